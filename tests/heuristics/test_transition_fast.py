"""The compiled greedy scheduler and the table path of the cost model against their pure-Python
references (``heuristics/transition.py``, ``costmodel/transition.py``): the same durations,
capacities, critical path and schedules (bit for bit, seconds and integer ticks, memory binding
or not) and the same errors on random transitions. Until the compiled scheduler is ready
``greedy_schedule`` takes the reference (same schedules), and the warm-ups compile exactly the
specialisations real calls use (no real call compiles another)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rpeg import Cluster, hardware_preset
from rpeg.costmodel.transition import (
    GpuCapacities,
    critical_path,
    gpu_capacities,
    primitive_times,
    primitive_times_array,
)
from rpeg.heuristics import _transition_kernel
from rpeg.heuristics import transition as transition_module
from rpeg.heuristics.transition import greedy_schedule, greedy_schedule_reference, warm_up
from rpeg.ir.cluster import NO_SPLITS
from rpeg.ir.emu import _build_kernel, emus_of, transition_dag, transition_dag_reference
from rpeg.ir.emu.flat import ready as builder_ready
from rpeg.solvers.transition import plan_transition
from tests.ir.emu.test_flat import GRAPH, plan_pair, plans, raw_pair

BIG = Cluster.from_shape("2x2x8", hardware_preset("h200"), **NO_SPLITS)


@pytest.fixture(autouse=True, scope="module")
def compiled_cores():
    """The compiled builder and scheduler are loaded, so the tests compare them with the
    references and not the references with themselves."""
    assert warm_up(wait=True) and builder_ready()


def outcome(f, *args):
    try:
        return f(*args)
    except ValueError as e:  # TransitionInfeasible is a ValueError
        return type(e).__name__, str(e)


def check_pair(rng: random.Random, cur, tgt) -> None:
    try:
        ref_dag = transition_dag_reference(cur, tgt)
    except ValueError:
        return  # the builders' errors are test_flat's
    dag = transition_dag(cur, tgt)
    assert dag.flat is not None
    engine = rng.choice([0.0, 2.5])
    setup = rng.choice([0.1, 0.0, 0.37])
    dur = primitive_times(dag, BIG, setup=setup, engine_start=engine)
    assert dur == primitive_times(ref_dag, BIG, setup=setup, engine_start=engine)
    largest = max(u.bytes_per_gpu for u in ref_dag.units.values())
    capacity = rng.choice([None, largest * rng.uniform(0.5, 3.0), largest * rng.uniform(1.0, 1.5)])
    caps = gpu_capacities(dag, BIG, capacity)
    ref_caps = gpu_capacities(ref_dag, BIG, capacity)
    assert caps == ref_caps and list(caps) == list(ref_caps)
    assert critical_path(dag, dur) == critical_path(ref_dag, dur)
    if rng.random() < 0.3:  # a capacity map that is not gpu_capacities' own
        caps = {g: c * rng.uniform(0.9, 1.1) for g, c in caps.items() if rng.random() < 0.8}
    for d in (dur, [math.ceil(x / 1e-3 - 1e-9) for x in dur]):
        fast = outcome(greedy_schedule, dag, d, caps)
        assert fast == outcome(greedy_schedule_reference, ref_dag, d, caps)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_fast_costs_and_schedule_equal_the_reference_on_plan_pairs(seed):
    rng = random.Random(seed)
    check_pair(rng, *plan_pair(rng))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_fast_costs_and_schedule_equal_the_reference_on_arbitrary_collections(seed):
    rng = random.Random(seed)
    check_pair(rng, *raw_pair(rng))


def test_memory_binding_path_is_exercised():
    """At least some random cases bind memory and still schedule (the path is not dead code)."""
    scheduled = blocked = 0
    for seed in range(200):
        rng = random.Random(seed)
        cur, tgt = plan_pair(rng)
        try:
            dag = transition_dag(cur, tgt)
        except ValueError:
            continue
        largest = max(u.bytes_per_gpu for u in dag.units.values())
        caps = gpu_capacities(dag, BIG, largest * 1.2)
        dur = primitive_times(dag, BIG)
        peak = {}
        for u in dag.units.values():
            for g in u.gpus:
                peak[g] = peak.get(g, 0.0) + u.bytes_per_gpu
        if not any(b > caps[g] * (1 + 1e-12) for g, b in peak.items()):
            continue
        got = outcome(greedy_schedule, dag, dur, caps)
        assert got == outcome(greedy_schedule_reference, transition_dag_reference(cur, tgt), dur, caps)
        scheduled += not isinstance(got, tuple)
        blocked += isinstance(got, tuple)
    assert scheduled > 0 and blocked >= 0


def test_the_reference_schedules_until_the_core_is_ready(monkeypatch):
    """A DAG with tables whose scheduler is not loaded yet: ``greedy_schedule`` starts the
    warm-up, runs the reference and gets the compiled path's schedule (or its error)."""
    compared = 0
    started: list[bool] = []
    reference: list[object] = []

    def spy(*args):
        reference.append(args[0])
        return greedy_schedule_reference(*args)

    for seed in range(40):
        rng = random.Random(seed)
        cur, tgt = plan_pair(rng) if seed % 2 else raw_pair(rng)
        try:
            dag = transition_dag(cur, tgt)
        except ValueError:
            continue
        assert dag.flat is not None
        dur = primitive_times(dag, BIG)
        largest = max(u.bytes_per_gpu for u in dag.units.values())
        caps = gpu_capacities(dag, BIG, rng.choice([None, largest * 1.2]))
        compiled = outcome(greedy_schedule, dag, dur, caps)
        with monkeypatch.context() as m:
            started.clear()
            reference.clear()
            m.setattr(transition_module, "ready", lambda: False)
            m.setattr(transition_module, "warm_up", lambda wait=False: started.append(wait) or False)
            m.setattr(transition_module, "_compiled_schedule", None)  # calling it would fail
            m.setattr(transition_module, "greedy_schedule_reference", spy)
            early = outcome(greedy_schedule, dag, dur, caps)
            assert started == [False] and len(reference) == 1 and reference[0] is dag
        assert early == compiled
        compared += not isinstance(compiled, tuple)
    assert compared > 0


def test_warm_up_compiles_the_specialisations_real_calls_use():
    """After the warm-ups each top-level kernel has its specialisations; real calls (builds on
    several cluster sizes, costs, critical path, schedules in seconds and in ticks, with and
    without binding memory, and the ``plan_transition`` front door) add none, so none of them
    waits for the compiler."""
    kernels = [
        _build_kernel.validate,
        _build_kernel.build,
        _build_kernel.build_from_vertices,
        _build_kernel.longest_path,
        _build_kernel.link_classes,
        _transition_kernel.schedule_tables,  # calls schedule inside the compiled code
    ]
    before = [len(k.signatures) for k in kernels]
    assert all(before)
    scheduled = 0
    for seed in range(30):
        rng = random.Random(seed)
        cur, tgt = plan_pair(rng) if seed % 2 else raw_pair(rng)
        try:
            dag = transition_dag(cur, tgt)
        except ValueError:
            continue
        dur = primitive_times(dag, BIG, setup=0.1, engine_start=2.5)
        largest = max(u.bytes_per_gpu for u in dag.units.values())
        caps = gpu_capacities(dag, BIG, rng.choice([None, largest * 1.2]))
        critical_path(dag, dur)
        for d in (dur, [math.ceil(x / 1e-3 - 1e-9) for x in dur]):
            scheduled += not isinstance(outcome(greedy_schedule, dag, d, caps), tuple)
        if seed % 2:
            c = rng.choice([BIG, Cluster.from_shape("1x4x8", hardware_preset("h200"), **NO_SPLITS)])
            outcome(plan_transition, cur, tgt, c)
        c, a, b = plans(rng)  # two plans: the DAG is built from their vertices
        outcome(lambda x, y, c=c: plan_transition(x, y, c, graph=GRAPH), a, b)
    assert scheduled > 0
    assert [len(k.signatures) for k in kernels] == before


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_planning_from_two_plans_equals_planning_from_their_units(seed):
    """``plan_transition`` on two plans (the DAG read per vertex, durations as one array) gives
    the plan it gives on their EMU collections: durations, capacities, critical path, schedule."""
    rng = random.Random(seed)
    c, a, b = plans(rng)
    engine = rng.choice([0.0, 2.5])
    by_plans = outcome(lambda x, y: plan_transition(x, y, c, graph=GRAPH, engine_start=engine), a, b)
    cur, tgt = emus_of(a, c, graph=GRAPH), emus_of(b, c, graph=GRAPH)
    by_units = outcome(lambda x, y: plan_transition(x, y, c, engine_start=engine), cur, tgt)
    if isinstance(by_units, tuple):
        assert by_plans == by_units
        return
    assert by_plans.dag == by_units.dag
    for f in ("durations", "starts", "ends", "status", "l_tran", "bound", "critical_path"):
        assert getattr(by_plans, f) == getattr(by_units, f), f
    assert type(by_plans.durations[0]) is float and type(by_plans.starts[0]) is float
    assert by_plans.capacity == by_units.capacity and by_plans.check() == []
    dur = primitive_times_array(by_units.dag, c, engine_start=engine)
    assert dur.dtype == np.float64 and dur.tolist() == list(by_units.durations)


def test_gpu_capacities_is_a_read_only_mapping_equal_to_its_dict():
    cur, tgt = plan_pair(random.Random(5))
    dag = transition_dag(cur, tgt)
    caps = gpu_capacities(dag, BIG)
    ref = gpu_capacities(transition_dag_reference(cur, tgt), BIG)
    assert isinstance(caps, GpuCapacities) and isinstance(ref, GpuCapacities)
    plain = dict(caps)
    assert caps == plain and plain == caps and caps == ref and list(caps) == sorted(plain)
    assert len(caps) == len(plain) and caps[next(iter(plain))] == plain[next(iter(plain))]
    assert next(iter(plain)) in caps and -1 not in caps and caps.get(-1) is None
    with pytest.raises(ValueError, match="read-only"):
        caps.caps[0] = 0.0
    with pytest.raises(TypeError):
        caps[0] = 1.0  # type: ignore[index]
    assert repr(caps).startswith("GpuCapacities({")
    with pytest.raises(ValueError, match="2 GPUs but 1 bounds"):
        GpuCapacities(np.array([0, 1]), np.array([1.0]))
    # the scheduler reads the arrays of its own map and the items of any other: same schedule
    dur = primitive_times(dag, BIG)
    assert greedy_schedule(dag, dur, caps) == greedy_schedule(dag, dur, plain)

"""The compiled DAG builder (``ir/emu/flat.py``) against the pure-Python reference builder:
equal DAGs (primitives, uids, GPU orders, edges, collections, diffs) and equal errors on random
transitions, from rpeg plans on clusters of several sizes and from arbitrary EMU collections;
and until the compiled core is ready, ``transition_dag`` builds with the reference (same DAGs and
errors) after starting the background warm-up."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rpeg import Cluster, Workload, hardware_preset, model_preset
from rpeg.ir import build_graph
from rpeg.ir.cluster import NO_SPLITS
from rpeg.ir.emu import (
    EMU,
    ModelStage,
    Stage,
    TransitionDAG,
    emus_of,
    transition_dag,
    transition_dag_of_plans,
    transition_dag_reference,
)
from rpeg.ir.emu import dag as dag_module
from rpeg.ir.emu.flat import FlatDAG, flat_dag, flat_dag_of_plans, warm_up
from rpeg.ir.plan import Choice, Plan
from rpeg.scoring.candidates import aligned_allocations, enumerate_strategies


@pytest.fixture(autouse=True, scope="module")
def compiled_core():
    """The compiled builder is loaded, so the tests compare it with the reference and not the
    reference with itself (``transition_dag`` builds with the reference until it is ready)."""
    assert warm_up(wait=True)


TINY = model_preset("7b").scaled(layers=4, hidden=256, heads=4, vocab=1000)
PPO = Workload("ppo", {"actor": TINY, "critic": TINY, "reward": TINY}, 16, 1, 32, 32)
GRAPH = build_graph(PPO)
# plans of SPEC §4 and §14 (the seeded draws of the transition tests); SPEC §15's splits below
CLUSTERS = [
    Cluster.from_shape(s, hardware_preset("h200"), **NO_SPLITS) for s in ("1x1x4", "1x2x4", "1x4x8", "2x2x8")
]
#: with context parallelism (and sequence parallelism): a CP rank holds a weight replica
SPLIT_CLUSTERS = [Cluster.from_shape(s, hardware_preset("h200")) for s in ("1x2x4", "1x4x8")]
STRATEGIES = {
    (c.shape_str, c.context_parallel): [
        enumerate_strategies(c, GRAPH.models[v.model].spec, v.sequences, v.role) for v in GRAPH.vertices
    ]
    for c in CLUSTERS + SPLIT_CLUSTERS
}


def plans(rng: random.Random, clusters: list[Cluster] = CLUSTERS) -> tuple[Cluster, Plan, Plan]:
    """Two legal rpeg plans (a strategy per vertex at a random aligned origin) on a random cluster
    of ``clusters``."""
    c = rng.choice(clusters)

    def plan() -> Plan:
        choices = []
        for strats in STRATEGIES[c.shape_str, c.context_parallel]:
            s = rng.choice(strats)
            choices.append(Choice(s, rng.choice(aligned_allocations(c, s.size))))
        return Plan(tuple(choices))

    return c, plan(), plan()


def plan_pair(rng: random.Random) -> tuple[list[EMU], list[EMU]]:
    """The EMU collections of :func:`plans`."""
    c, a, b = plans(rng)
    return emus_of(a, c, graph=GRAPH), emus_of(b, c, graph=GRAPH)


STAGES = [
    ModelStage("actor", Stage.GEN, "actor_gen", 0),
    ModelStage("reward", Stage.INF, "reward_inf", 2),
    ModelStage("critic", Stage.INF, "critic_inf", 3),
    ModelStage("actor", Stage.TRAIN, "actor_train", 4),
]


def raw_pair(rng: random.Random) -> tuple[list[EMU], list[EMU]]:
    """Arbitrary collections: GPU sets not aligned, ranks in any order, stages interleaved, equal
    model-stages as distinct objects, sometimes an invalid pair (a model-stage missing on one
    side, units sharing a GPU, a changed layout within a side or a changed state size)."""
    n_gpus = rng.choice([4, 8, 16, 32])
    stages = rng.sample(STAGES, rng.randint(1, len(STAGES)))
    nbytes = {ms: rng.choice([8e9, 16e9, 3e9]) for ms in stages}
    optim = {ms: rng.choice([0.0, 96e9]) for ms in stages}

    def side() -> list[EMU]:
        out = []
        for ms in stages:
            tp, pp = rng.choice([1, 2, 4]), rng.choice([1, 2])
            size = tp * pp
            if size > n_gpus:
                tp, pp, size = 1, 1, 1
            vp = rng.choice([1, 1, 2]) if pp > 1 else 1  # an interleaved pipeline now and then
            dp = rng.randint(1, n_gpus // size)
            free = rng.sample(range(n_gpus), dp * size)
            if rng.random() < 0.5:  # aligned contiguous blocks, as plans make them
                first = rng.sample(range(n_gpus // size), dp)
                free = [g for f in first for g in range(f * size, (f + 1) * size)]
            twin = ModelStage(ms.model, ms.stage, ms.vertex, ms.index) if rng.random() < 0.3 else ms
            for j in range(dp):
                gpus = free[j * size : (j + 1) * size]
                if rng.random() < 0.3:
                    rng.shuffle(gpus)
                out.append(EMU(twin if j % 2 else ms, tp, pp, tuple(gpus), nbytes[ms], optim[ms], vp=vp))
        if rng.random() < 0.5:
            rng.shuffle(out)
        return out

    cur, tgt = side(), side()
    if rng.random() < 0.1 and len(tgt) > 1:
        tgt = tgt[1:]  # maybe drops a model-stage, maybe only a replica
    if rng.random() < 0.05:
        u = cur[0]
        cur.append(EMU(u.stage, 1, 1, (u.gpus[0],), u.param_bytes, u.optim_bytes))  # shares a GPU
    if rng.random() < 0.05:
        u = tgt[0]
        tgt[0] = EMU(u.stage, u.tp, u.pp, u.gpus, u.param_bytes + 1.0, u.optim_bytes)
    return cur, tgt


def outcome(build, cur, tgt):
    try:
        return build(cur, tgt)
    except ValueError as e:  # TransitionInfeasible is a ValueError
        return type(e).__name__, str(e)


def assert_same_dag(fast: TransitionDAG, ref: TransitionDAG) -> None:
    assert fast == ref  # dataclass equality: primitives, edges, resource edges, collections, diffs
    assert len(fast) == len(ref) and fast.count("extend") == ref.count("extend")
    for p, q in zip(fast.primitives, ref.primitives):
        assert type(p) is type(q)
        for u, v in zip(p.inputs + p.outputs, q.inputs + q.outputs):
            assert (u.uid, u.gpus, u.mask, u.bytes_per_gpu, u.vp) == (
                v.uid,
                v.gpus,
                v.mask,
                v.bytes_per_gpu,
                v.vp,
            )
    for a, b in ((fast.current, ref.current), (fast.target, ref.target)):
        assert [(u.uid, u.gpus) for u in a] == [(u.uid, u.gpus) for u in b]
    assert list(fast.diffs) == list(ref.diffs)
    assert all(fast.diffs[ms].current == ref.diffs[ms].current for ms in ref.diffs)
    assert fast.topological_order == ref.topological_order


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_compiled_builder_equals_the_reference_on_plan_pairs(seed):
    cur, tgt = plan_pair(random.Random(seed))
    fast, ref = outcome(transition_dag, cur, tgt), outcome(transition_dag_reference, cur, tgt)
    if isinstance(ref, tuple):
        assert fast == ref  # same error, same message
        return
    assert fast.flat is not None
    assert_same_dag(fast, ref)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_compiled_builder_equals_the_reference_on_arbitrary_collections(seed):
    cur, tgt = raw_pair(random.Random(seed))
    fast, ref = outcome(transition_dag, cur, tgt), outcome(transition_dag_reference, cur, tgt)
    if isinstance(ref, tuple):
        assert fast == ref
        return
    assert_same_dag(fast, ref)


def test_fields_are_made_on_first_access():
    ms = STAGES[0]
    cur = [EMU(ms, 2, 1, (0, 1), 8e9), EMU(ms, 2, 1, (2, 3), 8e9)]
    tgt = [EMU(ms, 4, 1, (0, 1, 2, 3), 8e9), EMU(ms, 4, 1, (4, 5, 6, 7), 8e9)]
    dag = transition_dag(cur, tgt)
    assert dag.flat is not None and "primitives" not in vars(dag)
    assert len(dag) == 4 and dag.count("merge") == 2  # answered from the tables
    assert "primitives" not in vars(dag)
    assert [p.kind for p in dag.primitives] == ["extend", "extend", "merge", "merge"]
    assert "edges" in vars(dag)  # all fields made at once
    with pytest.raises(AttributeError):
        _ = dag.no_such_field
    assert dag == transition_dag_reference(cur, tgt)


def test_the_reference_builds_until_the_core_is_ready(monkeypatch):
    """Before the compiled core is loaded ``transition_dag`` starts the warm-up and returns the
    reference's DAG (no tables), equal to the compiled path's, with the same errors."""
    started = []
    monkeypatch.setattr(dag_module, "ready", lambda: False)
    monkeypatch.setattr(dag_module, "warm_up", lambda wait=False: started.append(wait) or False)
    rng = random.Random(7)
    built = 0
    for _ in range(40):
        cur, tgt = plan_pair(rng) if rng.random() < 0.5 else raw_pair(rng)
        early = outcome(transition_dag, cur, tgt)
        assert started and not started[-1]  # the warm-up was started, not waited for
        with monkeypatch.context() as m:
            m.setattr(dag_module, "ready", lambda: True)
            compiled = outcome(transition_dag, cur, tgt)
        if isinstance(compiled, tuple):
            assert early == compiled  # same error, same message
            continue
        assert early.flat is None and compiled.flat is not None
        assert_same_dag(compiled, early)
        built += 1
    assert built > 0


def assert_same_tables(a: FlatDAG, b: FlatDAG) -> None:
    """Every table of two flat DAGs equal, element types included; the units too."""
    assert a.n_current == b.n_current and a.stages == b.stages
    for f in dataclasses.fields(FlatDAG):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
    assert a.inputs == b.inputs


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), splits=st.booleans())
def test_the_dag_of_two_plans_is_the_dag_of_their_units(seed, splits):
    """``transition_dag_of_plans`` reads the plans per vertex; its tables are ``flat_dag``'s on the
    two EMU collections, its DAG the reference's, its errors the reference's — with context
    parallelism too (``dp·cp`` replicas, :func:`~rpeg.ir.emu.units.replica_order`)."""
    c, a, b = plans(random.Random(seed), SPLIT_CLUSTERS if splits else CLUSTERS)
    cur, tgt = emus_of(a, c, graph=GRAPH), emus_of(b, c, graph=GRAPH)
    fast = outcome(lambda x, y: transition_dag_of_plans(x, y, c, graph=GRAPH), a, b)
    ref = outcome(transition_dag_reference, cur, tgt)
    if isinstance(ref, tuple):
        assert fast == ref
        assert flat_dag_of_plans(a, b, c, graph=GRAPH) is None
        return
    assert fast.flat is not None and "inputs" not in vars(fast.flat)  # no unit made yet
    assert_same_tables(fast.flat, flat_dag(cur, tgt))
    assert_same_dag(fast, ref)


def test_the_dag_of_two_plans_takes_a_workload_and_checks_its_arguments():
    rng = random.Random(3)
    while True:  # a pair whose transition is feasible (random pairs can block each other)
        c, a, b = plans(rng)
        if not isinstance(
            outcome(lambda x, y, c=c: transition_dag_of_plans(x, y, c, graph=GRAPH), a, b), tuple
        ):
            break
    by_workload = transition_dag_of_plans(a, b, c, workload=PPO)
    assert by_workload == transition_dag_of_plans(a, b, c, graph=GRAPH)
    for kwargs in ({}, {"graph": GRAPH, "workload": PPO}):
        with pytest.raises(ValueError, match="exactly one of graph= or workload="):
            transition_dag_of_plans(a, b, c, **kwargs)
    with pytest.raises(ValueError, match="plan has 5 choices but the graph has 6 vertices"):
        transition_dag_of_plans(a, Plan(b.choices[:-1]), c, graph=GRAPH)


def test_the_dag_of_two_plans_is_the_reference_until_the_core_is_ready(monkeypatch):
    monkeypatch.setattr(dag_module, "ready", lambda: False)
    monkeypatch.setattr(dag_module, "warm_up", lambda wait=False: False)
    rng = random.Random(11)
    for _ in range(10):
        c, a, b = plans(rng)
        early = outcome(lambda x, y, c=c: transition_dag_of_plans(x, y, c, graph=GRAPH), a, b)
        ref = outcome(transition_dag_reference, emus_of(a, c, graph=GRAPH), emus_of(b, c, graph=GRAPH))
        if isinstance(ref, tuple):
            assert early == ref
        else:
            assert early.flat is None and early == ref


@pytest.mark.parametrize("shape", ["sorted", "two-runs", "any"])
def test_the_kernels_order_is_an_argsort(shape):
    """``_build_kernel._order`` (the build's sorts: identity when sorted, a merge of the even and
    odd positions when each is sorted, else an argsort) orders distinct keys as ``np.argsort``,
    and ``_sorted_by_min`` as a sort by the lowest GPU."""
    from rpeg.ir.emu import _build_kernel as kernel

    rng = np.random.default_rng(len(shape))
    for n in range(0, 40):
        keys = rng.permutation(4 * n + 4)[:n].astype(np.int64)
        if shape == "sorted":
            keys.sort()
        elif shape == "two-runs":
            keys[0::2].sort()
            keys[1::2].sort()
        assert kernel._order(keys).tolist() == np.argsort(keys).tolist(), keys
        idx = rng.permutation(n).astype(np.int64)
        assert kernel._sorted_by_min(idx, keys).tolist() == idx[np.argsort(keys[idx])].tolist()


def test_the_split_plans_hold_context_parallel_layouts():
    """The pool of the property above holds context-parallel strategies of every role that may
    split sequences (the training and inference vertices)."""
    for c in SPLIT_CLUSTERS:
        pools = STRATEGIES[c.shape_str, True]
        for v, pool in zip(GRAPH.vertices, pools):
            assert any(s.cp > 1 for s in pool) == (v.role.value != "generation"), (c.shape_str, v.name)

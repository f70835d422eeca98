"""Tests for ``formulations/plan_model.py``: the engine-independent plan instance (lowering classes
per candidate pair, costs, bounds) and what both plan engines share. The tiny instances here are
also the plan engines' (``test_plan_cpsat.py``, ``test_plan_milp.py``)."""

import dataclasses
import math

import pytest

from rpeg import Cluster, Workload, hardware_preset, model_preset
from rpeg.formulations.deadline import BuildTimeout, Deadline
from rpeg.formulations.plan_model import (
    PLAN_BLOCKS,
    PlanSolution,
    build_plan_instance,
    candidate_sets,
)
from rpeg.formulations.status import Status
from rpeg.ir import Plan, Structure
from rpeg.scoring import Evaluator, build_directories
from rpeg.scoring.scheduler import Schedule

TINY = model_preset("7b").scaled(layers=4, hidden=1024, heads=8, vocab=8000)
REL = 2e-3  # the model rounds durations up to serial-horizon/1e5; a path holds < 200 nodes here


def tiny(algorithm="grpo", memory=1.1e9, shape="1x1x2", rule=False):
    """A tiny workload on ``shape`` GPUs of ``memory`` bytes. 1.1 GB: every plan of the 2 fastest
    layouts fits (at 1.05 GB none does: a generation holds ``u·M_GPU``, SPEC §14.5), a third of
    the 3 fastest' do not, so the memory block binds there. ``rule``: a rule reward and no
    reference (``kl_coef = 0``), leaving the actor's generation and training."""
    hw = dataclasses.replace(hardware_preset("gh200"), name="tiny", gpu_memory_bytes=memory)
    models = (
        {"actor": TINY}
        | ({} if rule else {"reward": TINY})
        | ({"critic": TINY} if algorithm == "ppo" else {})
    )
    if algorithm == "dpo":
        models = {"actor": TINY}
    extra = {"reward": "rule", "kl_coef": 0.0} if rule else {}
    return Workload(algorithm, models, 8, 2, 64, 64, **extra), Cluster.from_shape(shape, hw)


def exact_schedule(ev, sol):
    """The model's start times laid onto the evaluator's lowered graph of the chosen plan."""
    e = ev.evaluate(sol.plan, keep=True)
    g = e.graph
    keys = [(g.kind[i], g.vertex[i], g.source[i], g.step[i], g.phase[i]) for i in range(len(g))]
    missing = [k for k in keys if k not in sol.starts]
    extra = set(sol.starts) - set(keys)
    starts = [sol.starts.get(k, 0.0) for k in keys]
    finish = [s + d for s, d in zip(starts, g.duration)]
    return e, g, Schedule(starts, finish, max(finish), [], [], []), missing, extra


def _instance(k: int | None = 2, tau: int = 1):
    w, cluster = tiny()
    ev = Evaluator(w, cluster, Structure("grpo", False, (("actor", tau),)), k_eval=1)
    cands = candidate_sets(ev, build_directories(ev.costs), k)
    return ev, cands, build_plan_instance(ev, cands)


def test_every_candidate_pair_of_every_edge_lands_in_exactly_one_class():
    ev, cands, inst = _instance()
    assert len(inst.edges) >= len(ev.graph.data_edges) + len(ev.graph.pub_edges)
    for ec in inst.edges:
        pairs = [p for ps in ec.pairs for p in ps]
        assert len(ec.pairs) == len(ec.classes)
        assert sorted(pairs) == sorted(
            (cu, cv) for cu in range(len(cands[ec.src])) for cv in range(len(cands[ec.dst]))
        )
    assert len(inst.op) == len(inst.memory) == len(cands)
    assert all(len(row) == len(cs) for row, cs in zip(inst.op, cands))


def test_the_serial_horizon_bounds_every_plan_and_plan_of_picks_the_candidates():
    ev, cands, inst = _instance()
    picks = [0] * len(cands)
    plan = inst.plan_of(picks)
    assert plan == Plan(tuple(cs[0] for cs in cands))
    ms = ev.evaluate(plan).makespan
    assert 0 < ms <= inst.serial_seconds() * (1 + 1e-9)
    assert inst.max_path_nodes() >= len(cands) * inst.k_eval


def test_bad_candidate_lists_are_named():
    ev, cands, _ = _instance(1)
    with pytest.raises(ValueError, match=rf"candidates: 1 lists for {len(cands)} vertices"):
        build_plan_instance(ev, cands[:1])
    with pytest.raises(ValueError, match="has none"):
        build_plan_instance(ev, [[], *cands[1:]])


def test_the_deadline_stops_the_lowering():
    ev, cands, _ = _instance(1)
    with pytest.raises(BuildTimeout, match="model too large to build in 0 s"):
        build_plan_instance(ev, cands, Deadline(0))


def test_the_blocks_and_an_outcome_without_a_plan():
    assert PLAN_BLOCKS[:4] == ("choice", "symmetry", "edges", "split")
    assert PLAN_BLOCKS[-2:] == ("memory", "cuts")  # the cuts use every node the blocks before made
    assert len(set(PLAN_BLOCKS)) == len(PLAN_BLOCKS)
    sol = PlanSolution.without_plan(Status.UNKNOWN, 1.5, "cpsat", message="why")
    assert (sol.status, sol.plan, sol.makespan, sol.lower_bound) == (Status.UNKNOWN, None, math.inf, 0.0)
    assert (sol.runtime, sol.engine, sol.message, sol.interrupted) == (1.5, "cpsat", "why", False)


def _symmetric(shape: str = "1x1x4", k: int | None = 2):
    w, cluster = tiny(shape=shape)
    ev = Evaluator(w, cluster, Structure("grpo", False, (("actor", 1),)), k_eval=1)
    cands = candidate_sets(ev, build_directories(ev.costs), k)
    return ev, cands, build_plan_instance(ev, cands)


@pytest.mark.parametrize("shape", ["1x1x4", "1x2x2"])
def test_certified_device_permutations_are_automorphisms_of_the_evaluator(shape):
    from random import Random

    from rpeg.formulations.plan_model import _block_swaps, _certify

    ev, cands, inst = _symmetric(shape)
    maps = [m for p in _block_swaps(ev.cluster.num_devices) if (m := _certify(inst, p))]
    assert len(maps) == 3  # both single swaps and the swap of halves
    rng = Random(0)
    for images in maps:
        assert all(sorted(pi) == list(range(len(cs))) for pi, cs in zip(images, cands))  # bijections
        for _ in range(20):
            picks = [rng.randrange(len(cs)) for cs in cands]
            a = ev.evaluate(Plan(tuple(cs[c] for cs, c in zip(cands, picks))))
            b = ev.evaluate(Plan(tuple(cs[pi[c]] for cs, pi, c in zip(cands, images, picks))))
            assert a.feasible == b.feasible
            if a.feasible:
                assert b.makespan == pytest.approx(a.makespan, rel=1e-9)


def test_symmetry_fixing_keeps_one_candidate_per_orbit_and_the_warm_starts_choice():
    from rpeg.formulations.plan_model import symmetry_fixing

    _ev, cands, inst = _symmetric()
    v0, out = symmetry_fixing(inst)
    assert out and len(out) < len(cands[v0])
    keep = Plan(tuple(cs[out[0]] if v == v0 else cs[0] for v, cs in enumerate(cands)))  # a ruled-out one
    v1, out1 = symmetry_fixing(inst, keep)
    assert v1 == v0 and cands[v0].index(keep.choices[v0]) not in out1 and len(out1) == len(out)


@pytest.mark.parametrize("shape", ["1x1x4", "1x2x2"])
def test_symmetry_breaking_keeps_the_optimum(shape, monkeypatch):
    from rpeg.formulations import plan_model
    from rpeg.formulations.plan_cpsat import solve_plan_cpsat

    _ev, _cands, inst = _symmetric(shape)
    with_sym = solve_plan_cpsat(inst, time_limit=60, threads=1)
    monkeypatch.setattr(plan_model, "symmetry_fixing", lambda inst, keep=None, deadline=None: None)
    without = solve_plan_cpsat(inst, time_limit=60, threads=1)
    assert with_sym.status == without.status == "optimal"
    assert with_sym.makespan == pytest.approx(without.makespan, rel=1e-12)


def test_a_block_swap_maps_a_mask_as_its_permutation_does():
    from random import Random

    from rpeg.formulations.plan_model import _block_swaps

    rng = Random(0)
    for n in (4, 16, 64):
        for swap in _block_swaps(n):
            perm = swap.perm(n)
            for mask in [rng.getrandbits(n) for _ in range(8)]:
                want = sum(1 << perm[d] for d in range(n) if mask >> d & 1)
                assert swap.map_mask(mask) == want


def test_symmetry_fixing_stops_at_its_deadline_with_what_it_certified():
    """Past its deadline no permutation is certified and nothing is ruled out; with time, the
    orbits of every certified swap."""
    from rpeg.formulations.deadline import Deadline
    from rpeg.formulations.plan_model import symmetry_fixing

    _ev, _cands, inst = _symmetric()
    assert symmetry_fixing(inst, deadline=Deadline(0.0)) is None
    assert symmetry_fixing(inst, deadline=Deadline(3600.0)) == symmetry_fixing(inst)

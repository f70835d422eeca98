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


def tiny(algorithm="grpo", memory=1.05e9, shape="1x1x2"):
    hw = dataclasses.replace(hardware_preset("gh200"), name="tiny", gpu_memory_bytes=memory)
    models = {"actor": TINY, "reward": TINY} | ({"critic": TINY} if algorithm == "ppo" else {})
    if algorithm == "dpo":
        models = {"actor": TINY}
    return Workload(algorithm, models, 8, 2, 64, 64), Cluster.from_shape(shape, hw)


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
    assert PLAN_BLOCKS[:3] == ("choice", "edges", "split") and PLAN_BLOCKS[-1] == "memory"
    assert len(set(PLAN_BLOCKS)) == len(PLAN_BLOCKS)
    sol = PlanSolution.without_plan(Status.UNKNOWN, 1.5, "cpsat", message="why")
    assert (sol.status, sol.plan, sol.makespan, sol.lower_bound) == (Status.UNKNOWN, None, math.inf, 0.0)
    assert (sol.runtime, sol.engine, sol.message, sol.interrupted) == (1.5, "cpsat", "why", False)

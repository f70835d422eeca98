"""Candidates under a deadline: the lean directories and frontiers a method plans over when its
time limit leaves no time for the full ones (``build_directories(costs, deadline)``,
``build_dp_instance(costs, budget, deadline)``), and what every method then says.

A deadline already past stands for "no time left", so nothing here depends on how fast the
machine is."""

from __future__ import annotations

import dataclasses
import time

import pytest

from rpeg import solve
from rpeg.heuristics.baselines import FLOOR_NOTE, Infeasible, baselines_in_time, concurrent_plan, greedy_plan
from rpeg.heuristics.dp_planner import (
    COARSE_MEM_UNITS,
    _build_frontier,
    build_dp_instance,
    coarsen_memory,
    model_stages,
    size_chain,
    solve_dp,
)
from rpeg.heuristics.search.anneal import SearchSpace
from rpeg.ir.templates import structures
from rpeg.ir.types import Role
from rpeg.scoring.candidates import (
    TimeUp,
    _build_directory,
    build_directories,
    degree_group,
    lean_directory,
)
from rpeg.scoring.evaluator import Evaluator
from rpeg.solvers import clear_caches
from rpeg.solvers.result import Status
from rpeg.solvers.solve import METHODS, Problem
from tests.conftest import example_problem


def _past() -> float:
    return time.monotonic() - 1.0


@pytest.fixture(scope="module")
def ppo7b():
    workload, cluster, k_eval = example_problem("ppo-7b-16gpu")
    return workload, cluster, k_eval


def _listed(dirs) -> list[tuple]:
    return [
        (d.vertex, d.strategies, d.times, d.dropped, d.smallest_isolated, d.dominated, d.lean) for d in dirs
    ]


def _groups(strategies) -> dict[tuple, list]:
    out: dict[tuple, list] = {}
    for s in strategies:
        out.setdefault(degree_group(s), []).append(s)
    return out


def test_past_the_deadline_every_directory_is_lean_and_covers_every_layout_at_its_leanest(ppo7b):
    """Each parallel layout (degrees, any microbatch count and engine variant) the full directory
    lists with plain 1F1B is in the lean one, a few times at most, with a strategy that needs no more
    isolated memory than the leanest the full one keeps: a plan the full directories allow on
    some devices has a lean candidate of the same degrees that fits there alone."""
    workload, cluster, _ = ppo7b
    clear_caches()
    ev = Evaluator(workload, cluster)
    lean = build_directories(ev.costs, _past())
    assert all(d.lean for d in lean)
    roles = {ev.graph.vertices[d.vertex].role for d in lean}
    assert roles == {Role.GENERATION, Role.INFERENCE, Role.TRAINING}
    for d in lean:
        full = _build_directory(ev.costs, d.vertex, {})
        assert full is not None and not full.lean
        assert d.times == sorted(d.times)
        lean_groups = _groups(s for s in d.strategies if not s.offload)  # each with its offload twin
        if ev.graph.vertices[d.vertex].role is Role.GENERATION:  # its memory fractions, at one mb
            assert all(len({s.mb for s in v}) <= 2 for v in lean_groups.values())
        else:  # the leanest and the fast end at the fewest and the most microbatches
            assert all(len(v) <= 3 for v in lean_groups.values()), "more than three strategies of a layout"
        assert len(d.strategies) == (2 if cluster.host_offload else 1) * sum(map(len, lean_groups.values()))
        assert all(s.vp == 1 for s in d.strategies), "a lean directory lists no interleaved twin"
        full_groups = _groups(s for s in full.strategies if s.vp == 1 and not s.offload)
        assert full_groups.keys() <= lean_groups.keys(), d.vertex
        for key, ss in full_groups.items():
            least = min(ev.costs.memory(d.vertex, s).isolated for s in ss)
            assert min(ev.costs.memory(d.vertex, s).isolated for s in lean_groups[key]) <= least
        # fewer strategies timed than the full build times
        assert len(d.strategies) < len(full.strategies) + full.dominated


def test_a_kept_lean_directory_is_replaced_by_the_full_one_when_time_allows(ppo7b):
    """Lean directories are kept for the other structures of one solve, never handed out as full:
    a later call without a deadline, or with time left, gets the directories built afresh."""
    workload, cluster, _ = ppo7b
    clear_caches()
    ev = Evaluator(workload, cluster)
    lean = build_directories(ev.costs, _past())
    assert _listed(build_directories(ev.costs, _past())) == _listed(lean)  # kept, and still lean
    fresh = [_build_directory(ev.costs, v, {}) for v in range(len(ev.graph.vertices))]
    assert _listed(build_directories(ev.costs, time.monotonic() + 3600)) == _listed(fresh)
    clear_caches()
    build_directories(ev.costs, _past())
    assert _listed(build_directories(ev.costs)) == _listed(fresh)


def test_a_directory_build_stops_at_its_deadline(ppo7b):
    workload, cluster, _ = ppo7b
    ev = Evaluator(workload, cluster)
    assert _build_directory(ev.costs, 0, {}, _past()) is None
    assert lean_directory(ev.costs, 0).lean


def test_an_empty_lean_directory_means_an_empty_full_one(ppo7b):
    """On a device too small for the model, both are empty and report the same least isolated
    memory: the lean one scores the leanest variant of every layout."""
    workload, cluster, _ = ppo7b
    small = dataclasses.replace(cluster.hardware, gpu_memory_bytes=cluster.hardware.gpu_memory_bytes / 16)
    ev = Evaluator(workload, dataclasses.replace(cluster, hardware=small))
    for vi, v in enumerate(ev.graph.vertices):
        if v.role is not Role.TRAINING:
            continue
        full = _build_directory(ev.costs, vi, {})
        lean = lean_directory(ev.costs, vi)
        assert len(full) == len(lean) == 0
        assert lean.smallest_isolated == full.smallest_isolated


@pytest.mark.parametrize("method", ["greedy", "concurrent", "sa", "dp", "cpsat"])
def test_a_method_with_no_time_left_plans_over_lean_candidates_and_says_so(ppo7b, method):
    """``started`` ten seconds before a one-second limit: every method returns a memory-feasible
    plan with status ``time_limit`` and a message naming the lean candidates."""
    workload, cluster, k_eval = ppo7b
    clear_caches()
    problem = Problem(workload, cluster, k_eval, time_limit=1.0, started=time.monotonic() - 10.0)
    r = METHODS[method](problem)
    assert r.plan is not None and r.evaluation is not None and r.evaluation.feasible
    assert r.status is Status.TIME_LIMIT
    assert "left no time to build the full" in r.message, r.message


def test_past_the_deadline_every_frontier_is_lean_and_the_full_one_replaces_it(ppo7b):
    workload, cluster, _ = ppo7b
    clear_caches()
    ev = Evaluator(workload, cluster)
    lean = build_dp_instance(ev.costs, deadline=_past())
    assert all(f.lean for f in lean.frontiers)
    full = build_dp_instance(ev.costs)
    assert not any(f.lean for f in full.frontiers)
    sizes = size_chain(cluster)
    for ms, f in zip(model_stages(ev.graph), full.frontiers):
        fresh = _build_frontier(ev.costs, ms, sizes, full.m_eff)
        assert dataclasses.astuple(f) == dataclasses.astuple(fresh), ms.label
    # the lean DP is no better than the full one: its candidates are fewer
    assert solve_dp(lean).step_latency >= solve_dp(full).step_latency


def test_a_selection_in_gib_fits_in_the_exact_units(ppo7b):
    """``coarsen_memory`` rounds ``P`` and ``T`` up and ``M_eff`` down: its selection fits the
    instance it came from, its frontiers are no larger, its latency is no better."""
    workload, cluster, _ = ppo7b
    ev = Evaluator(workload, cluster)
    inst = build_dp_instance(ev.costs)
    coarse = coarsen_memory(inst, COARSE_MEM_UNITS)
    assert all(len(c.points) <= len(f.points) for c, f in zip(coarse.frontiers, inst.frontiers))
    assert sum(len(c.points) for c in coarse.frontiers) < sum(len(f.points) for f in inst.frontiers)
    sel = solve_dp(coarse)
    assert sel.step_latency >= solve_dp(inst).step_latency
    by_strategy = [{q.strategy: q for q in f.points} for f in inst.frontiers]
    # the same picks priced in KiB, as the DP prices a plan: persistent state adds up along a
    # lane and over the stages (the widest lane of each), transient memory is the largest
    lanes = sel.lanes or coarse.side_by_side()
    per = tra = 0
    for stage_lanes in lanes:
        widest = 0
        for lane in stage_lanes:
            fine = [by_strategy[m][coarse.frontiers[m].points[sel.picks[m]].strategy] for m in lane]
            widest = max(widest, sum(q.persistent for q in fine))
            tra = max([tra] + [q.transient for q in fine])
        per += widest
    assert per + tra <= inst.m_eff


def test_dp_counts_memory_in_gib_under_a_time_limit_only(ppo7b):
    """With a limit the DP selects on :func:`coarsen_memory`'s instance (and says so); without
    one, on the exact KiB instance. Both plans fit; the coarse one is no better in the DP's own
    terms."""
    workload, cluster, k_eval = ppo7b
    clear_caches()
    exact = solve(workload, cluster, method="dp", k_eval=k_eval)
    timed = solve(workload, cluster, method="dp", k_eval=k_eval, time_limit=600.0)
    assert "GiB" not in exact.message and "memory counted in whole GiB" in timed.message
    assert exact.status is Status.FEASIBLE and timed.status is Status.FEASIBLE
    assert exact.evaluation.feasible and timed.evaluation.feasible
    assert timed.extra["dp"]["step_latency_s"] >= exact.extra["dp"]["step_latency_s"]


def test_only_the_floor_is_built_whatever_the_time(ppo7b):
    """``floor=False`` (a search's later structures): past the deadline, a vertex with no kept
    directory stops the build (``TimeUp``) instead of getting a lean one late; with every
    directory kept, the kept ones are returned."""
    workload, cluster, _ = ppo7b
    clear_caches()
    ev = Evaluator(workload, cluster)
    with pytest.raises(TimeUp):
        build_directories(ev.costs, _past(), floor=False)
    with pytest.raises(TimeUp):
        lean_directory(ev.costs, 0, deadline=_past())
    lean = build_directories(ev.costs, _past())
    assert _listed(build_directories(ev.costs, _past(), floor=False)) == _listed(lean)


def _planned(dirs, planner, ev):
    try:
        return planner(ev, dirs)
    except Infeasible as exc:
        return str(exc)


@pytest.mark.parametrize("when", ["none", "past", "ample"])
def test_the_baselines_in_time_are_the_baselines_over_the_directories_they_return(ppo7b, when):
    """Without a deadline or with time to spare: the full directories and the baselines over
    them, nothing to say; past it: the lean floor and the baselines over it, named lean."""
    workload, cluster, _ = ppo7b
    clear_caches()
    ev = Evaluator(workload, cluster)
    deadline = {"none": None, "past": _past(), "ample": time.monotonic() + 3600}[when]
    dirs, plans, note = baselines_in_time(ev, [concurrent_plan, greedy_plan], deadline)
    assert all(d.lean for d in dirs) if when == "past" else not any(d.lean for d in dirs)
    assert ("left no time to build the full" in note) == (when == "past")
    assert FLOOR_NOTE not in note
    for plan, planner in zip(plans, [concurrent_plan, greedy_plan]):
        want = _planned(dirs, planner, ev)
        assert (str(plan) if isinstance(plan, Infeasible) else plan) == want


def test_a_baseline_cut_by_the_deadline_keeps_its_plan_over_the_floor(ppo7b):
    """The full directories are built in time but the planner over them is not done: its plan
    over the lean floor stands in, and the note says so."""
    workload, cluster, _ = ppo7b
    clear_caches()
    ev = Evaluator(workload, cluster)
    calls = []

    def slow_concurrent(ev, dirs, deadline=None):
        calls.append(all(d.lean for d in dirs))
        if deadline is not None:
            raise TimeUp("cut")
        return concurrent_plan(ev, dirs)

    dirs, (plan,), note = baselines_in_time(ev, [slow_concurrent], time.monotonic() + 3600)
    assert calls == [True, False]  # over the floor first, then over the full directories
    assert not any(d.lean for d in dirs)
    lean = build_directories(ev.costs, _past())  # the kept full ones now; the floor was lean
    assert not any(d.lean for d in lean)
    clear_caches()
    assert plan == concurrent_plan(ev, build_directories(ev.costs, _past()))
    assert note == FLOOR_NOTE


def test_a_later_structure_is_not_prepared_on_a_floor_past_the_deadline(ppo7b):
    """The structure whose baselines are the incumbents is prepared on its lean floor whatever
    the time, with those baselines; another whose vertices have no directory yet (actor–critic
    sharing) is not (``TimeUp``: the search skips it)."""
    workload, cluster, k_eval = ppo7b
    clear_caches()
    ys = structures(workload)
    first, shared = ys[0], next(y for y in ys if y.ac_sharing)
    opts = dict(k_eval=k_eval, split_phases=True, tune_microbatches=True, deadline=_past())
    space = SearchSpace(workload, cluster, first, floor=True, **opts)
    assert all(d.lean for d in space.dirs) and "left no time" in space.lean
    assert space.baselines() and all(space.ev.memory(p).ratio <= 1.0 for p in space.baselines())
    with pytest.raises(TimeUp):
        SearchSpace(workload, cluster, shared, floor=False, **opts)

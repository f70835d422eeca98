"""Tests for ``heuristics/baselines.py``: the greedy and concurrent baselines (SPEC §8), the
memory repair they share and the :class:`Infeasible` explanation."""

from __future__ import annotations

import dataclasses
import itertools
import re
import time

import pytest

from rpeg import Cluster, example_names
from rpeg.heuristics.baselines import (
    Infeasible,
    TimeUp,
    concurrent_plan,
    greedy_plan,
    levels,
    repair_memory,
)
from rpeg.ir import Choice, Plan
from rpeg.ir.plan import check_strategy_of
from rpeg.scoring.candidates import build_directories, enumerate_strategies
from rpeg.scoring.evaluator import Evaluator

GIB = 2**30


def _setup(workload, cluster):
    ev = Evaluator(workload, cluster)
    return ev, build_directories(ev.costs)


def _fastest_on_all(ev, dirs):
    alloc = ev.cluster.allocations_of_size(ev.cluster.num_devices)[0]
    n = ev.cluster.num_devices
    return Plan(tuple(Choice(d.strategies[d.of_size(n)[0]], alloc) for d in dirs))


def _assert_legal(ev, plan):
    for v, c in zip(ev.graph.vertices, plan.choices):
        s = c.strategy
        spec = ev.graph.models[v.model].spec
        assert check_strategy_of(ev.cluster, spec, v.role, v.sequences, s) is None
        assert ev.cluster.allocation(c.allocation.origin, s.extent) == c.allocation


@pytest.fixture(scope="module")
def examples(problem_of):
    return {name: _setup(*problem_of(name)[:2]) for name in example_names()}


# ---------------------------------------------------------------------------- levels
def test_levels_of_ppo(tiny_ppo, cluster_1x2x4):
    ev = Evaluator(tiny_ppo, cluster_1x2x4)
    names = [[ev.graph.vertices[v].name for v in lv] for lv in levels(ev)]
    assert names == [["actor_gen"], ["ref_inf", "reward_inf", "critic_inf"], ["actor_train", "critic_train"]]


@pytest.mark.parametrize("name", example_names())
def test_levels_hold_no_data_dependency(examples, name):
    ev, _ = examples[name]
    depth = {v: k for k, lv in enumerate(levels(ev)) for v in lv}
    assert sorted(depth) == list(range(len(ev.graph.vertices)))
    for e in ev.graph.data_edges:
        assert depth[ev.graph.index[e.src]] < depth[ev.graph.index[e.dst]]


# ---------------------------------------------------------------------------- greedy
@pytest.mark.parametrize("name", example_names())
def test_greedy_puts_every_vertex_on_all_devices(examples, name):
    ev, dirs = examples[name]
    plan = greedy_plan(ev, dirs)
    assert len(plan) == len(ev.graph.vertices)
    assert all(c.allocation.mask == ev.cluster.all_mask for c in plan.choices)
    assert ev.memory(plan).feasible
    _assert_legal(ev, plan)


def test_greedy_takes_the_fastest_strategy_when_it_fits(tiny_ppo, cluster_1x2x4):
    ev, dirs = _setup(tiny_ppo, cluster_1x2x4)
    fast = _fastest_on_all(ev, dirs)
    assert ev.memory(fast).feasible  # premise: 96 GB GPUs hold the fastest plan
    assert greedy_plan(ev, dirs) == fast


def test_greedy_repairs_memory_when_the_fastest_plan_does_not_fit(tiny_ppo, cluster_1x2x4):
    hw = dataclasses.replace(cluster_1x2x4.hardware, gpu_memory_bytes=50e9)
    ev, dirs = _setup(tiny_ppo, Cluster(*cluster_1x2x4.shape, hw))
    fast = _fastest_on_all(ev, dirs)
    assert not ev.memory(fast).feasible
    plan = greedy_plan(ev, dirs)
    assert plan != fast
    assert ev.memory(plan).feasible
    assert all(c.allocation.mask == ev.cluster.all_mask for c in plan.choices)


# ---------------------------------------------------------------------------- concurrent
@pytest.mark.parametrize("name", example_names())
def test_concurrent_gives_each_level_disjoint_devices(examples, name):
    ev, dirs = examples[name]
    plan = concurrent_plan(ev, dirs)
    assert ev.memory(plan).feasible
    _assert_legal(ev, plan)
    for level in levels(ev):
        for a, b in itertools.combinations(level, 2):
            assert plan.choices[a].mask & plan.choices[b].mask == 0, (a, b)


def test_concurrent_picks_the_fastest_partition_of_each_level(tiny_ppo, cluster_1x2x4):
    # On 1x2x4 every size is a power of two with aligned origins, so any size assignment with
    # sum ≤ 8 packs: the best partition of a level is the least max over members of their
    # fastest time at the assigned size.
    # The partition is chosen on the fastest strategies; the memory repair that follows may only
    # have switched an invocation to a leaner variant of the same degrees (recomputation,
    # microbatches, ZeRO stage, loss chunking, memory fraction), never its degrees.
    ev, dirs = _setup(tiny_ppo, cluster_1x2x4)
    plan = concurrent_plan(ev, dirs)
    fastest = [d.strategies[d.of_size(c.allocation.size)[0]] for d, c in zip(dirs, plan.choices)]
    for v, c in enumerate(plan.choices):  # premise: the repair kept every invocation's degrees
        a, b = c.strategy, fastest[v]
        assert (a.extent, a.dp, a.pp, a.tp) == (b.extent, b.dp, b.pp, b.tp)
    for level in levels(ev):
        sizes = [sorted({s.size for s in dirs[v].strategies}) for v in level]
        best = min(
            max(dirs[v].times[dirs[v].of_size(k)[0]] for v, k in zip(level, combo))
            for combo in itertools.product(*sizes)
            if sum(combo) <= 8
        )
        chosen = max(dirs[v].times[dirs[v].strategies.index(fastest[v])] for v in level)
        assert chosen == best


# ---------------------------------------------------------------------------- repair
def test_repair_keeps_allocations_and_reaches_feasibility(tiny_ppo, cluster_1x2x4):
    hw = dataclasses.replace(cluster_1x2x4.hardware, gpu_memory_bytes=50e9)
    ev, dirs = _setup(tiny_ppo, Cluster(*cluster_1x2x4.shape, hw))
    fast = _fastest_on_all(ev, dirs)
    before = ev.memory(fast).ratio
    assert before > 1.0
    fixed = repair_memory(ev, dirs, fast)
    assert ev.memory(fixed).ratio <= 1.0
    for a, b in zip(fast.choices, fixed.choices):
        assert a.allocation == b.allocation
        assert a.strategy.size == b.strategy.size


def test_repair_leaves_a_feasible_plan_alone(tiny_ppo, cluster_1x2x4):
    ev, dirs = _setup(tiny_ppo, cluster_1x2x4)
    fast = _fastest_on_all(ev, dirs)
    assert repair_memory(ev, dirs, fast) is fast


def test_failed_repair_explains_the_worst_device(tiny_ppo, cluster_1x2x4):
    hw = dataclasses.replace(cluster_1x2x4.hardware, gpu_memory_bytes=50e9)
    ev, dirs = _setup(tiny_ppo, Cluster(*cluster_1x2x4.shape, hw))
    fast = _fastest_on_all(ev, dirs)
    mem = ev.memory(fast)
    with pytest.raises(Infeasible) as info:
        repair_memory(ev, dirs, fast, max_moves=0)
    exc = info.value
    assert exc.excess_bytes == pytest.approx(mem.max_peak - mem.m_eff)
    msg = str(exc)
    assert f"needs {mem.max_peak / GIB:.2f} GiB" in msg
    assert f"{(mem.max_peak - mem.m_eff) / GIB:.2f} GiB over M_eff={mem.m_eff / GIB:.2f} GiB" in msg
    assert "GPU 0 (and 7 like it)" in msg
    for v in ev.graph.vertices:  # greedy: everybody sits on the worst device
        assert v.name in msg
    assert exc.vertex in {v.name for v in ev.graph.vertices}


# ---------------------------------------------------------------------------- infeasible
@pytest.mark.parametrize("planner", [greedy_plan, concurrent_plan])
def test_70b_actor_on_eight_a100s_is_infeasible(ppo_70b, a100_1x1x8, planner):
    ev, dirs = _setup(ppo_70b, a100_1x1x8)
    train = ev.graph.index["actor_train"]
    legal = enumerate_strategies(a100_1x1x8, 80, 64)
    smallest = min(ev.costs.memory(train, s).isolated for s in legal)
    m_eff = a100_1x1x8.hardware.m_eff
    assert smallest > m_eff
    with pytest.raises(Infeasible) as info:
        planner(ev, dirs)
    exc = info.value
    msg = str(exc)
    assert exc.vertex == "actor_train"
    assert "'actor_train'" in msg
    assert exc.excess_bytes == pytest.approx(smallest - m_eff)
    assert f"{smallest / GIB:.1f} GiB per GPU" in msg
    over = re.search(r"([0-9.]+) GiB over M_eff=([0-9.]+) GiB", msg)
    assert over is not None
    assert float(over.group(1)) == pytest.approx((smallest - m_eff) / GIB, abs=0.05)
    assert float(over.group(2)) == pytest.approx(m_eff / GIB, abs=0.05)


def _full_scan_repair(ev, dirs, plan, max_moves=200):
    """The repair's rule scored on every strategy of the vertex's shape (no pruning): the
    reference :func:`repair_memory` must agree with."""
    ratio = ev.memory(plan).ratio
    moves = 0
    while ratio > 1.0 + 1e-9 and moves < max_moves:
        best = None
        for d in dirs:
            cur = plan.choices[d.vertex]
            t_cur = ev.costs.op_time(d.vertex, cur.strategy)
            for i in d.of_size(cur.allocation.size):
                if d.strategies[i] == cur.strategy:
                    continue
                trial = plan.replace(d.vertex, Choice(d.strategies[i], cur.allocation))
                r = ev.memory(trial).ratio
                if r < ratio - 1e-12 and (best is None or (d.times[i] - t_cur, r) < best[0]):
                    best = ((d.times[i] - t_cur, r), trial, r)
        if best is None:
            break
        _, plan, ratio = best
        moves += 1
    return plan if ratio <= 1.0 + 1e-9 else None


@pytest.mark.parametrize("name", ["ppo-7b-16gpu", "ppo-13b-64gpu", "grpo-8b-16gpu"])
@pytest.mark.parametrize("shrink", [1.0, 0.5])
def test_the_repair_picks_what_the_full_scan_picks(problem_of, name, shrink):
    """Scoring only the strategies below the current one's memory and on their shape's memory
    front changes no move: the repaired plans (and failures) are the full scan's, from the
    greedy start and from every concurrent partition, on the examples and on devices with half
    the memory (more moves)."""
    workload, cluster = problem_of(name)[:2]
    hw = dataclasses.replace(cluster.hardware, gpu_memory_bytes=cluster.hardware.gpu_memory_bytes * shrink)
    ev, dirs = _setup(workload, Cluster(*cluster.shape, hw))
    starts = [_fastest_on_all(ev, dirs)]
    for group in levels(ev):  # each level's members side by side, everything else on all GPUs
        sizes = [min(dirs[v].strategies[i].size for i in range(len(dirs[v]))) for v in group]
        choices = list(starts[0].choices)
        used = 0
        for v, size in zip(group, sizes):
            alloc = next(
                (a for a in ev.cluster.allocations_of_size(size) if not a.mask & used),
                None,
            )
            if alloc is None:
                break
            used |= alloc.mask
            choices[v] = Choice(dirs[v].strategies[dirs[v].of_size(size)[0]], alloc)
        starts.append(Plan(tuple(choices)))
    repaired = 0
    for start in starts:
        want = _full_scan_repair(ev, dirs, start)
        try:
            got = repair_memory(ev, dirs, start)
        except Infeasible:
            got = None
        assert got == want
        repaired += got is not None and got != start
    assert repaired, "no start needed a repair: the comparison tested nothing"


def test_a_repair_stops_at_its_deadline(tiny_ppo, cluster_1x2x4):
    hw = dataclasses.replace(cluster_1x2x4.hardware, gpu_memory_bytes=50e9)
    ev, dirs = _setup(tiny_ppo, Cluster(*cluster_1x2x4.shape, hw))
    fast = _fastest_on_all(ev, dirs)
    with pytest.raises(TimeUp):
        repair_memory(ev, dirs, fast, deadline=time.monotonic() - 1.0)
    with pytest.raises(TimeUp):
        greedy_plan(ev, dirs, deadline=time.monotonic() - 1.0)
    assert ev.memory(repair_memory(ev, dirs, fast, deadline=time.monotonic() + 3600)).ratio <= 1.0
    # a plan that fits needs no move: it is returned whatever the time
    ev, dirs = _setup(tiny_ppo, cluster_1x2x4)
    fits = _fastest_on_all(ev, dirs)
    assert repair_memory(ev, dirs, fits, deadline=time.monotonic() - 1.0) is fits

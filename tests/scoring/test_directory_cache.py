"""The process's caches of candidate directories and DP frontiers: a cached directory or frontier
is exactly the one built afresh, whatever input changed since the cache was filled (a key that
missed an input would hand a changed vertex its old candidates), and a caller's edits to what it
got never reach the cache."""

from __future__ import annotations

import dataclasses

import pytest

from rpeg import hardware_preset, solve
from rpeg.heuristics.dp_planner import _build_frontier, build_dp_instance, model_stages, size_chain
from rpeg.ir.templates import Structure, structures
from rpeg.scoring.candidates import _build_directory, build_directories, directory_key
from rpeg.scoring.evaluator import Evaluator
from rpeg.solvers import clear_caches
from tests.conftest import example_problem


def _fresh(ev: Evaluator) -> list[tuple]:
    """Every directory of ``ev``, built without the cache."""
    out = []
    for vi in range(len(ev.graph.vertices)):
        d = _build_directory(ev.costs, vi, {})
        out.append((d.vertex, d.strategies, d.times, d.dropped, d.smallest_isolated, d.dominated))
    return out


def _listed(dirs) -> list[tuple]:
    return [(d.vertex, d.strategies, d.times, d.dropped, d.smallest_isolated, d.dominated) for d in dirs]


@pytest.fixture(scope="module")
def base():
    workload, cluster, _ = example_problem("ppo-1b-4gpu")
    return workload, cluster


def _variants(workload, cluster):
    """One change of each input a directory depends on (the workload's lengths, length quantiles,
    reward cost and updates; the cluster's hardware and a parallelism switch; a model)."""
    w = workload
    actor = w.models["actor"]
    yield "prompt_len", dataclasses.replace(w, prompt_len=w.prompt_len * 2), cluster
    yield "response_len", dataclasses.replace(w, response_len=w.response_len // 2, quantiles=None), cluster
    q = ((0.5, w.response_len // 4), (1.0, w.response_len))
    yield "quantiles", dataclasses.replace(w, quantiles=q), cluster
    yield "mini_batches", dataclasses.replace(w, mini_batches=4), cluster
    yield (
        "model",
        dataclasses.replace(
            w, models={**w.models, "actor": dataclasses.replace(actor, layers=actor.layers * 2)}
        ),
        cluster,
    )
    yield "hardware", w, dataclasses.replace(cluster, hardware=hardware_preset("a100-40gb"))
    yield (
        "switch",
        w,
        dataclasses.replace(
            cluster, virtual_pipeline_parallel=not cluster.virtual_pipeline_parallel, host_offload=False
        ),
    )


def test_a_cached_directory_is_the_one_built_afresh_whatever_changed(base):
    workload, cluster = base
    clear_caches()
    first = Evaluator(workload, cluster)
    assert _listed(build_directories(first.costs)) == _fresh(first)
    for name, w, c in _variants(workload, cluster):
        ev = Evaluator(w, c)
        fresh = _fresh(ev)
        assert fresh != _fresh(first), f"{name}: the change does not move any directory (no test)"
        assert _listed(build_directories(ev.costs)) == fresh, name
        # and again, from the cache
        assert _listed(build_directories(ev.costs)) == fresh, name
    # the first workload's entries are still right after the others were added
    assert _listed(build_directories(Evaluator(workload, cluster).costs)) == _fresh(first)


def test_vertices_with_one_key_have_one_directory(base):
    """Two vertices of a graph share a key only when everything their directories read is equal
    (PPO's reward and critic inference: one spec, scalar heads): their fresh directories are
    equal, so one cache entry serves both."""
    workload, cluster = base
    ev = Evaluator(workload, cluster)
    fresh = _fresh(ev)
    by_key: dict[tuple, list[int]] = {}
    for v in range(len(ev.graph.vertices)):
        by_key.setdefault(directory_key(ev.costs, v), []).append(v)
    shared = [vs for vs in by_key.values() if len(vs) > 1]
    assert shared, "no two vertices share a key here (no test)"
    for vs in shared:
        assert len({(tuple(fresh[v][1]), tuple(fresh[v][2])) for v in vs}) == 1, vs


def test_edits_to_a_directory_never_reach_the_cache(base):
    workload, cluster = base
    clear_caches()
    ev = Evaluator(workload, cluster)
    dirs = build_directories(ev.costs)
    expected = _listed(build_directories(ev.costs))
    dirs[0].strategies.clear()
    dirs[0].times.clear()
    dirs[1].strategies = dirs[1].strategies[:1]
    assert _listed(build_directories(ev.costs)) == expected


def test_a_cached_frontier_is_the_one_built_afresh(base):
    """Every structure (sharing, staleness: what a frontier's memory terms read) and two changed
    workloads, after all of them filled the cache."""
    workload, cluster = base
    clear_caches()
    sizes = size_chain(cluster)
    cases = [(workload, y) for y in structures(workload)]
    cases += [(w, Structure.synchronous(w)) for name, w, c in _variants(workload, cluster) if c is cluster][
        :2
    ]
    cached = [build_dp_instance(Evaluator(w, cluster, y).costs) for w, y in cases]
    for (w, y), inst in zip(cases, cached):
        ev = Evaluator(w, cluster, y)
        for ms, f in zip(model_stages(ev.graph), inst.frontiers):
            fresh = _build_frontier(ev.costs, ms, sizes, inst.m_eff)
            assert dataclasses.astuple(f) == dataclasses.astuple(fresh), (y, ms.label)


def test_plans_are_the_same_with_the_caches_filled_or_empty(base):
    workload, cluster = base
    for method in ("greedy", "sa", "dp"):
        clear_caches()
        cold = (
            solve(workload, cluster, method, seed=0, max_evaluations=200)
            if method == "sa"
            else solve(workload, cluster, method)
        )
        warm = (
            solve(workload, cluster, method, seed=0, max_evaluations=200)
            if method == "sa"
            else solve(workload, cluster, method)
        )
        assert warm.plan == cold.plan and warm.evaluation.makespan == cold.evaluation.makespan, method


def test_the_cache_keeps_the_most_recently_used_and_builds_each_key_once():
    from rpeg.scoring.memo import KeyedCache

    built: list[str] = []

    def build(key: str):
        return lambda: built.append(key) or key.upper()

    cache: KeyedCache[str] = KeyedCache(2)
    assert [cache.get(k, build(k)) for k in "aab"] == ["A", "A", "B"] and built == ["a", "b"]
    cache.get("a", build("a"))  # a is now the most recent: c pushes b out
    cache.get("c", build("c"))
    assert len(cache) == 2 and cache.get("a", build("a")) == "A" and built == ["a", "b", "c"]
    cache.get("b", build("b"))
    assert built == ["a", "b", "c", "b"]
    cache.clear()
    assert len(cache) == 0
    nothing: KeyedCache[str] = KeyedCache(0)
    assert nothing.get("x", build("x")) == "X" and len(nothing) == 0

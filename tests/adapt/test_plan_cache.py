"""Tests of ``adapt/plan_cache.py``: the memoised planner and the fallback targets."""

from __future__ import annotations

import pytest

from rpeg.adapt.plan_cache import PlanCache


def test_fallback_targets_are_feasible_slower_and_distinct(job):
    strict = PlanCache(*job)  # the EMU layer's own memory rule: S* is often unreachable
    cur = strict.planned(1152, 32)
    best = strict.planned(1536, 32)
    alts = strict.alternatives(1536, 32, cur, best)
    assert alts, "no fallback target"
    lat = [strict.score(p, 1536).latency for p in alts]
    assert lat == sorted(lat) and min(lat) >= strict.score(best, 1536).latency - 1e-9
    assert all(strict.score(p, 1536).feasible and not p.same(best) and not p.same(cur) for p in alts)
    assert strict.alternatives(1536, 32, cur, best) is alts  # memoised


def test_the_planner_is_called_once_per_bucket_and_pool(cache):
    assert cache.lr(1100.0) == 1088 and cache.lr(10.0) == 64
    calls = cache.planner_calls
    a = cache.planned(cache.lr(1100.0), 32)
    b = cache.planned(cache.lr(1090.0), 32)
    assert a is b and cache.planner_calls <= calls + 1
    assert cache.transition(a, a) == 0.0


def test_plan_cache_validates_its_options(job):
    with pytest.raises(ValueError, match="unknown planner 'nope'"):
        PlanCache(*job, method="nope")
    with pytest.raises(ValueError, match="bucket"):
        PlanCache(*job, bucket=0)
    with pytest.raises(ValueError, match="transition_capacity"):
        PlanCache(*job, transition_capacity=0.0)

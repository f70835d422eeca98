"""Tests of ``adapt/simulate.py``: trace replays of the policies and the drift traces."""

from __future__ import annotations

import pytest

from rpeg.adapt.policies import Static, default_policies
from rpeg.adapt.simulate import DriftTrace, gpu_trace, length_trace, simulate


def _trace() -> DriftTrace:
    return DriftTrace(length_trace(8, 1100, 2600, seed=3), [32, 32, 32, 32, 16, 16, 32, 32], "short")


def test_simulator_policies_on_a_short_trace(job, cache):
    w, cl = job
    rep = simulate(w, cl, _trace(), cache=cache)
    assert list(rep) == ["static", "always-adapt", "every-3-steps", "any-positive-gain", "payback"]
    for r in rep.values():
        assert r.steps == 8
        assert r.mean_latency == pytest.approx((r.step_time + r.transition_time) / 8)
        assert all(x.transition == 0 or x.decision.admitted for x in r.records)
    st = rep["static"]
    assert all(x.decision.urgent for x in st.records if x.decision.admitted)  # only forced moves
    assert st.transitions == 1  # the pool drop at step 4
    # at step 5 (1774 → 2020 tokens; static keeps the plan forced onto 16 GPUs at step 4, which
    # uses the H100's 85.5 GB) the plan's resident activations stop fitting: its trainers switch to
    # full recomputation in place, which is not a transition (the rollout engine's cache is bounded
    # by its memory fraction, SPEC §14.5, so longer responses slow it down rather than outgrow it)
    assert [x.step for x in st.records if x.decision.leaner] == [5]
    assert rep["payback"].transitions <= rep["always-adapt"].transitions
    assert any(r.transition_time > 0 for r in rep.values())
    # static with enough GPUs and moderate growth never transitions
    calm = DriftTrace([1100, 1200, 1300, 1400], [32] * 4)
    assert simulate(w, cl, calm, [Static()], cache=cache)["static"].transitions == 0


def test_simulator_is_deterministic_and_learns_efficiency(job, cache):
    w, cl = job
    kw = dict(cache=cache, seed=7, noise=0.05, efficiency={"gemm": 1.2})
    a = simulate(w, cl, _trace(), default_policies(), **kw)
    b = simulate(w, cl, _trace(), default_policies(), **kw)
    for name in a:
        assert [x.latency for x in a[name].records] == [x.latency for x in b[name].records]
        assert a[name].transitions == b[name].transitions
    c = simulate(w, cl, _trace(), default_policies(), **{**kw, "seed": 8})
    assert [x.latency for x in c["static"].records] != [x.latency for x in a["static"].records]
    with pytest.raises(ValueError, match="distinct"):
        simulate(w, cl, _trace(), [Static(), Static()], cache=cache)
    with pytest.raises(ValueError, match="noise"):
        simulate(w, cl, _trace(), cache=cache, noise=-0.1)


def test_traces_validate_and_are_seeded():
    assert length_trace(25, 1147.5, 3722, seed=1) == length_trace(25, 1147.5, 3722, seed=1)
    g = gpu_trace(25, [8, 16, 32], start=32, changes=6, seed=2)
    assert len(g) == 25 and set(g) <= {8, 16, 32} and sum(a != b for a, b in zip(g, g[1:])) == 6
    with pytest.raises(ValueError, match="2 lengths but 3 pools"):
        DriftTrace([1.0, 2.0], [8, 8, 8])
    with pytest.raises(ValueError, match=r"DriftTrace.lengths\[1\]"):
        DriftTrace([1.0, 0.0], [8, 8])
    with pytest.raises(ValueError, match=r"DriftTrace.pools\[0\]"):
        DriftTrace([1.0], [0])
    assert len(DriftTrace([1.0, 2.0], [8, 8])) == 2

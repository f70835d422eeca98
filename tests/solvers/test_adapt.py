"""Tests of the adaptation controller (``solvers/adapt.py``) and the policy simulator
(``solvers/simulate.py``): triggers at their thresholds, the admission rule, horizons,
calibration, fallback targets and trace replays."""

from __future__ import annotations

import math

import pytest

from rpeg import Cluster, Workload, hardware_preset, model_preset
from rpeg.solvers.adapt import (
    AdaptConfig,
    Calibration,
    Controller,
    Horizon,
    Monitor,
    NoPlan,
    Payback,
    PlanCache,
    Signal,
    admit,
    pool_cluster,
    with_response_len,
)
from rpeg.solvers.simulate import (
    AlwaysAdapt,
    Static,
    Trace,
    default_policies,
    gpu_trace,
    length_trace,
    simulate,
)

GIB = 2**30
INF = float("inf")


@pytest.fixture(scope="module")
def job() -> tuple[Workload, Cluster]:
    m = model_preset("llama2-7b")
    w = Workload("ppo", {"actor": m, "critic": m, "reward": m}, 128, 1, 256, 1024, name="ppo-7b")
    return w, Cluster.from_shape("1x4x8", hardware_preset("h100"))


@pytest.fixture(scope="module")
def cache(job) -> PlanCache:
    """Transition memory check off (the EMU layer's ZeRO-0 accounting; docs/adaptation.md)."""
    return PlanCache(*job, transition_capacity=INF)


# ---------------------------------------------------------------------------- triggers
def _observe(mon: Monitor, length: float, pool: int = 32, peak: float = 0.0, devices: int = 32):
    return mon.observe(length, pool, peak_memory=peak, m_eff=10 * GIB, plan_devices=devices)


def test_length_trigger_fires_strictly_above_30_percent_and_resets():
    mon = Monitor(32, 1000.0)
    assert _observe(mon, 1300.0) == []  # exactly 30%: no
    assert _observe(mon, 700.0) == []  # −30%: no
    [t] = _observe(mon, 1301.0)
    assert t.signal is Signal.LENGTH and not t.urgent
    assert [x.signal for x in _observe(mon, 1301.0)] == [Signal.LENGTH]  # persists until a replan
    mon.reset_reference()
    assert mon.reference == 1301.0
    assert _observe(mon, 1301.0 * 1.3) == []
    assert [x.signal for x in _observe(mon, 1301.0 * 1.3 + 1)] == [Signal.LENGTH]
    assert [x.signal for x in _observe(mon, 1301.0 * 0.69)] == [Signal.LENGTH]


def test_pool_trigger_urgent_only_when_the_plan_loses_gpus():
    mon = Monitor(32, 1000.0)
    assert _observe(mon, 1000.0, pool=32, devices=32) == []
    [t] = _observe(mon, 1000.0, pool=16, devices=16)  # plan fits the smaller pool
    assert t.signal is Signal.POOL and not t.urgent
    [t] = _observe(mon, 1000.0, pool=32, devices=16)
    assert t.signal is Signal.POOL and not t.urgent
    [t] = _observe(mon, 1000.0, pool=8, devices=16)
    assert t.signal is Signal.POOL and t.urgent
    assert _observe(mon, 1000.0, pool=8, devices=8) == []


def test_memory_trigger_fires_above_m_eff_only():
    mon = Monitor(32, 1000.0)
    assert _observe(mon, 1000.0, peak=10 * GIB) == []
    [t] = _observe(mon, 1000.0, peak=10 * GIB * 1.001)
    assert t.signal is Signal.MEMORY and t.urgent


def test_horizon_is_one_until_an_interval_then_an_ema():
    h = Horizon(0.5)
    assert h.value == 1.0
    assert h.cross(3) == 1.0  # first crossing: no interval yet
    assert h.cross(7) == 4.0  # first interval sets H
    assert h.cross(9) == pytest.approx(0.5 * 4 + 0.5 * 2)
    with pytest.raises(ValueError, match="before the last crossing"):
        h.cross(1)
    with pytest.raises(ValueError, match="alpha"):
        Horizon(0.0)


# ---------------------------------------------------------------------------- admission
def test_admission_urgent_vs_opportunistic_and_the_gamma_h_boundary():
    assert admit(-5.0, 100.0, 1.0, urgent=True).admitted  # urgent: profitability waived
    assert not admit(-5.0, INF, 1.0, urgent=True).admitted  # ... but not feasibility
    assert not admit(0.0, 0.0, 10.0).admitted  # ΔL must be > 0
    # L_tran/ΔL = 4 steps; γ·H = 0.5·8 = 4: admitted exactly at the boundary
    a = admit(2.5, 10.0, 8.0, gamma=0.5)
    assert a.admitted and a.payback == 4.0
    assert not admit(2.5, 10.01, 8.0, gamma=0.5).admitted
    assert not admit(2.5, 10.0, 7.99, gamma=0.5).admitted
    assert admit(2.5, 10.0, 4.0, gamma=1.0).admitted
    assert not admit(2.5, 1e-9, 100.0, gamma=0.0).admitted  # γ = 0: only urgent transitions
    assert not admit(1.0, INF, 100.0).admitted
    with pytest.raises(ValueError, match="gamma"):
        admit(1.0, 1.0, 1.0, gamma=1.5)


# ---------------------------------------------------------------------------- calibration
def test_calibration_converges_to_a_constant_ratio():
    cal = Calibration(0.3)
    for _ in range(60):
        cal.observe_step(10.0, {"gemm": 1.0}, 15.0)
    assert cal.factors["gemm"] == pytest.approx(1.5, rel=1e-6)
    cal = Calibration(0.3)
    shares = {"gemm": 0.5, "collective/inter-node": 0.5}
    for _ in range(60):
        cal.observe_step(10.0, shares, 13.0)
    assert cal.predict(10.0, shares) == pytest.approx(13.0, rel=1e-6)
    assert cal.factors["gemm"] == pytest.approx(1.3, rel=1e-6)
    # unequal shares: the prediction still converges; the dominant class absorbs more
    cal = Calibration(0.3)
    shares = {"gemm": 0.8, "nongemm": 0.2}
    for _ in range(200):
        cal.observe_step(10.0, shares, 12.0)
    assert cal.predict(10.0, shares) == pytest.approx(12.0, rel=1e-6)
    assert cal.factors["gemm"] - 1 > cal.factors["nongemm"] - 1 > 0
    cal = Calibration(0.5)
    for _ in range(40):
        cal.observe_classes({"gemm": 2.0, "nongemm": 1.0}, {"gemm": 3.0, "nongemm": 0.5})
    assert cal.factors == pytest.approx({"gemm": 1.5, "nongemm": 0.5})


# ---------------------------------------------------------------------------- helpers
def test_pool_cluster_and_response_length_validation(job):
    w, cl = job
    assert pool_cluster(cl, 16).shape == (1, 2, 8)
    assert pool_cluster(cl, 4).shape == (1, 1, 4)
    with pytest.raises(ValueError, match=r"devices must be an integer in 1\.\.32, got 64"):
        pool_cluster(cl, 64)
    with pytest.raises(ValueError, match="12 devices"):
        pool_cluster(cl, 12)
    w2 = with_response_len(w, 2048)
    assert w2.response_len == 2048 and w2.quantiles[-1] == (1.0, 2048)
    assert [f for f, _ in w2.quantiles] == [f for f, _ in w.quantiles]
    with pytest.raises(ValueError, match="response_len"):
        with_response_len(w, 0)
    with pytest.raises(ValueError, match="max_fallbacks"):
        AdaptConfig(max_fallbacks=-1)


# ---------------------------------------------------------------------------- controller
def test_reference_resets_at_a_rejected_replan(cache):
    ctl = Controller(cache, 32, 1000.0, policy=Payback(gamma=0.0))  # γ = 0: rejects all
    d = ctl.boundary(1, 1400.0, 32)
    assert d.replanned and not d.admitted and ctl.monitor.reference == 1400.0
    assert not ctl.boundary(2, 1400.0, 32).triggers  # no retrigger on the persisting deviation


def test_urgent_pool_loss_always_moves_and_no_plan_raises(cache):
    ctl = Controller(cache, 32, 1100.0, policy=Static())
    d = ctl.boundary(1, 1100.0, 16)
    assert d.urgent and d.admitted and ctl.current.devices <= 16 and d.l_tran > 0
    w = cache.workload
    tiny = PlanCache(w, pool_cluster(cache.cluster, 8), transition_capacity=INF)
    ctl = Controller(tiny, 8, 1100.0)
    with pytest.raises(NoPlan, match=r"Lr=.* on a pool of 2 devices"):
        ctl.boundary(1, 1100.0, 2)


def test_fallback_targets_are_feasible_slower_and_distinct(job):
    strict = PlanCache(*job)  # the EMU layer's own memory rule: S* is often unreachable
    cur = strict.planned(1152, 32)
    best = strict.planned(1536, 32)
    alts = strict.alternatives(1536, 32, cur, best)
    assert alts, "no fallback target"
    lat = [strict.score(p, 1536).latency for p in alts]
    assert lat == sorted(lat) and min(lat) >= strict.score(best, 1536).latency - 1e-9
    assert all(strict.score(p, 1536).feasible and not p.same(best) and not p.same(cur) for p in alts)
    ctl = Controller(strict, 32, 1100.0, policy=AlwaysAdapt(), initial=cur)
    d = ctl.boundary(1, 1536.0, 32)
    assert d.replanned
    if math.isinf(strict.transition(cur, best)):
        assert d.fallback != "" or "targets tried" in d.reason


# ---------------------------------------------------------------------------- simulator
def _trace() -> Trace:
    return Trace(length_trace(8, 1100, 2600, seed=3), [32, 32, 32, 32, 16, 16, 32, 32], "short")


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
    assert rep["payback"].transitions <= rep["always-adapt"].transitions
    assert any(r.transition_time > 0 for r in rep.values())
    # static with enough GPUs and moderate growth never transitions
    calm = Trace([1100, 1200, 1300, 1400], [32] * 4)
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


def test_traces_validate_and_are_seeded():
    assert length_trace(25, 1147.5, 3722, seed=1) == length_trace(25, 1147.5, 3722, seed=1)
    g = gpu_trace(25, [8, 16, 32], start=32, changes=6, seed=2)
    assert len(g) == 25 and set(g) <= {8, 16, 32} and sum(a != b for a, b in zip(g, g[1:])) == 6
    with pytest.raises(ValueError, match="2 lengths but 3 pools"):
        Trace([1.0, 2.0], [8, 8, 8])
    with pytest.raises(ValueError, match=r"Trace.lengths\[1\]"):
        Trace([1.0, 0.0], [8, 8])

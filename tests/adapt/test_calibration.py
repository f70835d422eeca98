"""Tests of ``adapt/calibration.py``: the per-class factors converge to a constant slowdown, and
a plan's operation-class shares sum to one."""

from __future__ import annotations

import pytest

from rpeg.adapt.calibration import Calibration, class_shares


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


def test_calibration_validates_its_inputs():
    with pytest.raises(ValueError, match="alpha"):
        Calibration(0.0)
    with pytest.raises(ValueError, match=r"initial\['gemm'\]"):
        Calibration(0.3, {"gemm": 0.0})
    with pytest.raises(ValueError, match="positive base and measured"):
        Calibration().observe_step(0.0, {"gemm": 1.0}, 1.0)


def test_class_shares_of_a_plan_sum_to_one(cache):
    point = cache.planned(1024, 32)
    shares = class_shares(cache.evaluator(1024, 32), point.plan)
    assert sum(shares.values()) == pytest.approx(1.0)
    assert all(w > 0 for w in shares.values())
    assert "gemm" in shares and all(k in ("gemm", "nongemm") or k.startswith("collective/") for k in shares)
    assert list(shares) == sorted(shares)

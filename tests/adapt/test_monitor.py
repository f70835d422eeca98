"""Tests of ``adapt/monitor.py``: each trigger at its threshold, the length reference reset and
the horizons ``H_x``."""

from __future__ import annotations

import pytest

from rpeg.adapt.monitor import Horizon, Monitor, Signal

GIB = 2**30


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


def test_monitor_keeps_its_series_and_rejects_bad_lengths():
    mon = Monitor(32, 1000.0, ma_alpha=0.5)
    _observe(mon, 2000.0, pool=16, devices=16)
    assert mon.lengths == [1000.0, 2000.0] and mon.pools == [32, 16]
    assert mon.length_ma == pytest.approx(1500.0)
    with pytest.raises(ValueError, match="length must be positive"):
        _observe(mon, 0.0)
    with pytest.raises(ValueError, match=r"Monitor\.length"):
        Monitor(32, 0.0)
    with pytest.raises(ValueError, match=r"Monitor\.delta_len"):
        Monitor(32, 1000.0, delta_len=0.0)


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

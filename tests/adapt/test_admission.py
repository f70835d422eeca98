"""Tests of ``adapt/admission.py``: the payback rule (SPEC §10, Nereus Eq. 2) at its boundary."""

from __future__ import annotations

import pytest

from rpeg.adapt.admission import admit

INF = float("inf")


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
    with pytest.raises(ValueError, match="horizon"):
        admit(1.0, 1.0, 0.0)

"""The admission rule (SPEC §10 "Admission"; Nereus paper Eq. 2).

Urgent (the current plan is infeasible) → admit iff the transition is feasible; opportunistic →
admit iff ``ΔL = L_step(S) − L_step(S*) > 0`` and ``L_tran/ΔL ≤ γ·H_x`` (``γ = 0.5``).
``L_step`` is the calibrated predicted step latency (evaluator makespan / ``k_eval`` times the
calibration factor, :mod:`rpeg.adapt.calibration`); ``H_x`` is the signal's horizon
(:class:`~rpeg.adapt.monitor.Horizon`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["GAMMA", "Admission", "admit"]

GAMMA = 0.5


@dataclass(frozen=True)
class Admission:
    """An admission verdict: ``admitted``, the reason, and the payback ``L_tran/ΔL`` in steps."""

    admitted: bool
    reason: str
    payback: float = math.nan


def admit(
    delta_l: float, l_tran: float, horizon: float, *, gamma: float = GAMMA, urgent: bool = False
) -> Admission:
    """The SPEC §10 admission rule (Nereus Eq. 2).

    Urgent: admit iff ``L_tran`` is finite (the transition is feasible). Opportunistic: admit iff
    ``ΔL > 0`` and ``L_tran/ΔL ≤ γ·H_x``.

    Parameters
    ----------
    delta_l
        ``ΔL = L_step(S) − L_step(S*)`` in seconds per step.
    l_tran
        Transition length in seconds (``inf``: infeasible).
    horizon
        ``H_x`` in steps.
    gamma
        Confidence margin ``γ ∈ [0, 1]`` (``γ = 0`` admits only urgent transitions).
    urgent
        Whether the current plan is infeasible.

    Examples
    --------
    >>> admit(2.0, 1.0, 1.0).admitted          # payback 0.5 step ≤ 0.5·1
    True
    >>> admit(2.0, 1.1, 1.0).admitted
    False
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    if not horizon > 0:
        raise ValueError(f"horizon must be positive, got {horizon!r}")
    if not math.isfinite(l_tran):
        return Admission(False, "transition infeasible")
    if urgent:
        return Admission(True, "urgent: current plan infeasible")
    if not delta_l > 0:
        return Admission(False, f"no gain (ΔL = {delta_l:.3f} s)")
    payback = l_tran / delta_l
    if payback <= gamma * horizon:
        return Admission(True, f"payback {payback:.2f} ≤ γ·H = {gamma * horizon:.2f} steps", payback)
    return Admission(False, f"payback {payback:.2f} > γ·H = {gamma * horizon:.2f} steps", payback)

"""Adaptation policies: when to replan and what to admit (SPEC §10; Nereus §7.3.3).

A :class:`Policy` is a small pluggable piece the controller
(:class:`~rpeg.adapt.controller.AdaptController`) consults at every boundary. Urgent replans —
the current plan uses a lost GPU or its predicted peak exceeds ``M_eff`` — are forced by the
controller for every policy, and admitted if feasible, else by checkpoint/restart.

* :class:`Payback` (ours, Nereus) — replans on triggers, admits by the payback rule
  :func:`~rpeg.adapt.admission.admit`;
* :class:`Static` — never replans unless forced; after a forced move it keeps the new plan (it
  does not grow back when GPUs return; the paper's static baseline scales DP with the pool,
  ours keeps the whole plan);
* :class:`AlwaysAdapt` — replans whenever a trigger fires and switches to any different target
  whose transition is feasible (no payback check);
* :class:`EveryK` (``k = 3``) — replans every ``k`` steps and switches to the planner's target;
* :class:`AnyPositiveGain` (DynaRL-style) — replans at every step and switches whenever
  ``ΔL > 0``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .admission import GAMMA, Admission, admit
from .monitor import Trigger

__all__ = ["AlwaysAdapt", "AnyPositiveGain", "EveryK", "Payback", "Policy", "Static", "default_policies"]


class Policy(Protocol):
    """When to replan and what to admit (the controller enforces urgent replans itself)."""

    name: str

    def replan(self, step: int, triggers: Sequence[Trigger]) -> bool:
        """Whether to replan at this boundary (``triggers``: those that fired)."""
        ...

    def admit(self, delta_l: float, l_tran: float, horizon: float, urgent: bool) -> Admission:
        """Whether to execute a feasible transition to the target."""
        ...


@dataclass(frozen=True)
class Payback:
    """Nereus: replan on triggers, admit by :func:`admit` with margin ``gamma``."""

    gamma: float = GAMMA
    name: str = "payback"

    def replan(self, step: int, triggers: Sequence[Trigger]) -> bool:
        return bool(triggers)

    def admit(self, delta_l: float, l_tran: float, horizon: float, urgent: bool) -> Admission:
        return admit(delta_l, l_tran, horizon, gamma=self.gamma, urgent=urgent)


@dataclass(frozen=True)
class Static:
    """Keep the plan; only forced (urgent) replans move it."""

    name: str = "static"

    def replan(self, step: int, triggers: Sequence[Trigger]) -> bool:
        return False

    def admit(self, delta_l: float, l_tran: float, horizon: float, urgent: bool) -> Admission:
        if urgent and math.isfinite(l_tran):
            return Admission(True, "urgent: current plan infeasible")
        return Admission(False, "static")


@dataclass(frozen=True)
class AlwaysAdapt:
    """Replan on every trigger; switch to any different target (no payback)."""

    name: str = "always-adapt"

    def replan(self, step: int, triggers: Sequence[Trigger]) -> bool:
        return bool(triggers)

    def admit(self, delta_l: float, l_tran: float, horizon: float, urgent: bool) -> Admission:
        ok = math.isfinite(l_tran)
        return Admission(ok, "always" if ok else "transition infeasible")


@dataclass(frozen=True)
class EveryK:
    """Replan every ``k`` steps (and when forced); switch to the planner's target."""

    k: int = 3
    name: str = "every-3-steps"

    def replan(self, step: int, triggers: Sequence[Trigger]) -> bool:
        return step > 0 and step % self.k == 0

    def admit(self, delta_l: float, l_tran: float, horizon: float, urgent: bool) -> Admission:
        ok = math.isfinite(l_tran)
        return Admission(ok, f"every {self.k} steps" if ok else "transition infeasible")


@dataclass(frozen=True)
class AnyPositiveGain:
    """DynaRL-style: replan at every step, switch whenever ``ΔL > 0``."""

    name: str = "any-positive-gain"

    def replan(self, step: int, triggers: Sequence[Trigger]) -> bool:
        return True

    def admit(self, delta_l: float, l_tran: float, horizon: float, urgent: bool) -> Admission:
        if not math.isfinite(l_tran):
            return Admission(False, "transition infeasible")
        if urgent or delta_l > 0:
            return Admission(True, f"ΔL = {delta_l:.3f} s > 0" if not urgent else "urgent")
        return Admission(False, f"ΔL = {delta_l:.3f} s ≤ 0")


def default_policies(gamma: float = 0.5) -> list[Policy]:
    """The five policies of the comparison: static, always-adapt, every-3-steps,
    any-positive-gain and payback (``γ``)."""
    return [Static(), AlwaysAdapt(), EveryK(3), AnyPositiveGain(), Payback(gamma)]

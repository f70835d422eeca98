"""The adaptation controller: monitor → triggers → replan → admission → transition
(SPEC §10; Nereus paper §4).

At every safe boundary (an RL-step completion) the :class:`AdaptController` reads the GPU pool
and the mean response length of the coming step, checks its triggers
(:class:`~rpeg.adapt.monitor.Monitor`), lets its :class:`~rpeg.adapt.policies.Policy` decide
whether to replan, asks the planner for a target ``S*`` (cached by
:class:`~rpeg.adapt.plan_cache.PlanCache`), prices the transition with
:func:`~rpeg.solvers.transition.plan_transition` and admits it or not
(:func:`~rpeg.adapt.admission.admit`). After the step it receives the measured step time and
updates its per-class efficiencies (:class:`~rpeg.adapt.calibration.Calibration`).

When the current plan stops fitting in memory under the new length but its devices are still in
the pool, the controller first tries the same plan with leaner activation recomputation
(:meth:`AdaptController.leaner`: the training invocations' ``none`` → ``selective``, then every
trainer ``full``; docs/cost-model.md §4). Recomputation moves no weights, so such a plan is
adopted at no transition cost and the boundary then goes on as for a feasible plan (the memory
trigger does not fire; a length trigger may still ask the policy to replan).

When the transition to ``S*`` is infeasible the controller tries up to ``max_fallbacks`` slower
targets (:meth:`~rpeg.adapt.plan_cache.PlanCache.alternatives`); the first one whose transition
is feasible goes through the same admission rule. When none is feasible an urgent replan falls
back to checkpoint/restart into ``S*`` at a fixed cost ``restart_s`` (default 600 s, the order of
the paper's 837 s UCP checkpoint/restart of an 8B actor/critic job, its Table 2); an
opportunistic one keeps the current plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..ir.plan import Choice, Plan
from ..ir.types import Recompute, Role
from .calibration import CALIB_ALPHA, Calibration
from .monitor import DELTA_LEN, H_ALPHA, Horizon, Monitor, Signal, Trigger
from .plan_cache import NoPlan, PlanCache, PlanPoint
from .policies import Payback, Policy

__all__ = ["RESTART_S", "AdaptConfig", "AdaptController", "Decision"]

RESTART_S = 600.0


@dataclass(frozen=True)
class AdaptConfig:
    """Controller settings (defaults: SPEC §10; ``delta_len`` and ``h_alpha`` are described in
    :mod:`rpeg.adapt.monitor`, ``calib_alpha`` in :mod:`rpeg.adapt.calibration`, ``max_fallbacks``
    and ``restart_s`` in this module's docstring).

    Raises
    ------
    ValueError
        On a bad field (named with its value).
    """

    delta_len: float = DELTA_LEN
    h_alpha: float = H_ALPHA
    calib_alpha: float = CALIB_ALPHA
    max_fallbacks: int = 4
    restart_s: float = RESTART_S

    def __post_init__(self) -> None:
        if not self.delta_len > 0:
            raise ValueError(f"AdaptConfig.delta_len must be positive, got {self.delta_len!r}")
        if not 0 < self.h_alpha <= 1:
            raise ValueError(f"AdaptConfig.h_alpha must be in (0, 1], got {self.h_alpha!r}")
        if not 0 < self.calib_alpha <= 1:
            raise ValueError(f"AdaptConfig.calib_alpha must be in (0, 1], got {self.calib_alpha!r}")
        if not isinstance(self.max_fallbacks, int) or self.max_fallbacks < 0:
            raise ValueError(
                f"AdaptConfig.max_fallbacks must be a non-negative integer, got {self.max_fallbacks!r}"
            )
        if not self.restart_s >= 0:
            raise ValueError(f"AdaptConfig.restart_s must be non-negative, got {self.restart_s!r}")


@dataclass
class Decision:
    """What the controller did at one boundary.

    Attributes
    ----------
    step
        The step about to run.
    triggers
        Triggers that fired.
    replanned
        Whether the planner was asked.
    urgent
        Whether the current plan was infeasible.
    target
        The target considered (after any fallback), or ``None``.
    admitted
        Whether the plan changed.
    reason
        Admission reason (or why nothing was considered).
    l_tran, delta_l, horizon, payback
        The admission inputs (``nan`` when not computed).
    fallback
        Label of the fallback target used (``""``: ``S*`` itself; ``"restart"``: checkpoint/restart).
    leaner
        ``""``, or how the current plan's recomputation was made leaner before the triggers were
        checked (e.g. ``"actor_train none→selective"``): the plan no longer fitted, the leaner one
        does, and no weights moved (not a transition).
    """

    step: int
    triggers: list[Trigger] = field(default_factory=list)
    replanned: bool = False
    urgent: bool = False
    target: PlanPoint | None = None
    admitted: bool = False
    reason: str = ""
    l_tran: float = 0.0
    delta_l: float = math.nan
    horizon: float = math.nan
    payback: float = math.nan
    fallback: str = ""
    leaner: str = ""


class AdaptController:
    """Monitor → triggers → replan → admission → (transition) at each boundary (module docstring).

    Parameters
    ----------
    cache
        Planner/evaluator/transition oracle (shared across controllers to reuse its memo).
    pool, length
        Devices and mean response length at start.
    policy
        When to replan and what to admit (default :class:`~rpeg.adapt.policies.Payback` with
        ``γ = 0.5``).
    config
        Thresholds and EMA weights.
    initial
        The starting plan (default: the planner's plan for ``(length, pool)``).
    """

    def __init__(
        self,
        cache: PlanCache,
        pool: int,
        length: float,
        *,
        policy: Policy | None = None,
        config: AdaptConfig | None = None,
        initial: PlanPoint | None = None,
    ) -> None:
        self.cache = cache
        self.config = config or AdaptConfig()
        self.policy: Policy = policy or Payback()
        self.monitor = Monitor(pool, length, delta_len=self.config.delta_len)
        self.horizons = {
            Signal.POOL: Horizon(self.config.h_alpha),
            Signal.LENGTH: Horizon(self.config.h_alpha),
        }
        self.calibration = Calibration(self.config.calib_alpha)
        self.lr = cache.lr(length)
        self.current = initial or cache.planned(self.lr, pool)
        self.decisions: list[Decision] = []

    def predicted(self, point: PlanPoint, lr: int | None = None) -> float:
        """Calibrated ``L_step`` of ``point`` at ``lr`` (default: the current length); ``inf`` if
        memory-infeasible."""
        s = self.cache.score(point, self.lr if lr is None else lr)
        return self.calibration.predict(s.latency, s.shares) if s.feasible else math.inf

    def boundary(self, step: int, length: float, pool: int) -> Decision:
        """Decide at the boundary before ``step`` with mean response length ``length`` and
        ``pool`` devices; on admission :attr:`current` becomes the target.

        Raises
        ------
        NoPlan
            When the current plan is infeasible and no memory-feasible target exists.
        """
        cache = self.cache
        self.lr = lr = cache.lr(length)
        cur = self.current
        s = cache.score(cur, lr)
        leaner = ""
        if not s.feasible and cur.devices <= pool:
            found = self.leaner(cur, lr)
            if found is not None:
                self.current, leaner = found
                cur = self.current
                s = cache.score(cur, lr)
        m_eff = cache.cluster.hardware.m_eff
        triggers = self.monitor.observe(
            length, pool, peak_memory=s.peak, m_eff=m_eff, plan_devices=cur.devices
        )
        d = Decision(step, triggers, leaner=leaner)
        self.decisions.append(d)
        hs = [self.horizons[t.signal].cross(step) for t in triggers if t.signal in self.horizons]
        d.horizon = min(hs) if hs else min(h.value for h in self.horizons.values())
        urgent = any(t.urgent for t in triggers)
        d.urgent = urgent
        if not (urgent or self.policy.replan(step, triggers)):
            d.reason = "no replan"
            return d
        d.replanned = True
        self.monitor.reset_reference()
        try:
            best = cache.planned(lr, pool)
        except NoPlan as exc:
            if urgent:
                raise
            d.reason = f"no target: {exc}"
            return d
        l_cur = math.inf if urgent else self.predicted(cur)
        candidates = [best]
        for cand in candidates:
            if cand.same(cur):
                d.target, d.reason = cand, "target is the current plan"
                return d
            l_tran = cache.transition(cur, cand)
            if math.isfinite(l_tran):
                d.target, d.l_tran = cand, l_tran
                d.delta_l = l_cur - self.predicted(cand)
                a = self.policy.admit(d.delta_l, l_tran, d.horizon, urgent)
                d.admitted, d.reason, d.payback = a.admitted, a.reason, a.payback
                d.fallback = "" if cand is best else cand.label
                if a.admitted:
                    self.current = cand
                else:
                    d.l_tran = 0.0
                return d
            if cand is best:  # S* is infeasible: slower targets with cheaper transitions
                candidates.extend(cache.alternatives(lr, pool, cur, best)[: self.config.max_fallbacks])
        if urgent:
            d.target, d.admitted, d.fallback = best, True, "restart"
            d.l_tran = self.config.restart_s
            d.reason = "urgent: every transition infeasible, checkpoint/restart"
            self.current = best
            return d
        d.target, d.reason, d.l_tran = best, f"transition infeasible ({len(candidates)} targets tried)", 0.0
        return d

    def leaner(self, point: PlanPoint, lr: int) -> tuple[PlanPoint, str] | None:
        """``point`` with leaner activation recomputation that fits under ``lr``, and what changed
        (``"v mode→mode, …"``); ``None`` when it has no leaner mode or none fits.

        Tried in order: every training invocation at ``none`` moved to ``selective``; then every
        training invocation at ``full``. The layouts and allocations stay, so the transition is
        free (no weights move).
        """
        g = self.cache.evaluator(lr, point.pool).graph
        steps = (
            {Recompute.NONE: Recompute.SELECTIVE},
            {Recompute.NONE: Recompute.FULL, Recompute.SELECTIVE: Recompute.FULL},
        )
        for step in steps:
            choices, changed = [], []
            for v, c in zip(g.vertices, point.plan.choices):
                mode = step.get(c.strategy.recompute) if v.role is Role.TRAINING else None
                if mode is None:
                    choices.append(c)
                    continue
                choices.append(Choice(c.strategy.with_recompute(mode), c.allocation))
                changed.append(f"{v.name} {c.strategy.recompute.value}→{mode.value}")
            if not changed:
                continue
            lean = PlanPoint(Plan(tuple(choices)), point.pool, "leaner recompute")
            if self.cache.score(lean, lr).feasible:
                return lean, ", ".join(changed)
        return None

    def measured(self, seconds: float) -> float:
        """Feed the measured time of the step just run (current plan, current length) to the
        calibration; returns the error ratio ``r``."""
        s = self.cache.score(self.current, self.lr)
        self.monitor.measured.append(seconds)
        self.monitor.predicted.append(self.calibration.predict(s.latency, s.shares))
        return self.calibration.observe_step(s.latency, s.shares, seconds)

"""Trace-driven replay of adaptation policies (SPEC §10; Nereus §7.3.3).

:func:`simulate` replays a :class:`Trace` — the mean response length and the available devices
of every RL step — under each policy with its own :class:`~rpeg.solvers.adapt.Controller`, all
sharing one :class:`~rpeg.solvers.adapt.PlanCache` (planner results per (length bucket, pool),
evaluations per (plan, bucket), transition lengths per plan pair), so a replay costs a few
planner calls per bucket, not per step.

Step ``i``: at the boundary before it the controller sees ``(x_i, n_i)`` (the monitor is assumed
to know the coming step's mean length — a perfect one-step predictor), decides, and an admitted
transition costs ``L_tran`` seconds before the step. The step then runs on the current plan; its
*measured* time is

    T_i = L₀(plan, x_i)·Σ_c w_c·k_c·(1 + σ·ε_i),   ε_i ~ N(0, 1) from ``seed``,

with ``L₀`` the uncalibrated evaluator makespan/``k_eval``, ``w_c`` the plan's class shares and
``k_c`` the true per-class slowdowns (``efficiency``, default 1). The same ``ε_i`` serve every
policy. ``T_i`` feeds the controller's calibration. Reported per policy: mean step latency
including transition time ``(Σ T_i + Σ L_tran)/steps``, number of transitions and seconds spent
transitioning.

Policies (SPEC §10; urgent replans — the current plan uses a lost GPU or its predicted peak
exceeds ``M_eff`` — are forced by the controller for every policy, and admitted if feasible, else
by checkpoint/restart):

* :class:`Static` — never replans unless forced; after a forced move it keeps the new plan (it
  does not grow back when GPUs return; the paper's static baseline scales DP with the pool,
  ours keeps the whole plan);
* :class:`AlwaysAdapt` — replans whenever a trigger fires and switches to any different target
  whose transition is feasible (no payback check);
* :class:`EveryK` (``k = 3``) — replans every ``k`` steps and switches to the planner's target;
* :class:`AnyPositiveGain` (DynaRL-style) — replans at every step and switches whenever
  ``ΔL > 0``;
* :class:`~rpeg.solvers.adapt.Payback` (ours) — replans on triggers, admits by the payback rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..ir.cluster import Cluster
from ..ir.workload import Workload
from .adapt import AdaptConfig, Admission, Controller, Decision, Payback, PlanCache, Policy, Trigger

__all__ = [
    "AlwaysAdapt",
    "AnyPositiveGain",
    "EveryK",
    "PolicyReport",
    "Static",
    "StepRecord",
    "Trace",
    "default_policies",
    "gpu_trace",
    "length_trace",
    "simulate",
]


# ---------------------------------------------------------------------------- traces
@dataclass(frozen=True)
class Trace:
    """Per RL step: the mean response length (tokens) and the devices available.

    Raises
    ------
    ValueError
        If the two series differ in length, are empty, or hold a non-positive value.
    """

    lengths: tuple[float, ...]
    pools: tuple[int, ...]
    name: str = "trace"

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", tuple(float(x) for x in self.lengths))
        object.__setattr__(self, "pools", tuple(int(x) for x in self.pools))
        if not self.lengths:
            raise ValueError("Trace.lengths must not be empty")
        if len(self.lengths) != len(self.pools):
            raise ValueError(f"Trace: {len(self.lengths)} lengths but {len(self.pools)} pools")
        for i, (x, n) in enumerate(zip(self.lengths, self.pools)):
            if not x > 0:
                raise ValueError(f"Trace.lengths[{i}] must be positive, got {x!r}")
            if n < 1:
                raise ValueError(f"Trace.pools[{i}] must be a positive device count, got {n!r}")

    def __len__(self) -> int:
        return len(self.lengths)


def length_trace(steps: int, start: float, end: float, *, noise: float = 0.03, seed: int = 0) -> list[float]:
    """Mean response length growing geometrically from ``start`` to ``end`` over ``steps`` steps,
    times ``(1 + noise·ε)``, ``ε ~ N(0, 1)`` (the Nereus trace: 1,147 → 3,722 tokens over 25 steps)."""
    if steps < 2:
        raise ValueError(f"length_trace: steps must be at least 2, got {steps!r}")
    rng = np.random.default_rng(seed)
    out = []
    for i in range(steps):
        base = start * (end / start) ** (i / (steps - 1))
        out.append(max(1.0, base * (1.0 + noise * rng.standard_normal())))
    return out


def gpu_trace(steps: int, levels: Sequence[int], *, start: int, changes: int, seed: int = 0) -> list[int]:
    """Devices per step: ``start``, then ``changes`` availability changes at distinct random steps,
    each to a different level drawn from ``levels`` (spot reclaims and returns)."""
    rng = np.random.default_rng(seed)
    if changes >= steps:
        raise ValueError(f"gpu_trace: changes must be fewer than steps ({steps}), got {changes!r}")
    at = sorted(rng.choice(np.arange(1, steps), size=changes, replace=False).tolist())
    out, level = [], start
    for i in range(steps):
        if at and i == at[0]:
            at.pop(0)
            level = int(rng.choice([x for x in levels if x != level]))
        out.append(level)
    return out


# ---------------------------------------------------------------------------- policies
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


# ---------------------------------------------------------------------------- replay
@dataclass(frozen=True)
class StepRecord:
    """One replayed step: length, pool, measured step seconds, transition seconds before it,
    the plan's label and the controller's decision."""

    step: int
    length: float
    pool: int
    latency: float
    transition: float
    plan: str
    decision: Decision = field(repr=False)


@dataclass
class PolicyReport:
    """Per-policy outcome of a replay (module docstring)."""

    policy: str
    records: list[StepRecord]

    @property
    def steps(self) -> int:
        return len(self.records)

    @property
    def transitions(self) -> int:
        """Admitted plan changes (checkpoint/restarts included)."""
        return sum(1 for r in self.records if r.decision.admitted)

    @property
    def transition_time(self) -> float:
        """``Σ L_tran`` of the admitted transitions, seconds."""
        return sum(r.transition for r in self.records)

    @property
    def step_time(self) -> float:
        """``Σ T_i``, seconds."""
        return sum(r.latency for r in self.records)

    @property
    def mean_latency(self) -> float:
        """``(Σ T_i + Σ L_tran)/steps``: mean step latency including transitions."""
        return (self.step_time + self.transition_time) / self.steps

    @property
    def replans(self) -> int:
        return sum(1 for r in self.records if r.decision.replanned)

    @property
    def restarts(self) -> int:
        return sum(1 for r in self.records if r.decision.fallback == "restart")

    def summary(self) -> str:
        return (
            f"{self.policy}: {self.mean_latency:.2f} s/step over {self.steps} steps, "
            f"{self.transitions} transitions, {self.transition_time:.1f} s transitioning"
        )


def simulate(
    workload: Workload,
    cluster: Cluster,
    trace: Trace,
    policies: Sequence[Policy] | None = None,
    *,
    seed: int = 0,
    noise: float = 0.0,
    efficiency: Mapping[str, float] | None = None,
    config: AdaptConfig | None = None,
    cache: PlanCache | None = None,
    method: str = "dp",
    k_eval: int = 2,
    bucket: int = 64,
    transition_capacity: float | None = None,
) -> dict[str, PolicyReport]:
    """Replay ``trace`` under each policy (module docstring).

    Parameters
    ----------
    workload
        The job (its response length is replaced by the trace's, bucketed).
    cluster
        The full cluster; a pool of ``n`` devices is its first ``n`` flat ids.
    trace
        Lengths and pools per step.
    policies
        Default: :func:`default_policies` (five, ``γ = 0.5``). Names must be distinct.
    seed
        Seed of the measurement noise ``ε_i``.
    noise
        ``σ`` of the multiplicative measurement noise.
    efficiency
        True per-class slowdowns ``k_c`` the controllers must learn (default 1 for every class).
    config
        Controller settings.
    cache
        A :class:`PlanCache` to reuse (built from ``method``, ``k_eval``, ``bucket`` otherwise).
    method, k_eval, bucket, transition_capacity
        Planner, scoring steps, length bucket and transition memory bound of a new cache.

    Returns
    -------
    dict
        Policy name → :class:`PolicyReport`, in the order given.

    Raises
    ------
    ValueError
        For duplicate policy names or a negative ``noise``.
    NoPlan
        When a step's pool and length admit no memory-feasible plan while the current one is
        infeasible (the message names the length and pool).
    """
    policies = list(policies) if policies is not None else default_policies()
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise ValueError(f"policy names must be distinct, got {names}")
    if not noise >= 0:
        raise ValueError(f"noise must be non-negative, got {noise!r}")
    cache = cache or PlanCache(
        workload,
        cluster,
        method=method,
        k_eval=k_eval,
        bucket=bucket,
        seed=seed,
        transition_capacity=transition_capacity,
    )
    eps = np.random.default_rng(seed).standard_normal(len(trace))
    true_k = dict(efficiency or {})
    out: dict[str, PolicyReport] = {}
    for policy in policies:
        ctl = Controller(cache, trace.pools[0], trace.lengths[0], policy=policy, config=config)
        records = []
        for i, (x, n) in enumerate(zip(trace.lengths, trace.pools)):
            d = ctl.boundary(i, x, n) if i > 0 else _first(ctl)
            s = cache.score(ctl.current, ctl.lr)
            measured = s.latency * sum(w * true_k.get(c, 1.0) for c, w in s.shares.items())
            measured *= max(0.05, 1.0 + noise * eps[i])
            ctl.measured(measured)
            records.append(
                StepRecord(i, x, n, measured, d.l_tran if d.admitted else 0.0, ctl.current.label, d)
            )
        out[policy.name] = PolicyReport(policy.name, records)
    return out


def _first(ctl: Controller) -> Decision:
    """Step 0 runs the initial plan (no boundary before it)."""
    d = Decision(0, reason="initial plan")
    ctl.decisions.append(d)
    return d

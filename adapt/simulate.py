"""Trace-driven replay of adaptation policies (SPEC §10; Nereus §7.3.3).

:func:`simulate` replays a :class:`DriftTrace` — the mean response length and the available
devices of every RL step — under each policy (:mod:`rpeg.adapt.policies`) with its own
:class:`~rpeg.adapt.controller.AdaptController`, all sharing one
:class:`~rpeg.adapt.plan_cache.PlanCache` (planner results per (length bucket, pool), evaluations
per (plan, bucket), transition lengths per plan pair), so a replay costs a few planner calls per
bucket, not per step.

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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..ir.cluster import Cluster
from ..ir.workload import Workload
from .controller import AdaptConfig, AdaptController, Decision
from .plan_cache import PlanCache
from .policies import Policy, default_policies

__all__ = ["DriftTrace", "PolicyReport", "StepRecord", "gpu_trace", "length_trace", "simulate"]


# ---------------------------------------------------------------------------- traces
@dataclass(frozen=True)
class DriftTrace:
    """Per RL step: the mean response length (tokens) and the devices available (the drift a
    replay adapts to; the runtime's record of an executed run is :class:`rpeg.runtime.trace.records.Trace`).

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
            raise ValueError("DriftTrace.lengths must not be empty")
        if len(self.lengths) != len(self.pools):
            raise ValueError(f"DriftTrace: {len(self.lengths)} lengths but {len(self.pools)} pools")
        for i, (x, n) in enumerate(zip(self.lengths, self.pools)):
            if not x > 0:
                raise ValueError(f"DriftTrace.lengths[{i}] must be positive, got {x!r}")
            if n < 1:
                raise ValueError(f"DriftTrace.pools[{i}] must be a positive device count, got {n!r}")

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
    trace: DriftTrace,
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
        ctl = AdaptController(cache, trace.pools[0], trace.lengths[0], policy=policy, config=config)
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


def _first(ctl: AdaptController) -> Decision:
    """Step 0 runs the initial plan (no boundary before it)."""
    d = Decision(0, reason="initial plan")
    ctl.decisions.append(d)
    return d

"""The adaptation controller: monitor, triggers, replan, admission, fallback, online calibration
(SPEC §10 "Admission", "Triggers", "Online calibration"; Nereus paper §4).

At every safe boundary (an RL-step completion) the :class:`Controller` reads the GPU pool and
the mean response length of the coming step, checks its triggers, lets its :class:`Policy` decide
whether to replan, asks the planner for a target ``S*`` (cached by :class:`PlanCache`), prices
the transition with :func:`~rpeg.solvers.transition.plan_transition` and admits it or not. After
the step it receives the measured step time and updates its per-class efficiencies.

**Triggers** (:class:`Monitor`, Nereus §4.1):

* *pool* — the number of available devices differs from the last step's; *urgent* when the
  current plan uses a device that is no longer in the pool (the pool of ``n`` devices is the
  first ``n`` flat ids of the full cluster, :func:`pool_cluster`);
* *memory* — the evaluator's predicted peak of the current plan under the new length exceeds
  ``M_eff``; always urgent;
* *length* — ``|x − x_ref|/x_ref > δ_len`` (``δ_len = 0.30``, strictly greater) for the mean
  response length ``x``; ``x_ref`` is the length at the last replan and is reset at *every*
  replan, admitted or not, so a persistent deviation does not retrigger at every step.

**Horizons** ``H_x`` (:class:`Horizon`): per signal (pool, length), an exponential moving average
``H ← (1 − α_H)·H + α_H·Δ`` (``α_H = 0.5``) of the steps ``Δ`` between successive threshold
crossings, updated at crossings; ``H = 1`` before the first interval is observed. When several
signals trigger at once the smallest ``H_x`` is used.

**Admission** (:func:`admit`, SPEC §10, Nereus Eq. 2): urgent (current plan infeasible) → admit
iff the transition is feasible; opportunistic → admit iff ``ΔL = L_step(S) − L_step(S*) > 0`` and
``L_tran/ΔL ≤ γ·H_x`` (``γ = 0.5``). ``L_step`` is the calibrated predicted step latency
(evaluator makespan / ``k_eval`` times the calibration factor).

**Fallback** (:meth:`PlanCache.alternatives`): when the transition to ``S*`` is infeasible
(:class:`~rpeg.ir.emu.TransitionInfeasible`), the controller tries up to ``max_fallbacks``
slightly slower targets in increasing predicted latency, built from the ``dp`` planner's
frontiers on the new pool and length:

1. *re-fit*: every model-stage whose current strategy is still on its frontier keeps it, the
   others are re-planned (the current layout re-fitted: fewest model-stages move);
2. *keep one*: for each model-stage ``M`` whose current strategy is on its frontier, ``M`` keeps
   it and the DP re-plans the rest;
3. *next best*: for each model-stage ``M``, the DP re-solved without ``S*``'s point for ``M``.

Candidates that are memory-infeasible for the evaluator, equal to ``S*`` or to the current plan
are dropped. The first one whose transition is feasible goes through the same admission rule.
When none is feasible an urgent replan falls back to checkpoint/restart into ``S*`` at a fixed
cost ``restart_s`` (default 600 s, the order of the paper's 837 s UCP checkpoint/restart of an
8B actor/critic job, its Table 2); an opportunistic one keeps the current plan.

**Online calibration** (:class:`Calibration`): one factor ``f_c = 1/η_c`` per operation class
``c`` ∈ {``gemm``, ``nongemm``, ``collective/<tier>``} multiplies the uncalibrated prediction:
``L̂ = L₀·Σ_c w_c·f_c`` with ``w_c`` the plan's class shares (:func:`class_shares`). With only a
step-level measurement ``T`` the classes are not identifiable, so the error ratio ``r = T/L̂`` is
attributed to every class present in proportion to its share:
``f_c ← f_c·(1 + α·(w_c/max_c w_c)·(r − 1))`` (``α = 0.3``): the dominant class moves by the full
EMA step, a class with a small share hardly moves. If every step runs ``k`` times slower than
the uncalibrated model on one class mix, ``L̂/T → 1`` geometrically, and each factor → ``k`` when
the classes have equal shares. Per-class timings (kernel/collective instrumentation) update each
class by its own ratio instead (:meth:`Calibration.observe_classes`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from ..costmodel.time import op_time
from ..heuristics.baselines import Infeasible
from ..heuristics.dp_planner import DPInstance, build_instance, place, solve_dp
from ..ir.cluster import Cluster
from ..ir.emu import TransitionInfeasible
from ..ir.hardware import TIER_NAMES
from ..ir.plan import Plan
from ..ir.templates import Structure
from ..ir.workload import Workload, default_quantiles
from ..scoring.evaluator import Evaluator
from .solve import solve
from .transition import plan_transition

__all__ = [
    "CALIB_ALPHA",
    "DELTA_LEN",
    "GAMMA",
    "H_ALPHA",
    "RESTART_S",
    "AdaptConfig",
    "Admission",
    "Calibration",
    "Controller",
    "Decision",
    "Horizon",
    "Monitor",
    "NoPlan",
    "Payback",
    "PlanCache",
    "PlanPoint",
    "PlanScore",
    "Policy",
    "Signal",
    "Trigger",
    "admit",
    "class_shares",
    "pool_cluster",
    "with_response_len",
]

DELTA_LEN = 0.30
GAMMA = 0.5
H_ALPHA = 0.5
CALIB_ALPHA = 0.3
RESTART_S = 600.0
PLANNERS = ("dp", "greedy", "concurrent", "sa")


# ---------------------------------------------------------------------------- helpers
def pool_cluster(full: Cluster, devices: int) -> Cluster:
    """The cluster of a pool of the first ``devices`` flat ids of ``full``.

    Flat ids keep their meaning (``((r·Nn) + n)·Ng + g``): a pool is one partial node
    ``(1, 1, n)``, whole nodes of one rack ``(1, n/Ng, Ng)`` or whole racks ``(n/(Nn·Ng), Nn, Ng)``.

    Raises
    ------
    ValueError
        If ``devices`` is not in ``1..|D|`` or is not one of those shapes.
    """
    Ng, Nn = full.gpus_per_node, full.nodes_per_rack
    if isinstance(devices, bool) or not isinstance(devices, int) or not 1 <= devices <= full.num_devices:
        raise ValueError(f"pool: devices must be an integer in 1..{full.num_devices}, got {devices!r}")
    if devices <= Ng:
        shape = (1, 1, devices)
    elif devices % Ng == 0 and devices // Ng <= Nn:
        shape = (1, devices // Ng, Ng)
    elif devices % (Nn * Ng) == 0:
        shape = (devices // (Nn * Ng), Nn, Ng)
    else:
        raise ValueError(
            f"pool: {devices} devices are neither part of a node, whole nodes of one rack nor whole "
            f"racks of cluster {full.shape_str}"
        )
    return Cluster.from_shape(shape, full.hardware)


def with_response_len(workload: Workload, response_len: int) -> Workload:
    """``workload`` with ``Lr = response_len`` and its quantile lengths scaled by ``Lr'/Lr``
    (fractions kept; the SPEC §2 default quantiles when scaling breaks monotonicity).

    Raises
    ------
    ValueError
        If ``response_len`` is not a positive integer.
    """
    if isinstance(response_len, bool) or not isinstance(response_len, int) or response_len < 1:
        raise ValueError(f"response_len must be a positive integer, got {response_len!r}")
    if response_len == workload.response_len:
        return workload
    scale = response_len / workload.response_len
    q = [(f, max(1, round(t * scale))) for f, t in workload.quantiles]  # type: ignore[union-attr]
    q[-1] = (1.0, response_len)
    ok = all(a[1] < b[1] for a, b in zip(q, q[1:]))
    return dataclasses.replace(
        workload, response_len=response_len, quantiles=tuple(q) if ok else default_quantiles(response_len)
    )


def class_shares(evaluator: Evaluator, plan: Plan) -> dict[str, float]:
    """Operation-class shares ``w_c`` of ``plan``'s OP time (SPEC §6 terms, summed over vertices).

    ``gemm`` = ``T_gemm + T_bubble`` (attention FLOPs are part of ``W``: the cost model has no
    separate attention term, so attention shares the GEMM efficiency); ``nongemm`` =
    ``T_nongemm + T_opt``; ``collective/<tier>``: ``T_tp`` at the intra-node tier, ``T_pp`` at
    ``pp_tier``, ``T_dp`` at ``dp_tier``. Shares sum to 1 (``{"gemm": 1}`` for a plan with no time).
    """
    g, w, hw = evaluator.graph, evaluator.workload, evaluator.cluster.hardware
    costs = evaluator.costs
    acc: dict[str, float] = {}
    for v, c in zip(g.vertices, plan.choices):
        s = c.strategy
        bd = op_time(
            g.models[v.model].spec,
            v.role,
            costs.layout(s),
            hw,
            sequences=v.sequences,
            prompt_len=w.prompt_len,
            response_len=w.response_len,
            head=v.head,
        )
        for key, t in (
            ("gemm", bd.gemm + bd.bubble),
            ("nongemm", bd.nongemm + bd.opt),
            (f"collective/{TIER_NAMES[0]}", bd.tp_comm),
            (f"collective/{TIER_NAMES[s.pp_tier]}", bd.pp_comm),
            (f"collective/{TIER_NAMES[s.dp_tier]}", bd.dp_comm),
        ):
            if t > 0:
                acc[key] = acc.get(key, 0.0) + t
    total = sum(acc.values())
    if total <= 0:
        return {"gemm": 1.0}
    return {k: v / total for k, v in sorted(acc.items())}


# ---------------------------------------------------------------------------- triggers
class Signal(str, Enum):
    """What a trigger watched."""

    POOL = "pool"
    MEMORY = "memory"
    LENGTH = "length"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Trigger:
    """One fired trigger: its signal, whether it makes the current plan infeasible, and why."""

    signal: Signal
    urgent: bool
    detail: str


class Horizon:
    """``H_x``: EMA of the steps between threshold crossings of one signal (module docstring).

    Parameters
    ----------
    alpha
        EMA weight ``α_H`` of the newest interval, in ``(0, 1]``.
    """

    def __init__(self, alpha: float = H_ALPHA) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"Horizon.alpha must be in (0, 1], got {alpha!r}")
        self.alpha = alpha
        self.value = 1.0
        self.last: int | None = None
        self.intervals: list[int] = []

    def cross(self, step: int) -> float:
        """Record a crossing at ``step`` and return the updated ``H``: the first interval sets
        ``H = Δ``; later ones ``H ← (1 − α)·H + α·Δ``."""
        if self.last is not None:
            gap = step - self.last
            if gap < 0:
                raise ValueError(f"Horizon.cross: step {step} is before the last crossing {self.last}")
            self.value = (
                float(gap) if not self.intervals else (1 - self.alpha) * self.value + self.alpha * gap
            )
            self.intervals.append(gap)
        self.last = step
        return self.value


class Monitor:
    """Monitor state (Nereus §4.1): pool, length statistics, peak memory, measured step times.

    Parameters
    ----------
    pool
        Devices available at start.
    length
        Mean response length at start (the first reference ``x_ref``).
    delta_len
        Relative drift threshold ``δ_len``.
    ma_alpha
        EMA weight of the length moving average (a statistic for reports).
    """

    def __init__(
        self, pool: int, length: float, *, delta_len: float = DELTA_LEN, ma_alpha: float = 0.5
    ) -> None:
        if not length > 0:
            raise ValueError(f"Monitor.length must be positive, got {length!r}")
        if not delta_len > 0:
            raise ValueError(f"Monitor.delta_len must be positive, got {delta_len!r}")
        self.pool = pool
        self.length = float(length)
        self.reference = float(length)
        self.length_ma = float(length)
        self.ma_alpha = ma_alpha
        self.delta_len = delta_len
        self.lengths: list[float] = [float(length)]
        self.pools: list[int] = [pool]
        self.peak_memory: float = 0.0
        self.m_eff: float = math.inf
        self.measured: list[float] = []
        self.predicted: list[float] = []

    @property
    def drift(self) -> float:
        """``|x − x_ref|/x_ref``."""
        return abs(self.length - self.reference) / self.reference

    def reset_reference(self) -> None:
        """``x_ref ← x`` (at every replan)."""
        self.reference = self.length

    def observe(
        self, length: float, pool: int, *, peak_memory: float, m_eff: float, plan_devices: int
    ) -> list[Trigger]:
        """Read the next boundary's signals and return the triggers that fire.

        Parameters
        ----------
        length, pool
            Mean response length of the coming step and the devices available.
        peak_memory
            The current plan's predicted per-GPU peak under ``length`` (bytes).
        m_eff
            ``M_eff`` in bytes.
        plan_devices
            ``1 + max flat id`` the current plan uses (it fits the pool iff ``≤ pool``).
        """
        if not length > 0:
            raise ValueError(f"Monitor.observe: length must be positive, got {length!r}")
        out: list[Trigger] = []
        if pool != self.pool:
            lost = plan_devices > pool
            out.append(
                Trigger(
                    Signal.POOL,
                    lost,
                    f"pool {self.pool} → {pool} devices" + (" (current plan loses GPUs)" if lost else ""),
                )
            )
        self.pool = pool
        self.length = float(length)
        self.length_ma = (1 - self.ma_alpha) * self.length_ma + self.ma_alpha * self.length
        self.lengths.append(self.length)
        self.pools.append(pool)
        self.peak_memory, self.m_eff = peak_memory, m_eff
        if peak_memory > m_eff * (1 + 1e-9):
            out.append(
                Trigger(
                    Signal.MEMORY,
                    True,
                    f"predicted peak {peak_memory / 2**30:.2f} GiB > M_eff {m_eff / 2**30:.2f} GiB",
                )
            )
        if self.drift > self.delta_len:
            out.append(
                Trigger(
                    Signal.LENGTH,
                    False,
                    f"length {self.reference:.0f} → {self.length:.0f} ({100 * self.drift:.1f}% > {100 * self.delta_len:.0f}%)",
                )
            )
        return out


# ---------------------------------------------------------------------------- admission
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


# ---------------------------------------------------------------------------- calibration
class Calibration:
    """Per-class efficiency factors ``f_c = 1/η_c`` (module docstring).

    Parameters
    ----------
    alpha
        EMA weight in ``(0, 1]``.
    initial
        Starting factors (unseen classes start at 1: the hardware file's derated peak).
    """

    def __init__(self, alpha: float = CALIB_ALPHA, initial: Mapping[str, float] | None = None) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"Calibration.alpha must be in (0, 1], got {alpha!r}")
        self.alpha = alpha
        self.factors: dict[str, float] = dict(initial or {})
        for k, f in self.factors.items():
            if not f > 0:
                raise ValueError(f"Calibration.initial[{k!r}] must be positive, got {f!r}")

    def factor(self, shares: Mapping[str, float]) -> float:
        """``Σ_c w_c·f_c``."""
        return sum(w * self.factors.get(c, 1.0) for c, w in shares.items())

    def predict(self, base: float, shares: Mapping[str, float]) -> float:
        """Calibrated prediction ``L̂ = L₀·Σ_c w_c·f_c``."""
        return base * self.factor(shares)

    def observe_step(self, base: float, shares: Mapping[str, float], measured: float) -> float:
        """Update from one step: ``r = T/L̂``, ``f_c ← f_c·(1 + α·(w_c/max w)·(r − 1))``; returns ``r``.

        Raises
        ------
        ValueError
            If ``base`` or ``measured`` is not positive.
        """
        if not base > 0 or not measured > 0:
            raise ValueError(
                f"observe_step needs positive base and measured seconds, got {base!r}, {measured!r}"
            )
        r = measured / self.predict(base, shares)
        w_max = max(shares.values())
        for c, w in shares.items():
            if w > 0:
                f = self.factors.get(c, 1.0)
                self.factors[c] = f * (1.0 + self.alpha * (w / w_max) * (r - 1.0))
        return r

    def observe_classes(self, predicted: Mapping[str, float], measured: Mapping[str, float]) -> None:
        """Update each class from its own timing: ``f_c ← (1 − α)·f_c + α·T_c/T₀_c`` (``T₀_c``
        uncalibrated)."""
        for c, t in measured.items():
            p = predicted.get(c, 0.0)
            if p > 0 and t > 0:
                f = self.factors.get(c, 1.0)
                self.factors[c] = (1 - self.alpha) * f + self.alpha * t / p


# ---------------------------------------------------------------------------- plans and caching
@dataclass(frozen=True)
class PlanPoint:
    """A plan and the pool (device count) it was planned on; ``label`` says where it came from."""

    plan: Plan
    pool: int
    label: str = "planner"

    @property
    def devices(self) -> int:
        """``1 + max`` flat id the plan uses."""
        return max(c.allocation.mask.bit_length() for c in self.plan.choices)

    def same(self, other: PlanPoint | None) -> bool:
        """Same plan (the pool it was planned on does not matter)."""
        return other is not None and self.plan == other.plan


@dataclass(frozen=True)
class PlanScore:
    """A plan under one length: uncalibrated step latency (evaluator makespan/``k_eval``), its
    memory peak and ratio to ``M_eff``, and its operation-class shares."""

    latency: float
    peak: float
    ratio: float
    shares: dict[str, float]

    @property
    def feasible(self) -> bool:
        return self.ratio <= 1.0 + 1e-9


class NoPlan(ValueError):
    """No memory-feasible plan exists for a length and pool (the message names both)."""


class PlanCache:
    """Planner, evaluator and transition calls, memoised per (length bucket, pool).

    Parameters
    ----------
    workload
        The job; its response length is replaced by the bucketed trace value.
    cluster
        The full cluster (pools are its first ``n`` devices; transitions are priced on it).
    method
        Planner: ``"dp"`` (default), ``"greedy"``, ``"concurrent"`` or ``"sa"``.
    options
        Extra ``solve`` options (``"sa"`` defaults to ``max_evaluations=300`` on the synchronous
        structure, so every plan has the same graph and transitions pair up).
    k_eval
        Steps unrolled when scoring.
    bucket
        Length bucket width in tokens: a length ``x`` plans and scores as ``Lr = bucket·round(x/bucket)``.
    transition_method
        Scheduler of :func:`plan_transition`.
    seed
        Planner seed.
    transition_capacity
        Per-GPU bytes passed as ``capacity`` to :func:`plan_transition` (``None``: its default
        ``max(M_eff, usage of either endpoint)``; ``math.inf`` switches the transition memory
        check off, see ``docs/adaptation.md`` "Controller").
    """

    def __init__(
        self,
        workload: Workload,
        cluster: Cluster,
        *,
        method: str = "dp",
        options: Mapping[str, Any] | None = None,
        k_eval: int = 2,
        bucket: int = 64,
        transition_method: str = "greedy",
        seed: int = 0,
        transition_capacity: float | None = None,
    ) -> None:
        if method not in PLANNERS:
            raise ValueError(f"PlanCache.method: unknown planner {method!r}; known: {', '.join(PLANNERS)}")
        if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 1:
            raise ValueError(f"PlanCache.bucket must be a positive integer, got {bucket!r}")
        self.workload, self.cluster = workload, cluster
        self.method, self.k_eval, self.bucket = method, k_eval, bucket
        self.transition_method, self.seed = transition_method, seed
        if transition_capacity is not None and not transition_capacity > 0:
            raise ValueError(
                f"PlanCache.transition_capacity must be positive bytes, got {transition_capacity!r}"
            )
        self.transition_capacity = transition_capacity
        opts = dict(options or {})
        if method == "sa":
            opts.setdefault("max_evaluations", 300)
            opts.setdefault("structures", [Structure.synchronous(workload)])
        self.options = opts
        self._workloads: dict[int, Workload] = {}
        self._clusters: dict[int, Cluster] = {}
        self._evaluators: dict[tuple[int, int], Evaluator] = {}
        self._planned: dict[tuple[int, int], PlanPoint | None] = {}
        self._why: dict[tuple[int, int], str] = {}
        self._scores: dict[tuple[Plan, int], PlanScore] = {}
        self._tran: dict[tuple[Plan, Plan], float] = {}
        self._alts: dict[tuple[int, int, Plan], list[PlanPoint]] = {}
        self.planner_calls = 0
        self.transition_calls = 0

    def lr(self, length: float) -> int:
        """Bucketed response length ``bucket·max(1, round(x/bucket))``."""
        return self.bucket * max(1, round(length / self.bucket))

    def workload_at(self, lr: int) -> Workload:
        if lr not in self._workloads:
            self._workloads[lr] = with_response_len(self.workload, lr)
        return self._workloads[lr]

    def cluster_of(self, pool: int) -> Cluster:
        if pool not in self._clusters:
            self._clusters[pool] = pool_cluster(self.cluster, pool)
        return self._clusters[pool]

    def evaluator(self, lr: int, pool: int) -> Evaluator:
        key = (lr, pool)
        if key not in self._evaluators:
            self._evaluators[key] = Evaluator(self.workload_at(lr), self.cluster_of(pool), k_eval=self.k_eval)
        return self._evaluators[key]

    def planned(self, lr: int, pool: int) -> PlanPoint:
        """``S*`` for bucketed length ``lr`` on ``pool`` devices.

        Raises
        ------
        NoPlan
            When the planner finds no memory-feasible plan.
        """
        key = (lr, pool)
        if key not in self._planned:
            self.planner_calls += 1
            r = solve(
                self.workload_at(lr),
                self.cluster_of(pool),
                method=self.method,
                k_eval=self.k_eval,
                seed=self.seed,
                **self.options,
            )
            self._planned[key] = PlanPoint(r.plan, pool, self.method) if r.plan is not None else None
            self._why[key] = r.message or ""
        hit = self._planned[key]
        if hit is None:
            raise NoPlan(f"no memory-feasible plan for Lr={lr} on a pool of {pool} devices: {self._why[key]}")
        return hit

    def score(self, point: PlanPoint, lr: int) -> PlanScore:
        """The point's uncalibrated latency, memory and class shares under ``lr`` (on its pool)."""
        key = (point.plan, lr)
        if key not in self._scores:
            ev = self.evaluator(lr, point.pool)
            e = ev.evaluate(point.plan)
            self._scores[key] = PlanScore(
                e.makespan / self.k_eval, e.memory.max_peak, e.memory.ratio, class_shares(ev, point.plan)
            )
        return self._scores[key]

    def transition(self, current: PlanPoint, target: PlanPoint) -> float:
        """``L_tran`` in seconds of ``current → target`` on the full cluster (``inf`` when
        :class:`TransitionInfeasible`; 0 for the same plan)."""
        if current.same(target):
            return 0.0
        key = (current.plan, target.plan)
        if key not in self._tran:
            self.transition_calls += 1
            try:
                tp = plan_transition(
                    current.plan,
                    target.plan,
                    self.cluster,
                    workload=self.workload,
                    method=self.transition_method,
                    capacity=self.transition_capacity,
                )
                self._tran[key] = tp.l_tran
            except TransitionInfeasible:
                self._tran[key] = math.inf
        return self._tran[key]

    def alternatives(self, lr: int, pool: int, current: PlanPoint, best: PlanPoint) -> list[PlanPoint]:
        """Fallback targets (module docstring), memory-feasible, sorted by uncalibrated latency."""
        key = (lr, pool, current.plan)
        if key in self._alts:
            return self._alts[key]
        ev = self.evaluator(lr, pool)
        inst = build_instance(ev.costs)
        n = len(ev.graph.vertices)
        try:
            base = solve_dp(inst)
        except Infeasible:
            self._alts[key] = []
            return []
        cur = [current.plan.choices[f.stage.vertices[0]].strategy for f in inst.frontiers]
        keep = [[j for j, q in enumerate(f.points) if q.strategy == s] for f, s in zip(inst.frontiers, cur)]
        variants: list[tuple[str, DPInstance]] = []
        kept = [m for m, js in enumerate(keep) if js]
        if kept:
            variants.append(("refit", _restrict(inst, {m: keep[m] for m in kept})))
        for m in kept:
            variants.append((f"keep {inst.frontiers[m].stage.label}", _restrict(inst, {m: keep[m]})))
        for m, f in enumerate(inst.frontiers):
            rest = [j for j in range(len(f.points)) if j != base.picks[m]]
            if rest:
                variants.append((f"next-best {f.stage.label}", _restrict(inst, {m: rest})))
        out: list[PlanPoint] = []
        seen = {best.plan, current.plan}
        for label, sub in variants:
            try:
                plan = place(sub, solve_dp(sub), n)
            except (Infeasible, ValueError):
                continue
            if plan in seen:
                continue
            seen.add(plan)
            pt = PlanPoint(plan, pool, label)
            if self.score(pt, lr).feasible:
                out.append(pt)
        out.sort(key=lambda p: (self.score(p, lr).latency, p.label))
        self._alts[key] = out
        return out


def _restrict(inst: DPInstance, keep: Mapping[int, Sequence[int]]) -> DPInstance:
    """``inst`` with frontier ``m`` cut to the points ``keep[m]``."""
    fronts = [
        dataclasses.replace(f, points=[f.points[j] for j in keep[m]]) if m in keep else f
        for m, f in enumerate(inst.frontiers)
    ]
    return dataclasses.replace(inst, frontiers=fronts)


# ---------------------------------------------------------------------------- controller
@dataclass(frozen=True)
class AdaptConfig:
    """Controller settings (defaults: SPEC §10 and the module docstring).

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


class Controller:
    """Monitor → triggers → replan → admission → (transition) at each boundary (module docstring).

    Parameters
    ----------
    cache
        Planner/evaluator/transition oracle (shared across controllers to reuse its memo).
    pool, length
        Devices and mean response length at start.
    policy
        When to replan and what to admit (default :class:`Payback` with ``γ = 0.5``).
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
        m_eff = cache.cluster.hardware.m_eff
        triggers = self.monitor.observe(
            length, pool, peak_memory=s.peak, m_eff=m_eff, plan_devices=cur.devices
        )
        d = Decision(step, triggers)
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

    def measured(self, seconds: float) -> float:
        """Feed the measured time of the step just run (current plan, current length) to the
        calibration; returns the error ratio ``r``."""
        s = self.cache.score(self.current, self.lr)
        self.monitor.measured.append(seconds)
        self.monitor.predicted.append(self.calibration.predict(s.latency, s.shares))
        return self.calibration.observe_step(s.latency, s.shares, seconds)

"""Plans, their scores and the memoised planner/evaluator/transition oracle (SPEC §10).

:class:`PlanCache` answers the controller's questions — the planner's target ``S*`` for a
(bucketed length, pool), a plan's uncalibrated latency, memory and class shares
(:class:`PlanScore`), the transition length ``L_tran`` between two plans — and memoises each, so
a trace replay costs a few planner calls per length bucket, not per step.

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
are dropped.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..costmodel.transition import check_capacity
from ..heuristics.baselines import Infeasible
from ..heuristics.dp_planner import DPInstance, build_dp_instance, place, solve_dp
from ..ir.cluster import Cluster, pool_cluster
from ..ir.emu import TransitionInfeasible
from ..ir.plan import Plan
from ..ir.templates import Structure
from ..ir.workload import Workload, with_response_len
from ..scoring.evaluator import Evaluator
from ..solvers.solve import solve
from ..solvers.transition import plan_transition
from .calibration import class_shares

__all__ = ["PLANNERS", "NoPlan", "PlanCache", "PlanPoint", "PlanScore"]

PLANNERS = ("dp", "greedy", "concurrent", "sa")


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
        check_capacity("PlanCache.transition_capacity", transition_capacity)
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
        inst = build_dp_instance(ev.costs)
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

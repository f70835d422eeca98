"""Evaluate a configuration ``C = (G°(y), P)``: unroll, lower, cost, schedule, score (SPEC §5–§7).

Score ``= Keval·B·R·(Lp+Ē)/MS`` tokens/s (real tokens, SPEC §14.1). Memory penalty
``score·exp(−β_oom·max(0, max_d peak(d)/M_eff − 1))`` with ``β_oom = 40``. Optional utilisation
objective: ``Util = Σ_d busy(d)/(|D|·MS)``; the objective is ``score·Util`` when ``score ≥ (1 − δ)``
times the best raw score seen so far by this evaluator (``δ = 0.10``), else ``score·1e−12``.

Per-device memory (SPEC §6): ``peak(d) = Σ_m S(m, d) + max_{v on d} A(v, d)`` where

* ``S`` is ``12·W_shard/Pd`` on the training devices of ``m``; a BF16 copy ``W_shard·sb`` on a
  device serving a frozen model, and on a device serving a trainable model ``m`` with ``τ(m) > 0``
  that is not one of ``m``'s training devices (a shadow copy); a shared backbone once;
* ``A(v, d)`` is the vertex's transient; a serving vertex of a trainable model on a device with
  no persistent copy of it (``τ = 0``, or a device that also trains ``m``) materialises its BF16
  weights transiently, so they join ``A(v, d)`` (``docs/decisions.md``);
* a vertex whose strategy offloads to the host (SPEC §14.4) contributes no ``S``: what would
  persist is in its ``A(v, d)`` (:class:`~rpeg.scoring.costs.VertexMemory`), so a device whose
  vertices all offload peaks at its largest phase.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from ..ir.cluster import Cluster, mask_devices
from ..ir.lower import ExecGraph, lower
from ..ir.plan import Plan
from ..ir.templates import Structure, build_graph
from ..ir.types import Role
from ..ir.unroll import unroll
from ..ir.workload import Workload
from .costs import Costs
from .fast import FastLowering, ready, warm_up
from .scheduler import Schedule, atoms_of, list_schedule

__all__ = [
    "BACKENDS",
    "BACKEND_VARIABLE",
    "BETA_OOM",
    "AtomMemory",
    "Evaluation",
    "Evaluator",
    "MemoryReport",
    "node_identity",
    "start_order",
]

BETA_OOM = 40.0
BACKENDS = ("compiled", "python")
BACKEND_VARIABLE = "RPEG_EVALUATOR"
MEMORY_TOL = 1e-9  # relative slack on peak ≤ M_eff for float round-off


@dataclass
class AtomMemory:
    """What makes up the peak of one atom's devices.

    Attributes
    ----------
    mask
        The atom's devices.
    persistent
        ``S(m, d)`` items: ``(model, "train")`` for optimizer state and FP32 master weights,
        ``(model, "copy")`` for a frozen model's or a shadow BF16 copy.
    transient
        ``A(v, d)`` per vertex name (the peak adds only the largest).
    """

    mask: int
    persistent: dict[tuple[str, str], float]
    transient: dict[str, float]


@dataclass
class MemoryReport:
    """Per-atom memory of a plan.

    Attributes
    ----------
    atoms
        Device masks (devices of an atom host the same vertices, so share one peak).
    peak
        ``peak(d)`` of each atom's devices in bytes.
    m_eff
        ``M_eff`` in bytes.
    """

    atoms: list[int]
    peak: list[float]
    m_eff: float
    detail: list[AtomMemory] = field(default_factory=list)

    @property
    def max_peak(self) -> float:
        """``max_d peak(d)``."""
        return max(self.peak, default=0.0)

    @property
    def ratio(self) -> float:
        """``max_d peak(d)/M_eff``."""
        return self.max_peak / self.m_eff

    @property
    def feasible(self) -> bool:
        """``peak(d) ≤ M_eff`` on every device."""
        return self.ratio <= 1.0 + MEMORY_TOL

    def per_device(self, num_devices: int) -> list[float]:
        """``peak(d)`` for every flat id ``d`` (0 for devices nothing runs on)."""
        out = [0.0] * num_devices
        for a, p in zip(self.atoms, self.peak):
            for d in mask_devices(a):
                out[d] = p
        return out


def node_identity(g: ExecGraph, i: int) -> tuple[int, int, int, int, int]:
    """``(kind, vertex, source, step, phase)`` of node ``i``: what identifies it across lowerings
    of one plan (the exact models key their start times by it)."""
    return (g.kind[i], g.vertex[i], g.source[i], g.step[i], g.phase[i])


def start_order(g: ExecGraph, starts: dict[tuple, float]) -> list[int]:
    """The node ids of ``g`` sorted by ``(starts[identity], duration, id)``: an activity list
    consistent with the precedences and device order of any schedule whose durations are at
    least ``g``'s. Among nodes starting at one instant the zero-length ones (done at that
    instant) come first, then the rest; ids are a topological order, so a zero-length
    predecessor at the same instant precedes its successor.

    Raises
    ------
    ValueError
        A node of ``g`` has no start in ``starts`` (naming it).
    """
    keys = []
    for i in range(len(g)):
        ident = node_identity(g, i)
        if ident not in starts:
            raise ValueError(f"the schedule to follow has no start for node {i} {ident} of the lowered plan")
        keys.append((starts[ident], g.duration[i], i))
    return [i for *_, i in sorted(keys)]


@dataclass
class Evaluation:
    """What an evaluation returns.

    Attributes
    ----------
    score
        The objective the search maximises: throughput, memory-penalised, and utilisation-
        weighted when that objective is on.
    throughput
        Raw score ``Keval·B·R·(Lp+Lr)/MS`` in tokens/s.
    makespan
        ``MS`` in seconds over ``Keval`` steps.
    utilization
        ``Σ_d busy(d)/(|D|·MS)``.
    memory
        Per-device peaks and feasibility.
    critical
        Per vertex, the OP seconds it contributes to the schedule's critical path (the search
        picks bottleneck vertices in proportion to it).
    graph, schedule
        The lowered graph and its schedule (kept only when asked for).
    """

    score: float
    throughput: float
    makespan: float
    utilization: float
    memory: MemoryReport
    critical: list[float] = field(default_factory=list, repr=False)
    graph: ExecGraph | None = field(default=None, repr=False)
    schedule: Schedule | None = field(default=None, repr=False)

    @property
    def feasible(self) -> bool:
        """Memory feasibility of the plan."""
        return self.memory.feasible


class Evaluator:
    """Scores plans for one workload, cluster and structural candidate.

    Parameters
    ----------
    workload, cluster
        The problem.
    structure
        The structural candidate ``y``; ``None`` is the synchronous structure.
    k_eval
        Steps to unroll (SPEC default 8).
    objective
        ``"throughput"`` or ``"throughput-util"``.
    delta
        ``δ`` of the utilisation objective.
    penalty
        ``True`` for the soft memory penalty; ``False`` scores infeasible plans 0 (hard rejection).
    split_phases
        Split generation and disjoint inference into response-length phases (SPEC §5 rule 1).
    backend
        ``"compiled"``: the rules in Python, then lowering, list scheduling and memory peaks
        compiled by numba (:mod:`rpeg.scoring.fast`); ``"python"``: :func:`~rpeg.ir.lower.lower`,
        :func:`~rpeg.scoring.scheduler.list_schedule` and :meth:`memory`, the reference. Both
        give identical results. ``None`` (default): the environment variable ``RPEG_EVALUATOR``
        if set (so every evaluator of a search, its worker processes included, can be switched
        for a comparison), else ``"compiled"``. An evaluation that keeps its graph and schedule
        (``keep=True``) or follows an exact model's starts always takes the reference path, and
        so does every evaluation before the compiled kernels are loaded
        (:func:`~rpeg.scoring.fast.warm_up`, started in the background by the first evaluation
        of a process that could use them).
    """

    def __init__(
        self,
        workload: Workload,
        cluster: Cluster,
        structure: Structure | None = None,
        *,
        k_eval: int = 8,
        objective: str = "throughput",
        delta: float = 0.10,
        penalty: bool = True,
        split_phases: bool = True,
        backend: str | None = None,
    ) -> None:
        if backend is None:
            backend = os.environ.get(BACKEND_VARIABLE, "compiled")
            if backend not in BACKENDS:
                raise ValueError(
                    f"environment variable {BACKEND_VARIABLE} must be one of {', '.join(map(repr, BACKENDS))}, "
                    f"got {backend!r}"
                )
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
        if objective not in ("throughput", "throughput-util"):
            raise ValueError(f"objective must be 'throughput' or 'throughput-util', got {objective!r}")
        if not 0.0 < delta <= 1.0:  # the front door's range (solvers.solve.Problem): δ = 1 weights every plan
            raise ValueError(f"delta must be in (0, 1], got {delta!r}")
        self.workload = workload
        self.cluster = cluster
        self.structure = structure or Structure.synchronous(workload)
        self.graph = build_graph(workload, self.structure)
        self.unrolled = unroll(self.graph, k_eval)
        self.k_eval = k_eval
        self.costs = Costs(self.graph, workload, cluster)
        self.objective = objective
        self.delta = delta
        self.penalty = penalty
        self.split_phases = split_phases
        self.backend = backend
        self.fast = FastLowering(self.unrolled, workload.quantiles, self.costs, split_phases)  # type: ignore[arg-type]
        self.best_raw = 0.0
        self.evaluations = 0
        g = self.graph
        self._work = k_eval * workload.tokens_per_step
        self._trainer = {m: g.index[t.name] for m in g.models if (t := g.training_vertex(m)) is not None}
        self._vmodel = [v.model for v in g.vertices]
        self._training = [v.role is Role.TRAINING for v in g.vertices]
        self._trainable = {m: inst.trainable for m, inst in g.models.items()}

    # ------------------------------------------------------------------ memory
    def memory(self, plan: Plan, *, detail: bool = False) -> MemoryReport:
        """Per-device peaks of ``plan`` (module docstring; SPEC §6).

        With ``detail`` the report also lists, per atom, each persistent item
        (``(model, "train" | "copy")`` → bytes) and each vertex's transient ``A(v, d)``.
        """
        masks = [c.allocation.mask for c in plan.choices]
        mems = [self.costs.memory(v, c.strategy) for v, c in enumerate(plan.choices)]
        atoms = atoms_of(masks)
        tau = self.graph.staleness
        names = [v.name for v in self.graph.vertices]
        peaks = []
        details: list[AtomMemory] = []
        for a in atoms:
            persistent: dict[tuple[str, str], float] = {}
            transient: dict[str, float] = {}
            for v, m in enumerate(masks):
                if not m & a:
                    continue
                model = self._vmodel[v]
                if self._training[v]:
                    persistent[(model, "train")] = mems[v].train_state
                    transient[names[v]] = mems[v].transient
                    continue
                trainer = self._trainer.get(model)
                if trainer is None or (tau[model] > 0 and not masks[trainer] & a):
                    key = (model, "copy")  # a frozen model's or a shadow copy, once per model
                    persistent[key] = max(persistent.get(key, 0.0), mems[v].weights)
                    transient[names[v]] = mems[v].transient
                else:  # no persistent serving copy here: the BF16 weights are materialised
                    transient[names[v]] = mems[v].transient + mems[v].weights
            peaks.append(sum(persistent.values()) + max(transient.values(), default=0.0))
            if detail:
                details.append(AtomMemory(a, persistent, transient))
        return MemoryReport(atoms, peaks, self.cluster.hardware.m_eff, details)

    # ------------------------------------------------------------------ evaluation
    def evaluate(
        self, plan: Plan, *, keep: bool = False, starts: dict[tuple, float] | None = None
    ) -> Evaluation:
        """Unroll (cached), lower, cost, schedule and score ``plan``.

        Parameters
        ----------
        plan
            One choice per vertex of :attr:`graph`.
        keep
            Keep the lowered graph and schedule in the result.
        starts
            A schedule to follow: start (s) per lowered-node identity
            ``(kind, vertex, source, step, phase)`` (an exact model's, ``PlanSolution.starts``).
            The nodes are then list-scheduled in the order of those starts
            (:func:`~rpeg.scoring.scheduler.list_schedule` with ``order``, :func:`start_order`)
            instead of by the EST-first rule.

        Raises
        ------
        ValueError
            ``starts`` misses a node of the lowered graph.
        """
        self.evaluations += 1
        g = sched = None
        compiled = self.backend == "compiled" and not keep and starts is None
        if compiled and not ready():
            warm_up()  # once per process, in the background; meanwhile the reference path
            compiled = False
        if compiled:
            if self.fast.unrolled is not self.unrolled or self.fast.costs is not self.costs:
                self.fast = FastLowering(
                    self.unrolled, self.workload.quantiles, self.costs, self.split_phases
                )  # type: ignore[arg-type]
            fast = self.fast.schedule(plan)
            ms, busy, critical = fast.makespan, fast.busy_device_seconds, fast.critical
            mem = MemoryReport(fast.atoms, fast.peaks, self.cluster.hardware.m_eff)
        else:
            g = lower(
                self.unrolled, plan, self.workload.quantiles, self.costs, split_phases=self.split_phases
            )  # type: ignore[arg-type]
            sched = list_schedule(g, start_order(g, starts) if starts is not None else None)
            ms, busy = sched.makespan, sched.busy_device_seconds()
            critical = [0.0] * len(plan.choices)
            kind, vertex, dur = g.kind, g.vertex, g.duration
            for i in sched.critical_path():
                if kind[i] == 0:
                    critical[vertex[i]] += dur[i]
            mem = self.memory(plan)
        raw = self._work / ms if ms > 0 else math.inf
        util = busy / (self.cluster.num_devices * ms) if ms > 0 else 0.0
        score = raw
        if not mem.feasible:
            score = raw * math.exp(-BETA_OOM * (mem.ratio - 1.0)) if self.penalty else 0.0
        if self.objective == "throughput-util":
            if mem.feasible and raw > self.best_raw:
                self.best_raw = raw
            score = score * util if raw >= (1.0 - self.delta) * self.best_raw else score * 1e-12
        return Evaluation(score, raw, ms, util, mem, critical, g if keep else None, sched if keep else None)

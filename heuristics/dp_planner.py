"""The Nereus planner (SPEC §10 "Planner (dp)"; Nereus paper §4.2, Eq. 1).

A plan is one *frontier point* per **model-stage** ``M = (model, stage)``: the graph's vertices
grouped by model and role (Gen, Inf, Train). A point is a legal strategy (SPEC §4: GPU count,
``Pd × Pp × Pt``, microbatches) with its latency from the shared cost model
(:meth:`~rpeg.scoring.costs.Costs.op_time`, summed over the model-stage's vertices) and its
per-GPU memory from the shared memory model, split into

* ``P`` — persistent bytes (optimizer state ``12·W_shard/Pd`` of a training stage; the BF16
  copy ``W_shard·sb`` a frozen model or a shadow copy keeps), and
* ``T`` — transient bytes (activations, KV cache, materialised weights and gradients).

**Composition** (``docs/dp-planner.md``). The stages of one step run in dependency order
Gen → Inf → Train, each with the whole GPU pool as its budget (stages time-share the GPUs).
Inside a stage the model-stages are grouped into *lanes*: the members of a lane share one
allocation (one GPU count ``n``) and run one after another; lanes run side by side on disjoint
GPUs. The predicted step latency is the critical path of that overlap graph with a barrier
between stages,

    L_step = Σ_s max_{lanes λ of s} Σ_{M ∈ λ} ℓ(π_M),

subject to the per-stage GPU budget ``Σ_{λ of s} n_λ ≤ N`` and the plan-level memory bound

    Σ_s max_{λ of s} Σ_{M ∈ λ} P(π_M) + max_M T(π_M) ≤ M_eff.

A device hosts at most one lane per stage, so its evaluator peak ``Σ persistent + max
transient`` never exceeds the left-hand side, whatever the placement: every plan the planner
returns is memory-feasible for the evaluator.

**Dynamic programme.** Labels are triples ``(L, P, T)`` compared by Pareto dominance (``ND``
keeps the non-dominated ones). A lane ``λ = (M_1..M_r)`` on ``n`` GPUs::

    Λ_λ(n) = ND{ (Σ_i ℓ_{c_i}, Σ_i p_{c_i}, max_i t_{c_i}) : c_i ∈ frontier(M_i), n_{c_i} = n }

Inside stage ``s``, for every partition of its model-stages into lanes ``λ_1..λ_k`` (a knapsack
over GPUs ``g``)::

    F_0(0) = {(0, 0, 0)}
    F_j(g) = ND{ (max(L, L'), max(P, P'), max(T, T')) :
                 (L', P', T') ∈ Λ_{λ_j}(n), (L, P, T) ∈ F_{j−1}(g − n), max(P, P') + max(T, T') ≤ M_eff }
    Φ_s    = ND ∪_{partitions} ∪_{g ≤ N} F_k(g)

and across stages::

    G_0 = {(0, 0, 0)}
    G_s = ND{ (L + L', P + P', max(T, T')) : (L, P, T) ∈ G_{s−1}, (L', P', T') ∈ Φ_s,
              P + P' + max(T, T') ≤ M_eff }
    L*  = min{ L : (L, P, T) ∈ G_S }.

Every quantity is an integer (latency in µs, memory in KiB rounded up, ``M_eff`` down), so the DP, the
CP-SAT model of :mod:`rpeg.formulations.dp_exact` and brute-force enumeration agree exactly.
A label at ``g`` that is weakly dominated by a label at ``g' ≤ g`` is dropped: it uses more GPUs
for nothing. The DP is exact over the frontiers: dominance keeps, for every label it drops, one
that is no worse in every term the recurrences combine (``max`` and ``+`` are monotone).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..ir.cluster import Allocation, Cluster
from ..ir.graph import RPEG
from ..ir.plan import Choice, Plan, Strategy
from ..ir.types import Role
from ..scoring.candidates import (
    aligned_allocations,
    directory_key,
    enumerate_strategies,
    explain_illegal,
    head_exclusions,
    lean_groups,
    lean_picks,
    past_deadline,
    scan_interleavings,
)
from ..scoring.costs import Costs
from ..scoring.memo import KeyedCache
from .baselines import Infeasible

__all__ = [
    "COARSE_MEM_UNITS",
    "LAT_UNIT",
    "MEM_UNIT",
    "STAGES",
    "DPInstance",
    "Frontier",
    "FrontierPoint",
    "Selection",
    "StageUnit",
    "build_dp_instance",
    "build_frontier",
    "clear_frontier_cache",
    "coarsen_memory",
    "dominates",
    "lean_frontier",
    "model_stages",
    "place",
    "size_chain",
    "solve_dp",
]

#: Seconds per latency unit (µs): integer data keep the DP, CP-SAT and enumeration in exact
#: agreement; CP-SAT mis-proves optimality with nanosecond coefficients (~1e11).
LAT_UNIT = 1e-6
#: Bytes per memory unit (KiB); figures are rounded up and ``M_eff`` down, so the bound stays safe.
MEM_UNIT = 1024
GIB = 2**30 // MEM_UNIT  # memory units per GiB

#: Stages in dependency order, with the names the paper uses.
STAGES: tuple[Role, ...] = (Role.GENERATION, Role.INFERENCE, Role.TRAINING)
STAGE_NAME = {Role.GENERATION: "Gen", Role.INFERENCE: "Inf", Role.TRAINING: "Train"}


# ---------------------------------------------------------------------------- data
@dataclass(frozen=True)
class StageUnit:
    """One model in one stage (a *model-stage*): the unit the planner gives one candidate.

    Not :class:`rpeg.ir.emu.ModelStage`: the transition model's model-stage, one per vertex.

    Parameters
    ----------
    model
        Model name in the graph.
    stage
        :class:`~rpeg.ir.types.Role` of its vertices.
    vertices
        Indices of its vertices in the graph (they share one choice and run one after another).
    names
        Their names (for messages).
    """

    model: str
    stage: Role
    vertices: tuple[int, ...]
    names: tuple[str, ...]

    @property
    def label(self) -> str:
        """``(actor, Gen)``."""
        return f"({self.model}, {STAGE_NAME[self.stage]})"

    def __post_init__(self) -> None:
        if not self.vertices:
            raise ValueError(f"StageUnit.vertices must not be empty for model {self.model!r}")
        if len(self.vertices) != len(self.names):
            raise ValueError(
                f"StageUnit.names must name each vertex: {len(self.names)} names for "
                f"{len(self.vertices)} vertices"
            )


@dataclass(frozen=True)
class FrontierPoint:
    """One candidate of a model-stage.

    Attributes
    ----------
    strategy
        Shape, degrees, microbatches and tiers (placed later by :func:`place`).
    latency
        ``ℓ`` in µs (:data:`LAT_UNIT`): the summed unsplit OP time of the model-stage's vertices.
    gpus
        ``n = Pd·Pp·Pt``.
    persistent
        ``P`` in KiB per GPU (:data:`MEM_UNIT`, rounded up).
    transient
        ``T`` in KiB per GPU (rounded up).
    """

    strategy: Strategy
    latency: int
    gpus: int
    persistent: int
    transient: int

    @property
    def key(self) -> tuple[int, int, int, int]:
        """The four minimised terms ``(ℓ, n, P, T)``."""
        return (self.latency, self.gpus, self.persistent, self.transient)

    @property
    def footprint(self) -> int:
        """``P + T``: the per-GPU memory of this point alone."""
        return self.persistent + self.transient


def dominates(a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether ``a`` weakly dominates ``b``: no worse in every (minimised) term."""
    return all(x <= y for x, y in zip(a, b))


@dataclass
class Frontier:
    """The candidates of one model-stage with memory-infeasible and dominated ones dropped.

    Attributes
    ----------
    stage
        The model-stage.
    points
        Pareto-optimal points in ``(ℓ, n, P, T)``, sorted by ``(n, ℓ, P, T)``.
    legal
        Legal strategies considered (P1–P8 and H1–H2 for every vertex of the model-stage).
    dropped_memory
        Dropped because ``P + T > M_eff``.
    dropped_dominated
        Dropped because another point is no worse in ``(ℓ, n, P, T)`` (equal points: the later
        one in enumeration order).
    leanest
        Smallest ``P + T`` over the legal strategies (KiB; ``inf`` without any).
    why_illegal
        When no strategy is legal: which rules (P1–P8, H1–H2) excluded the candidates
        (:func:`~rpeg.scoring.candidates.explain_illegal`); empty otherwise.
    heads_excluded
        The H1–H2 messages of the in-node tensor-parallel degrees the model's heads exclude on
        the stage's engine (:func:`~rpeg.scoring.candidates.head_exclusions`).
    lean
        Whether the frontier is lean (:func:`lean_frontier`): built because a deadline left no
        time for the full one.
    """

    stage: StageUnit
    points: list[FrontierPoint]
    legal: int
    dropped_memory: int
    dropped_dominated: int
    leanest: float
    why_illegal: str = ""
    heads_excluded: tuple[str, ...] = ()
    lean: bool = False


@dataclass
class DPInstance:
    """The choice problem the DP and the exact model solve.

    Attributes
    ----------
    cluster
        The machine (for placement).
    stages
        Model-stage indices per stage, in order Gen → Inf → Train (empty stages left out).
    frontiers
        One frontier per model-stage.
    budget
        ``N``: GPUs available to every stage.
    m_eff
        ``M_eff`` in KiB (rounded down).
    build_s
        Seconds spent building the frontiers (cost-model calls included).
    """

    cluster: Cluster
    stages: list[list[int]]
    frontiers: list[Frontier]
    budget: int
    m_eff: int
    build_s: float = 0.0

    def side_by_side(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """The grouping with every model-stage in its own lane."""
        return tuple(tuple((m,) for m in members) for members in self.stages)

    def objective(
        self, picks: Sequence[int], lanes: Sequence[Sequence[Sequence[int]]] | None = None
    ) -> tuple[int, bool]:
        """``(L_step, feasible)`` of a selection, recomputed from the data (module docstring).

        Parameters
        ----------
        picks
            Frontier point index per model-stage.
        lanes
            Per stage, its model-stages grouped into lanes (default: each alone).

        Returns
        -------
        tuple
            ``L_step = Σ_s max_lanes Σ_{M∈lane} ℓ`` and whether every lane's members use one GPU
            count, every stage fits ``N`` GPUs and ``Σ_s max_lanes Σ P + max T ≤ M_eff``.

        Raises
        ------
        ValueError
            If ``picks`` or ``lanes`` do not match the instance (wrong length, index out of a
            frontier, a stage's lanes not a partition of its model-stages).
        """
        if len(picks) != len(self.frontiers):
            raise ValueError(
                f"picks must hold one index per model-stage ({len(self.frontiers)}), got {len(picks)}"
            )
        for m, j in enumerate(picks):
            if not 0 <= j < len(self.frontiers[m].points):
                raise ValueError(f"picks[{m}]={j} is outside the frontier of {self.frontiers[m].stage.label}")
        lanes = self.side_by_side() if lanes is None else lanes
        if len(lanes) != len(self.stages):
            raise ValueError(f"lanes must hold one grouping per stage ({len(self.stages)}), got {len(lanes)}")
        total = persistent = transient = 0
        ok = True
        for members, grouping in zip(self.stages, lanes):
            flat = sorted(m for lane in grouping for m in lane)
            if flat != sorted(members):
                raise ValueError(
                    f"lanes {grouping!r} are not a partition of the stage's model-stages {members}"
                )
            lat = per = gpus = 0
            for lane in grouping:
                pts = [self.frontiers[m].points[picks[m]] for m in lane]
                ok = ok and len({p.gpus for p in pts}) == 1
                lat = max(lat, sum(p.latency for p in pts))
                per = max(per, sum(p.persistent for p in pts))
                transient = max(transient, *(p.transient for p in pts))
                gpus += pts[0].gpus
            total += lat
            persistent += per
            ok = ok and gpus <= self.budget
        return total, ok and persistent + transient <= self.m_eff

    def stage_latencies(
        self, picks: Sequence[int], lanes: Sequence[Sequence[Sequence[int]]] | None = None
    ) -> list[int]:
        """``max_lanes Σ ℓ`` per stage (µs)."""
        lanes = self.side_by_side() if lanes is None else lanes
        return [
            max(sum(self.frontiers[m].points[picks[m]].latency for m in lane) for lane in grouping)
            for grouping in lanes
        ]


@dataclass(frozen=True)
class Selection:
    """The DP's (or an exact model's) choice.

    Attributes
    ----------
    picks
        Frontier point index per model-stage.
    step_latency
        ``L_step`` in µs.
    runtime
        Seconds the selection took (frontier building excluded).
    labels
        Labels the DP created (a size measure; 0 for other engines).
    lanes
        Per stage, its model-stages grouped into lanes (members of a lane share one allocation
        and run one after another; lanes run side by side); empty: each model-stage alone.
    """

    picks: tuple[int, ...]
    step_latency: int
    runtime: float
    labels: int = field(default=0)
    lanes: tuple[tuple[tuple[int, ...], ...], ...] = ()


# ---------------------------------------------------------------------------- model-stages
def model_stages(graph: RPEG) -> list[StageUnit]:
    """Group the vertices of ``graph`` into model-stages, in stage order then vertex order.

    Raises
    ------
    ValueError
        If a data edge joins two vertices of one stage or runs backwards (Train → Gen, …): the
        stage composition of the planner would then not respect the dependencies.
    """
    order = {r: i for i, r in enumerate(STAGES)}
    groups: dict[tuple[int, str], list[int]] = {}
    for i, v in enumerate(graph.vertices):
        groups.setdefault((order[v.role], v.model), []).append(i)
    for e in graph.data_edges:
        su, sv = graph.vertex(e.src).role, graph.vertex(e.dst).role
        if order[su] >= order[sv]:
            raise ValueError(
                f"data edge {e.src!r} → {e.dst!r} goes from stage {STAGE_NAME[su]} to stage "
                f"{STAGE_NAME[sv]}; the dp planner needs every edge to go to a later stage"
            )
    out = []
    for (si, model), vs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[1][0])):
        out.append(StageUnit(model, STAGES[si], tuple(vs), tuple(graph.vertices[v].name for v in vs)))
    return out


def size_chain(cluster: Cluster) -> tuple[int, ...]:
    """The allocation sizes the planner uses: the legal sizes when each divides the next, else
    the longest divisibility chain of legal sizes ending at ``N`` (ties: larger sizes first).

    On a chain, largest-first packing at the lowest free aligned origin places any set of blocks
    whose sizes sum to at most ``N`` (buddy argument), so the budget ``Σ n ≤ N`` is exactly
    packability.
    """
    sizes = cluster.legal_sizes
    if all(b % a == 0 for a, b in zip(sizes, sizes[1:])):
        return sizes
    best: dict[int, tuple[int, ...]] = {}
    for s in sizes:  # ascending: best[s] = longest chain ending at s
        prev = [best[a] for a in sizes if a < s and s % a == 0]
        tail = max(prev, key=lambda c: (len(c), c), default=())
        best[s] = (*tail, s)
    return best[cluster.num_devices]


# ---------------------------------------------------------------------------- frontiers
def _memory_terms(costs: Costs, vertex: int, s: Strategy) -> tuple[float, float]:
    """``(P, T)`` of one vertex under ``s``, classified as the evaluator does (SPEC §6).

    Training: ``(12·W_shard/Pd, A)``. Serving a frozen model, or a trainable one with ``τ > 0``
    (a shadow copy where it does not train): ``(W_shard·sb, A)`` — for a trainable model the
    evaluator may instead put the weights into the transient, and ``W + max(a, b) ≥ max(a, b + W)``
    keeps the bound valid. Serving a trainable model with ``τ = 0``: ``(0, A + W_shard·sb)``.
    """
    g = costs.graph
    v = g.vertices[vertex]
    mem = costs.memory(vertex, s)
    if v.role is Role.TRAINING:
        return mem.train_state, mem.transient
    inst = g.models[v.model]
    if not inst.trainable or g.staleness.get(v.model, 0) > 0:
        return mem.weights, mem.transient
    return 0.0, mem.transient + mem.weights


#: Model-stage frontiers :func:`build_frontier` keeps for the process (least recently used out).
FRONTIER_CACHE = 64
_FRONTIERS: KeyedCache[Frontier] = KeyedCache(FRONTIER_CACHE)


def clear_frontier_cache() -> None:
    """Forget the frontiers :func:`build_frontier` kept."""
    _FRONTIERS.clear()


def frontier_key(costs: Costs, ms: StageUnit, sizes: Sequence[int], m_eff: int) -> tuple:
    """What the frontier of ``ms`` depends on: per vertex its
    :func:`~rpeg.scoring.candidates.directory_key`, name, whether its model trains and the
    model's staleness (:func:`_memory_terms`); the allowed sizes and ``M_eff``."""
    g = costs.graph
    per_vertex = tuple(
        (
            directory_key(costs, v),
            g.vertices[v].name,
            g.models[g.vertices[v].model].trainable,
            g.staleness.get(g.vertices[v].model, 0),
        )
        for v in ms.vertices
    )
    return (per_vertex, tuple(sorted(set(sizes))), m_eff)


def build_frontier(
    costs: Costs, ms: StageUnit, sizes: Sequence[int], m_eff: int, deadline: float | None = None
) -> Frontier | None:
    """The frontier of model-stage ``ms``: legal, memory-feasible, Pareto-optimal points.

    A strategy is legal when it passes P1–P8 and the head rules H1–H2 of the stage's engine
    (vLLM for Gen, Megatron-core for Inf and Train; :func:`~rpeg.ir.plan.check_heads`) for every
    vertex of the model-stage and its size is in ``sizes``. Its latency is ``Σ_v op_time(v, s)``
    (the vertices run one after another on the same GPUs), ``P = max_v P_v`` and
    ``T = max_v T_v``. Without any legal strategy, :attr:`Frontier.why_illegal` says which rules
    excluded the candidates. Host-offload variants (SPEC §14.4) are each resident layout's twin,
    as legal and runnable as it: the resident layouts are enumerated and each is scored with its
    twin (as :func:`~rpeg.scoring.candidates.build_directories` lists them).

    A frontier depends only on :func:`frontier_key` (each vertex's
    :func:`~rpeg.scoring.candidates.directory_key`, whether its model trains and its
    staleness, the sizes and ``M_eff``), so the last :data:`FRONTIER_CACHE` built are kept for
    the process, as directories are: the structures of one plan and the re-plans of a
    controller share model-stages. ``None`` when ``deadline`` (a ``time.monotonic()``
    instant) passed before a frontier not kept was complete (:func:`lean_frontier` is the
    fallback :func:`build_dp_instance` uses).
    """
    key = frontier_key(costs, ms, sizes, m_eff)
    f = _FRONTIERS.peek(key)
    if f is None or f.lean:
        f = _build_frontier(costs, ms, sizes, m_eff, deadline=deadline)
        if f is None:
            return None
        _FRONTIERS.put(key, f)
    return dataclasses.replace(f, stage=ms, points=list(f.points))  # the caller's own copy


def lean_frontier(costs: Costs, ms: StageUnit, sizes: Sequence[int], m_eff: int) -> Frontier:
    """The lean frontier of model-stage ``ms`` (:attr:`Frontier.lean`; kept for the process
    until a full one replaces it): as :func:`build_frontier`, but of each group of degrees
    only the strategies that start for every vertex and fit ``M_eff`` that
    :func:`~rpeg.scoring.candidates.lean_picks` keeps, and no interleaved twins."""
    key = frontier_key(costs, ms, sizes, m_eff)
    f = _FRONTIERS.peek(key)
    if f is None:
        f = _build_frontier(costs, ms, sizes, m_eff, lean=True)
        assert f is not None  # no deadline
        _FRONTIERS.put(key, f)
    return dataclasses.replace(f, stage=ms, points=list(f.points))


def _build_frontier(
    costs: Costs,
    ms: StageUnit,
    sizes: Sequence[int],
    m_eff: int,
    *,
    deadline: float | None = None,
    lean: bool = False,
) -> Frontier | None:
    """:func:`build_frontier` (or with ``lean``, :func:`lean_frontier`), uncached; ``None``
    when ``deadline`` passed first."""
    g = costs.graph
    allowed = set(sizes)
    legal: list[Strategy] | None = None
    for v in ms.vertices:
        vert = g.vertices[v]
        ss = [
            s
            for s in enumerate_strategies(
                costs.cluster,
                g.models[vert.model].spec,
                vert.sequences,
                vert.role,
                offload=False,
                interleave=False,
            )
            if s.size in allowed
        ]
        if legal is None:
            legal = ss
        else:
            keep = set(ss)
            legal = [s for s in legal if s in keep]
    legal = legal or []
    why_illegal = ""
    if not legal:
        for v in ms.vertices:
            vert = g.vertices[v]
            why_illegal = explain_illegal(
                costs.cluster, g.models[vert.model].spec, vert.role, vert.sequences, sorted(allowed)
            )
            if why_illegal:
                why_illegal = f"{vert.name}: {why_illegal}"
                break
        else:
            why_illegal = "its vertices' legal layouts have none in common"
    raw: list[FrontierPoint] = []
    leanest = math.inf
    dropped_memory = 0

    def point_of(s: Strategy) -> FrontierPoint:
        p = t = lat = 0.0
        for v in ms.vertices:
            pv, tv = _memory_terms(costs, v, s)
            p, t = max(p, pv), max(t, tv)
            lat += costs.op_time(v, s)
        return FrontierPoint(
            s, round(lat / LAT_UNIT), s.size, math.ceil(p / MEM_UNIT), math.ceil(t / MEM_UNIT)
        )

    def with_offload(listed: list[Strategy]) -> list[Strategy]:
        """Each with its host-offload twin (SPEC §14.4), as legal and runnable as it."""
        if not costs.cluster.host_offload:
            return listed
        return [t for c in listed for t in (c, c.variant(offload=True))]

    def admit(strategies: list[Strategy]) -> bool:
        """Score ``strategies`` into ``raw``; ``False`` when the deadline passed first."""
        nonlocal leanest, dropped_memory
        for i, s in enumerate(strategies):
            if past_deadline(deadline, i):
                return False
            point = point_of(s)
            leanest = min(leanest, point.footprint)
            if point.footprint > m_eff:
                dropped_memory += 1
                continue
            raw.append(point)
        return True

    runnable = [s for s in legal if all(costs.runnable(v, s) for v in ms.vertices)]
    if lean:
        runnable = _lean_layouts(costs, ms, runnable, m_eff)
    if not admit(with_offload(runnable)):
        return None
    kept = _pareto(raw)
    dominated = len(raw) - len(kept)
    # the fastest interleaved twin (vp > 1) of each plain-1F1B point kept, then the filter again
    interleaved = []
    for i, q in enumerate([] if lean else kept):
        if past_deadline(deadline, i):
            return None
        if not q.strategy.offload and (fast := _fastest_interleaving(costs, ms, q.strategy, point_of, m_eff)):
            interleaved.append(fast)
    if interleaved:
        raw = kept[:]
        admit(with_offload(interleaved))
        kept = _pareto(raw)
        dominated += len(raw) - len(kept)
    first = g.vertices[ms.vertices[0]]
    excluded = tuple(head_exclusions(costs.cluster, g.models[first.model].spec, first.role))
    return Frontier(
        ms,
        kept,
        (len(legal) + len(interleaved)) * (2 if costs.cluster.host_offload else 1),  # with the twins
        dropped_memory,
        dominated,
        leanest,
        why_illegal,
        excluded,
        lean,
    )


def _lean_layouts(costs: Costs, ms: StageUnit, strategies: list[Strategy], m_eff: int) -> list[Strategy]:
    """Of each group of degrees in ``strategies`` (:func:`~rpeg.scoring.candidates.lean_groups`),
    the two :func:`~rpeg.scoring.candidates.lean_directory` keeps
    (:func:`~rpeg.scoring.candidates.lean_picks`), by footprint ``P + T`` against ``m_eff``
    (KiB); of a group none of whose strategies fits, its leanest (the frontier scores it as
    dropped, and its ``leanest`` is right)."""
    generation = ms.stage is Role.GENERATION

    def footprint(s: Strategy) -> int:
        p = t = 0.0
        for v in ms.vertices:
            pv, tv = _memory_terms(costs, v, s)
            p, t = max(p, pv), max(t, tv)
        return math.ceil(p / MEM_UNIT) + math.ceil(t / MEM_UNIT)

    out: list[Strategy] = []
    for group in lean_groups(strategies):
        sized = [(footprint(strategies[j]), strategies[j].mb, j) for j in group]
        fitting = [x for x in sized if x[0] <= m_eff]
        picks = lean_picks(fitting, generation) or [min(sized, key=lambda x: (x[0], x[2]))[2]]
        out += [strategies[j] for j in picks]
    return out


def _pareto(raw: list[FrontierPoint]) -> list[FrontierPoint]:
    """The points of ``raw`` no other one dominates (:func:`dominates` on ``(latency, gpus,
    persistent, transient)``): sorted so that a dominating point always comes first, then one
    sweep; of equal keys the first stays."""
    raw = sorted(raw, key=lambda q: (q.gpus, q.latency, q.persistent, q.transient))
    kept: list[FrontierPoint] = []
    keys = np.empty((len(raw), 4), dtype=np.int64)  # the kept points' keys, one row each
    for q in raw:
        key = np.array(q.key, dtype=np.int64)
        if not (keys[: len(kept)] <= key).all(axis=1).any():  # `dominates`, vectorised
            keys[len(kept)] = key
            kept.append(q)
    return kept


def _fastest_interleaving(
    costs: Costs, ms: StageUnit, plain: Strategy, point_of: Callable[[Strategy], FrontierPoint], m_eff: int
) -> Strategy | None:
    """The interleaved twin (``vp > 1``) of ``plain`` a frontier considers: the one of least
    latency summed over the model-stage's vertices that fits ``M_eff`` and starts
    (:func:`~rpeg.scoring.candidates.scan_interleavings`, as a directory picks one per vertex)."""
    g = costs.graph
    first = g.vertices[ms.vertices[0]]

    def latency_if_it_fits(s: Strategy) -> float | None:
        if not all(costs.runnable(v, s) for v in ms.vertices):
            return None
        point = point_of(s)
        return None if point.footprint > m_eff else point.latency

    best = scan_interleavings(
        costs.cluster, g.models[first.model].spec, first.role, plain, latency_if_it_fits
    )
    return best[1] if best is not None else None


def build_dp_instance(costs: Costs, budget: int | None = None, deadline: float | None = None) -> DPInstance:
    """Model-stages, their frontiers, the GPU budget and ``M_eff`` for ``costs``' graph.

    Parameters
    ----------
    costs
        The shared cost provider of one evaluator (graph, workload, cluster).
    budget
        GPUs per stage (default: the whole cluster).
    deadline
        A ``time.monotonic()`` instant (``None``: none). With one, every model-stage first gets
        its lean frontier (:func:`lean_frontier`), then the full ones are built in order,
        each replacing its lean one, until the deadline passes (as
        :func:`~rpeg.scoring.candidates.build_directories` does with directories).

    Raises
    ------
    ValueError
        If ``budget`` is not in ``1..N``, or the graph's edges do not follow the stage order.
    """
    t0 = time.perf_counter()
    cluster = costs.cluster
    n = cluster.num_devices
    if budget is None:
        budget = n
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= n:
        raise ValueError(f"budget must be an integer GPU count in 1..{n}, got {budget!r}")
    m_eff = math.floor(cluster.hardware.m_eff / MEM_UNIT)
    mss = model_stages(costs.graph)
    sizes = [s for s in size_chain(cluster) if s <= budget]
    frontiers: list[Frontier | None] = [None] * len(mss)
    if deadline is not None:  # every model-stage has its lean frontier before the full ones are tried
        frontiers = [lean_frontier(costs, ms, sizes, m_eff) for ms in mss]
    for i, ms in enumerate(mss):
        if frontiers[i] is not None and not frontiers[i].lean:
            continue
        if past_deadline(deadline, 0):
            break  # the rest stay lean
        full = build_frontier(costs, ms, sizes, m_eff, deadline)
        if full is None:  # the deadline passed: the rest stay lean
            break
        frontiers[i] = full
    stages = [[i for i, ms in enumerate(mss) if ms.stage is r] for r in STAGES]
    stages = [s for s in stages if s]
    built = [f for f in frontiers if f is not None]
    assert len(built) == len(mss)  # lean ones with a deadline, full ones without
    return DPInstance(cluster, stages, built, budget, m_eff, time.perf_counter() - t0)


#: Memory unit (KiB) of the DP under a time limit (``method="dp"`` with ``time_limit``): 1 GiB.
#: Rounding each point's ``P`` and ``T`` up and ``M_eff`` down keeps every selection feasible
#: and merges the points that differ by less: on the bundled 64-GPU example the DP took 0.08 s
#: instead of 2.2 s over the full frontiers at the same optimum, and 0.05 s instead of
#: 0.37-0.61 s over the lean ones for a 1 % longer predicted step (``docs/decisions.md``,
#: "Candidates under a time limit").
COARSE_MEM_UNITS = GIB


def coarsen_memory(inst: DPInstance, units: int) -> DPInstance:
    """``inst`` with memory in units of ``units`` KiB: each point's ``P`` and ``T`` rounded up,
    ``M_eff`` down, and the points another then dominates dropped (:func:`_pareto`).

    ``⌈P/u⌉ + ⌈T/u⌉ ≤ ⌊M/u⌋`` implies ``P + T ≤ M``, so whatever the DP selects on the coarse
    instance fits; a selection near the cap may be lost (at most ``u`` per term). Latencies
    stay exact.
    """
    frontiers = []
    for f in inst.frontiers:
        points = [
            dataclasses.replace(q, persistent=-(-q.persistent // units), transient=-(-q.transient // units))
            for q in f.points
        ]
        kept = _pareto(points)
        frontiers.append(
            dataclasses.replace(
                f, points=kept, dropped_dominated=f.dropped_dominated + len(points) - len(kept)
            )
        )
    return dataclasses.replace(inst, frontiers=frontiers, m_eff=inst.m_eff // units)


# ---------------------------------------------------------------------------- the DP
Lane = tuple[tuple[int, int], ...]  # (model-stage, point index) of the members sharing one allocation
Label = tuple[int, int, int, tuple[Lane, ...]]  # (L, P, T, lanes)


def partitions(items: Sequence[int]) -> list[tuple[tuple[int, ...], ...]]:
    """Every set partition of ``items`` (order of blocks and members as in ``items``).

    ``[0, 1]`` → ``[((0, 1),), ((0,), (1,))]``; there are Bell(k) of them (1, 2, 5, 15 for
    k = 1..4). Blocks keep the members' relative order.
    """
    if not items:
        return [()]
    head, rest = items[0], items[1:]
    out: list[tuple[tuple[int, ...], ...]] = []
    for sub in partitions(rest):
        for i in range(len(sub)):  # join an existing block ...
            out.append((*sub[:i], (head, *sub[i]), *sub[i + 1 :]))
        out.append(((head,), *sub))  # ... or open a new one
    return out


class _Staircase:
    """The ``(P, T)`` Pareto staircase of the labels seen so far: ``P`` ascending, ``T``
    strictly descending. With labels visited by ascending ``L``, a label is weakly dominated by
    an earlier one iff some stair has ``P' ≤ P`` and ``T' ≤ T`` — one binary search."""

    __slots__ = ("ps", "ts")

    def __init__(self) -> None:
        self.ps: list[int] = []
        self.ts: list[int] = []

    def covers(self, p: int, t: int) -> bool:
        i = bisect.bisect_right(self.ps, p)
        return i > 0 and self.ts[i - 1] <= t

    def add(self, p: int, t: int) -> None:
        i = bisect.bisect_left(self.ps, p)
        j = i
        while j < len(self.ps) and self.ts[j] >= t:  # stairs the new one dominates
            j += 1
        self.ps[i:j] = [p]
        self.ts[i:j] = [t]


def _nondominated(labels: list[Label], seen: list[Label] | None = None) -> list[Label]:
    """Labels not weakly dominated by an earlier one (nor by one in ``seen``), in a stable order.

    Visiting by ``(L, P, T)`` guarantees that a dominating label comes first, so each label needs
    one :class:`_Staircase` query: ``O(n log n)`` instead of pairwise comparisons.
    """
    stairs = _Staircase()
    tagged = [(lab[0], lab[1], lab[2], 0, lab) for lab in seen or ()]
    tagged += [(lab[0], lab[1], lab[2], 1, lab) for lab in labels]
    out: list[Label] = []
    for _, p, t, own, lab in sorted(tagged, key=lambda x: (x[0], x[1], x[2], x[3], x[4][3])):
        if stairs.covers(p, t):
            continue
        stairs.add(p, t)
        if own:
            out.append(lab)
    return out


def _lane_options(inst: DPInstance, block: tuple[int, ...]) -> dict[int, list[Label]]:
    """Per GPU count ``n``, the non-dominated ``(Σ ℓ, Σ P, max T)`` of the block's members run one
    after another on one allocation of ``n`` GPUs (each with a point of exactly ``n`` GPUs)."""
    cap = inst.m_eff
    sizes = set.intersection(*({q.gpus for q in inst.frontiers[m].points} for m in block))
    out: dict[int, list[Label]] = {}
    for n in sorted(sizes):
        labels: list[Label] = [(0, 0, 0, ((),))]
        for m in block:
            nxt: list[Label] = []
            for j, q in enumerate(inst.frontiers[m].points):
                if q.gpus != n:
                    continue
                for lat, per, tra, (lane,) in labels:
                    p2, t2 = per + q.persistent, max(tra, q.transient)
                    if p2 + t2 <= cap:
                        nxt.append((lat + q.latency, p2, t2, ((*lane, (m, j)),)))
            labels = _nondominated(nxt)
        if labels:
            out[n] = labels
    return out


def _stage_front(inst: DPInstance, members: list[int]) -> tuple[list[Label], int]:
    """``Φ_s``: the non-dominated ``(max ℓ, max P, max T)`` of the stage over every grouping of
    its model-stages into lanes, within ``N`` GPUs (module docstring); and the labels created."""
    n_max, cap = inst.budget, inst.m_eff
    created = 0
    final: list[Label] = []
    for blocks in partitions(members):
        states: dict[int, list[Label]] = {0: [(0, 0, 0, ())]}
        for block in blocks:
            options = _lane_options(inst, block)
            new: dict[int, list[Label]] = {}
            for g, labels in states.items():
                for n, lane_labels in options.items():
                    if g + n > n_max:
                        continue
                    bucket = new.setdefault(g + n, [])
                    for lat, per, tra, lanes in labels:
                        for l2, p2, t2, lane in lane_labels:
                            p3, t3 = max(per, p2), max(tra, t2)
                            if p3 + t3 <= cap:
                                bucket.append((max(lat, l2), p3, t3, (*lanes, *lane)))
                                created += 1
            states = {}
            seen: list[Label] = []
            for g in sorted(new):  # a label is useless if one on fewer GPUs is no worse
                kept = _nondominated(new[g], seen)
                if kept:
                    states[g] = kept
                    seen = _nondominated(seen + kept)
        final.extend(lab for labels in states.values() for lab in labels)
    return _nondominated(final), created


def solve_dp(inst: DPInstance) -> Selection:
    """Pick one frontier point per model-stage and a grouping into lanes per stage, minimising
    ``L_step`` (module docstring).

    Returns
    -------
    Selection
        The optimum over the frontiers; ties are broken by the smaller ``P + T``, then by the
        lanes and point indices (lexicographically), so the result is deterministic.

    Raises
    ------
    Infeasible
        Naming the model-stage (or stage) that cannot be served and by how much memory or how
        many GPUs it misses.
    """
    t0 = time.perf_counter()
    _check_frontiers(inst)
    cap = inst.m_eff
    fronts = []
    created = 0
    for members in inst.stages:
        front, c = _stage_front(inst, members)
        created += c
        if not front:
            raise _stage_infeasible(inst, members)
        fronts.append(front)
    combined: list[tuple[int, int, int, tuple[tuple[Lane, ...], ...]]] = [(0, 0, 0, ())]
    for front in fronts:
        nxt = []
        for lat, per, tra, stages in combined:
            for l2, p2, t2, lanes in front:
                if per + p2 + max(tra, t2) <= cap:
                    nxt.append((lat + l2, per + p2, max(tra, t2), (*stages, lanes)))
        created += len(nxt)
        combined = _nondominated(nxt)  # type: ignore[arg-type]
        if not combined:
            raise _memory_infeasible(inst)
    best = min(combined, key=lambda x: (x[0], x[1] + x[2], x[3]))
    picks = [0] * len(inst.frontiers)
    lanes_out = []
    for stage_lanes in best[3]:
        lanes_out.append(tuple(tuple(m for m, _ in lane) for lane in stage_lanes))
        for lane in stage_lanes:
            for m, j in lane:
                picks[m] = j
    return Selection(tuple(picks), best[0], time.perf_counter() - t0, created, tuple(lanes_out))


# ---------------------------------------------------------------------------- infeasibility
def _check_frontiers(inst: DPInstance) -> None:
    m_eff = inst.m_eff
    for f in inst.frontiers:
        if f.points:
            continue
        ms = f.stage
        where = f"{ms.label} [{', '.join(ms.names)}]"
        if f.legal == 0:
            raise Infeasible(
                f"model-stage {where} has no legal parallel layout within {inst.budget} GPUs on cluster "
                f"{inst.cluster.shape_str}" + (f": {f.why_illegal}" if f.why_illegal else ""),
                ms.names[0],
            )
        over = max(0, f.leanest - m_eff)
        raise Infeasible(
            f"model-stage {where} does not fit in memory: its leanest of {f.legal} legal layouts needs "
            f"{f.leanest / GIB:.2f} GiB per GPU, {over / GIB:.2f} GiB over M_eff={m_eff / GIB:.2f} GiB"
            + _heads_note(f),
            ms.names[0],
            over * MEM_UNIT,
        )


def _heads_note(f: Frontier) -> str:
    """``"; the attention heads exclude …"`` when H1–H2 ruled out tensor-parallel degrees."""
    if not f.heads_excluded:
        return ""
    return f"; the attention heads exclude the other tensor-parallel degrees ({'; '.join(f.heads_excluded)})"


def _stage_infeasible(inst: DPInstance, members: list[int]) -> Infeasible:
    """Why stage ``members`` has no label: its model-stages fit neither side by side nor sharing
    GPUs (sizes), or memory."""
    fronts = [inst.frontiers[m] for m in members]
    least = [min(q.gpus for q in f.points) for f in fronts]
    common = set.intersection(*({q.gpus for q in f.points} for f in fronts))
    stage = STAGE_NAME[fronts[0].stage.stage]
    if sum(least) > inst.budget and not common:
        parts = ", ".join(f"{f.stage.label} ≥ {n}" for f, n in zip(fronts, least))
        return Infeasible(
            f"stage {stage} needs at least {sum(least)} GPUs side by side ({parts}), the budget is "
            f"{inst.budget}, and its model-stages have no GPU count in common to share one allocation",
            fronts[0].stage.names[0],
        )
    return _memory_infeasible(inst)


def _memory_infeasible(inst: DPInstance) -> Infeasible:
    """The plan-level bound fails for every combination: report the least ``Σ_s P_s + max T``
    any selection reaches (the same DP with memory as the objective and no cap) and the
    model-stage of that selection with the largest footprint."""
    lean = dataclasses.replace(inst, m_eff=sys.maxsize)
    fronts = [_stage_front(lean, members)[0] for members in inst.stages]
    combined: list[tuple[int, int, int, tuple]] = [(0, 0, 0, ())]
    for front in fronts:
        nxt = [
            (0, per + p2, max(tra, t2), (*stages, lanes))
            for _, per, tra, stages in combined
            for _, p2, t2, lanes in front
        ]
        combined = _nondominated(nxt)  # type: ignore[arg-type]
    _, per, tra, stages = min(combined, key=lambda x: (x[1] + x[2], x[3]))
    need = per + tra
    points = [(m, inst.frontiers[m].points[j]) for lanes in stages for lane in lanes for m, j in lane]
    m, worst = max(points, key=lambda mq: (mq[1].footprint, -mq[0]))
    ms = inst.frontiers[m].stage
    over = need - inst.m_eff
    return Infeasible(
        f"no memory-feasible plan: the leanest selection needs Σ_s P_s + max T = {need / GIB:.2f} GiB "
        f"per GPU ({per / GIB:.2f} GiB persistent over the stages + {tra / GIB:.2f} GiB transient), "
        f"{over / GIB:.2f} GiB over M_eff={inst.m_eff / GIB:.2f} GiB; its largest footprint is model-stage "
        f"{ms.label} [{', '.join(ms.names)}] with P={worst.persistent / GIB:.2f} GiB, "
        f"T={worst.transient / GIB:.2f} GiB on {worst.gpus} GPUs",
        ms.names[0],
        over * MEM_UNIT,
    )


# ---------------------------------------------------------------------------- placement
def place(inst: DPInstance, sel: Selection, num_vertices: int) -> Plan:
    """Turn a selection into a :class:`Plan`: per stage, its lanes largest first (ties: lane
    order) at the lowest free aligned origin; every vertex of every model-stage of a lane gets its
    point's strategy on the lane's allocation. Stages start again from device 0 (they time-share
    the GPUs).

    Raises
    ------
    ValueError
        If a stage does not pack (impossible for sizes from :func:`size_chain` summing to at
        most ``N``; the message names the stage).
    """
    choices: list[Choice | None] = [None] * num_vertices
    picks = sel.picks
    for grouping in sel.lanes or inst.side_by_side():
        used = 0
        order = sorted(
            grouping, key=lambda lane: (-inst.frontiers[lane[0]].points[picks[lane[0]]].gpus, lane)
        )
        for lane in order:
            n = inst.frontiers[lane[0]].points[picks[lane[0]]].gpus
            alloc: Allocation | None = next(
                (a for a in aligned_allocations(inst.cluster, n) if not a.mask & used), None
            )
            if alloc is None:
                stage = STAGE_NAME[inst.frontiers[lane[0]].stage.stage]
                raise ValueError(f"stage {stage} does not pack: no free aligned block of {n} GPUs")
            used |= alloc.mask
            for m in lane:
                for v in inst.frontiers[m].stage.vertices:
                    choices[v] = Choice(inst.frontiers[m].points[picks[m]].strategy, alloc)
    missing = [i for i, c in enumerate(choices) if c is None]
    if missing:
        raise ValueError(f"vertices {missing} belong to no model-stage")
    return Plan(tuple(choices))  # type: ignore[arg-type]

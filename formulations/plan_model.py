"""Plan selection + scheduling as data for an exact model (engine independent, SPEC §9).

Given an :class:`~rpeg.scoring.evaluator.Evaluator` (workload, cluster, one structural
candidate) and a candidate set ``C(v)`` of choices per vertex, this module applies the *same*
lowering rules as :func:`~rpeg.ir.lower.lower` (they are shared functions) to every pair of
candidates an edge can join, and groups the outcomes into **classes**: a class is one lowered
fragment (a precedence, a COMM of some duration on some devices, a RESHARD, ``Q`` phase-wise
COMMs). An exact model then chooses one candidate per vertex (``x[v,c]``), activates exactly
one class per edge (``z[e,o] ≥ x[u,cu] + x[v,cv] − 1`` for the pairs in ``o``, ``Σ_o z[e,o] = 1``)
and schedules the unrolled instances of the nodes those classes imply.

Both engines (:class:`~.plan_cpsat.PlanCPModel`, :class:`~.plan_milp.PlanMILPModel`) add the
same constraint blocks in the same order, :data:`PLAN_BLOCKS`, and return a :class:`PlanSolution`.
Everything is in seconds and bytes here; engines round durations up to their time unit.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..ir.lower import COMM, PREC, RESHARD, data_rule, pair_rule, phase_fractions, pub_rule, splits
from ..ir.plan import Choice, Plan, check_strategy_of
from ..ir.types import Role
from ..scoring.costs import VertexMemory
from ..scoring.evaluator import Evaluator
from ..scoring.scheduler import atoms_of
from .deadline import Deadline
from .status import Status

__all__ = [
    "PLAN_BLOCKS",
    "SYMMETRY_SHARE",
    "EdgeClasses",
    "PlanInstance",
    "PlanModel",
    "PlanSolution",
    "build_plan_instance",
    "critical_path_bound",
    "cut_constraints",
    "edge_delay",
    "hint_makespan",
    "horizon_bound",
    "min_op_seconds",
    "symmetry_fixing",
]

#: The constraint blocks of the plan-selection models, in the order both engines add them (the
#: later blocks use what the earlier ones created: ``operations`` needs ``split``, exclusivity
#: needs every interval of ``operations`` and ``transfers``):
#:
#: ``choice``
#:     ``x[v,c]``, ``Σ_c x[v,c] = 1``: one candidate per vertex;
#: ``symmetry``
#:     ``x[v₀,c] = 0`` for the candidates of one vertex ``v₀`` that a certified device
#:     permutation maps onto a kept one (:func:`symmetry_fixing`; nothing where none is certified);
#: ``edges``
#:     ``z[e,o]``, ``Σ_o z[e,o] = 1``, ``z[e,o] ≥ x[u,cu] + x[v,cv] − 1``: one lowering class per edge;
#: ``split``
#:     ``split[v] = OR`` of the phase-wise classes touching ``v``;
#: ``operations``
#:     ``S[v,k]``, ``E[v,k]`` and the OP node of every step and candidate (unsplit, or ``Q``
#:     chained phases ``PS[v,k,q]``/``PE[v,k,q]``), present iff its candidate is chosen;
#: ``transfers``
#:     each active class's fragment per step: a precedence, a COMM or RESHARD node, ``Q``
#:     phase-wise COMMs, or a publication node shared by the consumers of one version;
#: ``chains``
#:     ``S[t,k] ≥ E[t,k−1]`` for every training vertex ``t``;
#: ``exclusivity``
#:     no two present nodes overlap on a device atom;
#: ``memory``
#:     per atom, persistent state plus the running vertex's need within ``M_eff``;
#: ``cuts``
#:     redundant linear constraints that hold in every solution and tighten the relaxation
#:     (:func:`min_op_seconds`, :func:`critical_path_bound`): ``E[v,k] ≥ S[v,k] + Σ_c d⁻(v,c)·x[v,c]``,
#:     ``S[v,k] ≥ E[u,k'] + Σ_o d(o)·z[e,o]`` per edge without phase-wise classes,
#:     ``E[v,k] ≥ E[u,k] + Σ_o d_Q(o)·z[e,o]`` per edge with them, the energy of every atom
#:     ``MS ≥ Σ_{v,c∋a} Keval·d⁻(v,c)·x[v,c] + Σ_{transfers ∋ a} d·presence`` and ``MS ≥`` the
#:     critical path.
#:
#: The objective comes after them: ``min MS`` with ``MS ≥ E[v,k]``.
PLAN_BLOCKS: tuple[str, ...] = (
    "choice",
    "symmetry",
    "edges",
    "split",
    "operations",
    "transfers",
    "chains",
    "exclusivity",
    "memory",
    "cuts",
)


#: Share of the time left on a model's deadline that certifying device symmetries
#: (:func:`symmetry_fixing`) may take: at 1,024 devices certifying every block swap takes about
#: a second, which a short limit needs for building and solving the model. Not tuned: a round
#: number.
SYMMETRY_SHARE = 0.25


class PlanModel:
    """What the CP-SAT and the MILP plan models share: the variables' containers, the ordered
    blocks of :data:`PLAN_BLOCKS` and the loop that adds them (checking the deadline before
    each), so the two engines' models can be compared block by block.

    A subclass sets up its engine's model, then calls :meth:`_add_blocks`; it defines one method
    ``_<block>`` per name of :data:`PLAN_BLOCKS`.

    Attributes
    ----------
    blocks
        The names of the blocks added, in order (:data:`PLAN_BLOCKS` once built).
    x, z, split
        Candidate, edge-class and split variables (``split[v]`` is ``None`` where ``v`` never splits).
    S, E, PS, PE
        Instance and phase starts/ends per vertex and step.
    op_vars
        ``(v, k, c, phase) → (start, presence)`` of every OP node.
    node_vars
        Lowered identity → ``[(start, presence)]`` of every transfer node.
    """

    BLOCKS = PLAN_BLOCKS

    def __init__(self, inst: PlanInstance, deadline: Deadline | None, keep: Plan | None = None) -> None:
        self.inst = inst
        self.deadline = deadline or Deadline()
        # symmetry breaking is optional: it may take a quarter of the time left, not the model's
        #: ``(v₀, candidates of v₀ ruled out)`` by the symmetry block (``keep``'s choice is kept;
        #: ``None``: no certified symmetry)
        self.symmetry = symmetry_fixing(
            inst, keep, self.deadline.within(SYMMETRY_SHARE * self.deadline.remaining())
        )
        self.n = len(inst.ev.graph.vertices)
        self.x: list[list[Any]] = []
        self.z: list[list[Any]] = []
        self.split: list[Any] = []
        self.S: list[list[Any]] = []
        self.E: list[list[Any]] = []
        self.PS: list[list[list[Any]]] = []
        self.PE: list[list[list[Any]]] = []
        self.op_vars: dict[tuple, tuple] = {}
        self.node_vars: dict[tuple, list] = defaultdict(list)
        self.blocks: list[str] = []

    def _add_blocks(self, stage: Callable[[str], str]) -> None:
        """Add the blocks of :attr:`BLOCKS` in order, checking the deadline (``stage(name)``
        names what is being built) before each."""
        for name in self.BLOCKS:
            self.deadline.check(stage(name))
            getattr(self, f"_{name}")()
            self.blocks.append(name)


@dataclass
class PlanSolution:
    """Outcome of an exact plan-selection model.

    Attributes
    ----------
    status
        ``OPTIMAL``; ``FEASIBLE`` (a plan, no proof, and no limit hit); ``TIME_LIMIT`` (the time
        limit or Ctrl-C stopped the engine, or the model could not be built in time; a plan is
        attached when one was found); ``INFEASIBLE`` (proven); ``UNKNOWN`` (no plan, no proof, no
        limit hit); ``ERROR`` (the engine failed) — mapped once from the engine's own status
        (:mod:`.cpsat_backend`, :mod:`.pyomo_backend`).
    plan
        The chosen plan (``None`` without a solution).
    makespan
        The model's makespan in seconds (``inf`` without a solution).
    lower_bound
        Best proven lower bound on the makespan, in seconds, valid for the unrounded durations
        (the engine's bound minus one time unit per node a path can hold).
    runtime
        Seconds spent in the engine.
    starts
        Start time (s) per lowered-node identity ``(kind, vertex, source, step, phase)``.
    engine
        Engine name.
    time_to_first
        Seconds until the first solution (``None`` if none).
    interrupted
        Ctrl-C stopped the engine (the solution, if any, is the best so far).
    cut_off
        The model was proven infeasible under the caller's ``cutoff`` (status ``INFEASIBLE``):
        no plan of this instance is shorter than ``lower_bound`` = the cutoff.
    message
        Why the engine stopped early, when it did (e.g. ``"model too large to build in 0.5 s
        (…)"``); empty otherwise.
    """

    status: Status
    plan: Plan | None
    makespan: float
    lower_bound: float
    runtime: float
    starts: dict[tuple, float] = field(default_factory=dict)
    engine: str = "cpsat"
    time_to_first: float | None = None
    interrupted: bool = False
    message: str = ""
    cut_off: bool = False

    @classmethod
    def without_plan(
        cls,
        status: Status,
        runtime: float,
        engine: str,
        *,
        lower_bound: float = 0.0,
        interrupted: bool = False,
        message: str = "",
        cut_off: bool = False,
    ) -> PlanSolution:
        """An outcome with no plan: makespan ``inf``."""
        return cls(
            status,
            None,
            math.inf,
            lower_bound,
            runtime,
            engine=engine,
            interrupted=interrupted,
            message=message,
            cut_off=cut_off,
        )

    def under_cutoff(self, cutoff: float | None, binding: bool) -> PlanSolution:
        """This outcome, or — when the model was infeasible and the horizon was the caller's
        ``cutoff`` (``binding``) — a ``cut_off`` outcome whose lower bound is the cutoff."""
        if self.status != Status.INFEASIBLE or not binding or cutoff is None:
            return self
        return PlanSolution.without_plan(
            Status.INFEASIBLE,
            self.runtime,
            self.engine,
            lower_bound=cutoff,
            cut_off=True,
            message=f"no plan shorter than the cutoff {cutoff:.6g} s",
        )


@dataclass
class EdgeClasses:
    """The lowering classes of one compact edge.

    Attributes
    ----------
    kind
        ``"data"``, ``"pub"`` or ``"pair"``.
    src, dst
        Compact vertex indices.
    model
        Model name (publication and pair edges).
    classes
        Class keys: ``(PREC,)``; ``(COMM, durations, dst_mask)`` for data edges (several
        durations = phase-wise); ``(kind, duration, dst_mask, dst_strategy)`` for publications;
        ``(RESHARD, duration, dst_mask)`` for pair edges; ``None`` = no dependency at all.
    pairs
        For each class, the candidate index pairs ``(cu, cv)`` that produce it.
    """

    kind: str
    src: int
    dst: int
    model: str | None
    classes: list = field(default_factory=list)
    pairs: list[list[tuple[int, int]]] = field(default_factory=list)

    def add(self, key: object, cu: int, cv: int) -> None:
        """Record that candidates ``(cu, cv)`` produce class ``key``."""
        try:
            i = self.classes.index(key)
        except ValueError:
            i = len(self.classes)
            self.classes.append(key)
            self.pairs.append([])
        self.pairs[i].append((cu, cv))


@dataclass
class PlanInstance:
    """Everything an engine needs, precomputed.

    Attributes
    ----------
    ev
        The evaluator (structure, costs, unrolled graph).
    cands
        ``C(v)``: candidate choices per vertex.
    n_phases
        ``Q``.
    can_split
        Per vertex: whether some candidate pair splits it into phases.
    op
        ``op[v][c] = (unsplit durations, split durations or ())``.
    memory
        ``memory[v][c]``: the cost model's :class:`VertexMemory`.
    edges
        Per compact edge, its classes.
    split_edges
        Per vertex, the ``(edge index, class index)`` pairs whose activation splits it.
    m_eff
        ``M_eff`` in bytes.
    """

    ev: Evaluator
    cands: list[list[Choice]]
    n_phases: int
    can_split: list[bool]
    op: list[list[tuple[tuple[float, ...], tuple[float, ...]]]]
    memory: list[list[VertexMemory]]
    edges: list[EdgeClasses]
    split_edges: list[list[tuple[int, int]]]
    m_eff: float

    @property
    def k_eval(self) -> int:
        """Unrolled steps."""
        return self.ev.k_eval

    def serial_seconds(self) -> float:
        """Every node of every step run one after another at its slowest candidate: a horizon."""
        total = 0.0
        for row in self.op:
            total += max(sum(w) + sum(p) for w, p in row)
        for ec in self.edges:
            for key in ec.classes:
                if key is not None and key[0] != PREC:
                    total += sum(key[1]) if isinstance(key[1], tuple) else key[1]
        return total * self.k_eval

    def max_duration(self) -> float:
        """The longest duration any single node of any candidate can have (an OP node's whole
        unsplit or phase-split time, or a transfer class's): the big-M of a conditional
        constraint must cover a horizon plus this, since an unchosen candidate's duration may
        exceed the horizon a warm start or a cutoff sets."""
        longest = 0.0
        for row in self.op:
            for w, p in row:
                longest = max(longest, sum(w), sum(p))
        for ec in self.edges:
            for key in ec.classes:
                if key is not None and key[0] != PREC:
                    longest = max(longest, sum(key[1]) if isinstance(key[1], tuple) else key[1])
        return longest

    def max_path_nodes(self) -> int:
        """An upper bound on the number of nodes any path of any lowered graph can hold: every
        OP phase and every possible COMM/RESHARD of every step. Rounding each duration up by less
        than one time unit therefore moves a makespan by less than this many units."""
        per_step = sum(self.n_phases if self.can_split[v] else 1 for v in range(len(self.op)))
        for ec in self.edges:
            per_step += max(
                (len(k[1]) if k is not None and k[0] == COMM and ec.kind == "data" else 1) for k in ec.classes
            )
        return per_step * self.k_eval

    def plan_of(self, picks: list[int]) -> Plan:
        """The plan choosing candidate ``picks[v]`` for every vertex."""
        return Plan(tuple(self.cands[v][c] for v, c in enumerate(picks)))


def build_plan_instance(
    ev: Evaluator, cands: list[list[Choice]], deadline: Deadline | None = None
) -> PlanInstance:
    """Apply the lowering rules to every candidate pair of every edge (see module docstring).

    ``deadline`` is checked as the candidate pairs are visited (their number grows with the
    square of the candidate sets): past it, :class:`~.deadline.BuildTimeout` is raised.

    Every candidate must be legal (P1–P8 and the head rules H1–H2 of its vertex's engine,
    :func:`~rpeg.ir.plan.check_strategy`): candidates from the directories are by construction;
    explicit candidate lists and warm-start plans are checked here, each distinct strategy once.

    Raises
    ------
    ValueError
        If a vertex has no candidate, or a candidate is illegal (the vertex, the strategy and the
        rule are named).
    BuildTimeout
        When ``deadline`` passes.
    """
    g = ev.graph
    n = len(g.vertices)
    if len(cands) != n:
        raise ValueError(f"candidates: {len(cands)} lists for {n} vertices")
    for v, cs in enumerate(cands):
        if not cs:
            raise ValueError(f"candidates: vertex {g.vertices[v].name!r} has none")
        vert = g.vertices[v]
        spec = g.models[vert.model].spec
        seen = set()
        for c in cs:
            s = c.strategy
            if s in seen:
                continue
            seen.add(s)
            why = check_strategy_of(ev.cluster, spec, vert.role, vert.sequences, s)
            if why is None and tuple(c.allocation.extent) != tuple(s.extent):
                why = f"P6: allocation extent {list(c.allocation.extent)} differs from {list(s.extent)}"
            if why is not None:
                raise ValueError(f"candidates: vertex {vert.name!r} candidate {s.label()} is illegal: {why}")
    costs = ev.costs
    quantiles = ev.workload.quantiles
    Q = len(quantiles)
    fracs = phase_fractions(quantiles)
    roles = [v.role for v in g.vertices]
    idx = g.index
    enabled = ev.split_phases

    edges: list[EdgeClasses] = []
    split_edges: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    can_split = [False] * n
    deadline = deadline or Deadline()
    deadline.check("lowering the data edges")
    tick = deadline.ticker("lowering the candidate pairs", every=64)
    for e in g.data_edges:
        u, v = idx[e.src], idx[e.dst]
        ec = EdgeClasses("data", u, v, None)
        nbytes = float(g.edge_bytes(e))
        for cu, a in enumerate(cands[u]):
            for cv, b in enumerate(cands[v]):
                tick()
                phasewise = splits(roles[u], roles[v], a, b, Q, enabled)
                kind, _payloads, durs = data_rule(nbytes, a, b, phasewise, fracs, costs)
                key = (PREC,) if kind == PREC else (COMM, tuple(durs), b.allocation.mask)
                ec.add(key, cu, cv)
        for o, key in enumerate(ec.classes):
            if key[0] == COMM and len(key[1]) > 1:
                split_edges[u].append((len(edges), o))
                split_edges[v].append((len(edges), o))
                can_split[u] = can_split[v] = True
        edges.append(ec)
    deadline.check("lowering the publication edges")
    for e in g.pub_edges:
        u, v = idx[e.src], idx[e.dst]
        ec = EdgeClasses("pub", u, v, e.model)
        wb = float(g.models[e.model].spec.weight_bytes)
        for cu, a in enumerate(cands[u]):
            for cv, b in enumerate(cands[v]):
                tick()
                kind, _nb, dur = pub_rule(wb, e.model, a, b, costs)
                key = (PREC,) if kind == PREC else (kind, dur, b.allocation.mask, b.strategy)
                ec.add(key, cu, cv)
        edges.append(ec)
    for m, inst in g.models.items():
        if not inst.trainable:
            continue
        vs = [i for i, v in enumerate(g.vertices) if v.model == m]
        wb = float(inst.spec.weight_bytes)
        for a_i, b_i in zip(vs, vs[1:]):
            ec = EdgeClasses("pair", a_i, b_i, m)
            for ca, a in enumerate(cands[a_i]):
                for cb, b in enumerate(cands[b_i]):
                    tick()
                    rule = pair_rule(g.staleness[m], wb, m, a, b, costs)
                    key = (
                        None
                        if rule is None
                        else ((PREC,) if rule[0] == PREC else (RESHARD, rule[2], b.allocation.mask))
                    )
                    ec.add(key, ca, cb)
            edges.append(ec)

    deadline.check("costing the candidates")
    op = []
    memory = []
    for v in range(n):
        row = []
        for c in cands[v]:
            whole = costs.op_phases(v, c, False)
            phased = costs.op_phases(v, c, True) if can_split[v] else ()
            row.append((whole, phased))
        op.append(row)
        memory.append([costs.memory(v, c.strategy) for c in cands[v]])
    return PlanInstance(ev, cands, Q, can_split, op, memory, edges, split_edges, ev.cluster.hardware.m_eff)


def candidate_sets(
    ev: Evaluator,
    dirs: list,
    k: int | None,
    include: Plan | None = None,
    everywhere: list[Plan] | tuple[Plan, ...] = (),
) -> list[list[Choice]]:
    """``C(v)``: the strategies of the ``k`` fastest layouts of each directory (all when ``k`` is
    ``None``; a training invocation's layouts in each recomputation mode its directory kept,
    :meth:`~rpeg.scoring.candidates.Directory.fastest_layouts`) at every aligned origin, plus the
    strategies the plans ``everywhere`` use, at every aligned origin too (SA's ``candidates=k``
    restriction, :func:`~rpeg.heuristics.search.anneal.restrict`, keeps the concurrent and greedy
    baselines' strategies so), plus the choices of ``include`` (a warm start) when given. Host
    offload candidates are left out when no plan over the sets could need them to fit
    (:func:`_offload_can_matter`), unless ``everywhere`` or ``include`` uses them."""
    out = []
    for v, d in enumerate(dirs):
        chosen: list[Choice] = []
        seen = set()
        extra = {plan.choices[v].strategy for plan in everywhere}
        fast = set(d.fastest_layouts(k))
        for i, s in enumerate(d.strategies):
            if i in fast or s in extra:
                for c in d.choices(ev.cluster, i):
                    if c not in seen:
                        seen.add(c)
                        chosen.append(c)
        if include is not None and include.choices[v] not in seen:
            chosen.append(include.choices[v])
        out.append(chosen)
    if not _offload_can_matter(ev, out):
        kept = [
            {plan.choices[v] for plan in (*everywhere, *([include] if include else []))}
            for v in range(len(out))
        ]
        out = [[c for c in row if not c.strategy.offload or c in kept[v]] for v, row in enumerate(out)]
    return out


def _offload_can_matter(ev: Evaluator, cands: list[list[Choice]]) -> bool:
    """Whether some plan over ``cands`` could need host offload (SPEC §14.4) to fit: ``False``
    when even every vertex resident on one device fits, ``Σ_v max_c P(v, c) + max_v max_c
    T(v, c) ≤ M_eff`` with ``P`` a trainer's ``12·N_s/Pd`` or a serving copy and ``T`` the
    transient with the weights a serving vertex may materialise, each of an offloading
    candidate taken as its resident twin. That sum bounds every device's peak of every plan
    (a copy shared by vertices of one model is counted once per vertex), so an offloading
    candidate then only adds its transfers: the exact models drop it."""
    costs = ev.costs
    persistent = transient = 0.0
    for v, row in enumerate(cands):
        if not row:
            continue
        trains = ev.graph.vertices[v].role is Role.TRAINING
        mems = [costs.memory(v, costs.resident(c.strategy)) for c in row]
        persistent += max(m.train_state if trains else m.weights for m in mems)
        transient = max(transient, *(m.transient + (0.0 if trains else m.weights) for m in mems))
    return persistent + transient > ev.cluster.hardware.m_eff


def trainer_of(ev: Evaluator) -> dict[str, int]:
    """Training vertex index per trainable model."""
    g = ev.graph
    return {m: g.index[t.name] for m in g.models if (t := g.training_vertex(m)) is not None}


def serving_groups(ev: Evaluator) -> dict[str, list[int]]:
    """Non-training vertices per model."""
    out: dict[str, list[int]] = defaultdict(list)
    for i, v in enumerate(ev.graph.vertices):
        if v.role is not Role.TRAINING:
            out[v.model].append(i)
    return dict(out)


def min_op_seconds(inst: PlanInstance, ticks: Callable[[float], Any] = float) -> list[list[Any]]:
    """``d⁻(v,c) = min(d_whole(v,c), Σ_q d_q(v,c))``: the least time candidate ``c`` keeps
    vertex ``v`` busy in one step, split into phases or not (``d_whole`` alone where ``v`` never
    splits). ``E[v,k] − S[v,k] ≥ Σ_c d⁻(v,c)·x[v,c]`` holds in every solution. ``ticks``
    converts each duration first (CP-SAT's rounding up to its time unit; seconds by default)."""
    return [
        [min(ticks(w[0]), sum(ticks(d) for d in p)) if p else ticks(w[0]) for w, p in row] for row in inst.op
    ]


def cut_constraints(
    inst: PlanInstance,
    x: list[list[Any]],
    S: list[list[Any]],
    E: list[list[Any]],
    z: list[list[Any]],
    ms: Any,
    transfers: list[tuple[int, Any, Any]],
    masks: set[int],
    ticks: Callable[[float], Any] = float,
) -> Iterator[Any]:
    """The redundant constraints of the ``cuts`` block (:data:`PLAN_BLOCKS`), as expressions
    each engine adds to its model (both overload ``>=``), every duration through ``ticks``:

    * ``E[v,k] ≥ S[v,k] + Σ_c d⁻(v,c)·x[v,c]`` per vertex and step (:func:`min_op_seconds`);
    * per edge that always adds a dependency (:func:`edge_delay`), ``S[dst,k] ≥ E[src,k'] + δ``
      (``k' = k − τ − 1`` for a publication), or ``E[dst,k] ≥ E[src,k] + δ`` when phase-wise;
    * per device atom ``a`` of the candidates' and transfers' masks, the energy bound
      ``MS ≥ Σ_{v,c: a ⊆ σ(c)} Keval·d⁻(v,c)·x[v,c] + Σ_{transfers on a} d·present``.

    Parameters
    ----------
    inst
        The instance.
    x, S, E, z
        The engine's choice, start, end and edge-class variables.
    ms
        The makespan variable.
    transfers
        ``(mask, duration, presence)`` of every optional transfer node.
    masks
        Further device masks whose atoms get an energy bound (the engine's resource masks).
    ticks
        Duration conversion (seconds by default).

    Yields
    ------
    Any
        One linear constraint expression at a time.
    """
    g, K = inst.ev.graph, inst.k_eval
    dmin = min_op_seconds(inst, ticks)
    for v in range(len(x)):
        busy = sum(d * x[v][c] for c, d in enumerate(dmin[v]))
        for k in range(K):
            yield E[v][k] >= S[v][k] + busy
    for ei, ec in enumerate(inst.edges):
        link = edge_delay(ec, z[ei], ticks)
        if link is None:
            continue
        phasewise, delay = link
        for k in range(K):
            src_k = k - g.staleness[ec.model] - 1 if ec.kind == "pub" else k
            if src_k < 0:
                continue
            if phasewise:
                yield E[ec.dst][k] >= E[ec.src][k] + delay
            else:
                yield S[ec.dst][k] >= E[ec.src][src_k] + delay
    for a in atoms_of({c.allocation.mask for cs in inst.cands for c in cs} | set(masks)):
        ops = [
            K * d * x[v][c]
            for v in range(len(x))
            for c, d in enumerate(dmin[v])
            if inst.cands[v][c].allocation.mask & a
        ]
        moves = [d * pres for mask, d, pres in transfers if mask & a]
        yield ms >= sum(ops) + sum(moves)


def critical_path_bound(inst: PlanInstance, ticks: Callable[[float], float] = float) -> float:
    """Analytical lower bound on the makespan: for each training vertex ``t``,
    ``LB = max_t head(t) + Keval·d⁻(t)``, with ``head(t)`` the longest data path into ``t`` in
    one step and ``d⁻(v) = min_c d⁻(v,c)`` (:func:`min_op_seconds`; every transfer free, the
    ``Keval`` updates of ``t`` chained). ``ticks`` converts each duration first (CP-SAT's
    rounding up to its time unit; seconds by default)."""
    g = inst.ev.graph
    fastest = [
        min(ticks(w[0]) if not p else min(ticks(w[0]), sum(ticks(d) for d in p)) for w, p in inst.op[v])
        for v in range(len(g.vertices))
    ]
    head = [0.0] * len(g.vertices)  # longest path ending before v starts
    for e in sorted(g.data_edges, key=lambda e: g.index[e.dst]):
        u, v = g.index[e.src], g.index[e.dst]
        head[v] = max(head[v], head[u] + fastest[u])
    bound = 0.0
    for t, vert in enumerate(g.vertices):
        if vert.role is Role.TRAINING:
            bound = max(bound, head[t] + inst.k_eval * fastest[t])
    return bound


@dataclass(frozen=True)
class BlockSwap:
    """The device permutation that swaps the aligned blocks ``[i, i+b)`` and ``[i+b, i+2b)``."""

    i: int
    b: int

    def map_mask(self, mask: int) -> int:
        """``mask`` with the two blocks' bits exchanged (shifts of the blocks' bit fields)."""
        field_ = (1 << self.b) - 1
        lo = mask >> self.i & field_
        hi = mask >> (self.i + self.b) & field_
        rest = mask & ~(((1 << (2 * self.b)) - 1) << self.i)
        return rest | lo << (self.i + self.b) | hi << self.i

    def perm(self, n_devices: int) -> list[int]:
        """The permutation as a list: ``perm[d]`` is the device ``d`` goes to."""
        out = list(range(n_devices))
        for j in range(self.b):
            out[self.i + j], out[self.i + self.b + j] = self.i + self.b + j, self.i + j
        return out


def _block_swaps(n_devices: int) -> list[BlockSwap]:
    """Device permutations that swap two adjacent aligned blocks of ``b`` devices
    (``b = 1, 2, 4, …``): ``[i, i+b) ↔ [i+b, i+2b)`` for ``i`` a multiple of ``2b``."""
    out = []
    b = 1
    while 2 * b <= n_devices:
        out += [BlockSwap(i, b) for i in range(0, n_devices - 2 * b + 1, 2 * b)]
        b *= 2
    return out


def _map_key(key: object, swap: BlockSwap) -> object:
    """A class key with its device mask (index 2 of COMM, RESHARD and publication keys) mapped."""
    if key is None or key[0] == PREC:
        return key
    return (*key[:2], swap.map_mask(key[2]), *key[3:])


@dataclass
class _Lookups:
    """What :func:`_certify` looks up for every permutation, built once per instance: each
    vertex's candidate index by ``(strategy, mask)``, each edge's class by candidate pair."""

    where: list[dict[tuple, int]]
    class_of: list[dict[tuple[int, int], int]]

    @classmethod
    def of(cls, inst: PlanInstance) -> _Lookups:
        return cls(
            [{(c.strategy, c.allocation.mask): i for i, c in enumerate(cs)} for cs in inst.cands],
            [{p: o for o, pairs in enumerate(ec.pairs) for p in pairs} for ec in inst.edges],
        )


def _certify(inst: PlanInstance, swap: BlockSwap, lookups: _Lookups | None = None) -> list[list[int]] | None:
    """The candidate permutation ``π_v`` per vertex that the device permutation ``swap`` induces,
    if it is an automorphism of the instance's data: every candidate has an image with the same
    strategy, the mapped mask, the same OP durations and memory, and every edge maps each class
    onto the class with the mapped key (same durations, mapped mask); ``None`` otherwise."""
    lookups = lookups or _Lookups.of(inst)
    images = []
    for v, cs in enumerate(inst.cands):
        where = lookups.where[v]
        pi = []
        for i, c in enumerate(cs):
            j = where.get((c.strategy, swap.map_mask(c.allocation.mask)))
            if j is None or inst.op[v][j] != inst.op[v][i] or inst.memory[v][j] != inst.memory[v][i]:
                return None
            pi.append(j)
        images.append(pi)
    for ec, class_of in zip(inst.edges, lookups.class_of):
        pu, pv = images[ec.src], images[ec.dst]
        for o, pairs in enumerate(ec.pairs):
            want = _map_key(ec.classes[o], swap)
            for cu, cv in pairs:
                if ec.classes[class_of[(pu[cu], pv[cv])]] != want:
                    return None
    return images


def _root(parent: list[int], i: int) -> int:
    """Union-find root of ``i`` (with path halving)."""
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def symmetry_fixing(
    inst: PlanInstance, keep: Plan | None = None, deadline: Deadline | None = None
) -> tuple[int, list[int]] | None:
    """Symmetry breaking among identical devices: the candidates of one vertex that may be ruled
    out without losing an optimum.

    A device permutation ``σ`` (candidates: swaps of adjacent aligned blocks of 1, 2, 4, …
    devices, :func:`_block_swaps`) is *certified* when it maps the instance onto itself
    (:func:`_certify`: each candidate onto one with the same strategy, the mapped mask, the same
    durations and memory; each edge's classes onto the classes with mapped masks). Every element
    ``g`` of the group ``G`` the certified permutations generate then maps each solution onto
    one with the same makespan, so each orbit of ``G`` on the candidates of one vertex ``v₀``
    needs only one member: ``x[v₀,c] = 0`` for the others keeps an optimum. ``v₀`` is the vertex
    whose orbits rule out the most candidates; each orbit keeps its lowest index, or ``keep``'s
    choice of ``v₀`` when it is in the orbit (so a warm-start plan stays feasible).

    The permutations are tried until ``deadline`` passes: the group the ones certified by then
    generate is a subgroup of ``G``, whose orbits are unions of fewer candidates, so fixing them
    keeps an optimum too (it rules out fewer). On 1,024 devices the 1,023 swaps take about a
    second to certify (:data:`SYMMETRY_SHARE`).

    Returns
    -------
    tuple[int, list[int]] or None
        ``(v₀, the candidate indices of v₀ ruled out)``, or ``None`` when no permutation is
        certified or no candidate would be ruled out.
    """
    lookups = _Lookups.of(inst)
    maps = []
    for swap in _block_swaps(inst.ev.cluster.num_devices):
        if deadline is not None and deadline.expired():
            break
        if m := _certify(inst, swap, lookups):
            maps.append(m)
    if not maps:
        return None
    best: tuple[int, list[int]] | None = None
    for v, cs in enumerate(inst.cands):
        parent = list(range(len(cs)))
        for images in maps:
            for i, j in enumerate(images[v]):
                a, b = _root(parent, i), _root(parent, j)
                if a != b:
                    parent[max(a, b)] = min(a, b)
        orbit = [_root(parent, i) for i in range(len(cs))]
        kept = {orbit[i]: i for i in reversed(range(len(cs)))}  # the lowest index per orbit
        if keep is not None and keep.choices[v] in cs:
            k = cs.index(keep.choices[v])
            kept[orbit[k]] = k
        out = [i for i in range(len(cs)) if kept[orbit[i]] != i]
        if out and (best is None or len(out) > len(best[1])):
            best = (v, out)
    return best


def edge_delay(ec: EdgeClasses, z: list, ticks: Callable[[float], Any] = float) -> tuple[bool, Any] | None:
    """The delay an edge imposes whatever class is active, as a linear expression in its class
    variables ``z``: ``(False, Σ_o d(o)·z[o])`` with ``S[dst,k] ≥ E[src,k'] + delay`` (``d`` = 0 for
    a precedence, the transfer's duration otherwise) when no class is phase-wise, or
    ``(True, Σ_o d_Q(o)·z[o])`` with ``E[dst,k] ≥ E[src,k] + delay`` (``d_Q`` the last phase's
    transfer) when one is; ``None`` when some pair of candidates adds no dependency at all.
    ``ticks`` converts each duration first (CP-SAT's rounding; seconds by default).

    Every class implies the delay: a precedence ``S[dst] ≥ E[src]``; a COMM, RESHARD or
    publication node of duration ``d`` between them ``S[dst] ≥ E[src] + d``; ``Q`` phase-wise
    COMMs ``E[dst] = PE[dst,Q] ≥ PS[dst,Q] ≥ start_Q + d_Q ≥ PE[src,Q] + d_Q = E[src] + d_Q``
    (and ``E[dst] ≥ S[dst]`` for the others on such an edge)."""
    if any(key is None for key in ec.classes):
        return None
    phasewise = any(ec.kind == "data" and key[0] == COMM and len(key[1]) > 1 for key in ec.classes)
    terms = []
    for o, key in enumerate(ec.classes):
        if key[0] == PREC:
            continue
        d = key[1][-1] if isinstance(key[1], tuple) else key[1]
        terms.append(ticks(d) * z[o])
    return phasewise, sum(terms)


def horizon_bound(inst: PlanInstance, hint: Plan | None, cutoff: float | None) -> tuple[float | None, bool]:
    """The upper bound a model's horizon takes: the smaller of :func:`hint_makespan` and the
    caller's ``cutoff`` (a makespan already achieved elsewhere: no plan here needs to be longer),
    and whether the cutoff is the one that binds (``None`` when neither is known)."""
    ub = hint_makespan(inst, hint)
    if cutoff is not None and math.isfinite(cutoff) and (ub is None or cutoff < ub):
        return cutoff, True
    return ub, False


def hint_makespan(inst: PlanInstance, hint: Plan | None) -> float | None:
    """The evaluator's makespan of ``hint`` (a plan whose choices are in the candidate sets) when
    it is memory-feasible, else ``None``: an upper bound on the models' optimum, because the list
    schedule of the hint is one schedule of the lowered graph the models schedule."""
    if hint is None:
        return None
    r = inst.ev.evaluate(hint)
    return r.makespan if r.feasible and math.isfinite(r.makespan) else None

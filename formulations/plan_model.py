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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..ir.lower import COMM, PREC, RESHARD, data_rule, pair_rule, phase_fractions, pub_rule, splits
from ..ir.plan import Choice, Plan, check_strategy
from ..ir.types import Role
from ..scoring.costs import VertexMemory
from ..scoring.evaluator import Evaluator
from .deadline import Deadline
from .status import Status

__all__ = ["PLAN_BLOCKS", "EdgeClasses", "PlanInstance", "PlanModel", "PlanSolution", "build_plan_instance"]

#: The constraint blocks of the plan-selection models, in the order both engines add them (the
#: later blocks use what the earlier ones created: ``operations`` needs ``split``, exclusivity
#: needs every interval of ``operations`` and ``transfers``):
#:
#: ``choice``
#:     ``x[v,c]``, ``Σ_c x[v,c] = 1``: one candidate per vertex;
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
#:     per atom, persistent state plus the running vertex's need within ``M_eff``.
#:
#: The objective comes after them: ``min MS`` with ``MS ≥ E[v,k]``.
PLAN_BLOCKS: tuple[str, ...] = (
    "choice",
    "edges",
    "split",
    "operations",
    "transfers",
    "chains",
    "exclusivity",
    "memory",
)


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

    def __init__(self, inst: PlanInstance, deadline: Deadline | None) -> None:
        self.inst = inst
        self.deadline = deadline or Deadline()
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
            why = check_strategy(
                ev.cluster, spec, vert.role, vert.sequences, s.extent, s.dp, s.pp, s.tp, s.mb
            )
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
    ev: Evaluator, dirs: list, k: int | None, include: Plan | None = None
) -> list[list[Choice]]:
    """``C(v)``: the strategies of the ``k`` fastest layouts of each directory (all when ``k`` is
    ``None``; a training invocation's layouts in each recomputation mode its directory kept,
    :meth:`~rpeg.scoring.candidates.Directory.fastest_layouts`) at every aligned origin, plus the
    choices of ``include`` (a warm start) when given."""
    out = []
    for v, d in enumerate(dirs):
        chosen: list[Choice] = []
        seen = set()
        for i in d.fastest_layouts(k):
            for c in d.choices(ev.cluster, i):
                if c not in seen:
                    seen.add(c)
                    chosen.append(c)
        if include is not None and include.choices[v] not in seen:
            chosen.append(include.choices[v])
        out.append(chosen)
    return out


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

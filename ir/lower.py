"""Lowering an unrolled RPEG under a plan into the executable DAG ``Ĝ`` (SPEC §5).

Rules, in the order SPEC §5 gives them:

1. One OP node per vertex instance. A generation vertex with a downstream inference vertex on a
   *disjoint* allocation is split into ``Q`` chained phase nodes (phase ``q`` decodes steps
   ``t_{q−1}..t_q`` for the sequences still running; phase 1 also prefills); each such inference
   vertex into ``Q`` chained nodes (phase ``q`` handles the fraction ``f_q − f_{q−1}`` of the
   sequences); generation phase ``q`` feeds inference phase ``q`` through a COMM whose payload is
   scaled by ``f_q − f_{q−1}``. Overlapping placements are not split.
2. Data edges: same allocation → precedence edge; different allocation → COMM node (payload
   ``#a·s(a)``) reserving the destination allocation.
3. Consecutive vertices of one trainable model inside a step (vertex order): a shadow pair
   (``τ(m) > 0`` and disjoint allocations) needs nothing; same allocation and layout, nothing;
   same allocation, other layout, a RESHARD (``N_m·sb``); otherwise a precedence edge.
4. Publication edges: same allocation and layout → precedence; same allocation, other
   layout → RESHARD; different allocation → COMM of ``N_m·sb·(n_max − n_overlap)/n_max``.
   (A layout is a strategy's shape, degrees and microbatches; its recomputation mode moves no
   weights and does not count.)
   A dependency that already installs the same version on the same allocation and layout is
   reused instead of creating another node.

Durations come from a cost provider passed in by the caller (:class:`rpeg.scoring.costs.Costs`
prices them with the cost model; ``ir`` stays free of it). :func:`lower` applies the rules per
compact vertex and edge, then emits the nodes step by step in a topological order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from .plan import Choice, Plan
from .types import NodeKind, Role
from .unroll import EdgeKind, Unrolled

__all__ = [
    "COMM",
    "OP",
    "PREC",
    "RESHARD",
    "CostProvider",
    "ExecGraph",
    "Rules",
    "apply_rules",
    "data_rule",
    "emit",
    "lower",
    "pair_rule",
    "phase_fractions",
    "pub_rule",
    "splits",
]

OP, COMM, RESHARD = 0, 1, 2
PREC = -1  # a rule's outcome that is a plain precedence edge, no node
_KINDS = (NodeKind.OP, NodeKind.COMM, NodeKind.RESHARD)


class CostProvider(Protocol):
    """Durations of lowered nodes (implemented by :class:`rpeg.scoring.costs.Costs`)."""

    def op_phases(self, vertex: int, choice: Choice, split: bool) -> tuple[float, ...]:
        """Durations of the vertex's OP node (one) or of its ``Q`` phase nodes when ``split``."""
        ...

    def comm(self, nbytes: float, src: Choice, dst: Choice) -> float:
        """Duration of a COMM moving ``nbytes`` from ``src``'s to ``dst``'s allocation."""
        ...

    def reshard(self, model: str, dst: Choice) -> float:
        """Duration of re-laying-out ``model``'s weights on ``dst``'s allocation."""
        ...


@dataclass
class ExecGraph:
    """The executable DAG as parallel lists indexed by node id (ids are a topological order).

    Attributes
    ----------
    kind
        ``OP``, ``COMM`` or ``RESHARD`` (ints; :meth:`kind_of` gives the enum).
    vertex
        Compact vertex index the node belongs to (the consumer for COMM/RESHARD).
    source
        Producing vertex index of a COMM/RESHARD, ``-1`` for OP nodes.
    step, phase
        RL step; response-length phase (0 when unsplit, else ``1..Q``).
    mask
        Device mask the node reserves.
    nbytes
        Payload of COMM/RESHARD nodes (0 for OP).
    duration
        Seconds, from the cost provider.
    preds
        Predecessor ids per node.
    first_phase
        For a phase node, the id of phase 1 of the same vertex instance (else itself).
    """

    kind: list[int] = field(default_factory=list)
    vertex: list[int] = field(default_factory=list)
    source: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)
    phase: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    nbytes: list[float] = field(default_factory=list)
    duration: list[float] = field(default_factory=list)
    preds: list[list[int]] = field(default_factory=list)
    first_phase: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.kind)

    def kind_of(self, i: int) -> NodeKind:
        """The :class:`NodeKind` of node ``i``."""
        return _KINDS[self.kind[i]]

    def add(
        self,
        kind: int,
        vertex: int,
        source: int,
        step: int,
        phase: int,
        mask: int,
        nbytes: float,
        duration: float,
        preds: list[int],
    ) -> int:
        """Append a node and return its id."""
        i = len(self.kind)
        self.kind.append(kind)
        self.vertex.append(vertex)
        self.source.append(source)
        self.step.append(step)
        self.phase.append(phase)
        self.mask.append(mask)
        self.nbytes.append(nbytes)
        self.duration.append(duration)
        self.preds.append(preds)
        self.first_phase.append(i)
        return i


def _incoming(unrolled: Unrolled) -> list[list[list]]:
    """Unrolled edges grouped by destination instance: ``inc[k][v] = [edge, ...]`` (cached)."""
    cache = unrolled.__dict__.get("_incoming")
    if cache is None:
        n = len(unrolled.graph.vertices)
        cache = [[[] for _ in range(n)] for _ in range(unrolled.k_eval)]
        for e in unrolled.edges:
            cache[e.dst_step][e.dst].append(e)
        unrolled.__dict__["_incoming"] = cache
    return cache


def _static(unrolled: Unrolled) -> tuple:
    """Plan-independent facts of the graph, cached on the unrolled object."""
    cache = unrolled.__dict__.get("_static")
    if cache is None:
        g = unrolled.graph
        idx = g.index
        data_bytes = [float(g.edge_bytes(e)) for e in g.data_edges]
        data_ends = [(idx[e.src], idx[e.dst]) for e in g.data_edges]
        pub_model = [e.model for e in g.pub_edges]
        weight_bytes = {m: float(inst.spec.weight_bytes) for m, inst in g.models.items()}
        roles = [v.role for v in g.vertices]
        # consecutive same-model pairs inside a step, trainable models only (rule 3)
        pairs: list[tuple[int, int, str]] = []
        for m, inst in g.models.items():
            if inst.trainable:
                vs = [i for i, v in enumerate(g.vertices) if v.model == m]
                pairs.extend((a, b, m) for a, b in zip(vs, vs[1:]))
        pairs_into: list[list[tuple[int, str]]] = [[] for _ in g.vertices]
        for a, b, m in pairs:
            pairs_into[b].append((a, m))
        cache = (data_bytes, data_ends, pub_model, weight_bytes, roles, pairs_into)
        unrolled.__dict__["_static"] = cache
    return cache


def lower(
    unrolled: Unrolled,
    plan: Plan,
    quantiles: tuple[tuple[float, int], ...],
    costs: CostProvider,
    *,
    split_phases: bool = True,
) -> ExecGraph:
    """Lower ``unrolled`` under ``plan`` into an :class:`ExecGraph` with durations.

    Parameters
    ----------
    unrolled
        The unrolled RPEG (:func:`~rpeg.ir.unroll.unroll`).
    plan
        One choice per compact vertex.
    quantiles
        Response-length quantiles ``((f1, t1), …, (fQ, tQ))``; ``Q`` phases per split vertex.
    costs
        Duration provider.
    split_phases
        Apply rule 1's response-length splitting (``False`` is the ablation that never splits).

    Returns
    -------
    ExecGraph
        Nodes in topological order (steps ascending, then vertex order; a vertex instance's
        incoming COMM/RESHARD nodes just before its OP nodes).
    """
    n = len(unrolled.graph.vertices)
    if len(plan) != n:
        raise ValueError(f"plan has {len(plan)} choices but the graph has {n} vertices")
    rules = apply_rules(unrolled, plan, quantiles, costs, split_phases)
    return emit(unrolled, plan, rules, len(quantiles))


@dataclass(frozen=True, slots=True)
class Rules:
    """What rules 1–4 decide for one plan, per compact vertex or edge (before unrolling).

    ``split[v]``: rule 1 splits ``v`` into phases; ``op_durs[v]``: its OP node(s)' seconds;
    ``data_plan[j]``, ``pub_plan[j]``: (kind, payload(s), duration(s)) of data / publication edge
    ``j``; ``pair_plan[b]``: ``(a, kind, bytes, seconds)`` of each rule-3 pair ending at ``b``.
    """

    split: list[bool]
    op_durs: list[tuple[float, ...]]
    data_plan: list[tuple]
    pub_plan: list[tuple]
    pair_plan: list[list[tuple[int, int, float, float]]]


def apply_rules(
    unrolled: Unrolled,
    plan: Plan,
    quantiles: tuple[tuple[float, int], ...],
    costs: CostProvider,
    split_phases: bool,
) -> Rules:
    """Rules 1–4 (module docstring) applied to every compact vertex and edge under ``plan``.

    The first half of :func:`lower`: what each compact vertex and edge becomes, with its
    durations, before anything is unrolled. :func:`emit` turns the result into nodes.

    Parameters
    ----------
    unrolled, plan, quantiles, costs, split_phases
        As for :func:`lower`.

    Returns
    -------
    Rules
        Per vertex its split flag and OP seconds; per data / publication edge and rule-3 pair
        its outcome (``PREC``, ``COMM`` or ``RESHARD``), payload(s) and seconds.
    """
    g = unrolled.graph
    n = len(g.vertices)
    data_bytes, data_ends, pub_model, weight_bytes, roles, pairs_into = _static(unrolled)
    choices = plan.choices
    Q = len(quantiles)
    fracs = phase_fractions(quantiles)

    # -- rule 1: which vertices split into phases
    split = [False] * n
    for u, v in data_ends:
        if splits(roles[u], roles[v], choices[u], choices[v], Q, split_phases):
            split[u] = split[v] = True
    op_durs = [costs.op_phases(v, choices[v], split[v]) for v in range(n)]

    # -- rule 2: data edges (per compact edge: kind, payload per node, duration per node)
    data_plan = [
        data_rule(
            data_bytes[j],
            choices[u],
            choices[v],
            splits(roles[u], roles[v], choices[u], choices[v], Q, split_phases),
            fracs,
            costs,
        )
        for j, (u, v) in enumerate(data_ends)
    ]

    # -- rule 4: publication edges (per compact edge: kind, bytes, duration)
    pub_plan = [
        pub_rule(weight_bytes[m], m, choices[g.index[e.src]], choices[g.index[e.dst]], costs)
        for e, m in zip(g.pub_edges, pub_model)
    ]

    # -- rule 3: consecutive same-model pairs (per destination vertex)
    pair_plan: list[list[tuple[int, int, float, float]]] = [[] for _ in range(n)]
    for b in range(n):
        for a, m in pairs_into[b]:
            rule = pair_rule(g.staleness[m], weight_bytes[m], m, choices[a], choices[b], costs)
            if rule is not None:
                pair_plan[b].append((a, *rule))
    return Rules(split, op_durs, data_plan, pub_plan, pair_plan)


def emit(unrolled: Unrolled, plan: Plan, rules: Rules, Q: int) -> ExecGraph:
    """The nodes of every vertex instance, step by step in vertex order (a topological order):
    first the COMM/RESHARD nodes its incoming edges need, then its OP node or ``Q`` phase nodes.

    The second half of :func:`lower`. Which nodes and edges it creates depends on ``rules``
    only through their outcomes (kinds, split flags) and on ``plan`` only through which
    publication destinations share an allocation and a strategy (one install serves them); the
    durations and payloads are copied from ``rules`` as they are, so a caller may pass other
    numbers in their place (:mod:`rpeg.scoring.fast` passes slot indices to build a template).

    Parameters
    ----------
    unrolled, plan
        As for :func:`lower`.
    rules
        :func:`apply_rules` of ``plan``.
    Q
        Number of response-length phases.
    """
    n = len(unrolled.graph.vertices)
    pub_model = _static(unrolled)[2]
    inc = _incoming(unrolled)
    masks = [c.allocation.mask for c in plan.choices]
    strategies = [c.strategy for c in plan.choices]
    split, op_durs, data_plan, pub_plan = rules.split, rules.op_durs, rules.data_plan, rules.pub_plan
    pair_plan = rules.pair_plan

    out = ExecGraph()
    first = [0] * (n * unrolled.k_eval)
    last = [0] * (n * unrolled.k_eval)
    installed: dict[tuple, int] = {}
    for k in range(unrolled.k_eval):
        base = k * n
        for v in range(n):
            head_preds: list[int] = []
            phase_preds: list[list[int]] = [[] for _ in range(Q)] if split[v] else []
            mv = masks[v]
            for e in inc[k][v]:
                src_last = last[e.src_step * n + e.src]
                if e.kind is EdgeKind.DATA:
                    kind, payloads, durs = data_plan[e.ref]
                    if kind == PREC:
                        _add(head_preds, src_last)
                    elif len(durs) > 1:  # phase-wise: generation phase q → COMM(q) → inference phase q
                        gfirst = first[e.src_step * n + e.src]
                        for q in range(Q):
                            c = out.add(COMM, v, e.src, k, q + 1, mv, payloads[q], durs[q], [gfirst + q])
                            phase_preds[q].append(c)
                    else:
                        c = out.add(COMM, v, e.src, k, 0, mv, payloads[0], durs[0], [src_last])
                        head_preds.append(c)
                elif e.kind is EdgeKind.PUB:
                    kind, nbytes, dur = pub_plan[e.ref]
                    if kind == PREC:
                        _add(head_preds, src_last)
                        continue
                    key = (pub_model[e.ref], e.src_step, mv, strategies[v])
                    c = installed.get(key)
                    if c is None:
                        c = out.add(kind, v, e.src, k, 0, mv, nbytes, dur, [src_last])
                        installed[key] = c
                    _add(head_preds, c)
                else:  # chain
                    _add(head_preds, src_last)
            for a, kind, nbytes, dur in pair_plan[v]:
                a_last = last[base + a]
                if kind == PREC:
                    _add(head_preds, a_last)
                else:
                    head_preds.append(out.add(kind, v, a, k, 0, mv, nbytes, dur, [a_last]))
            durs = op_durs[v]
            if split[v]:
                p0 = head_preds + phase_preds[0]
                f = out.add(OP, v, -1, k, 1, mv, 0.0, durs[0], p0)
                prev_id = f
                for q in range(1, Q):
                    prev_id = out.add(OP, v, -1, k, q + 1, mv, 0.0, durs[q], [prev_id, *phase_preds[q]])
                    out.first_phase[prev_id] = f
                first[base + v], last[base + v] = f, prev_id
            else:
                f = out.add(OP, v, -1, k, 0, mv, 0.0, durs[0], head_preds)
                first[base + v] = last[base + v] = f
    return out


def _add(preds: list[int], p: int) -> None:
    if p not in preds:
        preds.append(p)


# ---------------------------------------------------------------------------- the rules
# Each rule decides one compact edge's lowering from the two choices it joins. ``lower`` applies
# them per plan; the exact models apply them to every pair of candidates, so both mean the same.


def phase_fractions(quantiles: tuple[tuple[float, int], ...]) -> list[float]:
    """``f_q − f_{q−1}`` per response-length phase."""
    out = []
    prev = 0.0
    for f, _t in quantiles:
        out.append(f - prev)
        prev = f
    return out


def splits(role_u: Role, role_v: Role, cu: Choice, cv: Choice, n_phases: int, enabled: bool = True) -> bool:
    """Rule 1: a generation feeding an inference on a disjoint allocation splits both into phases."""
    return (
        enabled
        and n_phases > 1
        and role_u is Role.GENERATION
        and role_v is Role.INFERENCE
        and cu.allocation.mask & cv.allocation.mask == 0
    )


def data_rule(
    nbytes: float, cu: Choice, cv: Choice, phasewise: bool, fracs: list[float], costs: CostProvider
) -> tuple[int, list[float], list[float]]:
    """Rule 2 (and rule 1's phase-wise COMMs) for a data edge ``u → v``.

    Returns ``(kind, payloads, durations)``: ``PREC`` with empty lists on the same allocation;
    otherwise ``COMM`` with one node of ``#a·s(a)`` bytes, or, when ``phasewise``, ``Q`` nodes
    carrying ``(f_q − f_{q−1})·#a·s(a)`` each.
    """
    if cu.allocation.mask == cv.allocation.mask:
        return PREC, [], []
    if phasewise:
        payloads = [nbytes * fr for fr in fracs]
        return COMM, payloads, [costs.comm(b, cu, cv) for b in payloads]
    return COMM, [nbytes], [costs.comm(nbytes, cu, cv)]


def pair_rule(
    tau: int, weight_bytes: float, model: str, ca: Choice, cb: Choice, costs: CostProvider
) -> tuple[int, float, float] | None:
    """Rule 3 for consecutive vertices ``a, b`` of a trainable model inside a step.

    ``None`` for a shadow pair (``τ > 0``, disjoint) or the same allocation and layout
    (:meth:`~rpeg.ir.plan.Strategy.same_layout`: the recomputation mode does not count);
    ``(RESHARD, N_m·sb, T)`` for the same allocation with another strategy; else ``(PREC, 0, 0)``.
    """
    ma, mb = ca.allocation.mask, cb.allocation.mask
    if ma & mb == 0 and tau > 0:
        return None
    if ma == mb:
        if ca.strategy.same_layout(cb.strategy):  # recomputation moves no weights
            return None
        return RESHARD, weight_bytes, costs.reshard(model, cb)
    return PREC, 0.0, 0.0


def pub_rule(
    weight_bytes: float, model: str, cu: Choice, cv: Choice, costs: CostProvider
) -> tuple[int, float, float]:
    """Rule 4 for a publication ``u → v``: ``(kind, bytes, duration)``.

    Same allocation and layout (:meth:`~rpeg.ir.plan.Strategy.same_layout`) → ``PREC``; same
    allocation, other layout → ``RESHARD`` of
    ``N_m·sb``; otherwise ``COMM`` of ``N_m·sb·(n_max − n_overlap)/n_max``.
    """
    mu, mv = cu.allocation.mask, cv.allocation.mask
    if mu == mv:
        if cu.strategy.same_layout(cv.strategy):
            return PREC, 0.0, 0.0
        return RESHARD, weight_bytes, costs.reshard(model, cv)
    n_max = max(cu.allocation.size, cv.allocation.size)
    nbytes = weight_bytes * (n_max - (mu & mv).bit_count()) / n_max
    return COMM, nbytes, costs.comm(nbytes, cu, cv)

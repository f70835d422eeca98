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
   (``τ(m) > 0`` and disjoint allocations) needs nothing; same allocation and strategy, nothing;
   same allocation, other strategy, a RESHARD (``N_m·sb``); otherwise a precedence edge.
4. Publication edges: same allocation and strategy → precedence; same allocation, other
   strategy → RESHARD; different allocation → COMM of ``N_m·sb·(n_max − n_overlap)/n_max``.
   A dependency that already installs the same version on the same allocation and layout is
   reused instead of creating another node.

Durations come from a cost provider passed in by the caller (``heuristics`` owns the cost
model; ``ir`` stays free of it). Nodes are emitted in a topological order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from .plan import Choice, Plan
from .types import NodeKind, Role
from .unroll import EdgeKind, Unrolled

__all__ = ["COMM", "OP", "RESHARD", "CostProvider", "ExecGraph", "lower"]

OP, COMM, RESHARD = 0, 1, 2
_KINDS = (NodeKind.OP, NodeKind.COMM, NodeKind.RESHARD)


class CostProvider(Protocol):
    """Durations of lowered nodes (implemented by :class:`rpeg.heuristics.costs.Costs`)."""

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
    g = unrolled.graph
    V = g.vertices
    n = len(V)
    if len(plan) != n:
        raise ValueError(f"plan has {len(plan)} choices but the graph has {n} vertices")
    data_bytes, data_ends, pub_model, weight_bytes, roles, pairs_into = _static(unrolled)
    inc = _incoming(unrolled)
    choices = plan.choices
    masks = [c.allocation.mask for c in choices]
    strategies = [c.strategy for c in choices]
    Q = len(quantiles)
    fracs = []
    prev = 0.0
    for f, _t in quantiles:
        fracs.append(f - prev)
        prev = f

    # -- rule 1: which vertices split into phases
    split = [False] * n
    for u, v in data_ends:
        if (
            roles[u] is Role.GENERATION
            and roles[v] is Role.INFERENCE
            and masks[u] & masks[v] == 0
            and Q > 1
            and split_phases
        ):
            split[u] = split[v] = True
    op_durs = [costs.op_phases(v, choices[v], split[v]) for v in range(n)]

    # -- rule 2: data edges (per compact edge: None = precedence, else COMM durations per phase)
    data_plan: list[tuple[bool, list[float] | None]] = []
    for j, (u, v) in enumerate(data_ends):
        phasewise = split[u] and split[v] and roles[u] is Role.GENERATION and masks[u] & masks[v] == 0
        if masks[u] == masks[v]:
            data_plan.append((False, None))
        elif phasewise:
            data_plan.append((True, [costs.comm(data_bytes[j] * fr, choices[u], choices[v]) for fr in fracs]))
        else:
            data_plan.append((False, [costs.comm(data_bytes[j], choices[u], choices[v])]))

    # -- rule 4: publication edges (per compact edge: kind, bytes, duration)
    pub_plan: list[tuple[int, float, float]] = []
    for e, m in zip(g.pub_edges, pub_model):
        u, v = g.index[e.src], g.index[e.dst]
        if masks[u] == masks[v]:
            if strategies[u] == strategies[v]:
                pub_plan.append((-1, 0.0, 0.0))
            else:
                pub_plan.append((RESHARD, weight_bytes[m], costs.reshard(m, choices[v])))
        else:
            su, sv = choices[u].allocation.size, choices[v].allocation.size
            n_max = max(su, sv)
            overlap = (masks[u] & masks[v]).bit_count()
            nbytes = weight_bytes[m] * (n_max - overlap) / n_max
            pub_plan.append((COMM, nbytes, costs.comm(nbytes, choices[u], choices[v])))

    # -- rule 3: consecutive same-model pairs (per destination vertex)
    pair_plan: list[list[tuple[int, int, float, float]]] = [[] for _ in range(n)]
    for b in range(n):
        for a, m in pairs_into[b]:
            if masks[a] & masks[b] == 0 and g.staleness[m] > 0:
                continue  # shadow pair
            if masks[a] == masks[b]:
                if strategies[a] == strategies[b]:
                    continue
                pair_plan[b].append((a, RESHARD, weight_bytes[m], costs.reshard(m, choices[b])))
            else:
                pair_plan[b].append((a, -1, 0.0, 0.0))

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
                    phasewise, durs = data_plan[e.ref]
                    if durs is None:
                        _add(head_preds, src_last)
                    elif phasewise:
                        gfirst = first[e.src_step * n + e.src]
                        for q in range(Q):
                            c = out.add(
                                COMM,
                                v,
                                e.src,
                                k,
                                q + 1,
                                mv,
                                data_bytes[e.ref] * fracs[q],
                                durs[q],
                                [gfirst + q],
                            )
                            phase_preds[q].append(c)
                    else:
                        c = out.add(COMM, v, e.src, k, 0, mv, data_bytes[e.ref], durs[0], [src_last])
                        head_preds.append(c)
                elif e.kind is EdgeKind.PUB:
                    kind, nbytes, dur = pub_plan[e.ref]
                    if kind < 0:
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
                if kind < 0:
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

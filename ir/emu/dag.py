"""Plan diffs and the global transition DAG (SPEC §10, Nereus §6).

:func:`plan_diff` pairs the current and target EMU collections per model-stage and
:func:`transition_dag` compiles the difference into the global transition DAG:

1. **Local DAG** per model-stage, in the order Split → Destroy → Extend → Merge through the
   largest common layout ``T_sub = (gcd(tp, tp*), gcd(pp, pp*))`` (the whole pipeline, ``pp = 1``,
   when the two sides interleave their stages differently: :func:`~.units.sub_layout`). Units are aligned contiguous
   device ranges, so the ``|T_sub|``-blocks of the current and target units either coincide or are
   disjoint: a sub-unit on a target block is kept, the others are destroyed, the missing target
   blocks are filled by Extend (a binomial broadcast tree: each copy can serve as a source once it
   exists), and Merge assembles each target unit. When no sub-unit is kept, one *anchor* sub-unit
   (preferably one on GPUs no other model-stage wants) is destroyed only after the Extends it
   feeds, so a copy of the state exists at every prefix of the DAG.
2. **Global DAG**: the union of the local DAGs plus *resource edges*. A GPU's owners may change
   only from the current owners to the target owners: an Extend of ``M`` onto GPU ``g`` waits for
   the Destroy that releases ``g`` from every model-stage that holds ``g`` now and not in the
   target. Such an edge is added only if the Destroy does not itself depend on the blocked
   Extend; otherwise the target is infeasible (:class:`TransitionInfeasible` names the blocked and
   the blocking model-stages and the GPUs). Extends are processed in stage order Gen → Inf → Train.

Scheduling (release-before-acquire, per-GPU exclusivity and memory) is left to
:mod:`rpeg.heuristics.transition` and the exact models; costs to :mod:`rpeg.costmodel.transition`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..cluster import Cluster
from ..graph import RPEG
from ..plan import Plan
from .flat import DESTROY, EXTEND, MERGE, SPLIT, FlatDAG, flat_dag, flat_dag_of_plans, ready, warm_up
from .primitives import Destroy, Extend, Merge, Primitive, Split
from .units import EMU, ModelStage, _sorted_mask, _trusted, emus_of, sub_layout

__all__ = [
    "StageDiff",
    "TransitionDAG",
    "TransitionInfeasible",
    "plan_diff",
    "transition_dag",
    "transition_dag_of_plans",
    "transition_dag_reference",
]


class TransitionInfeasible(ValueError):
    """No transition DAG (or schedule) reaches the target.

    Attributes
    ----------
    stage
        The blocked model-stage (as text).
    blocking
        The model-stage holding what it needs (as text; empty when memory blocks).
    gpus
        The GPUs concerned.
    """

    def __init__(
        self, message: str, *, stage: str = "", blocking: str = "", gpus: Sequence[int] = ()
    ) -> None:
        super().__init__(message)
        self.stage = stage
        self.blocking = blocking
        self.gpus = tuple(gpus)


@dataclass(frozen=True)
class StageDiff:
    """``Δ_M = (E_M → E*_M)`` of one model-stage.

    Attributes
    ----------
    stage
        ``M``.
    current, target
        Its units before and after, sorted by first GPU.
    """

    stage: ModelStage
    current: tuple[EMU, ...]
    target: tuple[EMU, ...]

    @property
    def t_sub(self) -> tuple[int, int, int]:
        """The largest layout both sides split into, ``(tp, pp, vp)``: ``(gcd(tp, tp*),
        gcd(pp, pp*), vp)`` when both sides interleave alike, else the whole pipeline
        (:func:`~rpeg.ir.emu.units.sub_layout`)."""
        return sub_layout(self.current[0], self.target[0])

    @property
    def dp(self) -> tuple[int, int]:
        """DP degree before and after."""
        return (len(self.current), len(self.target))

    @property
    def unchanged(self) -> bool:
        """Whether the model-stage keeps exactly its units (same layout and GPU sets; the units of
        one side share a layout and are disjoint, as :func:`plan_diff` checks)."""
        a, b = self.current, self.target
        if len(a) != len(b) or not a:
            return len(a) == len(b)
        if (a[0].tp, a[0].pp, a[0].vp) != (b[0].tp, b[0].pp, b[0].vp):
            return False
        return {u.mask for u in a} == {u.mask for u in b}

    @property
    def released(self) -> frozenset[int]:
        """GPUs it holds now and not in the target."""
        return frozenset(g for u in self.current for g in u.gpus) - frozenset(
            g for u in self.target for g in u.gpus
        )

    @property
    def acquired(self) -> frozenset[int]:
        """GPUs it holds in the target and not now."""
        return frozenset(g for u in self.target for g in u.gpus) - frozenset(
            g for u in self.current for g in u.gpus
        )


def _check_collection(units: Sequence[EMU], name: str) -> dict[ModelStage, list[EMU]]:
    by: dict[ModelStage, list[EMU]] = {}
    # the units of a model-stage usually share one ModelStage object: hash each object once
    # (a dataclass hash is a Python call), the list of its model-stage found by identity after
    by_object: dict[int, list[EMU]] = {}
    for u in units:
        us = by_object.get(id(u.stage))
        if us is None:
            us = by_object[id(u.stage)] = by.setdefault(u.stage, [])
        us.append(u)
    for ms, us in by.items():
        if len({(u.tp, u.pp, u.vp) for u in us}) != 1:
            layouts = sorted({(u.tp, u.pp, u.vp) for u in us})
            raise ValueError(f"{name}: model-stage {ms} mixes layouts (tp, pp, vp) {layouts}")
        if len({(u.param_bytes, u.optim_bytes) for u in us}) != 1:
            raise ValueError(f"{name}: model-stage {ms} has units of different state sizes")
        seen = 0
        for u in us:
            if seen & u.mask:
                raise ValueError(
                    f"{name}: units of model-stage {ms} share GPUs {sorted(set(u.gpus) & _bits(seen))}"
                )
            seen |= u.mask
    return by


def _bits(mask: int) -> set[int]:
    """The positions of the set bits of ``mask`` (one step per set bit, not per bit position)."""
    out = set()
    while mask:
        low = mask & -mask
        out.add(low.bit_length() - 1)
        mask ^= low
    return out


def plan_diff(current: Sequence[EMU], target: Sequence[EMU]) -> dict[ModelStage, StageDiff]:
    """Pair two EMU collections per model-stage, in stage order Gen → Inf → Train.

    Raises
    ------
    ValueError
        If a model-stage is on one side only, mixes layouts, has units of different state sizes
        or units sharing GPUs, or changes its state size.
    """
    cur = _check_collection(current, "current")
    tgt = _check_collection(target, "target")
    if set(cur) != set(tgt):
        only = sorted(str(m) for m in set(cur) ^ set(tgt))
        raise ValueError(
            f"current and target plans must have the same model-stages; only on one side: {only}"
        )
    out = {}
    for ms in sorted(cur, key=lambda m: m.sort_key):
        a = tuple(sorted(cur[ms], key=lambda u: min(u.gpus)))
        b = tuple(sorted(tgt[ms], key=lambda u: min(u.gpus)))
        if a[0].state_bytes != b[0].state_bytes:
            raise ValueError(
                f"model-stage {ms} changes its state size ({a[0].state_bytes} → {b[0].state_bytes} bytes)"
            )
        out[ms] = StageDiff(ms, a, b)
    return out


@dataclass(frozen=True)
class TransitionDAG:
    """The global transition DAG (module docstring).

    Attributes
    ----------
    primitives
        The primitives; edges and schedules refer to them by index.
    edges
        State edges ``(i, j)``: ``j`` needs a unit ``i`` creates, or ``i`` must copy a unit before
        ``j`` consumes it (the local DAGs).
    resource_edges
        ``(destroy, extend)`` pairs added because the Extend needs GPUs the Destroy releases.
    current, target
        The collections before and after (units carry their ``uid``).
    diffs
        Per model-stage difference.
    flat
        The same DAG as index tables when :func:`transition_dag` built it (``None`` otherwise):
        the cost model and the greedy scheduler read these, and the fields above are made from
        them on first access (:meth:`~rpeg.ir.emu.flat.FlatDAG.objects`).
    """

    primitives: tuple[Primitive, ...]
    edges: tuple[tuple[int, int], ...]
    resource_edges: tuple[tuple[int, int], ...]
    current: tuple[EMU, ...]
    target: tuple[EMU, ...]
    diffs: dict[ModelStage, StageDiff]
    flat: FlatDAG | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_flat(cls, flat: FlatDAG) -> TransitionDAG:
        """The DAG of ``flat``, its object fields made on first access."""
        dag = object.__new__(cls)
        dag.__dict__["flat"] = flat
        return dag

    def __getattr__(self, name: str) -> object:
        # only reached for a field not made yet (a DAG from from_flat): make them all at once
        flat = self.__dict__.get("flat")
        if flat is None or name not in _LAZY_FIELDS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        fields = flat.objects()
        fields["diffs"] = {ms: StageDiff(ms, a, b) for ms, (a, b) in fields["diffs"].items()}  # type: ignore[attr-defined]
        self.__dict__.update(fields)
        return fields[name]

    def __len__(self) -> int:
        return len(self.primitives) if self.flat is None else self.flat.n_prims

    @property
    def all_edges(self) -> tuple[tuple[int, int], ...]:
        """State and resource edges."""
        return self.edges + self.resource_edges

    @cached_property
    def successors(self) -> tuple[tuple[int, ...], ...]:
        """Per primitive, the heads of its state edges, then of its resource edges."""
        out: list[list[int]] = [[] for _ in self.primitives]
        for i, j in self.all_edges:
            out[i].append(j)
        return tuple(map(tuple, out))

    @cached_property
    def predecessors(self) -> tuple[tuple[int, ...], ...]:
        """Per primitive, the tails of its state edges, then of its resource edges."""
        out: list[list[int]] = [[] for _ in self.primitives]
        for i, j in self.all_edges:
            out[j].append(i)
        return tuple(map(tuple, out))

    @cached_property
    def topological_order(self) -> tuple[int, ...]:
        """Kahn's order, smallest index first (``0, 1, …, n−1`` when every edge points to a
        higher index, as every state edge does).

        Raises
        ------
        ValueError
            If the edges contain a cycle.
        """
        n = len(self.primitives)
        if all(i < j for i, j in self.resource_edges) and all(i < j for i, j in self.edges):
            return tuple(range(n))  # Kahn's smallest-index-first rule then takes 0, 1, 2, … in turn
        indeg = [len(p) for p in self.predecessors]
        heap = [i for i in range(n) if indeg[i] == 0]
        heapq.heapify(heap)
        order = []
        while heap:
            i = heapq.heappop(heap)
            order.append(i)
            for j in self.successors[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    heapq.heappush(heap, j)
        if len(order) != n:
            raise ValueError(
                f"transition DAG has a cycle through primitive {min(i for i in range(n) if indeg[i])}"
            )
        return tuple(order)

    @property
    def is_acyclic(self) -> bool:
        try:
            _ = self.topological_order
        except ValueError:
            return False
        return True

    @cached_property
    def units(self) -> dict[int, EMU]:
        """Every unit that exists at some point, by ``uid``."""
        out = {u.uid: u for u in self.current}
        for p in self.primitives:
            for u in p.outputs:
                out[u.uid] = u
        return out

    @cached_property
    def creator(self) -> dict[int, int]:
        """``uid`` → index of the primitive that creates it (absent for current units)."""
        return {u.uid: i for i, p in enumerate(self.primitives) for u in p.outputs}

    @cached_property
    def consumer(self) -> dict[int, int]:
        """``uid`` → index of the primitive that removes it (absent for target units)."""
        return {u.uid: i for i, p in enumerate(self.primitives) for u in p.consumed}

    def count(self, kind: str) -> int:
        """Number of primitives of ``kind``."""
        if self.flat is not None:
            return int(np.count_nonzero(self.flat.p_kind == _FLAT_KIND[kind])) if kind in _FLAT_KIND else 0
        return sum(p.kind == kind for p in self.primitives)

    def apply(self, order: Sequence[int] | None = None) -> list[EMU]:
        """Execute the primitives one at a time in ``order`` (default: topological) on the current
        collection and return the resulting collection.

        Raises
        ------
        ValueError
            If a primitive's inputs are missing, an output already exists, a Destroy would drop
            the last copy of a model-stage's state, or ``order`` breaks an edge or repeats a
            primitive.
        """
        order = list(self.topological_order if order is None else order)
        if sorted(order) != list(range(len(self.primitives))):
            raise ValueError("order must list every primitive exactly once")
        pos = {p: k for k, p in enumerate(order)}
        for i, j in self.all_edges:
            if pos[i] > pos[j]:
                raise ValueError(f"order runs primitive {j} before its predecessor {i}")
        alive = {u.uid: u for u in self.current}
        per_stage: dict[ModelStage, int] = {}
        for u in self.current:
            per_stage[u.stage] = per_stage.get(u.stage, 0) + 1
        for i in order:
            p = self.primitives[i]
            for u in p.inputs:
                if u.uid not in alive:
                    raise ValueError(f"primitive {i} ({p.label()}) needs unit {u.uid}, which does not exist")
            if isinstance(p, Destroy) and per_stage[p.stage] <= 1:
                raise ValueError(f"primitive {i} destroys the last copy of {p.stage}")
            for u in p.consumed:
                del alive[u.uid]
                per_stage[u.stage] -= 1
            for u in p.outputs:
                if u.uid in alive:
                    raise ValueError(f"primitive {i} creates unit {u.uid} twice")
                alive[u.uid] = u
                per_stage[u.stage] = per_stage.get(u.stage, 0) + 1
        return list(alive.values())


_LAZY_FIELDS = frozenset({"primitives", "edges", "resource_edges", "current", "target", "diffs"})
_FLAT_KIND = {"split": SPLIT, "merge": MERGE, "extend": EXTEND, "destroy": DESTROY}


def transition_dag(current: Sequence[EMU], target: Sequence[EMU]) -> TransitionDAG:
    """Compile ``E(S) → E(S*)`` into the global transition DAG (module docstring).

    The steps run on index tables in a compiled core (:func:`~rpeg.ir.emu.flat.flat_dag`); the
    result equals :func:`transition_dag_reference`'s, whose objects it makes on first access.
    When the collections do not pair up or the DAG is infeasible the reference raises. Until the
    core is loaded in this process (:func:`~rpeg.ir.emu.flat.ready`) the first call starts
    loading it in the background (:func:`~rpeg.ir.emu.flat.warm_up`) and the reference builds
    the DAG (equal, without tables), so no call waits for the compiler.

    Parameters
    ----------
    current, target
        EMU collections (e.g. from :func:`emus_of`); ``uid`` values are reassigned.

    Returns
    -------
    TransitionDAG
        Acyclic; executing it (:meth:`TransitionDAG.apply`) yields ``target`` up to ``uid`` and
        the rank order inside a unit.

    Raises
    ------
    TransitionInfeasible
        When an Extend needs GPUs that another model-stage releases only after (transitively) that
        Extend: the message names both model-stages and the GPUs.
    ValueError
        When the collections do not pair up (:func:`plan_diff`).
    """
    if not ready():
        warm_up()  # once per process, in the background; meanwhile the reference builds
        return transition_dag_reference(current, target)
    flat = flat_dag(current, target)
    if flat is None:
        return transition_dag_reference(current, target)
    return TransitionDAG.from_flat(flat)


def transition_dag_of_plans(
    current: Plan,
    target: Plan,
    cluster: Cluster,
    *,
    graph: RPEG | None = None,
    workload: object | None = None,
) -> TransitionDAG:
    """:func:`transition_dag` of the EMU collections of two plans of one graph,
    ``transition_dag(emus_of(current), emus_of(target))``, read per vertex.

    With the compiled core loaded the tables are built from the plans' vertices
    (:func:`~rpeg.ir.emu.flat.flat_dag_of_plans`): no unit object is made until one is read, so
    planning a transition costs the same at 1,024 GPUs whether a vertex has 4 replicas or 512.
    Otherwise (core still loading, or an infeasible DAG whose error the reference words) it is
    :func:`transition_dag` on :func:`~rpeg.ir.emu.emus_of`. The result is equal either way.

    Parameters
    ----------
    current, target
        Plans of the same graph.
    cluster
        The device space (every device must exist).
    graph, workload
        The RPEG the plans are for, or a workload whose synchronous graph it is (one of them).

    Returns
    -------
    TransitionDAG

    Raises
    ------
    ValueError
        As :func:`~rpeg.ir.emu.emus_of` and :func:`transition_dag`.
    TransitionInfeasible
        As :func:`transition_dag`.
    """
    if graph is None and workload is not None:
        from ..templates import build_graph

        graph = build_graph(workload)  # type: ignore[arg-type]
    elif (graph is None) == (workload is None):
        raise ValueError("transition_dag_of_plans needs exactly one of graph= or workload=")
    if ready():
        flat = flat_dag_of_plans(current, target, cluster, graph=graph)
        if flat is not None:
            return TransitionDAG.from_flat(flat)
    return transition_dag(emus_of(current, cluster, graph=graph), emus_of(target, cluster, graph=graph))


def transition_dag_reference(current: Sequence[EMU], target: Sequence[EMU]) -> TransitionDAG:
    """:func:`transition_dag` in pure Python on :class:`EMU` and :class:`Primitive` objects (the
    reference the compiled core is tested against; same parameters, result and errors)."""
    diffs = plan_diff(current, target)
    b = _Builder(diffs)
    return b.build()


class _Builder:
    """Builds local DAGs, then the resource edges (kept out of the public API).

    Edges are kept as successor lists: a primitive's predecessors all exist when it is added, so
    every state edge points to a higher index, each list grows in index order and a repeated edge
    is always the list's last entry.
    """

    def __init__(self, diffs: dict[ModelStage, StageDiff]) -> None:
        self.diffs = diffs
        self.prims: list[Primitive] = []
        self.succ: list[list[int]] = []
        self.has_preds: list[bool] = []
        self.next_uid = 0
        self.current: list[EMU] = []
        self.final: list[EMU] = []
        # GPU owners now and in the target: mask per model-stage
        self.cur_mask = {ms: _union(d.current) for ms, d in diffs.items()}
        self.tgt_mask = {ms: _union(d.target) for ms, d in diffs.items()}
        # GPUs someone acquires: a Destroy there may unblock an Extend, so anchors avoid them
        self.wanted = {ms: 0 for ms in diffs}
        for ms in diffs:
            acq = self.tgt_mask[ms] & ~self.cur_mask[ms]
            for other in diffs:
                if other != ms:
                    self.wanted[other] |= acq
        self.destroy_of: list[tuple[EMU, int, ModelStage]] = []  # (unit, prim index, stage)
        self.extends: list[tuple[int, ModelStage]] = []

    def uid(self) -> int:
        self.next_uid += 1
        return self.next_uid - 1

    def add(self, p: Primitive, preds: Iterable[int | None] = ()) -> int:
        i = len(self.prims)
        self.prims.append(p)
        self.succ.append([])
        self.has_preds.append(False)
        for q in preds:
            if q is not None:
                s = self.succ[q]
                if not s or s[-1] != i:
                    s.append(i)
                    self.has_preds[i] = True
        return i

    def build(self) -> TransitionDAG:
        for d in self.diffs.values():
            for u in d.current:
                uid = self.uid()
                self.current.append(u if u.uid == uid else u.with_uid(uid))
        k = 0
        for d in self.diffs.values():
            n = len(d.current)
            self._local(d, self.current[k : k + n])
            k += n
        edges = tuple((i, j) for i, js in enumerate(self.succ) for j in js)  # sorted, as promised
        resource = self._resource_edges()
        dag = TransitionDAG(
            tuple(self.prims),
            edges,
            tuple(sorted(resource)),
            tuple(self.current),
            tuple(self.final),
            self.diffs,
        )
        _ = dag.topological_order  # validates acyclicity (cannot fail by construction)
        return dag

    def _local(self, d: StageDiff, current: list[EMU]) -> None:
        """Split → Destroy → Extend → Merge for one model-stage (module docstring, step 1).

        The primitives are consistent by construction (parts tile their source or result, an
        Extend's blocks are disjoint from its source), so they are built past their validation.
        """
        if d.unchanged:
            self.final.extend(current)
            return
        stp, spp, svp = d.t_sub
        s = stp * spp
        # 1. Split every current unit down to T_sub; sub-units keyed by their block's mask
        subs: dict[int, tuple[EMU, int | None]] = {}
        for u in current:
            if u.tp == stp and u.pp == spp:  # (then u.vp == svp: sub_layout)
                subs[u.mask] = (u, None)
                continue
            parts = tuple(
                u.sub_unit(stp, spp, u.gpus[j * s : (j + 1) * s], self.uid(), svp) for j in range(u.size // s)
            )
            i = self.add(_trusted_primitive(Split, source=u, parts=parts))
            for p in parts:
                subs[p.mask] = (p, i)
        # target blocks, per target unit in rank order: (mask, its |T_sub| GPUs in ascending order);
        # a unit of one block is its own block, its GPUs sorted only if it is missing
        blocks: list[list[tuple[int, tuple[int, ...] | EMU]]] = []
        for t in d.target:
            if t.size == s:
                blocks.append([(t.mask, t)])
                continue
            gs = sorted(t.gpus)
            bls = [tuple(gs[j * s : (j + 1) * s]) for j in range(t.size // s)]
            blocks.append([(_sorted_mask(bl), bl) for bl in bls])
        block_masks = {m for ms in blocks for m, _ in ms}
        kept = {m: v for m, v in subs.items() if m in block_masks}
        spare = [v for m, v in subs.items() if m not in block_masks]
        missing = [(m, bl) for ms in blocks for m, bl in ms if m not in kept]
        anchor: tuple[EMU, int | None] | None = None
        if not kept and missing:
            # the state survives on one spare sub-unit until an Extend copied it; prefer one on
            # GPUs nobody else acquires, so its late Destroy blocks no other model-stage
            wanted = self.wanted[d.stage]
            anchor = min(spare, key=lambda v: ((v[0].mask & wanted).bit_count(), min(v[0].gpus)))
        # 2. Destroy the redundant sub-units (release before acquire)
        for u, c in spare:
            if anchor is not None and u is anchor[0]:
                continue
            i = self.add(_trusted_primitive(Destroy, unit=u), (c,))
            self.destroy_of.append((u, i, d.stage))
        # 3. Extend onto the missing blocks: a binomial broadcast from the kept sub-units. Round
        # r uses every copy that exists after round r − 1 once, by (first GPU, uid): each source
        # serves again next round, next to the copy it made
        feeds: dict[int, list[int]] = {}  # uid → Extends reading it
        at: dict[int, tuple[EMU, int | None]] = dict(kept)
        now = sorted((min(v[0].gpus), v[0].uid, v) for v in (list(kept.values()) or [anchor]))  # type: ignore[list-item]
        after: list[tuple[int, int, tuple[EMU, int | None]]] = []
        k = 0
        for m, bl in missing:
            if k == len(now):
                now, after, k = sorted(after), [], 0
            first, _, (src, c) = now[k]
            k += 1
            if isinstance(bl, EMU):
                bl = tuple(sorted(bl.gpus))
            new = _trusted(src.stage, stp, spp, bl, src.param_bytes, src.optim_bytes, self.uid(), m, svp)
            i = self.add(_trusted_primitive(Extend, source=src, result=new), (c,))
            feeds.setdefault(src.uid, []).append(i)
            self.extends.append((i, d.stage))
            at[m] = (new, i)
            after.append((first, src.uid, (src, c)))
            after.append((bl[0], new.uid, (new, i)))
        if anchor is not None:
            u, c = anchor
            i = self.add(_trusted_primitive(Destroy, unit=u), [c, *feeds.get(u.uid, [])])
            self.destroy_of.append((u, i, d.stage))
        # 4. Merge the sub-units of each target unit
        for t, ms in zip(d.target, blocks):
            if len(ms) == 1:
                self.final.append(at[ms[0][0]][0])
                continue
            parts = [at[m] for m, _ in ms]
            result = t.with_uid(self.uid())
            preds = [c for _, c in parts] + [e for u, _ in parts for e in feeds.get(u.uid, [])]
            self.add(_trusted_primitive(Merge, parts=tuple(u for u, _ in parts), result=result), preds)
            self.final.append(result)

    def _resource_edges(self) -> set[tuple[int, int]]:
        """Step 2: Destroy → Extend where the Extend acquires GPUs a leaving owner releases (or,
        within one model-stage, GPUs a destroyed unit of its own still occupies)."""
        leaving = {ms: self.cur_mask[ms] & ~self.tgt_mask[ms] for ms in self.diffs}
        by_gpu: dict[int, list[int]] = {}
        destroyed = 0
        for k, (u, _, _) in enumerate(self.destroy_of):
            destroyed |= u.mask
            for g in u.gpus:
                by_gpu.setdefault(g, []).append(k)
        out: set[tuple[int, int]] = set()
        extra: dict[int, list[int]] = {}  # resource edges added so far, for the reachability test
        has_preds = self.has_preds
        # self.extends is in (stage order, index) order: the diffs come sorted, indices only grow
        for e, ms in self.extends:
            result = self.prims[e].outputs[0]
            dest = result.mask
            if not dest & destroyed:
                continue
            for k in sorted({k for g in result.gpus for k in by_gpu.get(g, ())}):
                u, dsi, other = self.destroy_of[k]
                blocks = u.mask & dest if other == ms else u.mask & dest & leaving[other]
                if not blocks or (dsi, e) in out:
                    continue
                if has_preds[dsi] and _reaches(self.succ, extra, e, dsi):
                    gpus = sorted(_bits(blocks))
                    raise TransitionInfeasible(
                        f"transition infeasible: Extend of {ms} onto GPUs {gpus} needs GPUs that {other} "
                        f"releases only after that Extend (both model-stages wait for each other; a free "
                        f"GPU or a cheaper target is needed)",
                        stage=str(ms),
                        blocking=str(other),
                        gpus=gpus,
                    )
                out.add((dsi, e))
                extra.setdefault(dsi, []).append(e)
                has_preds[e] = True
        return out


def _union(units: Iterable[EMU]) -> int:
    """Bit mask of every GPU of ``units``."""
    m = 0
    for u in units:
        m |= u.mask
    return m


def _trusted_primitive(cls: type[Primitive], **fields: object) -> Primitive:
    """A primitive built by the DAG builder, whose parts are consistent by construction: the
    fields go straight into the instance dictionary, past ``__post_init__``."""
    p = object.__new__(cls)
    p.__dict__.update(fields)
    return p


def _reaches(succ: Sequence[Sequence[int]], extra: dict[int, list[int]], src: int, dst: int) -> bool:
    """Whether ``dst`` is reachable from ``src`` over ``succ`` plus ``extra`` (iterative DFS)."""
    stack, seen = [src], {src}
    while stack:
        i = stack.pop()
        if i == dst:
            return True
        for j in (*succ[i], *extra.get(i, ())):
            if j not in seen:
                seen.add(j)
                stack.append(j)
    return False

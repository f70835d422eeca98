"""The evaluator's compiled core: lowering and list scheduling compiled by numba.

:func:`~rpeg.ir.lower.lower` followed by :func:`~rpeg.scoring.scheduler.list_schedule` is the
reference; this module computes the same graph and the same schedule (same nodes and edges, same
starts, finishes, blockers, makespan and per-atom busy time, float for float) in a fraction of the
time:

* **Rules in Python, nodes in numba.** :func:`~rpeg.ir.lower.apply_rules` decides, per compact
  vertex and edge, what it becomes (its cost lookups are cached dictionaries, cheap in Python).
  Its outcomes are packed into two flat arrays of a fixed layout (:meth:`FastLowering.pack`) and
  :func:`emit_kernel` unrolls them into nodes exactly as :func:`~rpeg.ir.lower.emit` does: step
  by step in vertex order, each instance's COMM/RESHARD nodes before its OP node or phase nodes,
  one install per publication destination sharing an allocation and a strategy.
* **A compiled list scheduler.** :func:`schedule_kernel` is SPEC §7's list scheduler as
  :func:`~rpeg.scoring.scheduler.list_schedule` implements it (EST-first, the same tie-breaks,
  the same device atoms and lazy heap), over flat arrays. The tie-break
  ``(kind is OP, −rank, vertex, step, id)`` is folded into one integer priority per node by a
  merge sort, so the heap compares ``(EST, priority)``.

Every float comes from the same operations in the same order as in the reference, so the
results are identical, not merely close (``tests/scoring/test_fast.py`` checks graphs, schedules,
scores and peaks on thousands of random plans). Every node of a vertex reserves that vertex's
allocation (OP nodes their own, COMM and RESHARD nodes their destination's), so a node's device
atoms are its vertex's.

numba compiles the kernels once (several seconds) and caches the machine code next to this file
(``__pycache__``) or, where that is read-only, in its per-user cache; later processes load it in
a fraction of a second. :func:`warm_up` does either in a background thread, started by the first
evaluation of a process that could use the kernels; until it is done the
:class:`~rpeg.scoring.evaluator.Evaluator` takes the reference path (same results), so a search
on a time limit never waits for the compiler. Nor does a process that ends first: a compile
still running at exit is finished by a detached process (:class:`~rpeg.ir.warmup.WarmUp`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from ..ir.lower import COMM, PREC, ExecGraph, Rules, apply_rules
from ..ir.plan import Plan
from ..ir.types import Role
from ..ir.unroll import EdgeKind, Unrolled
from ..ir.warmup import WarmUp, quiet_llvmlite_wrapper
from .costs import Costs
from .scheduler import atoms_of

quiet_llvmlite_wrapper()  # numba loads llvmlite: keep vLLM's module scan working

__all__ = [
    "FastLowering",
    "FastSchedule",
    "emit_kernel",
    "memory_kernel",
    "ready",
    "schedule_kernel",
    "warm_up",
]

_DATA, _PUB, _CHAIN = 0, 1, 2  # incoming-edge kinds in the packed static structure
_NONE = -2  # a rule-3 pair that needs nothing (shadow pair, or same allocation and layout)


# ---------------------------------------------------------------------------- lowering
@njit(cache=True)
def _add_unique(buf, size, p):  # pragma: no cover - compiled
    # the reference's ``_add``: append p unless it is already there
    for k in range(size):
        if buf[k] == p:
            return size
    buf[size] = p
    return size + 1


@njit(cache=True)
def emit_kernel(
    dims, inc_ptr, inc_kind, inc_ref, inc_src, inc_src_step, ints, secs
):  # pragma: no cover - compiled; tested against ir.lower.emit in tests/scoring/test_fast.py
    """The nodes and edges :func:`~rpeg.ir.lower.emit` creates, from packed rule outcomes.

    Parameters
    ----------
    dims
        ``(n, K, Q, data edges, publication edges, node capacity, edge capacity, most edges
        into one instance)``: compact vertices, unrolled steps, response-length phases, and
        bounds from the static structure.
    inc_ptr, inc_kind, inc_ref, inc_src, inc_src_step
        The unrolled edges into each instance ``k·n + v`` (CSR, in the reference's order): kind
        (0 data, 1 publication, 2 chain), compact edge index, source vertex, source step.
    ints
        Packed outcomes (:meth:`FastLowering.pack`): ``split[v]``; per data edge ``−1`` (PREC)
        or its COMM count (1 or ``Q``); per publication its kind (``−1`` PREC) and install
        group (the first publication of the same model onto the same allocation and
        strategy); per vertex ``b`` its rule-3 pair's kind (``−2`` none) and source ``a``.
    secs
        Packed seconds: OP phases ``v·Q + q``, then data COMMs ``j·Q + q``, publications, pairs.

    Returns
    -------
    tuple
        ``(kind, vertex, source, step, phase, first_phase, duration, pred_src, pred_dst,
        nodes, edges)``: per node its fields as in :class:`~rpeg.ir.lower.ExecGraph`; the
        precedence edges ``pred_src[e] → pred_dst[e]`` in the order the reference lists each
        node's predecessors, nodes in increasing id.
    """
    n, K, Q, n_data, n_pub, max_nodes, max_preds, max_inc = dims
    kind = np.empty(max_nodes, dtype=np.int64)
    vertex = np.empty(max_nodes, dtype=np.int64)
    source = np.empty(max_nodes, dtype=np.int64)
    step = np.empty(max_nodes, dtype=np.int64)
    phase = np.empty(max_nodes, dtype=np.int64)
    first_phase = np.empty(max_nodes, dtype=np.int64)
    dur = np.empty(max_nodes)
    psrc = np.empty(max_preds, dtype=np.int64)
    pdst = np.empty(max_preds, dtype=np.int64)
    first = np.zeros(n * K, dtype=np.int64)
    last = np.zeros(n * K, dtype=np.int64)
    installed = np.full(max(n_pub, 1) * K, -1, dtype=np.int64)
    head = np.empty(max_inc + 2, dtype=np.int64)
    phase_buf = np.empty((Q, max_inc + 1), dtype=np.int64)
    phase_len = np.zeros(Q, dtype=np.int64)
    o_data = n
    o_pub = o_data + n_data
    o_pair = o_pub + 2 * n_pub
    s_data = n * Q
    s_pub = s_data + n_data * Q
    s_pair = s_pub + n_pub
    nn = 0
    ne = 0
    for k in range(K):
        base = k * n
        for v in range(n):
            hl = 0
            for q in range(Q):
                phase_len[q] = 0
            for x in range(inc_ptr[base + v], inc_ptr[base + v + 1]):
                ek = inc_kind[x]
                j = inc_ref[x]
                src = inc_src[x]
                sstep = inc_src_step[x]
                src_last = last[sstep * n + src]
                if ek == _DATA:
                    count = ints[o_data + j]
                    if count < 0:
                        hl = _add_unique(head, hl, src_last)
                    elif count > 1:  # phase-wise: generation phase q → COMM(q) → inference phase q
                        gfirst = first[sstep * n + src]
                        for q in range(Q):
                            kind[nn], vertex[nn], source[nn], step[nn], phase[nn] = COMM, v, src, k, q + 1
                            first_phase[nn] = nn
                            dur[nn] = secs[s_data + j * Q + q]
                            psrc[ne], pdst[ne] = gfirst + q, nn
                            ne += 1
                            phase_buf[q, phase_len[q]] = nn
                            phase_len[q] += 1
                            nn += 1
                    else:
                        kind[nn], vertex[nn], source[nn], step[nn], phase[nn] = COMM, v, src, k, 0
                        first_phase[nn] = nn
                        dur[nn] = secs[s_data + j * Q]
                        psrc[ne], pdst[ne] = src_last, nn
                        ne += 1
                        head[hl] = nn
                        hl += 1
                        nn += 1
                elif ek == _PUB:
                    pk = ints[o_pub + 2 * j]
                    if pk < 0:
                        hl = _add_unique(head, hl, src_last)
                        continue
                    slot = ints[o_pub + 2 * j + 1] * K + sstep
                    c = installed[slot]
                    if c < 0:
                        c = nn
                        kind[nn], vertex[nn], source[nn], step[nn], phase[nn] = pk, v, src, k, 0
                        first_phase[nn] = nn
                        dur[nn] = secs[s_pub + j]
                        psrc[ne], pdst[ne] = src_last, nn
                        ne += 1
                        nn += 1
                        installed[slot] = c
                    hl = _add_unique(head, hl, c)
                else:
                    hl = _add_unique(head, hl, src_last)
            pk = ints[o_pair + 2 * v]
            if pk != _NONE:
                a = ints[o_pair + 2 * v + 1]
                a_last = last[base + a]
                if pk < 0:
                    hl = _add_unique(head, hl, a_last)
                else:
                    kind[nn], vertex[nn], source[nn], step[nn], phase[nn] = pk, v, a, k, 0
                    first_phase[nn] = nn
                    dur[nn] = secs[s_pair + v]
                    psrc[ne], pdst[ne] = a_last, nn
                    ne += 1
                    head[hl] = nn
                    hl += 1
                    nn += 1
            if ints[v] != 0:  # split into Q phase nodes
                f = nn
                kind[nn], vertex[nn], source[nn], step[nn], phase[nn] = 0, v, -1, k, 1
                first_phase[nn] = nn
                dur[nn] = secs[v * Q]
                for x in range(hl):
                    psrc[ne], pdst[ne] = head[x], nn
                    ne += 1
                for x in range(phase_len[0]):
                    psrc[ne], pdst[ne] = phase_buf[0, x], nn
                    ne += 1
                nn += 1
                prev = f
                for q in range(1, Q):
                    kind[nn], vertex[nn], source[nn], step[nn], phase[nn] = 0, v, -1, k, q + 1
                    first_phase[nn] = f
                    dur[nn] = secs[v * Q + q]
                    psrc[ne], pdst[ne] = prev, nn
                    ne += 1
                    for x in range(phase_len[q]):
                        psrc[ne], pdst[ne] = phase_buf[q, x], nn
                        ne += 1
                    prev = nn
                    nn += 1
                first[base + v] = f
                last[base + v] = prev
            else:
                kind[nn], vertex[nn], source[nn], step[nn], phase[nn] = 0, v, -1, k, 0
                first_phase[nn] = nn
                dur[nn] = secs[v * Q]
                for x in range(hl):
                    psrc[ne], pdst[ne] = head[x], nn
                    ne += 1
                first[base + v] = nn
                last[base + v] = nn
                nn += 1
    return kind, vertex, source, step, phase, first_phase, dur, psrc, pdst, nn, ne


@njit(cache=True)
def _successors(nn, ne, psrc, pdst):  # pragma: no cover - compiled
    # CSR of successors by a stable counting sort on the source: each node's successors in
    # increasing id, as the reference builds them from the predecessor lists
    ptr = np.zeros(nn + 1, dtype=np.int64)
    indeg = np.zeros(nn, dtype=np.int64)
    for e in range(ne):
        ptr[psrc[e] + 1] += 1
        indeg[pdst[e]] += 1
    for i in range(nn):
        ptr[i + 1] += ptr[i]
    fill = ptr[:nn].copy()
    idx = np.empty(ne, dtype=np.int64)
    for e in range(ne):
        s = psrc[e]
        idx[fill[s]] = pdst[e]
        fill[s] += 1
    return ptr, idx, indeg


# ---------------------------------------------------------------------------- the kernel
@njit(cache=True)
def _push(hk, hn, size, est, node, prio):  # pragma: no cover - compiled
    # heap of (EST, priority): the priority folds the rest of the reference's key
    i = size
    while i > 0:
        p = (i - 1) >> 1
        if est < hk[p] or (est == hk[p] and prio[node] < prio[hn[p]]):
            hk[i] = hk[p]
            hn[i] = hn[p]
            i = p
        else:
            break
    hk[i] = est
    hn[i] = node
    return size + 1


@njit(cache=True)
def _pop(hk, hn, size, prio):  # pragma: no cover - compiled
    size -= 1
    est = hk[size]
    node = hn[size]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and (hk[c + 1] < hk[c] or (hk[c + 1] == hk[c] and prio[hn[c + 1]] < prio[hn[c]])):
            c += 1
        if hk[c] < est or (hk[c] == est and prio[hn[c]] < prio[node]):
            hk[i] = hk[c]
            hn[i] = hn[c]
            i = c
        else:
            break
    hk[i] = est
    hn[i] = node
    return size


@njit(cache=True)
def _first(a, b, is_op, rank, vertex, step):  # pragma: no cover - compiled
    # a before b in the order (kind is OP, −rank, vertex, step, id)
    if is_op[a] != is_op[b]:
        return is_op[a] < is_op[b]
    if rank[a] != rank[b]:
        return rank[a] > rank[b]
    if vertex[a] != vertex[b]:
        return vertex[a] < vertex[b]
    if step[a] != step[b]:
        return step[a] < step[b]
    return a < b


@njit(cache=True)
def _sorted_nodes(is_op, rank, vertex, step):  # pragma: no cover - compiled
    # the node ids in that order: a bottom-up merge sort (the key is total, ids being unique)
    n = rank.shape[0]
    src = np.arange(n)
    dst = np.empty(n, dtype=np.int64)
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j, k = lo, mid, lo
            while i < mid and j < hi:
                if _first(src[j], src[i], is_op, rank, vertex, step):
                    dst[k] = src[j]
                    j += 1
                else:
                    dst[k] = src[i]
                    i += 1
                k += 1
            while i < mid:
                dst[k] = src[i]
                i += 1
                k += 1
            while j < hi:
                dst[k] = src[j]
                j += 1
                k += 1
        src, dst = dst, src
        width *= 2
    return src


@njit(cache=True)
def schedule_kernel(
    dur,
    succ_ptr,
    succ_idx,
    indeg0,
    first_phase,
    is_op,
    vertex,
    step,
    vatom_ptr,
    vatom_idx,
    n_atoms,
    n_vertices,
):  # pragma: no cover - compiled; tested against the reference in tests/scoring/test_fast.py
    """SPEC §7's list schedule of one lowered graph (the reference's rule, see the module docstring).

    ``rank(i) = T(i) + max_{s ∈ succ(i)} rank(s)`` (phase nodes take their first phase's rank);
    the ready node with the smallest key ``(EST, kind is OP, −rank, vertex, step, id)`` starts
    next at ``EST(i) = max(max_p finish(p), max_{a ∈ atoms(i)} free(a))``; a node popped with a
    stale EST goes back with the current one.

    Parameters
    ----------
    dur
        Seconds per node.
    succ_ptr, succ_idx
        Successors per node (CSR), in increasing id.
    indeg0
        Predecessor count per node.
    first_phase, is_op, vertex, step
        Per node: its first phase's id (itself when unsplit), 1 for OP nodes, its vertex, step.
    vatom_ptr, vatom_idx
        The atoms of each vertex's allocation (CSR), in increasing atom index.
    n_atoms, n_vertices
        Counts.

    Returns
    -------
    tuple
        ``(start, finish, blocker, busy per atom, nodes scheduled, critical seconds per vertex,
        makespan)``; the critical seconds sum each vertex's OP durations along the blocker chain
        from the first node finishing last, first to last.
    """
    n = dur.shape[0]
    rank = dur.copy()
    for i in range(n - 1, -1, -1):
        s0 = succ_ptr[i]
        s1 = succ_ptr[i + 1]
        if s1 > s0:
            m = rank[succ_idx[s0]]
            for k in range(s0 + 1, s1):
                r = rank[succ_idx[k]]
                if r > m:
                    m = r
            rank[i] = dur[i] + m
    for i in range(n):
        f = first_phase[i]
        if f != i:
            rank[i] = rank[f]
    # prio[i]: position of i in the order (kind is OP, −rank, vertex, step, id)
    order = _sorted_nodes(is_op, rank, vertex, step)
    prio = np.empty(n, dtype=np.int64)
    for k in range(n):
        prio[order[k]] = k

    indeg = indeg0.copy()
    ready_at = np.zeros(n)
    why = np.full(n, -1, dtype=np.int64)
    free = np.zeros(n_atoms)
    last_user = np.full(n_atoms, -1, dtype=np.int64)
    busy = np.zeros(n_atoms)
    start = np.zeros(n)
    finish = np.zeros(n)
    blocker = np.full(n, -1, dtype=np.int64)
    hk = np.empty(n)
    hn = np.empty(n, dtype=np.int64)
    size = 0
    for i in range(n):
        if indeg[i] == 0:
            size = _push(hk, hn, size, 0.0, i, prio)
    done = 0
    while size > 0:
        est = hk[0]
        i = hn[0]
        size = _pop(hk, hn, size, prio)
        t = ready_at[i]
        src = why[i]
        v = vertex[i]
        for k in range(vatom_ptr[v], vatom_ptr[v + 1]):
            a = vatom_idx[k]
            if free[a] > t:
                t = free[a]
                src = last_user[a]
        if t > est:
            size = _push(hk, hn, size, t, i, prio)
            continue
        d = dur[i]
        f = t + d
        start[i] = t
        finish[i] = f
        blocker[i] = src
        done += 1
        for k in range(vatom_ptr[v], vatom_ptr[v + 1]):
            a = vatom_idx[k]
            free[a] = f
            last_user[a] = i
            busy[a] += d
        for k in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[k]
            if f > ready_at[j]:
                ready_at[j] = f
                why[j] = i
            elif why[j] < 0:
                why[j] = i
            indeg[j] -= 1
            if indeg[j] == 0:
                t2 = ready_at[j]
                vj = vertex[j]
                for kk in range(vatom_ptr[vj], vatom_ptr[vj + 1]):
                    a = vatom_idx[kk]
                    if free[a] > t2:
                        t2 = free[a]
                size = _push(hk, hn, size, t2, j, prio)

    critical = np.zeros(n_vertices)
    makespan = 0.0
    if n > 0:
        last = 0
        for i in range(1, n):
            if finish[i] > finish[last]:
                last = i
        makespan = finish[last]
        path = np.empty(n, dtype=np.int64)
        length = 0
        i = last
        while i >= 0:
            path[length] = i
            length += 1
            i = blocker[i]
        for k in range(length - 1, -1, -1):
            i = path[k]
            if is_op[i]:
                critical[vertex[i]] += dur[i]
    return start, finish, blocker, busy, done, critical, makespan


# ---------------------------------------------------------------------------- memory
@njit(cache=True)
def memory_kernel(
    vatom_ptr, vatom_idx, n_atoms, model, training, trainer, shadow, train_state, transient, weights
):  # pragma: no cover - compiled; tested against Evaluator.memory in tests/scoring/test_fast.py
    """``peak(a) = Σ_m S(m, a) + max_{v on a} A(v, a)`` per atom (SPEC §6), as
    :meth:`~rpeg.scoring.evaluator.Evaluator.memory` sums it.

    Per vertex ``v`` on atom ``a`` in vertex order: a training vertex adds its model's training
    state ``12·W_shard/Pd`` and its transient; a serving vertex of a frozen model, or of a model
    with ``τ > 0`` whose trainer is not on ``a``, holds a BF16 copy (the largest per model) and
    adds its transient; otherwise its transient plus its materialised weights. The persistent
    items are summed in the order they first appear, as the reference's dictionary does.

    Parameters
    ----------
    vatom_ptr, vatom_idx, n_atoms
        The atoms of each vertex's allocation (CSR) and their count.
    model, training, trainer, shadow
        Per vertex: its model's index, 1 for a training vertex, the vertex index of its model's
        trainer (−1 for a frozen model), 1 when its model's ``τ > 0``.
    train_state, transient, weights
        Per vertex, bytes (:class:`~rpeg.scoring.costs.VertexMemory`).

    Returns
    -------
    numpy.ndarray
        ``peak`` per atom, bytes.
    """
    n = model.shape[0]
    n_models = 0
    for v in range(n):
        if model[v] + 1 > n_models:
            n_models = model[v] + 1
    on = np.zeros((n, n_atoms), dtype=np.bool_)
    for v in range(n):
        for k in range(vatom_ptr[v], vatom_ptr[v + 1]):
            on[v, vatom_idx[k]] = True
    peaks = np.zeros(n_atoms)
    slot = np.empty(2 * n_models, dtype=np.int64)
    order = np.empty(2 * n_models, dtype=np.int64)
    value = np.zeros(2 * n_models)
    for a in range(n_atoms):
        slot[:] = -1
        items = 0
        top = 0.0
        for v in range(n):
            if not on[v, a]:
                continue
            m = model[v]
            if training[v]:
                key = 2 * m
                if slot[key] < 0:
                    slot[key] = items
                    order[items] = key
                    items += 1
                value[key] = train_state[v]
                t = transient[v]
            elif trainer[v] < 0 or (shadow[v] and not on[trainer[v], a]):
                key = 2 * m + 1  # a frozen model's or a shadow copy, once per model
                if slot[key] < 0:
                    slot[key] = items
                    order[items] = key
                    items += 1
                    value[key] = max(0.0, weights[v])
                else:
                    value[key] = max(value[key], weights[v])
                t = transient[v]
            else:  # no persistent serving copy here: the BF16 weights are materialised
                t = transient[v] + weights[v]
            if t > top:
                top = t
        total = 0.0
        for k in range(items):
            total += value[order[k]]
        peaks[a] = total + top
    return peaks


# ---------------------------------------------------------------------------- the front
def vertex_atoms(masks: list[int]) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The device atoms of a plan's allocations (:func:`~rpeg.scoring.scheduler.atoms_of`) and
    each vertex's atoms as CSR ``(ptr, idx)``, in increasing atom index as the reference
    scheduler visits them."""
    atoms = atoms_of(masks)
    ptr = [0]
    idx: list[int] = []
    for m in masks:
        idx.extend(k for k, a in enumerate(atoms) if a & m)
        ptr.append(len(idx))
    return atoms, np.array(ptr, dtype=np.int64), np.array(idx, dtype=np.int64)


@njit(cache=True)
def _evaluate(
    dims, inc_ptr, inc_kind, inc_ref, inc_src, inc_src_step, ints, secs, vatom_ptr, vatom_idx, n_atoms, memory
):  # pragma: no cover - compiled
    # emit, schedule and the memory peaks in one call (one dispatch from Python)
    kind, vertex, _, step, _, first_phase, dur, psrc, pdst, nn, ne = emit_kernel(
        dims, inc_ptr, inc_kind, inc_ref, inc_src, inc_src_step, ints, secs
    )
    ptr, idx, indeg = _successors(nn, ne, psrc, pdst)
    is_op = (kind[:nn] == 0).astype(np.int64)
    _, _, _, busy, done, critical, makespan = schedule_kernel(
        dur[:nn],
        ptr,
        idx,
        indeg,
        first_phase[:nn],
        is_op,
        vertex[:nn],
        step[:nn],
        vatom_ptr,
        vatom_idx,
        n_atoms,
        dims[0],
    )
    model, training, trainer, shadow, per_vertex = memory
    peaks = memory_kernel(
        vatom_ptr,
        vatom_idx,
        n_atoms,
        model,
        training,
        trainer,
        shadow,
        per_vertex[0],
        per_vertex[1],
        per_vertex[2],
    )
    return busy, done, nn, critical, makespan, peaks


@dataclass
class FastSchedule:
    """What :meth:`FastLowering.schedule` returns (the parts of an evaluation it decides).

    Attributes
    ----------
    makespan
        ``MS`` in seconds.
    busy_device_seconds
        ``Σ_d busy(d)``, summed as :meth:`~rpeg.scoring.scheduler.Schedule.busy_device_seconds`.
    critical
        Per vertex, its OP seconds on the critical path.
    atoms, peaks
        The plan's device atoms and each one's memory peak in bytes
        (:meth:`~rpeg.scoring.evaluator.Evaluator.memory`).
    """

    makespan: float
    busy_device_seconds: float
    critical: list[float]
    atoms: list[int]
    peaks: list[float]


class FastLowering:
    """Lower and schedule plans of one unrolled structure with the compiled kernels.

    Parameters
    ----------
    unrolled
        The unrolled RPEG.
    quantiles
        Response-length quantiles (``Q`` phases).
    costs
        The cost provider (its caches are shared with the reference path).
    split_phases
        Rule 1's phase splitting on or off.
    """

    def __init__(
        self, unrolled: Unrolled, quantiles: tuple[tuple[float, int], ...], costs: Costs, split_phases: bool
    ) -> None:
        self.unrolled = unrolled
        self.quantiles = quantiles
        self.costs = costs
        self.split_phases = split_phases
        g = unrolled.graph
        n, K, Q = len(g.vertices), unrolled.k_eval, len(quantiles)
        self.n, self.K, self.Q = n, K, Q
        self.n_data, self.n_pub = len(g.data_edges), len(g.pub_edges)
        self._pub_keys = [(e.model, g.index[e.dst]) for e in g.pub_edges]
        codes = {EdgeKind.DATA: _DATA, EdgeKind.PUB: _PUB, EdgeKind.CHAIN: _CHAIN}
        by_instance: list[list] = [[] for _ in range(n * K)]
        for e in unrolled.edges:  # the reference's grouping: per destination, in edge order
            by_instance[e.dst_step * n + e.dst].append(e)
        ptr = [0]
        kinds, refs, srcs, src_steps = [], [], [], []
        max_nodes = max_preds = max_inc = 0
        for edges in by_instance:
            for e in edges:
                kinds.append(codes[e.kind])
                refs.append(e.ref)
                srcs.append(e.src)
                src_steps.append(e.src_step)
            ptr.append(len(kinds))
            # nodes: ≤ Q COMMs per edge, one pair node, Q OP nodes; edges: one per COMM or pair
            # node, and the OP nodes' predecessors (every edge and the pair once, Q phase chains)
            max_nodes += Q * len(edges) + 1 + Q
            max_preds += (Q + 1) * len(edges) + 2 + Q + Q * len(edges)
            max_inc = max(max_inc, len(edges))
        i64 = np.int64
        self._static = (
            np.array(ptr, dtype=i64),
            np.array(kinds, dtype=i64),
            np.array(refs, dtype=i64),
            np.array(srcs, dtype=i64),
            np.array(src_steps, dtype=i64),
        )
        models = list(g.models)
        trainer = {m: g.index[t.name] for m in models if (t := g.training_vertex(m)) is not None}
        self._model = np.array([models.index(v.model) for v in g.vertices], dtype=i64)
        self._training = np.array([v.role is Role.TRAINING for v in g.vertices], dtype=i64)
        self._trainer = np.array([trainer.get(v.model, -1) for v in g.vertices], dtype=i64)
        self._shadow = np.array([g.staleness.get(v.model, 0) > 0 for v in g.vertices], dtype=i64)
        self._dims = np.array(
            [n, K, Q, self.n_data, self.n_pub, max_nodes, max_preds + 1, max_inc], dtype=i64
        )

    def pack(self, rules: Rules, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
        """The outcomes and seconds of ``rules`` in the fixed layout :func:`emit_kernel` reads.

        Returns
        -------
        tuple
            ``(ints, secs)`` (see :func:`emit_kernel`).

        Raises
        ------
        ValueError
            A vertex ends more than one rule-3 pair (the layout holds one per vertex).
        """
        n, Q = self.n, self.Q
        ints = [1 if s else 0 for s in rules.split]
        secs = [0.0] * (n * Q)
        for v, durs in enumerate(rules.op_durs):
            secs[v * Q : v * Q + len(durs)] = durs
        for kind, _payloads, durs in rules.data_plan:
            if kind == PREC:
                ints.append(-1)
                secs.extend([0.0] * Q)
            else:
                ints.append(len(durs))
                secs.extend(durs)
                if len(durs) < Q:
                    secs.extend([0.0] * (Q - len(durs)))
        choices = plan.choices
        groups: dict[tuple, int] = {}
        for j, (kind, _nbytes, dur) in enumerate(rules.pub_plan):
            if kind == PREC:
                ints.extend((-1, 0))
                secs.append(0.0)
                continue
            model, dst = self._pub_keys[j]
            c = choices[dst]
            ints.extend((kind, groups.setdefault((model, c.allocation.mask, c.strategy), j)))
            secs.append(dur)
        for entries in rules.pair_plan:
            if not entries:
                ints.extend((_NONE, 0))
                secs.append(0.0)
                continue
            if len(entries) > 1:
                raise ValueError("a vertex ends more than one rule-3 pair; the compiled lowering holds one")
            a, kind, _nbytes, dur = entries[0]
            ints.extend((kind, a))
            secs.append(dur)
        return np.array(ints, dtype=np.int64), np.array(secs)

    def lower(self, plan: Plan) -> ExecGraph:
        """The compiled lowering of ``plan`` as an :class:`~rpeg.ir.lower.ExecGraph` (durations,
        no payloads: ``nbytes`` is 0 on every node and masks are the vertices' allocations);
        equal node for node to :func:`~rpeg.ir.lower.lower` but for ``nbytes``."""
        rules = apply_rules(self.unrolled, plan, self.quantiles, self.costs, self.split_phases)
        ints, secs = self.pack(rules, plan)
        kind, vertex, source, step, phase, first_phase, dur, psrc, pdst, nn, ne = emit_kernel(
            self._dims, *self._static, ints, secs
        )
        g = ExecGraph()
        masks = [c.allocation.mask for c in plan.choices]
        g.kind = kind[:nn].tolist()
        g.vertex = vertex[:nn].tolist()
        g.source = source[:nn].tolist()
        g.step = step[:nn].tolist()
        g.phase = phase[:nn].tolist()
        g.first_phase = first_phase[:nn].tolist()
        g.duration = dur[:nn].tolist()
        g.mask = [masks[v] for v in g.vertex]
        g.nbytes = [0.0] * nn
        g.preds = [[] for _ in range(nn)]
        for s, d in zip(psrc[:ne].tolist(), pdst[:ne].tolist()):
            g.preds[d].append(s)
        return g

    def schedule(self, plan: Plan) -> FastSchedule:
        """Makespan, busy device-seconds, critical seconds and memory peaks of ``plan``.

        Equal to lowering ``plan`` (:func:`~rpeg.ir.lower.lower`), list-scheduling the result
        (:func:`~rpeg.scoring.scheduler.list_schedule`) and
        :meth:`~rpeg.scoring.evaluator.Evaluator.memory`.

        Raises
        ------
        ValueError
            The plan has the wrong number of choices, or the lowered graph has a cycle.
        """
        if len(plan) != self.n:
            raise ValueError(f"plan has {len(plan)} choices but the graph has {self.n} vertices")
        rules = apply_rules(self.unrolled, plan, self.quantiles, self.costs, self.split_phases)
        ints, secs = self.pack(rules, plan)
        choices = plan.choices
        atoms, vptr, vidx = vertex_atoms([c.allocation.mask for c in choices])
        mems = [self.costs.memory(v, c.strategy) for v, c in enumerate(choices)]
        per_vertex = np.array(
            [[m.train_state for m in mems], [m.transient for m in mems], [m.weights for m in mems]]
        )
        busy, done, nn, critical, makespan, peaks = _evaluate(
            self._dims,
            *self._static,
            ints,
            secs,
            vptr,
            vidx,
            len(atoms),
            (self._model, self._training, self._trainer, self._shadow, per_vertex),
        )
        if done != nn:
            raise ValueError(f"executable graph has a cycle: scheduled {done} of {nn} nodes")
        busy_device = sum(b * m.bit_count() for b, m in zip(busy.tolist(), atoms))
        return FastSchedule(float(makespan), busy_device, critical.tolist(), atoms, peaks.tolist())


# ---------------------------------------------------------------------------- warm-up
def _compile() -> bool:
    """One call of :func:`_evaluate` on a one-node graph, with the argument types every real
    call has (so the compiled specialisation is the one the evaluator uses)."""
    i64 = np.int64
    empty = np.zeros(0, dtype=i64)
    one = np.zeros(1, dtype=i64)
    _evaluate(
        np.array([1, 1, 1, 0, 0, 2, 3, 0], dtype=i64),  # one vertex, one step, one phase
        np.zeros(2, dtype=i64),
        empty,
        empty,
        empty,
        empty,
        np.array([0, _NONE, 0], dtype=i64),
        np.array([1.0, 0.0]),
        np.array([0, 1], dtype=i64),
        np.zeros(1, dtype=i64),
        1,
        (one, one, np.full(1, -1, dtype=i64), one, np.zeros((3, 1))),
    )
    return True


_WARM_UP = WarmUp(
    "rpeg-compile-evaluator",
    _compile,
    "the compiled evaluator",
    "plans are scored by the pure-Python reference (same results, several times slower)",
)


def ready() -> bool:
    """Whether the compiled kernels are loaded in this process (:func:`warm_up` has finished)."""
    return _WARM_UP.ready()


def warm_up(wait: bool = False) -> bool:
    """Load or compile the kernels in a background thread, once per process
    (:class:`~rpeg.ir.warmup.WarmUp`).

    Parameters
    ----------
    wait
        Block until the thread has finished.

    Returns
    -------
    bool
        :func:`ready`. ``False`` after waiting means the kernels could not be compiled (a
        warning says why); evaluators then keep the reference path.
    """
    return _WARM_UP.start(wait)

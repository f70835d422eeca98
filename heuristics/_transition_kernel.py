"""The numba core of :func:`rpeg.heuristics.transition.greedy_schedule` on a DAG's index tables
(:class:`rpeg.ir.emu.flat.FlatDAG`).

The same event-driven list scheduler as the reference (:func:`greedy_schedule_reference`), step
for step: a GPU set is a slice of GPU ids instead of a bit mask, the waiting lists are linked
lists threaded through per-position arrays, the end times a binary heap of ``(end, index)``.
Status 0: scheduled; 1: nothing runs and nothing ready fits in memory (the reference raises the
message).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..ir.warmup import quiet_llvmlite_wrapper

quiet_llvmlite_wrapper()  # numba loads llvmlite: keep vLLM's module scan working

SPLIT, MERGE, EXTEND, DESTROY = 0, 1, 2, 3


@njit(cache=True, inline="always")
def _sort_distinct(a, m, flag):
    """Sort ``a[:m]``, distinct ids below ``flag.shape[0]``, in place. When ``m`` is a sixteenth
    of the id range or more, by one pass over per-id flags (``flag`` all ``False`` before and
    after) instead of a comparison sort: at 1,024 GPUs those sorts were a third of the schedule."""
    n = flag.shape[0]
    if m * 16 <= n:
        a[:m].sort()
        return
    for q in range(m):
        flag[a[q]] = True
    q = 0
    for k in range(n):
        if flag[k]:
            flag[k] = False
            a[q] = k
            q += 1


@njit(cache=True)
def _heap_push(ht, hi, n, t, i):
    k = n
    ht[k] = t
    hi[k] = i
    while k > 0:
        p = (k - 1) // 2
        if ht[p] < ht[k] or (ht[p] == ht[k] and hi[p] < hi[k]):
            break
        ht[p], ht[k] = ht[k], ht[p]
        hi[p], hi[k] = hi[k], hi[p]
        k = p
    return n + 1


@njit(cache=True)
def _heap_pop(ht, hi, n):
    n -= 1
    ht[0] = ht[n]
    hi[0] = hi[n]
    k = 0
    while True:
        a = 2 * k + 1
        if a >= n:
            break
        b = a + 1
        if b < n and (ht[b] < ht[a] or (ht[b] == ht[a] and hi[b] < hi[a])):
            a = b
        if ht[k] < ht[a] or (ht[k] == ht[a] and hi[k] < hi[a]):
            break
        ht[a], ht[k] = ht[k], ht[a]
        hi[a], hi[k] = hi[k], hi[a]
        k = a
    return n


@njit(cache=True)
def used_gpus(p_kind, p_iptr, p_in, p_optr, p_out, u_ptr, u_gpus):
    """Per primitive the GPUs it holds (CSR): a Split its source's, a Merge its result's, an
    Extend its source's and its result's, a Destroy its unit's."""
    n = p_kind.shape[0]
    ptr = np.zeros(n + 1, np.int64)
    for i in range(n):
        k = p_kind[i]
        m = 0
        if k != MERGE:
            x = p_in[p_iptr[i]]
            m += u_ptr[x + 1] - u_ptr[x]
        if k in (MERGE, EXTEND):
            y = p_out[p_optr[i]]
            m += u_ptr[y + 1] - u_ptr[y]
        ptr[i + 1] = ptr[i] + m
    out = np.empty(ptr[n], np.int64)
    for i in range(n):
        k = p_kind[i]
        q = ptr[i]
        if k != MERGE:
            x = p_in[p_iptr[i]]
            for z in range(u_ptr[x], u_ptr[x + 1]):
                out[q] = u_gpus[z]
                q += 1
        if k in (MERGE, EXTEND):
            y = p_out[p_optr[i]]
            for z in range(u_ptr[y], u_ptr[y + 1]):
                out[q] = u_gpus[z]
                q += 1
    return ptr, out


@njit(cache=True)
def schedule_tables(
    n_gpus, n_cur, p_kind, p_stage, stage_class, n_keys, p_iptr, p_in, p_optr, p_out, u_ptr, u_gpus,
    u_bpg, edge_src, edge_dst, res_src, res_dst, dur, cap_gpus, cap_vals,
):  # fmt: skip
    """:func:`schedule` on a flat DAG's tables as they are, the preparation done here: status 2
    when a duration is negative (or NaN); each primitive's list class, ``stage_class`` of its
    model-stage, plus ``n_keys`` unless it is a Destroy; ``cap_g`` from the GPU ids and bounds
    given (``inf`` elsewhere; ids outside ``0..n_gpus−1`` ignored); the state edges, then the
    resource edges."""
    n = p_kind.shape[0]
    for i in range(n):
        if not dur[i] >= 0:
            return 2, np.zeros(n, np.float64), np.zeros(n, np.float64)
    cls = np.empty(n, np.int64)
    for i in range(n):
        cls[i] = stage_class[p_stage[i]] + (0 if p_kind[i] == DESTROY else n_keys)
    cap = np.full(n_gpus, np.inf)
    for k in range(cap_gpus.shape[0]):
        g = cap_gpus[k]
        if 0 <= g < n_gpus:
            cap[g] = cap_vals[k]
    src = np.concatenate((edge_src, res_src))
    dst = np.concatenate((edge_dst, res_dst))
    return schedule(
        n_gpus, n_cur, p_kind, cls, p_iptr, p_in, p_optr, p_out, u_ptr, u_gpus, u_bpg, src, dst, dur, cap
    )


@njit(cache=True)
def schedule(
    n_gpus, n_cur, p_kind, cls, p_iptr, p_in, p_optr, p_out, u_ptr, u_gpus, u_bpg, src, dst, dur, cap
):
    """Greedy list schedule; returns ``(status, starts, ends)`` (module docstring).

    ``src``/``dst`` are all edges (state and resource), ``cls`` each primitive's class in the
    list order (Destroys first, then stage order), ``cap`` ``cap_g`` per GPU id (``inf`` where
    unbounded), current units are ``uid`` ``0..n_cur−1``.
    """
    n = p_kind.shape[0]
    n_units = u_ptr.shape[0] - 1
    starts = np.zeros(n, np.float64)
    ends = np.zeros(n, np.float64)
    # successors (CSR) and in-degrees
    sptr = np.zeros(n + 1, np.int64)
    indeg = np.zeros(n, np.int64)
    for e in range(src.shape[0]):
        sptr[src[e] + 1] += 1
        indeg[dst[e]] += 1
    for i in range(n):
        sptr[i + 1] += sptr[i]
    succ = np.empty(src.shape[0], np.int64)
    fill = sptr[:-1].copy()
    for e in range(src.shape[0]):
        succ[fill[src[e]]] = dst[e]
        fill[src[e]] += 1
    # downstream ranks rank_i = d_i + max_j rank_j, in a reverse topological order (Kahn)
    deg = indeg.copy()
    topo = np.empty(n, np.int64)
    head = 0
    tail = 0
    for i in range(n):
        if deg[i] == 0:
            topo[tail] = i
            tail += 1
    while head < tail:
        i = topo[head]
        head += 1
        for z in range(sptr[i], sptr[i + 1]):
            j = succ[z]
            deg[j] -= 1
            if deg[j] == 0:
                topo[tail] = j
                tail += 1
    rank = np.empty(n, np.float64)
    for q in range(n - 1, -1, -1):
        i = topo[q]
        best = 0.0
        first = True
        for z in range(sptr[i], sptr[i + 1]):
            r = rank[succ[z]]
            if first or r > best:
                best = r
                first = False
        rank[i] = dur[i] + best
    # list order: class, then larger rank, then index (two stable sorts)
    by_rank = np.argsort(-rank, kind="mergesort")
    n_cls = cls.max() + 1 if n else 0
    cptr = np.zeros(n_cls + 1, np.int64)
    for i in range(n):
        cptr[cls[i] + 1] += 1
    for c in range(n_cls):
        cptr[c + 1] += cptr[c]
    order = np.empty(n, np.int64)
    for i in by_rank:  # stable counting sort by class
        order[cptr[cls[i]]] = i
        cptr[cls[i]] += 1
    pos = np.empty(n, np.int64)
    for k in range(n):
        pos[order[k]] = k
    gptr, gl = used_gpus(p_kind, p_iptr, p_in, p_optr, p_out, u_ptr, u_gpus)
    # memory: only on GPUs where every unit ever resident could exceed cap_g
    peak = np.zeros(n_gpus, np.float64)
    for u in range(n_units):
        for z in range(u_ptr[u], u_ptr[u + 1]):
            peak[u_gpus[z]] += u_bpg[u]
    binding = np.zeros(n_gpus, np.bool_)
    limit = np.empty(n_gpus, np.float64)
    n_binding = 0
    for g in range(n_gpus):
        limit[g] = cap[g] * (1 + 1e-12)
        if peak[g] > limit[g]:
            binding[g] = True
            n_binding += 1
    usage = np.zeros(n_gpus, np.float64)
    if n_binding:
        for u in range(n_cur):
            for z in range(u_ptr[u], u_ptr[u + 1]):
                g = u_gpus[z]
                if binding[g]:
                    usage[g] += u_bpg[u]
    # event loop
    todo = np.empty(n, np.int64)
    n_todo = 0
    for i in range(n):
        if indeg[i] == 0:
            todo[n_todo] = pos[i]
            n_todo += 1
    busy = np.zeros(n_gpus, np.bool_)
    busy_end = np.zeros(n_gpus, np.float64)  # end of the primitive holding a busy GPU
    wait_head = -np.ones(n_gpus, np.int64)  # GPU → positions waiting for it to be released
    mem_head = -np.ones(n_gpus, np.int64)  # binding GPU → positions waiting for memory there
    nxt = -np.ones(n, np.int64)
    # running primitives in buckets of one end time, a heap of buckets by (end, bucket): the
    # primitives started in one pass share the start, so few buckets hold them all
    ht = np.empty(n, np.float64)
    hi = np.empty(n, np.int64)
    n_heap = 0
    b_time = np.empty(n, np.float64)
    b_head = np.empty(n, np.int64)
    b_next = np.empty(n, np.int64)
    n_buckets = 0
    batch = np.empty(n, np.int64)
    flag = np.zeros(n, np.bool_)  # scratch of _sort_distinct
    t = 0.0
    done = 0
    while done < n:
        if n_todo:
            m = n_todo
            _sort_distinct(todo, m, flag)  # nothing joins todo while it is tried
            n_todo = 0
            first_bucket = n_buckets  # buckets made in this pass
            for q in range(m):
                k = todo[q]
                i = order[k]
                # wait on the busy GPU released last: the primitive cannot start before then, and
                # any busy GPU gives the same schedule (the reference waits on the highest one)
                hg = -1
                for z in range(gptr[i], gptr[i + 1]):
                    g = gl[z]
                    if busy[g] and (hg < 0 or busy_end[g] > busy_end[hg]):
                        hg = g
                if hg >= 0:
                    nxt[k] = wait_head[hg]
                    wait_head[hg] = k
                    continue
                if n_binding:
                    short = -1
                    for z in range(p_optr[i], p_optr[i + 1]):
                        u = p_out[z]
                        for y in range(u_ptr[u], u_ptr[u + 1]):
                            g = u_gpus[y]
                            if binding[g] and usage[g] + u_bpg[u] > limit[g]:
                                short = g
                                break
                        if short >= 0:
                            break
                    if short >= 0:
                        nxt[k] = mem_head[short]
                        mem_head[short] = k
                        continue
                    for z in range(p_optr[i], p_optr[i + 1]):
                        u = p_out[z]
                        for y in range(u_ptr[u], u_ptr[u + 1]):
                            g = u_gpus[y]
                            if binding[g]:
                                usage[g] += u_bpg[u]
                starts[i] = t
                ends[i] = t + dur[i]
                for z in range(gptr[i], gptr[i + 1]):
                    busy[gl[z]] = True
                    busy_end[gl[z]] = ends[i]
                e = ends[i]
                q = n_buckets - 1
                while q >= first_bucket and q >= n_buckets - 16 and b_time[q] != e:
                    q -= 1
                if q >= first_bucket and q >= n_buckets - 16:
                    b_next[i] = b_head[q]
                    b_head[q] = i
                else:
                    b_time[n_buckets] = e
                    b_head[n_buckets] = i
                    b_next[i] = -1
                    n_heap = _heap_push(ht, hi, n_heap, e, n_buckets)
                    n_buckets += 1
        if n_heap == 0:
            return 1, starts, ends
        t = ht[0]
        m = 0
        while n_heap and ht[0] == t:  # every bucket ending at t (equal ends may span passes)
            i = b_head[hi[0]]
            n_heap = _heap_pop(ht, hi, n_heap)
            while i >= 0:
                batch[m] = i
                m += 1
                i = b_next[i]
        _sort_distinct(batch, m, flag)  # a heap of (end, index) pops them so: memory is freed in this order
        for q in range(m):
            i = batch[q]
            done += 1
            for z in range(gptr[i], gptr[i + 1]):
                g = gl[z]
                busy[g] = False
                k = wait_head[g]
                wait_head[g] = -1
                while k >= 0:
                    todo[n_todo] = k
                    n_todo += 1
                    k = nxt[k]
            if n_binding and p_kind[i] != EXTEND:
                for z in range(p_iptr[i], p_iptr[i + 1]):
                    u = p_in[z]
                    for y in range(u_ptr[u], u_ptr[u + 1]):
                        g = u_gpus[y]
                        if binding[g]:
                            usage[g] -= u_bpg[u]
                            k = mem_head[g]
                            mem_head[g] = -1
                            while k >= 0:
                                todo[n_todo] = k
                                n_todo += 1
                                k = nxt[k]
            for z in range(sptr[i], sptr[i + 1]):
                j = succ[z]
                indeg[j] -= 1
                if indeg[j] == 0:
                    todo[n_todo] = pos[j]
                    n_todo += 1
    return 0, starts, ends

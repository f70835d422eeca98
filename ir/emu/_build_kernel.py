"""The numba core of :func:`rpeg.ir.emu.transition_dag` (see :mod:`.flat`).

It runs the reference builder's steps (:class:`rpeg.ir.emu.dag._Builder`) on flat arrays: units are
rows (``uid`` = row), a unit's GPUs are a CSR slice, GPU sets are compared through per-GPU owner
arrays instead of bit masks. :func:`validate` returns 1 when the units of a side and model-stage
share a GPU; :func:`build` returns status 2 when a resource edge would close a cycle. Either way
the caller hands over to the reference, which raises the message.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..warmup import quiet_llvmlite_wrapper

quiet_llvmlite_wrapper()  # numba loads llvmlite: keep vLLM's module scan working

# unit origins
CURRENT, PART, COPY, MERGED = 0, 1, 2, 3
# primitive kinds
SPLIT, MERGE, EXTEND, DESTROY = 0, 1, 2, 3


@njit(cache=True)
def _gcd(a, b):
    while b:
        a, b = b, a % b
    return a


@njit(cache=True)
def _sorted_by_min(idx, umin):
    """``idx`` stably sorted by the units' lowest GPU (``sorted(us, key=lambda u: min(u.gpus))``)."""
    for j in range(1, idx.shape[0]):  # a plan's replicas come in device order: mostly sorted
        if umin[idx[j]] < umin[idx[j - 1]]:
            return idx[np.argsort(umin[idx])]  # distinct keys: one side and stage are disjoint
    return idx


@njit(cache=True)
def _order(keys):
    """The permutation that sorts the distinct ``keys``: the identity when they are sorted, a
    merge when the even and the odd positions are each sorted (a broadcast round's sources and
    the copies they made, in turn), else an argsort."""
    n = keys.shape[0]
    runs = True
    for j in range(1, n):
        if keys[j] < keys[j - 1]:
            runs = False
            break
    if runs:
        return np.arange(n)
    for j in range(2, n):
        if keys[j] < keys[j - 2]:
            return np.argsort(keys)
    out = np.empty(n, np.int64)
    a = 0
    b = 1
    for j in range(n):
        if b >= n or (a < n and keys[a] < keys[b]):
            out[j] = a
            a += 2
        else:
            out[j] = b
            b += 2
    return out


@njit(cache=True)
def validate(n_stages, n_cur, stage, gptr, gpus):
    """0 when the units of each side and model-stage are disjoint, as
    :func:`~rpeg.ir.emu.plan_diff` requires, else 1."""
    n_in = stage.shape[0]
    held = np.zeros((2 * n_stages, gpus.max() + 1), np.bool_)  # (model-stage, side) × GPU
    for u in range(n_in):
        key = 2 * stage[u] + (0 if u < n_cur else 1)
        for k in range(gptr[u], gptr[u + 1]):
            if held[key, gpus[k]]:
                return 1
            held[key, gpus[k]] = True
    return 0


@njit(cache=True, inline="always")
def _add_unit(
    units, n_units, origin, src, s, tp, pp, bpg, from_gpus, g0, count
):  # pragma: no cover - compiled
    # append unit ``n_units`` (no Extend reads it yet) holding ``from_gpus[g0 : g0 + count]``
    u_origin, u_src, u_stage, u_tp, u_pp, u_bpg, u_ptr, u_gpus, feed_head = units
    u_origin[n_units] = origin
    feed_head[n_units] = -1
    u_src[n_units] = src
    u_stage[n_units] = s
    u_tp[n_units] = tp
    u_pp[n_units] = pp
    u_bpg[n_units] = bpg
    q0 = u_ptr[n_units]
    for q in range(count):
        u_gpus[q0 + q] = from_gpus[g0 + q]
    u_ptr[n_units + 1] = q0 + count
    return n_units + 1


@njit(cache=True)
def _sub_pp(pa, pb, va, vb):
    """Pipeline stages of ``T_sub`` (:func:`rpeg.ir.emu.units.sub_layout`): ``gcd(pp, pp*)``
    when both sides interleave alike, else 1 (the whole pipeline)."""
    if va != vb:
        return 1
    return _gcd(pa, pb)


@njit(cache=True)
def build(n_stages, n_cur, stage, tp, pp, bpg, gptr, gpus, sub_bpg, vp):
    """Flat transition DAG of the input units ``0..n_cur−1`` (current) and ``n_cur..`` (target),
    which :func:`validate` accepted.

    ``stage`` is each unit's model-stage in diff order, ``gptr``/``gpus`` its GPUs in rank order,
    ``sub_bpg[s]`` the bytes per GPU of a ``T_sub`` unit of stage ``s``, ``vp`` each unit's chunks
    per pipeline stage (:func:`_sub_pp`). Returns the status and
    the tables :class:`rpeg.ir.emu.flat.FlatDAG` holds (meaningless unless the status is 0).
    """
    n_in = stage.shape[0]
    n_gpus = gpus.max() + 1
    umin = np.empty(n_in, np.int64)
    for u in range(n_in):
        lo = gpus[gptr[u]]
        for k in range(gptr[u] + 1, gptr[u + 1]):
            lo = min(lo, gpus[k])
        umin[u] = lo
    cur_own = np.zeros((n_stages, n_gpus), np.bool_)
    tgt_own = np.zeros((n_stages, n_gpus), np.bool_)
    for u in range(n_in):
        own = cur_own if u < n_cur else tgt_own
        for k in range(gptr[u], gptr[u + 1]):
            own[stage[u], gpus[k]] = True
    seen = -np.ones(n_gpus, np.int64)
    # ---- current units, uids in diff order, each model-stage's sorted by lowest GPU
    cur_sorted = []
    tgt_sorted = []
    tgt_rows = np.empty(n_in - n_cur, np.int64)
    n_rows = 0
    # rows grouped by (side, model-stage) in one counting pass, then sorted by lowest GPU
    gptr_s = np.zeros(2 * n_stages + 1, np.int64)
    for u in range(n_in):
        gptr_s[2 * stage[u] + (u >= n_cur) + 1] += 1
    for k in range(2 * n_stages):
        gptr_s[k + 1] += gptr_s[k]
    grouped = np.empty(n_in, np.int64)
    fill_s = gptr_s[:-1].copy()
    for u in range(n_in):
        k = 2 * stage[u] + (u >= n_cur)
        grouped[fill_s[k]] = u
        fill_s[k] += 1
    for s in range(n_stages):
        cur_sorted.append(_sorted_by_min(grouped[gptr_s[2 * s] : gptr_s[2 * s + 1]], umin))
        tgt_sorted.append(_sorted_by_min(grouped[gptr_s[2 * s + 1] : gptr_s[2 * s + 2]], umin))
        tgt_rows[n_rows : n_rows + tgt_sorted[s].shape[0]] = tgt_sorted[s]
        n_rows += tgt_sorted[s].shape[0]
    # ---- capacity of the output tables, from each model-stage's T_sub (tight: fresh pages of
    # a large allocation cost more than the work done in them)
    cur_g = gptr[n_cur]
    tgt_g = gptr[n_in] - cur_g
    tot_sub = 0  # sub-units after step 1
    tot_blk = 0  # target blocks
    for s in range(n_stages):
        a, b = cur_sorted[s][0], tgt_sorted[s][0]
        sz = _gcd(tp[a], tp[b]) * _sub_pp(pp[a], pp[b], vp[a], vp[b])
        tot_sub += cur_sorted[s].shape[0] * tp[a] * pp[a] // sz
        tot_blk += tgt_sorted[s].shape[0] * tp[b] * pp[b] // sz
    max_units = n_in + tot_sub + tot_blk  # current, parts, copies, merge results
    max_prims = n_in + tot_sub + tot_blk  # splits, destroys, extends, merges
    max_edges = tot_sub + 4 * tot_blk + 16
    u_origin = np.empty(max_units, np.int64)  # CURRENT … MERGED
    u_src = np.empty(max_units, np.int64)  # input row (current, merged) or the unit it copies/splits
    u_stage = np.empty(max_units, np.int64)
    u_tp = np.empty(max_units, np.int64)
    u_pp = np.empty(max_units, np.int64)
    u_bpg = np.empty(max_units, np.float64)
    u_ptr = np.empty(max_units + 1, np.int64)
    u_ptr[0] = 0
    u_gpus = np.empty(2 * (cur_g + tgt_g) + 1, np.int64)
    feed_head = np.empty(max_units, np.int64)  # uid → last Extend reading it (linked list)
    units = (u_origin, u_src, u_stage, u_tp, u_pp, u_bpg, u_ptr, u_gpus, feed_head)
    p_kind = np.empty(max_prims, np.int64)
    p_stage = np.empty(max_prims, np.int64)
    p_iptr = np.empty(max_prims + 1, np.int64)
    p_iptr[0] = 0
    p_in = np.empty(max_prims + tot_blk, np.int64)
    p_optr = np.empty(max_prims + 1, np.int64)
    p_optr[0] = 0
    p_out = np.empty(max_prims + tot_sub, np.int64)
    # set when a primitive is added: whether it has a predecessor, its last successor so far
    has_preds = np.empty(max_prims, np.bool_)
    last_succ = np.empty(max_prims, np.int64)
    e_src = np.empty(max_edges, np.int64)
    e_dst = np.empty(max_edges, np.int64)
    final = np.empty(n_in, np.int64)
    n_units = 0
    n_prims = 0
    n_edges = 0
    n_final = 0
    n_in_ref = 0
    n_out_ref = 0
    for s in range(n_stages):
        for u in cur_sorted[s]:
            n_units = _add_unit(
                units, n_units, CURRENT, u, s, tp[u], pp[u], bpg[u], gpus, gptr[u], gptr[u + 1] - gptr[u]
            )
    # GPUs some other model-stage acquires (anchors avoid them)
    acq_count = np.zeros(n_gpus, np.int64)
    for u in range(n_cur, n_in):
        for k in range(gptr[u], gptr[u + 1]):
            if not cur_own[stage[u], gpus[k]]:
                acq_count[gpus[k]] += 1
    destroy_uid = np.empty(tot_sub, np.int64)
    destroy_prim = np.empty(tot_sub, np.int64)
    n_destroy = 0
    extend_prim = np.empty(tot_blk, np.int64)
    n_extend = 0
    feed_next = np.empty(max_prims, np.int64)
    sub_at = -np.ones(n_gpus, np.int64)  # GPU → local sub-unit index
    uid0 = 0
    for s in range(n_stages):
        cur = cur_sorted[s]
        tgt = tgt_sorted[s]
        cur_uids = np.arange(uid0, uid0 + cur.shape[0])
        uid0 += cur.shape[0]
        a, b = cur[0], tgt[0]
        # unchanged: same layout and the same GPU sets
        same = cur.shape[0] == tgt.shape[0] and tp[a] == tp[b] and pp[a] == pp[b] and vp[a] == vp[b]
        if same:
            seen[:] = -1
            for j in range(tgt.shape[0]):
                t = tgt[j]
                for k in range(gptr[t], gptr[t + 1]):
                    seen[gpus[k]] = j
            for u in cur:
                j = seen[gpus[gptr[u]]]
                if j < 0 or gptr[tgt[j] + 1] - gptr[tgt[j]] != gptr[u + 1] - gptr[u]:
                    same = False
                    break
                for k in range(gptr[u], gptr[u + 1]):
                    if seen[gpus[k]] != j:
                        same = False
                        break
                if not same:
                    break
        if same:
            for x in cur_uids:
                final[n_final] = x
                n_final += 1
            continue
        stp = _gcd(tp[a], tp[b])
        spp = _sub_pp(pp[a], pp[b], vp[a], vp[b])
        sz = stp * spp
        # 1. Split down to T_sub
        n_sub = 0
        n_sub_max = cur.shape[0] * tp[a] * pp[a] // sz
        sub_uid = np.empty(n_sub_max, np.int64)
        sub_creator = np.empty(n_sub_max, np.int64)
        for x in cur_uids:
            if u_tp[x] == stp and u_pp[x] == spp:
                sub_uid[n_sub] = x
                sub_creator[n_sub] = -1
                n_sub += 1
                continue
            parts0 = n_units
            k0 = u_ptr[x]
            for j in range((u_ptr[x + 1] - k0) // sz):
                n_units = _add_unit(units, n_units, PART, x, s, stp, spp, sub_bpg[s], u_gpus, k0 + j * sz, sz)
            i = n_prims
            has_preds[i] = False
            last_succ[i] = -1
            p_kind[i] = SPLIT
            p_stage[i] = s
            p_in[n_in_ref] = x
            n_in_ref += 1
            p_iptr[i + 1] = n_in_ref
            for y in range(parts0, n_units):
                p_out[n_out_ref] = y
                n_out_ref += 1
                sub_uid[n_sub] = y
                sub_creator[n_sub] = i
                n_sub += 1
            p_optr[i + 1] = n_out_ref
            n_prims += 1
        for j in range(n_sub):
            x = sub_uid[j]
            for k in range(u_ptr[x], u_ptr[x + 1]):
                sub_at[u_gpus[k]] = j
        # target blocks: sorted GPUs of each block, per target unit in rank order
        n_blocks = 0
        blk_gpus = np.empty(tgt.shape[0] * tp[b] * pp[b], np.int64)  # block q: [q*sz, (q+1)*sz)
        blk_of = np.empty(tgt.shape[0] + 1, np.int64)  # target unit j: blocks blk_of[j]..blk_of[j+1]
        blk_of[0] = 0
        for j in range(tgt.shape[0]):
            t = tgt[j]
            # insertion sort of the unit's GPUs into its blocks' place (units are small)
            b0 = n_blocks * sz
            m = gptr[t + 1] - gptr[t]
            for k in range(m):
                g = gpus[gptr[t] + k]
                q = b0 + k
                while q > b0 and blk_gpus[q - 1] > g:
                    blk_gpus[q] = blk_gpus[q - 1]
                    q -= 1
                blk_gpus[q] = g
            n_blocks += m // sz
            blk_of[j + 1] = n_blocks
        kept = np.zeros(n_sub, np.bool_)
        at_uid = np.empty(n_blocks, np.int64)
        at_creator = np.empty(n_blocks, np.int64)
        missing = np.zeros(n_blocks, np.bool_)
        n_kept = 0
        for q in range(n_blocks):
            bl = blk_gpus[q * sz : (q + 1) * sz]
            j = sub_at[bl[0]]
            ok = j >= 0
            if ok:
                for g in bl:
                    if sub_at[g] != j:
                        ok = False
                        break
            if ok:
                kept[j] = True
                n_kept += 1
                at_uid[q] = sub_uid[j]
                at_creator[q] = sub_creator[j]
            else:
                missing[q] = True
        n_missing = n_blocks - n_kept
        anchor = -1
        if n_kept == 0 and n_missing > 0:
            best_w = -1
            best_g = -1
            for j in range(n_sub):
                x = sub_uid[j]
                w = 0
                lo = n_gpus
                for k in range(u_ptr[x], u_ptr[x + 1]):
                    g = u_gpus[k]
                    if acq_count[g] - (1 if tgt_own[s, g] and not cur_own[s, g] else 0) > 0:
                        w += 1
                    if g < lo:
                        lo = g
                if anchor < 0 or w < best_w or (w == best_w and lo < best_g):
                    anchor, best_w, best_g = j, w, lo
        # 2. Destroy the redundant sub-units
        for j in range(n_sub):
            if kept[j] or j == anchor:
                continue
            i = n_prims
            has_preds[i] = False
            last_succ[i] = -1
            p_kind[i] = DESTROY
            p_stage[i] = s
            p_in[n_in_ref] = sub_uid[j]
            n_in_ref += 1
            p_iptr[i + 1] = n_in_ref
            p_optr[i + 1] = n_out_ref
            c = sub_creator[j]
            if c >= 0:
                e_src[n_edges] = c
                e_dst[n_edges] = i
                n_edges += 1
                last_succ[c] = i
                has_preds[i] = True
            destroy_uid[n_destroy] = sub_uid[j]
            destroy_prim[n_destroy] = i
            n_destroy += 1
            n_prims += 1
        # 3. Extend: a binomial broadcast, each round ordered by (first GPU, uid)
        cap = n_kept + 2 * n_missing + 1
        now_first = np.empty(cap, np.int64)
        now_uid = np.empty(cap, np.int64)
        now_c = np.empty(cap, np.int64)
        n_now = 0
        for j in range(n_sub):
            if kept[j] or (n_kept == 0 and j == anchor):
                x = sub_uid[j]
                lo = n_gpus
                for k in range(u_ptr[x], u_ptr[x + 1]):
                    lo = min(lo, u_gpus[k])
                now_first[n_now] = lo
                now_uid[n_now] = x
                now_c[n_now] = sub_creator[j]
                n_now += 1
        aft_first = np.empty(cap, np.int64)
        aft_uid = np.empty(cap, np.int64)
        aft_c = np.empty(cap, np.int64)
        n_aft = 0
        order = _order(now_first[:n_now] * max_units + now_uid[:n_now])
        now_first[:n_now] = now_first[:n_now][order]
        now_uid[:n_now] = now_uid[:n_now][order]
        now_c[:n_now] = now_c[:n_now][order]
        k = 0
        for q in range(n_blocks):
            if not missing[q]:
                continue
            if k == n_now:
                order = _order(aft_first[:n_aft] * max_units + aft_uid[:n_aft])
                now_first[:n_aft] = aft_first[:n_aft][order]
                now_uid[:n_aft] = aft_uid[:n_aft][order]
                now_c[:n_aft] = aft_c[:n_aft][order]
                n_now = n_aft
                n_aft = 0
                k = 0
            first_g, src, c = now_first[k], now_uid[k], now_c[k]
            k += 1
            new = n_units
            n_units = _add_unit(units, n_units, COPY, src, s, stp, spp, sub_bpg[s], blk_gpus, q * sz, sz)
            i = n_prims
            has_preds[i] = False
            last_succ[i] = -1
            p_kind[i] = EXTEND
            p_stage[i] = s
            p_in[n_in_ref] = src
            n_in_ref += 1
            p_iptr[i + 1] = n_in_ref
            p_out[n_out_ref] = new
            n_out_ref += 1
            p_optr[i + 1] = n_out_ref
            if c >= 0:
                e_src[n_edges] = c
                e_dst[n_edges] = i
                n_edges += 1
                last_succ[c] = i
                has_preds[i] = True
            feed_next[i] = feed_head[src]
            feed_head[src] = i
            extend_prim[n_extend] = i
            n_extend += 1
            n_prims += 1
            at_uid[q] = new
            at_creator[q] = i
            aft_first[n_aft] = first_g
            aft_uid[n_aft] = src
            aft_c[n_aft] = c
            aft_first[n_aft + 1] = blk_gpus[q * sz]
            aft_uid[n_aft + 1] = new
            aft_c[n_aft + 1] = i
            n_aft += 2
        if anchor >= 0:
            x = sub_uid[anchor]
            i = n_prims
            has_preds[i] = False
            last_succ[i] = -1
            p_kind[i] = DESTROY
            p_stage[i] = s
            p_in[n_in_ref] = x
            n_in_ref += 1
            p_iptr[i + 1] = n_in_ref
            p_optr[i + 1] = n_out_ref
            c = sub_creator[anchor]
            if c >= 0 and last_succ[c] != i:
                e_src[n_edges] = c
                e_dst[n_edges] = i
                n_edges += 1
                last_succ[c] = i
                has_preds[i] = True
            f = feed_head[x]
            while f >= 0:
                if last_succ[f] != i:
                    e_src[n_edges] = f
                    e_dst[n_edges] = i
                    n_edges += 1
                    last_succ[f] = i
                    has_preds[i] = True
                f = feed_next[f]
            destroy_uid[n_destroy] = x
            destroy_prim[n_destroy] = i
            n_destroy += 1
            n_prims += 1
        # 4. Merge the sub-units of each target unit
        for j in range(tgt.shape[0]):
            b0, b1 = blk_of[j], blk_of[j + 1]
            if b1 - b0 == 1:
                final[n_final] = at_uid[b0]
                n_final += 1
                continue
            t = tgt[j]
            new = n_units
            n_units = _add_unit(
                units, n_units, MERGED, t, s, tp[t], pp[t], bpg[t], gpus, gptr[t], gptr[t + 1] - gptr[t]
            )
            i = n_prims
            has_preds[i] = False
            last_succ[i] = -1
            p_kind[i] = MERGE
            p_stage[i] = s
            for q in range(b0, b1):
                p_in[n_in_ref] = at_uid[q]
                n_in_ref += 1
            p_iptr[i + 1] = n_in_ref
            p_out[n_out_ref] = new
            n_out_ref += 1
            p_optr[i + 1] = n_out_ref
            for q in range(b0, b1):
                c = at_creator[q]
                if c >= 0 and last_succ[c] != i:
                    e_src[n_edges] = c
                    e_dst[n_edges] = i
                    n_edges += 1
                    last_succ[c] = i
                    has_preds[i] = True
            for q in range(b0, b1):
                f = feed_head[at_uid[q]]
                while f >= 0:
                    if last_succ[f] != i:
                        e_src[n_edges] = f
                        e_dst[n_edges] = i
                        n_edges += 1
                        last_succ[f] = i
                        has_preds[i] = True
                    f = feed_next[f]
            n_prims += 1
            final[n_final] = new
            n_final += 1
        for j in range(n_sub):
            x = sub_uid[j]
            for k in range(u_ptr[x], u_ptr[x + 1]):
                sub_at[u_gpus[k]] = -1
    # sort the edges by tail: each head's edges were added in turn, so a stable counting sort
    # by tail leaves the heads of one tail in increasing order
    tail_ptr = np.zeros(n_prims + 1, np.int64)
    for z in range(n_edges):
        tail_ptr[e_src[z] + 1] += 1
    for i in range(n_prims):
        tail_ptr[i + 1] += tail_ptr[i]
    es = np.empty(n_edges, np.int64)
    ed = np.empty(n_edges, np.int64)
    fill = tail_ptr[:-1].copy()
    for z in range(n_edges):
        q = fill[e_src[z]]
        es[q] = e_src[z]
        ed[q] = e_dst[z]
        fill[e_src[z]] += 1
    # ---- resource edges (reference: _Builder._resource_edges)
    n_res = 0
    status = 0
    n_pairs = 0  # at most one edge per (Destroy, Extend) sharing a GPU
    if n_destroy > 0 and n_extend > 0:
        by_ptr = np.zeros(n_gpus + 1, np.int64)
        for k in range(n_destroy):
            x = destroy_uid[k]
            for q in range(u_ptr[x], u_ptr[x + 1]):
                by_ptr[u_gpus[q] + 1] += 1
        for ei in range(n_extend):
            x = p_out[p_optr[extend_prim[ei]]]
            for q in range(u_ptr[x], u_ptr[x + 1]):
                n_pairs += by_ptr[u_gpus[q] + 1]
    r_src = np.empty(n_pairs, np.int64)
    r_dst = np.empty(n_pairs, np.int64)
    if n_pairs > 0:
        succ_ptr = tail_ptr  # the heads of i are ed[succ_ptr[i]:succ_ptr[i+1]]
        extra_head = -np.ones(n_prims, np.int64)
        extra_next = np.empty(r_src.shape[0], np.int64)
        extra_dst = np.empty(r_src.shape[0], np.int64)
        n_extra = 0
        destroyed = np.zeros(n_gpus, np.bool_)
        for k in range(n_destroy):
            x = destroy_uid[k]
            for q in range(u_ptr[x], u_ptr[x + 1]):
                destroyed[u_gpus[q]] = True
        for g in range(n_gpus):
            by_ptr[g + 1] += by_ptr[g]
        by = np.empty(by_ptr[n_gpus], np.int64)
        fill = by_ptr[:-1].copy()
        for k in range(n_destroy):
            x = destroy_uid[k]
            for q in range(u_ptr[x], u_ptr[x + 1]):
                g = u_gpus[q]
                by[fill[g]] = k
                fill[g] += 1
        dest = -np.ones(n_gpus, np.int64)
        mark = -np.ones(n_destroy, np.int64)
        stamp = -np.ones(n_prims, np.int64)
        stack = np.empty(n_prims + r_src.shape[0] + 1, np.int64)
        cand = np.empty(n_destroy, np.int64)  # the Destroys sharing a GPU with one Extend, sorted
        for ei in range(n_extend):
            if status:
                break
            e = extend_prim[ei]
            ms = p_stage[e]
            res = p_out[p_optr[e]]
            hit = False
            for q in range(u_ptr[res], u_ptr[res + 1]):
                dest[u_gpus[q]] = e
                if destroyed[u_gpus[q]]:
                    hit = True
            if not hit:
                continue
            n_cand = 0
            for q in range(u_ptr[res], u_ptr[res + 1]):
                g = u_gpus[q]
                for z in range(by_ptr[g], by_ptr[g + 1]):
                    k = by[z]
                    if mark[k] != e:
                        mark[k] = e
                        # insertion into the sorted candidates (a handful per Extend)
                        y = n_cand
                        while y > 0 and cand[y - 1] > k:
                            cand[y] = cand[y - 1]
                            y -= 1
                        cand[y] = k
                        n_cand += 1
            for ci in range(n_cand):
                k = cand[ci]
                x = destroy_uid[k]
                dsi = destroy_prim[k]
                other = u_stage[x]
                blocks = False
                for q in range(u_ptr[x], u_ptr[x + 1]):
                    g = u_gpus[q]
                    if dest[g] == e and (other == ms or (cur_own[other, g] and not tgt_own[other, g])):
                        blocks = True
                        break
                if not blocks:
                    continue
                if has_preds[dsi]:
                    # is dsi reachable from e over the state edges and the resource edges so far?
                    top = 0
                    stack[0] = e
                    stamp[e] = e * n_prims + dsi
                    top = 1
                    found = False
                    while top > 0:
                        top -= 1
                        v = stack[top]
                        if v == dsi:
                            found = True
                            break
                        for z in range(succ_ptr[v], succ_ptr[v + 1]):
                            w = ed[z]
                            if stamp[w] != e * n_prims + dsi:
                                stamp[w] = e * n_prims + dsi
                                stack[top] = w
                                top += 1
                        f = extra_head[v]
                        while f >= 0:
                            w = extra_dst[f]
                            if stamp[w] != e * n_prims + dsi:
                                stamp[w] = e * n_prims + dsi
                                stack[top] = w
                                top += 1
                            f = extra_next[f]
                    if found:
                        status = 2
                        break
                r_src[n_res] = dsi
                r_dst[n_res] = e
                n_res += 1
                extra_dst[n_extra] = e
                extra_next[n_extra] = extra_head[dsi]
                extra_head[dsi] = n_extra
                n_extra += 1
                has_preds[e] = True
    order = _order(r_src[:n_res] * max_prims + r_dst[:n_res])
    rs = r_src[:n_res][order]
    rd = r_dst[:n_res][order]
    # span of each primitive's link group: a Split's smallest enclosing group, an Extend's R ∪ R′
    p_lo = np.zeros(n_prims, np.int64)
    p_hi = np.zeros(n_prims, np.int64)
    for i in range(n_prims):
        x = p_in[p_iptr[i]]
        if p_kind[i] == SPLIT:
            y = p_out[p_optr[i]]
            ktp = u_tp[x] // u_tp[y]
            kpp = u_pp[x] // u_pp[y]
            lo = n_gpus
            hi = -1
            for p in range(kpp):
                for t in range(ktp):
                    g = u_gpus[u_ptr[x] + p * u_tp[x] + t]
                    lo = min(lo, g)
                    hi = max(hi, g)
            p_lo[i] = lo
            p_hi[i] = hi
        elif p_kind[i] == EXTEND:
            y = p_out[p_optr[i]]
            lo = u_gpus[u_ptr[x]]
            hi = lo
            for q in range(u_ptr[x], u_ptr[x + 1]):
                lo = min(lo, u_gpus[q])
                hi = max(hi, u_gpus[q])
            for q in range(u_ptr[y], u_ptr[y + 1]):
                lo = min(lo, u_gpus[q])
                hi = max(hi, u_gpus[q])
            p_lo[i] = lo
            p_hi[i] = hi
    # per GPU the bytes of the current and of the target collection, summed in collection order
    cur_bytes = np.zeros(n_gpus, np.float64)
    tgt_bytes = np.zeros(n_gpus, np.float64)
    held = np.zeros(n_gpus, np.bool_)
    for x in range(n_cur):
        for q in range(u_ptr[x], u_ptr[x + 1]):
            cur_bytes[u_gpus[q]] += u_bpg[x]
            held[u_gpus[q]] = True
    for z in range(n_final):
        x = final[z]
        for q in range(u_ptr[x], u_ptr[x + 1]):
            tgt_bytes[u_gpus[q]] += u_bpg[x]
            held[u_gpus[q]] = True
    return status, (
        u_origin[:n_units],
        u_src[:n_units],
        u_stage[:n_units],
        u_tp[:n_units],
        u_pp[:n_units],
        u_bpg[:n_units],
        u_ptr[: n_units + 1],
        u_gpus[: u_ptr[n_units]],
        p_kind[:n_prims],
        p_stage[:n_prims],
        p_iptr[: n_prims + 1],
        p_in[:n_in_ref],
        p_optr[: n_prims + 1],
        p_out[:n_out_ref],
        es,
        ed,
        rs,
        rd,
        final[:n_final],
        tgt_rows,
        p_lo,
        p_hi,
        cur_bytes,
        tgt_bytes,
        held,
    )


@njit(cache=True)
def build_from_vertices(n_stages, v_stage, v_dp, v_tp, v_pp, v_vp, v_state, v_gpus):
    """:func:`build` on the units of two plans given per vertex: rows ``0..n_stages−1`` are the
    current plan's vertices, the next ``n_stages`` the target's; vertex ``v`` has model-stage
    ``v_stage[v]`` (diff order), ``v_dp[v]`` replicas of layout ``v_tp[v]×v_pp[v]`` (``v_vp[v]``
    chunks per stage) holding
    ``v_state[v] = |θ|+|ω|`` bytes, and ``v_gpus`` holds every vertex's devices in turn (replica
    ``j`` of ``v`` takes the next ``tp·pp``). Returns :func:`build`'s status and tables and the
    units' model-stages."""
    n_rows = v_stage.shape[0]
    n_in = 0
    n_cur = 0
    for v in range(n_rows):
        n_in += v_dp[v]
        if v < n_stages:
            n_cur += v_dp[v]
    stage = np.empty(n_in, np.int64)
    tp = np.empty(n_in, np.int64)
    pp = np.empty(n_in, np.int64)
    vp = np.empty(n_in, np.int64)
    bpg = np.empty(n_in, np.float64)
    gptr = np.empty(n_in + 1, np.int64)
    gptr[0] = 0
    r = 0
    for v in range(n_rows):
        size = v_tp[v] * v_pp[v]
        b = v_state[v] / size  # (|θ| + |ω|)/(tp·pp), as EMU computes it
        for _ in range(v_dp[v]):
            stage[r] = v_stage[v]
            tp[r] = v_tp[v]
            pp[r] = v_pp[v]
            vp[r] = v_vp[v]
            bpg[r] = b
            gptr[r + 1] = gptr[r] + size
            r += 1
    sub_bpg = np.empty(n_stages, np.float64)  # a T_sub unit holds (|θ| + |ω|)/|T_sub|
    for v in range(n_stages):
        w = v + n_stages
        sub_bpg[v_stage[v]] = v_state[v] / (
            _gcd(v_tp[v], v_tp[w]) * _sub_pp(v_pp[v], v_pp[w], v_vp[v], v_vp[w])
        )
    status, t = build(n_stages, n_cur, stage, tp, pp, bpg, gptr, v_gpus, sub_bpg, vp)
    return status, t, stage, n_cur


@njit(cache=True)
def longest_path(n, src, dst, src2, dst2, dur):
    """``max_i EF_i`` with ``EF_i = d_i + max_{(j,i)} EF_j`` over the edges ``src → dst`` and
    ``src2 → dst2`` (any order), in a topological order found by Kahn's rule (0 for no
    primitive)."""
    tails = np.concatenate((src, src2))
    heads = np.concatenate((dst, dst2))
    ptr = np.zeros(n + 1, np.int64)
    indeg = np.zeros(n, np.int64)
    for e in range(tails.shape[0]):
        ptr[tails[e] + 1] += 1
        indeg[heads[e]] += 1
    for i in range(n):
        ptr[i + 1] += ptr[i]
    succ = np.empty(tails.shape[0], np.int64)
    fill = ptr[:-1].copy()
    for e in range(tails.shape[0]):
        succ[fill[tails[e]]] = heads[e]
        fill[tails[e]] += 1
    start = np.zeros(n, np.float64)  # max over predecessors of EF_j, 0 without one
    queue = np.empty(n, np.int64)
    head = 0
    tail = 0
    for i in range(n):
        if indeg[i] == 0:
            queue[tail] = i
            tail += 1
    best = 0.0
    while head < tail:
        i = queue[head]
        head += 1
        ef = dur[i] + start[i]
        best = max(best, ef)
        for z in range(ptr[i], ptr[i + 1]):
            j = succ[z]
            start[j] = max(start[j], ef)
            indeg[j] -= 1
            if indeg[j] == 0:
                queue[tail] = j
                tail += 1
    return best


@njit(cache=True)
def link_classes(p_kind, p_stage, p_lo, p_hi, n_stages, gpus_per_node, nodes_per_rack):
    """Per primitive its class ``(kind·n_stages + stage)·3 + tier``, the tier of its link group
    spanning GPUs ``p_lo..p_hi`` (0 one node, 1 one rack, 2 several racks, as
    :meth:`~rpeg.ir.cluster.Cluster.tier_of_mask`), and per class one primitive of it (−1 if none)."""
    n = p_kind.shape[0]
    code = np.empty(n, np.int64)
    example = -np.ones(4 * n_stages * 3, np.int64)
    for i in range(n):
        a = p_lo[i] // gpus_per_node
        b = p_hi[i] // gpus_per_node
        tier = 0 if a == b else (1 if a // nodes_per_rack == b // nodes_per_rack else 2)
        c = (p_kind[i] * n_stages + p_stage[i]) * 3 + tier
        code[i] = c
        if example[c] < 0:
            example[c] = i
    return code, example

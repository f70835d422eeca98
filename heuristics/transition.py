"""Greedy scheduling of a transition DAG and an independent schedule checker (SPEC §10, Nereus §6).

**Greedy list order** (the Nereus rule, event driven): at time ``t`` a primitive is *ready* when
its predecessors have ended; a ready primitive starts at ``t`` when none of its GPUs is busy
(every primitive holds its GPUs exclusively while it runs) and the units it creates fit in memory
on every GPU they occupy, ``usage_g(t) + |u|/|R_u| ≤ cap_g``. Ready primitives are tried in the
order

1. **release before acquire**: Destroys first;
2. **stage order** Gen → Inf → Train;
3. larger downstream rank ``rank_i = d_i + max_{(i,j)} rank_j`` (the critical path first);
4. index.

Then ``t`` advances to the next end. Memory only grows at a start and only shrinks at an end, so
checking at starts is enough. If nothing runs and no ready primitive fits, the transition is
infeasible under this order (:class:`~rpeg.ir.emu.TransitionInfeasible` names the primitive, the
GPU and who holds its memory). Memory is tracked only on GPUs where it can bind
(:func:`~rpeg.costmodel.transition.peak_possible` above ``cap_g``).

The list order is sorted once (:func:`priority_order`); a ready primitive that cannot start
waits on one GPU that blocks it and is tried again only after that GPU is released, so an event
costs what it changes rather than a rescan of every ready primitive
(:func:`greedy_schedule_reference`). :func:`greedy_schedule` runs the same steps in a
numba-compiled core on the index tables of a DAG from :func:`~rpeg.ir.emu.transition_dag`, with
the same schedules. numba compiles that core once per installation (seconds) and caches it on
disk; :func:`warm_up` loads or compiles it (after the DAG builder's,
:func:`rpeg.ir.emu.flat.warm_up`) in a background thread started by the first
:func:`greedy_schedule` of a process, and until it is done (:func:`ready`) the reference
schedules (same result), so planning a transition never waits for the compiler.

:func:`check_transition_schedule` re-derives every invariant from the data alone.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..costmodel.transition import GpuCapacities, peak_possible
from ..ir.emu import Destroy, Merge, Split, TransitionDAG, TransitionInfeasible, transition_dag
from ..ir.emu.flat import warm_up as _warm_up_builder
from ..ir.emu.flat import warm_up_pair
from ..ir.warmup import WarmUp

__all__ = [
    "TransitionSchedule",
    "check_transition_schedule",
    "downstream_ranks",
    "greedy_schedule",
    "greedy_schedule_reference",
    "priority_order",
    "ready",
    "warm_up",
]

_GIB = 2.0**30


@dataclass(frozen=True)
class TransitionSchedule:
    """Start and end of every primitive (same units as the durations it was built from)."""

    starts: tuple[float, ...]
    ends: tuple[float, ...]

    @cached_property
    def length(self) -> float:
        """``max_i E_i`` (0 for an empty DAG)."""
        return max(self.ends, default=0.0)

    def order(self) -> list[int]:
        """Primitive indices by start, then index."""
        return sorted(range(len(self.starts)), key=lambda i: (self.starts[i], i))


def downstream_ranks(dag: TransitionDAG, durations: Sequence[float]) -> list[float]:
    """``rank_i = d_i + max_{(i,j)} rank_j`` (the longest path from ``i`` to the end)."""
    rank = list(map(float, durations))
    succ = dag.successors
    for i in reversed(dag.topological_order):
        s = succ[i]
        rank[i] += max(map(rank.__getitem__, s)) if s else 0.0
    return rank


def priority_order(dag: TransitionDAG, rank: Sequence[float]) -> list[int]:
    """Primitive indices in the greedy list order (module docstring): Destroys first, then stage
    order, larger ``rank`` first, then index.

    Two stable sorts on C-level keys instead of one sort on per-primitive tuples: by ``−rank``
    (ties keep index order), then by the class ``(not Destroy, stage)``.
    """
    prims = dag.primitives
    # class of a primitive: (not Destroy, its stage's sort key), numbered in that order; stage
    # keys are looked up once per model-stage object (the units of one model-stage share it)
    stage_key: dict[int, tuple[int, int, str]] = {}
    raw = []
    for p in prims:
        ms = p.stage
        k = stage_key.get(id(ms))
        if k is None:
            k = stage_key[id(ms)] = ms.sort_key
        raw.append((not isinstance(p, Destroy), k))
    number = {c: r for r, c in enumerate(sorted(set(raw)))}
    cls = [number[c] for c in raw]
    neg = [-r for r in rank]
    order = sorted(range(len(prims)), key=neg.__getitem__)
    order.sort(key=cls.__getitem__)
    return order


def _memory_plan(dag: TransitionDAG, caps: Mapping[int, float]):
    """Per primitive, ``(gpu, bytes)`` added at its start and freed at its end on binding GPUs,
    and the initial usage there; ``None`` when no GPU can bind (then memory is never checked)."""
    peak = peak_possible(dag)
    binding = {g for g, b in peak.items() if b > caps.get(g, math.inf) * (1 + 1e-12)}
    if not binding:
        return None
    add: list[list[tuple[int, float]]] = []
    free: list[list[tuple[int, float]]] = []
    for p in dag.primitives:
        add.append([(g, u.bytes_per_gpu) for u in p.outputs for g in u.gpus if g in binding])
        free.append([(g, u.bytes_per_gpu) for u in p.consumed for g in u.gpus if g in binding])
    usage = dict.fromkeys(binding, 0.0)
    for u in dag.current:
        for g in u.gpus:
            if g in binding:
                usage[g] += u.bytes_per_gpu
    return add, free, usage


def greedy_schedule(
    dag: TransitionDAG, durations: Sequence[float], capacity: Mapping[int, float]
) -> TransitionSchedule:
    """Schedule ``dag`` by the greedy list order (module docstring).

    On a DAG that :func:`~rpeg.ir.emu.transition_dag` built (``dag.flat`` set) this runs
    :func:`greedy_schedule_reference`'s steps in a compiled core on the index tables, with the
    same result (``tests/heuristics/test_transition_fast.py`` checks it on random transitions);
    otherwise, and to raise :class:`~rpeg.ir.emu.TransitionInfeasible`, it runs the reference.
    Until the core is loaded in this process (:func:`ready`) it starts loading it in the
    background (:func:`warm_up`) and runs the reference.

    Parameters
    ----------
    dag
        The transition DAG.
    durations
        Per primitive, in any time unit (seconds, or integer ticks for the exact models).
    capacity
        ``cap_g`` per GPU in bytes (:func:`~rpeg.costmodel.transition.gpu_capacities`); a GPU
        not listed is unbounded.

    Returns
    -------
    TransitionSchedule

    Raises
    ------
    TransitionInfeasible
        When the order reaches a state where nothing runs and nothing ready fits in memory.
    ValueError
        When ``durations`` has the wrong length or a negative entry.
    """
    if not ready():
        warm_up()  # once per process, in the background; meanwhile the reference schedules
        return greedy_schedule_reference(dag, durations, capacity)
    if dag.flat is None:
        return greedy_schedule_reference(dag, durations, capacity)
    return _compiled_schedule(dag, durations, capacity)


def _compiled_schedule(
    dag: TransitionDAG, durations: Sequence[float], capacity: Mapping[int, float]
) -> TransitionSchedule:
    """:func:`greedy_schedule` in the compiled core on ``dag.flat`` (which must be set)."""
    from . import _transition_kernel as kernel

    flat = dag.flat
    assert flat is not None
    n = flat.n_prims
    if len(durations) != n:
        raise ValueError(f"durations has {len(durations)} entries for {n} primitives")
    dur = np.asarray(durations, dtype=np.float64)
    if isinstance(capacity, GpuCapacities):  # gpu_capacities' own: its arrays as they are
        gpus, caps = capacity.gpus, capacity.caps
    else:
        given = capacity or {}
        gpus = np.fromiter(given.keys(), np.int64, len(given))
        caps = np.fromiter(given.values(), np.float64, len(given))
    stage_class, n_keys = flat.stage_class
    status, starts, ends = kernel.schedule_tables(
        flat.n_gpus, flat.n_current, flat.p_kind, flat.p_stage, stage_class, n_keys,
        flat.p_iptr, flat.p_in, flat.p_optr, flat.p_out, flat.u_ptr, flat.u_gpus, flat.u_bpg,
        flat.edge_src, flat.edge_dst, flat.res_src, flat.res_dst, dur, gpus, caps,
    )  # fmt: skip
    if status == 2:
        raise ValueError(f"durations must be non-negative, got {min(durations)!r}")
    if status:
        return greedy_schedule_reference(dag, durations, capacity)  # raises TransitionInfeasible
    sched = TransitionSchedule(tuple(starts.tolist()), tuple(ends.tolist()))
    sched.__dict__["length"] = float(ends.max()) if n else 0.0  # the same maximum, read in C
    return sched


def greedy_schedule_reference(
    dag: TransitionDAG, durations: Sequence[float], capacity: Mapping[int, float]
) -> TransitionSchedule:
    """:func:`greedy_schedule` in pure Python on the DAG's objects (the reference its compiled
    core is tested against; same parameters, result and errors).

    Positions in :func:`priority_order` stand for the primitives. A ready primitive that cannot
    start waits on one GPU that blocks it (one of its busy GPUs, or one short of memory) and is
    tried again, in list order with the others, only once that GPU is released. Until then it
    cannot start (a busy GPU stays busy and usage only grows until a primitive on it ends), so
    skipping it changes nothing: the schedule is the one a rescan of every ready primitive at
    every event gives, in ``O((n + w) log n + e)`` for ``n`` primitives, ``e`` edges and ``w``
    wake-ups, plus one pass over every unit's GPUs to find those where memory can bind.

    Parameters
    ----------
    dag
        The transition DAG.
    durations
        Per primitive, in any time unit (seconds, or integer ticks for the exact models).
    capacity
        ``cap_g`` per GPU in bytes (:func:`~rpeg.costmodel.transition.gpu_capacities`); a GPU
        not listed is unbounded.

    Returns
    -------
    TransitionSchedule

    Raises
    ------
    TransitionInfeasible
        When the order reaches a state where nothing runs and nothing ready fits in memory.
    ValueError
        When ``durations`` has the wrong length or a negative entry.
    """
    n = len(dag.primitives)
    if len(durations) != n:
        raise ValueError(f"durations has {len(durations)} entries for {n} primitives")
    if any(not d >= 0 for d in durations):
        raise ValueError(f"durations must be non-negative, got {min(durations)!r}")
    order = priority_order(dag, downstream_ranks(dag, durations))
    pos = [0] * n
    for k, i in enumerate(order):
        pos[i] = k
    masks = [p.used_mask for p in dag.primitives]
    memory = _memory_plan(dag, capacity)
    add, free, usage = memory if memory is not None else ([], [], {})
    limit = {g: capacity[g] * (1 + 1e-12) for g in usage}
    indeg = [0] * n
    for _, j in dag.all_edges:
        indeg[j] += 1
    succ = dag.successors
    todo = [pos[i] for i in range(n) if indeg[i] == 0]  # positions to try at the current time
    on_busy: dict[int, list[int]] = {}  # GPU → positions waiting for it to be released
    waited = 0  # mask of the GPUs in on_busy
    on_memory: dict[int, list[int]] = {}  # binding GPU → positions waiting for memory there
    ending: dict[float, list[int]] = {}  # end time → running primitives
    times: list[float] = []  # heap of the keys of ending
    starts = [0.0] * n
    ends = [0.0] * n
    busy = 0
    t = 0.0
    done = 0
    while done < n:
        if todo:
            todo.sort()
            for k in todo:
                i = order[k]
                m = masks[i]
                hit = m & busy
                if hit:
                    g = hit.bit_length() - 1  # any busy GPU of it will do; the highest is cheapest
                    if g in on_busy:
                        on_busy[g].append(k)
                    else:
                        on_busy[g] = [k]
                        waited |= 1 << g
                    continue
                if usage and add[i]:
                    short = next((g for g, b in add[i] if usage[g] + b > limit[g]), None)
                    if short is not None:
                        on_memory.setdefault(short, []).append(k)
                        continue
                    for g, b in add[i]:
                        usage[g] += b
                busy |= m
                starts[i] = t
                e = ends[i] = t + durations[i]
                if e in ending:
                    ending[e].append(i)
                else:
                    ending[e] = [i]
                    heapq.heappush(times, e)
            todo = []
        if not times:
            _deadlock(dag, order[min(k for ks in on_memory.values() for k in ks)], add, usage, capacity)
        t = heapq.heappop(times)
        batch = ending.pop(t)
        batch.sort()  # the order a heap of (end, index) pops them: memory is freed in this order
        for i in batch:
            done += 1
            m = masks[i]
            busy ^= m  # m ⊆ busy: running primitives hold disjoint GPUs
            woken = m & waited
            if woken:
                waited ^= woken
                while woken:
                    g = woken.bit_length() - 1
                    todo += on_busy.pop(g)
                    woken ^= 1 << g
            if usage:
                for g, b in free[i]:
                    usage[g] -= b
                    if g in on_memory:
                        todo += on_memory.pop(g)
            for j in succ[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    todo.append(pos[j])
    return TransitionSchedule(tuple(starts), tuple(ends))


def _deadlock(dag: TransitionDAG, i: int, add, usage, capacity) -> None:
    p = dag.primitives[i]
    g, b = next((g, b) for g, b in add[i] if usage[g] + b > capacity[g] * (1 + 1e-12))
    holders = sorted({str(u.stage) for u in dag.units.values() if g in u.gpus})
    raise TransitionInfeasible(
        f"transition infeasible: {p.label()} (primitive {i}) needs {b / _GIB:.2f} GiB more on GPU {g}, where "
        f"{usage[g] / _GIB:.2f} of {capacity[g] / _GIB:.2f} GiB are held (units of {', '.join(holders)}) and "
        "nothing running can free them",
        stage=str(p.stage),
        blocking=", ".join(h for h in holders if h != str(p.stage)),
        gpus=[g],
    )


def check_transition_schedule(
    dag: TransitionDAG,
    starts: Sequence[float],
    ends: Sequence[float],
    capacity: Mapping[int, float],
    *,
    tol: float = 1e-9,
) -> list[str]:
    """Return every violated invariant of a schedule as a message (empty when valid).

    Shares no logic with the schedulers. Checks: one start and end per primitive, ``E_i ≥ S_i``;
    every edge ``S_j ≥ E_i``; **GPU exclusivity** (primitives sharing a GPU do not overlap);
    **ownership** (on every GPU, a unit of a model-stage that did not hold it before is resident
    only after every unit of a model-stage that gives it up is gone); **memory** (units resident
    on ``g`` — from the creator's start, or 0, to the consumer's end, or for ever — sum to at
    most ``cap_g`` at every instant); **no lost state** (every model-stage has a complete copy at
    every instant: a unit is complete from its creator's end to its consumer's start for a
    Destroy, its end for a Split or Merge); and that running the primitives in start order turns
    the current collection into the target one.
    """
    errors: list[str] = []
    n = len(dag.primitives)
    if len(starts) != n or len(ends) != n:
        return [f"{len(starts)} starts and {len(ends)} ends for {n} primitives"]
    for i in range(n):
        if not (starts[i] >= -tol and ends[i] >= starts[i] - tol):
            errors.append(f"primitive {i}: start {starts[i]} / end {ends[i]} invalid")
    for i, j in dag.all_edges:
        if starts[j] < ends[i] - tol:
            errors.append(f"edge {i}->{j}: start {starts[j]} < end {ends[i]}")
    # GPU exclusivity
    per_gpu: dict[int, list[int]] = {}
    for i, p in enumerate(dag.primitives):
        for g in p.gpus:
            per_gpu.setdefault(g, []).append(i)
    for g, users in per_gpu.items():
        users.sort(key=lambda i: (starts[i], ends[i]))
        for a, b in zip(users, users[1:]):
            if starts[b] < ends[a] - tol and ends[b] - starts[b] > tol and ends[a] - starts[a] > tol:
                errors.append(f"GPU {g}: primitives {a} and {b} overlap")
    # residency of every unit
    creator, consumer = dag.creator, dag.consumer
    res: dict[int, tuple[float, float]] = {}
    for uid in dag.units:
        a = starts[creator[uid]] if uid in creator else 0.0
        b = ends[consumer[uid]] if uid in consumer else math.inf
        res[uid] = (a, b)
    cur_owner: dict[int, set] = {}
    tgt_owner: dict[int, set] = {}
    for u in dag.current:
        for g in u.gpus:
            cur_owner.setdefault(g, set()).add(u.stage)
    for u in dag.target:
        for g in u.gpus:
            tgt_owner.setdefault(g, set()).add(u.stage)
    on_gpu: dict[int, list[int]] = {}
    for uid, u in dag.units.items():
        for g in u.gpus:
            on_gpu.setdefault(g, []).append(uid)
    for g, uids in on_gpu.items():
        before, after = cur_owner.get(g, set()), tgt_owner.get(g, set())
        leave = [uid for uid in uids if dag.units[uid].stage in before - after]
        arrive = [uid for uid in uids if dag.units[uid].stage in after - before]
        if leave and arrive:
            last_leave = max(res[uid][1] for uid in leave)
            first_arrive = min(res[uid][0] for uid in arrive)
            if first_arrive < last_leave - tol:
                errors.append(
                    f"GPU {g}: a unit of {dag.units[arrive[0]].stage} arrives at {first_arrive} before the "
                    f"leaving owner is gone at {last_leave}"
                )
        cap = capacity.get(g, math.inf)
        events = sorted({res[uid][0] for uid in uids})
        for t in events:
            load = sum(
                dag.units[uid].bytes_per_gpu
                for uid in uids
                if res[uid][0] <= t + tol and t < res[uid][1] - tol
            )
            if load > cap * (1 + 1e-9):
                errors.append(
                    f"GPU {g}: {load / _GIB:.3f} GiB resident at t={t} > capacity {cap / _GIB:.3f} GiB"
                )
                break
    # no lost state: complete copies cover [0, ∞) for every model-stage
    valid: dict[object, list[tuple[float, float]]] = {}
    for uid, u in dag.units.items():
        a = ends[creator[uid]] if uid in creator else 0.0
        if uid in consumer:
            c = dag.primitives[consumer[uid]]
            b = ends[consumer[uid]] if isinstance(c, (Split, Merge)) else starts[consumer[uid]]
        else:
            b = math.inf
        if b > a:
            valid.setdefault(u.stage, []).append((a, b))
    for ms in {u.stage for u in dag.current}:
        covered = 0.0
        for a, b in sorted(valid.get(ms, [])):
            if a > covered + tol:
                break
            covered = max(covered, b)
        if covered != math.inf:
            errors.append(f"{ms}: no complete copy of its state at t={covered}")
    topo = {i: k for k, i in enumerate(dag.topological_order)}
    try:
        final = dag.apply(sorted(range(n), key=lambda i: (starts[i], topo[i])))
    except ValueError as e:
        errors.append(f"executing in start order: {e}")
    else:
        if sorted(map(_key_str, final)) != sorted(map(_key_str, dag.target)):
            errors.append("executing the schedule does not yield the target collection")
    return errors


def _key_str(u) -> str:
    ms, tp, pp, gpus, vp = u.key()
    return f"{ms}|{tp}|{pp}|{vp}|{sorted(gpus)}"


# ---------------------------------------------------------------------------- warm-up
def _compile() -> bool:
    """The builder's warm-up, then :func:`_compiled_schedule` on a DAG of
    :func:`~rpeg.ir.emu.flat.warm_up_pair` built by :func:`~rpeg.ir.emu.transition_dag`: the real
    entry points, so the compiled specialisation (argument types and array layouts) is the one
    real calls use."""
    if not _warm_up_builder(wait=True):
        return False  # the builder's warm-up said why; without tables the compiled scheduler is unused
    dag = transition_dag(*warm_up_pair())
    if dag.flat is None:
        raise RuntimeError("the warm-up transition has no index tables")
    _compiled_schedule(dag, [1.0] * len(dag), {0: 1e12})
    return True


_WARM_UP = WarmUp(
    "rpeg-compile-transition-schedule",
    _compile,
    "the compiled transition scheduler",
    "transitions are scheduled by the pure-Python reference (same schedules, slower)",
)


def ready() -> bool:
    """Whether the compiled scheduler is loaded in this process (:func:`warm_up` has finished)."""
    return _WARM_UP.ready()


def warm_up(wait: bool = False) -> bool:
    """Load or compile the DAG builder's and the scheduler's kernels in a background thread,
    once per process (:class:`~rpeg.ir.warmup.WarmUp`).

    Parameters
    ----------
    wait
        Block until the thread has finished.

    Returns
    -------
    bool
        :func:`ready`. ``False`` after waiting means the kernels could not be compiled (a
        warning says why); :func:`greedy_schedule` then keeps the reference.
    """
    return _WARM_UP.start(wait)

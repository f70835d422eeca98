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

:func:`check_transition_schedule` re-derives every invariant from the data alone.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..costmodel.transition import peak_possible
from ..ir.emu import Destroy, Merge, Split, TransitionDAG, TransitionInfeasible

__all__ = ["TransitionSchedule", "check_transition_schedule", "downstream_ranks", "greedy_schedule"]

_GIB = 2.0**30


@dataclass(frozen=True)
class TransitionSchedule:
    """Start and end of every primitive (same units as the durations it was built from)."""

    starts: tuple[float, ...]
    ends: tuple[float, ...]

    @property
    def length(self) -> float:
        """``max_i E_i`` (0 for an empty DAG)."""
        return max(self.ends, default=0.0)

    def order(self) -> list[int]:
        """Primitive indices by start, then index."""
        return sorted(range(len(self.starts)), key=lambda i: (self.starts[i], i))


def downstream_ranks(dag: TransitionDAG, durations: Sequence[float]) -> list[float]:
    """``rank_i = d_i + max_{(i,j)} rank_j`` (the longest path from ``i`` to the end)."""
    rank = list(map(float, durations))
    for i in reversed(dag.topological_order):
        best = max((rank[j] for j in dag.successors[i]), default=0.0)
        rank[i] = float(durations[i]) + best
    return rank


def _memory_plan(dag: TransitionDAG, caps: Mapping[int, float]):
    """Per primitive, ``(gpu, bytes)`` added at its start and freed at its end on binding GPUs,
    and the initial usage there."""
    peak = peak_possible(dag)
    binding = {g for g, b in peak.items() if b > caps.get(g, math.inf) * (1 + 1e-12)}
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
    prims = dag.primitives
    rank = downstream_ranks(dag, durations)
    key = [(0 if isinstance(p, Destroy) else 1, p.stage.sort_key, -rank[i], i) for i, p in enumerate(prims)]
    masks = [p.used_mask for p in prims]
    add, free, usage = _memory_plan(dag, capacity)
    indeg = [len(ps) for ps in dag.predecessors]
    succ = dag.successors
    ready = sorted(key[i] for i in range(n) if indeg[i] == 0)
    running: list[tuple[float, int]] = []
    starts = [0.0] * n
    ends = [0.0] * n
    busy = 0
    t = 0.0
    done = 0
    while done < n:
        if ready:
            keep = []
            for k in ready:
                i = k[-1]
                if masks[i] & busy or not all(usage[g] + b <= capacity[g] * (1 + 1e-12) for g, b in add[i]):
                    keep.append(k)
                    continue
                for g, b in add[i]:
                    usage[g] += b
                busy |= masks[i]
                starts[i] = t
                ends[i] = t + durations[i]
                heapq.heappush(running, (ends[i], i))
            ready = keep
        if not running:
            _deadlock(dag, ready[0][-1], add, usage, capacity)
        t = running[0][0]
        newly = []
        while running and running[0][0] <= t:
            _, i = heapq.heappop(running)
            done += 1
            busy &= ~masks[i]
            for g, b in free[i]:
                usage[g] -= b
            for j in succ[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    newly.append(key[j])
        if newly:
            ready = sorted(ready + newly)
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
    ms, tp, pp, gpus = u.key()
    return f"{ms}|{tp}|{pp}|{sorted(gpus)}"

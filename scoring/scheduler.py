"""Greedy list scheduling of the executable DAG (SPEC §7).

OP nodes reserve their allocation, COMM/RESHARD nodes their destination allocation. Among nodes
whose predecessors are all scheduled, the one with the smallest earliest start

    EST(i) = max( max_{p ∈ pred(i)} finish(p),  max_{d ∈ devices(i)} free(d) )

starts next; ties go to COMM/RESHARD before OP, then the larger downstream rank
(``rank(i) = T(i) + max_{s ∈ succ(i)} rank(s)``; phase nodes inherit the rank of their first
phase), then RPEG vertex order, then step, then node id.

Speed: devices are never handled one by one. The distinct device masks of a lowered graph are
split into *atoms* (maximal device sets every mask either contains or misses), so a node's
device set is a handful of atoms however many GPUs it spans. Ready nodes sit in a heap keyed by
their EST when pushed; because free times only grow, a popped node whose EST has grown is pushed
back with the new key, and a popped node whose key is still exact is the true minimum.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from ..ir.lower import OP, ExecGraph

__all__ = ["Schedule", "atoms_of", "list_schedule"]


@dataclass
class Schedule:
    """Start and finish times of every node of an :class:`ExecGraph`.

    Attributes
    ----------
    start, finish
        Seconds per node id.
    makespan
        ``MS = max finish``.
    atoms
        Device masks of the atoms (see module docstring).
    atom_busy
        Busy seconds of each atom (identical for all its devices).
    blocker
        Per node, the node whose finish fixed its start (a predecessor or the previous user of
        one of its devices), ``-1`` if it started at 0; following it from the last node gives the
        critical path.
    """

    start: list[float]
    finish: list[float]
    makespan: float
    atoms: list[int]
    atom_busy: list[float]
    blocker: list[int]

    def busy_device_seconds(self) -> float:
        """``Σ_d busy(d)``."""
        return sum(b * m.bit_count() for b, m in zip(self.atom_busy, self.atoms))

    def critical_path(self) -> list[int]:
        """Node ids of the critical path, first to last."""
        if not self.finish:
            return []
        i = max(range(len(self.finish)), key=self.finish.__getitem__)
        path = []
        while i >= 0:
            path.append(i)
            i = self.blocker[i]
        return path[::-1]


def atoms_of(masks: set[int] | list[int]) -> list[int]:
    """Partition the union of ``masks`` into atoms: each atom lies inside or outside every mask.

    Refines ``{union}`` by each distinct mask: an atom ``a`` becomes ``a & m`` and ``a & ~m``.
    """
    atoms: list[int] = []
    for m in set(masks):
        if not m:
            continue
        rest = m
        nxt = []
        for a in atoms:
            inside = a & m
            if inside:
                nxt.append(inside)
                rest &= ~inside
                outside = a & ~m
                if outside:
                    nxt.append(outside)
            else:
                nxt.append(a)
        if rest:
            nxt.append(rest)
        atoms = nxt
    return sorted(atoms)


def list_schedule(g: ExecGraph, order: list[int] | None = None) -> Schedule:
    """Schedule ``g`` greedily (SPEC §7); node ids must be a topological order.

    Parameters
    ----------
    g
        The lowered graph with durations.
    order
        An activity list (every node id once): nodes are then scheduled in this order among
        those whose predecessors are scheduled — the serial schedule-generation scheme — each
        at its earliest start ``EST(i)`` (module docstring), no node jumping ahead of an earlier
        one. Listing the nodes by the start times of a schedule whose durations are at least
        ``g``'s (an exact model's, rounded up to its ticks) reproduces it or finishes earlier:
        by induction every node starts no later than there. ``None``: the EST-first rule.

    Returns
    -------
    Schedule
        Start/finish per node, makespan, per-atom busy time and the blocker of every node.

    Raises
    ------
    ValueError
        If ``order`` is not a permutation of the node ids, or the graph has a cycle.
    """
    n = len(g.kind)
    dur = g.duration
    preds = g.preds
    # atoms and each distinct mask's atom indices
    atoms = atoms_of(g.mask)
    mask_atoms: dict[int, tuple[int, ...]] = {}
    for m in set(g.mask):
        mask_atoms[m] = tuple(i for i, a in enumerate(atoms) if a & m)
    node_atoms = [mask_atoms[m] for m in g.mask]

    succs: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for i in range(n):
        p = preds[i]
        indeg[i] = len(p)
        for j in p:
            succs[j].append(i)

    rank = list(dur)
    for i in range(n - 1, -1, -1):
        s = succs[i]
        if s:
            rank[i] = dur[i] + max(rank[j] for j in s)
    first = g.first_phase
    for i in range(n):
        f = first[i]
        if f != i:
            rank[i] = rank[f]

    kind = g.kind
    vertex = g.vertex
    step = g.step
    # static part of the heap key: (kind priority, -rank, vertex order, step, id)
    ready_at = [0.0] * n
    why = [-1] * n  # predecessor with the latest finish so far
    free = [0.0] * len(atoms)
    last_user = [-1] * len(atoms)
    busy = [0.0] * len(atoms)
    start = [0.0] * n
    finish = [0.0] * n
    blocker = [-1] * n

    heap: list[tuple] = []
    push, pop = heapq.heappush, heapq.heappop
    position: list[int] | None = None
    if order is not None:
        position = [-1] * n
        for pos, i in enumerate(order):
            if not 0 <= i < n or position[i] >= 0:
                raise ValueError(f"order must list every node id 0..{n - 1} once; bad or repeated id {i!r}")
            position[i] = pos
        if len(order) != n:
            raise ValueError(f"order lists {len(order)} of the graph's {n} nodes")
    for i in range(n):
        if indeg[i] == 0:
            est = max([free[a] for a in node_atoms[i]], default=0.0)
            push(
                heap,
                (est, kind[i] == OP, -rank[i], vertex[i], step[i], i)
                if position is None
                else (position[i], i),
            )
    done = 0
    while heap:
        item = pop(heap)
        i = item[-1]
        t = ready_at[i]
        src = why[i]
        for a in node_atoms[i]:
            if free[a] > t:
                t = free[a]
                src = last_user[a]
        if position is None and t > item[0]:
            push(heap, (t, *item[1:]))
            continue
        f = t + dur[i]
        start[i] = t
        finish[i] = f
        blocker[i] = src
        done += 1
        d = dur[i]
        for a in node_atoms[i]:
            free[a] = f
            last_user[a] = i
            busy[a] += d
        for j in succs[i]:
            if f > ready_at[j]:
                ready_at[j] = f
                why[j] = i
            elif why[j] < 0:
                why[j] = i
            indeg[j] -= 1
            if indeg[j] == 0:
                t2 = ready_at[j]
                for a in node_atoms[j]:
                    if free[a] > t2:
                        t2 = free[a]
                push(
                    heap,
                    (t2, kind[j] == OP, -rank[j], vertex[j], step[j], j)
                    if position is None
                    else (position[j], j),
                )
    if done != n:
        raise ValueError(f"executable graph has a cycle: scheduled {done} of {n} nodes")
    makespan = max(finish, default=0.0)
    return Schedule(start, finish, makespan, atoms, busy, blocker)

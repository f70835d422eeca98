"""An independent check of a schedule: re-derives what the list scheduler must guarantee.

It shares no logic with :mod:`.scheduler` (no atoms, no heap): devices are expanded one by one
from the masks and every interval is compared directly.
"""

from __future__ import annotations

from ..ir.cluster import mask_devices
from ..ir.lower import ExecGraph
from .scheduler import Schedule

__all__ = ["check_schedule"]


def check_schedule(g: ExecGraph, s: Schedule, tol: float = 1e-9) -> list[str]:
    """Return the violations of ``s`` as messages (empty when the schedule is valid).

    Checks: ``finish = start + duration`` and ``start ≥ 0``; precedence
    ``start(i) ≥ finish(p)`` for every predecessor ``p``; device exclusivity (no two nodes that
    reserve one device overlap in time; zero-length nodes never conflict); ``MS = max finish``;
    the predecessor graph is acyclic.
    """
    errors: list[str] = []
    n = len(g.kind)
    if len(s.start) != n or len(s.finish) != n:
        return [f"schedule has {len(s.start)} starts and {len(s.finish)} finishes for {n} nodes"]
    scale = max([1.0, *s.finish])
    eps = tol * scale
    for i in range(n):
        if s.start[i] < -eps:
            errors.append(f"node {i} starts at {s.start[i]} < 0")
        if abs(s.finish[i] - s.start[i] - g.duration[i]) > eps:
            errors.append(f"node {i}: finish - start = {s.finish[i] - s.start[i]} ≠ duration {g.duration[i]}")
        for p in g.preds[i]:
            if not 0 <= p < n:
                errors.append(f"node {i} names unknown predecessor {p}")
            elif s.start[i] < s.finish[p] - eps:
                errors.append(
                    f"precedence: node {i} starts at {s.start[i]} before pred {p} finishes at {s.finish[p]}"
                )
    # acyclicity by Kahn's algorithm
    indeg = [len(p) for p in g.preds]
    succ: list[list[int]] = [[] for _ in range(n)]
    for i, ps in enumerate(g.preds):
        for p in ps:
            if 0 <= p < n:
                succ[p].append(i)
    stack = [i for i in range(n) if indeg[i] == 0]
    seen = 0
    while stack:
        i = stack.pop()
        seen += 1
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                stack.append(j)
    if seen != n:
        errors.append(f"predecessor graph has a cycle ({n - seen} nodes on or after it)")
    per_device: dict[int, list[tuple[float, float, int]]] = {}
    for i in range(n):
        if s.finish[i] - s.start[i] <= eps:
            continue
        for d in mask_devices(g.mask[i]):
            per_device.setdefault(d, []).append((s.start[i], s.finish[i], i))
    for d, items in sorted(per_device.items()):
        items.sort()
        for (_s0, f0, i0), (s1, _f1, i1) in zip(items, items[1:]):
            if s1 < f0 - eps:
                errors.append(f"device {d}: node {i1} starts at {s1} while node {i0} runs until {f0}")
    ms = max(s.finish, default=0.0)
    if abs(ms - s.makespan) > eps:
        errors.append(f"makespan {s.makespan} ≠ max finish {ms}")
    return errors

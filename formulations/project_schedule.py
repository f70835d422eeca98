"""Greedy list scheduling of a :class:`~rpeg.formulations.Project` and an independent checker.

The rule is the package's list scheduler (:mod:`.scheduler`, SPEC §7) adapted to cumulative
capacities and modes — a serial schedule-generation scheme:

1. **Modes.** Each activity takes its shortest mode that fits every capacity on its own (ties:
   the smaller relative non-renewable, then renewable demand, then the lower index). While a
   non-renewable budget is exceeded, the mode change that most reduces the total relative excess
   ``Σ_k max(0, use_k - R_k)/R_k`` is made, the smaller added duration breaking ties; if no change
   reduces it, the heuristic gives up (status ``UNKNOWN``).
2. **Ranks.** ``rank(i) = d_i + max_{(i,j,ℓ)} (ℓ + rank(j))`` (``d_i`` in the chosen mode): the
   downstream rank of SPEC §7 with lags.
3. **Scheduling.** Among activities whose predecessors are all scheduled, the one with the
   smallest earliest start

   ``EST(i) = min{ t ≥ max(0, max_{(p,i,ℓ)} S_p + d_p + ℓ) : u_k(τ) + r_ik ≤ R_k ∀k, ∀τ ∈ [t, t+d_i) }``

   (``u_k`` the usage profile so far) starts next at ``EST(i)``; ties go to the larger rank, then
   the lower index. As in :mod:`.scheduler`, the eligible activities sit in a heap keyed by their
   EST when pushed; usage only grows, so ESTs only grow, and a popped activity whose EST has
   grown is pushed back with the new key.

The heuristic proves nothing: its status is ``FEASIBLE`` (``UNKNOWN`` if step 1 fails) and its
lower bound is :meth:`Project.lower_bound`.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time

from .project import Project
from .status import ProjectSolution, Status

__all__ = ["check_project_schedule", "choose_modes", "fallback_schedule", "list_schedule_project"]


def _relative_excess(use: list[int], caps: list[int]) -> float:
    return sum(max(0, u - c) / max(c, 1) for u, c in zip(use, caps))


def choose_modes(project: Project) -> list[int] | None:
    """Step 1 of the module docstring: the shortest fitting modes, repaired for the
    non-renewable budgets. ``None`` when an activity has no fitting mode or the repair fails."""
    p = project
    acts = p.activities
    non = p.nonrenewable
    caps = [p.resources[k].capacity for k in non]

    def key(i: int, m: int) -> tuple:
        mode = acts[i].modes[m]
        rel_non = sum(mode.demands[k] / max(p.resources[k].capacity, 1) for k in non)
        rel_ren = sum(mode.demands[k] / max(p.resources[k].capacity, 1) for k in p.renewable)
        return (mode.duration, rel_non, rel_ren, m)

    modes = []
    for i in range(p.num_activities):
        usable = p.usable_modes[i]
        if not usable:
            return None
        modes.append(min(usable, key=lambda m, i=i: key(i, m)))
    if not non:
        return modes
    use = [sum(acts[i].modes[modes[i]].demands[k] for i in range(p.num_activities)) for k in non]
    excess = _relative_excess(use, caps)
    while excess > 0:
        best = None
        for i in range(p.num_activities):
            cur = acts[i].modes[modes[i]]
            for m in p.usable_modes[i]:
                if m == modes[i]:
                    continue
                new = acts[i].modes[m]
                trial = [u - cur.demands[k] + new.demands[k] for u, k in zip(use, non)]
                cand = (_relative_excess(trial, caps), new.duration - cur.duration, i, m)
                if best is None or cand < best[0]:
                    best = (cand, trial)
        if best is None or best[0][0] >= excess:
            return None
        (excess, _, i, m), use = best
        modes[i] = m
    return modes


def list_schedule_project(project: Project, modes: list[int] | None = None) -> ProjectSolution:
    """Schedule ``project`` greedily (module docstring).

    Parameters
    ----------
    project
        The instance.
    modes
        Fixed mode per activity (default: :func:`choose_modes`).

    Returns
    -------
    ProjectSolution
        ``solver="list"``, status ``FEASIBLE`` with the schedule, or ``UNKNOWN`` (makespan ``inf``)
        when no mode assignment meets the non-renewable budgets.

    Raises
    ------
    ValueError
        When a mode given in ``modes`` demands more than a renewable capacity on its own.

    Notes
    -----
    The usage profile is kept as a step function over the start and end times placed so far,
    so time and memory grow with the number of activities, not with the horizon.
    """
    t0 = time.perf_counter()
    p = project
    n = p.num_activities
    lb = p.lower_bound()
    if modes is None:
        modes = choose_modes(p)
    if modes is None:
        return ProjectSolution.without_schedule(
            Status.UNKNOWN, lower_bound=lb, runtime=time.perf_counter() - t0, solver="list"
        )
    acts = p.activities
    dur = [acts[i].modes[modes[i]].duration for i in range(n)]
    dem = [acts[i].modes[modes[i]].demands for i in range(n)]
    ren = [k for k in p.renewable if any(dem[i][k] for i in range(n))]
    cap = [p.resources[k].capacity for k in ren]

    rank = list(dur)
    for i in reversed(p.topological_order):
        for j, lag in p.successors[i]:
            rank[i] = max(rank[i], dur[i] + lag + rank[j])

    # The usage profile as a step function (no array over the horizon, whose length is the sum
    # of the durations): usage[r][s] holds on [times[s], times[s+1]), and on [times[-1], ∞) it
    # is 0, since every activity's end is a breakpoint.
    times = [0]
    usage: list[list[int]] = [[0] for _ in ren]

    def earliest(i: int, t: int) -> int:
        need = [(r, dem[i][k]) for r, k in enumerate(ren) if dem[i][k] > 0]
        if not need or dur[i] == 0:
            return t
        while True:
            # the last segment overlapping [t, t + d_i) where i does not fit: start after it
            clash = -1
            s = bisect.bisect_right(times, t) - 1
            while s < len(times) and times[s] < t + dur[i]:
                if any(usage[r][s] + d > cap[r] for r, d in need):
                    clash = s
                s += 1
            if clash < 0:
                return t
            if clash == len(times) - 1:  # the last segment has usage 0: i exceeds a capacity alone
                raise ValueError(
                    f"modes[{i}] = {modes[i]}: activity {i} demands more than a resource's capacity"
                )
            t = times[clash + 1]

    def breakpoint_at(t: int) -> int:
        """The index of the segment starting at ``t``, splitting the one that holds ``t``."""
        s = bisect.bisect_right(times, t) - 1
        if times[s] == t:
            return s
        times.insert(s + 1, t)
        for row in usage:
            row.insert(s + 1, row[s])
        return s + 1

    ready = [0] * n
    indeg = [len(p.predecessors[i]) for i in range(n)]
    start = [0] * n
    heap = [(earliest(i, 0), -rank[i], i) for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    done = 0
    while heap:
        est, neg_rank, i = heapq.heappop(heap)
        t = earliest(i, est)
        if t > est:
            heapq.heappush(heap, (t, neg_rank, i))
            continue
        start[i] = t
        done += 1
        if dur[i] and any(dem[i][k] for k in ren):
            first, last = breakpoint_at(t), breakpoint_at(t + dur[i])
            for r, k in enumerate(ren):
                for seg in range(first, last):
                    usage[r][seg] += dem[i][k]
        for j, lag in p.successors[i]:
            ready[j] = max(ready[j], t + dur[i] + lag)
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(heap, (earliest(j, ready[j]), -rank[j], j))
    assert done == n  # the project's precedences are acyclic by construction
    return ProjectSolution.from_schedule(
        p,
        start,
        modes,
        status=Status.FEASIBLE,
        lower_bound=lb,
        runtime=time.perf_counter() - t0,
        solver="list",
    )


def fallback_schedule(project: Project, hint: ProjectSolution | None = None) -> ProjectSolution | None:
    """The schedule an exact engine returns when it has nothing better (at a time limit, after
    Ctrl-C, or when its model is too large to build in time).

    Parameters
    ----------
    project
        The instance.
    hint
        A schedule given to the engine; used only if :func:`check_project_schedule` finds it
        valid.

    Returns
    -------
    ProjectSolution or None
        The shorter of the valid ``hint`` and the list schedule (:func:`list_schedule_project`,
        milliseconds), ``None`` when neither exists (the list scheduler cannot meet the
        non-renewable budgets and no valid hint was given).
    """
    best = list_schedule_project(project)
    if not best.has_schedule:
        best = None
    if hint is not None and hint.has_schedule and (best is None or hint.makespan < best.makespan):
        try:
            valid = check_project_schedule(project, hint) == []
        except (IndexError, TypeError):  # a hint of another project
            valid = False
        if valid:
            best = hint
    return best


def check_project_schedule(project: Project, solution: ProjectSolution) -> list[str]:
    """Return the violations of ``solution`` as messages (empty when it is valid).

    Shares no logic with the engines or the list scheduler. Checks, when the solution has a
    schedule: one start ``S_i ≥ 0`` (an integer) and one valid mode per activity; every
    precedence ``S_j ≥ S_i + d_{i m_i} + ℓ``; every renewable capacity at every instant
    ``t ∈ [0, C_max)``, ``Σ_{i: S_i ≤ t < S_i + d_i} r_ik ≤ R_k``; every non-renewable budget
    ``Σ_i r_{i m_i k} ≤ R_k``; ``makespan = max_i S_i + d_i``; ``lower_bound ≤ makespan``. Without a
    schedule: ``makespan = inf`` and no starts or modes.
    """
    errors: list[str] = []
    n = len(project.activities)
    if not math.isfinite(solution.makespan):
        if solution.starts or solution.modes:
            errors.append("makespan is inf but starts/modes are given")
        if solution.status in (Status.OPTIMAL, Status.FEASIBLE):
            errors.append(f"status {solution.status} without a schedule")
        return errors
    if len(solution.starts) != n or len(solution.modes) != n:
        return [f"{len(solution.starts)} starts and {len(solution.modes)} modes for {n} activities"]
    finish = []
    for i, (s, m) in enumerate(zip(solution.starts, solution.modes)):
        acts_modes = project.activities[i].modes
        if not isinstance(m, int) or not 0 <= m < len(acts_modes):
            errors.append(f"activity {i}: mode {m!r} is not one of its {len(acts_modes)} modes")
            return errors
        if not isinstance(s, int) or s < 0:
            errors.append(f"activity {i}: start {s!r} is not a non-negative integer")
        finish.append(s + acts_modes[m].duration)
    for i, j, lag in project.precedences:
        if solution.starts[j] < finish[i] + lag:
            errors.append(
                f"precedence ({i}, {j}, lag {lag}): start {solution.starts[j]} < finish {finish[i]} + {lag}"
            )
    end = max(finish, default=0)
    for k, res in enumerate(project.resources):
        demands = [project.activities[i].modes[solution.modes[i]].demands[k] for i in range(n)]
        if res.renewable:
            # the load only changes where an activity starts or ends: sweep those instants
            # (no loop over the horizon, which may be long)
            change: dict[int, int] = {}
            for i, d in enumerate(demands):
                if d and solution.starts[i] < finish[i]:
                    change[solution.starts[i]] = change.get(solution.starts[i], 0) + d
                    change[finish[i]] = change.get(finish[i], 0) - d
            load = 0
            for t in sorted(change):
                load += change[t]
                if load > res.capacity:
                    errors.append(
                        f"resource {k} ({res.name}): load {load} > capacity {res.capacity} at t={t}"
                    )
                    break
        elif sum(demands) > res.capacity:
            errors.append(f"resource {k} ({res.name}): total demand {sum(demands)} > budget {res.capacity}")
    if solution.makespan != end:
        errors.append(f"makespan {solution.makespan} ≠ max finish {end}")
    if solution.lower_bound > solution.makespan:
        errors.append(f"lower bound {solution.lower_bound} > makespan {solution.makespan}")
    return errors

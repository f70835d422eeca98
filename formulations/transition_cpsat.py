"""Exact scheduling of a transition DAG with CP-SAT, on the project-scheduling core (SPEC §9(b)).

The transition schedule is a resource-constrained project (:func:`transition_project`): one
single-mode activity per primitive with its duration in integer ticks, the DAG's edges as
finish-to-start precedences, and one **unary** resource per group of GPUs used by the same set of
primitives (a GPU is held exclusively by the primitive running on it; GPUs no primitive set tells
apart share one resource). :class:`~.cpsat.CPModel` builds that part. On top of it comes the
**memory** of every GPU where it can bind (:func:`memory_groups`), which is not a plain renewable
resource because a unit outlives the primitives that touch it:

    resident interval of unit ``u`` = ``[S_create(u), E_consume(u))`` (``S = 0`` for a current
    unit, ``E = H`` for a target unit),
    ``Cumulative({resident intervals of units on g}, ⌈|u|/|R_u|⌉, cap_g)`` per GPU group,

with bytes in KiB, demands rounded up and the capacity rounded up plus one KiB per unit, so a
schedule that fits in bytes also fits here (the model is looser than the bytes by at most that
slack). The objective is the project's makespan ``C``; the critical path (and the unary
resources' energy) bound it from below, and a greedy schedule enters as a hint.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..costmodel.transition import peak_possible
from ..ir.emu import TransitionDAG
from .cpsat import CPModel
from .project import Activity, Mode, Project, Resource
from .status import ProjectSolution, Status

__all__ = ["MemoryGroup", "memory_groups", "solve_transition_cpsat", "transition_project"]

KIB = 1024


@dataclass(frozen=True)
class MemoryGroup:
    """GPUs that hold the same units under the same capacity (one memory constraint for all).

    Attributes
    ----------
    gpus
        The GPUs (for messages).
    units
        ``(uid, KiB per GPU)`` of every unit ever resident on them, demand rounded up.
    capacity
        ``⌈cap_g/KiB⌉ + len(units)``.
    """

    gpus: tuple[int, ...]
    units: tuple[tuple[int, int], ...]
    capacity: int


def memory_groups(dag: TransitionDAG, capacity: Mapping[int, float]) -> list[MemoryGroup]:
    """The memory constraints that can bind: GPUs whose every-unit-at-once load exceeds
    ``cap_g``, grouped by (resident units, capacity)."""
    peak = peak_possible(dag)
    on: dict[int, list[int]] = {}
    for uid, u in dag.units.items():
        for g in u.gpus:
            on.setdefault(g, []).append(uid)
    groups: dict[tuple, list[int]] = {}
    for g, load in peak.items():
        cap = capacity.get(g, math.inf)
        if load <= cap * (1 + 1e-12):
            continue
        groups.setdefault((tuple(sorted(on[g])), cap), []).append(g)
    out = []
    for (uids, cap), gpus in sorted(groups.items(), key=lambda kv: min(kv[1])):
        units = tuple((uid, math.ceil(dag.units[uid].bytes_per_gpu / KIB)) for uid in uids)
        out.append(MemoryGroup(tuple(gpus), units, math.ceil(cap / KIB) + len(units)))
    return out


def transition_project(dag: TransitionDAG, ticks: Sequence[int], name: str = "transition") -> Project:
    """Primitives as activities, edges as precedences, one unary resource per GPU group (module
    docstring). Memory is not part of it (see :func:`memory_groups`).

    Raises
    ------
    ValueError
        If ``ticks`` has the wrong length or a negative or non-integer entry.
    """
    n = len(dag.primitives)
    if len(ticks) != n:
        raise ValueError(f"ticks has {len(ticks)} entries for {n} primitives")
    users: dict[int, list[int]] = {}
    for i, p in enumerate(dag.primitives):
        for g in p.gpus:
            users.setdefault(g, []).append(i)
    sets = sorted({tuple(u) for u in users.values() if len(u) > 1})
    resources = tuple(Resource(1, unary=True, name=f"gpus{k}") for k in range(len(sets)))
    member = [set(s) for s in sets]
    acts = tuple(
        Activity((Mode(int(ticks[i]), tuple(int(i in m) for m in member)),), dag.primitives[i].label())
        for i in range(n)
    )
    return Project(acts, resources, tuple((i, j, 0) for i, j in dag.all_edges), name)


def solve_transition_cpsat(
    dag: TransitionDAG,
    ticks: Sequence[int],
    capacity: Mapping[int, float],
    *,
    time_limit: float | None = None,
    seed: int = 0,
    threads: int | None = 1,
    hint: Sequence[int] | None = None,
) -> ProjectSolution:
    """Minimise the transition's schedule length with CP-SAT (module docstring).

    Parameters
    ----------
    dag
        The transition DAG.
    ticks
        Integer duration of every primitive.
    capacity
        ``cap_g`` per GPU in bytes.
    time_limit
        Wall-clock seconds for building and solving (``None``: until proven).
    seed, threads
        CP-SAT ``random_seed`` and ``num_workers``.
    hint
        Start tick of every primitive (e.g. the greedy schedule on the same ticks).

    Returns
    -------
    ProjectSolution
        Starts in ticks; ``status`` optimal / feasible / time_limit / infeasible; ``makespan`` and
        ``lower_bound`` in ticks (``inf`` makespan without a schedule).
    """
    project = transition_project(dag, ticks)
    m = CPModel(project)
    _add_memory(m, dag, memory_groups(dag, capacity))
    if hint is not None:
        m.add_hint(
            ProjectSolution.from_schedule(
                project,
                list(hint),
                [0] * len(hint),
                status=Status.FEASIBLE,
                lower_bound=0,
                runtime=0.0,
                solver="greedy",
            )
        )
    return m.solve(time_limit=time_limit, seed=seed, threads=threads)


def _add_memory(m: CPModel, dag: TransitionDAG, groups: list[MemoryGroup]) -> None:
    """Cumulative memory per group over the units' resident intervals."""
    if not groups:
        return
    model, v, H = m.model, m.vars, m.horizon
    creator, consumer = dag.creator, dag.consumer
    intervals = {}
    for g in groups:
        for uid, _ in g.units:
            if uid in intervals:
                continue
            a = v.start[creator[uid]] if uid in creator else 0
            b = v.end[consumer[uid]] if uid in consumer else H
            size = model.new_int_var(0, H, f"res{uid}")
            intervals[uid] = model.new_interval_var(a, size, b, f"unit{uid}")
    for g in groups:
        model.add_cumulative([intervals[uid] for uid, _ in g.units], [d for _, d in g.units], g.capacity)

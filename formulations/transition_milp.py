"""Exact scheduling of a transition DAG as a time-indexed MILP in Pyomo (HiGHS by default).

The precedences and the per-GPU exclusivity come from the project-scheduling core: the project
of :func:`~.transition_cpsat.transition_project` goes into :class:`~.milp.MILPModel` (pulse
variables ``x_it``: primitive ``i`` starts at tick ``t``; disaggregated precedences; one capacity
row per unary GPU group and tick). Added on top, for every memory group ``G`` of
:func:`~.transition_cpsat.memory_groups` and tick ``t < H``:

    ``Σ_{u on G} m_u · (Z_{create(u), t} − F_{consume(u), t}) ≤ cap_G``,

with ``Z_{i,t} = Σ_{τ ≤ t} x_iτ`` (``i`` started by ``t``; 1 for a current unit) and
``F_{i,t} = Σ_{τ + d_i ≤ t} x_iτ`` (``i`` finished by ``t``; 0 for a target unit): unit ``u`` is
resident during tick ``t`` iff its creator has started and its consumer has not finished.

The horizon ``H`` is the hint's length (the greedy schedule on the same ticks), which is also
the incumbent when the solver finds nothing better in time; memory demands are in KiB as in the
CP-SAT model, so both engines solve the same problem and agree on its optimum.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..ir.emu import TransitionDAG
from .deadline import BuildTimeout
from .milp import MILPModel
from .pyomo_backend import pyomo_environ, run_pyomo
from .status import ProjectSolution, Status
from .transition_cpsat import memory_groups, transition_project

__all__ = ["solve_transition_milp"]


def solve_transition_milp(
    dag: TransitionDAG,
    ticks: Sequence[int],
    capacity: Mapping[int, float],
    *,
    solver: str = "highs",
    time_limit: float | None = None,
    seed: int = 0,
    threads: int | None = 1,
    hint: Sequence[int] | None = None,
) -> ProjectSolution:
    """Minimise the transition's schedule length with the time-indexed MILP (module docstring).

    Parameters
    ----------
    dag
        The transition DAG.
    ticks
        Integer duration of every primitive.
    capacity
        ``cap_g`` per GPU in bytes.
    solver
        A Pyomo MILP solver name (``"highs"`` by default; see :data:`~.pyomo_backend.MILP_SOLVERS`).
    time_limit
        Wall-clock seconds for building and solving (``None``: until proven).
    seed, threads
        The solver's random seed and thread count.
    hint
        Start tick of every primitive of a feasible schedule; sets ``H``. Without one (or an
        invalid one) ``H`` is the serial horizon ``Σ d_i``.

    Returns
    -------
    ProjectSolution
        As :func:`~.transition_cpsat.solve_transition_cpsat`; ``solver="milp/<name>"``.

    Raises
    ------
    SolverUnavailableError
        If ``solver`` is not installed.
    """
    t0 = time.perf_counter()
    pyo = pyomo_environ()
    project = transition_project(dag, ticks)
    label = f"milp/{solver.lower()}"
    start = None
    if hint is not None:
        start = ProjectSolution.from_schedule(
            project,
            list(hint),
            [0] * len(hint),
            status=Status.FEASIBLE,
            lower_bound=0,
            runtime=0.0,
            solver="greedy",
        )
    horizon = int(start.makespan) if start is not None else project.trivial_horizon()
    mm = MILPModel(project, max(horizon, project.lower_bound()))
    _add_memory(pyo, mm, dag, ticks, capacity)
    if start is not None and not mm.set_values(start):
        start = None  # the hint breaks a constraint: it sets no incumbent
    deadline_left = None if time_limit is None else max(0.01, float(time_limit) - (time.perf_counter() - t0))
    try:
        status, bound, incumbent = run_pyomo(mm.model, solver, deadline_left, seed, threads, False)
    except BuildTimeout:  # no time left to hand the model to the solver: the hint, if any, stands
        status, bound, incumbent = Status.TIME_LIMIT, -math.inf, False
    runtime = time.perf_counter() - t0
    lb = max(float(project.lower_bound()), math.ceil(bound - 1e-6) if math.isfinite(bound) else -math.inf)
    if status in (Status.INFEASIBLE, Status.ERROR) and start is None:
        return ProjectSolution.without_schedule(status, lower_bound=lb, runtime=runtime, solver=label)
    starts: list[int] | None = None
    if incumbent and status not in (Status.INFEASIBLE, Status.ERROR):
        starts, _ = mm.schedule()
    if start is not None and (starts is None or start.makespan < project.makespan(starts, [0] * len(starts))):
        starts = list(start.starts)
        if status in (Status.INFEASIBLE, Status.ERROR):
            status = Status.FEASIBLE  # the hint satisfied every constraint of this model
    if starts is None:
        return ProjectSolution.without_schedule(status, lower_bound=lb, runtime=runtime, solver=label)
    ms = project.makespan(starts, [0] * len(starts))
    if ms <= lb:
        status = Status.OPTIMAL  # a schedule at a proven bound is optimal whatever the solver said
    elif status is Status.OPTIMAL:
        status = Status.FEASIBLE  # the proof does not cover the returned schedule
    return ProjectSolution.from_schedule(
        project, starts, [0] * len(starts), status=status, lower_bound=lb, runtime=runtime, solver=label
    )


def _add_memory(
    pyo: Any, mm: MILPModel, dag: TransitionDAG, ticks: Sequence[int], capacity: Mapping[int, float]
) -> None:
    groups = memory_groups(dag, capacity)
    mdl = mm.model
    mdl.memory = pyo.ConstraintList()
    if not groups:
        return
    H = mm.horizon
    x = mdl.x
    creator, consumer = dag.creator, dag.consumer

    def started_by(i: int, t: int) -> list:
        return [x[i, m, tau] for m, tau in mm.starts[i] if tau <= t]

    def finished_by(i: int, t: int) -> list:
        return [x[i, m, tau] for m, tau in mm.starts[i] if tau + ticks[i] <= t]

    for g in groups:
        for t in range(H):
            terms = []
            const = 0
            for uid, d in g.units:
                if uid in creator:
                    terms += [d * v for v in started_by(creator[uid], t)]
                else:
                    const += d
                if uid in consumer:
                    terms += [-d * v for v in finished_by(consumer[uid], t)]
            if terms:
                mdl.memory.add(sum(terms) + const <= g.capacity)

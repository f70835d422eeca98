"""CP-SAT model of a :class:`~.project.Project` (multi-mode RCPSP with lags), after the OR-Tools
``rcpsp_sat.py`` example.

Model (``H`` a horizon, ``ES_i`` and the tail ``q_i`` from :class:`~.project.Project`,
``M_i`` the usable modes of ``i``):

Variables
    ``S_i ∈ [ES_i, H - d_i^min - q_i]``, ``E_i ∈ [ES_i + d_i^min, H - q_i]``; for every usable mode a
    presence literal ``x_im`` and an optional interval ``I_im = [S_i, E_i)`` of size ``d_im``
    present iff ``x_im`` (one fixed interval when ``|M_i| = 1``); ``C ∈ [LB, H]``.
Constraints
    1. one mode: ``Σ_{m ∈ M_i} x_im = 1``;
    2. precedence: ``S_j ≥ E_i + ℓ`` for every ``(i, j, ℓ)``;
    3. renewable capacity: ``Cumulative({I_im : r_imk > 0} ∪ {[C, H)}, (r_imk, R_k), R_k)``; a
       unary resource: ``NoOverlap({I_im : r_imk = 1} ∪ {[C, H)})``. The tail ``[C, H)`` at full
       demand is redundant (``C ≥ E_i``) but lets the energy reasoning push ``C`` up (the
       example's "interval makespan"); a resource whose largest demands fit together is skipped;
    4. non-renewable budget: ``Σ_i Σ_m r_imk·x_im ≤ R_k``;
    5. makespan: ``C ≥ E_i`` for every ``i`` without a successor of lag ≥ 0 (the others are
       dominated by their successors).
Objective
    ``min C``; ``LB = max(critical path, resource energy)`` is the domain's lower end.

A heuristic solution enters as a hint (starts, ends, mode literals, ``C``); CP-SAT repairs or drops
a bad hint on its own, so the hint never changes the answer, only how fast it comes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from .project import Project
from .status import ProjectSolution, SolveStatus

__all__ = ["CPModel", "solve_cpsat"]

#: CP-SAT's native statuses (``CpSolver.StatusName``) mapped onto ours. ``FEASIBLE`` and
#: ``UNKNOWN`` become ``TIME_LIMIT`` when the wall time reached the limit.
_STATUS = {
    "OPTIMAL": SolveStatus.OPTIMAL,
    "FEASIBLE": SolveStatus.FEASIBLE,
    "INFEASIBLE": SolveStatus.INFEASIBLE,
    "UNKNOWN": SolveStatus.UNKNOWN,
    "MODEL_INVALID": SolveStatus.ERROR,
}


def _cp_model() -> Any:
    try:
        from ortools.sat.python import cp_model
    except ImportError as e:  # pragma: no cover - ortools is a base dependency
        raise ImportError("solve_cpsat needs OR-Tools CP-SAT: pip install ortools") from e
    return cp_model


@dataclass
class Variables:
    """The decision variables (see the module docstring)."""

    start: list[Any]
    end: list[Any]
    #: per activity, ``{mode: (presence literal, interval)}`` over its usable modes
    modes: list[dict[int, tuple[Any, Any]]]
    makespan: Any
    #: ``[C, H)``, added to every renewable resource at full demand
    makespan_interval: Any

    @classmethod
    def create(cls, model: Any, project: Project, horizon: int) -> Variables:
        es, q, dmin = project.earliest_starts, project.tails, project.min_durations
        start, end, modes = [], [], []
        for i, act in enumerate(project.activities):
            s = model.new_int_var(es[i], max(es[i], horizon - dmin[i] - q[i]), f"S{i}")
            e = model.new_int_var(es[i] + dmin[i], max(es[i] + dmin[i], horizon - q[i]), f"E{i}")
            usable = [m for m in project.usable_modes[i] if project.latest_start(i, m, horizon) >= es[i]]
            per: dict[int, tuple[Any, Any]] = {}
            for m in usable:
                d = act.modes[m].duration
                if len(usable) == 1:
                    lit = model.new_constant(1)
                    iv = model.new_interval_var(s, d, e, f"I{i}_{m}")
                else:
                    lit = model.new_bool_var(f"x{i}_{m}")
                    iv = model.new_optional_interval_var(s, d, e, lit, f"I{i}_{m}")
                per[m] = (lit, iv)
            start.append(s)
            end.append(e)
            modes.append(per)
        lb = min(project.lower_bound(), horizon)
        makespan = model.new_int_var(lb, max(lb, horizon), "C")
        tail = model.new_interval_var(makespan, model.new_int_var(0, horizon, "H-C"), horizon, "tail")
        return cls(start, end, modes, makespan, tail)


@dataclass
class Constraints:
    """Adds the constraints in the order of the module docstring."""

    model: Any
    project: Project
    vars: Variables
    _added: bool = field(default=False, repr=False)

    def add_all(self) -> None:
        if self._added:
            return
        self._one_mode()
        self._precedence()
        self._renewable()
        self._nonrenewable()
        self._makespan()
        self._added = True

    def _one_mode(self) -> None:
        for per in self.vars.modes:
            if len(per) != 1:  # a single usable mode is a constant-true literal already
                self.model.add_exactly_one([lit for lit, _ in per.values()])

    def _precedence(self) -> None:
        v = self.vars
        for i, j, lag in self.project.precedences:
            self.model.add(v.start[j] >= v.end[i] + lag)

    def _renewable(self) -> None:
        p, v = self.project, self.vars
        for k in p.renewable:
            res = p.resources[k]
            items = [
                (iv, p.activities[i].modes[m].demands[k])
                for i, per in enumerate(v.modes)
                for m, (_, iv) in per.items()
                if p.activities[i].modes[m].demands[k] > 0
            ]
            # the sum of each activity's largest demand within capacity: the resource never binds
            peak = sum(
                max((p.activities[i].modes[m].demands[k] for m in per), default=0)
                for i, per in enumerate(v.modes)
            )
            if not items or peak <= res.capacity:
                continue
            # the tail [C, H) holds the whole resource, so the energy reasoning of NoOverlap /
            # Cumulative also pushes the makespan up (the rcpsp_sat.py "interval makespan")
            tail = v.makespan_interval
            if res.unary:
                self.model.add_no_overlap([iv for iv, _ in items] + [tail])
            else:
                self.model.add_cumulative(
                    [iv for iv, _ in items] + [tail], [r for _, r in items] + [res.capacity], res.capacity
                )

    def _nonrenewable(self) -> None:
        p, v = self.project, self.vars
        for k in p.nonrenewable:
            terms = [
                p.activities[i].modes[m].demands[k] * lit
                for i, per in enumerate(v.modes)
                for m, (lit, _) in per.items()
                if p.activities[i].modes[m].demands[k] > 0
            ]
            if terms:
                self.model.add(sum(terms) <= p.resources[k].capacity)

    def _makespan(self) -> None:
        p, v = self.project, self.vars
        for i in range(p.num_activities):
            if not any(lag >= 0 for _, lag in p.successors[i]):
                self.model.add(v.makespan >= v.end[i])


class CPModel:
    """The CP-SAT model of ``project`` over horizon ``H`` (default :meth:`Project.trivial_horizon`).

    ``CPModel(project).solve(time_limit=10)`` is :func:`solve_cpsat` without the hint.
    """

    def __init__(self, project: Project, horizon: int | None = None) -> None:
        t0 = time.perf_counter()
        cp_model = _cp_model()
        self.project = project
        self.horizon = project.trivial_horizon() if horizon is None else int(horizon)
        self.model = cp_model.CpModel()
        self.vars = Variables.create(self.model, project, self.horizon)
        Constraints(self.model, project, self.vars).add_all()
        self.model.minimize(self.vars.makespan)
        self.build_time = time.perf_counter() - t0

    def add_hint(self, hint: ProjectSolution) -> bool:
        """Hint ``hint``'s schedule to CP-SAT; False (and nothing hinted) if it has none or the
        wrong length."""
        n = self.project.num_activities
        if not hint.has_schedule or len(hint.starts) != n or len(hint.modes) != n:
            return False
        v, acts = self.vars, self.project.activities
        for i, (s, m) in enumerate(zip(hint.starts, hint.modes)):
            self.model.add_hint(v.start[i], s)
            if 0 <= m < len(acts[i].modes):
                self.model.add_hint(v.end[i], s + acts[i].modes[m].duration)
            for mm, (lit, _) in v.modes[i].items():
                if len(v.modes[i]) > 1:
                    self.model.add_hint(lit, mm == m)
        self.model.add_hint(v.makespan, int(hint.makespan))
        return True

    def solve(
        self,
        *,
        time_limit: float | None = None,
        seed: int = 0,
        threads: int | None = None,
        log: bool = False,
    ) -> ProjectSolution:
        """Solve; see :func:`solve_cpsat` for the parameters."""
        cp_model = _cp_model()
        t0 = time.perf_counter()
        solver = cp_model.CpSolver()
        prm = solver.parameters
        if time_limit is not None:
            prm.max_time_in_seconds = max(0.0, float(time_limit) - self.build_time)
        prm.random_seed = int(seed)
        if threads is not None:
            prm.num_workers = int(threads)
        prm.log_search_progress = bool(log)
        code = solver.solve(self.model)
        runtime = self.build_time + (time.perf_counter() - t0)
        status = _STATUS.get(solver.status_name(code), SolveStatus.ERROR)
        hit_limit = time_limit is not None and solver.wall_time >= 0.98 * prm.max_time_in_seconds
        if status in (SolveStatus.FEASIBLE, SolveStatus.UNKNOWN) and hit_limit:
            status = SolveStatus.TIME_LIMIT
        name = "cpsat"
        lb0 = self.project.lower_bound()
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            bound = lb0 if status is not SolveStatus.ERROR else 0
            if status is SolveStatus.UNKNOWN or status is SolveStatus.TIME_LIMIT:
                bound = max(lb0, _ceil(solver.best_objective_bound))
            return ProjectSolution.without_schedule(status, lower_bound=bound, runtime=runtime, solver=name)
        v = self.vars
        starts = [solver.value(s) for s in v.start]
        modes = [next(m for m, (lit, _) in per.items() if solver.boolean_value(lit)) for per in v.modes]
        bound = max(lb0, _ceil(solver.best_objective_bound))
        return ProjectSolution.from_schedule(
            self.project, starts, modes, status=status, lower_bound=bound, runtime=runtime, solver=name
        )


def _ceil(x: float) -> int:
    """Integer objective, so a fractional bound rounds up (with a tolerance for float noise)."""
    return math.ceil(x - 1e-6)


def solve_cpsat(
    project: Project,
    *,
    time_limit: float | None = None,
    seed: int = 0,
    threads: int | None = None,
    hint: ProjectSolution | None = None,
    log: bool = False,
) -> ProjectSolution:
    """Minimise the makespan of ``project`` with CP-SAT (model in the module docstring).

    Parameters
    ----------
    project
        The instance.
    time_limit
        Wall-clock seconds for building and solving (``None``: until proven).
    seed
        CP-SAT ``random_seed``.
    threads
        CP-SAT ``num_workers`` (``None``: CP-SAT's default, all cores).
    hint
        A schedule to start from (e.g. the list scheduler's); only guides the search.
    log
        Print CP-SAT's search log.

    Returns
    -------
    ProjectSolution
        ``solver="cpsat"``; ``lower_bound`` is CP-SAT's best bound, never below the critical-path
        and energy bounds; ``makespan = inf`` when no schedule was found.
    """
    t0 = time.perf_counter()
    m = CPModel(project)
    if hint is not None:
        m.add_hint(hint)
    m.build_time = time.perf_counter() - t0
    return m.solve(time_limit=time_limit, seed=seed, threads=threads, log=log)

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
a bad hint on its own, so the hint never changes the answer, only how fast it comes. Without a
usable hint, :func:`solve_cpsat` hints the list schedule.

Time limits: :func:`solve_cpsat` turns ``time_limit`` into one :class:`~.deadline.Deadline` that
covers the list schedule, building (checked between constraint blocks) and the solve (CP-SAT
gets what is left). On the limit, or on Ctrl-C (:func:`~.cpsat_backend.run_cpsat` stops the search as if the
limit had been reached), the result has status ``time_limit``, the best schedule
found — never worse than the fallback, the better of a valid hint and the list schedule — and
CP-SAT's best bound; a model too large to build in time returns the fallback with a message.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from ..ir.errors import check_seed
from . import cpsat_backend
from .deadline import BuildTimeout, Deadline
from .project import Project
from .status import ProjectSolution, Status

__all__ = ["CPModel", "solve_cpsat"]


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
    def create(
        cls, model: Any, project: Project, horizon: int, deadline: Deadline | None = None
    ) -> Variables:
        es, q, dmin = project.earliest_starts, project.tails, project.min_durations
        start, end, modes = [], [], []
        tick = (deadline or Deadline()).ticker("creating the variables", every=64)
        for i, act in enumerate(project.activities):
            tick()
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
    deadline: Deadline | None = None
    _added: bool = field(default=False, repr=False)

    def add_all(self) -> None:
        """Add every block, checking the deadline between blocks (raises :class:`BuildTimeout`)."""
        if self._added:
            return
        d = self.deadline or Deadline()
        for name, block in (
            ("one mode", self._one_mode),
            ("precedence", self._precedence),
            ("renewable capacity", self._renewable),
            ("non-renewable budget", self._nonrenewable),
            ("makespan", self._makespan),
        ):
            d.check(f"adding the {name} constraints")
            block()
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

    ``CPModel(project).solve(time_limit=10)`` is :func:`solve_cpsat` without the hint and the
    fallback schedule.

    Parameters
    ----------
    project
        The instance.
    horizon
        ``H`` (default :meth:`Project.trivial_horizon`).
    deadline
        Building checks it between blocks and raises :class:`~.deadline.BuildTimeout` past it.
    """

    def __init__(
        self, project: Project, horizon: int | None = None, *, deadline: Deadline | None = None
    ) -> None:
        t0 = time.monotonic()
        cp_model = cpsat_backend.cp_model()
        self.project = project
        self.horizon = project.trivial_horizon() if horizon is None else int(horizon)
        self.model = cp_model.CpModel()
        self.vars = Variables.create(self.model, project, self.horizon, deadline)
        Constraints(self.model, project, self.vars, deadline).add_all()
        self.model.minimize(self.vars.makespan)
        self.build_time = time.monotonic() - t0

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
        deadline: Deadline | None = None,
    ) -> ProjectSolution:
        """Solve; see :func:`solve_cpsat` for the parameters.

        With ``deadline``, CP-SAT gets the time left on it (``time_limit`` is then ignored);
        otherwise ``time_limit`` less the build time. Ctrl-C stops the search
        (:func:`~.cpsat_backend.run_cpsat`) with status ``time_limit`` and the best schedule so far; the message
        says so.
        """
        t0 = time.monotonic()
        if deadline is not None and not deadline.unlimited:
            limit: float | None = deadline.remaining()
        elif time_limit is not None:
            limit = max(0.0, float(time_limit) - self.build_time)
        else:
            limit = None
        run = cpsat_backend.solve(self.model, time_limit=limit, seed=seed, threads=threads, log=log)
        solver, status = run.solver, run.status
        runtime = self.build_time + (time.monotonic() - t0)
        message = "interrupted (Ctrl-C); best schedule so far" if run.interrupted else ""
        name = "cpsat"
        lb0 = self.project.lower_bound()
        if not run.has_solution:
            bound = lb0 if status is not Status.ERROR else 0
            if status is Status.TIME_LIMIT:
                bound = max(lb0, _ceil(solver.best_objective_bound))
            return ProjectSolution.without_schedule(
                status, lower_bound=bound, runtime=runtime, solver=name, message=message
            )
        v = self.vars
        starts = [solver.value(s) for s in v.start]
        modes = [next(m for m, (lit, _) in per.items() if solver.boolean_value(lit)) for per in v.modes]
        bound = max(lb0, _ceil(solver.best_objective_bound))
        return ProjectSolution.from_schedule(
            self.project,
            starts,
            modes,
            status=status,
            lower_bound=bound,
            runtime=runtime,
            solver=name,
            message=message,
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
        Wall-clock seconds for everything: the list schedule, building and solving (``None``:
        until proven).
    seed
        CP-SAT ``random_seed``.
    threads
        CP-SAT ``num_workers`` (``None``: CP-SAT's default, all cores).
    hint
        A schedule to start from (e.g. the list scheduler's); only guides the search. Without
        one (or when it does not fit the project) the list schedule is hinted.
    log
        Print CP-SAT's search log.

    Returns
    -------
    ProjectSolution
        ``solver="cpsat"``; ``lower_bound`` is CP-SAT's best bound, never below the critical-path
        and energy bounds. At the time limit, after Ctrl-C, or when the model is too large to
        build in time: status ``TIME_LIMIT`` with the best schedule found, never worse than the
        fallback (the shorter of a valid ``hint`` and the list schedule), and a ``message`` when
        the fallback was returned or the search was interrupted. ``makespan = inf`` only when no
        schedule is known at all (e.g. non-renewable budgets the list scheduler cannot meet).
    """
    from .project_schedule import fallback_schedule

    seed = check_seed("seed", seed)  # OR-Tools' random_seed is 32-bit: a larger one is a TypeError there
    t0 = time.monotonic()
    deadline = Deadline(time_limit, start=t0)
    fallback = fallback_schedule(project, hint)
    lb0 = project.lower_bound()

    def fall_back(why: str, bound: float = lb0) -> ProjectSolution:
        runtime = time.monotonic() - t0
        if fallback is None:
            return ProjectSolution.without_schedule(
                Status.TIME_LIMIT, lower_bound=bound, runtime=runtime, solver="cpsat", message=why
            )
        return ProjectSolution.from_schedule(
            project,
            fallback.starts,
            fallback.modes,
            status=Status.TIME_LIMIT,
            lower_bound=max(bound, lb0),
            runtime=runtime,
            solver="cpsat",
            message=f"{why}; returned the {'list schedule' if fallback.solver == 'list' else 'hint'}",
        )

    try:
        m = CPModel(project, deadline=deadline)
        if not (hint is not None and m.add_hint(hint)) and fallback is not None:
            m.add_hint(fallback)
        m.build_time = time.monotonic() - t0
        sol = m.solve(seed=seed, threads=threads, log=log, deadline=deadline)
    except BuildTimeout as exc:
        return fall_back(str(exc))
    except KeyboardInterrupt:
        return fall_back("interrupted (Ctrl-C) while building the model")
    sol = sol.replace(runtime=time.monotonic() - t0)
    if (
        sol.status is Status.TIME_LIMIT
        and fallback is not None
        and (not sol.has_schedule or fallback.makespan < sol.makespan)
    ):
        why = sol.message.split(";")[0] if sol.message else f"no better schedule within {time_limit:g} s"
        return fall_back(why, sol.lower_bound)
    return sol

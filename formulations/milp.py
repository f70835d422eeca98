"""Time-indexed MILP of a :class:`~.project.Project` in Pyomo (Pritsker, Watters & Wolfe 1969,
with the disaggregated precedences of Christofides, Alvarez-Valdés & Tamarit 1987).

Why time-indexed rather than disjunctive: see ``docs/formulations.md`` (modes, cumulative
capacities and non-renewable budgets are all linear in the pulse variables, and its LP bound is
far stronger than a big-M disjunctive model's on PSPLIB-sized horizons).

Model (``H`` a horizon, ``ES_i`` and tail ``q_i`` from :class:`~.project.Project`,
``LS_im = H - d_im - q_i``, ``M_i`` the usable modes, ``T_im = {ES_i, …, LS_im}``):

Variables
    ``x_imt ∈ {0,1}``: activity ``i`` starts at ``t`` in mode ``m`` (``m ∈ M_i``, ``t ∈ T_im``);
    ``C ∈ [LB, H]`` integer. Then ``S_i = Σ_{m,t} t·x_imt``.
Constraints
    1. one start: ``Σ_{m,t} x_imt = 1``;
    2. precedence ``(i, j, ℓ)``, disaggregated: for every ``t`` in ``j``'s window,
       ``Σ_m Σ_{τ ≤ t} x_jmτ ≤ Σ_m Σ_{τ ≤ t - d_im - ℓ} x_imτ``
       (``j`` has started by ``t`` only if ``i`` finished by ``t - ℓ``), written with running
       sums ``Z_jt = Z_j,t-1 + Σ_m x_jmt`` and ``F_it = F_i,t-1 + Σ_m x_{i,m,t-d_im}`` as
       ``Z_jt ≤ F_{i,t-ℓ}`` (two terms a row instead of O(window); the same LP relaxation);
    3. renewable capacity: for every ``k`` and ``t < H``,
       ``Σ_{i,m} r_imk Σ_{τ = t-d_im+1}^{t} x_imτ ≤ R_k`` (skipped where it cannot bind);
    4. non-renewable budget: ``Σ_{i,m,t} r_imk·x_imt ≤ R_k``;
    5. makespan: ``C ≥ Σ_{m,t} (t + d_im)·x_imt`` for every ``i`` without a successor of lag ≥ 0.
Objective
    ``min C``. HiGHS stops at its default relative gap 1e-4, which on an integer makespan below
    10⁴ means the incumbent is proven optimal.

The horizon comes from a schedule: ``H`` = the hint's makespan (the number of variables grows
with ``H``, so this is where a hint pays most). The hint is first checked against every
constraint of the model built with that ``H``; without a hint, or when it violates one, the list
scheduler's schedule takes its place, and only if that fails too (non-renewable budgets it cannot
meet) does ``H`` fall back to :meth:`Project.trivial_horizon`. A bad hint costs time, never
correctness. The accepted schedule is returned when the solver ends with nothing better (e.g. at
the time limit), and is a MIP start for solvers that take one — but not for HiGHS, which with a
start can claim an optimum it does not return (see ``solve_milp``). As a guard for every solver,
an ``optimal`` claim whose returned schedule is longer than the solver's bound is downgraded to
``feasible``.

Time limits: :func:`solve_milp` turns ``time_limit`` into one :class:`~.deadline.Deadline` that
covers the list schedule, building the Pyomo model (checked inside the constraint loops), the
hint check, the transfer to the solver and the solve; HiGHS gets only what is left. The transfer
to HiGHS goes in chunks of rows, with the deadline checked between chunks; for the other solvers
Pyomo writes a file first, whose time is estimated from the build time and taken off the
solver's limit. A model too large to build (or transfer) in time returns the fallback — the
shorter of a valid hint and the list schedule — with status ``time_limit`` and a message. Ctrl-C
does the same: during building at once; during a HiGHS solve it cancels the solve (and lowers
HiGHS's time limit to zero, since its presolve does not poll the cancel flag), keeps HiGHS's
incumbent if it stops within a second, else abandons the run to finish in the background.

Size limit: the model grows with the horizon (variables and capacity rows per period), so before
building over a horizon :func:`solve_milp` estimates its size (:func:`model_size`); above
:data:`MAX_MODEL_SIZE` it builds nothing and returns the fallback schedule with status
``feasible`` (``unknown`` if there is none) and a message naming the size, the horizon and the
longest activity.

Solvers: ``"highs"`` (default) runs HiGHS through Pyomo's persistent ``appsi_highs`` interface
(time limit, seed, threads, MIP start, best bound); ``"cbc"``, ``"scip"``, ``"gurobi"``, ``"cplex"``,
``"glpk"`` and any other name ``pyomo.environ.SolverFactory`` knows go through Pyomo's legacy
interface. A solver that is not installed raises :class:`SolverUnavailableError` saying what to
install; an unknown name raises ``ValueError`` listing the known ones.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..ir.errors import check_seed
from . import pyomo_backend
from .deadline import BuildTimeout, Deadline, heap_frozen
from .project import Project
from .pyomo_backend import MILP_SOLVERS, SolverUnavailableError, pyomo_environ
from .status import ProjectSolution, Status

__all__ = [
    "MAX_MODEL_SIZE",
    "MILP_SOLVERS",
    "MILPModel",
    "SolverUnavailableError",
    "model_size",
    "solve_milp",
]

#: Largest time-indexed model :func:`solve_milp` builds, in the units of :func:`model_size` (j30
#: instances measure 10³–10⁵; Pyomo needs roughly 1 GB per 10⁶). A larger model is not built:
#: the fallback schedule is returned, with status ``feasible`` and a message saying why.
MAX_MODEL_SIZE = 2_000_000


class ModelTooLarge(Exception):
    """The time-indexed model over the chosen horizon exceeds :data:`MAX_MODEL_SIZE`;
    ``str()`` is the message for the user."""


def model_size(project: Project, horizon: int) -> int:
    """An upper estimate of the time-indexed model's size over ``horizon``, computed without
    building it: the start variables ``x_imt`` and their terms in the capacity rows
    (``Σ_{i,m} |T_im|·(1 + d_im·#{k renewable: r_imk > 0})``), the running sums (at most
    ``2·(max_m |T_im| + max_m d_im)`` per activity with precedences) and one capacity row per
    instant and renewable resource (``H·#renewable``).
    """
    p = project
    es = p.earliest_starts
    size = horizon * len(p.renewable)
    for i, act in enumerate(p.activities):
        widest = 0
        for m in p.usable_modes[i]:
            mode = act.modes[m]
            window = max(0, p.latest_start(i, m, horizon) - es[i] + 1)
            widest = max(widest, window)
            uses = sum(1 for k in p.renewable if mode.demands[k] > 0)
            size += window * (1 + min(mode.duration, horizon) * uses)
        if p.precedences:
            size += 2 * (widest + max(m.duration for m in act.modes))
    return size


def _label(project: Project, i: int) -> str:
    name = project.activities[i].name
    return f"activity {i}" + (f" ({name!r})" if name else "")


def _check_size(project: Project, horizon: int) -> None:
    """Raise :class:`ModelTooLarge` when :func:`model_size` exceeds :data:`MAX_MODEL_SIZE`."""
    size = model_size(project, horizon)
    if size > MAX_MODEL_SIZE:
        longest = max(
            range(project.num_activities), key=lambda i: max(m.duration for m in project.activities[i].modes)
        )
        d = max(m.duration for m in project.activities[longest].modes)
        raise ModelTooLarge(
            f"time-indexed model not built: over the horizon {horizon} it would have size {size:,} "
            f"(start variables and capacity terms), above MAX_MODEL_SIZE = {MAX_MODEL_SIZE:,}; the "
            f"longest activity is {_label(project, longest)} with duration {d}"
        )


# ---------------------------------------------------------------------------------------- model
@dataclass
class MILPModel:
    """The Pyomo model of ``project`` over horizon ``H`` (module docstring), with index maps.

    Attributes
    ----------
    model
        The ``ConcreteModel``: variables ``x[i, m, t]``, ``C`` and the running sums
        ``cum["Z" | "F", i, t]``; constraint lists ``one_mode``, ``running_sum``, ``precedence``,
        ``renewable``, ``nonrenewable``, ``makespan_def``; objective ``obj``.
    starts
        Per activity, its ``(m, t)`` pairs, the index of its ``x`` variables.
    deadline
        Checked between the blocks and inside their loops; past it, building raises
        :class:`~.deadline.BuildTimeout` (the model is then incomplete and must not be used).
    build_time
        Seconds spent building.
    """

    project: Project
    horizon: int
    model: Any = None
    starts: list[list[tuple[int, int]]] = field(default_factory=list)
    #: ``(cum key, has a predecessor, x terms)`` in recurrence order, to fill ``cum`` from ``x``
    _recurrence: list[tuple[tuple[str, int, int], bool, list[Any]]] = field(default_factory=list, repr=False)
    deadline: Deadline | None = field(default=None, repr=False)
    build_time: float = 0.0

    def __post_init__(self) -> None:
        t0 = time.monotonic()
        pyo = pyomo_environ()
        d = self.deadline or Deadline()
        self.model = pyo.ConcreteModel(name=self.project.name or "project")
        # order does not matter to the solver; this one follows the module docstring
        for name, block in (
            ("variables", self._add_variables),
            ("one-mode constraints", self._add_one_mode),
            ("precedence constraints", self._add_precedence),
            ("renewable capacity constraints", self._add_renewable),
            ("non-renewable budget constraints", self._add_nonrenewable),
            ("makespan constraints", self._add_makespan),
        ):
            d.check(f"building the {name}")
            self._tick = d.ticker(f"building the {name}")
            block(pyo)
        self.model.obj = pyo.Objective(expr=self.model.C, sense=pyo.minimize)
        self.build_time = time.monotonic() - t0

    def _add_variables(self, pyo: Any) -> None:
        p, H = self.project, self.horizon
        es = p.earliest_starts
        self.starts = [
            [(m, t) for m in p.usable_modes[i] for t in range(es[i], p.latest_start(i, m, H) + 1)]
            for i in range(p.num_activities)
        ]
        index = [(i, m, t) for i, st in enumerate(self.starts) for m, t in st]
        self.model.x = pyo.Var(index, within=pyo.Binary)
        lb = min(p.lower_bound(), H)
        self.model.C = pyo.Var(within=pyo.NonNegativeIntegers, bounds=(lb, max(lb, H)))

    def _add_one_mode(self, pyo: Any) -> None:
        x = self.model.x
        self.model.one_mode = pyo.ConstraintList()
        for i, st in enumerate(self.starts):
            # solve_milp answers "infeasible" before building when an activity has no usable mode
            if st:
                self.model.one_mode.add(sum(x[i, m, t] for m, t in st) == 1)

    def _add_precedence(self, pyo: Any) -> None:
        # The disaggregated precedences, written with two running sums per activity so that each
        # row has two terms instead of O(window): Z_jt = Σ_m Σ_{τ≤t} x_jmτ ("j started by t") and
        # F_it = Σ_m Σ_{τ≤t-d_im} x_imτ ("i finished by t"), both defined by recurrences
        # Z_jt = Z_j,t-1 + Σ_m x_jmt. The LP relaxation is the same as with the sums written out.
        p, mdl = self.project, self.model
        acts = p.activities
        mdl.precedence = pyo.ConstraintList()
        mdl.running_sum = pyo.ConstraintList()
        if not p.precedences:
            return
        started: dict[int, dict[int, list]] = {}
        finished: dict[int, dict[int, list]] = {}
        for i, st in enumerate(self.starts):
            self._tick()
            s_at: dict[int, list] = {}
            f_at: dict[int, list] = {}
            for m, t in st:
                s_at.setdefault(t, []).append(mdl.x[i, m, t])
                f_at.setdefault(t + acts[i].modes[m].duration, []).append(mdl.x[i, m, t])
            started[i], finished[i] = s_at, f_at
        index = []
        for kind, table in (("Z", started), ("F", finished)):
            for i, at in table.items():
                if at:
                    index += [(kind, i, t) for t in range(min(at), max(at) + 1)]
        mdl.cum = pyo.Var(index, bounds=(0, 1))
        cum = mdl.cum

        def running(kind: str, i: int, t: int) -> Any:
            """Z_it or F_it as a variable, or the constant 0 / 1 outside its window."""
            at = (started if kind == "Z" else finished)[i]
            if t < min(at):
                return 0
            if t >= max(at):
                return 1 if t > max(at) else cum[kind, i, t]
            return cum[kind, i, t]

        for kind, table in (("Z", started), ("F", finished)):
            for i, at in table.items():
                lo, hi = min(at), max(at)
                for t in range(lo, hi + 1):
                    self._tick()
                    prev = cum[kind, i, t - 1] if t > lo else 0
                    mdl.running_sum.add(cum[kind, i, t] == prev + sum(at.get(t, [])))
                    self._recurrence.append(((kind, i, t), t > lo, at.get(t, [])))
        for i, j, lag in p.precedences:
            if not self.starts[i] or not self.starts[j]:
                continue
            s_lo, s_hi = min(started[j]), max(started[j])
            f_hi = max(finished[i])
            for t in range(s_lo, s_hi + 1):
                self._tick()
                if t - lag > f_hi:
                    break  # i surely finished by t - ℓ from here on
                mdl.precedence.add(running("Z", j, t) <= running("F", i, t - lag))

    def _add_renewable(self, pyo: Any) -> None:
        p, x, H = self.project, self.model.x, self.horizon
        acts = p.activities
        self.model.renewable = pyo.ConstraintList()
        for k in p.renewable:
            cap = p.resources[k].capacity
            users = [
                (i, m, t, acts[i].modes[m].demands[k], acts[i].modes[m].duration)
                for i, st in enumerate(self.starts)
                for m, t in st
            ]
            users = [u for u in users if u[3] > 0 and u[4] > 0]
            # per time, the (demand, var) pairs of starts that make the activity run at t
            running: list[list[tuple[int, Any]]] = [[] for _ in range(H)]
            peak_by_t: list[dict[int, int]] = [{} for _ in range(H)]
            for i, m, t, r, d in users:
                self._tick()
                for tau in range(t, min(t + d, H)):
                    running[tau].append((r, x[i, m, t]))
                    peak_by_t[tau][i] = max(peak_by_t[tau].get(i, 0), r)
            for tau in range(H):
                self._tick()
                if sum(peak_by_t[tau].values()) <= cap:
                    continue  # cannot bind
                self.model.renewable.add(sum(r * v for r, v in running[tau]) <= cap)

    def _add_nonrenewable(self, pyo: Any) -> None:
        p, x = self.project, self.model.x
        acts = p.activities
        self.model.nonrenewable = pyo.ConstraintList()
        for k in p.nonrenewable:
            terms = [
                acts[i].modes[m].demands[k] * x[i, m, t]
                for i, st in enumerate(self.starts)
                for m, t in st
                if acts[i].modes[m].demands[k] > 0
            ]
            if terms:
                self.model.nonrenewable.add(sum(terms) <= p.resources[k].capacity)

    def _add_makespan(self, pyo: Any) -> None:
        p, x = self.project, self.model.x
        acts = p.activities
        self.model.makespan_def = pyo.ConstraintList()
        for i, st in enumerate(self.starts):
            if st and not any(lag >= 0 for _, lag in p.successors[i]):
                self.model.makespan_def.add(
                    sum((t + acts[i].modes[m].duration) * x[i, m, t] for m, t in st) <= self.model.C
                )

    # ------------------------------------------------------------------------------ hint
    def set_values(self, hint: ProjectSolution) -> bool:
        """Load ``hint`` into the variables and check it satisfies every constraint (tolerance
        1e-6); False, with the values cleared, if it does not or has no schedule.

        Raises
        ------
        BuildTimeout
            When the model's deadline passes during the check.
        """
        pyo = pyomo_environ()
        tick = (self.deadline or Deadline()).ticker("checking the hint against the model")
        p, mdl = self.project, self.model
        n = p.num_activities
        if not hint.has_schedule or len(hint.starts) != n or len(hint.modes) != n:
            return False
        chosen = set(zip(range(n), hint.modes, hint.starts))
        if any(key not in mdl.x for key in chosen):
            return False
        for key in mdl.x:
            mdl.x[key].set_value(1 if key in chosen else 0)
        mdl.C.set_value(int(hint.makespan))
        if self._recurrence:
            cum = mdl.cum
            for (kind, i, t), chained, terms in self._recurrence:
                prev = cum[kind, i, t - 1].value if chained else 0
                cum[kind, i, t].set_value(prev + sum(v.value for v in terms))
        ok = mdl.C.lb <= hint.makespan <= mdl.C.ub
        for c in mdl.component_data_objects(pyo.Constraint, active=True):
            if not ok:
                break
            tick()
            body = pyo.value(c.body)
            ok = (c.lower is None or body >= pyo.value(c.lower) - 1e-6) and (
                c.upper is None or body <= pyo.value(c.upper) + 1e-6
            )
        if not ok:
            for v in mdl.component_data_objects(pyo.Var):
                v.set_value(None)
        return ok

    def schedule(self) -> tuple[list[int], list[int]]:
        """Starts and modes read from the loaded ``x`` values (the largest per activity)."""
        x = self.model.x
        starts, modes = [], []
        for i, st in enumerate(self.starts):
            m, t = max(st, key=lambda mt: x[i, mt[0], mt[1]].value or 0.0)
            starts.append(t)
            modes.append(m)
        return starts, modes


# ---------------------------------------------------------------------------------------- solve
def _model_with_horizon(
    project: Project, hint: ProjectSolution | None, deadline: Deadline | None = None
) -> tuple[MILPModel, ProjectSolution | None]:
    """The model over the tightest horizon a valid schedule gives, and that schedule (loaded into
    the variables): ``hint`` if it satisfies the model, else the list scheduler's schedule, else
    the trivial horizon and ``None``.

    Raises
    ------
    BuildTimeout
        When ``deadline`` passes while building or checking.
    """
    trivial = project.trivial_horizon()

    def schedules() -> Iterator[ProjectSolution]:
        if hint is not None:
            yield hint
        # the variables grow with H: the list scheduler's makespan bounds it (a few ms)
        from .project_schedule import list_schedule_project

        yield list_schedule_project(project)

    for h in schedules():
        if h.has_schedule and h.makespan < trivial:
            _check_size(project, int(h.makespan))
            mm = MILPModel(project, int(h.makespan), deadline=deadline)
            if mm.set_values(h):
                return mm, h
    _check_size(project, trivial)
    return MILPModel(project, trivial, deadline=deadline), None


def solve_milp(
    project: Project,
    *,
    solver: str = "highs",
    time_limit: float | None = None,
    seed: int = 0,
    threads: int | None = None,
    hint: ProjectSolution | None = None,
) -> ProjectSolution:
    """Minimise the makespan of ``project`` with the time-indexed MILP (module docstring).

    Parameters
    ----------
    project
        The instance.
    solver
        ``"highs"`` (default, via ``appsi_highs``), ``"cbc"``, ``"scip"``, ``"gurobi"``,
        ``"cplex"``, ``"glpk"``, or any other ``pyomo.environ.SolverFactory`` name.
    time_limit
        Wall-clock seconds for everything: the list schedule, building the model, checking the
        hint, handing the model to the solver and solving (``None``: until proven).
    seed
        The solver's random seed (where it has one).
    threads
        The solver's thread count (``None``: its default). HiGHS keeps one thread pool per
        process, sized by its first run: later values are not passed on (a differing one makes
        HiGHS fail the run).
    hint
        A feasible schedule: its makespan becomes the horizon ``H``, it is the incumbent if the
        solver finds nothing better, and a MIP start for solvers other than HiGHS (module
        docstring). Without one, or when it violates the model, the list
        scheduler's schedule (:func:`rpeg.formulations.project_schedule.list_schedule_project`, a
        few milliseconds) takes its place.

    Returns
    -------
    ProjectSolution
        ``solver="milp/<name>"``. At the time limit, after Ctrl-C, or when the model is too large
        to build in time: status ``TIME_LIMIT`` with the best incumbent, never worse than the
        fallback (the shorter of a valid ``hint`` and the list schedule; ``makespan = inf`` only
        when neither exists), the solver's best bound, never below the critical-path and energy
        bounds, and a ``message`` when the fallback was returned for lack of time. When the model
        over the horizon would exceed :data:`MAX_MODEL_SIZE`: status ``FEASIBLE`` with the
        fallback (``UNKNOWN`` without one) and a message.

    Raises
    ------
    SolverUnavailableError
        ``solver`` is not installed (the message names it and what to install).
    """
    from .project_schedule import fallback_schedule

    seed = check_seed("seed", seed)  # OR-Tools' random_seed is 32-bit: a larger one is a TypeError there
    t0 = time.monotonic()
    deadline = Deadline(time_limit, start=t0)
    pyomo_backend.backend(solver)  # an unknown or missing solver fails before any work
    label = f"milp/{solver.lower()}"
    if not all(project.usable_modes):
        # some activity has no mode within the capacities: no schedule exists
        return ProjectSolution.without_schedule(
            Status.INFEASIBLE, lower_bound=math.inf, runtime=time.monotonic() - t0, solver=label
        )
    lb0 = float(project.lower_bound())
    fallback = fallback_schedule(project, hint)
    try:
        with heap_frozen():  # the build and the transfer to the solver (deadline.py)
            mm, start = _model_with_horizon(project, fallback if fallback is not None else hint, deadline)
            status, bound, incumbent = _run(mm, solver, start is not None, deadline, seed, threads)
    except BuildTimeout as exc:
        return _fall_back(project, fallback, str(exc), lb0, time.monotonic() - t0, label)
    except ModelTooLarge as exc:
        status = Status.FEASIBLE if fallback is not None else Status.UNKNOWN
        return _fall_back(project, fallback, str(exc), lb0, time.monotonic() - t0, label, status)
    except KeyboardInterrupt:
        why = "interrupted (Ctrl-C) before the solver had a schedule"
        return _fall_back(project, fallback, why, lb0, time.monotonic() - t0, label)
    lb = max(lb0, math.ceil(bound - 1e-6) if math.isfinite(bound) else -math.inf)
    return _outcome(project, mm, start, status, lb, incumbent, time.monotonic() - t0, label)


def _run(
    mm: MILPModel, solver: str, started: bool, deadline: Deadline, seed: int, threads: int | None
) -> tuple[Status, float, bool]:
    """Solve ``mm`` with ``solver`` (:func:`~.pyomo_backend.run_pyomo`); ``started``: the model's
    values hold the schedule that set the horizon (a MIP start, except for HiGHS)."""
    # No MIP start for HiGHS (under any Pyomo name): with one, HiGHS 1.16 can improve the
    # start's objective in its presolved space, report that value as optimal, and return the
    # start itself (j3010_5: "optimal" 41 with a schedule of makespan 42). The horizon keeps
    # the hint's value, and the hint stays the fallback incumbent (:func:`_outcome`).
    warm = started and "highs" not in pyomo_backend.backend(solver).pyomo_name
    x = mm.model.x
    return pyomo_backend.run_pyomo(
        mm.model,
        solver,
        deadline,
        seed,
        threads,
        warm,
        write_estimate=pyomo_backend.WRITE_PER_BUILD * mm.build_time,
        complete=lambda: all(x[key].value is not None for key in x),
    )


def _fall_back(
    project: Project,
    fallback: ProjectSolution | None,
    why: str,
    lb0: float,
    runtime: float,
    label: str,
    status: Status = Status.TIME_LIMIT,
) -> ProjectSolution:
    """``status`` with ``fallback``'s schedule (if any) and the message ``why``."""
    if fallback is None:
        return ProjectSolution.without_schedule(
            status, lower_bound=lb0, runtime=runtime, solver=label, message=why
        )
    what = "list schedule" if fallback.solver == "list" else "hint"
    return ProjectSolution.from_schedule(
        project,
        fallback.starts,
        fallback.modes,
        status=status,
        lower_bound=lb0,
        runtime=runtime,
        solver=label,
        message=f"{why}; returned the {what}",
    )


def _outcome(
    project: Project,
    mm: MILPModel,
    start: ProjectSolution | None,
    status: Status,
    lb: float,
    incumbent: bool,
    runtime: float,
    label: str,
) -> ProjectSolution:
    """The solution from the solver's ``status``, the bound ``lb`` and its incumbent (if
    ``incumbent``), or ``start`` (the schedule that set the horizon) when that is shorter."""
    if status is Status.INFEASIBLE and start is not None:
        # the horizon came from a schedule that satisfied every constraint: cannot happen
        status = Status.ERROR
    if status in (Status.INFEASIBLE, Status.ERROR):
        return ProjectSolution.without_schedule(status, lower_bound=lb, runtime=runtime, solver=label)
    if incumbent:
        starts, modes = mm.schedule()
    if start is not None and (not incumbent or start.makespan < project.makespan(starts, modes)):
        # the schedule that set the horizon is an incumbent too (e.g. at the time limit)
        starts, modes = list(start.starts), list(start.modes)
        if not incumbent and status is Status.UNKNOWN:
            status = Status.FEASIBLE  # a schedule without a proof, the solver stopped early
        incumbent = True
    if not incumbent:
        if status in (Status.OPTIMAL, Status.FEASIBLE):
            status = Status.ERROR  # the solver claims a schedule it did not return
        return ProjectSolution.without_schedule(status, lower_bound=lb, runtime=runtime, solver=label)
    if project.makespan(starts, modes) <= lb:
        # a schedule at a proven lower bound is optimal, whatever the solver said (e.g. HiGHS
        # answers "unknown" on a degenerate model such as a single zero-duration activity)
        status = Status.OPTIMAL
    if status is Status.OPTIMAL and project.makespan(starts, modes) > lb:
        # the solver's proof does not cover the schedule it returned: keep the schedule, not the claim
        status = Status.FEASIBLE
    return ProjectSolution.from_schedule(
        project,
        starts,
        modes,
        status=status,
        lower_bound=lb,
        runtime=runtime,
        solver=label,
        message="interrupted (Ctrl-C); best schedule so far" if pyomo_backend.last_run_interrupted() else "",
    )

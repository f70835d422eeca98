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

Solvers: ``"highs"`` (default) runs HiGHS through Pyomo's persistent ``appsi_highs`` interface
(time limit, seed, threads, MIP start, best bound); ``"cbc"``, ``"scip"``, ``"gurobi"``, ``"cplex"``,
``"glpk"`` and any other name ``pyomo.environ.SolverFactory`` knows go through Pyomo's legacy
interface. A solver that is not installed raises :class:`SolverUnavailableError` saying what to
install; an unknown name raises ``ValueError`` listing the known ones.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .deadline import BuildTimeout, Deadline
from .project import Project
from .status import ProjectSolution, Status

__all__ = ["MILP_SOLVERS", "MILPModel", "SolverUnavailableError", "solve_milp"]


class SolverUnavailableError(RuntimeError):
    """A MILP solver that is known but not installed (the message says what to install)."""


def _pyomo() -> Any:
    try:
        import pyomo.environ as pyo
    except ImportError as e:  # pragma: no cover - pyomo is a base dependency
        raise ImportError("solve_milp needs Pyomo: pip install pyomo") from e
    return pyo


@dataclass(frozen=True)
class _Backend:
    """How one named solver is reached through Pyomo."""

    pyomo_name: str
    install: str
    available: Callable[[], bool]
    #: solver option names for the time limit, the seed and the thread count (None: not set)
    time_key: str | None = None
    seed_key: str | None = None
    threads_key: str | None = None


def _has_module(name: str) -> Callable[[], bool]:
    return lambda: importlib.util.find_spec(name) is not None


def _has_exe(name: str) -> Callable[[], bool]:
    return lambda: shutil.which(name) is not None


def _scip_backend() -> _Backend:
    if importlib.util.find_spec("pyscipopt") is not None:
        return _Backend(
            "scip_direct",
            "pip install pyscipopt",
            _has_module("pyscipopt"),
            "limits/time",
            "randomization/randomseedshift",
        )
    return _Backend(
        "scip", "pip install pyscipopt (or put the scip executable on PATH)", _has_exe("scip"), "limits/time"
    )


#: Named MILP solvers and how to get them. Other names are passed to ``pyomo.environ.SolverFactory``.
MILP_SOLVERS: dict[str, Callable[[], _Backend]] = {
    "highs": lambda: _Backend("appsi_highs", "pip install highspy", _has_module("highspy")),
    "cbc": lambda: _Backend(
        "cbc",
        "put the cbc executable on PATH (apt-get install coinor-cbc, or conda install -c conda-forge coin-or-cbc)",
        _has_exe("cbc"),
        "sec",
        "randomCbcSeed",
        "threads",
    ),
    "scip": _scip_backend,
    "gurobi": lambda: _Backend(
        "gurobi_direct",
        "pip install gurobipy (and hold a Gurobi licence)",
        _has_module("gurobipy"),
        "TimeLimit",
        "Seed",
        "Threads",
    ),
    "cplex": lambda: _Backend(
        "cplex_direct",
        "pip install cplex (and hold a CPLEX licence)",
        _has_module("cplex"),
        "timelimit",
        "randomseed",
        "threads",
    ),
    "glpk": lambda: _Backend(
        "glpk", "put the glpsol executable on PATH (apt-get install glpk-utils)", _has_exe("glpsol"), "tmlim"
    ),
}


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
        pyo = _pyomo()
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
        pyo = _pyomo()
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
#: appsi termination conditions (by name) mapped onto ours; ``None``: decided by whether an
#: incumbent exists (FEASIBLE with one, UNKNOWN without).
_APPSI_STATUS: dict[str, Status | None] = {
    "optimal": Status.OPTIMAL,
    "maxTimeLimit": Status.TIME_LIMIT,
    "infeasible": Status.INFEASIBLE,
    # C and every x are bounded, so the model cannot be unbounded: "or unbounded" means infeasible
    "infeasibleOrUnbounded": Status.INFEASIBLE,
    "unbounded": Status.ERROR,
    "error": Status.ERROR,
    "licensingProblems": Status.ERROR,
    "maxIterations": None,
    "minStepLength": None,
    "objectiveLimit": None,
    "interrupted": None,
    "unknown": None,
}

#: Pyomo legacy ``TerminationCondition`` values (by name) mapped onto ours; ``None`` as above.
_LEGACY_STATUS: dict[str, Status | None] = {
    "optimal": Status.OPTIMAL,
    "globallyOptimal": Status.OPTIMAL,
    "maxTimeLimit": Status.TIME_LIMIT,
    "infeasible": Status.INFEASIBLE,
    "infeasibleOrUnbounded": Status.INFEASIBLE,
    "feasible": Status.FEASIBLE,
    "unbounded": Status.ERROR,
    "error": Status.ERROR,
    "solverFailure": Status.ERROR,
    "internalSolverError": Status.ERROR,
    "invalidProblem": Status.ERROR,
    "licensingProblems": Status.ERROR,
    "maxIterations": None,
    "maxEvaluations": None,
    "minStepLength": None,
    "userInterrupt": None,
    "resourceInterrupt": None,
    "intermediateNonInteger": None,
    "other": None,
    "unknown": None,
}


def _backend(name: str) -> _Backend:
    """The backend for ``name``.

    Raises
    ------
    SolverUnavailableError
        ``name`` is known here or to Pyomo but not installed.
    ValueError
        ``name`` is neither known here nor registered with ``pyomo.environ.SolverFactory``.
    """
    pyo = _pyomo()
    key = name.lower()
    if key in MILP_SOLVERS:
        b = MILP_SOLVERS[key]()
        if not b.available():
            raise SolverUnavailableError(f"MILP solver {name!r} is not available; to use it, {b.install}.")
        return b
    if key not in pyo.SolverFactory:
        raise ValueError(
            f"unknown MILP solver {name!r}: known names are {', '.join(sorted(MILP_SOLVERS))}, or any name "
            "registered with pyomo.environ.SolverFactory"
        )
    if not pyo.SolverFactory(key).available(exception_flag=False):
        raise SolverUnavailableError(
            f"MILP solver {name!r} is registered with Pyomo but not available; install it, or use "
            "'highs' (pip install highspy)."
        )
    return _Backend(key, "", lambda: True)


#: Extra HiGHS options applied on every ``"highs"`` solve (tuning hook; empty by default).
HIGHS_OPTIONS: dict[str, Any] = {}


#: Size the process-wide HiGHS thread pool was given on the first run (0: HiGHS's default).
_HIGHS_POOL: int | None = None


#: Rows handed to HiGHS per call while transferring a model (the deadline is checked between calls).
TRANSFER_CHUNK = 2000
#: Seconds a cancelled HiGHS run is given to stop after Ctrl-C before it is abandoned.
INTERRUPT_GRACE = 1.0
#: Pyomo's file writers (legacy solvers) take about this many seconds per second of model
#: building (LP writer on a 80k-row project model: 1.3 s after a 2.3 s build); the estimate is
#: taken off the solver's time limit and a model whose estimate does not fit is not written.
WRITE_PER_BUILD = 1.0

#: Abandoned HiGHS runs (their time limit set to zero); joined before the next run starts.
_ABANDONED: list[Any] = []
#: Whether Ctrl-C stopped the last HiGHS run (read with :func:`last_run_interrupted`).
_LAST_INTERRUPTED = False


def last_run_interrupted() -> bool:
    """Whether Ctrl-C stopped the last HiGHS run of this process (its status is then
    ``TIME_LIMIT`` and its incumbent, if any, is the best so far)."""
    return _LAST_INTERRUPTED


def _transfer(opt: Any, model: Any, deadline: Deadline) -> None:
    """``opt.set_instance(model)`` in chunks of :data:`TRANSFER_CHUNK` rows, so that the
    deadline holds while Pyomo hands the model to HiGHS (about as long as building it).

    Raises
    ------
    BuildTimeout
        Past the deadline (the solver object is then incomplete and must be dropped).
    """
    pyo = _pyomo()
    blocks = list(model.component_objects(pyo.Constraint, active=True, descend_into=True))
    rows = list(model.component_data_objects(pyo.Constraint, active=True, descend_into=True))
    for b in blocks:
        b.deactivate()
    try:
        opt.set_instance(model)  # the objective and its variables only
    finally:
        for b in blocks:
            b.activate()
    for i in range(0, len(rows), TRANSFER_CHUNK):
        deadline.check("transferring the model to HiGHS")
        opt.add_constraints(rows[i : i + TRANSFER_CHUNK])
    # every row is in: solve() must not rescan the model for changes (as long as the transfer again)
    uc = opt.update_config
    for key in (
        "check_for_new_or_removed_constraints",
        "check_for_new_or_removed_vars",
        "check_for_new_or_removed_params",
        "check_for_new_objective",
        "update_constraints",
        "update_vars",
        "update_params",
        "update_named_expressions",
        "update_objective",
    ):
        setattr(uc, key, False)


class _DropInterruptWarning(logging.Filter):
    """appsi warns of HiGHS's "interrupted" model status, which is ours (Ctrl-C): drop that."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "kInterrupt" not in record.getMessage()


def _interruptible(opt: Any) -> list[bool]:
    """Make Ctrl-C cancel ``opt``'s next HiGHS run: the run goes to highspy's solver thread and
    this thread waits for it. The first ``KeyboardInterrupt`` cancels the run and sets HiGHS's
    time limit to zero (its presolve does not poll the cancel flag, but does check the limit);
    if HiGHS has not stopped :data:`INTERRUPT_GRACE` seconds later, the run is abandoned (it stops
    on its own shortly; the next run waits for it) and ``KeyboardInterrupt`` propagates. The
    returned list becomes ``[True]`` once interrupted."""
    h = opt._solver_model
    flag: list[bool] = []

    def run() -> Any:
        thread = h.startSolve()
        give_up = math.inf
        while True:
            try:
                done, status = h.wait(0.05)
            except KeyboardInterrupt:
                if not flag:
                    flag.append(True)
                    h.cancelSolve()
                    # a benign race on one double, read by HiGHS at its next limit check
                    h.setOptionValue("time_limit", 0.0)
                    give_up = time.monotonic() + INTERRUPT_GRACE
                continue
            if done:
                return status
            if time.monotonic() > give_up:
                h.setOptionValue("output_flag", False)  # keep the abandoned run quiet
                _ABANDONED.append(thread)
                raise KeyboardInterrupt

    h.run = run  # appsi calls run(); highspy's solver thread calls the C++ run directly
    return flag


def _solve_appsi_highs(
    model: Any, deadline: Deadline | None, seed: int, threads: int | None, warm: bool
) -> tuple[Status, float, bool]:
    """Run HiGHS on a Pyomo ``model`` through appsi; returns (status, bound, loaded an incumbent).

    The transfer counts against ``deadline`` (:func:`_transfer`); HiGHS gets what is left. A run
    stopped by Ctrl-C ends with status ``TIME_LIMIT`` (:func:`_interruptible`).

    Raises
    ------
    BuildTimeout
        When the deadline passes during the transfer.
    KeyboardInterrupt
        When Ctrl-C came and HiGHS did not stop within :data:`INTERRUPT_GRACE` seconds.
    """
    from pyomo.contrib.appsi.solvers.highs import Highs

    global _HIGHS_POOL, _LAST_INTERRUPTED
    _LAST_INTERRUPTED = False
    deadline = Deadline.of(deadline)
    while _ABANDONED:
        _ABANDONED.pop().join()
    opt = Highs()
    opt.config.load_solution = False
    opt.config.stream_solver = False
    opt.config.warmstart = warm
    _transfer(opt, model, deadline)
    deadline.check("transferring the model to HiGHS")
    if not deadline.unlimited:
        opt.config.time_limit = max(0.01, deadline.remaining())
    options: dict[str, Any] = {"random_seed": int(seed)}
    if _HIGHS_POOL is None:
        # HiGHS sizes one process-wide thread pool on its first run, and a later run whose
        # ``threads`` differs from that size fails (appsi reports "unknown"): the first call's
        # value is the process's, later ones are not passed on
        if threads is not None:
            options["threads"] = int(threads)
        _HIGHS_POOL = int(threads) if threads is not None else 0
    options.update(HIGHS_OPTIONS)
    opt.highs_options = options
    interrupted = _interruptible(opt)
    quiet = _DropInterruptWarning()
    appsi_log = logging.getLogger("pyomo.contrib.appsi.solvers.highs")
    appsi_log.addFilter(quiet)
    try:
        res = opt.solve(model)
    finally:
        appsi_log.removeFilter(quiet)
        _LAST_INTERRUPTED = bool(interrupted)
    name = res.termination_condition.name
    incumbent = res.best_feasible_objective is not None and math.isfinite(res.best_feasible_objective)
    if incumbent:
        res.solution_loader.load_vars()
    status = _APPSI_STATUS.get(name)
    if interrupted and status not in (Status.OPTIMAL, Status.INFEASIBLE):
        status = Status.TIME_LIMIT
    if status is None:
        status = Status.FEASIBLE if incumbent else Status.UNKNOWN
    bound = res.best_objective_bound
    bound = -math.inf if bound is None else float(bound)
    return status, bound, incumbent


def _solve_legacy(
    model: Any,
    b: _Backend,
    deadline: Deadline | None,
    seed: int,
    threads: int | None,
    warm: bool,
    complete: Callable[[], bool] | None = None,
    write_estimate: float = 0.0,
) -> tuple[Status, float, bool]:
    """Run any solver on a Pyomo ``model`` through the legacy ``SolverFactory`` interface;
    ``complete`` double-checks that a loaded incumbent set every variable that matters.

    Pyomo writes the model to a file before the solver's clock starts: ``write_estimate``
    seconds are taken off the solver's time limit for it.

    Raises
    ------
    BuildTimeout
        When the deadline leaves no time for writing the model (by the estimate).
    """
    global _LAST_INTERRUPTED
    _LAST_INTERRUPTED = False
    pyo = _pyomo()
    deadline = Deadline.of(deadline)
    opt = pyo.SolverFactory(b.pyomo_name)
    kwargs: dict[str, Any] = {"load_solutions": False}
    if not deadline.unlimited:
        if deadline.remaining() <= write_estimate:
            raise BuildTimeout(deadline.seconds or 0.0, f"writing the model for {b.pyomo_name}")
        time_limit = deadline.remaining() - write_estimate
        if b.time_key is not None:
            opt.options[b.time_key] = max(0.01, time_limit)
        else:
            kwargs["timelimit"] = max(0.01, time_limit)
    if b.seed_key is not None:
        opt.options[b.seed_key] = int(seed)
    if threads is not None and b.threads_key is not None:
        opt.options[b.threads_key] = int(threads)
    if warm and hasattr(opt, "warm_start_capable") and opt.warm_start_capable():
        kwargs["warmstart"] = True
    res = opt.solve(model, **kwargs)
    tc = res.solver.termination_condition
    incumbent = len(res.solution) > 0
    if incumbent:
        model.solutions.load_from(res)
        if complete is not None:
            incumbent = complete()
    status = _LEGACY_STATUS.get(getattr(tc, "name", str(tc)))
    if status is None:
        status = Status.FEASIBLE if incumbent else Status.UNKNOWN
    bound = res.problem.lower_bound
    try:
        bound = float(bound)
    except (TypeError, ValueError):
        bound = -math.inf
    return status, bound, incumbent


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
            mm = MILPModel(project, int(h.makespan), deadline=deadline)
            if mm.set_values(h):
                return mm, h
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
        bounds, and a ``message`` when the fallback was returned for lack of time.

    Raises
    ------
    SolverUnavailableError
        ``solver`` is not installed (the message names it and what to install).
    """
    from .project_schedule import fallback_schedule

    t0 = time.monotonic()
    deadline = Deadline(time_limit, start=t0)
    backend = _backend(solver)
    label = f"milp/{solver.lower()}"
    if not all(project.usable_modes):
        # some activity has no mode within the capacities: no schedule exists
        return ProjectSolution.without_schedule(
            Status.INFEASIBLE, lower_bound=math.inf, runtime=time.monotonic() - t0, solver=label
        )
    lb0 = float(project.lower_bound())
    fallback = fallback_schedule(project, hint)

    def fall_back(why: str) -> ProjectSolution:
        runtime = time.monotonic() - t0
        if fallback is None:
            return ProjectSolution.without_schedule(
                Status.TIME_LIMIT, lower_bound=lb0, runtime=runtime, solver=label, message=why
            )
        what = "list schedule" if fallback.solver == "list" else "hint"
        return ProjectSolution.from_schedule(
            project,
            fallback.starts,
            fallback.modes,
            status=Status.TIME_LIMIT,
            lower_bound=lb0,
            runtime=runtime,
            solver=label,
            message=f"{why}; returned the {what}",
        )

    try:
        mm, start = _model_with_horizon(project, fallback if fallback is not None else hint, deadline)
        # No MIP start for HiGHS (under any Pyomo name): with one, HiGHS 1.16 can improve the
        # start's objective in its presolved space, report that value as optimal, and return the
        # start itself (j3010_5: "optimal" 41 with a schedule of makespan 42). The horizon keeps
        # the hint's value, and the hint stays the fallback incumbent below.
        warm = start is not None and "highs" not in backend.pyomo_name
        if backend.pyomo_name == "appsi_highs":
            status, bound, incumbent = _solve_appsi_highs(mm.model, deadline, seed, threads, warm)
        else:
            status, bound, incumbent = _solve_legacy(
                mm.model,
                backend,
                deadline,
                seed,
                threads,
                warm,
                complete=lambda: all(mm.model.x[key].value is not None for key in mm.model.x),
                write_estimate=WRITE_PER_BUILD * mm.build_time,
            )
    except BuildTimeout as exc:
        return fall_back(str(exc))
    except KeyboardInterrupt:
        return fall_back("interrupted (Ctrl-C) before the solver had a schedule")
    runtime = time.monotonic() - t0
    lb = max(lb0, math.ceil(bound - 1e-6) if math.isfinite(bound) else -math.inf)
    if status is Status.INFEASIBLE and start is not None:
        # the horizon came from a schedule that satisfied every constraint: cannot happen
        status = Status.ERROR
    if status in (Status.INFEASIBLE, Status.ERROR):
        return ProjectSolution.without_schedule(status, lower_bound=lb, runtime=runtime, solver=label)
    if incumbent:
        starts, modes = mm.schedule()
    if start is not None and (not incumbent or start.makespan < project.makespan(starts, modes)):
        # the schedule that set the horizon is an incumbent too (e.g. at the time limit)
        starts, modes, incumbent = list(start.starts), list(start.modes), True
    if not incumbent:
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
        message="interrupted (Ctrl-C); best schedule so far" if _LAST_INTERRUPTED else "",
    )

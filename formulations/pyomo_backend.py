"""The Pyomo engine: solving any Pyomo model with a named MILP solver, and mapping its status.

Every Pyomo model here (:mod:`.milp` for projects, :mod:`.plan_milp` for plans,
:mod:`.transition_milp` on top of the project model) is solved through :func:`run_pyomo`. This
module holds the solver registry (:data:`MILP_SOLVERS`, :func:`backend`) with its install hints,
the two ways of running a solver — HiGHS through Pyomo's persistent ``appsi_highs`` interface
(the model handed over in chunks with the deadline checked between them, Ctrl-C cancelling the
run) and anything else through ``SolverFactory`` (Pyomo writes a file first) — and the status
tables (:data:`APPSI_STATUS`, :data:`LEGACY_STATUS`) that map each interface's native
termination condition onto :class:`~.status.Status`, once, in :func:`map_status`.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .deadline import BuildTimeout, Deadline
from .status import Status

__all__ = [
    "APPSI_STATUS",
    "HIGHS_OPTIONS",
    "LEGACY_STATUS",
    "MILP_SOLVERS",
    "WRITE_PER_BUILD",
    "SolverUnavailableError",
    "backend",
    "last_run_interrupted",
    "map_status",
    "pyomo_environ",
    "run_pyomo",
]


class SolverUnavailableError(RuntimeError):
    """A MILP solver that is known but not installed (the message says what to install)."""


def pyomo_environ() -> Any:
    """``pyomo.environ``, imported on first use (raises ``ImportError`` saying what to install)."""
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


#: appsi termination conditions (by name) mapped onto ours; ``None``: decided by whether an
#: incumbent exists (FEASIBLE with one, UNKNOWN without).
APPSI_STATUS: dict[str, Status | None] = {
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
LEGACY_STATUS: dict[str, Status | None] = {
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
    "locallyOptimal": None,  # no global proof (a nonlinear solver's verdict)
    "minFunctionValue": None,
    "noSolution": None,
    "other": None,
    "unknown": None,
}


def map_status(
    table: Mapping[str, Status | None], name: str, *, incumbent: bool, interrupted: bool = False
) -> Status:
    """A solver's termination condition ``name`` as a :class:`~.status.Status`.

    Parameters
    ----------
    table
        :data:`APPSI_STATUS` or :data:`LEGACY_STATUS`.
    name
        The termination condition's name.
    incumbent
        Whether the solver returned a solution.
    interrupted
        Whether Ctrl-C stopped the run.

    Returns
    -------
    Status
        ``table[name]``; where that is ``None`` (or ``name`` is not in the table), ``FEASIBLE``
        with an incumbent and ``UNKNOWN`` without. After Ctrl-C, anything but a proof
        (``OPTIMAL``, ``INFEASIBLE``) is ``TIME_LIMIT``, the best solution so far attached.
    """
    status = table.get(name)
    if interrupted and status not in (Status.OPTIMAL, Status.INFEASIBLE):
        return Status.TIME_LIMIT
    if status is None:
        return Status.FEASIBLE if incumbent else Status.UNKNOWN
    return status


def backend(name: str) -> _Backend:
    """The backend for ``name``.

    Raises
    ------
    SolverUnavailableError
        ``name`` is known here or to Pyomo but not installed.
    ValueError
        ``name`` is neither known here nor registered with ``pyomo.environ.SolverFactory``.
    """
    pyo = pyomo_environ()
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
    pyo = pyomo_environ()
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
    status = map_status(APPSI_STATUS, name, incumbent=incumbent, interrupted=bool(interrupted))
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
    pyo = pyomo_environ()
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
    status = map_status(LEGACY_STATUS, getattr(tc, "name", str(tc)), incumbent=incumbent)
    bound = res.problem.lower_bound
    try:
        bound = float(bound)
    except (TypeError, ValueError):
        bound = -math.inf
    return status, bound, incumbent


def run_pyomo(
    model: Any,
    solver: str,
    time_limit: float | Deadline | None,
    seed: int,
    threads: int | None,
    warm: bool,
    *,
    write_estimate: float = 0.0,
    complete: Callable[[], bool] | None = None,
) -> tuple[Status, float, bool]:
    """Solve ``model`` with ``solver`` (``"highs"`` via appsi, or any Pyomo solver name).

    Parameters
    ----------
    model
        A Pyomo model with one objective.
    solver
        ``"highs"`` or another name :func:`~.milp.solve_milp` accepts.
    time_limit
        Seconds from now, or the caller's :class:`~.deadline.Deadline` (``None``: unlimited).
        The transfer to HiGHS counts against it; for file-based solvers ``write_estimate``
        seconds are set aside for Pyomo's writer.
    seed, threads, warm
        The solver's random seed, thread count and whether the model's values are a MIP start.
    write_estimate
        Seconds the legacy path expects Pyomo's writer to take.
    complete
        For the legacy path: whether a loaded incumbent set every variable that matters (else
        it does not count as one).

    Returns
    -------
    tuple
        ``(status, best bound, whether an incumbent was loaded into the model's variables)``;
        the status is mapped once, by :func:`map_status`. After Ctrl-C,
        :func:`last_run_interrupted` is true.

    Raises
    ------
    SolverUnavailableError
        When the solver is known but not installed (the message says what to install).
    ValueError
        For an unknown solver name.
    BuildTimeout
        When the time runs out while the model is handed to the solver.
    """
    b = backend(solver)
    deadline = Deadline.of(time_limit)
    if b.pyomo_name == "appsi_highs":
        return _solve_appsi_highs(model, deadline, seed, threads, warm)
    return _solve_legacy(model, b, deadline, seed, threads, warm, complete, write_estimate)

"""Running OR-Tools CP-SAT: the one place its parameters are set and its statuses are mapped.

Every CP-SAT model here (:mod:`.cpsat` for projects, :mod:`.plan_cpsat` for plans,
:mod:`.transition_cpsat` on top of the project model, :mod:`.dp_exact` for the planner's choice)
is solved through :func:`solve`: it sets the time limit, the seed, the workers and the log
(:func:`configure`), runs the search with Ctrl-C handled (:func:`run_cpsat`), and maps CP-SAT's
native status onto :class:`~.status.Status` (:func:`map_status`, table :data:`STATUS`). Hints
are added with :func:`add_hints`. OR-Tools is imported only when a model is built
(:func:`cp_model`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..ir.errors import check_seed
from .status import Status

__all__ = [
    "PRESOLVE_INCLUSION_WORK_LIMIT",
    "STATUS",
    "CpSatRun",
    "add_hints",
    "configure",
    "cp_model",
    "map_status",
    "run_cpsat",
    "solve",
]

#: CP-SAT's native statuses (``CpSolver.StatusName``) mapped onto ours. ``FEASIBLE`` and
#: ``UNKNOWN`` are what CP-SAT says when it stops without a proof; :func:`map_status` turns them
#: into ``TIME_LIMIT`` when a time limit was set or Ctrl-C stopped the search (no other limit is
#: ever set, so those are the only ways it stops early), and keeps them otherwise.
STATUS: dict[str, Status] = {
    "OPTIMAL": Status.OPTIMAL,
    "FEASIBLE": Status.FEASIBLE,
    "INFEASIBLE": Status.INFEASIBLE,
    "UNKNOWN": Status.UNKNOWN,
    "MODEL_INVALID": Status.ERROR,
}


def cp_model() -> Any:
    """``ortools.sat.python.cp_model``, imported on first use.

    Raises
    ------
    ImportError
        Saying what to install, when OR-Tools is missing.
    """
    try:
        from ortools.sat.python import cp_model as module
    except ImportError as e:  # pragma: no cover - ortools is a base dependency
        raise ImportError("the CP-SAT models need OR-Tools: pip install ortools") from e
    return module


def map_status(name: str, *, limited: bool, interrupted: bool = False) -> Status:
    """CP-SAT's status ``name`` as a :class:`~.status.Status`.

    Parameters
    ----------
    name
        ``CpSolver.status_name(code)``: ``OPTIMAL``, ``FEASIBLE``, ``INFEASIBLE``, ``UNKNOWN``
        or ``MODEL_INVALID``.
    limited
        Whether a time limit was set.
    interrupted
        Whether Ctrl-C stopped the search (:func:`run_cpsat`).

    Returns
    -------
    Status
        :data:`STATUS` of ``name``, except that ``FEASIBLE`` and ``UNKNOWN`` (stopped without a
        proof) become ``TIME_LIMIT`` when ``limited`` or ``interrupted``; a name CP-SAT does not
        have is ``ERROR``.
    """
    status = STATUS.get(name, Status.ERROR)
    if status in (Status.FEASIBLE, Status.UNKNOWN) and (limited or interrupted):
        return Status.TIME_LIMIT
    return status


#: ``presolve_inclusion_work_limit`` for every solve (0: off; see :func:`configure`).
PRESOLVE_INCLUSION_WORK_LIMIT = 0


def configure(
    solver: Any,
    *,
    time_limit: float | None = None,
    seed: int = 0,
    threads: int | None = None,
    log: bool = False,
) -> None:
    """Set ``solver``'s parameters.

    Besides the arguments, presolve's inclusion detection is switched off
    (``presolve_inclusion_work_limit = 0``, :data:`PRESOLVE_INCLUSION_WORK_LIMIT`): with it,
    OR-Tools 9.15 certifies wrong optima (google/or-tools#5293) — on the plan model of
    ``ppo-1x1x4-K2-Q3`` (structure ``τ(actor)=1 τ(critic)=1``) it proved 14.72 s or 15.07 s
    "optimal" depending on the seed while a plan of 13.996 s exists (the MILP's, checked by the
    evaluator); with the limit at 0 every seed proves 13.998 s.

    Parameters
    ----------
    solver
        A ``cp_model.CpSolver``.
    time_limit
        ``max_time_in_seconds`` (``None``: unlimited).
    seed
        ``random_seed``.
    threads
        ``num_workers`` (``None``: CP-SAT's default, all cores).
    log
        ``log_search_progress``.
    """
    prm = solver.parameters
    if time_limit is not None:
        prm.max_time_in_seconds = float(time_limit)
    prm.random_seed = check_seed("seed", seed)
    if threads is not None:
        prm.num_workers = int(threads)
    prm.log_search_progress = bool(log)
    prm.presolve_inclusion_work_limit = PRESOLVE_INCLUSION_WORK_LIMIT


def add_hints(model: Any, hints: Iterable[tuple[Any, int | bool]]) -> None:
    """``model.add_hint(var, value)`` for every ``(var, value)`` of ``hints``."""
    for var, value in hints:
        model.add_hint(var, value)


def run_cpsat(solver: Any, model: Any, callback: Any = None) -> tuple[Any, bool]:
    """``solver.solve(model, callback)`` with Ctrl-C handled here: the solve runs in a helper
    thread while this one waits, and the first ``KeyboardInterrupt`` calls
    ``solver.stop_search()``, after which CP-SAT ends as at its time limit, with its best
    solution. (CP-SAT's own SIGINT handler is switched off: it stops the search too, but says
    nothing, so an interruption could only be guessed from the time.)

    Parameters
    ----------
    solver
        A configured ``cp_model.CpSolver``.
    model
        The ``cp_model.CpModel``.
    callback
        A ``CpSolverSolutionCallback``, or ``None``.

    Returns
    -------
    tuple
        ``(CP-SAT status code, whether Ctrl-C stopped the search)``.
    """
    solver.parameters.catch_sigint_signal = False
    out: dict[str, Any] = {}
    done = threading.Event()

    def work() -> None:
        try:
            out["code"] = solver.solve(model, callback)
        except BaseException as exc:  # re-raised in the caller's thread
            out["error"] = exc
        finally:
            done.set()

    worker = threading.Thread(target=work, name="cpsat-solve", daemon=True)
    worker.start()
    interrupted = False
    while not done.is_set():
        try:
            done.wait(0.05)  # an Event, not join(): an interrupted join() can break is_alive()
        except KeyboardInterrupt:
            interrupted = True
            solver.stop_search()
    worker.join()
    if "error" in out:
        raise out["error"]
    return out["code"], interrupted


@dataclass(frozen=True)
class CpSatRun:
    """How one CP-SAT search ended.

    Attributes
    ----------
    solver
        The ``CpSolver`` (read values and bounds from it when :attr:`has_solution`).
    status
        The mapped status (:func:`map_status`).
    has_solution
        Whether CP-SAT holds a solution (native ``OPTIMAL`` or ``FEASIBLE``).
    interrupted
        Whether Ctrl-C stopped the search.
    """

    solver: Any
    status: Status
    has_solution: bool
    interrupted: bool


def solve(
    model: Any,
    *,
    time_limit: float | None = None,
    seed: int = 0,
    threads: int | None = None,
    log: bool = False,
    callback: Any = None,
) -> CpSatRun:
    """Solve ``model`` with a fresh ``CpSolver`` set up by :func:`configure`, Ctrl-C handled by
    :func:`run_cpsat`, and the status mapped by :func:`map_status`.

    Parameters
    ----------
    model
        The ``cp_model.CpModel`` (hints already added).
    time_limit, seed, threads, log
        See :func:`configure`.
    callback
        A ``CpSolverSolutionCallback``, or ``None``.

    Returns
    -------
    CpSatRun
        The solver, the status, whether a solution exists and whether Ctrl-C came.
    """
    cp = cp_model()
    solver = cp.CpSolver()
    configure(solver, time_limit=time_limit, seed=seed, threads=threads, log=log)
    code, interrupted = run_cpsat(solver, model, callback)
    status = map_status(solver.status_name(code), limited=time_limit is not None, interrupted=interrupted)
    return CpSatRun(solver, status, code in (cp.OPTIMAL, cp.FEASIBLE), interrupted)

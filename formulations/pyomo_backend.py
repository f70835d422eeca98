"""Solving any Pyomo model with a named MILP solver (used by the plan-selection MILP).

The solver registry, the install hints, the status tables and the two ways of running a solver
(HiGHS through appsi, anything else through ``SolverFactory``) live in :mod:`.milp`; this module
only gives them a model-agnostic entry point with a relative time limit or a deadline.
"""

from __future__ import annotations

from typing import Any

from .deadline import Deadline
from .milp import _backend, _solve_appsi_highs, _solve_legacy
from .status import Status

__all__ = ["run_pyomo"]


def run_pyomo(
    model: Any,
    solver: str,
    time_limit: float | Deadline | None,
    seed: int,
    threads: int | None,
    warm: bool,
    *,
    write_estimate: float = 0.0,
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

    Returns
    -------
    tuple
        ``(status, best bound, whether an incumbent was loaded into the model's variables)``.

    Raises
    ------
    SolverUnavailableError
        When the solver is known but not installed (the message says what to install).
    ValueError
        For an unknown solver name.
    BuildTimeout
        When the time runs out while the model is handed to the solver.
    """
    b = _backend(solver)
    deadline = Deadline.of(time_limit)
    if b.pyomo_name == "appsi_highs":
        return _solve_appsi_highs(model, deadline, seed, threads, warm)
    return _solve_legacy(model, b, deadline, seed, threads, warm, write_estimate=write_estimate)

"""Solving any Pyomo model with a named MILP solver (used by the plan-selection MILP).

The solver registry, the install hints, the status tables and the two ways of running a solver
(HiGHS through appsi, anything else through ``SolverFactory``) live in :mod:`.milp`; this module
only gives them a model-agnostic entry point with a relative time limit.
"""

from __future__ import annotations

import time
from typing import Any

from .milp import _backend, _solve_appsi_highs, _solve_legacy
from .status import SolveStatus

__all__ = ["run_pyomo"]


def run_pyomo(
    model: Any, solver: str, time_limit: float | None, seed: int, threads: int | None, warm: bool
) -> tuple[SolveStatus, float, bool]:
    """Solve ``model`` with ``solver`` (``"highs"`` via appsi, or any Pyomo solver name).

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
    """
    b = _backend(solver)
    deadline = None if time_limit is None else time.perf_counter() + time_limit
    if b.pyomo_name == "appsi_highs":
        return _solve_appsi_highs(model, deadline, seed, threads, warm)
    return _solve_legacy(model, b, deadline, seed, threads, warm)

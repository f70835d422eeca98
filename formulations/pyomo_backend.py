"""Solving any Pyomo model with a named MILP solver (shared by the plan-selection MILP).

The solver registry, the install hints and the status tables are those of :mod:`.milp`; this
module only runs a model that is not a :class:`~.milp.MILPModel`.
"""

from __future__ import annotations

import math
from typing import Any

from .milp import _APPSI_STATUS, _LEGACY_STATUS, _backend
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
        When the solver is not installed (the message says what to install).
    """
    import pyomo.environ as pyo

    b = _backend(solver)
    if b.pyomo_name == "appsi_highs":
        from pyomo.contrib.appsi.solvers.highs import Highs

        opt = Highs()
        opt.config.load_solution = False
        opt.config.stream_solver = False
        opt.config.warmstart = warm
        opt.config.mip_gap = 0.0
        if time_limit is not None:
            opt.config.time_limit = max(0.01, time_limit)
        options: dict[str, Any] = {"random_seed": int(seed), "mip_rel_gap": 0.0}
        if threads is not None:
            options["threads"] = int(threads)
        opt.highs_options = options
        res = opt.solve(model)
        incumbent = res.best_feasible_objective is not None and math.isfinite(res.best_feasible_objective)
        if incumbent:
            res.solution_loader.load_vars()
        status = _APPSI_STATUS.get(res.termination_condition.name)
        if status is None:
            status = SolveStatus.FEASIBLE if incumbent else SolveStatus.TIME_LIMIT
        bound = res.best_objective_bound
        return status, (-math.inf if bound is None else float(bound)), incumbent
    opt = pyo.SolverFactory(b.pyomo_name)
    kwargs: dict[str, Any] = {"load_solutions": False}
    if time_limit is not None:
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
    status = _LEGACY_STATUS.get(getattr(tc, "name", str(tc)))
    if status is None:
        status = SolveStatus.FEASIBLE if incumbent else SolveStatus.TIME_LIMIT
    try:
        bound = float(res.problem.lower_bound)
    except (TypeError, ValueError):
        bound = -math.inf
    return status, bound, incumbent

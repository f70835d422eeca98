"""Exact models (SPEC §9), starting with the general project-scheduling core.

A :class:`Project` is a set of activities with one or more modes (duration, resource demands),
lagged finish-to-start precedences, renewable resources (cumulative capacities, or unary devices)
and non-renewable budgets; the objective is the makespan. Two engines solve it behind the same
signature and return the same :class:`ProjectSolution` (a :class:`Status`, the makespan,
a proven lower bound, the runtime, starts and modes):

- :func:`solve_cpsat` — OR-Tools CP-SAT: optional intervals per mode, ``NoOverlap`` for unary
  resources, ``Cumulative`` for capacities, hints, and the critical-path bound as the makespan's
  lower end;
- :func:`solve_milp` — a time-indexed Pyomo MILP solved by HiGHS (``appsi_highs``) by default, or
  by any other Pyomo solver named by ``solver=`` (``cbc``, ``scip``, ``gurobi``, …).

:func:`read_sm`, :func:`read_mm` and :func:`read_optima` read PSPLIB instances and their
published optima, which check both engines (``tests/formulations``, ``benchmarks/psplib.py``).
OR-Tools and Pyomo are imported only when a model is built. The greedy counterpart is
:func:`rpeg.formulations.project_schedule.list_schedule_project`.
"""

from .cpsat import CPModel, solve_cpsat
from .milp import MILPModel, solve_milp
from .project import Activity, Mode, Project, Resource
from .psplib import read_mm, read_optima, read_sm
from .pyomo_backend import MILP_SOLVERS, SolverUnavailableError
from .status import ProjectSolution, Status

__all__ = [
    "MILP_SOLVERS",
    "Activity",
    "CPModel",
    "MILPModel",
    "Mode",
    "Project",
    "ProjectSolution",
    "Resource",
    "SolverUnavailableError",
    "Status",
    "read_mm",
    "read_optima",
    "read_sm",
    "solve_cpsat",
    "solve_milp",
]

"""What every project-scheduling engine returns: a status and a :class:`ProjectSolution`.

Each engine maps its native status explicitly onto :class:`Status`, once, in its engine module
(``cpsat_backend.STATUS``, ``pyomo_backend.APPSI_STATUS``, ``pyomo_backend.LEGACY_STATUS``). A solution
recomputes its makespan from the project data, so a reported objective can always be re-derived.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from .project import Project

__all__ = ["ProjectSolution", "SolveStatus", "Status"]


class Status(str, Enum):
    """How a solve ended — the one status vocabulary of the project: every engine's own status is
    mapped onto it once (the tables live in the engine modules, :mod:`.cpsat_backend` and
    :mod:`.pyomo_backend`), and every method's
    :class:`~rpeg.solvers.result.Result` carries it (``rpeg.Status``).

    ``OPTIMAL``: the schedule or plan is proven optimal. ``FEASIBLE``: one was found, not proven
    optimal, and the engine stopped for another reason than the time limit (a heuristic always
    says this). ``TIME_LIMIT``: the limit was hit; the best schedule or plan so far is attached
    when one was found. ``INFEASIBLE``: proven that none exists (or, for a heuristic, none was
    found; the message says which). ``UNKNOWN``: none found and nothing proven, and the engine
    stopped before its limit (e.g. the heuristic could not meet the non-renewable budgets).
    ``ERROR``: the engine failed or rejected the model.
    """

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    TIME_LIMIT = "time_limit"
    INFEASIBLE = "infeasible"
    UNKNOWN = "unknown"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value


SolveStatus = Status  # the name before the vocabularies were merged; kept for one release


@dataclass(frozen=True)
class ProjectSolution:
    """A schedule of a :class:`~.project.Project` (or the lack of one) and what the engine proved.

    Attributes
    ----------
    status
        See :class:`Status`.
    makespan
        ``C_max = max_i S_i + d_{i m_i}`` of the attached schedule; ``inf`` when there is none.
    lower_bound
        A proven bound ``LB ≤ C_max*`` (``inf`` when infeasibility is proven).
    runtime
        Wall-clock seconds, model building included.
    starts, modes
        ``S_i`` and the chosen mode index ``m_i`` per activity; empty when there is no schedule.
    solver
        The engine's name (``"cpsat"``, ``"milp/highs"``, ``"list"``, …).
    message
        What the user should know about how the solve ended (empty when nothing): e.g. ``"model
        too large to build in 1 s; returned the list schedule"`` or that Ctrl-C stopped it.
    """

    status: Status
    makespan: float
    lower_bound: float
    runtime: float
    starts: tuple[int, ...] = ()
    modes: tuple[int, ...] = ()
    solver: str = ""
    message: str = ""

    @classmethod
    def from_schedule(
        cls,
        project: Project,
        starts: Sequence[int],
        modes: Sequence[int],
        *,
        status: Status,
        lower_bound: float,
        runtime: float,
        solver: str,
        message: str = "",
    ) -> ProjectSolution:
        """A solution whose makespan is recomputed from ``project`` (never taken from the engine).

        For ``OPTIMAL`` the bound is set to the makespan.
        """
        starts = tuple(math.floor(s + 0.5) for s in starts)  # MILP values may carry float noise
        modes = tuple(int(m) for m in modes)
        ms = float(project.makespan(starts, modes))
        lb = ms if status is Status.OPTIMAL else float(lower_bound)
        return cls(status, ms, lb, runtime, starts, modes, solver, message)

    @classmethod
    def without_schedule(
        cls, status: Status, *, lower_bound: float, runtime: float, solver: str, message: str = ""
    ) -> ProjectSolution:
        """No schedule: makespan ``inf`` (and bound ``inf`` when infeasibility is proven)."""
        lb = math.inf if status is Status.INFEASIBLE else float(lower_bound)
        return cls(status, math.inf, lb, runtime, (), (), solver, message)

    def replace(self, **changes: object) -> ProjectSolution:
        """A copy with ``changes`` (``status``, ``lower_bound``, ``runtime``, ``solver``,
        ``message``); the schedule and its makespan are kept."""
        return dataclasses.replace(self, **changes)

    @property
    def objective(self) -> float:
        """The makespan (the objective of every model here)."""
        return self.makespan

    @property
    def has_schedule(self) -> bool:
        return math.isfinite(self.makespan)

    @property
    def is_optimal(self) -> bool:
        return self.status is Status.OPTIMAL

    @property
    def gap(self) -> float:
        """``(C_max - LB) / C_max`` (0 when optimal, ``inf`` without a schedule)."""
        if not math.isfinite(self.makespan):
            return math.inf
        if self.makespan == 0:
            return 0.0
        return (self.makespan - self.lower_bound) / self.makespan

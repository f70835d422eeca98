"""Heuristic planners and the evaluator they share: candidate directories, the list scheduler,
the greedy and concurrent baselines (SPEC §4, §7, §8). Simulated annealing, the Nereus planner and
transition heuristics will join them here."""

from .baselines import Infeasible, concurrent_plan, greedy_plan, repair_memory
from .candidates import Directory, build_directories, enumerate_strategies
from .check import check_schedule
from .costs import Costs, VertexMemory
from .evaluator import Evaluation, Evaluator, MemoryReport
from .scheduler import Schedule, list_schedule

__all__ = [
    "Costs",
    "Directory",
    "Evaluation",
    "Evaluator",
    "Infeasible",
    "MemoryReport",
    "Schedule",
    "VertexMemory",
    "build_directories",
    "check_schedule",
    "concurrent_plan",
    "enumerate_strategies",
    "greedy_plan",
    "list_schedule",
    "repair_memory",
]

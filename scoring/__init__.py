"""The scorer every layer shares (SPEC §5–7): per-vertex costs under a strategy, the candidate
directories, the list scheduler, the evaluator and the independent schedule checker.

It sits between :mod:`rpeg.costmodel` (the formulas) and the planners (:mod:`rpeg.heuristics`,
:mod:`rpeg.formulations`, :mod:`rpeg.solvers`); the runtime and the CLI reach it directly.
"""

from .candidates import Directory, build_directories, clear_directory_cache, enumerate_strategies
from .check import check_schedule
from .costs import Costs, VertexMemory
from .evaluator import Evaluation, Evaluator, MemoryReport
from .scheduler import Schedule, list_schedule

__all__ = [
    "Costs",
    "Directory",
    "Evaluation",
    "Evaluator",
    "MemoryReport",
    "Schedule",
    "VertexMemory",
    "build_directories",
    "check_schedule",
    "clear_directory_cache",
    "enumerate_strategies",
    "list_schedule",
]

"""The front door: ``solve(workload, cluster, method=...) -> Result`` and the method registry.

A *method* is a function ``(Problem, **options) -> Result`` registered under a name with
:func:`register`; ``solve`` checks the name, builds the :class:`Problem` once and hands it over.
Later capabilities (``sa``, ``dp``, ``cpsat``, ``milp``) plug in here the same way the baselines
do.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..heuristics.baselines import Infeasible, concurrent_plan, greedy_plan
from ..heuristics.candidates import build_directories
from ..heuristics.evaluator import Evaluator
from ..ir.cluster import Cluster
from ..ir.plan import Plan
from ..ir.templates import Structure
from ..ir.workload import Workload
from .result import Result, Status

__all__ = ["METHODS", "Problem", "register", "solve"]


@dataclass(frozen=True)
class Problem:
    """Everything a method needs: the workload, the cluster and the scoring settings.

    Parameters
    ----------
    workload, cluster
        The job and the machine.
    k_eval
        Steps unrolled when scoring (SPEC default 8).
    objective
        ``"throughput"`` or ``"throughput-util"``.
    delta
        ``δ`` of the utilisation objective.
    seed
        Seed of every random choice a method makes.
    time_limit
        Wall-clock budget in seconds (``None``: the method's own default).
    """

    workload: Workload
    cluster: Cluster
    k_eval: int = 8
    objective: str = "throughput"
    delta: float = 0.10
    seed: int = 0
    time_limit: float | None = None

    def evaluator(self, structure: Structure | None = None) -> Evaluator:
        """A fresh evaluator for ``structure`` (default: synchronous)."""
        return Evaluator(
            self.workload,
            self.cluster,
            structure,
            k_eval=self.k_eval,
            objective=self.objective,
            delta=self.delta,
        )


MethodFn = Callable[..., Result]
METHODS: dict[str, MethodFn] = {}


def register(name: str) -> Callable[[MethodFn], MethodFn]:
    """Decorator: register ``fn(problem, **options) -> Result`` as method ``name``.

    Raises
    ------
    ValueError
        If the name is taken.
    """

    def deco(fn: MethodFn) -> MethodFn:
        if name in METHODS:
            raise ValueError(f"method {name!r} is already registered")
        METHODS[name] = fn
        return fn

    return deco


def solve(
    workload: Workload,
    cluster: Cluster,
    method: str = "concurrent",
    *,
    time_limit: float | None = None,
    seed: int = 0,
    k_eval: int = 8,
    objective: str = "throughput",
    delta: float = 0.10,
    **options: Any,
) -> Result:
    """Plan ``workload`` on ``cluster`` with ``method`` and return the scored :class:`Result`.

    Parameters
    ----------
    workload
        The RL job (:class:`~rpeg.ir.workload.Workload`).
    cluster
        The machine (:class:`~rpeg.ir.cluster.Cluster`).
    method
        A registered method name: ``"greedy"``, ``"concurrent"`` (and those later issues add).
    time_limit
        Wall-clock budget in seconds for methods that search.
    seed
        Seed of every random choice.
    k_eval
        Steps unrolled for scoring.
    objective
        ``"throughput"`` or ``"throughput-util"`` (SPEC §7).
    delta
        ``δ`` of the utilisation objective.
    **options
        Method-specific options; a method rejects the ones it does not know.

    Returns
    -------
    Result
        Status ``feasible``/``optimal``/``time_limit`` with a memory-feasible plan, or
        ``infeasible`` with no plan and a :attr:`~Result.message` naming the invocation that does
        not fit and by how much.

    Raises
    ------
    ValueError
        For an unknown method (the message lists the known ones) or a bad argument.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; known methods: {', '.join(sorted(METHODS))}")
    if not isinstance(workload, Workload):
        raise ValueError(f"workload must be a Workload, got {type(workload).__name__}")
    if not isinstance(cluster, Cluster):
        raise ValueError(f"cluster must be a Cluster, got {type(cluster).__name__}")
    if time_limit is not None and not time_limit > 0:
        raise ValueError(f"time_limit must be positive seconds, got {time_limit!r}")
    if not isinstance(k_eval, int) or k_eval < 1:
        raise ValueError(f"k_eval must be a positive integer, got {k_eval!r}")
    problem = Problem(workload, cluster, k_eval, objective, delta, int(seed), time_limit)
    return METHODS[method](problem, **options)


def _reject_options(method: str, options: dict[str, Any]) -> None:
    if options:
        raise ValueError(f"method {method!r} takes no option(s) {', '.join(sorted(options))}")


def _baseline(name: str, planner: Callable[..., Plan], problem: Problem, options: dict[str, Any]) -> Result:
    _reject_options(name, options)
    t0 = time.perf_counter()
    structure = Structure.synchronous(problem.workload)
    ev = problem.evaluator(structure)
    dirs = build_directories(ev.costs)
    try:
        plan = planner(ev, dirs)
    except Infeasible as exc:
        return Result(
            problem.workload,
            problem.cluster,
            structure,
            ev.graph,
            None,
            None,
            Status.INFEASIBLE,
            name,
            time.perf_counter() - t0,
            ev.evaluations,
            problem.k_eval,
            message=str(exc),
        )
    evaluation = ev.evaluate(plan, keep=True)
    if not evaluation.feasible:  # the planners repair memory; this guards the invariant
        raise AssertionError(f"{name} produced a memory-infeasible plan")
    return Result(
        problem.workload,
        problem.cluster,
        structure,
        ev.graph,
        plan,
        evaluation,
        Status.FEASIBLE,
        name,
        time.perf_counter() - t0,
        ev.evaluations,
        problem.k_eval,
    )


@register("greedy")
def _greedy(problem: Problem, **options: Any) -> Result:
    """SPEC §8 greedy baseline (synchronous structure)."""
    return _baseline("greedy", greedy_plan, problem, options)


@register("concurrent")
def _concurrent(problem: Problem, **options: Any) -> Result:
    """SPEC §8 concurrent baseline (synchronous structure)."""
    return _baseline("concurrent", concurrent_plan, problem, options)

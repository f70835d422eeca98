"""The front door: ``solve(workload, cluster, method=...) -> Result`` and the method registry.

A *method* is a function ``(Problem, **options) -> Result`` registered under a name with
:func:`register`; ``solve`` checks the name, builds the :class:`Problem` once and hands it over.
Later capabilities (``sa``, ``dp``, ``cpsat``, ``milp``) plug in here the same way the baselines
do.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..formulations.deadline import heap_frozen
from ..heuristics.baselines import Infeasible, baselines_in_time, concurrent_plan, greedy_plan
from ..heuristics.dp_planner import clear_frontier_cache
from ..heuristics.search.parallel import EXIT_UNGUARDED, in_worker_bootstrap
from ..ir.cluster import Cluster
from ..ir.errors import check_positive_int, check_seconds, check_seed, check_type
from ..ir.plan import Plan
from ..ir.templates import Structure, build_graph
from ..ir.workload import MAX_K_EVAL, Workload
from ..scoring.candidates import clear_directory_cache
from ..scoring.evaluator import Evaluator
from .result import Result, Status, check_structure

__all__ = ["METHODS", "Problem", "check_structure_arg", "clear_caches", "register", "solve"]


#: Objectives of SPEC §7.
OBJECTIVES = ("throughput", "throughput-util")


@dataclass(frozen=True)
class Problem:
    """Everything a method needs: the workload, the cluster and the scoring settings.

    A problem checks itself once, when it is built, so no method re-checks these fields.

    Parameters
    ----------
    workload, cluster
        The job and the machine.
    k_eval
        Steps unrolled when scoring (SPEC default 8), ``1 ≤ k_eval ≤ MAX_K_EVAL``.
    objective
        ``"throughput"`` or ``"throughput-util"``.
    delta
        ``δ ∈ (0, 1]`` of the utilisation objective (stored as a float).
    seed
        Seed of every random choice a method makes: an integer in ``[0, MAX_SEED]``
        (:data:`~rpeg.ir.errors.MAX_SEED`, what every engine takes).
    time_limit
        Wall-clock budget in seconds, finite and positive (stored as a float), or ``None``:
        the method's own default.
    started
        The ``time.monotonic()`` reading ``time_limit`` counts from (default: when the problem
        is built; :func:`solve` passes its own entry, so importing an engine or starting worker
        processes counts against the limit).

    Raises
    ------
    TypeError
        For a field of the wrong type (``time_limit="3"``, ``seed=0.5``), naming it.
    ValueError
        For a field out of range (``k_eval=0``, ``delta=0``, ``seed=2**70``,
        ``objective="speed"``), naming it.
    """

    workload: Workload
    cluster: Cluster
    k_eval: int = 8
    objective: str = "throughput"
    delta: float = 0.10
    seed: int = 0
    time_limit: float | None = None
    started: float | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        check_type("workload", self.workload, Workload, "a rpeg.Workload")
        check_type("cluster", self.cluster, Cluster, "a rpeg.Cluster")
        # frozen: the normalised values are stored through object.__setattr__
        object.__setattr__(self, "time_limit", check_seconds("time_limit", self.time_limit))
        object.__setattr__(self, "seed", check_seed("seed", self.seed))
        object.__setattr__(self, "k_eval", check_positive_int("k_eval", self.k_eval))
        if self.started is None:
            object.__setattr__(self, "started", time.monotonic())
        else:
            check_type("started", self.started, (int, float), "a time.monotonic() reading")
        if self.k_eval > MAX_K_EVAL:
            raise ValueError(f"k_eval must be at most {MAX_K_EVAL}, got {self.k_eval}")
        check_type("objective", self.objective, str, "'throughput' or 'throughput-util'")
        if self.objective not in OBJECTIVES:
            raise ValueError(
                f"objective must be one of {', '.join(map(repr, OBJECTIVES))}, got {self.objective!r}"
            )
        check_type("delta", self.delta, (int, float), "a number in (0, 1]")
        if not 0 < self.delta <= 1:
            raise ValueError(f"delta must be in (0, 1], got {self.delta!r}")
        object.__setattr__(self, "delta", float(self.delta))

    def deadline(self) -> float | None:
        """The ``time.monotonic()`` instant ``started + time_limit`` (``None`` without a limit):
        what the one-pass baselines give :func:`~rpeg.scoring.candidates.build_directories`,
        which lists lean candidates for the vertices whose full directories it cannot build by
        then."""
        return None if self.time_limit is None else self.started + self.time_limit

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


def clear_caches() -> None:
    """Empty the process's caches of candidate directories and DP frontiers
    (:func:`~rpeg.scoring.candidates.build_directories`,
    :func:`~rpeg.heuristics.dp_planner.build_frontier`), so that the next ``solve`` prepares
    its candidates as a fresh process would. Plans do not change either way; what changes is
    the time: a benchmark that times several methods on one instance calls this before each,
    so that none is handed the candidates another built."""
    clear_directory_cache()
    clear_frontier_cache()


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
        A registered method name (:data:`METHODS`: ``"greedy"``, ``"concurrent"``, ``"sa"``,
        ``"dp"``, ``"cpsat"``, ``"milp"``).
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
        Status ``feasible``/``optimal``/``time_limit`` with a memory-feasible plan, or no plan
        and a :attr:`~Result.message` saying why: ``infeasible`` (naming the invocation that
        does not fit and by how much), ``time_limit`` (none found in time), ``unknown`` or
        ``error`` (an engine that could not tell, or failed).

    Raises
    ------
    ValueError
        For an unknown method (the message lists the known ones) or an argument out of range
        (``time_limit`` must be finite and positive, ``k_eval ≥ 1``, ...; checked by
        :class:`Problem`), naming it.
    TypeError
        For an argument of the wrong type (``time_limit="3"``, ``ablate="polish"``), naming it.

    Notes
    -----
    ``time_limit`` counts from this call's entry: importing an engine, building the search
    spaces and starting worker processes all count against it.

    While the method runs, the objects that existed before the call are frozen out of Python's
    cyclic garbage collector (``gc.freeze``; handed back on return, not done when the process
    froze objects itself): a full collection scans every tracked object, and in a process with
    a large heap one took a second, past a short time limit.
    """
    started = time.monotonic()
    if in_worker_bootstrap():
        # a worker of ``workers=N`` re-importing a main script that calls solve() at its top level:
        # end it quietly; the parent names the missing ``if __name__ == "__main__":`` once
        raise SystemExit(EXIT_UNGUARDED)
    check_type("method", method, str, "a method name (str)")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; known methods: {', '.join(sorted(METHODS))}")
    problem = Problem(workload, cluster, k_eval, objective, delta, seed, time_limit, started)
    _check_options(options)
    # the caller's objects stay out of the collector's scans meanwhile: a full collection over a
    # large heap (1 s in the test suite's process) would run past a short time limit
    with heap_frozen():
        return METHODS[method](problem, **options)


#: Options several methods take, with their types; each method still rejects what it does not know.
_COUNT_OPTIONS = ("threads", "workers", "max_evaluations", "chains", "budget")
#: More worker processes or solver threads than any single machine has cores.
MAX_PROCESSES = 256


def _check_options(options: dict[str, Any]) -> None:
    """Type and range of the method options whose meaning every method shares.

    Raises
    ------
    TypeError, ValueError
        Naming the option and the value.
    """
    for name in _COUNT_OPTIONS:
        if options.get(name) is not None:
            options[name] = check_positive_int(name, options[name])  # a NumPy integer as an int
    for name in ("workers", "threads"):
        if options.get(name) is not None and options[name] > MAX_PROCESSES:
            raise ValueError(
                f"{name} must be at most {MAX_PROCESSES} (processes/threads), got {options[name]}"
            )
    candidates = options.get("candidates")
    if isinstance(candidates, (bool, int, float, str)):  # a count (a list of choices is also allowed)
        check_positive_int("candidates", candidates)
    if "ablate" in options:
        ablate = options["ablate"]
        if isinstance(ablate, str) or not isinstance(ablate, (list, tuple, set, frozenset)):
            raise TypeError(
                f"ablate must be a list of mechanism names (e.g. ablate=['polish']), got {type(ablate).__name__} "
                f"{ablate!r}"
            )
        bad = [a for a in ablate if not isinstance(a, str)]
        if bad:
            raise TypeError(f"ablate must hold mechanism names (str), got {bad[0]!r}")
    for name in ("t_init", "t_warm"):
        if options.get(name) is not None:
            check_type(name, options[name], (int, float), "a positive number")
            if not (math.isfinite(options[name]) and options[name] > 0):
                raise ValueError(f"{name} must be a positive finite number, got {options[name]!r}")
    if options.get("progress") is not None and not callable(options["progress"]):
        raise TypeError(
            f"progress must be a callable taking a dict, got {type(options['progress']).__name__}"
        )


def check_structure_arg(name: str, value: Any, workload: Workload) -> Structure:
    """``value`` if it is a :class:`~rpeg.ir.templates.Structure` that fits ``workload`` (its
    algorithm, sharing and trained models: :func:`~rpeg.ir.templates.build_graph`'s checks) and
    that the workload allows (:func:`~rpeg.solvers.result.check_structure`).

    Raises
    ------
    TypeError
        For another type (``structure="sync"``), naming ``name``.
    ValueError
        For a structure of another workload, naming ``name`` and why.
    """
    check_type(name, value, Structure, "a rpeg.Structure (one of rpeg.structures(workload))")
    try:
        build_graph(workload, value)
        check_structure(workload, value)  # one the workload allows, as a result file must hold
    except ValueError as exc:
        raise ValueError(f"{name} {value.label!r} does not fit the workload: {exc}") from None
    return value


def _reject_options(method: str, options: dict[str, Any]) -> None:
    if options:
        raise ValueError(f"method {method!r} takes no option(s) {', '.join(sorted(options))}")


def _baseline(name: str, planner: Callable[..., Plan], problem: Problem, options: dict[str, Any]) -> Result:
    _reject_options(name, options)
    t0 = time.perf_counter()
    structure = Structure.synchronous(problem.workload)
    ev = problem.evaluator(structure)
    # a one-pass construction: the directories may take the whole limit (lean ones past it), the
    # plan over the lean floor standing in where the one over the full ones is not done in time
    _, (plan, *_), lean = baselines_in_time(ev, [planner], problem.deadline())
    if isinstance(plan, Infeasible):
        status = Status.TIME_LIMIT if lean else Status.INFEASIBLE  # no proof over lean candidates
        message = f"{plan} ({lean})" if lean else str(plan)
        return Result.infeasible(ev, name, message, runtime_s=time.perf_counter() - t0, status=status)
    evaluation = ev.evaluate(plan, keep=True)
    if not evaluation.feasible:  # the planners repair memory; this guards the invariant
        raise AssertionError(f"{name} produced a memory-infeasible plan")
    return Result.scored(
        ev,
        plan,
        Status.TIME_LIMIT if lean else Status.FEASIBLE,
        name,
        runtime_s=time.perf_counter() - t0,
        evaluation=evaluation,
        message=lean,
    )


@register("greedy")
def _greedy(problem: Problem, **options: Any) -> Result:
    """SPEC §8 greedy baseline (synchronous structure)."""
    return _baseline("greedy", greedy_plan, problem, options)


@register("concurrent")
def _concurrent(problem: Problem, **options: Any) -> Result:
    """SPEC §8 concurrent baseline (synchronous structure)."""
    return _baseline("concurrent", concurrent_plan, problem, options)

"""``method="sa"``: the RPEG optimizer (SPEC §8) behind :func:`~rpeg.solvers.solve.solve`.

Options (all keyword):

``max_evaluations``
    Budget in uncached plan evaluations (with ``time_limit``, whichever ends first; with neither,
    10 seconds).

``time_limit`` counts from the method's start, so building the search spaces (evaluators,
directories) is included; the search checks it between proposal rounds and polish batches, so it
ends within one round (a few evaluations) of the limit. The candidate directories may take all of
it; the vertices not built by then are searched over lean directories
(:func:`~rpeg.scoring.candidates.lean_directory`) and the result
says so, with status ``time_limit``. Ctrl-C ends the search with the best plan so far (status
``time_limit``).
``workers``
    Local processes evaluating proposals in parallel (default 1; ``backend="local"`` only).
``backend``
    ``"local"`` (default): one search in this process. ``"ray"``: independent chains on a Ray
    cluster, merged and polished here (:mod:`~rpeg.heuristics.search.distributed`; needs
    ``pip install 'rpeg[ray]'``).
``address``
    Ray cluster to join (``backend="ray"``; default: the connection this process already holds,
    else a new local Ray instance, shut down afterwards).
``chains``
    Independent searches with ``backend="ray"`` (default: the cluster's CPUs, at least 2); chain
    ``i`` uses seed ``seed + i``. ``Result.extra["chains"]`` summarises each.
``ablate``
    Names of mechanisms to switch off, from :data:`~rpeg.heuristics.search.ABLATIONS`.
``t_init``, ``t_warm``, ``proposals``, ``max_rejections``, ``elite_size``, ``polish_share``
    Search parameters (defaults in ``docs/search.md``).
``acceptance``, ``temperature``, ``moves``
    Pluggable pieces replacing the defaults (:class:`Metropolis`, :class:`Constant`,
    :func:`~rpeg.heuristics.search.anneal.default_moves`: ``SingleMove(0.6)`` 0.62,
    ``PairMove`` 0.28, ``VariantMove`` 0.10).
``structures``
    Structural candidates to search instead of all of ``Ycand``.
``candidates``
    Search only the ``k`` fastest strategies (layouts, each in every recomputation mode) of each
    invocation plus the strategies of the
    concurrent and greedy baselines (as the exact models' candidate sets keep their warm
    start's), for like-for-like comparisons.
``progress``
    Callback receiving live figures about twice a second.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..heuristics.search import (
    ABLATIONS,
    T_INIT,
    T_WARM,
    Anneal,
    Budget,
    Constant,
    Geometric,
    Outcome,
    ProcessEvaluator,
    default_moves,
)
from ..heuristics.search.acceptance import Acceptance
from ..heuristics.search.anneal import evaluate_raw
from ..heuristics.search.distributed import ray_search
from ..heuristics.search.moves import Move
from ..heuristics.search.parallel import UnguardedMainError, unguarded_main_call
from ..heuristics.search.temperature import Temperature
from ..ir.errors import check_positive_int, check_type
from ..ir.templates import Structure
from ..ir.templates import structures as all_structures
from .result import Result, Status
from .solve import Problem, check_structure_arg, register

__all__ = ["DEFAULT_TIME_LIMIT", "configure"]

DEFAULT_TIME_LIMIT = 10.0


def configure(
    problem: Problem,
    *,
    max_evaluations: int | None = None,
    ablate: Sequence[str] = (),
    t_init: float = T_INIT,
    t_warm: float = T_WARM,
    acceptance: Acceptance | None = None,
    temperature: Callable[[], Temperature] | None = None,
    moves: Sequence[tuple[float, Move]] | None = None,
    proposals: int = 6,
    max_rejections: int = 10,
    elite_size: int = 3,
    polish_share: float = 0.1,
    structures: Sequence[Structure] | None = None,
    candidates: int | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    evaluate_many: Callable | None = None,
    started: float | None = None,
) -> Anneal:
    """Build the :class:`Anneal` for ``problem`` from ``solve()``'s options.

    The budget's clock starts at ``started`` (a ``time.monotonic()`` reading; default: now), before
    the search spaces are built, so the set-up counts against ``time_limit``.

    Raises
    ------
    ValueError
        For an unknown ablation name (the message lists the known ones) or a bad parameter.
    """
    off = set(ablate)
    unknown = off - set(ABLATIONS)
    if unknown:
        raise ValueError(f"unknown ablation(s) {', '.join(sorted(unknown))}; known: {', '.join(ABLATIONS)}")
    ys = list(structures) if structures is not None else all_structures(problem.workload)
    if "staleness" in off:
        ys = [y for y in ys if all(t == 0 for _, t in y.staleness)]
    if moves is None:
        moves = default_moves(
            0.0 if "critical_path" in off else 0.6,
            pair="pair_moves" not in off,
            # SPEC's "pair moves" ablation is no donor move at all: the split kernel is one too
            split="pair_moves" not in off and "split_moves" not in off,
        )
    if temperature is None:
        temperature = Geometric if "constant_temperature" in off else Constant
    seconds = problem.time_limit
    if seconds is None and max_evaluations is None:
        seconds = DEFAULT_TIME_LIMIT
    return Anneal(
        problem.workload,
        problem.cluster,
        k_eval=problem.k_eval,
        seed=problem.seed,
        budget=Budget(seconds, max_evaluations, start=started),
        objective=problem.objective,
        delta=problem.delta,
        t_init=t_init,
        t_warm=t_warm,
        acceptance=acceptance,
        temperature=temperature,
        moves=moves,
        proposals=proposals,
        max_rejections=max_rejections,
        elite_size=elite_size,
        warm_restarts="warm_restarts" not in off,
        polish="polish" not in off,
        polish_share=polish_share,
        soft_penalty="soft_penalty" not in off,
        structures_=ys,
        split_phases="phase_split" not in off,
        tune_microbatches="microbatch_tuning" not in off,
        candidates=candidates,
        evaluate_many=evaluate_many,
        progress=progress,
        adaptive_moves="adaptive_moves" not in off,
        halving="structure_halving" not in off,
    )


BACKENDS = ("local", "ray")


@register("sa")
def _sa(
    problem: Problem,
    *,
    workers: int = 1,
    backend: str = "local",
    address: str | None = None,
    chains: int | None = None,
    **options: Any,
) -> Result:
    """Simulated annealing over structures and plans (SPEC §8); see the module docstring."""
    workers = _check_sa_options(problem, workers, backend, address, options)
    if backend == "ray":
        if workers != 1:
            raise ValueError("workers applies to backend='local'; with backend='ray' set chains")
        return _sa_ray(problem, address, chains, options)
    if address is not None or chains is not None:
        raise ValueError("address and chains apply to backend='ray' only")
    if workers > 1 and (script := unguarded_main_call()) is not None:
        raise UnguardedMainError(workers, script)  # before spawn re-runs the script in each worker
    t0 = problem.started  # the time limit counts from solve()'s entry
    search = configure(problem, **options, started=t0)
    pool = None
    if workers > 1:
        spaces = search.spaces
        # the workers start in the background, inside the budget: until they are all up, each
        # batch is evaluated here (the same figures), so a slow start never stalls the search
        pool = ProcessEvaluator(
            problem.workload,
            problem.cluster,
            [sp.structure for sp in spaces],
            k_eval=problem.k_eval,
            split_phases=spaces[0].ev.split_phases,
            workers=workers,
            local=lambda items: [evaluate_raw(spaces[si].ev, plan) for si, plan in items],
        )
        search._evaluate_many = pool
    try:
        outcome = search.run()
    finally:
        if pool is not None:
            pool.close()
    result = outcome_result(search, outcome, "sa", time.monotonic() - t0)
    if pool is not None:
        ready = pool.ready_after
        result.extra["workers"] = {"workers": workers, "ready_after_s": ready}
        if ready is None and result.message:
            result.message += (
                f"; the {workers} worker processes were not up before the search ended, so it ran in "
                "this process only"
            )
    return result


#: Options of ``sa`` that :func:`configure` takes (the rest are ``_sa``'s own or internal).
_CONFIGURE_OPTIONS = frozenset(inspect.signature(configure).parameters) - {
    "problem",
    "evaluate_many",
    "started",
}


def _check_sa_options(
    problem: Problem, workers: Any, backend: Any, address: Any, options: dict[str, Any]
) -> int:
    """Names, types and values of ``sa``'s options, before any work; returns ``workers`` as an
    ``int``.

    Raises
    ------
    TypeError, ValueError
        Naming the option and the value (an unknown option lists the known ones).
    """
    unknown = set(options) - _CONFIGURE_OPTIONS
    if unknown:
        known = sorted(_CONFIGURE_OPTIONS | {"workers", "backend", "address", "chains"})
        raise ValueError(
            f"method 'sa' takes no option(s) {', '.join(sorted(unknown))}; known: {', '.join(known)}"
        )
    workers = check_positive_int("workers", workers)
    check_type("backend", backend, str, f"one of {', '.join(map(repr, BACKENDS))}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known backends: {', '.join(map(repr, BACKENDS))}")
    if address is not None:
        check_type("address", address, str, "a Ray address (str) or None")
    for name in ("proposals", "max_rejections", "elite_size"):
        if name in options:
            options[name] = check_positive_int(name, options[name])
    if options.get("candidates") is not None:
        options["candidates"] = check_positive_int("candidates", options["candidates"])
    if "polish_share" in options:
        share = options["polish_share"]
        check_type("polish_share", share, (int, float), "a number in [0, 1)")
        if not 0 <= share < 1:
            raise ValueError(f"polish_share must be in [0, 1), got {share!r}")
    for name in ("acceptance", "temperature"):
        if options.get(name) is not None and not callable(options[name]):
            raise TypeError(
                f"{name} must be callable or None, got {type(options[name]).__name__} {options[name]!r}"
            )
    moves = options.get("moves")
    if moves is not None and (
        isinstance(moves, (str, bytes))
        or not isinstance(moves, Sequence)
        or not moves
        or not all(
            isinstance(m, tuple)
            and len(m) == 2
            and isinstance(m[0], (int, float))
            and hasattr(m[1], "propose")
            for m in moves
        )
    ):
        raise TypeError(f"moves must be a non-empty list of (weight, Move) pairs or None, got {moves!r}")
    structures = options.get("structures")
    if structures is not None:
        if (
            isinstance(structures, (str, bytes, Structure))
            or not isinstance(structures, Sequence)
            or not structures
        ):
            raise TypeError(
                f"structures must be a non-empty list of Structures (see rpeg.structures(workload)) or None, "
                f"got {type(structures).__name__} {structures!r}"
            )
        for i, y in enumerate(structures):
            check_structure_arg(f"structures[{i}]", y, problem.workload)
    return workers


def _sa_ray(problem: Problem, address: str | None, chains: int | None, options: dict[str, Any]) -> Result:
    """``backend="ray"``: independent chains on a Ray cluster, merged and polished here."""
    t0 = time.monotonic()
    options = dict(options)
    progress = options.pop("progress", None)
    evaluations = options.pop("max_evaluations", None)
    seconds = problem.time_limit
    if seconds is None and evaluations is None:
        seconds = DEFAULT_TIME_LIMIT
    search, outcome, done = ray_search(
        functools.partial(_build_chain, problem, options),
        seed=problem.seed,
        seconds=seconds,
        evaluations=evaluations,
        polish="polish" not in options.get("ablate", ()),
        polish_share=options.get("polish_share", 0.1),
        chains=chains,
        address=address,
        progress=progress,
    )
    result = outcome_result(search, outcome, "sa", time.monotonic() - t0)
    result.extra["chains"] = [r.summary() for r in done]
    return result


def _build_chain(
    problem: Problem,
    options: dict[str, Any],
    *,
    seed: int,
    seconds: float | None,
    evaluations: int | None,
    polish: bool,
    progress: Callable[[dict[str, Any]], None] | None,
) -> Anneal:
    """One search of a ``backend="ray"`` run: ``configure`` with its own seed and budget
    (module level, so Ray can send it to the workers)."""
    ablate = [*options.get("ablate", ()), *(() if polish else ("polish",))]
    return configure(
        replace(problem, seed=seed, time_limit=seconds, started=None),  # a clock of this process
        **{**options, "ablate": ablate, "max_evaluations": evaluations, "progress": progress},
    )


def outcome_result(search: Anneal, outcome: Outcome, method: str, runtime_s: float) -> Result:
    """Turn a search :class:`~rpeg.heuristics.search.Outcome` into a :class:`Result`.

    The plan is scored by its structure's evaluator (the search built it from the problem, with
    the problem's workload, cluster and ``k_eval``); without a plan the result reports the first
    structure searched, status ``infeasible`` and the search's reason. ``Result.extra`` keeps the
    search history and the number of structures searched.
    """
    extra = {"history": [list(h) for h in outcome.history], "structures_searched": len(search.spaces)}
    if outcome.plan is None:
        return Result.infeasible(
            search.spaces[0].ev,
            method,
            outcome.reason,
            runtime_s=runtime_s,
            evaluations=outcome.evaluations,
            extra=extra,
        )
    lean = outcome.space.lean  # the plan's structure searched lean candidates: not all of them
    status = Status.TIME_LIMIT if outcome.interrupted or lean else Status.FEASIBLE
    message = _budget_note(search, outcome) + (f"; {lean}" if lean else "")
    return Result.scored(
        outcome.space.ev,
        outcome.plan,
        status,
        method,
        runtime_s=runtime_s,
        evaluations=outcome.evaluations,
        message=message,
        extra=extra,
    )


def _budget_note(search: Anneal, outcome: Outcome) -> str:
    """What the search spent against its budget, or that Ctrl-C stopped it."""
    if outcome.interrupted:
        return f"interrupted after {outcome.evaluations} evaluations; best plan so far"
    budget = search.budget
    limits = [
        f"{budget.seconds:g} s" if budget.seconds is not None else "",
        f"{budget.evaluations} evaluations" if budget.evaluations is not None else "",
    ]
    limit = " or ".join(x for x in limits if x)
    searched = f"{len(search.spaces)} structures"
    if search.skipped:
        searched = (
            f"{len(search.spaces)} of {len(search.spaces) + search.skipped} structures (the time "
            "limit ran out while preparing the rest)"
        )
    return (
        f"searched {searched} within a budget of {limit}: "
        f"{budget.elapsed():.1f} s, {outcome.evaluations} evaluations"
    )

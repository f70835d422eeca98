"""``method="cpsat"`` and ``method="milp"``: exact plan selection + scheduling (SPEC §9).

For every structural candidate (or the one given as ``structure=``) the candidate set ``C(v)``
is built from the directories — the ``candidates`` fastest strategies of each invocation at every
aligned origin (``None``: the whole directory), plus the warm start's choices — and the exact
model of :mod:`rpeg.formulations.plan_model` is solved with the time left, split evenly over the
structures still to solve. The returned plan is the one with the smallest proven-model makespan;
like every method's, it is scored by the evaluator (list scheduler), so its ``throughput`` is
comparable with the heuristics'. The model's own makespan, its lower bound and the per-structure
outcomes are kept in ``Result.extra``; ``objective_bound`` is the throughput bound
``Keval·B·R·(Lp+Lr)/LB`` with ``LB`` the smallest lower bound over the structures.

"Optimal" means optimal over the candidate sets (and the time rounding of the engine); the
message says which candidate sets were used.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..formulations.plan_cpsat import PlanSolution, solve_plan_cpsat
from ..formulations.plan_model import build_instance, candidate_sets
from ..heuristics.baselines import Infeasible, check_directories, concurrent_plan
from ..heuristics.candidates import Directory, build_directories
from ..heuristics.evaluator import Evaluator
from ..ir.plan import Choice, Plan
from ..ir.templates import Structure
from ..ir.templates import structures as all_structures
from .result import Result, Status
from .solve import Problem, register, solve

__all__ = ["solve_exact"]

DEFAULT_TIME_LIMIT = 60.0


def solve_exact(
    problem: Problem,
    engine: str,
    engine_fn: Callable[..., PlanSolution],
    *,
    candidates: int | Sequence[Sequence[Choice]] | None = 3,
    structure: Structure | None = None,
    warm_start: str | Plan | None = "concurrent",
    threads: int | None = None,
    engine_options: dict[str, Any] | None = None,
) -> Result:
    """Run an exact plan-selection engine over the structures (see the module docstring).

    Parameters
    ----------
    problem
        Workload, cluster, ``k_eval``, seed and time limit (default 60 s).
    engine
        Method name for the result (``"cpsat"`` or ``"milp"``).
    engine_fn
        ``engine_fn(instance, time_limit=, seed=, threads=, hint=, **engine_options)``.
    candidates
        ``k`` fastest strategies per invocation (at every origin), ``None`` for all, or explicit
        candidate lists per vertex (only with one ``structure``).
    structure
        Solve only this structural candidate.
    warm_start
        ``"concurrent"``, ``"sa"`` (a short SA run restricted to the structure, 20% of its
        time), a :class:`Plan`, or ``None``; its choices join the candidate sets and hint the
        engine.
    threads
        Engine threads.

    Raises
    ------
    ValueError
        For a bad option (the message names it).
    """
    if isinstance(warm_start, str) and warm_start not in ("concurrent", "sa"):
        raise ValueError(f"warm_start must be 'concurrent', 'sa', a Plan or None, got {warm_start!r}")
    if candidates is not None and not isinstance(candidates, int) and structure is None:
        raise ValueError("explicit candidate lists need structure= (they belong to one graph)")
    if isinstance(candidates, int) and candidates < 1:
        raise ValueError(
            f"candidates must be a positive integer, None or candidate lists, got {candidates!r}"
        )
    t0 = time.perf_counter()
    limit = problem.time_limit if problem.time_limit is not None else DEFAULT_TIME_LIMIT
    ys = [structure] if structure is not None else all_structures(problem.workload)
    outcomes = []
    best = None  # (model makespan, ev, solution)
    bounds = []
    for i, y in enumerate(ys):
        left = limit - (time.perf_counter() - t0)
        share = max(0.1, left / (len(ys) - i))
        ev = problem.evaluator(y)
        dirs = build_directories(ev.costs)
        try:
            check_directories(ev, dirs)
        except Infeasible as exc:
            outcomes.append({"structure": y.label, "status": "infeasible", "reason": str(exc)})
            continue
        hint = _warm_start(problem, ev, dirs, y, warm_start, 0.2 * share)
        if candidates is None or isinstance(candidates, int):
            cands = candidate_sets(ev, dirs, candidates, include=hint)
        else:
            cands = [list(c) for c in candidates]
        inst = build_instance(ev, cands)
        share = max(0.1, limit - (time.perf_counter() - t0)) / (len(ys) - i)
        sol = engine_fn(
            inst, time_limit=share, seed=problem.seed, threads=threads, hint=hint, **(engine_options or {})
        )
        outcomes.append(
            {
                "structure": y.label,
                "status": sol.status,
                "makespan": sol.makespan,
                "lower_bound": sol.lower_bound,
                "runtime_s": sol.runtime,
                "time_to_first_s": sol.time_to_first,
                "candidates": [len(c) for c in cands],
            }
        )
        if sol.status != "infeasible":
            bounds.append(sol.lower_bound)
        if sol.plan is not None and (best is None or sol.makespan < best[0]):
            best = (sol.makespan, ev, sol)
    runtime = time.perf_counter() - t0
    cand_note = (
        "whole directories"
        if candidates is None
        else (
            f"the {candidates} fastest strategies per invocation at every origin"
            if isinstance(candidates, int)
            else "the given candidate lists"
        )
    )
    extra: dict[str, Any] = {"structures": outcomes, "candidates": cand_note}
    work = problem.k_eval * problem.workload.tokens_per_step
    bound = work / min(bounds) if bounds and min(bounds) > 0 else None
    if best is None:
        proven = all(o["status"] == "infeasible" for o in outcomes)
        y = ys[0]
        ev = problem.evaluator(y)
        reasons = [o["reason"] for o in outcomes if "reason" in o]
        if proven and reasons and len(reasons) == len(outcomes):
            msg = reasons[0]
        elif proven:
            msg = "no memory-feasible plan exists within " + cand_note
        else:
            msg = f"no plan found within the time limit ({limit:.0f} s) over {cand_note}"
        return Result(
            problem.workload,
            problem.cluster,
            y,
            ev.graph,
            None,
            None,
            Status.INFEASIBLE if proven else Status.TIME_LIMIT,
            engine,
            runtime,
            0,
            problem.k_eval,
            objective_bound=None,
            message=msg,
            extra=extra,
        )
    model_ms, ev, sol = best
    evaluation = ev.evaluate(sol.plan, keep=True)
    all_optimal = all(o["status"] in ("optimal", "infeasible") for o in outcomes)
    status = Status.OPTIMAL if all_optimal else Status.TIME_LIMIT
    extra.update(
        {
            "model_makespan": model_ms,
            "model_throughput": work / model_ms if model_ms > 0 else math.inf,
            "exact_starts": {repr(k): v for k, v in sol.starts.items()},
        }
    )
    msg = (
        f"proven optimal over {cand_note}"
        if all_optimal
        else f"time limit ({limit:.0f} s) reached before proving optimality over {cand_note}; best plan so far"
    )
    return Result(
        problem.workload,
        problem.cluster,
        ev.structure,
        ev.graph,
        sol.plan,
        evaluation,
        status,
        engine,
        runtime,
        ev.evaluations,  # the evaluator is only asked to score the final plan
        problem.k_eval,
        objective_bound=bound,
        message=msg,
        extra=extra,
    )


def _warm_start(
    problem: Problem,
    ev: Evaluator,
    dirs: list[Directory],
    y: Structure,
    how: str | Plan | None,
    seconds: float,
) -> Plan | None:
    if how is None:
        return None
    if isinstance(how, Plan):
        if len(how) != len(ev.graph.vertices):
            raise ValueError(
                f"warm_start plan has {len(how)} choices, structure {y.label} has "
                f"{len(ev.graph.vertices)} vertices"
            )
        return how
    if how == "concurrent":
        try:
            return concurrent_plan(ev, dirs)
        except Infeasible:
            return None
    r = solve(
        problem.workload,
        problem.cluster,
        method="sa",
        time_limit=max(0.2, seconds),
        seed=problem.seed,
        k_eval=problem.k_eval,
        structures=[y],
    )
    return r.plan


@register("cpsat")
def _cpsat(problem: Problem, **options: Any) -> Result:
    """Exact plan selection with OR-Tools CP-SAT (options: see :func:`solve_exact`; ``unit``)."""
    engine_options = {k: options.pop(k) for k in ("unit",) if k in options}
    _check(options, "cpsat")
    return solve_exact(problem, "cpsat", solve_plan_cpsat, engine_options=engine_options, **options)


def _check(options: dict[str, Any], name: str) -> None:
    known = {"candidates", "structure", "warm_start", "threads"}
    unknown = set(options) - known
    if unknown:
        extra = {"cpsat": {"unit"}, "milp": {"solver"}}[name]
        raise ValueError(
            f"method {name!r} takes no option(s) {', '.join(sorted(unknown))}; "
            f"known: {', '.join(sorted(known | extra))}"
        )


@register("milp")
def _milp(problem: Problem, **options: Any) -> Result:
    """Exact plan selection as a Pyomo MILP (options: see :func:`solve_exact`; ``solver``, default
    ``"highs"``)."""
    from ..formulations.plan_milp import solve_plan_milp

    engine_options = {"solver": options.pop("solver", "highs")}
    _check(options, "milp")
    return solve_exact(problem, "milp", solve_plan_milp, engine_options=engine_options, **options)

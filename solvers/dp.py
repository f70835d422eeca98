"""``method="dp"``: the Nereus planner (SPEC §10; :mod:`rpeg.heuristics.dp_planner`).

Per model-stage a latency/GPU/memory frontier from the shared cost model, a dynamic programme
(or, with ``engine="cpsat"``, the exact model of :mod:`rpeg.formulations.dp_exact`) picking one
point per model-stage under the per-stage GPU budget and the plan-level memory bound, minimising
the stage-composed step latency; the choice is placed on aligned allocations and scored by the
evaluator like every other method's plan, so ``throughput`` is comparable across methods.

Options (all keyword):

``structure``
    A :class:`~rpeg.ir.templates.Structure`, ``None`` (default: the synchronous structure, as the
    baselines) or ``"all"``: plan every structural candidate and keep the one with the least
    *predicted* step latency (ties: the first in ``Ycand`` order). The planner's latency
    composition does not model staleness; with ``τ > 0`` it is an upper bound.
``budget``
    GPUs each stage may use (default: the whole cluster).
``engine``
    ``"dp"`` (default) or ``"cpsat"`` (same choice by the exact model; ``time_limit`` applies).
``threads``
    CP-SAT workers with ``engine="cpsat"`` (default 1).

``time_limit`` covers the whole method (one deadline from its start): structures are planned
one after another while time is left (the first always is: its DP is one pass and cannot stop
half-way), and with ``engine="cpsat"`` each gets the time left divided by the structures still
to plan. With a limit the DP counts memory in whole GiB
(:func:`~rpeg.heuristics.dp_planner.coarsen_memory`: every plan it selects still fits; on the
64-GPU example it took 0.05-0.08 s where the KiB DP took 0.4-2.5 s, at the same optimum over the
full frontiers and 1 % off it over the lean ones; the KiB DP runs when it finds nothing), so the
frontiers may take :data:`FRONTIER_SHARE` of the limit: the model-stages whose full frontier is
not built by then are planned over lean ones
(:func:`~rpeg.heuristics.dp_planner.lean_frontier`), and the result says so, with status
``time_limit``. Without a limit the DP is exact in KiB over full frontiers. When time runs out,
or on Ctrl-C, before every structure is planned, the best plan so far is returned with status
``time_limit`` and a message naming how many structures were planned.

``Result.extra["dp"]`` holds the predicted step latency, the per-stage latencies, each
model-stage's pick and frontier size, and the frontier-building and selection times.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..formulations.deadline import Deadline
from ..formulations.dp_exact import solve_dp_cpsat
from ..heuristics.baselines import Infeasible
from ..heuristics.dp_planner import (
    COARSE_MEM_UNITS,
    LAT_UNIT,
    STAGE_NAME,
    DPInstance,
    Selection,
    build_dp_instance,
    coarsen_memory,
    place,
    solve_dp,
)
from ..ir.templates import Structure
from ..ir.templates import structures as all_structures
from ..scoring.candidates import lean_note
from ..scoring.evaluator import Evaluator
from .result import Result, Status
from .solve import Problem, check_structure_arg, register

__all__ = ["ENGINES", "select"]

ENGINES = ("dp", "cpsat")


def select(
    inst: DPInstance,
    engine: str = "dp",
    *,
    time_limit: float | None = None,
    seed: int = 0,
    threads: int | None = 1,
) -> tuple[Selection, str]:
    """Run ``engine`` on ``inst``: the selection and a status word (``"optimal"`` unless CP-SAT
    stopped early).

    Raises
    ------
    Infeasible
        When no selection meets the budget and memory bound (the message names the model-stage).
    ValueError
        For an unknown engine.
    """
    if engine == "dp":
        return solve_dp(inst), "optimal"
    if engine == "cpsat":
        sol = solve_dp_cpsat(inst, time_limit=time_limit, seed=seed, threads=threads)
        if sol.selection is None:
            if sol.status == "infeasible":
                solve_dp(inst)  # raises Infeasible with the DP's explanation
            raise Infeasible(f"CP-SAT found no selection ({sol.status}) within {time_limit} s")
        return sol.selection, sol.status
    raise ValueError(f"unknown engine {engine!r}; known engines: {', '.join(map(repr, ENGINES))}")


@register("dp")
def _dp(
    problem: Problem,
    *,
    structure: Structure | str | None = None,
    budget: int | None = None,
    engine: str = "dp",
    threads: int | None = 1,
    **options: Any,
) -> Result:
    """The Nereus planner; see the module docstring."""
    if options:
        raise ValueError(f"method 'dp' takes no option(s) {', '.join(sorted(options))}")
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; known engines: {', '.join(map(repr, ENGINES))}")
    ys = _structures(problem, structure)
    t0 = problem.started  # solve()'s entry
    run = _plan_structures(problem, ys, Deadline(problem.time_limit, start=t0), budget, engine, threads)
    lean = lean_note(run.lean, "frontiers")
    if run.best is None:
        assert run.first_error is not None  # the first structure is always planned
        message = str(run.first_error)
        if run.stopped:  # the others were not tried: no proof
            message += f" ({run.stopped}: planned {run.planned} of {len(ys)} structures)"
        if lean:  # nor over lean frontiers
            message += f"; {lean}"
        return Result.infeasible(
            run.evaluators[0],
            "dp",
            message,
            runtime_s=time.monotonic() - t0,
            status=Status.TIME_LIMIT if run.stopped or lean else Status.INFEASIBLE,
            evaluations=0,
        )
    best = run.best
    plan = place(best.inst, best.sel, len(best.ev.graph.vertices))
    evaluation = best.ev.evaluate(plan, keep=True)
    if not evaluation.feasible:  # the plan-level bound covers every placement
        raise AssertionError("dp produced a memory-infeasible plan")
    lanes = best.sel.lanes or best.inst.side_by_side()
    lat = best.inst.stage_latencies(best.sel.picks, lanes)
    extra = {"dp": _extra(best, engine, lanes, lat, run.planned, len(ys))}
    note = (
        f"{engine} over {len(best.inst.frontiers)} model-stages "
        f"({sum(len(f.points) for f in best.inst.frontiers)} frontier points): predicted step latency "
        f"{best.sel.step_latency * LAT_UNIT:.3f} s = Σ_stages max_lanes Σ ℓ "
        f"({' + '.join(f'{x * LAT_UNIT:.3f}' for x in lat)}); "
        + (
            "optimal within the planner's space"
            if best.status == "optimal"
            else f"CP-SAT status {best.status}"
        )
        + (" (memory counted in whole GiB: the time limit's DP)" if best.coarse else "")
    )
    if run.stopped:
        note = f"{run.stopped}: planned {run.planned} of {len(ys)} structures; best plan so far; " + note
    if lean:
        note += f"; {lean}"
    return Result.scored(
        best.ev,
        plan,
        Status.TIME_LIMIT if best.status == "time_limit" or run.stopped or lean else Status.FEASIBLE,
        "dp",
        runtime_s=time.monotonic() - t0,
        evaluation=evaluation,
        message=note,
        extra=extra,
    )


def _select(
    inst: DPInstance, coarse: bool, engine: str, share: float | None, seed: int, threads: int | None
) -> tuple[Selection, str, DPInstance]:
    """:func:`select` on ``inst``, and the instance the selection indexes. With ``coarse`` (a
    time limit) the memory is first counted in GiB (:func:`coarsen_memory`, far fewer labels,
    every selection still feasible); only when that finds nothing is the exact instance
    selected on, so that an infeasibility is reported in its own terms.

    Raises
    ------
    Infeasible
        From :func:`select` on ``inst``.
    """
    if coarse:
        coarse_inst = coarsen_memory(inst, COARSE_MEM_UNITS)
        try:
            sel, status = select(coarse_inst, engine, time_limit=share, seed=seed, threads=threads)
            return sel, status, coarse_inst
        except Infeasible:
            pass
    sel, status = select(inst, engine, time_limit=share, seed=seed, threads=threads)
    return sel, status, inst


#: Share of the time limit the frontiers may take: with a limit the DP counts memory in GiB,
#: which took a few hundredths of a second on the bundled examples, so most of the limit can go
#: to the frontiers. Not tuned: a round number that leaves the DP a fifth of the limit.
FRONTIER_SHARE = 0.8


def _structures(problem: Problem, structure: Structure | str | None) -> list[Structure]:
    """The structures the ``structure`` option names (module docstring).

    Raises
    ------
    ValueError
        If ``structure`` is not a :class:`Structure`, ``None`` or ``"all"``.
    """
    if isinstance(structure, str) and structure == "all":
        return all_structures(problem.workload)
    if structure is None:
        return [Structure.synchronous(problem.workload)]
    if isinstance(structure, Structure):
        return [check_structure_arg("structure", structure, problem.workload)]
    raise ValueError(f"structure must be a Structure, None or 'all', got {structure!r}")


@dataclass(frozen=True)
class _Planned:
    """One structure's plan: its index in the structures, evaluator, DP instance, selection,
    status word and whether the selection counted memory in GiB (:func:`coarsen_memory`;
    ``inst`` is then the coarse instance)."""

    index: int
    ev: Evaluator
    inst: DPInstance
    sel: Selection
    status: str
    coarse: bool = False


@dataclass
class _Run:
    """What planning the structures one after another produced.

    Attributes
    ----------
    best
        The structure with the least predicted step latency (ties: the first), or ``None``.
    first_error
        Why the first infeasible structure had no selection.
    evaluators
        One per structure tried, in order.
    planned
        Structures planned (infeasible ones included).
    stopped
        Why not every structure was planned (``"time limit"``, ``"Ctrl-C"``; empty: all were).
    lean
        The model-stages planned over lean frontiers (the time limit cut their build short),
        by name, once each.
    """

    best: _Planned | None = None
    first_error: Infeasible | None = None
    evaluators: list[Evaluator] = field(default_factory=list)
    planned: int = 0
    stopped: str = ""
    lean: list[str] = field(default_factory=list)


def _plan_structures(
    problem: Problem,
    ys: list[Structure],
    deadline: Deadline,
    budget: int | None,
    engine: str,
    threads: int | None,
) -> _Run:
    """Build and select each structure's instance while time is left (the first always is),
    keeping the least predicted step latency; CP-SAT gets the time left divided by the
    structures still to plan. Ctrl-C after a plan was found stops early.
    """
    run = _Run()
    try:
        for k, y in enumerate(ys):
            if k > 0 and deadline.expired():
                run.stopped = "time limit"
                break
            ev = problem.evaluator(y)
            run.evaluators.append(ev)
            # past FRONTIER_SHARE of the limit, the model-stages not yet built keep lean frontiers
            build_at = None if deadline.unlimited else deadline.start + FRONTIER_SHARE * deadline.seconds
            inst = build_dp_instance(ev.costs, budget, build_at)
            lean = [f.stage.label for f in inst.frontiers if f.lean]
            run.lean += [label for label in lean if label not in run.lean]
            share = deadline.limit()
            if share is not None:
                share = max(0.01, share / (len(ys) - k))
            try:
                sel, status, picked = _select(
                    inst, not deadline.unlimited, engine, share, problem.seed, threads
                )
            except Infeasible as exc:
                run.first_error = run.first_error or exc
                continue
            finally:
                run.planned += 1
            if run.best is None or sel.step_latency < run.best.sel.step_latency:
                run.best = _Planned(k, ev, picked, sel, status, picked is not inst)
    except KeyboardInterrupt:
        if run.best is None:
            raise
        run.stopped = "Ctrl-C"
    return run


def _extra(
    best: _Planned,
    engine: str,
    lanes: Sequence[Sequence[Sequence[int]]],
    lat: Sequence[int],
    planned: int,
    structures: int,
) -> dict[str, Any]:
    """``Result.extra["dp"]``: predicted latencies (seconds), each model-stage's pick and
    frontier, the lanes and the frontier-building and selection times."""
    inst, sel = best.inst, best.sel
    return {
        "engine": engine,
        "step_latency_s": sel.step_latency * LAT_UNIT,
        "stage_latency_s": {
            STAGE_NAME[inst.frontiers[m[0]].stage.stage]: x * LAT_UNIT for m, x in zip(inst.stages, lat)
        },
        "model_stages": [
            {
                "model_stage": f.stage.label,
                "vertices": list(f.stage.names),
                "frontier": len(f.points),
                "legal": f.legal,
                "pick": f.points[j].strategy.label(),
                "gpus": f.points[j].gpus,
                "latency_s": f.points[j].latency * LAT_UNIT,
            }
            for f, j in zip(inst.frontiers, sel.picks)
        ],
        "lanes": [[[inst.frontiers[m].stage.label for m in lane] for lane in g] for g in lanes],
        "build_s": inst.build_s,
        "select_s": sel.runtime,
        "labels": sel.labels,
        "structures_planned": planned,
        "structures": structures,
    }

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
one after another while time is left (the first always is: a structure's frontiers and DP are
one pass of milliseconds to a few tenths of a second and cannot stop half-way), and with
``engine="cpsat"`` each gets the time left divided by the structures still to plan. When time
runs out, or on Ctrl-C, before every structure is planned, the best plan so far is returned with
status ``time_limit`` and a message naming how many structures were planned.

``Result.extra["dp"]`` holds the predicted step latency, the per-stage latencies, each
model-stage's pick and frontier size, and the frontier-building and selection times.
"""

from __future__ import annotations

import time
from typing import Any

from ..formulations.deadline import Deadline
from ..formulations.dp_exact import solve_dp_cpsat
from ..heuristics.baselines import Infeasible
from ..heuristics.dp_planner import (
    LAT_UNIT,
    STAGE_NAME,
    DPInstance,
    Selection,
    build_instance,
    place,
    solve_dp,
)
from ..ir.templates import Structure
from ..ir.templates import structures as all_structures
from .result import Result, Status
from .solve import Problem, register

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
    if structure == "all":
        ys = all_structures(problem.workload)
    elif structure is None:
        ys = [Structure.synchronous(problem.workload)]
    elif isinstance(structure, Structure):
        ys = [structure]
    else:
        raise ValueError(f"structure must be a Structure, None or 'all', got {structure!r}")
    t0 = time.monotonic()
    deadline = Deadline(problem.time_limit, start=t0)
    best = None  # (latency, index, ev, inst, selection, status)
    first_error: Infeasible | None = None
    evs = []
    planned = 0
    stopped = ""  # why not every structure was planned
    try:
        for k, y in enumerate(ys):
            if k > 0 and deadline.expired():
                stopped = "time limit"
                break
            ev = problem.evaluator(y)
            evs.append(ev)
            inst = build_instance(ev.costs, budget)
            share = deadline.limit()
            if share is not None:
                share = max(0.01, share / (len(ys) - k))
            try:
                sel, status = select(inst, engine, time_limit=share, seed=problem.seed, threads=threads)
            except Infeasible as exc:
                first_error = first_error or exc
                continue
            finally:
                planned += 1
            if best is None or sel.step_latency < best[0]:
                best = (sel.step_latency, k, ev, inst, sel, status)
    except KeyboardInterrupt:
        if best is None:
            raise
        stopped = "Ctrl-C"
    if best is None:
        assert first_error is not None  # the first structure is always planned
        message = str(first_error)
        if stopped:  # the others were not tried: no proof
            message += f" ({stopped}: planned {planned} of {len(ys)} structures)"
        return Result(
            problem.workload,
            problem.cluster,
            ys[0],
            evs[0].graph,
            None,
            None,
            Status.TIME_LIMIT if stopped else Status.INFEASIBLE,
            "dp",
            time.monotonic() - t0,
            0,
            problem.k_eval,
            message=message,
        )
    _, k, ev, inst, sel, status = best
    plan = place(inst, sel, len(ev.graph.vertices))
    evaluation = ev.evaluate(plan, keep=True)
    if not evaluation.feasible:  # the plan-level bound covers every placement
        raise AssertionError("dp produced a memory-infeasible plan")
    lanes = sel.lanes or inst.side_by_side()
    lat = inst.stage_latencies(sel.picks, lanes)
    extra = {
        "dp": {
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
            "structures": len(ys),
        }
    }
    note = (
        f"{engine} over {len(inst.frontiers)} model-stages "
        f"({sum(len(f.points) for f in inst.frontiers)} frontier points): predicted step latency "
        f"{sel.step_latency * LAT_UNIT:.3f} s = Σ_stages max_lanes Σ ℓ "
        f"({' + '.join(f'{x * LAT_UNIT:.3f}' for x in lat)}); "
        + ("optimal within the planner's space" if status == "optimal" else f"CP-SAT status {status}")
    )
    if stopped:
        note = f"{stopped}: planned {planned} of {len(ys)} structures; best plan so far; " + note
    return Result(
        problem.workload,
        problem.cluster,
        ys[k],
        ev.graph,
        plan,
        evaluation,
        Status.TIME_LIMIT if status == "time_limit" or stopped else Status.FEASIBLE,
        "dp",
        time.monotonic() - t0,
        ev.evaluations,
        problem.k_eval,
        message=note,
        extra=extra,
    )

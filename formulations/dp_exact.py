"""The Nereus planner's choice as a CP-SAT model: the exact counterpart of
:func:`rpeg.heuristics.dp_planner.solve_dp` (SPEC §10 "Planner (dp)").

Same data (:class:`~rpeg.heuristics.dp_planner.DPInstance`: integer latencies in µs, KiB rounded
up), same constraints, same objective:

* ``x[M,c] ∈ {0,1}``, ``Σ_c x[M,c] = 1`` — one frontier point per model-stage;
* with ``n_M = Σ_c n_c·x[M,c]``, ``ℓ_M``, ``p_M``, ``t_M`` alike;
* per stage ``s``: ``y[s,π] ∈ {0,1}`` over the set partitions ``π`` of its model-stages into
  lanes, ``Σ_π y[s,π] = 1``; if ``y[s,π]``: members of a lane have equal ``n_M``,
  ``Σ_{λ∈π} n_{first(λ)} ≤ N`` (per-stage GPU budget), ``L_s ≥ Σ_{M∈λ} ℓ_M`` and
  ``P_s ≥ Σ_{M∈λ} p_M`` for every lane ``λ``;
* ``T ≥ t_M`` for every ``M``; ``Σ_s P_s + T ≤ M_eff`` — the plan-level memory bound;
* minimise ``Σ_s L_s`` — the step latency (stages in dependency order).

The model's optimum equals the DP's (the tests check it, and both against brute force); the
benchmark ``benchmarks/dp_planner.py`` compares their decision times.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..heuristics.dp_planner import DPInstance, Selection, partitions
from . import cpsat_backend
from .status import Status

__all__ = ["DPExactSolution", "solve_dp_cpsat"]


@dataclass(frozen=True)
class DPExactSolution:
    """Outcome of the exact model.

    Attributes
    ----------
    status
        ``OPTIMAL``; ``TIME_LIMIT`` (the time limit or Ctrl-C stopped the search; a selection is
        attached when one was found); ``INFEASIBLE`` (proven); ``UNKNOWN`` (stopped without a
        selection or a proof, and without a limit); ``ERROR`` (CP-SAT rejected the model).
        Mapped from CP-SAT's status by :func:`~.cpsat_backend.map_status`.
    selection
        The chosen points (``None`` without a solution).
    objective
        ``L_step`` in µs (``None`` without a solution).
    bound
        CP-SAT's proven lower bound on ``L_step`` (µs).
    runtime
        Seconds, model building included.
    """

    status: Status
    selection: Selection | None
    objective: int | None
    bound: float
    runtime: float


def solve_dp_cpsat(
    inst: DPInstance,
    *,
    time_limit: float | None = None,
    seed: int = 0,
    threads: int | None = 1,
    hint: Selection | None = None,
) -> DPExactSolution:
    """Solve the planner's choice exactly with CP-SAT (module docstring).

    Parameters
    ----------
    inst
        Frontiers, stages, GPU budget and ``M_eff``.
    time_limit
        Seconds for the engine (``None``: no limit).
    seed
        CP-SAT's random seed.
    threads
        Search workers (default 1, for a like-for-like timing against the one-thread DP).
    hint
        A selection to hint (e.g. the DP's).

    Raises
    ------
    ValueError
        If ``time_limit`` is not positive or ``threads`` is not a positive integer.
    """
    if time_limit is not None and not time_limit > 0:
        raise ValueError(f"time_limit must be positive seconds, got {time_limit!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    t0 = time.perf_counter()
    cp_model = cpsat_backend.cp_model()
    m = cp_model.CpModel()
    fronts = inst.frontiers
    x = [[m.NewBoolVar(f"x[{i},{c}]") for c in range(len(f.points))] for i, f in enumerate(fronts)]
    for xs in x:
        if not xs:  # an empty frontier: no plan
            m.AddBoolOr([])
        else:
            m.AddExactlyOne(xs)
    lat_max = sum(max((q.latency for q in f.points), default=0) for f in fronts)
    n_of = [sum(q.gpus * x[i][c] for c, q in enumerate(f.points)) for i, f in enumerate(fronts)]
    lat_of = [sum(q.latency * x[i][c] for c, q in enumerate(f.points)) for i, f in enumerate(fronts)]
    per_of = [sum(q.persistent * x[i][c] for c, q in enumerate(f.points)) for i, f in enumerate(fronts)]
    t_var = m.NewIntVar(0, inst.m_eff, "T")
    for i, f in enumerate(fronts):
        m.Add(t_var >= sum(q.transient * x[i][c] for c, q in enumerate(f.points)))
    stage_l, stage_p, groupings = [], [], []
    for s, members in enumerate(inst.stages):
        lat_s = m.NewIntVar(0, lat_max, f"lat_s[{s}]")
        per_s = m.NewIntVar(0, inst.m_eff, f"per_s[{s}]")
        parts = partitions(members)
        y = [m.NewBoolVar(f"y[{s},{k}]") for k in range(len(parts))]
        m.AddExactlyOne(y)
        for yk, blocks in zip(y, parts):
            gpus = []
            for lane in blocks:
                for a, b in zip(lane, lane[1:]):  # members of a lane share one allocation
                    m.Add(n_of[a] == n_of[b]).OnlyEnforceIf(yk)
                m.Add(lat_s >= sum(lat_of[i] for i in lane)).OnlyEnforceIf(yk)
                m.Add(per_s >= sum(per_of[i] for i in lane)).OnlyEnforceIf(yk)
                gpus.append(n_of[lane[0]])
            m.Add(sum(gpus) <= inst.budget).OnlyEnforceIf(yk)
        stage_l.append(lat_s)
        stage_p.append(per_s)
        groupings.append((y, parts))
    m.Add(sum(stage_p) + t_var <= inst.m_eff)
    m.Minimize(sum(stage_l))
    if hint is not None:
        cpsat_backend.add_hints(
            m, ((var, int(hint.picks[i] == c)) for i, xs in enumerate(x) for c, var in enumerate(xs))
        )
        for (y, parts), lanes in zip(groupings, hint.lanes or inst.side_by_side()):
            cpsat_backend.add_hints(m, ((yk, int(blocks == tuple(lanes))) for yk, blocks in zip(y, parts)))

    run = cpsat_backend.solve(m, time_limit=time_limit, seed=seed, threads=threads)
    solver, status = run.solver, run.status
    runtime = time.perf_counter() - t0
    if not run.has_solution:
        bound = float("inf") if status is Status.INFEASIBLE else 0.0
        return DPExactSolution(status, None, None, bound, runtime)
    picks = tuple(next(c for c, var in enumerate(xs) if solver.Value(var)) for xs in x)
    lanes = tuple(next(p for yk, p in zip(y, parts) if solver.Value(yk)) for y, parts in groupings)
    objective, feasible = inst.objective(picks, lanes)  # recomputed from the data, never the engine's
    if not feasible:  # pragma: no cover - the model's constraints are the instance's
        raise AssertionError("CP-SAT returned a selection the instance calls infeasible")
    sel = Selection(picks, objective, runtime, 0, lanes)
    return DPExactSolution(status, sel, objective, float(solver.BestObjectiveBound()), runtime)

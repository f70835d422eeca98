"""Plan selection + scheduling as a CP-SAT model (OR-Tools), exact w.r.t. the evaluator.

Model (one structural candidate, candidate sets ``C(v)``, ``Keval`` steps, ``Q`` phases):

* ``x[v,c] ∈ {0,1}``, ``Σ_c x[v,c] = 1`` — one candidate per vertex;
* per compact edge ``e`` and lowering class ``o`` (:mod:`.plan_model`): ``z[e,o] ∈ {0,1}``,
  ``Σ_o z[e,o] = 1`` and ``z[e,o] ≥ x[u,cu] + x[v,cv] − 1`` for every pair producing ``o``;
* ``split[v] = OR`` of the phase-wise classes touching ``v`` (rule 1);
* per step ``k``, vertex ``v`` and candidate ``c``: an optional interval of the unsplit OP node
  (presence ``x[v,c] ∧ ¬split[v]``) and ``Q`` optional phase intervals (presence
  ``x[v,c] ∧ split[v]``), chained; ``S[v,k]``/``E[v,k]`` are the instance's first start and last
  end, ``PS[v,k,q]``/``PE[v,k,q]`` its phase starts/ends;
* every active class adds its fragment per step: precedence ``S[v,k] ≥ E[u,k']``; a COMM or
  RESHARD interval between them on the destination's devices; ``Q`` phase-wise COMMs
  ``PE[u,k,q] ≤ start_q``, ``end_q ≤ PS[v,k,q]``; publication nodes are shared by consumers whose
  class (kind, duration, devices, layout) coincides, as :func:`~rpeg.ir.lower.lower` reuses an
  installed version; chains ``S[t,k] ≥ E[t,k−1]``;
* device exclusivity: one ``NoOverlap`` per atom of the candidate masks (devices no mask tells
  apart share one constraint);
* memory per atom ``a`` and every ``x[v,c]`` on it: ``Σ_m state(m,a) + Σ_m copy(m,a) + A(v,c,a) ≤
  M_eff`` with the evaluator's persistent/transient rules (``copy(m,a) ≥ w(c)·(x[v,c] −
  T[m,a])`` for shadow copies, ``T[m,a]`` = the trainer of ``m`` sits on ``a``);
* objective: minimise ``MS = max_{v,k} E[v,k]``.

Unavoidable simplifications (also in ``docs/formulations.md``): durations are rounded *up* to
the time unit (``serial horizon / 10⁵`` by default), so the proven makespan is that of the
rounded problem — at most one unit per node on the critical path above the true optimum (about
0.05% on the test instances); byte figures are rounded up to whole bytes. The model finds the best schedule of the chosen plan, whereas the evaluator scores a
plan with the greedy list scheduler; re-scoring the exact plan with the evaluator therefore gives
a makespan no shorter than the exact one (up to the rounding).

Time limits: ``time_limit`` (or a ``deadline`` handed down by the caller) covers building and
solving; building checks it as it goes and, past it, the result is ``time_limit`` with no plan
and a message saying the model was too large to build in time; CP-SAT gets what is left. Ctrl-C
stops CP-SAT's search (:func:`~.cpsat.run_cpsat`) with the best solution so far, or building at
once; either way ``interrupted`` is set, so that the caller stops too.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

from ..ir.lower import COMM, PREC
from ..ir.plan import Plan
from ..ir.types import Role
from ..scoring.scheduler import atoms_of
from .cpsat import run_cpsat
from .deadline import BuildTimeout, Deadline
from .plan_model import PlanInstance, serving_groups, trainer_of

__all__ = ["DEFAULT_RESOLUTION", "PlanSolution", "solve_plan_cpsat"]

DEFAULT_RESOLUTION = 1e5  # time units in the serial horizon


@dataclass
class PlanSolution:
    """Outcome of an exact plan-selection model.

    Attributes
    ----------
    status
        ``"optimal"``, ``"feasible"``, ``"infeasible"`` or ``"time_limit"`` (no solution found in
        time) — mapped from the engine's own status.
    plan
        The chosen plan (``None`` without a solution).
    makespan
        The model's makespan in seconds (``inf`` without a solution).
    lower_bound
        Best proven lower bound on the makespan, in seconds, valid for the unrounded durations
        (the engine's bound minus one time unit per node a path can hold).
    runtime
        Seconds spent in the engine.
    starts
        Start time (s) per lowered-node identity ``(kind, vertex, source, step, phase)``.
    engine
        Engine name.
    time_to_first
        Seconds until the first solution (``None`` if none).
    interrupted
        Ctrl-C stopped the engine (the solution, if any, is the best so far).
    message
        Why the engine stopped early, when it did (e.g. ``"model too large to build in 0.5 s
        (…)"``); empty otherwise.
    """

    status: str
    plan: Plan | None
    makespan: float
    lower_bound: float
    runtime: float
    starts: dict[tuple, float] = field(default_factory=dict)
    engine: str = "cpsat"
    time_to_first: float | None = None
    interrupted: bool = False
    message: str = ""


def solve_plan_cpsat(
    inst: PlanInstance,
    *,
    time_limit: float | None = None,
    seed: int = 0,
    threads: int | None = None,
    hint: Plan | None = None,
    unit: float | None = None,
    deadline: Deadline | None = None,
) -> PlanSolution:
    """Build and solve the CP-SAT model of the module docstring.

    Parameters
    ----------
    inst
        Instance from :func:`~rpeg.formulations.plan_model.build_instance`.
    time_limit
        Seconds for building and solving (``None``: until proven); ignored when ``deadline`` is
        given.
    seed
        CP-SAT random seed.
    threads
        Search workers (``None``: OR-Tools' default).
    hint
        A plan whose choices are all in the candidate sets, used as a solution hint.
    unit
        Seconds per integer time unit; ``None`` picks ``serial horizon / DEFAULT_RESOLUTION``.
        Durations are rounded up to it: a finer unit is more exact and slower
        to prove.
    deadline
        The caller's deadline (building checks it; CP-SAT gets the time left on it).

    Returns
    -------
    PlanSolution
        Status ``"time_limit"`` with no plan and a message when the model could not be built in
        time; ``interrupted`` after Ctrl-C.
    """
    t0 = time.monotonic()
    if deadline is None:
        deadline = Deadline(time_limit, start=t0)
    try:
        return _solve(inst, deadline, seed, threads, hint, unit, t0)
    except BuildTimeout as exc:
        return PlanSolution("time_limit", None, math.inf, 0.0, time.monotonic() - t0, message=str(exc))
    except KeyboardInterrupt:
        return PlanSolution(
            "time_limit",
            None,
            math.inf,
            0.0,
            time.monotonic() - t0,
            interrupted=True,
            message="interrupted (Ctrl-C) while building the model",
        )


def _solve(
    inst: PlanInstance,
    deadline: Deadline,
    seed: int,
    threads: int | None,
    hint: Plan | None,
    unit: float | None,
    t0: float,
) -> PlanSolution:
    """:func:`solve_plan_cpsat` without the catching (raises ``BuildTimeout``)."""
    from ortools.sat.python import cp_model

    ev = inst.ev
    g = ev.graph
    n = len(g.vertices)
    K = inst.k_eval
    Q = inst.n_phases
    cands = inst.cands
    m = cp_model.CpModel()

    if unit is None:
        unit = inst.serial_seconds() / DEFAULT_RESOLUTION

    def ticks(seconds: float) -> int:
        return math.ceil(seconds / unit - 1e-9)

    # horizon: everything serialised
    total = 0
    for v in range(n):
        total += max(ticks(sum(w)) + (ticks(sum(p)) if p else 0) for w, p in inst.op[v]) * K
    for ec in inst.edges:
        for key in ec.classes:
            if key is None or key[0] == PREC:
                continue
            durs = key[1] if isinstance(key[1], tuple) else (key[1],)
            total += sum(ticks(d) + 1 for d in durs) * K
    horizon = max(1, total)

    x = [[m.NewBoolVar(f"x[{v},{c}]") for c in range(len(cands[v]))] for v in range(n)]
    for v in range(n):
        m.AddExactlyOne(x[v])
    z: list[list] = []
    for ei, ec in enumerate(inst.edges):
        zs = [m.NewBoolVar(f"z[{ei},{o}]") for o in range(len(ec.classes))]
        m.AddExactlyOne(zs)
        for o, pairs in enumerate(ec.pairs):
            for cu, cv in pairs:
                m.AddBoolOr([x[ec.src][cu].Not(), x[ec.dst][cv].Not(), zs[o]])
        z.append(zs)
    split = []
    for v in range(n):
        if not inst.can_split[v]:
            split.append(None)
            continue
        s = m.NewBoolVar(f"split[{v}]")
        lits = [z[ei][o] for ei, o in inst.split_edges[v]]
        m.AddMaxEquality(s, lits)
        split.append(s)

    # intervals by device set, for exclusivity
    by_mask: dict[int, list] = defaultdict(list)
    S = [[m.NewIntVar(0, horizon, f"S[{v},{k}]") for k in range(K)] for v in range(n)]
    E = [[m.NewIntVar(0, horizon, f"E[{v},{k}]") for k in range(K)] for v in range(n)]
    PS = [
        [[m.NewIntVar(0, horizon, "") for _ in range(Q)] if split[v] is not None else [] for _ in range(K)]
        for v in range(n)
    ]
    PE = [
        [[m.NewIntVar(0, horizon, "") for _ in range(Q)] if split[v] is not None else [] for _ in range(K)]
        for v in range(n)
    ]
    op_vars: dict[tuple, tuple] = {}  # (v, k, c, phase) -> (start var, presence)
    tick = deadline.ticker("adding the operation intervals", every=32)
    for v in range(n):
        for c, (whole, phased) in enumerate(inst.op[v]):
            tick()
            mask = cands[v][c].allocation.mask
            if split[v] is None:
                pres_whole = x[v][c]
            else:
                pres_whole = m.NewBoolVar("")
                m.AddBoolAnd([x[v][c], split[v].Not()]).OnlyEnforceIf(pres_whole)
                m.AddBoolOr([x[v][c].Not(), split[v], pres_whole])
                pres_split = m.NewBoolVar("")
                m.AddBoolAnd([x[v][c], split[v]]).OnlyEnforceIf(pres_split)
                m.AddBoolOr([x[v][c].Not(), split[v].Not(), pres_split])
            for k in range(K):
                st = m.NewIntVar(0, horizon, "")
                iv = m.NewOptionalFixedSizeIntervalVar(st, ticks(whole[0]), pres_whole, "")
                by_mask[mask].append(iv)
                m.Add(S[v][k] == st).OnlyEnforceIf(pres_whole)
                m.Add(E[v][k] == st + ticks(whole[0])).OnlyEnforceIf(pres_whole)
                op_vars[(v, k, c, 0)] = (st, pres_whole)
                if split[v] is None:
                    continue
                prev_end = None
                for q in range(Q):
                    sq = m.NewIntVar(0, horizon, "")
                    d = ticks(phased[q])
                    by_mask[mask].append(m.NewOptionalFixedSizeIntervalVar(sq, d, pres_split, ""))
                    m.Add(PS[v][k][q] == sq).OnlyEnforceIf(pres_split)
                    m.Add(PE[v][k][q] == sq + d).OnlyEnforceIf(pres_split)
                    if prev_end is not None:
                        m.Add(sq >= prev_end).OnlyEnforceIf(pres_split)
                    prev_end = sq + d
                    op_vars[(v, k, c, q + 1)] = (sq, pres_split)
                m.Add(S[v][k] == PS[v][k][0]).OnlyEnforceIf(pres_split)
                m.Add(E[v][k] == PE[v][k][Q - 1]).OnlyEnforceIf(pres_split)

    node_vars: dict[tuple, list] = defaultdict(list)  # lowered identity -> [(start, presence)]
    shared: dict[tuple, tuple] = {}  # publication nodes shared by consumers
    tick = deadline.ticker("adding the transfer intervals", every=32)
    for ei, ec in enumerate(inst.edges):
        u, v = ec.src, ec.dst
        for o, key in enumerate(ec.classes):
            lit = z[ei][o]
            if key is None:
                continue
            for k in range(K):
                tick()
                if ec.kind == "pub":
                    src_k = k - g.staleness[ec.model] - 1
                    if src_k < 0:
                        continue
                elif ec.kind == "data" or ec.kind == "pair":
                    src_k = k
                if key[0] == PREC:
                    m.Add(S[v][k] >= E[u][src_k]).OnlyEnforceIf(lit)
                    continue
                if ec.kind == "data" and len(key[1]) > 1:  # phase-wise COMMs
                    for q, dur in enumerate(key[1]):
                        st = m.NewIntVar(0, horizon, "")
                        d = ticks(dur)
                        by_mask[key[2]].append(m.NewOptionalFixedSizeIntervalVar(st, d, lit, ""))
                        m.Add(st >= PE[u][k][q]).OnlyEnforceIf(lit)
                        m.Add(PS[v][k][q] >= st + d).OnlyEnforceIf(lit)
                        node_vars[(COMM, v, u, k, q + 1)].append((st, lit))
                    continue
                if ec.kind == "pub":
                    skey = (ec.model, src_k, key)
                    if skey not in shared:
                        st = m.NewIntVar(0, horizon, "")
                        pres = m.NewBoolVar("")
                        d = ticks(key[1])
                        by_mask[key[2]].append(m.NewOptionalFixedSizeIntervalVar(st, d, pres, ""))
                        m.Add(st >= E[u][src_k]).OnlyEnforceIf(pres)
                        shared[skey] = (st, d, pres, [])
                    st, d, pres, lits = shared[skey]
                    lits.append((lit, v))
                    m.Add(S[v][k] >= st + d).OnlyEnforceIf(lit)
                    continue
                kind = key[0]
                dur = key[1][0] if ec.kind == "data" else key[1]
                st = m.NewIntVar(0, horizon, "")
                d = ticks(dur)
                by_mask[key[2]].append(m.NewOptionalFixedSizeIntervalVar(st, d, lit, ""))
                m.Add(st >= E[u][src_k]).OnlyEnforceIf(lit)
                m.Add(S[v][k] >= st + d).OnlyEnforceIf(lit)
                node_vars[(kind, v, u, k, 0)].append((st, lit))
    for (model_name, src_k, key), (st, _d, pres, lits) in shared.items():
        m.AddMaxEquality(pres, [lit for lit, _ in lits])
        node_vars[("pub", model_name, src_k, key)].append((st, pres, lits))
    for t in (i for i, vv in enumerate(g.vertices) if vv.role is Role.TRAINING):
        for k in range(1, K):
            m.Add(S[t][k] >= E[t][k - 1])

    deadline.check("adding the device exclusivity constraints")
    atoms = atoms_of(set(by_mask))
    for a in atoms:
        ivs = [iv for mask, group in by_mask.items() if mask & a for iv in group]
        if len(ivs) > 1:
            m.AddNoOverlap(ivs)

    deadline.check("adding the memory constraints")
    _memory(m, inst, x, atoms_of({c.allocation.mask for cs in cands for c in cs}), deadline)
    deadline.check("adding the objective")

    ms = m.NewIntVar(0, horizon, "makespan")
    m.AddMaxEquality(ms, [E[v][k] for v in range(n) for k in range(K)])
    m.Add(ms >= _critical_path_bound(inst, ticks))
    m.Minimize(ms)
    if hint is not None:
        for v in range(n):
            for c, ch in enumerate(cands[v]):
                m.AddHint(x[v][c], ch == hint.choices[v])

    solver = cp_model.CpSolver()
    limit = deadline.limit()
    if limit is not None:
        solver.parameters.max_time_in_seconds = limit
    solver.parameters.random_seed = int(seed)
    if threads is not None:
        solver.parameters.num_search_workers = int(threads)
    first: list[float] = []

    class _First(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            if not first:
                first.append(time.monotonic() - t0)

    code, interrupted = run_cpsat(solver, m, _First())
    runtime = time.monotonic() - t0
    note = "interrupted (Ctrl-C)" if interrupted else ""
    status = {
        cp_model.OPTIMAL: "optimal",
        cp_model.FEASIBLE: "feasible",
        cp_model.INFEASIBLE: "infeasible",
        cp_model.MODEL_INVALID: "error",
    }.get(code, "time_limit")
    # a bound valid for the unrounded durations: each node on a path was rounded up by < 1 unit
    slack = inst.max_path_nodes() * unit
    bound = (
        max(0.0, solver.BestObjectiveBound() * unit - slack)
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE)
        else 0.0
    )
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if code == cp_model.UNKNOWN:
            status = "time_limit"
        return PlanSolution(
            status, None, math.inf, bound, runtime, engine="cpsat", interrupted=interrupted, message=note
        )
    picks = [next(c for c in range(len(cands[v])) if solver.Value(x[v][c])) for v in range(n)]
    starts: dict[tuple, float] = {}
    for (v, k, c, phase), (st, pres) in op_vars.items():
        if c == picks[v] and solver.Value(pres):
            starts[(0, v, -1, k, phase)] = solver.Value(st) * unit
    for ident, items in node_vars.items():
        if ident[0] == "pub":
            st, pres, lits = items[0]
            if solver.Value(pres):
                _, model_name, src_k, key = ident
                consumers = sorted(vv for lit, vv in lits if solver.Value(lit))
                t_vertex = g.index[g.training_vertex(model_name).name]
                k = src_k + g.staleness[model_name] + 1
                starts[(key[0], consumers[0], t_vertex, k, 0)] = solver.Value(st) * unit
            continue
        for st, lit in items:
            if solver.Value(lit):
                starts[ident] = solver.Value(st) * unit
    return PlanSolution(
        status,
        inst.plan_of(picks),
        solver.ObjectiveValue() * unit,
        bound,
        runtime,
        starts,
        "cpsat",
        first[0] if first else None,
        interrupted,
        note,
    )


def _critical_path_bound(inst: PlanInstance, ticks) -> int:
    """Analytical lower bound on the makespan, in time units: for each training vertex, the
    longest data path into it in one step plus ``Keval`` of its own updates (they are chained),
    every node at its fastest candidate and every transfer free."""
    g = inst.ev.graph
    fastest = [
        min(ticks(w[0]) if not p else min(ticks(w[0]), sum(ticks(d) for d in p)) for w, p in inst.op[v])
        for v in range(len(g.vertices))
    ]
    head = [0] * len(g.vertices)  # longest path ending before v starts
    for e in sorted(g.data_edges, key=lambda e: g.index[e.dst]):
        u, v = g.index[e.src], g.index[e.dst]
        head[v] = max(head[v], head[u] + fastest[u])
    bound = 0
    for t, vert in enumerate(g.vertices):
        if vert.role is Role.TRAINING:
            bound = max(bound, head[t] + inst.k_eval * fastest[t])
    return bound


def _memory(m, inst: PlanInstance, x: list[list], atoms: list[int], deadline: Deadline | None = None) -> None:
    """Per-atom memory constraints with the evaluator's persistent/transient rules (``deadline``
    checked every 64 rows)."""
    tick = (deadline or Deadline()).ticker("adding the memory constraints", every=64)
    ev = inst.ev
    g = ev.graph
    cands = inst.cands
    trainers = trainer_of(ev)
    serving = serving_groups(ev)
    cap = math.floor(inst.m_eff)

    def on(v: int, a: int) -> list[int]:
        return [c for c, ch in enumerate(cands[v]) if ch.allocation.mask & a]

    for a in atoms:
        terms = []
        t_on: dict[str, list] = {}
        for model_name, t in trainers.items():
            cs = on(t, a)
            t_on[model_name] = [x[t][c] for c in cs]
            terms += [math.ceil(inst.memory[t][c].train_state) * x[t][c] for c in cs]
        for model_name, vs in serving.items():
            trainer = trainers.get(model_name)
            tau = g.staleness.get(model_name, 0)
            if trainer is not None and tau == 0:
                continue  # no persistent serving copy anywhere
            items = [(v, c) for v in vs for c in on(v, a)]
            if not items:
                continue
            top = max(math.ceil(inst.memory[v][c].weights) for v, c in items)
            copy = m.NewIntVar(0, top, "")
            for v, c in items:
                w = math.ceil(inst.memory[v][c].weights)
                if trainer is None:
                    m.Add(copy >= w * x[v][c])
                else:  # shadow copy only off the trainer's devices
                    m.Add(copy >= w * x[v][c] - w * sum(t_on[model_name]))
            terms.append(copy)
        persistent = sum(terms)
        for v, vert in enumerate(g.vertices):
            for c in on(v, a):
                mem = inst.memory[v][c]
                need = math.ceil(mem.transient)
                extra = 0
                if vert.role is not Role.TRAINING and vert.model in trainers:
                    w = math.ceil(mem.weights)
                    if g.staleness[vert.model] == 0:
                        need += w
                    else:  # materialised only where the trainer also sits
                        extra = w * sum(t_on[vert.model])
                tick()
                m.Add(persistent + extra + need <= cap).OnlyEnforceIf(x[v][c])

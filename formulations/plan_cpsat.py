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
* the symmetry breaking and the redundant cuts of :data:`~.plan_model.PLAN_BLOCKS` (durations,
  edge delays and per-atom energy linear in ``x``/``z``, the critical path);
* every time variable in ``[0, H]``: the serial horizon or, with a warm-start plan, ``⌈UB/unit⌉ +
  N`` from its evaluator makespan ``UB`` (:meth:`PlanCPModel._horizon`);
* objective: minimise ``MS = max_{v,k} E[v,k]``.

:class:`PlanCPModel` adds these as the named blocks of :data:`~.plan_model.PLAN_BLOCKS`, in the
same order as :class:`~.plan_milp.PlanMILPModel`, so the two engines can be compared block by block.

Unavoidable simplifications (also in ``docs/formulations.md``): durations are rounded *up* to
the time unit (``serial horizon / 10⁵`` by default), so the proven makespan is that of the
rounded problem — at most one unit per node on the critical path above the true optimum (about
0.05% on the test instances); byte figures are rounded up to whole bytes. The model finds the best schedule of the chosen plan, whereas the evaluator scores a
plan with the greedy list scheduler; re-scoring the exact plan with the evaluator therefore gives
a makespan no shorter than the exact one (up to the rounding).

Time limits: ``time_limit`` (or a ``deadline`` handed down by the caller) covers building and
solving; building checks it as it goes and, past it, the result is ``time_limit`` with no plan
and a message saying the model was too large to build in time; CP-SAT gets what is left. Ctrl-C
stops CP-SAT's search (:func:`~.cpsat_backend.run_cpsat`) with the best solution so far, or building at
once; either way ``interrupted`` is set, so that the caller stops too.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any

from ..ir.lower import COMM, PREC
from ..ir.plan import Plan
from ..ir.types import Role
from ..scoring.scheduler import atoms_of
from . import cpsat_backend
from .deadline import BuildTimeout, Deadline, heap_frozen
from .plan_model import (
    PlanInstance,
    PlanModel,
    PlanSolution,
    critical_path_bound,
    cut_constraints,
    horizon_bound,
    serving_groups,
    trainer_of,
)
from .status import Status

__all__ = ["DEFAULT_RESOLUTION", "PlanCPModel", "solve_plan_cpsat"]

DEFAULT_RESOLUTION = 1e5  # time units in the serial horizon

#: What each block is called in a "model too large to build" message.
_STAGES = {
    "choice": "adding the candidate choice",
    "symmetry": "adding the symmetry breaking",
    "edges": "adding the edge classes",
    "split": "adding the phase splits",
    "operations": "adding the operation intervals",
    "transfers": "adding the transfer intervals",
    "chains": "adding the training chains",
    "exclusivity": "adding the device exclusivity constraints",
    "memory": "adding the memory constraints",
    "cuts": "adding the redundant constraints",
}


class PlanCPModel(PlanModel):
    """The CP-SAT model of ``inst`` (module docstring): variables, the constraint blocks of
    :data:`~.plan_model.PLAN_BLOCKS` in that order, and the objective.

    ``PlanCPModel(inst).solve()`` is :func:`solve_plan_cpsat` without the catching.

    Parameters
    ----------
    inst
        Instance from :func:`~rpeg.formulations.plan_model.build_plan_instance`.
    unit
        Seconds per integer time unit (``None``: ``serial horizon / DEFAULT_RESOLUTION``).
    deadline
        Checked between the blocks and inside the large ones; past it, building raises
        :class:`~.deadline.BuildTimeout`.
    hint
        A plan whose choices are in the candidate sets: hinted to the engine, and its choice is
        the one the symmetry block keeps in its orbit.
    upper_bound
        A makespan (s) no optimum exceeds (:func:`~.plan_model.hint_makespan` of ``hint``), which
        shrinks the horizon; ``None``: the serial horizon.

    Attributes
    ----------
    model
        The ``cp_model.CpModel``.
    blocks
        The names of the blocks added, in order (:data:`~.plan_model.PLAN_BLOCKS` once built).
    x, z, split
        Candidate, edge-class and split literals (``split[v]`` is ``None`` where ``v`` never splits).
    S, E, PS, PE
        Instance and phase starts/ends per vertex and step (integer time units).
    intervals
        Interval variables per device mask (for exclusivity).
    """

    def __init__(
        self,
        inst: PlanInstance,
        *,
        unit: float | None = None,
        deadline: Deadline | None = None,
        hint: Plan | None = None,
        upper_bound: float | None = None,
    ) -> None:
        cp_model = cpsat_backend.cp_model()
        super().__init__(inst, deadline, keep=hint)
        self.unit = inst.serial_seconds() / DEFAULT_RESOLUTION if unit is None else unit
        self.model = cp_model.CpModel()
        self.horizon = self._horizon(upper_bound)
        self.intervals: dict[int, list[Any]] = defaultdict(list)
        #: ``(mask, duration, presence)`` of every transfer node (for the energy cuts)
        self.transfers: list[tuple[int, int, Any]] = []
        self.makespan: Any = None
        self._add_blocks(_STAGES.__getitem__)
        self.deadline.check("adding the objective")
        self._objective()
        if hint is not None:
            self.add_hint(hint)

    def ticks(self, seconds: float) -> int:
        """``⌈seconds / unit⌉``: a duration rounded up to the time unit."""
        return math.ceil(seconds / self.unit - 1e-9)

    def _horizon(self, upper_bound: float | None = None) -> int:
        """Everything serialised, in time units: every OP at its slowest candidate (both ways
        split and unsplit) and every transfer, ``Keval`` times; or, when smaller,
        ``⌈upper_bound / unit⌉ + N`` with ``N`` = :meth:`~.plan_model.PlanInstance.max_path_nodes`
        (a schedule of makespan ``upper_bound`` keeps its order with every duration rounded up by
        less than one unit, each start moving by at most one unit per node before it)."""
        inst, K, ticks = self.inst, self.inst.k_eval, self.ticks
        if upper_bound is not None and math.isfinite(upper_bound):
            tight = ticks(upper_bound) + inst.max_path_nodes()
        else:
            tight = None
        total = 0
        for row in inst.op:
            total += max(ticks(sum(w)) + (ticks(sum(p)) if p else 0) for w, p in row) * K
        for ec in inst.edges:
            for key in ec.classes:
                if key is None or key[0] == PREC:
                    continue
                durs = key[1] if isinstance(key[1], tuple) else (key[1],)
                total += sum(ticks(d) + 1 for d in durs) * K
        return max(1, total if tight is None else min(total, tight))

    # ------------------------------------------------------------------------------ blocks
    def _choice(self) -> None:
        m, cands = self.model, self.inst.cands
        self.x = [[m.NewBoolVar(f"x[{v},{c}]") for c in range(len(cands[v]))] for v in range(self.n)]
        for v in range(self.n):
            m.AddExactlyOne(self.x[v])

    def _symmetry(self) -> None:
        if self.symmetry is not None:
            v0, out = self.symmetry
            for c in out:
                self.model.Add(self.x[v0][c] == 0)

    def _edges(self) -> None:
        m, x = self.model, self.x
        for ei, ec in enumerate(self.inst.edges):
            zs = [m.NewBoolVar(f"z[{ei},{o}]") for o in range(len(ec.classes))]
            m.AddExactlyOne(zs)
            for o, pairs in enumerate(ec.pairs):
                for cu, cv in pairs:
                    m.AddBoolOr([x[ec.src][cu].Not(), x[ec.dst][cv].Not(), zs[o]])
            self.z.append(zs)

    def _split(self) -> None:
        m, inst = self.model, self.inst
        for v in range(self.n):
            if not inst.can_split[v]:
                self.split.append(None)
                continue
            s = m.NewBoolVar(f"split[{v}]")
            m.AddMaxEquality(s, [self.z[ei][o] for ei, o in inst.split_edges[v]])
            self.split.append(s)

    def _operations(self) -> None:
        m, inst, H, n, split = self.model, self.inst, self.horizon, self.n, self.split
        K, Q = inst.k_eval, inst.n_phases
        self.S = [[m.NewIntVar(0, H, f"S[{v},{k}]") for k in range(K)] for v in range(n)]
        self.E = [[m.NewIntVar(0, H, f"E[{v},{k}]") for k in range(K)] for v in range(n)]
        self.PS = [
            [[m.NewIntVar(0, H, "") for _ in range(Q)] if split[v] is not None else [] for _ in range(K)]
            for v in range(n)
        ]
        self.PE = [
            [[m.NewIntVar(0, H, "") for _ in range(Q)] if split[v] is not None else [] for _ in range(K)]
            for v in range(n)
        ]
        tick = self.deadline.ticker(_STAGES["operations"], every=32)
        for v in range(n):
            for c, (whole, phased) in enumerate(inst.op[v]):
                tick()
                self._operation(v, c, whole, phased)

    def _presences(self, v: int, c: int) -> tuple[Any, Any]:
        """The presence literals of candidate ``c``'s unsplit OP (``x ∧ ¬split``) and of its
        phases (``x ∧ split``; ``None`` where ``v`` never splits)."""
        m, x, split = self.model, self.x[v][c], self.split[v]
        if split is None:
            return x, None
        pres_whole = m.NewBoolVar("")
        m.AddBoolAnd([x, split.Not()]).OnlyEnforceIf(pres_whole)
        m.AddBoolOr([x.Not(), split, pres_whole])
        pres_split = m.NewBoolVar("")
        m.AddBoolAnd([x, split]).OnlyEnforceIf(pres_split)
        m.AddBoolOr([x.Not(), split.Not(), pres_split])
        return pres_whole, pres_split

    def _operation(self, v: int, c: int, whole: tuple[float, ...], phased: tuple[float, ...]) -> None:
        """Candidate ``c`` of vertex ``v`` at every step: one unsplit OP interval and, where
        ``v`` can split, ``Q`` chained phase intervals."""
        m, H, ticks, Q = self.model, self.horizon, self.ticks, self.inst.n_phases
        S, E, PS, PE = self.S[v], self.E[v], self.PS[v], self.PE[v]
        mask = self.inst.cands[v][c].allocation.mask
        pres_whole, pres_split = self._presences(v, c)
        for k in range(self.inst.k_eval):
            st = m.NewIntVar(0, H, "")
            iv = m.NewOptionalFixedSizeIntervalVar(st, ticks(whole[0]), pres_whole, "")
            self.intervals[mask].append(iv)
            m.Add(S[k] == st).OnlyEnforceIf(pres_whole)
            m.Add(E[k] == st + ticks(whole[0])).OnlyEnforceIf(pres_whole)
            self.op_vars[(v, k, c, 0)] = (st, pres_whole)
            if pres_split is None:
                continue
            prev_end = None
            for q in range(Q):
                sq = m.NewIntVar(0, H, "")
                d = ticks(phased[q])
                self.intervals[mask].append(m.NewOptionalFixedSizeIntervalVar(sq, d, pres_split, ""))
                m.Add(PS[k][q] == sq).OnlyEnforceIf(pres_split)
                m.Add(PE[k][q] == sq + d).OnlyEnforceIf(pres_split)
                if prev_end is not None:
                    m.Add(sq >= prev_end).OnlyEnforceIf(pres_split)
                prev_end = sq + d
                self.op_vars[(v, k, c, q + 1)] = (sq, pres_split)
            m.Add(S[k] == PS[k][0]).OnlyEnforceIf(pres_split)
            m.Add(E[k] == PE[k][Q - 1]).OnlyEnforceIf(pres_split)

    def _transfers(self) -> None:
        g = self.inst.ev.graph
        shared: dict[tuple, tuple] = {}  # publication nodes shared by consumers
        tick = self.deadline.ticker(_STAGES["transfers"], every=32)
        for ei, ec in enumerate(self.inst.edges):
            for o, key in enumerate(ec.classes):
                if key is None:
                    continue
                for k in range(self.inst.k_eval):
                    tick()
                    src_k = k - g.staleness[ec.model] - 1 if ec.kind == "pub" else k
                    if src_k >= 0:
                        self._fragment(ec, key, self.z[ei][o], k, src_k, shared)
        m = self.model
        for (model_name, src_k, key), (st, _d, pres, lits) in shared.items():
            m.AddMaxEquality(pres, [lit for lit, _ in lits])
            self.node_vars[("pub", model_name, src_k, key)].append((st, pres, lits))

    def _fragment(self, ec: Any, key: tuple, lit: Any, k: int, src_k: int, shared: dict) -> None:
        """The lowered fragment of class ``key`` of edge ``ec`` at step ``k`` (source step
        ``src_k``), present iff ``lit``: a precedence, ``Q`` phase-wise COMMs, a publication node
        shared by every consumer of that version and layout (as :func:`~rpeg.ir.lower.lower`
        reuses an installed version), or a COMM / RESHARD node."""
        m, H, ticks = self.model, self.horizon, self.ticks
        u, v = ec.src, ec.dst
        S, E, PS, PE = self.S, self.E, self.PS, self.PE
        if key[0] == PREC:
            m.Add(S[v][k] >= E[u][src_k]).OnlyEnforceIf(lit)
            return
        if ec.kind == "data" and len(key[1]) > 1:  # phase-wise COMMs
            for q, dur in enumerate(key[1]):
                st = m.NewIntVar(0, H, "")
                d = ticks(dur)
                self.intervals[key[2]].append(m.NewOptionalFixedSizeIntervalVar(st, d, lit, ""))
                self.transfers.append((key[2], d, lit))
                m.Add(st >= PE[u][k][q]).OnlyEnforceIf(lit)
                m.Add(PS[v][k][q] >= st + d).OnlyEnforceIf(lit)
                self.node_vars[(COMM, v, u, k, q + 1)].append((st, lit))
            return
        if ec.kind == "pub":
            skey = (ec.model, src_k, key)
            if skey not in shared:
                st = m.NewIntVar(0, H, "")
                pres = m.NewBoolVar("")
                d = ticks(key[1])
                self.intervals[key[2]].append(m.NewOptionalFixedSizeIntervalVar(st, d, pres, ""))
                self.transfers.append((key[2], d, pres))
                m.Add(st >= E[u][src_k]).OnlyEnforceIf(pres)
                shared[skey] = (st, d, pres, [])
            st, d, pres, lits = shared[skey]
            lits.append((lit, v))
            m.Add(S[v][k] >= st + d).OnlyEnforceIf(lit)
            return
        dur = key[1][0] if ec.kind == "data" else key[1]
        st = m.NewIntVar(0, H, "")
        d = ticks(dur)
        self.intervals[key[2]].append(m.NewOptionalFixedSizeIntervalVar(st, d, lit, ""))
        self.transfers.append((key[2], d, lit))
        m.Add(st >= E[u][src_k]).OnlyEnforceIf(lit)
        m.Add(S[v][k] >= st + d).OnlyEnforceIf(lit)
        self.node_vars[(key[0], v, u, k, 0)].append((st, lit))

    def _chains(self) -> None:
        g = self.inst.ev.graph
        for t in (i for i, vv in enumerate(g.vertices) if vv.role is Role.TRAINING):
            for k in range(1, self.inst.k_eval):
                self.model.Add(self.S[t][k] >= self.E[t][k - 1])

    def _exclusivity(self) -> None:
        # one NoOverlap per atom of the masks: devices no mask tells apart share one constraint
        for a in atoms_of(set(self.intervals)):
            ivs = [iv for mask, group in self.intervals.items() if mask & a for iv in group]
            if len(ivs) > 1:
                self.model.AddNoOverlap(ivs)

    def _memory(self) -> None:
        cands = self.inst.cands
        _memory(
            self.model,
            self.inst,
            self.x,
            atoms_of({c.allocation.mask for cs in cands for c in cs}),
            self.deadline,
        )

    def _ms(self) -> Any:
        """``MS``, created when first needed."""
        if self.makespan is None:
            self.makespan = self.model.NewIntVar(0, self.horizon, "makespan")
        return self.makespan

    def _cuts(self) -> None:
        """The redundant constraints of the ``cuts`` block (:data:`~.plan_model.PLAN_BLOCKS`,
        :func:`~.plan_model.cut_constraints`), every duration in time units as the nodes have
        them."""
        m, inst, ticks = self.model, self.inst, self.ticks
        ms = self._ms()
        for c in cut_constraints(
            inst, self.x, self.S, self.E, self.z, ms, self.transfers, set(self.intervals), ticks
        ):
            m.Add(c)
        m.Add(ms >= math.ceil(critical_path_bound(inst, ticks)))

    def _objective(self) -> None:
        """``min MS``, ``MS = max_{v,k} E[v,k]`` (its lower ends are in the ``cuts`` block)."""
        m, n, K = self.model, self.n, self.inst.k_eval
        ms = self._ms()
        m.AddMaxEquality(ms, [self.E[v][k] for v in range(n) for k in range(K)])
        m.Minimize(ms)

    # ------------------------------------------------------------------------------- solve
    def add_hint(self, plan: Plan) -> None:
        """Hint ``plan``'s choices (all in the candidate sets) to CP-SAT."""
        cands = self.inst.cands
        cpsat_backend.add_hints(
            self.model,
            ((self.x[v][c], ch == plan.choices[v]) for v in range(self.n) for c, ch in enumerate(cands[v])),
        )

    def solve(
        self,
        *,
        deadline: Deadline | None = None,
        seed: int = 0,
        threads: int | None = None,
        t0: float | None = None,
    ) -> PlanSolution:
        """Solve with the time left on ``deadline`` (CP-SAT's status mapped once, by
        :func:`~.cpsat_backend.map_status`); ``t0`` is when the caller started (runtimes count
        from it)."""
        cp_model = cpsat_backend.cp_model()
        t0 = time.monotonic() if t0 is None else t0
        first: list[float] = []

        class _First(cp_model.CpSolverSolutionCallback):
            def on_solution_callback(self) -> None:
                if not first:
                    first.append(time.monotonic() - t0)

        limit = (deadline or Deadline()).limit()
        run = cpsat_backend.solve(self.model, time_limit=limit, seed=seed, threads=threads, callback=_First())
        runtime = time.monotonic() - t0
        note = "interrupted (Ctrl-C)" if run.interrupted else ""
        if not run.has_solution:
            return PlanSolution.without_plan(
                run.status, runtime, "cpsat", interrupted=run.interrupted, message=note
            )
        solver, unit = run.solver, self.unit
        # a bound valid for the unrounded durations: each node on a path was rounded up by < 1 unit
        bound = max(0.0, solver.BestObjectiveBound() * unit - self.inst.max_path_nodes() * unit)
        picks, starts = self._read(solver)
        return PlanSolution(
            run.status,
            self.inst.plan_of(picks),
            solver.ObjectiveValue() * unit,
            bound,
            runtime,
            starts,
            "cpsat",
            first[0] if first else None,
            run.interrupted,
            note,
        )

    def _read(self, solver: Any) -> tuple[list[int], dict[tuple, float]]:
        """The chosen candidates and the start (s) of every present lowered node."""
        g, cands, unit = self.inst.ev.graph, self.inst.cands, self.unit
        picks = [next(c for c in range(len(cands[v])) if solver.Value(self.x[v][c])) for v in range(self.n)]
        starts: dict[tuple, float] = {}
        for (v, k, c, phase), (st, pres) in self.op_vars.items():
            if c == picks[v] and solver.Value(pres):
                starts[(0, v, -1, k, phase)] = solver.Value(st) * unit
        for ident, items in self.node_vars.items():
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
        return picks, starts


def solve_plan_cpsat(
    inst: PlanInstance,
    *,
    time_limit: float | None = None,
    seed: int = 0,
    threads: int | None = None,
    hint: Plan | None = None,
    unit: float | None = None,
    deadline: Deadline | None = None,
    cutoff: float | None = None,
) -> PlanSolution:
    """Build and solve the CP-SAT model of the module docstring (:class:`PlanCPModel`).

    Parameters
    ----------
    inst
        Instance from :func:`~rpeg.formulations.plan_model.build_plan_instance`.
    time_limit
        Seconds for building and solving (``None``: until proven); ignored when ``deadline`` is
        given.
    seed
        CP-SAT random seed.
    threads
        Search workers (``None``: OR-Tools' default).
    hint
        A plan whose choices are all in the candidate sets, used as a solution hint; its
        evaluator makespan (when memory-feasible) bounds the horizon.
    unit
        Seconds per integer time unit; ``None`` picks ``serial horizon / DEFAULT_RESOLUTION``.
        Durations are rounded up to it: a finer unit is more exact and slower
        to prove.
    deadline
        The caller's deadline (building checks it; CP-SAT gets the time left on it).
    cutoff
        A makespan (s) already achieved elsewhere (another structure): the horizon is at most
        this, and a model infeasible under it gives a ``cut_off`` outcome
        (:meth:`~.plan_model.PlanSolution.under_cutoff`).

    Returns
    -------
    PlanSolution
        Status ``TIME_LIMIT`` with no plan and a message when the model could not be built in
        time; ``interrupted`` after Ctrl-C.
    """
    t0 = time.monotonic()
    if deadline is None:
        deadline = Deadline(time_limit, start=t0)
    try:
        upper, binding = horizon_bound(inst, hint, cutoff)
        with heap_frozen():
            model = PlanCPModel(inst, unit=unit, deadline=deadline, hint=hint, upper_bound=upper)
        sol = model.solve(deadline=deadline, seed=seed, threads=threads, t0=t0)
        return sol.under_cutoff(cutoff, binding)
    except BuildTimeout as exc:
        return PlanSolution.without_plan(Status.TIME_LIMIT, time.monotonic() - t0, "cpsat", message=str(exc))
    except KeyboardInterrupt:
        return PlanSolution.without_plan(
            Status.TIME_LIMIT,
            time.monotonic() - t0,
            "cpsat",
            interrupted=True,
            message="interrupted (Ctrl-C) while building the model",
        )


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

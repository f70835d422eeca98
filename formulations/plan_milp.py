"""Plan selection + scheduling as a Pyomo MILP (disjunctive), the twin of :mod:`.plan_cpsat`.

Same instance data (:mod:`.plan_model`), same variables' meaning, linearised:

* ``x[v,c]``, ``z[e,o]``, ``split[v]`` binaries with ``Σ_c x = 1``, ``Σ_o z = 1``,
  ``z[e,o] ≥ x[u,cu] + x[v,cv] − 1``, ``split[v] ≥ z`` (each phase-wise class touching ``v``) and
  ``split[v] ≤ Σ z``;
* a node (OP phase, COMM, RESHARD) is a start ``s ≥ 0`` with a fixed duration ``d`` (seconds, not
  rounded) and a presence ``p`` that is a binary or a product of binaries linearised
  (``p ≥ a + b − 1, p ≤ a, p ≤ b``);
* conditional precedences ``s_j ≥ s_i + d_i − M·(1 − lit)``; every time variable lies in
  ``[0, H]`` with ``H`` the horizon: the evaluator's makespan of the warm-start plan when one is
  given (an upper bound on the optimum, :func:`~.plan_model.hint_makespan`), else the serial
  horizon; the big-M is ``M = H + 2·d_max`` (``d_max`` the longest node of any candidate,
  :meth:`~.plan_model.PlanInstance.max_duration`): an unchosen candidate's node may last longer
  than a warm start's horizon, and ``M = H`` then cut off feasible plans;
* device exclusivity on every atom: for each pair of nodes that can share it, an order binary
  ``y`` with ``s_i + d_i ≤ s_j + M·(1 − y) + M·(2 − p_i − p_j)`` and
  ``s_j + d_j ≤ s_i + M·y + M·(2 − p_i − p_j)`` (quadratic in the nodes per atom — keep
  instances small: few candidates, small ``Keval``), except for pairs never present together or
  ordered by other constraints (:func:`_needs_order`, :func:`_before`);
* memory per atom and candidate as in the CP-SAT model, enforced with ``H_mem·(1 − x[v,c])``;
* the symmetry breaking and the redundant cuts of :data:`~.plan_model.PLAN_BLOCKS` (linear in
  ``x`` and ``z``, so that the LP relaxation sees durations, transfer delays and device loads);
* ``min MS`` with ``MS ≥ E[v,k]``.

:class:`PlanMILPModel` adds these as the named blocks of :data:`~.plan_model.PLAN_BLOCKS`, in the
same order as :class:`~.plan_cpsat.PlanCPModel`.

Durations stay real numbers here, so this model has no time rounding; its bound and incumbent are
the solver's (``optimal`` is the solver's verdict at its default relative gap, 10⁻⁴ for HiGHS).

Time limits: the model grows quadratically and Pyomo builds it one row at a time (about 70 µs a
row; ``ppo-13b-64gpu`` with 3 candidates has 380,000 rows per structure, 27 s), then hands it to
the solver (about as long again). ``time_limit`` (or the caller's ``deadline``) covers all of it:
the builder checks the deadline every 256 rows, the transfer to HiGHS goes in chunks with a check
between them, and the solver gets what is left. A model too large to build in time gives status
``time_limit``, no plan and the message ``"model too large to build in N s (…)"``; the caller
(:func:`rpeg.solvers.exact.solve_exact`) then returns its warm start.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import defaultdict
from typing import Any

from ..ir.lower import COMM, PREC
from ..ir.plan import Plan
from ..ir.types import Role
from ..scoring.scheduler import atoms_of
from . import pyomo_backend
from .deadline import BuildTimeout, Deadline, heap_frozen
from .plan_model import (
    PlanInstance,
    PlanModel,
    PlanSolution,
    critical_path_bound,
    cut_constraints,
    edge_delay,
    horizon_bound,
    serving_groups,
    trainer_of,
)
from .status import Status

__all__ = ["PlanMILPModel", "solve_plan_milp"]


class _Builder:
    """Collects Pyomo components with generated names (keeps the model code short)."""

    def __init__(self, pyo, horizon: float, deadline: Deadline | None = None) -> None:
        self.pyo = pyo
        self.m = pyo.ConcreteModel()
        self.m.cons = pyo.ConstraintList()
        self.H = horizon
        self.n = 0
        self.tick = (deadline or Deadline()).ticker("building the MILP rows", every=256)

    def var(self, binary: bool = False, ub: float | None = None):
        self.n += 1
        if binary:
            v = self.pyo.Var(domain=self.pyo.Binary)
        else:
            v = self.pyo.Var(domain=self.pyo.NonNegativeReals, bounds=(0, ub if ub is not None else self.H))
        setattr(self.m, f"v{self.n}", v)
        return v

    def add(self, expr) -> None:
        self.tick()
        self.m.cons.add(expr)

    def both(self, a, b):
        """A binary equal to ``a ∧ b``."""
        p = self.var(binary=True)
        self.add(p >= a + b - 1)
        self.add(p <= a)
        self.add(p <= b)
        return p

    def either(self, lits):
        """A binary equal to ``OR(lits)``."""
        p = self.var(binary=True)
        for lit in lits:
            self.add(p >= lit)
        self.add(p <= sum(lits))
        return p


class PlanMILPModel(PlanModel):
    """The Pyomo model of ``inst`` (module docstring): variables, the constraint blocks of
    :data:`~.plan_model.PLAN_BLOCKS` in that order (the same as
    :class:`~.plan_cpsat.PlanCPModel`'s), and the objective.

    Parameters
    ----------
    inst
        Instance from :func:`~rpeg.formulations.plan_model.build_plan_instance`.
    deadline
        Checked between the blocks and every 256 rows; past it, building raises
        :class:`~.deadline.BuildTimeout` (the partial model must then be dropped).
    hint
        A plan whose choices are in the candidate sets: hinted to the engine, and its choice is
        the one the symmetry block keeps in its orbit.
    upper_bound
        A makespan (s) no optimum exceeds (:func:`~.plan_model.hint_makespan` of ``hint``), which
        shrinks the horizon; ``None``: the serial horizon.

    Attributes
    ----------
    model
        The ``ConcreteModel`` (its objective is ``obj``).
    blocks
        The names of the blocks added, in order (:data:`~.plan_model.PLAN_BLOCKS` once built).
    x, z, split
        Candidate, edge-class and split binaries (``split[v]`` is ``None`` where ``v`` never splits).
    S, E, PS, PE
        Instance and phase starts/ends per vertex and step (seconds).
    nodes
        ``(start, duration, presence)`` of every node per device mask (for exclusivity).
    makespan
        ``MS``.
    """

    def __init__(
        self,
        inst: PlanInstance,
        *,
        deadline: Deadline | None = None,
        hint: Plan | None = None,
        upper_bound: float | None = None,
    ) -> None:
        import pyomo.environ as pyo

        super().__init__(inst, deadline, keep=hint)
        self.horizon = inst.serial_seconds() * 1.01 + 1e-9
        if upper_bound is not None and math.isfinite(upper_bound):
            self.horizon = min(self.horizon, upper_bound * (1 + 1e-6) + 1e-9)
        self.b = _Builder(pyo, self.horizon, self.deadline)
        #: the big-M of every conditional constraint: the horizon bounds the time variables, but
        #: an unchosen candidate's node may last longer than a warm start's or cutoff's horizon
        self.big_m = self.horizon + 2.0 * inst.max_duration()
        self.model = self.b.m
        #: ``(start, duration, presence, tag)`` of every node per device mask (exclusivity);
        #: ``tag`` tells which pairs need no order binary (:func:`_needs_order`)
        self.nodes: dict[int, list[tuple]] = defaultdict(list)
        #: ``(mask, duration, presence)`` of every transfer node (energy cuts)
        self.transfers: list[tuple[int, float, Any]] = []
        self.makespan: Any = None
        self._add_blocks(lambda name: f"building the MILP {name} rows")
        ms = self._ms()
        for v in range(self.n):
            for k in range(inst.k_eval):
                self.b.add(ms >= self.E[v][k])
        self.model.obj = pyo.Objective(expr=ms, sense=pyo.minimize)
        if hint is not None:
            self.set_hint(hint)

    def _ms(self) -> Any:
        """``MS``, created when first needed."""
        if self.makespan is None:
            self.makespan = self.b.var()
        return self.makespan

    def _pinned(self, a: Any, expr: Any, lit: Any) -> None:
        """``a == expr`` when ``lit``."""
        M = self.big_m
        self.b.add(a - expr <= M * (1 - lit))
        self.b.add(expr - a <= M * (1 - lit))

    # ------------------------------------------------------------------------------ blocks
    def _choice(self) -> None:
        b = self.b
        self.x = [[b.var(binary=True) for _ in self.inst.cands[v]] for v in range(self.n)]
        for v in range(self.n):
            b.add(sum(self.x[v]) == 1)

    def _symmetry(self) -> None:
        if self.symmetry is not None:
            v0, out = self.symmetry
            for c in out:
                self.x[v0][c].fix(0)

    def _edges(self) -> None:
        b, x = self.b, self.x
        for ec in self.inst.edges:
            zs = [b.var(binary=True) for _ in ec.classes]
            b.add(sum(zs) == 1)
            for o, pairs in enumerate(ec.pairs):
                for cu, cv in pairs:
                    b.add(zs[o] >= x[ec.src][cu] + x[ec.dst][cv] - 1)
            self.z.append(zs)

    def _split(self) -> None:
        inst = self.inst
        self.split = [
            self.b.either([self.z[ei][o] for ei, o in inst.split_edges[v]]) if inst.can_split[v] else None
            for v in range(self.n)
        ]

    def _operations(self) -> None:
        b, n, split = self.b, self.n, self.split
        K, Q = self.inst.k_eval, self.inst.n_phases
        self.S = [[b.var() for _ in range(K)] for _ in range(n)]
        self.E = [[b.var() for _ in range(K)] for _ in range(n)]
        self.PS = [
            [[b.var() for _ in range(Q)] if split[v] is not None else [] for _ in range(K)] for v in range(n)
        ]
        self.PE = [
            [[b.var() for _ in range(Q)] if split[v] is not None else [] for _ in range(K)] for v in range(n)
        ]
        for v in range(n):
            for c, (whole, phased) in enumerate(self.inst.op[v]):
                self._operation(v, c, whole, phased)

    def _presences(self, v: int, c: int) -> tuple[Any, Any]:
        """The presence of candidate ``c``'s unsplit OP (``x ∧ ¬split``, linearised) and of its
        phases (``x ∧ split``; ``None`` where ``v`` never splits)."""
        b, x, split = self.b, self.x[v][c], self.split[v]
        if split is None:
            return x, None
        p_whole = b.var(binary=True)
        b.add(p_whole >= x - split)
        b.add(p_whole <= x)
        b.add(p_whole <= 1 - split)
        return p_whole, b.both(x, split)

    def _operation(self, v: int, c: int, whole: tuple[float, ...], phased: tuple[float, ...]) -> None:
        """Candidate ``c`` of vertex ``v`` at every step: one unsplit OP node and, where ``v``
        can split, ``Q`` chained phase nodes."""
        b, M, Q = self.b, self.big_m, self.inst.n_phases
        S, E, PS, PE = self.S[v], self.E[v], self.PS[v], self.PE[v]
        mask = self.inst.cands[v][c].allocation.mask
        p_whole, p_split = self._presences(v, c)
        for k in range(self.inst.k_eval):
            st = b.var()
            span = (("S", v, k), ("E", v, k))
            self.nodes[mask].append((st, whole[0], p_whole, ("op", v, c, 0, k), span))
            self._pinned(S[k], st, p_whole)
            self._pinned(E[k], st + whole[0], p_whole)
            self.op_vars[(v, k, c, 0)] = (st, p_whole)
            if p_split is None:
                continue
            prev = None
            for q in range(Q):
                sq = b.var()
                self.nodes[mask].append((sq, phased[q], p_split, ("op", v, c, 1, k), span))
                self._pinned(PS[k][q], sq, p_split)
                self._pinned(PE[k][q], sq + phased[q], p_split)
                if prev is not None:
                    b.add(sq >= prev - M * (1 - p_split))
                prev = sq + phased[q]
                self.op_vars[(v, k, c, q + 1)] = (sq, p_split)
            self._pinned(S[k], PS[k][0], p_split)
            self._pinned(E[k], PE[k][Q - 1], p_split)

    def _transfers(self) -> None:
        b, g = self.b, self.inst.ev.graph
        shared: dict[tuple, list] = {}
        for ei, ec in enumerate(self.inst.edges):
            for o, key in enumerate(ec.classes):
                if key is None:
                    continue
                for k in range(self.inst.k_eval):
                    src_k = k - g.staleness[ec.model] - 1 if ec.kind == "pub" else k
                    if src_k >= 0:
                        self._fragment(ec, key, self.z[ei][o], k, src_k, shared)
        M = self.big_m
        for (model_name, src_k, key), (st, d, lits) in shared.items():
            pres = b.either([lit for lit, _ in lits])
            t = g.index[g.training_vertex(model_name).name]
            b.add(st >= self.E[t][src_k] - M * (1 - pres))
            consumers = {vv for _, vv in lits}
            k = src_k + g.staleness[model_name] + 1
            end = ("S", consumers.pop(), k) if len(consumers) == 1 else None
            self.nodes[key[2]].append((st, d, pres, ("pub",), (("E", t, src_k), end)))
            self.transfers.append((key[2], d, pres))
            self.node_vars[("pub", model_name, src_k, key)].append((st, pres, lits))

    def _fragment(self, ec: Any, key: tuple, lit: Any, k: int, src_k: int, shared: dict) -> None:
        """The lowered fragment of class ``key`` of edge ``ec`` at step ``k`` (source step
        ``src_k``), present iff ``lit``, as in :meth:`.plan_cpsat.PlanCPModel._fragment` (a
        shared publication node is completed after the loop, in :meth:`_transfers`)."""
        b, M = self.b, self.big_m
        u, v = ec.src, ec.dst
        S, E, PS, PE = self.S, self.E, self.PS, self.PE
        if key[0] == PREC:
            b.add(S[v][k] >= E[u][src_k] - M * (1 - lit))
            return
        tag = ("move", id(ec), k, id(lit))
        if ec.kind == "data" and len(key[1]) > 1:
            for q, d in enumerate(key[1]):
                st = b.var()
                self.nodes[key[2]].append((st, d, lit, tag, (("S", u, k), ("E", v, k))))
                self.transfers.append((key[2], d, lit))
                b.add(st >= PE[u][k][q] - M * (1 - lit))
                b.add(PS[v][k][q] >= st + d - M * (1 - lit))
                self.node_vars[(COMM, v, u, k, q + 1)].append((st, lit))
            return
        if ec.kind == "pub":
            skey = (ec.model, src_k, key)
            if skey not in shared:
                shared[skey] = [b.var(), key[1], []]
            st, d, lits = shared[skey]
            lits.append((lit, v))
            b.add(S[v][k] >= st + d - M * (1 - lit))
            return
        d = key[1][0] if ec.kind == "data" else key[1]
        st = b.var()
        self.nodes[key[2]].append((st, d, lit, tag, (("E", u, src_k), ("S", v, k))))
        self.transfers.append((key[2], d, lit))
        b.add(st >= E[u][src_k] - M * (1 - lit))
        b.add(S[v][k] >= st + d - M * (1 - lit))
        self.node_vars[(key[0], v, u, k, 0)].append((st, lit))

    def _chains(self) -> None:
        g = self.inst.ev.graph
        for t in (i for i, vv in enumerate(g.vertices) if vv.role is Role.TRAINING):
            for k in range(1, self.inst.k_eval):
                self.b.add(self.S[t][k] >= self.E[t][k - 1])

    def _exclusivity(self) -> None:
        # an order binary y per pair of nodes that can share an atom (quadratic in the nodes),
        # except pairs never present together or ordered by other constraints (_needs_order);
        # a pair sharing several atoms gets one y
        b, M = self.b, self.big_m
        g = self.inst.ev.graph
        training = {i for i, vv in enumerate(g.vertices) if vv.role is Role.TRAINING}
        reach = self._reach()
        done: set[tuple[int, int]] = set()
        for a in atoms_of(set(self.nodes)):
            group = [node for mask, items in self.nodes.items() if mask & a for node in items]
            for (si, di, pi, ti, ni), (sj, dj, pj, tj, nj) in itertools.combinations(group, 2):
                pair = (id(si), id(sj)) if id(si) < id(sj) else (id(sj), id(si))
                if pair in done or not _needs_order(ti, tj, training):
                    continue
                if _before(ni[1], nj[0], reach) or _before(nj[1], ni[0], reach):
                    continue  # ordered by the precedences of the cuts block
                done.add(pair)
                y = b.var(binary=True)
                b.add(si + di <= sj + M * (1 - y) + M * (2 - pi - pj))
                b.add(sj + dj <= si + M * y + M * (2 - pi - pj))

    def _reach(self) -> set[tuple[tuple[int, int], tuple[int, int]]]:
        """Pairs ``((u,k), (v,k'))`` of vertex steps with ``E[u,k] ≤ S[v,k']`` in every solution:
        the transitive closure of the training chains and of the edge links of the ``cuts``
        block without phase-wise classes (:func:`~.plan_model.edge_delay`)."""
        g, K = self.inst.ev.graph, self.inst.k_eval
        succ: dict[tuple[int, int], set[tuple[int, int]]] = defaultdict(set)
        for t in (i for i, vv in enumerate(g.vertices) if vv.role is Role.TRAINING):
            for k in range(1, K):
                succ[(t, k - 1)].add((t, k))
        for ei, ec in enumerate(self.inst.edges):
            link = edge_delay(ec, self.z[ei])
            if link is None or link[0]:
                continue
            for k in range(K):
                src_k = k - g.staleness[ec.model] - 1 if ec.kind == "pub" else k
                if src_k >= 0:
                    succ[(ec.src, src_k)].add((ec.dst, k))
        out = set()
        for a in list(succ):
            stack, seen = list(succ[a]), set()
            while stack:
                b = stack.pop()
                if b not in seen:
                    seen.add(b)
                    stack.extend(succ.get(b, ()))
            out.update((a, b) for b in seen)
        return out

    def _memory(self) -> None:
        cands = self.inst.cands
        _memory(self.b, self.inst, self.x, atoms_of({c.allocation.mask for cs in cands for c in cs}))

    def _cuts(self) -> None:
        """The redundant constraints of the ``cuts`` block (:data:`~.plan_model.PLAN_BLOCKS`,
        :func:`~.plan_model.cut_constraints`), in seconds."""
        b, inst = self.b, self.inst
        ms = self._ms()
        for c in cut_constraints(inst, self.x, self.S, self.E, self.z, ms, self.transfers, set(self.nodes)):
            b.add(c)
        b.add(ms >= critical_path_bound(inst))

    # ------------------------------------------------------------------------------- solve
    def set_hint(self, plan: Plan) -> None:
        """Set the selection binaries to ``plan``'s choices (a partial MIP start)."""
        for v, row in enumerate(self.x):
            for c, var in enumerate(row):
                var.set_value(1 if self.inst.cands[v][c] == plan.choices[v] else 0)

    def read(self) -> tuple[list[int], dict[tuple, float]]:
        """The chosen candidates and the start (s) of every present lowered node, from the
        loaded values."""
        g = self.inst.ev.graph
        picks = [max(range(len(row)), key=lambda c, row=row: row[c].value or 0.0) for row in self.x]
        starts: dict[tuple, float] = {}
        for (v, k, c, phase), (st, pres) in self.op_vars.items():
            if c == picks[v] and (pres.value or 0) > 0.5:
                starts[(0, v, -1, k, phase)] = float(st.value)
        for ident, items in self.node_vars.items():
            if ident[0] == "pub":
                st, pres, lits = items[0]
                if (pres.value or 0) > 0.5:
                    _, model_name, src_k, key = ident
                    consumers = sorted(vv for lit, vv in lits if (lit.value or 0) > 0.5)
                    t = g.index[g.training_vertex(model_name).name]
                    starts[(key[0], consumers[0], t, src_k + g.staleness[model_name] + 1, 0)] = float(
                        st.value
                    )
                continue
            for st, lit in items:
                if (lit.value or 0) > 0.5:
                    starts[ident] = float(st.value)
        return picks, starts


def _before(end: tuple | None, start: tuple | None, reach: set) -> bool:
    """Whether a node that ends by the instant ``end`` (``("S" | "E", v, k)``: ``S[v,k]`` or
    ``E[v,k]``; ``None``: unknown) always ends before one that starts from ``start``:
    ``S[v,k] ≤ E[v,k]``, and ``E[u,k] ≤ S[v,k']`` for the pairs in ``reach``."""
    if end is None or start is None:
        return False
    if end[1:] == start[1:]:
        return not (end[0] == "E" and start[0] == "S")
    return (end[1:], start[1:]) in reach


def _needs_order(ti: tuple, tj: tuple, training: set[int]) -> bool:
    """Whether two nodes that may share a device need an order binary: not when they are never
    present together (OP nodes of one vertex with different candidates, or one unsplit and one
    phase; transfers of one edge and step in different classes), nor when other constraints
    order them (phases of one OP instance are chained; a training vertex's steps are chained)."""
    if ti[0] == "op" and tj[0] == "op" and ti[1] == tj[1]:
        _, v, ci, wi, ki = ti
        _, _, cj, wj, kj = tj
        return ci == cj and wi == wj and ki != kj and v not in training
    return not (ti[0] == tj[0] == "move" and ti[1:3] == tj[1:3] and ti[3] != tj[3])


def _memory(b: _Builder, inst: PlanInstance, x: list[list], atoms: list[int]) -> None:
    """Memory per atom, as :func:`.plan_cpsat._memory` (big-M on ``x[v,c]``), in GiB so that the
    coefficients stay within a few orders of magnitude of the binaries (bytes would reach 1e11)."""
    g = inst.ev.graph
    cands = inst.cands
    trainers = trainer_of(inst.ev)
    serving = serving_groups(inst.ev)
    gib = float(2**30)
    cap = inst.m_eff / gib
    big = (
        sum(max(m.train_state + m.weights + m.transient for m in row) for row in inst.memory) * 2 / gib + cap
    )

    def on(v: int, a: int) -> list[int]:
        return [c for c, ch in enumerate(cands[v]) if ch.allocation.mask & a]

    for a in atoms:
        terms = []
        t_on = {}
        for model_name, t in trainers.items():
            cs = on(t, a)
            t_on[model_name] = sum(x[t][c] for c in cs) if cs else 0
            terms += [inst.memory[t][c].train_state / gib * x[t][c] for c in cs]
        for model_name, vs in serving.items():
            trainer = trainers.get(model_name)
            if trainer is not None and g.staleness[model_name] == 0:
                continue
            items = [(v, c) for v in vs for c in on(v, a)]
            if not items:
                continue
            copy = b.var(ub=max(inst.memory[v][c].weights for v, c in items) / gib)
            for v, c in items:
                w = inst.memory[v][c].weights / gib
                b.add(copy >= w * x[v][c] - (w * t_on[model_name] if trainer is not None else 0))
            terms.append(copy)
        persistent = sum(terms) if terms else 0
        for v, vert in enumerate(g.vertices):
            for c in on(v, a):
                mem = inst.memory[v][c]
                need = mem.transient / gib
                extra = 0
                if vert.role is not Role.TRAINING and vert.model in trainers:
                    if g.staleness[vert.model] == 0:
                        need += mem.weights / gib
                    else:
                        extra = mem.weights / gib * t_on[vert.model]
                b.add(persistent + extra + need <= cap + big * (1 - x[v][c]))


def solve_plan_milp(
    inst: PlanInstance,
    *,
    solver: str = "highs",
    time_limit: float | None = None,
    seed: int = 0,
    threads: int | None = None,
    hint: Plan | None = None,
    deadline: Deadline | None = None,
    cutoff: float | None = None,
) -> PlanSolution:
    """Build and solve the MILP of the module docstring (:class:`PlanMILPModel`) with a Pyomo
    solver.

    Parameters
    ----------
    inst
        Instance from :func:`~rpeg.formulations.plan_model.build_plan_instance`.
    solver
        ``"highs"`` (default) or any name :func:`~rpeg.formulations.milp.solve_milp` accepts.
    time_limit
        Seconds for building, handing the model to the solver and solving (``None``: until
        proven); ignored when ``deadline`` is given.
    seed, threads
        Passed to the solver.
    hint
        A plan whose choices are in the candidate sets; its selection binaries start at 1
        (a partial MIP start where the solver takes one) and its evaluator makespan (when
        memory-feasible) is the horizon ``H``.
    deadline
        The caller's deadline.
    cutoff
        A makespan (s) already achieved elsewhere (another structure): the horizon is at most
        this, and a model infeasible under it gives a ``cut_off`` outcome
        (:meth:`~.plan_model.PlanSolution.under_cutoff`).

    Returns
    -------
    PlanSolution
        Status ``TIME_LIMIT`` with no plan and a message when the model could not be built (or
        handed to the solver) in time; ``interrupted`` after Ctrl-C; otherwise the solver's
        status, mapped once by :mod:`.pyomo_backend` (``ERROR`` when it claims a solution it did
        not return).

    Raises
    ------
    SolverUnavailableError
        When ``solver`` is not installed (the message says what to install).
    """
    t0 = time.monotonic()
    if deadline is None:
        deadline = Deadline(time_limit, start=t0)
    engine = f"milp/{solver}"
    pyomo_backend.backend(solver)  # an unknown or missing solver fails before the build
    try:
        upper, binding = horizon_bound(inst, hint, cutoff)
        with heap_frozen():  # the build and the transfer to the solver
            mm = PlanMILPModel(inst, deadline=deadline, hint=hint, upper_bound=upper)
            build_s = time.monotonic() - t0
            status, bound, incumbent = pyomo_backend.run_pyomo(
                mm.model,
                solver,
                deadline,
                seed,
                threads,
                hint is not None,
                write_estimate=pyomo_backend.WRITE_PER_BUILD * build_s,
            )
    except BuildTimeout as exc:
        return PlanSolution.without_plan(Status.TIME_LIMIT, time.monotonic() - t0, engine, message=str(exc))
    except KeyboardInterrupt:
        return PlanSolution.without_plan(
            Status.TIME_LIMIT,
            time.monotonic() - t0,
            engine,
            interrupted=True,
            message="interrupted (Ctrl-C) before the solver had a plan",
        )
    runtime = time.monotonic() - t0
    interrupted = pyomo_backend.last_run_interrupted()
    note = "interrupted (Ctrl-C)" if interrupted else ""
    bound_s = max(0.0, bound) if math.isfinite(bound) else 0.0
    if not incumbent or status in (Status.INFEASIBLE, Status.ERROR):
        if status in (Status.OPTIMAL, Status.FEASIBLE):
            status = Status.ERROR  # a claimed solution that was not returned
            note = note or "the solver reported a solution but returned none"
        return PlanSolution.without_plan(
            status, runtime, engine, lower_bound=bound_s, interrupted=interrupted, message=note
        ).under_cutoff(cutoff, binding)
    picks, starts = mm.read()
    makespan = float(mm.makespan.value)
    return PlanSolution(
        status,
        inst.plan_of(picks),
        makespan,
        min(bound_s, makespan),
        runtime,
        starts,
        engine,
        None,
        interrupted,
        note,
    )

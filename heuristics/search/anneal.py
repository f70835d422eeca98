"""The RPEG optimizer: structural outer loop, multi-start simulated annealing, polish (SPEC §8).

For every structural candidate ``y = (ac, τ)`` (its share of the budget: wall-clock split evenly
over the variants still to run, or an equal number of uncached evaluations each) chains of
proposal rounds run:

1. a move kernel proposes up to ``Kx = 6`` neighbours (pair move with probability 0.28, a
   recomputation flip of one training invocation with probability 0.10, else a single move whose
   vertex comes from the critical path with probability 0.6);
2. the proposals are evaluated (uncached ones in parallel when ``workers > 1``) and the best is
   accepted by the acceptance rule at the chain's temperature;
3. a chain ends after 10 consecutive rejections; the first chain of a structure starts from the
   concurrent baseline at ``t_init``, later ones from one of the 3 best feasible plans of the same
   vertex set (shared across staleness variants) at ``t_warm``.

Finally the best feasible plan is polished: deterministic coordinate descent over the vertices and
their whole directories (every strategy at every aligned origin) until a pass improves nothing.

Scores are computed here from the evaluator's raw figures (throughput, utilisation, memory
ratio), so parallel workers never hold search state and the same seed and evaluation budget give
the same plan on 1 or N workers.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from random import Random
from typing import Any

from ...ir.cluster import Cluster
from ...ir.plan import Choice, Plan, Strategy
from ...ir.templates import Structure, structures
from ...ir.workload import Workload
from ...scoring.candidates import Directory, aligned_allocations, build_directories
from ...scoring.evaluator import BETA_OOM, MEMORY_TOL, Evaluator
from ..baselines import Infeasible, check_directories, concurrent_plan, greedy_plan
from .acceptance import Acceptance, Metropolis
from .moves import Move, MoveContext, PairMove, RecomputeMove, SingleMove
from .stop import Budget
from .temperature import Constant, Temperature

__all__ = ["ABLATIONS", "Anneal", "Outcome", "Raw", "SearchSpace", "default_moves"]

#: Switches of SPEC §8's ablation list, as accepted by ``ablate=``.
ABLATIONS = (
    "phase_split",  # response-length splitting
    "staleness",  # bounded staleness (only τ = 0 structures)
    "microbatch_tuning",  # fix mb = Pp (inference/generation) or 2·Pp (training)
    "pair_moves",
    "warm_restarts",
    "critical_path",
    "polish",
    "soft_penalty",  # hard rejection of memory-infeasible proposals instead
    "constant_temperature",  # geometric cooling instead
)

T_INIT = 0.01
#: Move weights: SPEC §8's pair move 0.28; the recomputation flip takes 0.10 of the single move's
#: 0.72 (SPEC is silent on it; ``docs/decisions.md``).
W_SINGLE, W_PAIR, W_RECOMPUTE = 0.62, 0.28, 0.10
T_WARM = 0.03
STALE_ROUNDS = 50  # rounds without a new evaluation that end a chain
STALE_CHAINS = 20  # chains without a new evaluation that end a structure


def default_moves(
    p_cp: float = 0.6, *, pair: bool = True, recompute: bool = True
) -> list[tuple[float, Move]]:
    """The move kernels and their weights: ``SingleMove(p_cp)`` 0.62, ``PairMove`` 0.28 and
    ``RecomputeMove`` 0.10 (the pair and recomputation kernels fall back to the single move;
    ``pair=False`` or ``recompute=False`` drops one, the rest keep their weights)."""
    single = SingleMove(p_cp)
    moves: list[tuple[float, Move]] = [(W_SINGLE, single)]
    if pair:
        moves.append((W_PAIR, PairMove(single)))
    if recompute:
        moves.append((W_RECOMPUTE, RecomputeMove(single, p_cp)))
    return moves


@dataclass(frozen=True, slots=True)
class Raw:
    """What an evaluation returns to the search: raw figures, no search state."""

    throughput: float
    makespan: float
    utilization: float
    ratio: float
    critical: tuple[float, ...]

    @property
    def feasible(self) -> bool:
        """``max_d peak(d) ≤ M_eff``."""
        return self.ratio <= 1.0 + MEMORY_TOL


def evaluate_raw(ev: Evaluator, plan: Plan) -> Raw:
    """Evaluate ``plan`` and keep only the figures the search needs."""
    e = ev.evaluate(plan)
    return Raw(e.throughput, e.makespan, e.utilization, e.memory.ratio, tuple(e.critical))


def fixed_microbatch_ok(role_is_training: bool, s: Strategy) -> bool:
    """Ablation "no microbatch tuning": ``mb = Pp`` for inference/generation, ``2·Pp`` for
    training (``mb = 1`` without pipelining)."""
    if s.pp == 1:
        return s.mb == 1
    return s.mb == (2 * s.pp if role_is_training else s.pp)


def baseline_plans(ev: Evaluator, dirs: list[Directory]) -> list[Plan]:
    """The concurrent and the greedy baseline over ``dirs``, those that exist, in that order."""
    plans = []
    for baseline in (concurrent_plan, greedy_plan):
        with contextlib.suppress(Infeasible):
            plans.append(baseline(ev, dirs))
    return plans


def restrict(dirs: list[Directory], k: int, keep: list[Plan]) -> None:
    """The exact models' candidate restriction, in place: each directory keeps the strategies of
    its ``k`` fastest layouts (each in every recomputation mode it holds) plus the strategies the
    plans ``keep`` (the unrestricted baselines) use, as the exact models keep their warm start's
    choices (``formulations.plan_model.candidate_sets``).

    Without the baselines' strategies a restriction to the fastest — usually the widest —
    strategies can leave no plan at all (none of them packs side by side, and all of them on
    every GPU do not fit in memory), while the exact models over "the same" candidates still
    find one through their warm start.
    """
    for v, d in enumerate(dirs):
        extra = {plan.choices[v].strategy for plan in keep}
        fast = set(d.fastest_layouts(k))
        idx = [i for i, s in enumerate(d.strategies) if i in fast or s in extra]
        d.strategies = [d.strategies[i] for i in idx]
        d.times = [d.times[i] for i in idx]


class SearchSpace:
    """One structural candidate: its evaluator, directories, seed plan and evaluation cache."""

    def __init__(
        self,
        workload: Workload,
        cluster: Cluster,
        structure: Structure,
        *,
        k_eval: int,
        split_phases: bool,
        tune_microbatches: bool,
        candidates: int | None = None,
    ) -> None:
        self.structure = structure
        self.ev = Evaluator(workload, cluster, structure, k_eval=k_eval, split_phases=split_phases)
        dirs = build_directories(self.ev.costs)
        if not tune_microbatches:
            from ...ir.types import Role

            for d in dirs:
                training = self.ev.graph.vertices[d.vertex].role is Role.TRAINING
                keep = [i for i, s in enumerate(d.strategies) if fixed_microbatch_ok(training, s)]
                d.strategies = [d.strategies[i] for i in keep]
                d.times = [d.times[i] for i in keep]
        self._baselines: list[Plan] | None = None
        if candidates is not None:  # the baselines are computed over the unrestricted directories
            self._baselines = baseline_plans(self.ev, dirs)
            restrict(dirs, candidates, self._baselines)
        self.dirs: list[Directory] = dirs
        self.cache: dict[tuple, Raw] = {}
        self.vertex_key = tuple(v.name for v in self.ev.graph.vertices)

    def baselines(self) -> list[Plan]:
        """The structure's concurrent and greedy baselines (those that exist), computed once;
        with a candidate restriction, over the directories before it (their strategies are kept)."""
        if self._baselines is None:
            self._baselines = baseline_plans(self.ev, self.dirs)
        return self._baselines

    def key(self, plan: Plan) -> tuple:
        """Canonical cache key of ``plan`` under this structure."""
        return plan.key()


@dataclass
class Outcome:
    """What the search found.

    Attributes
    ----------
    space
        The structure the best plan belongs to (``None`` when nothing feasible was found).
    plan
        The best memory-feasible plan.
    raw
        Its raw figures.
    evaluations
        Uncached evaluations spent.
    interrupted
        Whether the search was stopped by ``KeyboardInterrupt``.
    reason
        Why nothing feasible was found.
    history
        ``(seconds, evaluations, best throughput)`` each time the best improved.
    """

    space: SearchSpace | None
    plan: Plan | None
    raw: Raw | None
    evaluations: int
    interrupted: bool = False
    reason: str = ""
    history: list[tuple[float, int, float]] = field(default_factory=list)


class Anneal:
    """The RPEG optimizer with pluggable pieces.

    Parameters
    ----------
    workload, cluster
        The problem.
    k_eval
        Steps unrolled when scoring.
    seed
        Seed of the search's random generator.
    budget
        Wall-clock and/or evaluation budget.
    objective, delta
        ``"throughput"`` or ``"throughput-util"`` with its ``δ``.
    t_init, t_warm
        Temperatures of the first chain of a structure and of warm-restarted chains.
    acceptance
        Acceptance rule (default :class:`Metropolis`).
    temperature
        Temperature schedule factory (default :class:`Constant`).
    moves
        ``(weight, Move)`` pairs; a round picks one in proportion to its weight.
    proposals
        ``Kx``, proposals per round.
    max_rejections
        Consecutive rejections that end a chain.
    elite_size
        Feasible plans kept per vertex set as restart seeds.
    warm_restarts
        Restart chains from the elite set at ``t_warm`` (else from the structure's seed at
        ``t_init``).
    polish
        Run the final deterministic polish.
    polish_share
        Fraction of the budget reserved for the polish.
    soft_penalty
        Score memory-infeasible plans with the exponential penalty (else 0).
    structures_
        Structural candidates to search (default: all of ``Ycand``).
    split_phases, tune_microbatches
        Ablation switches passed to the evaluator and the directories.
    candidates
        Keep only the ``k`` fastest layouts of each directory, in every recomputation mode (the
        candidate sets of the exact
        models, for like-for-like comparisons); ``None`` keeps all.
    evaluate_many
        Evaluates a list of ``(space index, plan)``; default evaluates in this process.
    progress
        Called about twice a second with a dict of live figures.
    """

    def __init__(
        self,
        workload: Workload,
        cluster: Cluster,
        *,
        k_eval: int = 8,
        seed: int = 0,
        budget: Budget,
        objective: str = "throughput",
        delta: float = 0.10,
        t_init: float = T_INIT,
        t_warm: float = T_WARM,
        acceptance: Acceptance | None = None,
        temperature: Callable[[], Temperature] = Constant,
        moves: Sequence[tuple[float, Move]] | None = None,
        proposals: int = 6,
        max_rejections: int = 10,
        elite_size: int = 3,
        warm_restarts: bool = True,
        polish: bool = True,
        polish_share: float = 0.1,
        soft_penalty: bool = True,
        structures_: Sequence[Structure] | None = None,
        split_phases: bool = True,
        tune_microbatches: bool = True,
        candidates: int | None = None,
        evaluate_many: Callable[[list[tuple[int, Plan]]], list[Raw]] | None = None,
        progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        if objective not in ("throughput", "throughput-util"):
            raise ValueError(f"objective must be 'throughput' or 'throughput-util', got {objective!r}")
        if not (t_init > 0 and t_warm > 0):
            raise ValueError(f"t_init and t_warm must be positive, got {t_init!r}, {t_warm!r}")
        if proposals < 1 or max_rejections < 1 or elite_size < 1:
            raise ValueError("proposals, max_rejections and elite_size must be ≥ 1")
        if not 0.0 <= polish_share < 1.0:
            raise ValueError(f"polish_share must be in [0, 1), got {polish_share!r}")
        self.workload = workload
        self.cluster = cluster
        self.rng = Random(seed)
        self.budget = budget
        self.objective = objective
        self.delta = delta
        self.t_init, self.t_warm = t_init, t_warm
        self.acceptance = acceptance or Metropolis()
        self.temperature = temperature
        self.moves = list(moves) if moves is not None else default_moves()
        self.proposals = proposals
        self.max_rejections = max_rejections
        self.elite_size = elite_size
        self.warm_restarts = warm_restarts
        self.do_polish = polish
        self.polish_share = polish_share if polish else 0.0
        self.soft_penalty = soft_penalty
        ys = list(structures_) if structures_ is not None else structures(workload)
        if not ys:
            raise ValueError("no structural candidate to search")
        self.spaces = [
            SearchSpace(
                workload,
                cluster,
                y,
                k_eval=k_eval,
                split_phases=split_phases,
                tune_microbatches=tune_microbatches,
                candidates=candidates,
            )
            for y in ys
        ]
        self._evaluate_many = evaluate_many
        self.progress = progress
        self.best_raw = 0.0
        self.best: tuple[float, int, Plan, Raw] | None = None  # (score, space, plan, raw)
        self.elites: dict[tuple, list[tuple[float, tuple, Plan, int]]] = {}
        self.history: list[tuple[float, int, float]] = []
        self._last_progress = 0.0
        self._label = ""
        self._active: Budget | None = None  # the sub-budget being spent

    # ------------------------------------------------------------------ scoring
    def score(self, raw: Raw) -> float:
        """SPEC §7 objective from raw figures: memory penalty, then the utilisation objective
        (whose "best raw score so far" counts memory-feasible plans only)."""
        s = raw.throughput
        if raw.ratio > 1.0 + MEMORY_TOL:
            s = s * math.exp(-BETA_OOM * (raw.ratio - 1.0)) if self.soft_penalty else 0.0
        if self.objective == "throughput-util":
            if raw.feasible and raw.throughput > self.best_raw:
                self.best_raw = raw.throughput
            s = s * raw.utilization if raw.throughput >= (1.0 - self.delta) * self.best_raw else s * 1e-12
        return s

    def evaluate(self, si: int, plans: list[Plan]) -> list[tuple[Plan, Raw]]:
        """Evaluate ``plans`` in space ``si`` (cache first); uncached ones count against the
        budget, and plans beyond what an evaluation budget still allows are dropped, so a search
        never spends more evaluations than it was given. Returns ``(plan, raw)`` pairs in order."""
        space = self.spaces[si]
        allowed = self._evaluations_left()
        keys = [space.key(p) for p in plans]
        missing: list[tuple[int, Plan]] = []
        seen = set()
        kept: list[int] = []
        for i, (k, p) in enumerate(zip(keys, plans)):
            if k in space.cache or k in seen:
                kept.append(i)
            elif allowed is None or len(missing) < allowed:
                seen.add(k)
                missing.append((si, p))
                kept.append(i)
        if missing:
            if self._evaluate_many is None:
                results = [evaluate_raw(space.ev, p) for _, p in missing]
            else:
                results = self._evaluate_many(missing)
            for (_, p), r in zip(missing, results):
                space.cache[space.key(p)] = r
            self.budget.spend(len(missing))
            if self._active is not None:
                self._active.spend(len(missing))
        out = [(plans[i], space.cache[keys[i]]) for i in kept]
        for p, r in out:
            self._offer(si, p, r)
        self._report()
        return out

    def _evaluations_left(self) -> int | None:
        left = [b.remaining()[1] for b in (self.budget, self._active) if b is not None]
        left = [x for x in left if x is not None]
        return max(0, min(left)) if left else None

    def _offer(self, si: int, plan: Plan, raw: Raw) -> None:
        """Keep ``plan`` as best and as an elite if it is feasible and good enough."""
        if not raw.feasible:
            return
        s = self.score(raw)
        if self.best is None or s > self.best[0]:
            self.best = (s, si, plan, raw)
            self.history.append((self.budget.elapsed(), self.budget.used, raw.throughput))
        vkey = self.spaces[si].vertex_key
        elites = self.elites.setdefault(vkey, [])
        pkey = plan.key()
        if any(k == pkey for _, k, _, _ in elites):
            return
        elites.append((s, pkey, plan, si))
        elites.sort(key=lambda e: -e[0])
        del elites[self.elite_size :]

    def _report(self, force: bool = False) -> None:
        if self.progress is None:
            return
        now = time.perf_counter()
        if not force and now - self._last_progress < 0.5:
            return
        self._last_progress = now
        elapsed = self.budget.elapsed()
        self.progress(
            {
                "elapsed": elapsed,
                "evaluations": self.budget.used,
                "evals_per_s": self.budget.used / elapsed if elapsed > 0 else 0.0,
                "best_throughput": self.best[3].throughput if self.best else 0.0,
                "structure": self._label,
                "time_limit": self.budget.seconds,
                "max_evaluations": self.budget.evaluations,
            }
        )

    # ------------------------------------------------------------------ search
    def seed_plan(self, si: int) -> Plan:
        """The first chain's start: the concurrent baseline of this structure, else its greedy
        baseline (every invocation on all GPUs, repaired for memory: it needs no side-by-side
        packing, which a candidate restriction to the fastest, widest strategies can make
        impossible), else every invocation on all GPUs with its fastest strategy (memory left
        to the penalty)."""
        space = self.spaces[si]
        check_directories(space.ev, space.dirs)  # an empty directory: nothing to search
        baselines = space.baselines()
        if baselines:
            return baselines[0]
        n = self.cluster.num_devices
        choices = []
        for d in space.dirs:
            idx = d.of_size(n)
            s = d.strategies[idx[0]] if idx else d.strategies[0]
            choices.append(Choice(s, aligned_allocations(self.cluster, s.size)[0]))
        return Plan(tuple(choices))

    def _out_of_budget(self) -> bool:
        return self.budget.exhausted() or (self._active is not None and self._active.exhausted())

    def chain(self, si: int, start: Plan, t0: float) -> None:
        """One annealing chain in space ``si`` from ``start`` at temperature ``t0``.

        Ends after ``max_rejections`` consecutive rejections, when the budget runs out, or after
        ``STALE_ROUNDS`` rounds in a row that evaluated nothing new (a fully explored
        neighbourhood, which would otherwise spin without spending an evaluation budget).
        """
        space = self.spaces[si]
        rng = self.rng
        schedule = self.temperature()
        t = schedule.start(t0)
        current = start
        first = self.evaluate(si, [current])
        if not first:
            return
        raw = first[0][1]
        score = self.score(raw)
        ctx = MoveContext(space.dirs, self.cluster, list(raw.critical))
        total_weight = sum(w for w, _ in self.moves)
        rejected = stale = 0
        while rejected < self.max_rejections and stale < STALE_ROUNDS and not self._out_of_budget():
            x = rng.random() * total_weight
            move = self.moves[-1][1]
            for w, m in self.moves:
                x -= w
                if x < 0:
                    move = m
                    break
            proposals = move.propose(rng, current, ctx, self.proposals)
            before = self.budget.used
            evaluated = self.evaluate(si, proposals) if proposals else []
            if evaluated:
                scores = [self.score(r) for _, r in evaluated]
                best_i = max(range(len(scores)), key=scores.__getitem__)
                if self.acceptance(rng, score, scores[best_i], t):
                    (current, raw), score = evaluated[best_i], scores[best_i]
                    ctx.critical = list(raw.critical)
                    rejected = 0
                else:
                    rejected += 1
            else:
                rejected += 1
            stale = stale + 1 if self.budget.used == before else 0
            t = schedule.step()

    def search_structure(self, si: int) -> None:
        """Multi-start annealing in one structure until its (active) budget is spent."""
        space = self.spaces[si]
        self._label = space.structure.label
        try:
            seed = self.seed_plan(si)
        except Infeasible:
            return
        first = True
        idle = 0
        while not self._out_of_budget() and idle < STALE_CHAINS:
            before = self.budget.used
            elites = self.elites.get(space.vertex_key, [])
            if first or not (self.warm_restarts and elites):
                self.chain(si, seed, self.t_init)
            else:
                _, _, plan, _ = elites[self.rng.randrange(len(elites))]
                self.chain(si, plan, self.t_warm)
            first = False
            idle = idle + 1 if self.budget.used == before else 0

    def polish(self) -> None:
        """Deterministic coordinate descent on the best plan: for each vertex in order, try
        every strategy of its directory at every aligned origin (replacing only that vertex)
        and keep the best feasible improvement; repeat until a pass improves nothing."""
        improved = True
        while improved and self.best is not None and not self._out_of_budget():
            improved = False
            for v in range(len(self.best[2].choices)):
                _, si, plan, _ = self.best
                before = self.best[0]
                candidates = [
                    plan.replace(v, c)
                    for s in self.spaces[si].dirs[v].strategies
                    for a in aligned_allocations(self.cluster, s.size)
                    if (c := Choice(s, a)) != plan.choices[v]
                ]
                for i in range(0, len(candidates), 64):
                    if self._out_of_budget():
                        return
                    self.evaluate(si, candidates[i : i + 64])
                improved |= self.best[0] > before

    def run(self) -> Outcome:
        """Search every structure, then polish; ``KeyboardInterrupt`` stops early with the best
        plan so far."""
        interrupted = False
        reserve = self.polish_share
        try:
            # the synchronous baselines are the incumbents to beat: SA never returns less than
            # the concurrent or the greedy plan over the same candidate directories
            for si, sp in enumerate(self.spaces):
                if not sp.structure.ac_sharing and all(t == 0 for _, t in sp.structure.staleness):
                    if baselines := sp.baselines():
                        self.evaluate(si, baselines)
                    break
            n = len(self.spaces)
            for i in range(n):
                self._active = self.budget.sub(1.0 / (n - i), reserve)
                if self._active is None:
                    break
                self.search_structure(i)
            self._active = None
            if self.do_polish:
                self.polish()
        except KeyboardInterrupt:
            interrupted = True
        self._active = None
        self._report(force=True)
        if self.best is None:
            return Outcome(None, None, None, self.budget.used, interrupted, self._explain(), self.history)
        _, si, plan, raw = self.best
        return Outcome(self.spaces[si], plan, raw, self.budget.used, interrupted, "", self.history)

    def _explain(self) -> str:
        space = self.spaces[0]
        try:
            concurrent_plan(space.ev, space.dirs)
        except Infeasible as exc:
            return str(exc)
        best = None
        for sp in self.spaces:
            for key, r in sp.cache.items():
                if best is None or r.ratio < best[0]:
                    best = (r.ratio, sp, key)
        if best is None:
            return "no plan was evaluated"
        return f"no memory-feasible plan found; the closest needs {best[0]:.2f}× M_eff on its worst GPU"

"""The RPEG optimizer: structural outer loop, multi-start simulated annealing, polish (SPEC §8).

The budget goes to the structural candidates ``y = (ac, τ)`` by successive halving
(:func:`halving_rounds`): ``R = ⌈log₂ n⌉ + 1`` rounds each get an equal part of the budget
(wall-clock or uncached evaluations), split evenly over the structures still in the race; after a
round, the better half (by the best feasible score each has found) goes on. Every structure is
searched early, and the last rounds go to the best. In each structure's turn chains of proposal
rounds run:

1. a move kernel proposes up to ``Kx = 6`` neighbours (pair move with prior probability 0.28, a
   recomputation flip of one training invocation with 0.10, else a single move whose vertex comes
   from the critical path with probability 0.6); the kernels' probabilities adapt to what they
   have paid (:class:`MoveWeights`, as adaptive large-neighbourhood search does);
2. the proposals are evaluated (uncached ones in parallel when ``workers > 1``) and the best is
   accepted by the acceptance rule at the chain's temperature;
3. a chain ends after 10 consecutive rejections; a structure's first chain starts from its
   concurrent baseline at ``t_init``, later ones (in this round or the next) from one of the 3 best
   feasible plans of the same vertex set (shared across staleness variants) at ``t_warm``.

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
from ...scoring.candidates import (
    Directory,
    aligned_allocations,
    build_directories,
    lean_message,
)
from ...scoring.evaluator import BETA_OOM, MEMORY_TOL, Evaluator
from ..baselines import Infeasible, TimeUp, baselines_in_time, check_directories, concurrent_plan, greedy_plan
from .acceptance import Acceptance, Metropolis
from .moves import Move, MoveContext, PairMove, SingleMove, SplitMove, VariantMove
from .stop import Budget
from .temperature import Constant, Temperature

__all__ = [
    "ABLATIONS",
    "Anneal",
    "MoveWeights",
    "Outcome",
    "Raw",
    "SearchSpace",
    "default_moves",
    "halving_rounds",
]

#: Switches of SPEC §8's ablation list, as accepted by ``ablate=``.
ABLATIONS = (
    "phase_split",  # response-length splitting
    "staleness",  # bounded staleness (only τ = 0 structures)
    "microbatch_tuning",  # fix mb = Pp (inference/generation) or 2·Pp (training)
    "pair_moves",
    "split_moves",  # the donor–receivers split kernel (not in SPEC §8; docs/decisions.md)
    "warm_restarts",
    "critical_path",
    "polish",
    "soft_penalty",  # hard rejection of memory-infeasible proposals instead
    "constant_temperature",  # geometric cooling instead
    "adaptive_moves",  # the kernels' prior probabilities throughout
    "structure_halving",  # one turn per structure with an even split of the budget
)

T_INIT = 0.01
#: Move weights: SPEC §8's pair move 0.28, shared by the pair kernel (0.20) and the split kernel
#: (0.08), both donor moves; the recomputation flip takes 0.10 of the single move's 0.72 (SPEC is
#: silent on both; ``docs/decisions.md``).
W_SINGLE, W_PAIR, W_SPLIT, W_RECOMPUTE = 0.62, 0.20, 0.08, 0.10
T_WARM = 0.03
STALE_ROUNDS = 50  # rounds without a new evaluation that end a chain
STALE_CHAINS = 20  # chains without a new evaluation that end a structure

#: Adaptive move weights (:class:`MoveWeights`): reaction ``ρ`` of the smoothed reward and the
#: rewards of a round whose best proposal is a new best plan, improves on the chain's current
#: plan, is accepted without improving, or is rejected.
MOVE_REACTION = 0.1
MOVE_REWARDS = (3.0, 2.0, 0.5, 0.0)
#: Each kernel keeps at least this share of its prior probability.
MOVE_FLOOR = 0.2


def halving_rounds(n: int) -> list[int]:
    """Structures still in the race in each round of successive halving over ``n`` structures:
    ``n, ⌈n/2⌉, ⌈n/4⌉, …, 1`` (``R = ⌈log₂ n⌉ + 1`` rounds; one round for ``n = 1``).

    Raises
    ------
    ValueError
        If ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"halving_rounds: n must be at least 1, got {n!r}")
    out = [n]
    while out[-1] > 1:
        out.append(math.ceil(out[-1] / 2))
    return out


class MoveWeights:
    """Adaptive probabilities of the move kernels (the weight adaptation of adaptive
    large-neighbourhood search, Ropke & Pisinger 2006).

    Kernel ``m`` with prior weight ``w_m`` is drawn with probability ``∝ w_m·a_m``; its gain
    ``a_m`` (1 at first) follows the rewards ``σ`` of the rounds it proposed,
    ``a_m ← (1 − ρ)·a_m + ρ·σ/σ̄``, with ``σ̄`` the mean reward of all rounds so far (so the gains
    stay near 1), floored at :data:`MOVE_FLOOR`.

    Parameters
    ----------
    weights
        The kernels' prior weights (positive).
    reaction
        ``ρ`` in ``(0, 1]``.
    """

    def __init__(self, weights: Sequence[float], reaction: float = MOVE_REACTION) -> None:
        if not weights or any(not w > 0 for w in weights):
            raise ValueError(f"MoveWeights: weights must be positive, got {list(weights)!r}")
        if not 0.0 < reaction <= 1.0:
            raise ValueError(f"MoveWeights: reaction must be in (0, 1], got {reaction!r}")
        self.prior = [float(w) for w in weights]
        self.gain = [1.0] * len(self.prior)
        self.reaction = reaction
        self._reward_sum = 0.0
        self._rounds = 0

    def weights(self) -> list[float]:
        """``w_m·max(a_m, floor)`` per kernel."""
        return [w * max(a, MOVE_FLOOR) for w, a in zip(self.prior, self.gain)]

    def draw(self, rng: Random) -> int:
        """A kernel index, drawn in proportion to :meth:`weights`."""
        ws = self.weights()
        x = rng.random() * sum(ws)
        for i, w in enumerate(ws):
            x -= w
            if x < 0:
                return i
        return len(ws) - 1

    def reward(self, m: int, sigma: float) -> None:
        """Record a round of kernel ``m`` that earned ``sigma``."""
        self._reward_sum += sigma
        self._rounds += 1
        mean = self._reward_sum / self._rounds
        rel = sigma / mean if mean > 0 else 1.0
        self.gain[m] = (1.0 - self.reaction) * self.gain[m] + self.reaction * rel


def default_moves(
    p_cp: float = 0.6, *, pair: bool = True, split: bool = True, variants: bool = True
) -> list[tuple[float, Move]]:
    """The move kernels and their weights: ``SingleMove(p_cp)`` 0.62, ``PairMove`` 0.20,
    ``SplitMove`` 0.08 and ``VariantMove`` 0.10 (all but the single move fall back to it;
    ``pair=False``, ``split=False`` or ``variants=False`` drops one, the rest keep their
    weights)."""
    single = SingleMove(p_cp)
    moves: list[tuple[float, Move]] = [(W_SINGLE, single)]
    if pair:
        moves.append((W_PAIR, PairMove(single)))
    if split:
        moves.append((W_SPLIT, SplitMove(single)))
    if variants:
        moves.append((W_RECOMPUTE, VariantMove(single, p_cp)))
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


#: The baselines a search starts from, in the order :func:`baseline_plans` lists them.
BASELINES = (concurrent_plan, greedy_plan)


def baseline_plans(ev: Evaluator, dirs: list[Directory], deadline: float | None = None) -> list[Plan]:
    """The concurrent and the greedy baseline over ``dirs``, those that exist (and are done by
    ``deadline``, a ``time.monotonic()`` instant), in that order."""
    plans = []
    for baseline in BASELINES:
        with contextlib.suppress(Infeasible, TimeUp):
            plans.append(baseline(ev, dirs, deadline=deadline))
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
    """One structural candidate: its evaluator, directories, seed plan and evaluation cache.

    With a ``deadline`` (a ``time.monotonic()`` instant) the directories are built until it
    (lean past it, :func:`~rpeg.scoring.candidates.build_directories`) and the baselines stop at
    it; with ``floor`` too, the lean floor and its baselines come first and stand in for what
    the deadline cuts (:func:`~rpeg.heuristics.baselines.baselines_in_time`): the structure
    whose baselines are the search's incumbents is prepared so.
    """

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
        deadline: float | None = None,
        floor: bool = False,
    ) -> None:
        self.structure = structure
        self.ev = Evaluator(workload, cluster, structure, k_eval=k_eval, split_phases=split_phases)
        # the staleness variants of one sharing choice have the same vertices: the process's
        # directory cache builds each once and hands every structure its own copy (restricted
        # independently below)
        self.deadline = deadline

        def narrow(dirs: list[Directory]) -> None:
            if not tune_microbatches:
                from ...ir.types import Role

                for d in dirs:
                    training = self.ev.graph.vertices[d.vertex].role is Role.TRAINING
                    keep = [i for i, s in enumerate(d.strategies) if fixed_microbatch_ok(training, s)]
                    d.strategies = [d.strategies[i] for i in keep]
                    d.times = [d.times[i] for i in keep]

        self._baselines: list[Plan] | None = None
        if floor and deadline is not None:
            # the floor first (lean directories and the baselines over them), so that a plan
            # exists by the deadline wherever one can; then the full directories until it
            dirs, plans, self.lean = baselines_in_time(self.ev, BASELINES, deadline, narrow)
            self._baselines = [p for p in plans if isinstance(p, Plan)]
        else:
            # past ``deadline`` (a time.monotonic() instant) the vertices not yet built stay lean;
            # a later structure's lean floor stops at it too (TimeUp: it is not searched)
            dirs = build_directories(self.ev.costs, deadline, floor=floor)
            #: what the result says when a directory is lean ("" when none is)
            self.lean = lean_message(self.ev.costs, dirs)
            narrow(dirs)
        if candidates is not None:  # the baselines are computed over the unrestricted directories
            if self._baselines is None:
                self._baselines = baseline_plans(self.ev, dirs, deadline)
            restrict(dirs, candidates, self._baselines)
        self.dirs: list[Directory] = dirs
        self.cache: dict[tuple, Raw] = {}
        self.vertex_key = tuple(v.name for v in self.ev.graph.vertices)

    def baselines(self) -> list[Plan]:
        """The structure's concurrent and greedy baselines (those that exist and are done by the
        deadline), computed once; with a candidate restriction, over the directories before it
        (their strategies are kept); for the structure prepared with its ``floor``, those over
        the lean floor where the full ones were not done in time."""
        if self._baselines is None:
            self._baselines = baseline_plans(self.ev, self.dirs, self.deadline)
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
    adaptive_moves
        Adapt the kernels' probabilities to their rewards (:class:`MoveWeights`); else draw
        them with the prior ``moves`` weights throughout.
    halving
        Share the budget over the structures by successive halving (:func:`halving_rounds`);
        else one turn each, an even split of what remains.
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
        adaptive_moves: bool = True,
        halving: bool = True,
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
        self.halving = halving
        ys = list(structures_) if structures_ is not None else structures(workload)
        if not ys:
            raise ValueError("no structural candidate to search")
        self.spaces: list[SearchSpace] = []
        for y in ys:
            # the first structure is always prepared (the synchronous one, whose baselines are
            # the incumbents); the rest only while time is left: each costs an evaluator and,
            # for a new sharing choice, directories (about 0.4 s at 16 GPUs on this machine)
            if self.spaces and budget.seconds is not None and budget.elapsed() >= budget.seconds:
                break
            try:
                space = SearchSpace(
                    workload,
                    cluster,
                    y,
                    k_eval=k_eval,
                    split_phases=split_phases,
                    tune_microbatches=tune_microbatches,
                    candidates=candidates,
                    # the whole limit: a search over full candidates from its baselines beat one
                    # over lean candidates that started sooner (docs/decisions.md, candidates
                    # under a time limit); the first structure's floor is built whatever the time
                    deadline=None if budget.seconds is None else budget.start + budget.seconds,
                    floor=not self.spaces,
                )
            except TimeUp:  # a later structure's lean floor was cut by the deadline
                break
            self.spaces.append(space)
        #: structures left unprepared because the time limit ran out first
        self.skipped = len(ys) - len(self.spaces)
        self._evaluate_many = evaluate_many
        self.progress = progress
        self.best_raw = 0.0
        self.best: tuple[float, int, Plan, Raw] | None = None  # (score, space, plan, raw)
        self.elites: dict[tuple, list[tuple[float, tuple, Plan, int]]] = {}
        self.history: list[tuple[float, int, float]] = []
        self._last_progress = 0.0
        self._label = ""
        self._active: Budget | None = None  # the sub-budget being spent
        self.adaptive_moves = adaptive_moves
        self.move_weights = MoveWeights([w for w, _ in self.moves])
        self.space_best: dict[int, float] = {}  # best feasible score per structure
        self.rounds: list[list[int]] = []  # the structures searched in each halving round
        self._started: set[int] = set()  # structures whose first chain has run

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
        if s > self.space_best.get(si, -math.inf):
            self.space_best[si] = s
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
        weights = self.move_weights
        prior_total = sum(w for w, _ in self.moves)
        rejected = stale = 0
        while rejected < self.max_rejections and stale < STALE_ROUNDS and not self._out_of_budget():
            if self.adaptive_moves:
                k = weights.draw(rng)
            else:
                x = rng.random() * prior_total
                k = len(self.moves) - 1
                for i, (w, _) in enumerate(self.moves):
                    x -= w
                    if x < 0:
                        k = i
                        break
            proposals = self.moves[k][1].propose(rng, current, ctx, self.proposals)
            before = self.budget.used
            best_before = self.best[0] if self.best is not None else -math.inf
            evaluated = self.evaluate(si, proposals) if proposals else []
            sigma = MOVE_REWARDS[3]
            if evaluated:
                scores = [self.score(r) for _, r in evaluated]
                best_i = max(range(len(scores)), key=scores.__getitem__)
                if self.acceptance(rng, score, scores[best_i], t):
                    if self.best is not None and self.best[0] > best_before:
                        sigma = MOVE_REWARDS[0]
                    else:
                        sigma = MOVE_REWARDS[1] if scores[best_i] > score else MOVE_REWARDS[2]
                    (current, raw), score = evaluated[best_i], scores[best_i]
                    ctx.critical = list(raw.critical)
                    rejected = 0
                else:
                    rejected += 1
            else:
                rejected += 1
            if proposals and self.adaptive_moves:
                weights.reward(k, sigma)
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
        idle = 0
        while not self._out_of_budget() and idle < STALE_CHAINS:
            before = self.budget.used
            elites = self.elites.get(space.vertex_key, [])
            if si not in self._started or not (self.warm_restarts and elites):
                self.chain(si, seed, self.t_init)
            else:
                _, _, plan, _ = elites[self.rng.randrange(len(elites))]
                self.chain(si, plan, self.t_warm)
            self._started.add(si)
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
            self._allocate(reserve)
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

    def _allocate(self, reserve: float) -> None:
        """Spend the budget (less the polish's ``reserve``) on the structures: successive halving
        (module docstring), or with ``halving=False`` one turn each with an even split of what
        remains.

        Structure ``j`` (0-based) of a round that ``k`` structures run, with ``r`` rounds left
        including this one, gets ``1/(r·k − j)`` of what remains when its turn starts: an equal
        ``1/(r·k)`` of the round's start when every turn spends its share, and a turn that ends
        early (a fully explored structure) leaves its rest to the turns after it.
        """
        n = len(self.spaces)
        sizes = halving_rounds(n) if self.halving else [n]
        alive = list(range(n))
        for r, k in enumerate(sizes):
            if r > 0:  # the better half goes on (ties: the earlier structure)
                ranked = sorted(alive, key=lambda si: (-self.space_best.get(si, -math.inf), si))
                alive = sorted(ranked[:k])
            self.rounds.append(list(alive))
            left = len(sizes) - r
            for j, si in enumerate(alive):
                self._active = self.budget.sub(1.0 / (left * len(alive) - j), reserve)
                if self._active is None:
                    return
                self.search_structure(si)

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

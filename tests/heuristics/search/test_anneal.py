"""The RPEG optimizer (method="sa"): optimality on enumerable spaces, incumbents, determinism,
budgets, ablation switches and the pluggable pieces."""

import dataclasses
import itertools
import math
from random import Random

import pytest

import rpeg
from rpeg import Cluster, Workload, hardware_preset, model_preset, solve
from rpeg.heuristics.search import (
    ABLATIONS,
    Anneal,
    Budget,
    Constant,
    Geometric,
    Greedy,
    Metropolis,
    MoveWeights,
    PairMove,
    Raw,
    SingleMove,
    SplitMove,
    halving_rounds,
)
from rpeg.ir import Plan, structures
from rpeg.scoring import Evaluator, build_directories
from rpeg.solvers import Status
from rpeg.solvers.sa import configure
from rpeg.solvers.solve import Problem

TINY = model_preset("7b").scaled(layers=4, hidden=1024, heads=8, vocab=8000)


def tiny_cluster(memory=0.8e9):
    hw = dataclasses.replace(hardware_preset("gh200"), name="tiny", gpu_memory_bytes=memory)
    return Cluster.from_shape("1x1x2", hw)


def exhaustive_optimum(w, cluster):
    """Best feasible throughput over every structure and every plan (brute force)."""
    best = 0.0
    count = 0
    for y in structures(w):
        ev = Evaluator(w, cluster, y)
        dirs = build_directories(ev.costs)
        options = [[c for i in range(len(d)) for c in d.choices(cluster, i)] for d in dirs]
        for choices in itertools.product(*options):
            e = ev.evaluate(Plan(choices))
            count += 1
            if e.feasible:
                best = max(best, e.throughput)
    return best, count


# Spaces small enough to enumerate with SPEC §14's engine variants in every directory (memory
# fractions, ZeRO stages, loss chunking, microbatches): a rule reward and no reference leave the
# generation and the training (on 0.8 GB GPUs, where about half of them do not fit).
@pytest.mark.parametrize(
    "w",
    [
        Workload("grpo", {"actor": TINY}, 8, 2, 64, 64, name="grpo-tiny", reward="rule", kl_coef=0.0),
        Workload("grpo", {"actor": TINY}, 4, 2, 64, 64, name="grpo-tinier", reward="rule", kl_coef=0.0),
    ],
    ids=lambda w: w.name,
)
def test_sa_finds_the_enumerated_optimum(w):
    cluster = tiny_cluster()
    best, count = exhaustive_optimum(w, cluster)
    assert 50 < count < 5000  # the space is small enough to enumerate, but not trivial
    assert best > 0
    r = solve(w, cluster, method="sa", max_evaluations=count, seed=0)
    assert r.feasible
    assert r.throughput == pytest.approx(best, rel=1e-12)


def test_memory_is_binding_in_the_enumerated_space():
    # the enumeration test above is only meaningful if memory rules some plans out
    w = Workload("grpo", {"actor": TINY}, 8, 2, 64, 64, reward="rule", kl_coef=0.0)
    cluster = tiny_cluster()
    ev = Evaluator(w, cluster)
    dirs = build_directories(ev.costs)
    options = [[c for i in range(len(d)) for c in d.choices(cluster, i)] for d in dirs]
    feas = [ev.evaluate(Plan(c)).feasible for c in itertools.product(*options)]
    assert any(feas) and not all(feas)


@pytest.fixture(scope="module")
def example():
    wf = rpeg.load_workload(rpeg.example_path("ppo-7b-16gpu"))
    return wf.workload, Cluster.from_shape(wf.cluster_shape, hardware_preset(wf.hardware))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sa_never_returns_less_than_the_concurrent_baseline(example, seed):
    w, cluster = example
    base = solve(w, cluster, method="concurrent")
    r = solve(w, cluster, method="sa", max_evaluations=150, seed=seed)
    assert r.feasible and r.status is Status.FEASIBLE
    assert r.throughput >= base.throughput
    assert r.evaluations <= 150


def test_sa_improves_on_the_baseline_with_a_real_budget(example):
    w, cluster = example
    base = solve(w, cluster, method="concurrent")
    # 3,000 evaluations: SPEC §14's engine variants make every directory about 4x larger
    r = solve(w, cluster, method="sa", max_evaluations=3000, seed=0)
    # measured 1.17x under issue 31's GPU terms (non-GEMM work at TP 1, the engine step's host
    # time), above 1.2x before them: the gain is the search's, the margin the instance's
    assert r.throughput > 1.1 * base.throughput


def test_same_seed_and_budget_give_the_same_plan(example):
    w, cluster = example
    a = solve(w, cluster, method="sa", max_evaluations=400, seed=7)
    b = solve(w, cluster, method="sa", max_evaluations=400, seed=7)
    c = solve(w, cluster, method="sa", max_evaluations=400, seed=8)
    assert a.plan == b.plan and a.structure == b.structure
    assert a.evaluations == b.evaluations == 400
    assert c.evaluations == 400


def test_workers_do_not_change_the_result(example):
    w, cluster = example
    one = solve(w, cluster, method="sa", max_evaluations=300, seed=5, workers=1)
    two = solve(w, cluster, method="sa", max_evaluations=300, seed=5, workers=2)
    assert one.plan == two.plan and one.structure == two.structure
    assert one.throughput == two.throughput


def test_time_limit_is_respected(example):
    w, cluster = example
    r = solve(w, cluster, method="sa", time_limit=1.5, seed=0)
    assert r.feasible
    assert r.runtime_s < 1.5 + 1.5  # one directory build and one final evaluation of slack


def test_interrupt_returns_best_so_far(example, monkeypatch):
    w, cluster = example
    calls = {"n": 0}
    original = Anneal.evaluate

    def flaky(self, si, plans):
        calls["n"] += 1
        if calls["n"] == 40:
            raise KeyboardInterrupt
        return original(self, si, plans)

    monkeypatch.setattr(Anneal, "evaluate", flaky)
    r = solve(w, cluster, method="sa", max_evaluations=10_000, seed=0)
    assert r.status is Status.TIME_LIMIT
    assert r.feasible and "interrupted" in r.message


# ------------------------------------------------------------------------------ ablations
def _problem(example):
    w, cluster = example
    return Problem(w, cluster, seed=0)


def test_unknown_ablation_is_named(example):
    with pytest.raises(ValueError, match=r"nonsense.*known: phase_split"):
        configure(_problem(example), max_evaluations=10, ablate=["nonsense"])


def test_each_ablation_switches_its_mechanism(example):
    p = _problem(example)
    default = configure(p, max_evaluations=10)
    assert default.spaces[0].ev.split_phases
    assert isinstance(default.temperature(), Constant)
    assert any(isinstance(m, PairMove) for _, m in default.moves)
    assert default.warm_restarts and default.do_polish and default.soft_penalty
    assert any(t > 0 for sp in default.spaces for _, t in sp.structure.staleness)

    assert not configure(p, max_evaluations=10, ablate=["phase_split"]).spaces[0].ev.split_phases
    stale = configure(p, max_evaluations=10, ablate=["staleness"])
    assert all(t == 0 for sp in stale.spaces for _, t in sp.structure.staleness)
    mb = configure(p, max_evaluations=10, ablate=["microbatch_tuning"])
    for sp in mb.spaces:
        for d in sp.dirs:
            training = sp.ev.graph.vertices[d.vertex].role.value == "training"
            for s in d.strategies:
                assert s.mb == (1 if s.pp == 1 else (2 * s.pp if training else s.pp))
    assert not any(
        isinstance(m, PairMove) for _, m in configure(p, max_evaluations=10, ablate=["pair_moves"]).moves
    )
    assert any(isinstance(m, SplitMove) for _, m in default.moves)
    assert not any(
        isinstance(m, SplitMove) for _, m in configure(p, max_evaluations=10, ablate=["split_moves"]).moves
    )
    no_donors = configure(p, max_evaluations=10, ablate=["pair_moves"]).moves
    assert not any(isinstance(m, PairMove | SplitMove) for _, m in no_donors)  # SPEC's ablation
    assert not configure(p, max_evaluations=10, ablate=["warm_restarts"]).warm_restarts
    cp = configure(p, max_evaluations=10, ablate=["critical_path"])
    assert all(m.p_cp == 0.0 for _, m in cp.moves if isinstance(m, SingleMove))
    assert not configure(p, max_evaluations=10, ablate=["polish"]).do_polish
    assert not configure(p, max_evaluations=10, ablate=["soft_penalty"]).soft_penalty
    assert isinstance(
        configure(p, max_evaluations=10, ablate=["constant_temperature"]).temperature(), Geometric
    )
    assert set(ABLATIONS) == {
        "phase_split",
        "staleness",
        "microbatch_tuning",
        "pair_moves",
        "split_moves",
        "warm_restarts",
        "critical_path",
        "polish",
        "soft_penalty",
        "constant_temperature",
        "adaptive_moves",
        "structure_halving",
    }
    assert default.adaptive_moves and default.halving
    assert not configure(p, max_evaluations=10, ablate=["adaptive_moves"]).adaptive_moves
    assert not configure(p, max_evaluations=10, ablate=["structure_halving"]).halving


def test_ablated_results_show_the_switch(example):
    w, cluster = example
    r = solve(w, cluster, method="sa", max_evaluations=200, seed=0, ablate=["phase_split"])
    assert not any(r.evaluation.graph.phase)
    r = solve(w, cluster, method="sa", max_evaluations=200, seed=0, ablate=["staleness"])
    assert all(t == 0 for _, t in r.structure.staleness)


def test_hard_rejection_scores_infeasible_plans_zero(example):
    search = configure(_problem(example), max_evaluations=10, ablate=["soft_penalty"])
    assert search.score(Raw(1000.0, 1.0, 0.5, 1.2, ())) == 0.0
    soft = configure(_problem(example), max_evaluations=10)
    assert soft.score(Raw(1000.0, 1.0, 0.5, 1.2, ())) == pytest.approx(1000.0 * math.exp(-40 * 0.2))
    assert soft.score(Raw(1000.0, 1.0, 0.5, 0.9, ())) == 1000.0


def test_warm_restarts_use_elites_at_t_warm(example, monkeypatch):
    temps = []
    original = Anneal.chain

    def spy(self, si, start, t0):
        temps.append(t0)
        return original(self, si, start, t0)

    monkeypatch.setattr(Anneal, "chain", spy)
    search = configure(_problem(example), max_evaluations=600, t_init=0.001, t_warm=0.05)
    search.run()
    assert temps[0] == 0.001 and 0.05 in temps
    temps.clear()
    search = configure(
        _problem(example), max_evaluations=600, t_init=0.001, t_warm=0.05, ablate=["warm_restarts"]
    )
    search.run()
    assert set(temps) == {0.001}


# ------------------------------------------------------------------------------ pieces
def test_metropolis_is_score_normalised():
    acc = Metropolis()
    assert acc(Random(0), 100.0, 101.0, 0.01)
    # P = exp((s' − s)/(|s|·t)) = exp(−0.01/0.01) = e^−1 ≈ 0.368
    rng = Random(1)
    hits = sum(acc(rng, 100.0, 99.0, 0.01) for _ in range(20000))
    assert hits / 20000 == pytest.approx(math.exp(-1), abs=0.015)
    rng = Random(1)
    hits_scaled = sum(acc(rng, 1e6, 0.99e6, 0.01) for _ in range(20000))
    assert hits_scaled == hits  # same relative loss, same decisions
    assert not Greedy()(Random(0), 100.0, 100.0, 1.0)


def test_geometric_cooling():
    g = Geometric(gamma=0.5, t_min=0.1)
    assert g.start(1.0) == 1.0
    assert [g.step() for _ in range(4)] == [0.5, 0.25, 0.125, 0.1]
    with pytest.raises(ValueError, match="gamma"):
        Geometric(gamma=1.5)


def test_budget_validation_and_sub_budgets():
    with pytest.raises(ValueError, match="time_limit or max_evaluations"):
        Budget()
    with pytest.raises(ValueError, match="max_evaluations"):
        Budget(evaluations=0)
    b = Budget(evaluations=100)
    b.spend(40)
    sub = b.sub(0.5, reserve=0.1)  # (60 − 10)·0.5
    assert sub.evaluations == 25
    b.spend(60)
    assert b.exhausted() and b.sub(1.0) is None


def test_custom_acceptance_plugs_in(example):
    w, cluster = example
    r = solve(w, cluster, method="sa", max_evaluations=200, seed=0, acceptance=Greedy())
    assert r.feasible


def _concurrent_context(example, restrict=None):
    """The evaluator, directories (``restrict(dirs)`` applied), concurrent plan and move context."""
    from rpeg.heuristics import concurrent_plan
    from rpeg.heuristics.search import MoveContext

    w, cluster = example
    ev = Evaluator(w, cluster)
    dirs = build_directories(ev.costs)
    if restrict is not None:
        restrict(dirs)
    plan = concurrent_plan(ev, dirs)
    return ev, dirs, plan, MoveContext(dirs, cluster, list(ev.evaluate(plan).critical))


def test_moves_propose_legal_neighbours(example):
    _, dirs, plan, ctx = _concurrent_context(example)
    rng = Random(0)
    for move in (SingleMove(0.6), PairMove()):
        for _ in range(20):
            for p in move.propose(rng, plan, ctx, 6):
                assert p != plan
                changed = [i for i in range(len(p)) if p[i] != plan[i]]
                assert 1 <= len(changed) <= 2
                for i in changed:
                    assert p[i].strategy in dirs[i].strategies
                    assert p[i].allocation.size == p[i].strategy.size


class _RecordingSingle(SingleMove):
    """A single move that records the ``k`` of each call (a kernel's fallback, observed)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []

    def propose(self, rng, plan, ctx, k):
        self.calls.append(k)
        return super().propose(rng, plan, ctx, k)


def _all_on_every_gpu(example):
    """Every invocation on all 16 GPUs with its fastest strategy of that size: a generation
    that shares its GPUs with every other invocation (the stability benchmark's basin)."""
    from rpeg.heuristics.search import MoveContext
    from rpeg.ir import Choice
    from rpeg.scoring.candidates import aligned_allocations

    w, cluster = example
    ev = Evaluator(w, cluster)
    dirs = build_directories(ev.costs)
    n = cluster.num_devices
    choices = []
    for d in dirs:
        s = d.strategies[d.of_size(n)[0]]
        choices.append(Choice(s, aligned_allocations(cluster, n)[0]))
    plan = Plan(tuple(choices))
    return dirs, plan, MoveContext(dirs, cluster, list(ev.evaluate(plan).critical))


def _separated(p: Plan) -> bool:
    """Some invocation shares no GPU with any other."""
    masks = [c.allocation.mask for c in p.choices]
    return any(all(not masks[u] & masks[v] for u in range(len(masks)) if u != v) for v in range(len(masks)))


def test_split_move_separates_the_donor_from_everything_it_shared_in_one_step(example):
    dirs, plan, ctx = _all_on_every_gpu(example)
    assert not _separated(plan)
    rng = Random(0)
    split = [p for _ in range(30) for p in SplitMove().propose(rng, plan, ctx, 6)]
    assert len(split) == 180
    for p in split:
        for i in range(len(p)):
            assert p[i].strategy in dirs[i].strategies
            assert p[i].allocation.size == p[i].strategy.size
    # the donor shrinks to at most 8 of the 16 GPUs and every other invocation has a strategy
    # of 2 GPUs, so each proposal moves all the others off the donor's GPUs
    assert all(_separated(p) for p in split)
    # the pair move frees GPUs for one receiver: with five invocations sharing, never in one step
    pair = [p for _ in range(30) for p in PairMove().propose(rng, plan, ctx, 6)]
    assert pair and not any(_separated(p) for p in pair)


def test_split_move_falls_back_when_nothing_shares_a_gpu(example):
    from rpeg.ir import Choice
    from rpeg.scoring.candidates import aligned_allocations

    dirs, _, ctx = _all_on_every_gpu(example)
    pairs = aligned_allocations(ctx.cluster, 2)
    apart = Plan(tuple(Choice(d.strategies[d.of_size(2)[0]], pairs[i]) for i, d in enumerate(dirs)))
    assert _separated(apart)
    spy = _RecordingSingle()
    SplitMove(spy).propose(Random(0), apart, ctx, 6)
    assert spy.calls == [6]


# ---------------------------------------------------------------------------- candidate restriction
def _ppo_13b_on_two_a100_nodes():
    wl = Workload(
        "ppo",
        {"actor": model_preset("llama2-13b"), "critic": model_preset("7b"), "reward": model_preset("7b")},
        256,
        1,
        128,
        256,
        name="ppo-13b",
    )
    return wl, Cluster.from_shape("1x2x8", hardware_preset("a100-40gb"))


@pytest.mark.parametrize("candidates", [None, 1, 2, 3])
def test_sa_never_ends_below_the_baselines_with_or_without_a_candidate_restriction(candidates):
    """The issue's instance: restricted to the 2 fastest strategies per invocation, SA called it
    infeasible ("cannot run side by side") while greedy (8,350 tok/s), concurrent (7,629) and
    CP-SAT over the same candidates found plans. Like the exact models, a restricted search keeps
    the baselines' strategies, and both baselines are incumbents (measured: 8,602 tok/s at 4,000
    evaluations with ``candidates=2``)."""
    wl, cl = _ppo_13b_on_two_a100_nodes()
    floor = max(solve(wl, cl, m, k_eval=2).throughput for m in ("greedy", "concurrent"))
    r = solve(wl, cl, "sa", k_eval=2, seed=0, candidates=candidates, max_evaluations=1500)
    assert r.status is Status.FEASIBLE, r.message
    assert r.throughput >= floor * (1 - 1e-9), (r.throughput, floor)


# ---------------------------------------------------------------------------- recomputation move
def test_variant_move_keeps_degrees_and_allocation(example):
    from rpeg.heuristics.search import VariantMove

    ev, dirs, plan, ctx = _concurrent_context(example)
    move = VariantMove()
    rng = Random(0)
    flipped = set()
    for _ in range(30):
        proposals = move.propose(rng, plan, ctx, 6)
        assert 1 <= len(proposals) <= 6
        for p in proposals:
            (i,) = [i for i in range(len(p)) if p[i] != plan[i]]
            a, b = p[i].strategy, plan[i].strategy
            assert p[i].allocation == plan[i].allocation
            assert (a.extent, a.dp, a.pp, a.tp) == (b.extent, b.dp, b.pp, b.tp)
            assert a != b and a in dirs[i].strategies
            flipped.add((i, a))
    roles = {ev.graph.vertices[i].role for i, _ in flipped}
    assert len(flipped) > 2 and len(roles) > 1  # not only trainers have variants now


def test_variant_move_falls_back_without_a_choice(example):
    from rpeg.heuristics.search import VariantMove

    def one_variant(dirs):  # every directory down to one variant per degrees: nothing to switch
        for d in dirs:
            seen, keep = set(), []
            for i, s in enumerate(d.strategies):
                if (s.extent, s.dp, s.pp, s.tp) not in seen:
                    seen.add((s.extent, s.dp, s.pp, s.tp))
                    keep.append(i)
            d.strategies, d.times = [d.strategies[i] for i in keep], [d.times[i] for i in keep]

    _, _, plan, ctx = _concurrent_context(example, one_variant)
    spy = _RecordingSingle()
    VariantMove(spy).propose(Random(0), plan, ctx, 6)
    assert spy.calls == [6]


def test_default_moves_give_the_donor_kernels_specs_pair_weight_and_include_the_flip():
    from rpeg.heuristics.search import VariantMove, default_moves

    moves = default_moves()
    weights = {type(m).__name__: w for w, m in moves}
    assert weights == {"SingleMove": 0.62, "PairMove": 0.20, "SplitMove": 0.08, "VariantMove": 0.10}
    assert weights["PairMove"] + weights["SplitMove"] == pytest.approx(0.28)  # SPEC §8's pair move
    assert not any(isinstance(m, PairMove) for _, m in default_moves(pair=False))
    assert any(isinstance(m, VariantMove) for _, m in default_moves(pair=False))
    assert not any(isinstance(m, SplitMove) for _, m in default_moves(split=False))


# ------------------------------------------------------------------------------ budget allocation
def test_halving_rounds():
    assert halving_rounds(1) == [1]
    assert halving_rounds(2) == [2, 1]
    assert halving_rounds(6) == [6, 3, 2, 1]
    assert halving_rounds(9) == [9, 5, 3, 2, 1]
    with pytest.raises(ValueError, match="at least 1"):
        halving_rounds(0)


def test_halving_searches_every_structure_then_the_better_half(example):
    """Round 1 runs every structure; each later round keeps the better half by the best score a
    structure has found; the turns of a round get equal evaluation budgets; the last structure
    standing is the best plan's."""
    spent: list[tuple[int, int]] = []
    search = configure(_problem(example), max_evaluations=3000)
    original = search.search_structure

    def spy(si):
        before = search.budget.used
        original(si)
        spent.append((si, search.budget.used - before))

    search.search_structure = spy
    outcome = search.run()
    n = len(search.spaces)
    assert [len(r) for r in search.rounds] == halving_rounds(n)
    assert search.rounds[0] == list(range(n))
    for prev, cur in zip(search.rounds, search.rounds[1:]):
        assert set(cur) <= set(prev)
        worst_kept = min(search.space_best.get(si, -math.inf) for si in cur)
        assert all(search.space_best.get(si, -math.inf) <= worst_kept for si in set(prev) - set(cur))
    assert outcome.space is search.spaces[search.rounds[-1][0]]
    # round 1: n turns of about (3000·(1 − polish share)/R)/n evaluations each
    first = [e for _, e in spent[:n]]
    share = 3000 * (1 - search.polish_share) / len(search.rounds) / n
    assert all(e <= share + 1 for e in first) and max(first) >= share - search.proposals


def test_without_halving_each_structure_gets_one_turn(example):
    seen: list[int] = []
    search = configure(_problem(example), max_evaluations=600, ablate=["structure_halving"])
    original = search.search_structure
    search.search_structure = lambda si: (seen.append(si), original(si))
    search.run()
    assert seen == list(range(len(search.spaces))) and search.rounds == [seen]


def test_move_weights_follow_the_rewards():
    mw = MoveWeights([0.6, 0.3, 0.1], reaction=0.5)
    assert mw.weights() == pytest.approx([0.6, 0.3, 0.1])
    for _ in range(20):  # kernel 1 keeps paying, kernel 0 never does
        mw.reward(1, 3.0)
        mw.reward(0, 0.0)
    w = mw.weights()
    assert w[1] / 0.3 > 1.5 and w[0] == pytest.approx(0.6 * 0.2)  # floored at MOVE_FLOOR
    assert w[2] == pytest.approx(0.1)  # not drawn: its prior stays
    rng = Random(0)
    draws = [mw.draw(rng) for _ in range(2000)]
    assert draws.count(1) > draws.count(0)
    for bad in ([], [1.0, 0.0]):
        with pytest.raises(ValueError, match="weights must be positive"):
            MoveWeights(bad)
    with pytest.raises(ValueError, match="reaction"):
        MoveWeights([1.0], reaction=0.0)


def test_adaptive_moves_change_the_draws_but_stay_deterministic(example):
    a = configure(_problem(example), max_evaluations=800)
    a.run()
    assert a.move_weights.gain != [1.0] * len(a.moves)  # the rewards moved the gains
    b = configure(_problem(example), max_evaluations=800)
    b.run()
    assert a.move_weights.gain == b.move_weights.gain and a.best[2] == b.best[2]
    fixed = configure(_problem(example), max_evaluations=800, ablate=["adaptive_moves"])
    fixed.run()
    assert fixed.move_weights.gain == [1.0] * len(fixed.moves)

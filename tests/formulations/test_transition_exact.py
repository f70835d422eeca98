"""Exact transition scheduling (CP-SAT, MILP) and the ``plan_transition`` front door."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rpeg import Cluster, Workload, hardware_preset, model_preset
from rpeg.costmodel.transition import gpu_capacities, primitive_times
from rpeg.formulations.status import Status
from rpeg.heuristics.transition import greedy_schedule
from rpeg.ir import build_graph
from rpeg.ir.cluster import NO_SPLITS
from rpeg.ir.emu import EMU, ModelStage, Stage, TransitionInfeasible, emus_of, transition_dag
from rpeg.ir.plan import Choice, Plan
from rpeg.scoring.candidates import aligned_allocations, enumerate_strategies
from rpeg.solvers.transition import TRANSITION_METHODS, plan_transition

GIB = 2.0**30
CLUSTER = Cluster.from_shape("1x2x4", hardware_preset("h200"), **NO_SPLITS)
TINY = model_preset("7b").scaled(layers=4, hidden=256, heads=4, vocab=1000)
GRPO = Workload("grpo", {"actor": TINY, "reward": TINY}, 8, 2, 32, 32)  # GRPO needs R ≥ 2
GRAPH = build_graph(GRPO)
STRATS = [enumerate_strategies(CLUSTER, TINY.layers, v.sequences) for v in GRAPH.vertices]
GEN = ModelStage("actor", Stage.GEN, "actor_gen", 0)
INF = ModelStage("reward", Stage.INF, "reward_inf", 2)


def random_plan(rng: random.Random) -> Plan:
    choices = []
    for strats in STRATS:
        s = rng.choice(strats)
        choices.append(Choice(s, rng.choice(aligned_allocations(CLUSTER, s.size))))
    return Plan(tuple(choices))


def unit(ms, tp, first, nbytes=8 * GIB):
    return EMU(ms, tp, 1, tuple(range(first, first + tp)), nbytes)


def ticks_of(dag, resolution):
    return [math.ceil(d / resolution - 1e-9) for d in primitive_times(dag, CLUSTER)]


def test_unknown_method_lists_known_ones():
    cur = [unit(GEN, 2, 0)]
    with pytest.raises(ValueError, match="greedy, cpsat, milp"):
        plan_transition(cur, cur, CLUSTER, method="scip")
    assert TRANSITION_METHODS == ("greedy", "cpsat", "milp")
    with pytest.raises(ValueError, match="graph= or workload="):
        plan_transition(random_plan(random.Random(0)), cur, CLUSTER)


def test_plan_transition_from_plans_reports_a_checked_schedule():
    rng = random.Random(3)
    while True:  # a pair whose transition is feasible (random pairs can block each other)
        cur, tgt = random_plan(rng), random_plan(rng)
        try:
            plan_transition(cur, tgt, CLUSTER, workload=GRPO, method="greedy")
            break
        except ValueError:  # TransitionInfeasible
            continue
    for method in ("greedy", "cpsat"):
        tp = plan_transition(cur, tgt, CLUSTER, workload=GRPO, method=method, time_limit=20)
        assert tp.status in (Status.OPTIMAL, Status.FEASIBLE)
        assert tp.check() == []
        assert tp.bound <= tp.l_tran + 1e-9 and tp.critical_path <= tp.l_tran + 1e-9
        assert tp.l_tran == pytest.approx(max(tp.ends, default=0.0))
        assert "L_tran" in tp.table()


def test_exact_beats_greedy_when_memory_forces_a_choice():
    """Memory on GPUs 2-3 admits one arriving copy at a time: greedy's order (Gen first) makes
    the long Inf move wait, the optimum starts it first."""
    stay = ModelStage("critic", Stage.INF, "critic_inf", 3)
    cur = [unit(GEN, 2, 0, 1 * GIB), unit(INF, 2, 4, 60 * GIB), unit(stay, 2, 2, 8 * GIB)]
    tgt = [unit(GEN, 2, 2, 1 * GIB), unit(INF, 2, 2, 60 * GIB), unit(stay, 2, 2, 8 * GIB)]
    for method in ("greedy", "cpsat", "milp"):
        tp = plan_transition(
            cur, tgt, CLUSTER, method=method, capacity=40 * GIB, resolution=0.05, time_limit=30
        )
        assert tp.check() == []
        if method == "greedy":
            greedy = tp.l_tran
        else:
            assert tp.status is Status.OPTIMAL
            assert tp.l_tran <= greedy + 0.05 * 6  # rounding: at most one tick per primitive


def test_time_limit_returns_the_best_schedule_and_says_so():
    rng = random.Random(11)
    cur = emus_of(random_plan(rng), CLUSTER, graph=GRAPH)
    tgt = emus_of(random_plan(rng), CLUSTER, graph=GRAPH)
    tp = plan_transition(cur, tgt, CLUSTER, method="milp", time_limit=1e-3)
    assert tp.has_schedule and tp.check() == []
    assert tp.status in (Status.TIME_LIMIT, Status.OPTIMAL)


def perturbed(rng: random.Random, plan: Plan) -> Plan:
    """``plan`` with one or two vertices' choices redrawn (a small transition)."""
    other = random_plan(rng)
    for i in rng.sample(range(len(plan)), rng.choice([1, 2])):
        plan = plan.replace(i, other[i])
    return plan


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(seed=st.integers(0, 2**31 - 1))
def test_cpsat_and_milp_agree_and_bound_the_greedy(seed):
    rng = random.Random(seed)
    plan = random_plan(rng)
    cur = emus_of(plan, CLUSTER, graph=GRAPH)
    tgt = emus_of(perturbed(rng, plan), CLUSTER, graph=GRAPH)
    try:
        dag = transition_dag(cur, tgt)
    except TransitionInfeasible:
        assume(False)
    assume(0 < len(dag) <= 12)
    largest = max(u.bytes_per_gpu for u in dag.units.values())
    capacity = largest * rng.uniform(1.5, 4.0)
    greedy = plan_transition(cur, tgt, CLUSTER, method="greedy", capacity=None)
    res = max(greedy.l_tran / 25, 1e-3)
    out = {
        m: plan_transition(cur, tgt, CLUSTER, method=m, resolution=res, capacity=capacity, time_limit=30)
        for m in ("cpsat", "milp")
    }
    statuses = {m: tp.status for m, tp in out.items()}
    if Status.INFEASIBLE in statuses.values():
        assert set(statuses.values()) == {Status.INFEASIBLE}  # both prove it
        return
    assert set(statuses.values()) == {Status.OPTIMAL}
    assert out["cpsat"].l_tran == pytest.approx(out["milp"].l_tran)
    for tp in out.values():
        assert tp.check() == []
    # the greedy list order on the same ticks is never shorter than the optimum
    ticks = ticks_of(dag, res)
    caps = gpu_capacities(dag, CLUSTER, capacity)
    try:
        g = greedy_schedule(dag, ticks, caps)
    except TransitionInfeasible:
        return
    assert g.length * res >= out["cpsat"].l_tran - 1e-9

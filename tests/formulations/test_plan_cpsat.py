"""Tests for ``formulations/plan_cpsat.py``: the exact plan-selection model means what the
evaluator means (SPEC §9 cross-checks), and ``method="cpsat"`` returns it."""

import itertools
from random import Random

import pytest

from rpeg import solve
from rpeg.formulations.plan_cpsat import PlanCPModel, solve_plan_cpsat
from rpeg.formulations.plan_model import PLAN_BLOCKS, build_plan_instance, candidate_sets
from rpeg.formulations.status import Status as EngineStatus
from rpeg.ir import Plan, Structure
from rpeg.scoring import Evaluator, build_directories
from rpeg.scoring.check import check_schedule
from rpeg.solvers import Status
from tests.formulations.test_plan_model import REL, exact_schedule, tiny


@pytest.mark.parametrize("tau", [0, 1])
def test_exact_optimum_matches_enumeration_and_its_schedule_checks(tau):
    w, cluster = tiny()
    ev = Evaluator(w, cluster, Structure("grpo", False, (("actor", tau),)), k_eval=2)
    # the 3 fastest layouts per invocation, each with its engine variants: 288 plans, 194 of them
    # memory-feasible (every candidate would be ~10^5 plans, and a serial horizon so long that
    # CP-SAT's time unit times the nodes of a path exceeds REL of the makespan)
    cands = candidate_sets(ev, build_directories(ev.costs), 3)
    sol = solve_plan_cpsat(build_plan_instance(ev, cands), time_limit=60)
    assert sol.status == "optimal"
    # the model schedules exactly the nodes the evaluator lowers, and its schedule is valid
    e, g, sched, missing, extra = exact_schedule(ev, sol)
    assert not missing and not extra
    assert check_schedule(g, sched) == []
    assert e.feasible
    # re-scoring the exact plan with the list scheduler is never shorter than the exact makespan
    assert e.makespan >= sol.makespan * (1 - REL)
    assert sol.lower_bound <= sol.makespan
    # no enumerated feasible plan is better than the exact optimum (list schedules are schedules)
    best_list = min(r.makespan for p in itertools.product(*cands) if (r := ev.evaluate(Plan(p))).feasible)
    assert sol.makespan <= best_list * (1 + REL)


def test_memory_rules_agree_with_the_evaluator_plan_by_plan():
    w, cluster = tiny("ppo", memory=1.6e9)
    ev = Evaluator(w, cluster, Structure("ppo", False, (("actor", 1), ("critic", 1))), k_eval=1)
    dirs = build_directories(ev.costs)
    cands = candidate_sets(ev, dirs, None)
    rng = Random(0)
    verdicts = set()
    for _ in range(12):
        plan = Plan(tuple(rng.choice(cs) for cs in cands))
        inst = build_plan_instance(ev, [[c] for c in plan.choices])
        sol = solve_plan_cpsat(inst, time_limit=20)
        feasible = ev.evaluate(plan).feasible
        verdicts.add(feasible)
        assert (sol.status == "optimal") == feasible, plan
        assert (sol.status == "infeasible") == (not feasible)
    assert verdicts == {True, False}  # both outcomes were exercised


def test_fixed_plan_exact_makespan_is_no_longer_than_the_list_schedule():
    w, cluster = tiny("ppo", memory=100e9, shape="1x1x4")
    ev = Evaluator(w, cluster, Structure("ppo", True, (("actor_critic", 1),)), k_eval=2)
    cands = candidate_sets(ev, build_directories(ev.costs), 2)
    rng = Random(3)
    for _ in range(2):
        plan = Plan(tuple(rng.choice(cs) for cs in cands))
        sol = solve_plan_cpsat(build_plan_instance(ev, [[c] for c in plan.choices]), time_limit=30)
        assert sol.status == "optimal"
        _, g, sched, missing, extra = exact_schedule(ev, sol)
        assert not missing and not extra
        assert check_schedule(g, sched) == []
        assert sol.makespan <= ev.evaluate(plan).makespan * (1 + REL)


def test_solve_cpsat_front_door():
    w, cluster = tiny(rule=True)  # whole directories: two invocations keep the model small
    r = solve(w, cluster, method="cpsat", candidates=None, k_eval=2, time_limit=60)
    assert r.status is Status.OPTIMAL and r.feasible
    assert "proven optimal" in r.message
    assert r.objective_bound is not None and r.objective_bound >= r.extra["model_throughput"] * (1 - 1e-9)
    assert r.to_dict()["objective_bound"] == r.objective_bound
    with pytest.raises(ValueError, match="nonsense"):
        solve(w, cluster, method="cpsat", nonsense=1)
    with pytest.raises(ValueError, match="warm_start"):
        solve(w, cluster, method="cpsat", warm_start="magic")


def test_infeasible_candidate_sets_say_so():
    w, cluster = tiny(memory=0.5e9)
    r = solve(w, cluster, method="cpsat", k_eval=1, time_limit=30)
    assert r.status is Status.INFEASIBLE and r.plan is None
    assert "does not fit" in r.message and "GiB" in r.message


def test_the_model_adds_every_block_in_order_and_hints_a_plan():
    w, cluster = tiny()
    ev = Evaluator(w, cluster, Structure("grpo", False, (("actor", 1),)), k_eval=1)
    cands = candidate_sets(ev, build_directories(ev.costs), 2)
    model = PlanCPModel(build_plan_instance(ev, cands))
    assert model.blocks == list(PLAN_BLOCKS) == list(PlanCPModel.BLOCKS)
    plan = Plan(tuple(cs[0] for cs in cands))
    model.add_hint(plan)
    sol = model.solve(seed=0, threads=1)
    assert sol.status is EngineStatus.OPTIMAL and sol.plan is not None
    assert sol.lower_bound <= sol.makespan


def test_a_model_too_large_for_its_deadline_is_time_limit_without_a_plan():
    from rpeg.formulations.deadline import Deadline

    w, cluster = tiny()
    ev = Evaluator(w, cluster, Structure("grpo", False, (("actor", 1),)), k_eval=1)
    inst = build_plan_instance(ev, candidate_sets(ev, build_directories(ev.costs), 1))
    sol = solve_plan_cpsat(inst, deadline=Deadline(0))
    assert sol.status is EngineStatus.TIME_LIMIT and sol.plan is None and sol.makespan == float("inf")
    assert sol.message.startswith("model too large to build in 0 s")

"""The exact plan-selection model means what the evaluator means (SPEC §9 cross-checks)."""

import dataclasses
import itertools
from random import Random

import pytest

from rpeg import Cluster, Workload, hardware_preset, model_preset, solve
from rpeg.formulations.plan_cpsat import solve_plan_cpsat
from rpeg.formulations.plan_model import build_instance, candidate_sets
from rpeg.ir import Plan, Structure
from rpeg.scoring import Evaluator, build_directories
from rpeg.scoring.check import check_schedule
from rpeg.scoring.scheduler import Schedule
from rpeg.solvers import Status

TINY = model_preset("7b").scaled(layers=4, hidden=1024, heads=8, vocab=8000)
REL = 2e-3  # the model rounds durations up to serial-horizon/1e5; a path holds < 200 nodes here


def tiny(algorithm="grpo", memory=1.05e9, shape="1x1x2"):
    hw = dataclasses.replace(hardware_preset("gh200"), name="tiny", gpu_memory_bytes=memory)
    models = {"actor": TINY, "reward": TINY} | ({"critic": TINY} if algorithm == "ppo" else {})
    if algorithm == "dpo":
        models = {"actor": TINY}
    return Workload(algorithm, models, 8, 2, 64, 64), Cluster.from_shape(shape, hw)


def exact_schedule(ev, sol):
    """The model's start times laid onto the evaluator's lowered graph of the chosen plan."""
    e = ev.evaluate(sol.plan, keep=True)
    g = e.graph
    keys = [(g.kind[i], g.vertex[i], g.source[i], g.step[i], g.phase[i]) for i in range(len(g))]
    missing = [k for k in keys if k not in sol.starts]
    extra = set(sol.starts) - set(keys)
    starts = [sol.starts.get(k, 0.0) for k in keys]
    finish = [s + d for s, d in zip(starts, g.duration)]
    return e, g, Schedule(starts, finish, max(finish), [], [], []), missing, extra


@pytest.mark.parametrize("tau", [0, 1])
def test_exact_optimum_matches_enumeration_and_its_schedule_checks(tau):
    w, cluster = tiny()
    ev = Evaluator(w, cluster, Structure("grpo", False, (("actor", tau),)), k_eval=2)
    cands = candidate_sets(ev, build_directories(ev.costs), None)
    sol = solve_plan_cpsat(build_instance(ev, cands), time_limit=60)
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
        inst = build_instance(ev, [[c] for c in plan.choices])
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
        sol = solve_plan_cpsat(build_instance(ev, [[c] for c in plan.choices]), time_limit=30)
        assert sol.status == "optimal"
        _, g, sched, missing, extra = exact_schedule(ev, sol)
        assert not missing and not extra
        assert check_schedule(g, sched) == []
        assert sol.makespan <= ev.evaluate(plan).makespan * (1 + REL)


def test_solve_cpsat_front_door():
    w, cluster = tiny()
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


def test_cpsat_and_milp_reach_the_same_optimum():
    from rpeg.formulations.plan_milp import solve_plan_milp

    w, cluster = tiny()
    ev = Evaluator(w, cluster, Structure("grpo", False, (("actor", 1),)), k_eval=1)
    inst = build_instance(ev, candidate_sets(ev, build_directories(ev.costs), 2))
    cp = solve_plan_cpsat(inst, time_limit=60)
    mi = solve_plan_milp(inst, time_limit=120)
    assert cp.status == mi.status == "optimal"
    # MILP keeps durations exact; CP-SAT rounds them up: same optimum up to that rounding
    assert mi.makespan == pytest.approx(cp.makespan, rel=REL)
    assert cp.lower_bound <= mi.makespan * (1 + 1e-9)
    # the MILP's schedule is a valid schedule of the evaluator's lowered graph too
    e, g, sched, missing, extra = exact_schedule(ev, mi)
    assert not missing and not extra
    assert check_schedule(g, sched, tol=1e-6) == []
    assert e.makespan >= mi.makespan * (1 - 1e-6)


def test_milp_front_door_and_missing_solver():
    from rpeg.formulations.milp import SolverUnavailableError

    w, cluster = tiny()
    r = solve(w, cluster, method="milp", candidates=1, k_eval=1, time_limit=60)
    assert r.status is Status.OPTIMAL and r.feasible
    with pytest.raises(ValueError, match="no-such-solver"):
        solve(w, cluster, method="milp", solver="no-such-solver", candidates=1, k_eval=1, time_limit=5)
    pytest.importorskip("pyomo")
    import importlib.util

    if importlib.util.find_spec("gurobipy") is None:  # a known solver that is not installed
        with pytest.raises(SolverUnavailableError, match="gurobi"):
            solve(w, cluster, method="milp", solver="gurobi", candidates=1, k_eval=1, time_limit=5)


def test_milp_handles_realistic_byte_sizes():
    # realistic byte sizes (memory is scaled to GiB inside the MILP to keep HiGHS numerically sound)
    m7 = model_preset("7b")
    w = Workload("grpo", {"actor": m7, "reward": m7}, 64, 4, 128, 256)
    cluster = Cluster.from_shape("1x1x4", hardware_preset("gh200"))
    cp = solve(
        w,
        cluster,
        method="cpsat",
        candidates=1,
        k_eval=1,
        time_limit=30,
        structure=Structure("grpo", False, (("actor", 0),)),
    )
    mi = solve(
        w,
        cluster,
        method="milp",
        candidates=1,
        k_eval=1,
        time_limit=60,
        structure=Structure("grpo", False, (("actor", 0),)),
    )
    assert cp.status is Status.OPTIMAL
    assert mi.plan is not None and mi.status in (Status.OPTIMAL, Status.TIME_LIMIT)
    assert mi.extra["model_throughput"] <= cp.objective_bound * (1 + 1e-9)

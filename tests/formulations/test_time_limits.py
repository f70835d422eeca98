"""Time limits that hold in the project-scheduling engines (``solve_cpsat``, ``solve_milp``).

The instance is ``tests/data/psplib/synthetic/j120like_1.sm``: 120 jobs, 4 renewable resources
and a resource strength of 0.1, drawn in the PSPLIB layout by ``make_j120like.py`` next to it
(the PSPLIB j120 set is not shipped). Before the deadline work, CP-SAT without a hint found no
schedule in 1 s (nor in 5 s) and reported ``makespan inf``, and the MILP spent 4-6 s building the
model and handing it to HiGHS on a 1-s limit. Bounds are generous (``1.1·limit + 1 s`` measured
with ``time.monotonic``) so that a loaded 2-core machine does not make them flaky.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rpeg.formulations import Status, read_sm, solve_cpsat, solve_milp
from rpeg.formulations.deadline import BuildTimeout, Deadline
from rpeg.formulations.milp import MILPModel
from rpeg.formulations.project_schedule import (
    check_project_schedule,
    fallback_schedule,
    list_schedule_project,
)

J120 = Path(__file__).resolve().parents[1] / "data" / "psplib" / "synthetic" / "j120like_1.sm"


def bound(limit: float) -> float:
    """The overshoot the tests allow: 10% of the limit plus one second."""
    return 1.1 * limit + 1.0


@pytest.fixture(scope="module")
def j120():
    return read_sm(J120)


@pytest.mark.parametrize("engine", [solve_cpsat, solve_milp], ids=["cpsat", "milp"])
def test_a_j120_instance_on_a_one_second_limit_gets_a_valid_schedule_in_time(j120, engine):
    listed = list_schedule_project(j120)
    t0 = time.monotonic()
    sol = engine(j120, time_limit=1, threads=1)
    elapsed = time.monotonic() - t0
    assert elapsed <= bound(1), f"{engine.__name__} took {elapsed:.2f} s on a 1-s limit"
    assert sol.status is Status.TIME_LIMIT
    assert sol.has_schedule and check_project_schedule(j120, sol) == []
    assert sol.makespan <= listed.makespan  # at least the list schedule
    assert j120.lower_bound() <= sol.lower_bound < sol.makespan  # the gap is shown
    assert 0 < sol.gap < 1


@pytest.mark.parametrize("engine", [solve_cpsat, solve_milp], ids=["cpsat", "milp"])
def test_a_model_too_large_to_build_in_time_returns_the_list_schedule_and_says_so(j120, engine):
    t0 = time.monotonic()
    sol = engine(j120, time_limit=1e-3, threads=1)
    assert time.monotonic() - t0 <= bound(1e-3)
    assert sol.status is Status.TIME_LIMIT
    assert sol.starts == list_schedule_project(j120).starts
    assert "model too large to build in 0.001 s" in sol.message and "list schedule" in sol.message
    assert check_project_schedule(j120, sol) == []


def test_a_better_valid_hint_is_the_fallback_and_an_invalid_one_is_not(j120):
    listed = list_schedule_project(j120)
    assert fallback_schedule(j120, None).starts == listed.starts
    better = solve_cpsat(j120, time_limit=1, threads=1, hint=listed)
    assert better.makespan < listed.makespan
    assert fallback_schedule(j120, better) is better
    broken = better.replace(starts=tuple(0 for _ in better.starts))
    assert fallback_schedule(j120, broken).starts == listed.starts


def test_model_building_checks_the_deadline():
    with pytest.raises(BuildTimeout, match="model too large to build in 0 s"):
        MILPModel(read_sm(J120), 300, deadline=Deadline(0))


def test_rpeg_project_on_a_time_limit_prints_a_valid_schedule_and_the_bound(capsys):
    from rpeg.cli import main

    t0 = time.monotonic()
    code = main(["project", str(J120), "--method", "cpsat", "--time-limit", "1", "--threads", "1"])
    assert time.monotonic() - t0 <= bound(1)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "status time_limit" in out and "schedule   valid" in out
    assert "lower bound 1" in out  # the gap is shown: a finite bound next to the makespan


@pytest.mark.parametrize("engine", ["cpsat", "milp"])
def test_plan_models_past_their_deadline_return_no_plan_and_say_why(tiny_ppo, cluster_1x2x4, engine):
    from rpeg.formulations.plan_cpsat import solve_plan_cpsat
    from rpeg.formulations.plan_milp import solve_plan_milp
    from rpeg.formulations.plan_model import build_plan_instance, candidate_sets
    from rpeg.scoring import Evaluator, build_directories

    ev = Evaluator(tiny_ppo, cluster_1x2x4, k_eval=1)
    inst = build_plan_instance(ev, candidate_sets(ev, build_directories(ev.costs), 1))
    with pytest.raises(BuildTimeout):
        build_plan_instance(ev, inst.cands, Deadline(0))
    fn = solve_plan_cpsat if engine == "cpsat" else solve_plan_milp
    sol = fn(inst, deadline=Deadline(0))
    assert sol.status == "time_limit" and sol.plan is None and not sol.interrupted
    assert sol.message.startswith("model too large to build in 0 s")
    sol = fn(inst, time_limit=30)  # the same instance with time to spare
    assert sol.plan is not None and sol.message == ""


def test_the_milp_builds_and_hands_over_its_model_with_the_callers_heap_frozen(monkeypatch):
    """A full garbage collection scans every tracked object of the process and cannot be
    interrupted: in a long-lived process (a test worker, a notebook) one such collection during
    the build pushed a 1-s limit to 2.2 s on CI. The caller's objects stay frozen meanwhile."""
    import gc

    from rpeg.formulations import milp

    seen: dict[str, int] = {}
    build, run = milp.MILPModel.__post_init__, milp._run

    def spy_build(self):
        seen["build"] = gc.get_freeze_count()
        build(self)

    def spy_run(*args, **kwargs):
        seen["run"] = gc.get_freeze_count()
        return run(*args, **kwargs)

    monkeypatch.setattr(milp.MILPModel, "__post_init__", spy_build)
    monkeypatch.setattr(milp, "_run", spy_run)
    frozen_before = gc.get_freeze_count()
    small = read_sm(J120.parents[1] / "j30.sm" / "j3011_1.sm")
    assert solve_milp(small, time_limit=60, threads=1).status is Status.OPTIMAL
    assert seen["build"] > 0 and seen["run"] > 0
    assert gc.get_freeze_count() == frozen_before  # handed back

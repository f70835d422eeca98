"""Tests for ``formulations/cpsat.py``: CP-SAT proves published PSPLIB optima and hand-worked
answers on tiny projects (unary devices, lags, modes, non-renewable budgets, infeasibility).

Instances: j30 ``j3011_7``, ``j3033_4``, ``j3018_7``, ``j307_8`` and j20.mm ``j2014_3``, ``j209_1``,
``j2031_3`` — each has a critical-path/energy bound below its optimum and a list schedule above
it, so the engine has to improve the hint *and* prove the bound, yet both engines close them in
about a second (the time-indexed MILP being the slower; see ``test_milp.py``).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from rpeg.formulations import (
    Activity,
    CPModel,
    Mode,
    Project,
    Resource,
    Status,
    read_mm,
    read_optima,
    read_sm,
    solve_cpsat,
)
from rpeg.formulations.project_schedule import check_project_schedule, list_schedule_project

PSPLIB = Path(__file__).resolve().parents[1] / "data" / "psplib"
J30 = ["j3011_7", "j3033_4", "j3018_7", "j307_8"]
J20MM = ["j2014_3", "j209_1", "j2031_3"]


def load(name: str) -> tuple[Project, int]:
    """The instance and its published optimum (shipped under tests/data/psplib)."""
    if name.startswith("j30"):
        return read_sm(PSPLIB / "j30.sm" / f"{name}.sm"), read_optima(PSPLIB / "j30.sm" / "optimum.csv")[name]
    return read_mm(PSPLIB / "j20.mm" / f"{name}.mm"), read_optima(PSPLIB / "j20.mm" / "j20opt.mm")[name]


# ------------------------------------------------------------------------------- PSPLIB
@pytest.mark.parametrize("name", J30 + J20MM)
def test_proves_the_published_optimum(name):
    p, optimum = load(name)
    sol = solve_cpsat(p, time_limit=30, seed=0, threads=1)
    assert sol.status is Status.OPTIMAL
    assert sol.makespan == optimum and sol.lower_bound == optimum
    assert check_project_schedule(p, sol) == []
    assert p.lower_bound() < optimum  # the proof is not the root bound
    assert sol.solver == "cpsat" and sol.runtime < 30


@pytest.mark.parametrize("name", ["j3018_7", "j2014_3"])
def test_a_list_schedule_hint_is_taken_whole(name):
    p, optimum = load(name)
    hint = list_schedule_project(p)
    assert hint.makespan > optimum
    m = CPModel(p)
    assert m.add_hint(hint)
    # with every variable fixed to its hint, CP-SAT must return the hint itself: the hint is
    # complete and consistent with the model
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.fix_variables_to_their_hinted_value = True
    solver.parameters.num_workers = 1
    assert solver.Solve(m.model) == cp_model.OPTIMAL
    assert [solver.Value(s) for s in m.vars.start] == list(hint.starts)
    assert solver.ObjectiveValue() == hint.makespan
    # and a normal solve from the hint reaches the optimum
    sol = solve_cpsat(p, time_limit=30, threads=1, hint=hint)
    assert sol.status is Status.OPTIMAL and sol.makespan == optimum


def test_time_limit_keeps_the_incumbent_and_the_bound():
    p, optimum = load("j3013_2")  # one of the hardest j30 instances: CP-SAT did not close it in 10 s
    hint = list_schedule_project(p)
    sol = solve_cpsat(p, time_limit=3, threads=1, hint=hint)  # long enough to load the hint under load
    assert sol.status is Status.TIME_LIMIT
    assert optimum <= sol.makespan <= hint.makespan
    assert p.lower_bound() <= sol.lower_bound <= optimum and sol.lower_bound < sol.makespan
    assert check_project_schedule(p, sol) == []
    assert sol.runtime < 10


def test_wrong_length_hint_is_refused():
    p = Project.single_mode([1, 1], [[1], [1]], [1])
    bad = list_schedule_project(Project.single_mode([1], [[1]], [1]))
    assert not CPModel(p).add_hint(bad)
    assert solve_cpsat(p, hint=bad).makespan == 2


# ------------------------------------------------------------------------------- tiny
def test_unary_device_serialises_and_cumulative_packs():
    # three 2-unit-long jobs on one device: 6; the same jobs on a capacity-2 resource: 4
    dev = Project.single_mode([2, 2, 2], [[1], [1], [1]], [1], unary=[0])
    sol = solve_cpsat(dev)
    assert sol.status is Status.OPTIMAL and sol.makespan == 6
    assert check_project_schedule(dev, sol) == []
    cum = Project.single_mode([2, 2, 2], [[1], [1], [1]], [2])
    assert solve_cpsat(cum).makespan == 4


def test_lags_and_modes():
    # 0 -(lag 3)-> 1; activity 1: slow mode (4) on nothing, fast mode (1) on the device that
    # activity 2 (length 10, no predecessors) holds: fast only after 10, so 2 + 3 + 4 = 9 wins
    p = Project(
        (
            Activity((Mode(2, (0,)),)),
            Activity((Mode(4, (0,)), Mode(1, (1,)))),
            Activity((Mode(10, (1,)),)),
        ),
        (Resource(1, unary=True),),
        ((0, 1, 3),),
    )
    sol = solve_cpsat(p)
    assert sol.status is Status.OPTIMAL and sol.makespan == 10
    assert sol.modes[1] == 0 or sol.starts[1] >= 10
    assert check_project_schedule(p, sol) == []
    # a negative lag lets the successor start before its predecessor ends
    q = Project.single_mode([5, 1], [[0], [0]], [1], [(0, 1, -4)])
    sol = solve_cpsat(q)
    assert 1 <= sol.starts[1] <= 4 and sol.makespan == 5
    assert check_project_schedule(q, sol) == []


def test_nonrenewable_budget_forces_one_slow_mode():
    # on one device: both fast (2) would spend 10 > 6; one fast and one slow: 1 + 3 = 4
    fast_or_cheap = Activity((Mode(1, (1, 5)), Mode(3, (1, 1))))
    p = Project((fast_or_cheap, fast_or_cheap), (Resource(1, unary=True), Resource(6, renewable=False)))
    sol = solve_cpsat(p)
    assert sol.makespan == 4 and sorted(sol.modes) == [0, 1]
    assert check_project_schedule(p, sol) == []


@pytest.mark.parametrize(
    "project",
    [
        Project((Activity((Mode(1, (3,)),)),), (Resource(2),)),  # demand above capacity
        Project((Activity((Mode(1, (2,)),)), Activity((Mode(1, (2,)),))), (Resource(3, renewable=False),)),
    ],
    ids=["no-fitting-mode", "budget"],
)
def test_infeasible(project):
    sol = solve_cpsat(project)
    assert sol.status is Status.INFEASIBLE
    assert sol.makespan == math.inf and sol.lower_bound == math.inf and sol.objective == math.inf
    assert check_project_schedule(project, sol) == []


def test_importing_the_package_does_not_import_the_engines():
    code = "import sys, rpeg.formulations; assert not any(m.startswith(('ortools', 'pyomo')) for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])

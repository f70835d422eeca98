"""Tests for ``formulations/milp.py``: the time-indexed MILP, solved by HiGHS through Pyomo, proves
the published PSPLIB optima and agrees with CP-SAT.

Instances: the same as ``test_cpsat.py`` — j30 ``j3011_7``, ``j3033_4``, ``j3018_7``, ``j307_8``
and j20.mm ``j2014_3``, ``j209_1``, ``j2031_3``. They were picked because HiGHS closes them in
well under a second each (most j30 instances take it seconds, and the hard ones time out at
10 s; see ``benchmarks/RESULTS.md``), while still needing more than the root bound: on each the
critical-path/energy bound is below the optimum and the list schedule (the hint) above it.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpeg.formulations import (
    MILP_SOLVERS,
    Activity,
    MILPModel,
    Mode,
    Project,
    Resource,
    SolverUnavailableError,
    Status,
    pyomo_backend,
    read_mm,
    read_optima,
    read_sm,
    solve_cpsat,
    solve_milp,
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
def test_proves_the_published_optimum_and_agrees_with_cpsat(name):
    p, optimum = load(name)
    hint = list_schedule_project(p)
    assert p.lower_bound() < optimum < hint.makespan
    sol = solve_milp(p, time_limit=30, seed=0, threads=1, hint=hint)
    assert sol.status is Status.OPTIMAL, sol
    assert sol.makespan == optimum and sol.lower_bound == optimum
    assert check_project_schedule(p, sol) == []
    assert sol.solver == "milp/highs"
    cp = solve_cpsat(p, time_limit=30, threads=1, hint=hint)
    assert cp.status is Status.OPTIMAL and cp.makespan == sol.makespan


def test_the_list_hint_is_accepted_and_a_broken_one_is_not():
    p, optimum = load("j3018_7")
    hint = list_schedule_project(p)
    mm = MILPModel(p, int(hint.makespan))
    assert mm.set_values(hint)  # satisfies every constraint of the model over H = its makespan
    assert len(mm.model.x) < len(MILPModel(p, p.trivial_horizon()).model.x) / 2
    # all activities at their earliest starts: precedence-feasible, but over capacity
    es = dataclasses.replace(
        hint, starts=p.earliest_starts, makespan=float(p.makespan(p.earliest_starts, hint.modes))
    )
    assert es.makespan < optimum
    assert not MILPModel(p, int(es.makespan)).set_values(es)
    assert check_project_schedule(p, es) != []
    # the broken hint is dropped (its makespan would make the model infeasible): still optimal
    sol = solve_milp(p, time_limit=30, threads=1, hint=es)
    assert sol.status is Status.OPTIMAL and sol.makespan == optimum


@pytest.mark.parametrize(("name", "optimum"), [("j3010_5", 41), ("j3011_8", 62)])
def test_highs_mip_start_regression(name, optimum):
    # with the hint as a MIP start, HiGHS 1.16 reported "optimal" at the optimum while returning
    # the start (one unit longer); solve_milp no longer gives HiGHS a start
    p, published = load(name)
    assert published == optimum
    hint = list_schedule_project(p)
    assert hint.makespan == optimum + 1
    for solver in ("highs", "appsi_highs"):
        sol = solve_milp(p, solver=solver, time_limit=30, threads=1, hint=hint)
        assert sol.status is Status.OPTIMAL and sol.makespan == optimum, solver


def test_an_unbacked_optimal_claim_is_downgraded_and_the_hint_kept(monkeypatch):
    p, optimum = load("j3018_7")
    hint = list_schedule_project(p)
    assert hint.makespan > optimum

    def claims(status, bound):
        # a solver that returns no schedule of its own but claims `status` with `bound`
        return lambda mm, deadline, seed, threads, warm: (status, float(bound), False)

    monkeypatch.setattr(pyomo_backend, "_solve_appsi_highs", claims(Status.OPTIMAL, optimum))
    sol = solve_milp(p, hint=hint)
    assert sol.status is Status.FEASIBLE
    assert sol.starts == hint.starts and sol.makespan == hint.makespan and sol.lower_bound == optimum
    monkeypatch.setattr(pyomo_backend, "_solve_appsi_highs", claims(Status.TIME_LIMIT, optimum - 3))
    sol = solve_milp(p, hint=hint)
    assert sol.status is Status.TIME_LIMIT and sol.makespan == hint.makespan
    assert sol.lower_bound == max(p.lower_bound(), optimum - 3)
    assert check_project_schedule(p, sol) == []


def test_without_a_hint_the_list_schedule_bounds_the_horizon():
    p, optimum = load("j2031_3")
    sol = solve_milp(p, time_limit=30, threads=1)
    assert sol.status is Status.OPTIMAL and sol.makespan == optimum
    assert check_project_schedule(p, sol) == []


def test_a_model_too_large_is_not_built_and_the_list_schedule_returned(monkeypatch):
    # issue 33: a long horizon made the time-indexed model grow to 15 GB; its size is now
    # estimated first and a model above MAX_MODEL_SIZE is not built
    from rpeg.formulations import milp

    p, _ = load("j2031_3")
    H = int(list_schedule_project(p).makespan)
    mm = MILPModel(p, H)
    assert len(mm.model.x) + len(mm.model.cum) < milp.model_size(p, H) < milp.MAX_MODEL_SIZE
    monkeypatch.setattr(milp, "MAX_MODEL_SIZE", 1000)
    sol = solve_milp(p, time_limit=30, threads=1)
    assert sol.status is Status.FEASIBLE and sol.makespan == H and check_project_schedule(p, sol) == []
    assert sol.message.startswith(f"time-indexed model not built: over the horizon {H} it would have size")
    assert "above MAX_MODEL_SIZE = 1,000" in sol.message and sol.message.endswith(
        "returned the list schedule"
    )


def test_time_limit_keeps_the_incumbent_and_the_bound():
    p, optimum = load("j3013_2")  # one of the hardest j30 instances
    hint = list_schedule_project(p)
    sol = solve_milp(p, time_limit=2, threads=1, hint=hint)
    assert sol.status is Status.TIME_LIMIT
    assert optimum <= sol.makespan <= hint.makespan
    assert p.lower_bound() <= sol.lower_bound <= optimum
    assert check_project_schedule(p, sol) == []
    assert sol.runtime < 4


def test_any_pyomo_solver_name_goes_through_the_legacy_interface():
    # "appsi_highs" is not one of the named solvers: it runs through pyomo.environ.SolverFactory
    p, optimum = load("j2031_3")
    sol = solve_milp(p, solver="appsi_highs", time_limit=30, threads=1)
    assert sol.status is Status.OPTIMAL and sol.makespan == optimum
    assert sol.solver == "milp/appsi_highs"


# ----------------------------------------------------------------------------- solvers
@pytest.mark.parametrize(
    ("name", "installed", "advice"),
    [
        ("cbc", lambda: shutil.which("cbc") is not None, "apt-get install coinor-cbc"),
        ("scip", lambda: MILP_SOLVERS["scip"]().available(), "pip install pyscipopt"),
        ("gurobi", lambda: MILP_SOLVERS["gurobi"]().available(), "pip install gurobipy"),
        ("glpk", lambda: shutil.which("glpsol") is not None, "glpk-utils"),
    ],
)
def test_a_missing_solver_says_what_to_install(name, installed, advice):
    if installed():
        pytest.skip(f"{name} is installed here")
    p = Project.single_mode([1], [[1]], [1])
    with pytest.raises(
        SolverUnavailableError, match=rf"MILP solver '{name}' is not available; to use it, .*"
    ) as e:
        solve_milp(p, solver=name)
    assert advice in str(e.value)


def test_an_unknown_solver_lists_the_known_ones():
    p = Project.single_mode([1], [[1]], [1])
    with pytest.raises(
        ValueError, match=r"unknown MILP solver 'nosuchsolver': known names are cbc, cplex, .*highs"
    ):
        solve_milp(p, solver="nosuchsolver")


# ------------------------------------------------------------------------------- tiny
def test_unary_lags_modes_and_budgets():
    # the CP-SAT test's project: 0 -(lag 3)-> 1, activity 1 fast only on the busy device: 10
    p = Project(
        (
            Activity((Mode(2, (0,)),)),
            Activity((Mode(4, (0,)), Mode(1, (1,)))),
            Activity((Mode(10, (1,)),)),
        ),
        (Resource(1, unary=True),),
        ((0, 1, 3),),
    )
    sol = solve_milp(p)
    assert sol.status is Status.OPTIMAL and sol.makespan == 10
    assert check_project_schedule(p, sol) == []
    fast_or_cheap = Activity((Mode(1, (1, 5)), Mode(3, (1, 1))))
    q = Project((fast_or_cheap, fast_or_cheap), (Resource(1, unary=True), Resource(6, renewable=False)))
    sol = solve_milp(q)
    assert sol.makespan == 4 and sorted(sol.modes) == [0, 1]


@pytest.mark.parametrize(
    "project",
    [
        Project((Activity((Mode(1, (3,)),)),), (Resource(2),)),  # demand above capacity
        # the list scheduler gives up on the budget, so HiGHS must prove it over the trivial horizon
        Project((Activity((Mode(1, (2,)),)), Activity((Mode(1, (2,)),))), (Resource(3, renewable=False),)),
    ],
    ids=["no-fitting-mode", "budget"],
)
def test_infeasible(project):
    sol = solve_milp(project)
    assert sol.status is Status.INFEASIBLE
    assert sol.makespan == math.inf and sol.lower_bound == math.inf
    assert check_project_schedule(project, sol) == []


@st.composite
def projects(draw) -> Project:
    n = draw(st.integers(1, 5))
    K = draw(st.integers(1, 2))
    res = [Resource(draw(st.integers(1, 3)), renewable=k == 0 or draw(st.booleans())) for k in range(K)]
    acts = [
        Activity(
            tuple(
                Mode(draw(st.integers(0, 4)), tuple(draw(st.integers(0, 3)) for _ in range(K)))
                for _ in range(draw(st.integers(1, 2)))
            )
        )
        for _ in range(n)
    ]
    precs = [
        (i, j, draw(st.integers(-1, 2))) for j in range(n) for i in range(j) if draw(st.integers(0, 2)) == 0
    ]
    return Project(tuple(acts), tuple(res), tuple(precs))


@settings(max_examples=20, deadline=None)
@given(projects())
def test_milp_and_cpsat_agree_on_random_small_projects(p):
    cp = solve_cpsat(p, threads=1)
    mi = solve_milp(p, threads=1)
    assert cp.status in (Status.OPTIMAL, Status.INFEASIBLE)
    assert mi.status is cp.status
    assert mi.makespan == cp.makespan
    assert check_project_schedule(p, mi) == [] and check_project_schedule(p, cp) == []
    if cp.status is Status.OPTIMAL:
        assert p.lower_bound() <= cp.makespan


def test_zero_duration_project_is_optimal_at_zero():
    # found by hypothesis: HiGHS answers "unknown" on this degenerate model
    from rpeg.formulations import Activity, Mode, Project, Resource, Status, solve_milp

    p = Project(
        activities=(Activity(modes=(Mode(duration=0, demands=(0,)),)),), resources=(Resource(capacity=1),)
    )
    sol = solve_milp(p, threads=1)
    assert sol.status is Status.OPTIMAL and sol.makespan == 0


def test_highs_thread_counts_after_the_first_run_do_not_fail_later_runs():
    """HiGHS keeps one thread pool per process; a run asking for another size used to come back
    "unknown" (seen on a fresh clone, where a single zero-duration activity was the first MILP of
    a different size). Every size must still solve."""
    p = Project(
        activities=(Activity(modes=(Mode(duration=0, demands=(0,)),)),),
        resources=(Resource(capacity=1),),
        precedences=(),
    )
    q = Project(
        activities=(
            Activity(modes=(Mode(duration=2, demands=(1,)),)),
            Activity(modes=(Mode(duration=3, demands=(1,)),)),
        ),
        resources=(Resource(capacity=1),),
        precedences=(),
    )
    for threads in (None, 1, 2, None, 1):
        a, b = solve_milp(p, threads=threads), solve_milp(q, threads=threads)
        assert (a.status, a.makespan) == (Status.OPTIMAL, 0), threads
        assert (b.status, b.makespan) == (Status.OPTIMAL, 5), threads

"""Tests for ``formulations/project_schedule.py``: the project list scheduler and its checker.

Hand-worked tiny projects pin down the EST rule, each tie-break, lags, mode choice and the
non-renewable repair; hand-broken schedules show the checker catches each kind of violation; a
property test and every PSPLIB instance show the scheduler's schedules always pass the checker
and never beat the published optimum.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpeg.formulations import (
    Activity,
    Mode,
    Project,
    ProjectSolution,
    Resource,
    Status,
    read_mm,
    read_optima,
    read_sm,
)
from rpeg.formulations.project import MAX_VALUE
from rpeg.formulations.project_schedule import check_project_schedule, choose_modes, list_schedule_project

PSPLIB = Path(__file__).resolve().parents[1] / "data" / "psplib"


def single(durations, demands, caps, precs=(), unary=()) -> Project:
    return Project.single_mode(durations, demands, caps, precs, unary=unary)


# --------------------------------------------------------------------------------- EST rule
def test_earliest_start_then_rank_with_a_cumulative_resource():
    # capacity 2; A0 (2, r1) → A3 (2, r1); A1 (3, r1); A2 (1, r2). Ranks 4, 3, 1, 2.
    # t=0: A0 (rank 4) then A1 (EST 0, usage 2); A2 needs 2 units, free only from t=3; A3 is ready
    # at 2 with EST 2 < 3, so it goes first; that pushes A2 to 4 (A3 holds a unit until 4).
    p = single([2, 3, 1, 2], [[1], [1], [2], [1]], [2], [(0, 3)])
    s = list_schedule_project(p)
    assert s.starts == (0, 0, 4, 2)
    assert s.makespan == 5 and s.status is Status.FEASIBLE and s.solver == "list"
    assert check_project_schedule(p, s) == []


def test_ties_go_to_the_larger_rank_then_the_lower_index():
    # one device; A0 (1) has rank 1, A1 (1) → A2 (5) has rank 6: A1 first, then A2 (rank 5)
    # beats A0 (rank 1) at EST 1
    p = single([1, 1, 5], [[1], [1], [1]], [1], [(1, 2)], unary=[0])
    assert p.resources[0].unary
    assert list_schedule_project(p).starts == (6, 0, 1)
    # identical activities: index order
    q = single([2, 2, 2], [[1], [1], [1]], [1])
    assert list_schedule_project(q).starts == (0, 2, 4)


def test_gaps_are_filled_when_a_later_activity_fits():
    # capacity 2: A0 (4, r1) and A1 (1, r2) after A2 (1, r1). A2 and A0 start at 0; A1 needs both
    # units, so it waits for A0 (t=4); A3 (1, r1), free of predecessors, fills the gap at t=1.
    p = single([4, 1, 1, 1], [[1], [2], [1], [1]], [2], [(2, 1)])
    s = list_schedule_project(p)
    assert s.starts == (0, 4, 0, 1)
    assert check_project_schedule(p, s) == []


def test_lags_delay_or_advance_the_successor():
    p = single([2, 1], [[0], [0]], [1], [(0, 1, 3)])
    assert list_schedule_project(p).starts == (0, 5)
    p = single([4, 1], [[0], [0]], [1], [(0, 1, -2)])
    s = list_schedule_project(p)
    assert s.starts == (0, 2) and s.makespan == 4
    assert check_project_schedule(p, s) == []


# ------------------------------------------------------------------------------------ modes
def test_shortest_mode_that_fits():
    fits = Activity((Mode(5, (1,)), Mode(2, (3,))))  # the 2-unit mode exceeds capacity 2
    short = Activity((Mode(3, (1,)), Mode(2, (2,))))
    p = Project((fits, short), (Resource(2),))
    assert choose_modes(p) == [0, 1]
    s = list_schedule_project(p)
    assert s.modes == (0, 1) and s.starts == (0, 5)  # A1 holds both units: after A0
    assert check_project_schedule(p, s) == []


def test_nonrenewable_repair_and_giving_up():
    fast_or_cheap = Activity((Mode(1, (0, 5)), Mode(3, (0, 1))))
    p = Project((fast_or_cheap, fast_or_cheap), (Resource(1), Resource(6, renewable=False)))
    # both fast: 10 > 6; switching either one gives 6; the tie goes to the lower index
    assert choose_modes(p) == [1, 0]
    s = list_schedule_project(p)
    assert check_project_schedule(p, s) == [] and s.makespan == 3
    tight = Project((fast_or_cheap, fast_or_cheap), (Resource(1), Resource(1, renewable=False)))
    s = list_schedule_project(tight)
    assert s.status is Status.UNKNOWN and s.makespan == math.inf and not s.has_schedule
    assert check_project_schedule(tight, s) == []


def test_no_fitting_mode_gives_unknown():
    p = Project((Activity((Mode(1, (3,)),)),), (Resource(2),))
    assert choose_modes(p) is None
    assert list_schedule_project(p).status is Status.UNKNOWN


# ---------------------------------------------------------------------------------- checker
def _sol(starts, modes, makespan, lb=0.0, status=Status.FEASIBLE) -> ProjectSolution:
    return ProjectSolution(status, float(makespan), float(lb), 0.0, tuple(starts), tuple(modes), "hand")


def test_checker_catches_each_violation():
    p = Project(
        (
            Activity((Mode(2, (1, 2)),)),
            Activity((Mode(2, (1, 2)), Mode(1, (1, 5)))),
        ),
        (Resource(1), Resource(4, renewable=False)),
        ((0, 1, 1),),
    )
    assert check_project_schedule(p, _sol([0, 3], [0, 0], 5)) == []
    (e,) = check_project_schedule(p, _sol([0, 2], [0, 0], 4))
    assert "precedence (0, 1, lag 1): start 2 < finish 2 + 1" in e
    errs = check_project_schedule(p, _sol([0, 3], [0, 1], 4))
    assert errs == ["resource 1 (): total demand 7 > budget 4"]
    q = single([2, 2], [[1], [1]], [1])
    assert check_project_schedule(q, _sol([0, 1], [0, 0], 3)) == ["resource 0 (): load 2 > capacity 1 at t=1"]
    assert check_project_schedule(q, _sol([0, 2], [0, 0], 5)) == ["makespan 5.0 ≠ max finish 4"]
    assert check_project_schedule(q, _sol([0, 2], [0, 0], 4, lb=5)) == ["lower bound 5.0 > makespan 4.0"]
    assert "mode 1 is not one of its 1 modes" in check_project_schedule(q, _sol([0, 2], [0, 1], 4))[0]
    assert "start -1 is not a non-negative integer" in check_project_schedule(q, _sol([-1, 2], [0, 0], 4))[0]
    assert check_project_schedule(q, _sol([0], [0], 2)) == ["1 starts and 1 modes for 2 activities"]
    bad = ProjectSolution(Status.OPTIMAL, math.inf, 0.0, 0.0, (), (), "hand")
    assert check_project_schedule(q, bad) == ["status optimal without a schedule"]


def test_long_horizons_cost_no_memory_or_time_per_period():
    # issue 33: the usage profile was an array over the horizon (a MemoryError for a duration of
    # 1e9) and the checker looped over every period; both now work on start and end events
    big = MAX_VALUE
    p = single([big, big, big, 1], [[1], [1], [1], [1]], [2], [(0, 3, 0)])
    s = list_schedule_project(p)
    assert list(s.starts) == [0, 0, big, big] and s.makespan == 2 * big
    assert check_project_schedule(p, s) == []
    late = _sol([0, 0, big - 1, big], [0, 0, 0, 0], 2 * big - 1)
    assert check_project_schedule(p, late)[0] == f"resource 0 (): load 3 > capacity 2 at t={big - 1}"


def test_a_fixed_mode_over_a_capacity_is_refused():
    p = Project((Activity((Mode(1, (1,)), Mode(1, (3,)))),), (Resource(2),))
    with pytest.raises(
        ValueError, match=r"modes\[0\] = 1: activity 0 demands more than a resource's capacity"
    ):
        list_schedule_project(p, [1])


# ----------------------------------------------------------------------------- properties
@st.composite
def projects(draw) -> Project:
    n = draw(st.integers(1, 7))
    K = draw(st.integers(1, 2))
    caps = [draw(st.integers(1, 4)) for _ in range(K)]
    renewable = [True] + [draw(st.booleans()) for _ in range(K - 1)]
    acts = []
    for _ in range(n):
        modes = [
            Mode(draw(st.integers(0, 5)), tuple(draw(st.integers(0, 3)) for _ in range(K)))
            for _ in range(draw(st.integers(1, 3)))
        ]
        acts.append(Activity(tuple(modes)))
    precs = [
        (i, j, draw(st.integers(-2, 2))) for j in range(n) for i in range(j) if draw(st.integers(0, 3)) == 0
    ]
    res = [Resource(c, renewable=r) for c, r in zip(caps, renewable)]
    return Project(tuple(acts), tuple(res), tuple(precs))


@settings(max_examples=150, deadline=None)
@given(projects())
def test_list_schedules_always_pass_the_checker(p):
    s = list_schedule_project(p)
    assert check_project_schedule(p, s) == []
    if s.has_schedule:
        assert p.lower_bound() <= s.makespan <= p.trivial_horizon()
    else:
        assert s.status is Status.UNKNOWN


# ---------------------------------------------------------------------------------- PSPLIB
@pytest.mark.parametrize(
    ("folder", "pattern", "reader", "opt_file"),
    [("j30.sm", "*.sm", read_sm, "optimum.csv"), ("j20.mm", "j20*_*.mm", read_mm, "j20opt.mm")],
)
def test_every_shipped_psplib_instance_gets_a_valid_schedule_no_better_than_optimal(
    folder, pattern, reader, opt_file
):
    optima = read_optima(PSPLIB / folder / opt_file)
    unknown = []
    for f in sorted((PSPLIB / folder).glob(pattern)):
        p = reader(f)
        s = list_schedule_project(p)
        assert check_project_schedule(p, s) == [], p.name
        if s.has_schedule:
            assert s.makespan >= optima[p.name], p.name
        else:
            unknown.append(p.name)
    # single-mode instances have no non-renewable budgets: the heuristic never gives up on them;
    # on j20.mm the greedy repair fails on 3 instances of 554, all three shipped in tests/data
    # (benchmarks/psplib.py sweeps the whole library)
    assert sorted(unknown) == ([] if folder == "j30.sm" else ["j203_2", "j203_5", "j206_3"])

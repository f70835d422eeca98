"""Tests for ``formulations/project.py``: the project data validate themselves once (the error names
the field and the value), and the bounds and time windows match hand-worked figures."""

from __future__ import annotations

import math

import pytest

from rpeg.formulations import Activity, Mode, Project, Resource


def test_validation_names_field_and_value():
    with pytest.raises(ValueError, match=r"Mode duration must be a non-negative integer, got -1"):
        Mode(-1, (0,))
    with pytest.raises(ValueError, match=r"Mode demands\[1\] must be a non-negative integer, got 2\.5"):
        Mode(1, (0, 2.5))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Activity modes must not be empty"):
        Activity(())
    with pytest.raises(ValueError, match=r"Resource capacity must be a non-negative integer, got -3"):
        Resource(-3)
    with pytest.raises(ValueError, match=r"unary=True needs capacity 1, got capacity=2"):
        Resource(2, unary=True)
    with pytest.raises(ValueError, match=r"unary=True needs renewable=True"):
        Resource(1, renewable=False, unary=True)
    a = Activity((Mode(2, (1,)),))
    with pytest.raises(
        ValueError,
        match=r"activities\[0\]\.modes\[0\]\.demands has 1 entries, expected one per resource \(2\)",
    ):
        Project((a,), (Resource(1), Resource(1)))
    with pytest.raises(ValueError, match=r"precedences\[0\] = \(0, 2, 0\) names an activity outside 0\.\.1"):
        Project((a, a), (Resource(1),), ((0, 2, 0),))
    with pytest.raises(ValueError, match=r"links activity 1 to itself"):
        Project((a, a), (Resource(1),), ((1, 1, 0),))
    with pytest.raises(ValueError, match=r"precedences contain a cycle \(through activity 0\)"):
        Project((a, a), (Resource(1),), ((0, 1, 0), (1, 0, 0)))
    with pytest.raises(ValueError, match=r"demands\[0\] = 2 on unary resource 0"):
        Project((Activity((Mode(1, (2,)),)),), (Resource(1, unary=True),))


def test_figures_are_bounded_and_cycles_are_listed():
    from rpeg.formulations.project import MAX_VALUE, find_cycle

    with pytest.raises(
        ValueError, match=r"Mode duration must be at most 1,000,000,000,000 \(MAX_VALUE\), got 10{13}"
    ):
        Mode(10**13, (0,))
    with pytest.raises(ValueError, match=r"Mode demands\[0\] must be at most 1,000,000,000,000"):
        Mode(1, (MAX_VALUE + 1,))
    with pytest.raises(ValueError, match=r"Resource capacity must be at most 1,000,000,000,000"):
        Resource(10**300)
    a = Activity((Mode(MAX_VALUE, (MAX_VALUE,)),))
    Project((a, a), (Resource(MAX_VALUE),), ((0, 1, -MAX_VALUE),))  # the limit itself is fine
    with pytest.raises(ValueError, match=r"precedences\[0\] = \(0, 1, -10{13}\): the lag must be at most"):
        Project((a, a), (Resource(1),), ((0, 1, -(10**13)),))
    assert find_cycle(4, [(0, 1), (1, 2), (2, 3)]) is None
    assert find_cycle(4, [(0, 1), (3, 1), (2, 3), (1, 2)]) == [3, 2, 1]  # 1 → 2 → 3 → 1
    assert find_cycle(2, [(1, 1)]) == [0]
    with pytest.raises(
        ValueError, match=r"cycle \(through activity 1\): 1 → 2 → 3 → 1 \(entries 3, 2, 1 of precedences\)"
    ):
        Project((a,) * 4, (Resource(MAX_VALUE),), ((0, 1, 0), (3, 1, 0), (2, 3, 0), (1, 2, 0)))


def test_bounds_and_windows_by_hand():
    # 0 -(lag 2)-> 1 -> 2, activity 3 alone; durations 3, (4 or 1), 2, 5 on one resource of 2
    p = Project(
        (
            Activity((Mode(3, (1,)),)),
            Activity((Mode(4, (1,)), Mode(1, (2,)))),
            Activity((Mode(2, (1,)),)),
            Activity((Mode(5, (2,)),)),
        ),
        (Resource(2),),
        ((0, 1, 2), (1, 2)),  # a pair is read as lag 0
    )
    assert p.precedences == ((0, 1, 2), (1, 2, 0))
    assert p.min_durations == (3, 1, 2, 5)
    assert p.earliest_starts == (0, 5, 6, 0)
    assert p.tails == (5, 2, 0, 0)
    assert p.critical_path_bound() == 8  # 3 + 2 + 1 + 2
    assert p.energy_bound() == math.ceil((3 + 2 + 2 + 10) / 2)  # mode 1 of activity 1: 1·2 < 4·1
    assert p.lower_bound() == 9
    assert p.trivial_horizon() == 3 + 4 + 2 + 2 + 5
    assert p.latest_start(1, 0, 20) == 20 - 4 - 2
    assert p.makespan((0, 5, 9, 0), (0, 0, 0, 0)) == 11

"""Tests for ``formulations/status.py``: the status vocabulary, and a solution that recomputes its
makespan from the project data."""

from __future__ import annotations

import math
import re

from rpeg.formulations import Project, ProjectSolution, Status


def test_solution_recomputes_its_makespan():
    p = Project.single_mode([2, 3], [[1], [1]], [1], [(0, 1)])
    s = ProjectSolution.from_schedule(
        p, [0.0, 2.0000001], [0, 0], status=Status.FEASIBLE, lower_bound=5, runtime=0.1, solver="x"
    )
    assert s.starts == (0, 2) and s.makespan == 5.0 and s.objective == 5.0 and s.gap == 0.0
    opt = ProjectSolution.from_schedule(
        p, [0, 2], [0, 0], status=Status.OPTIMAL, lower_bound=1, runtime=0.1, solver="x"
    )
    assert opt.lower_bound == 5.0 and opt.is_optimal
    none = ProjectSolution.without_schedule(Status.INFEASIBLE, lower_bound=3, runtime=0.0, solver="x")
    assert none.makespan == math.inf and none.lower_bound == math.inf and not none.has_schedule
    assert str(Status.TIME_LIMIT) == "time_limit" and Status("optimal") is Status.OPTIMAL
    assert re.fullmatch(r"[a-z_]+", Status.ERROR.value)


def test_the_gap_and_replace_keep_the_schedule():
    p = Project.single_mode([2, 3], [[1], [1]], [1], [(0, 1)])
    s = ProjectSolution.from_schedule(
        p, [0, 3], [0, 0], status=Status.TIME_LIMIT, lower_bound=4, runtime=0.1, solver="x"
    )
    assert s.makespan == 6 and s.lower_bound == 4 and s.gap == (6 - 4) / 6
    t = s.replace(status=Status.FEASIBLE, message="m")
    assert (t.starts, t.makespan, t.status, t.message) == (s.starts, s.makespan, Status.FEASIBLE, "m")
    none = ProjectSolution.without_schedule(Status.UNKNOWN, lower_bound=3, runtime=0.0, solver="x")
    assert none.gap == math.inf and none.lower_bound == 3

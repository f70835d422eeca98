"""Tests for ``formulations/dp_exact.py``: the planner's choice as a CP-SAT model, on hand-worked
instances with known optima (the DP-against-CP-SAT cross-checks on real costs are in
``tests/heuristics/test_dp_planner.py``)."""

from __future__ import annotations

import types

import pytest

from rpeg.formulations.dp_exact import solve_dp_cpsat
from rpeg.formulations.status import Status
from rpeg.heuristics.dp_planner import DPInstance, FrontierPoint


def point(latency: int, gpus: int, persistent: int = 1, transient: int = 1) -> FrontierPoint:
    return FrontierPoint(None, latency, gpus, persistent, transient)


def instance(budget: int, m_eff: int = 100) -> DPInstance:
    """Two model-stages in one stage, each fast on 4 GPUs (6 µs) or slow on 2 (10 µs).

    Side by side on ``N = 4``: both on 2 GPUs, ``L = max(10, 10) = 10``; in one lane they share
    an allocation and add up: ``6 + 6 = 12`` on 4 GPUs. The optimum is 10.
    """
    fronts = [types.SimpleNamespace(points=[point(10, 2), point(6, 4)], stage=None) for _ in range(2)]
    return DPInstance(None, [[0, 1]], fronts, budget, m_eff)


def test_the_known_optimum_is_proven():
    sol = solve_dp_cpsat(instance(4), time_limit=10)
    assert sol.status is Status.OPTIMAL
    assert sol.objective == 10 and sol.selection.picks == (0, 0)
    assert sol.bound == pytest.approx(10)


def test_a_hint_does_not_change_the_answer():
    first = solve_dp_cpsat(instance(4), time_limit=10)
    again = solve_dp_cpsat(instance(4), time_limit=10, hint=first.selection)
    assert (again.status, again.objective) == (Status.OPTIMAL, 10)


def test_no_selection_within_the_budget_is_proven_infeasible():
    sol = solve_dp_cpsat(instance(1), time_limit=10)
    assert sol.status is Status.INFEASIBLE
    assert sol.selection is None and sol.objective is None and sol.bound == float("inf")


def test_no_selection_within_memory_is_proven_infeasible():
    sol = solve_dp_cpsat(instance(4, m_eff=1))
    assert sol.status is Status.INFEASIBLE


@pytest.mark.parametrize(("kw", "match"), [({"time_limit": 0}, "time_limit"), ({"threads": 0}, "threads")])
def test_bad_options_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        solve_dp_cpsat(instance(4), **kw)

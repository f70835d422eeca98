"""Tests for ``solvers/exact.py``: when the exact methods may call a plan optimal."""

from __future__ import annotations

import pytest

pytest.importorskip("ortools")

from rpeg.formulations.plan_cpsat import solve_plan_cpsat
from rpeg.formulations.plan_model import PlanSolution
from rpeg.formulations.status import Status as EngineStatus
from rpeg.ir.templates import structures
from rpeg.solvers import Status
from rpeg.solvers.exact import solve_exact
from rpeg.solvers.solve import Problem
from tests.formulations.test_plan_model import tiny


def _run(bound: float):
    """``solve_exact`` where the first structure is solved by CP-SAT and every later one stops at
    its limit with no plan and the lower bound ``bound`` (a makespan in seconds)."""
    w, cluster = tiny()
    calls: list[int] = []

    def engine(inst, **kw):
        calls.append(1)
        if len(calls) == 1:
            return solve_plan_cpsat(inst, **kw)
        return PlanSolution.without_plan(EngineStatus.TIME_LIMIT, 0.0, "cpsat", lower_bound=bound)

    r = solve_exact(Problem(w, cluster, k_eval=1, time_limit=60), "cpsat", engine, candidates=2)
    return r, structures(w)


def test_a_structure_whose_bound_reaches_the_best_makespan_is_settled():
    r, ys = _run(1e9)
    assert len(ys) > 1
    assert r.status is Status.OPTIMAL
    solved = [o["structure"] for o in r.extra["structures"] if o["status"] == "optimal"]
    assert len(solved) == 1
    # the outcomes come in the structures' order, whatever order they were solved in
    assert [o["structure"] for o in r.extra["structures"]] == [y.label for y in ys]
    assert r.extra["settled_by_bound"] == [y.label for y in ys if y.label not in solved]
    best = r.extra["model_makespan"]
    # a bound just below the best makespan settles nothing: the limit stopped the search
    r, _ = _run(best * (1 - 1e-6))
    assert r.status is Status.TIME_LIMIT and "settled_by_bound" not in r.extra
    r, _ = _run(best)
    assert r.status is Status.OPTIMAL


@pytest.mark.parametrize("method", ["cpsat", pytest.param("milp", marks=pytest.mark.slow)])
def test_structures_are_cut_off_by_the_best_makespan_found_before(method):
    from rpeg import Cluster, Workload, hardware_preset, model_preset, solve

    # ppo-1x1x4-K2-Q3 of benchmarks/exact_vs_heuristic.py: the actor-critic-sharing structures
    # have the best concurrent plans, are solved first and cut the others off
    m7 = model_preset("7b")
    w = Workload("ppo", {"actor": m7, "critic": m7, "reward": m7}, 256, 1, 128, 256)
    cluster = Cluster.from_shape("1x1x4", hardware_preset("gh200"))
    r = solve(w, cluster, method=method, candidates=2, k_eval=2, time_limit=60)
    assert r.status is Status.OPTIMAL
    outcomes = r.extra["structures"]
    assert {o["status"] for o in outcomes} <= {"optimal", "cut off"}
    cut = [o for o in outcomes if o["status"] == "cut off"]
    assert cut and any(o["structure"].startswith("ppo ac=0") for o in cut)
    for o in cut:  # no plan of a cut-off structure beats the result
        assert o["lower_bound"] >= r.extra["model_makespan"] * (1 - 1e-3)

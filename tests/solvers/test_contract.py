"""The contract every planning method keeps, checked once for all of :data:`rpeg.METHODS`.

Each registered method solves two small bundled problems with a short budget: ``ppo-1b-4gpu``
(a plan exists) and a 70B PPO job on one 8×A100-40GB node (no plan fits). Its result must

* pass the independent checker (``tests/tools/check_result.py``) as an ``rpeg.result/1`` file;
* survive the JSON round trip exactly: ``to_json → from_json → to_json`` gives the same text;
* have a status consistent with its plan: a plan (memory-feasible) ⇔ ``optimal``, ``feasible``
  or ``time_limit``; without one, ``infeasible``, ``time_limit``, ``unknown`` or ``error`` and a
  message saying why.

A method registered later is covered by the same tests; give it a short budget in ``BUDGETS``.
"""

from __future__ import annotations

import json
from functools import cache

import pytest

from rpeg import METHODS, Cluster, Result, hardware_preset, solve
from rpeg.ir import Structure
from rpeg.solvers.result import PLAN_STATUSES, Status
from tests.conftest import example_problem, load_checker, ppo_70b_workload

cr = load_checker()

#: Short budgets per method (the exact ones on the synchronous structure, one candidate each).
BUDGETS: dict[str, dict] = {
    "greedy": {},
    "concurrent": {},
    "sa": {"max_evaluations": 60},
    "dp": {},
    "cpsat": {"candidates": 1, "time_limit": 5.0},
    "milp": {"candidates": 1, "time_limit": 5.0},
}
#: A method without an entry in BUDGETS gets this.
DEFAULT_BUDGET = {"time_limit": 2.0}
EXACT = ("cpsat", "milp")
PROBLEMS = ("fits", "does-not-fit")


@cache
def _problem(name: str):
    """Workload, cluster and ``k_eval`` of one of :data:`PROBLEMS`."""
    if name == "fits":
        workload, cluster, _ = example_problem("ppo-1b-4gpu")
        return workload, cluster, 1
    return ppo_70b_workload(), Cluster.from_shape("1x1x8", hardware_preset("a100-40gb")), 1


@cache
def _solved(method: str, problem: str) -> tuple[Result, str]:
    """The result of ``method`` on ``problem`` and its ``rpeg.result/1`` text (solved once)."""
    workload, cluster, k_eval = _problem(problem)
    options = dict(BUDGETS.get(method, DEFAULT_BUDGET))
    if method in EXACT:
        options["structure"] = Structure.synchronous(workload)
    result = solve(workload, cluster, method, k_eval=k_eval, seed=0, **options)
    return result, result.to_json()


CASES = [pytest.param(m, p, id=f"{m}-{p}") for m in sorted(METHODS) for p in PROBLEMS]


@pytest.mark.parametrize(("method", "problem"), CASES)
def test_the_independent_checker_accepts_the_file(method, problem):
    _, text = _solved(method, problem)
    assert cr.check(json.loads(text)) == []


@pytest.mark.parametrize(("method", "problem"), CASES)
def test_the_json_round_trip_is_exact(method, problem):
    result, text = _solved(method, problem)
    back = Result.from_json(text)
    assert back.to_json() == text
    assert (back.status, back.plan, back.throughput) == (result.status, result.plan, result.throughput)


@pytest.mark.parametrize(("method", "problem"), CASES)
def test_the_status_agrees_with_the_plan(method, problem):
    result, _ = _solved(method, problem)
    assert result.method == method
    if result.plan is not None:
        assert result.status in PLAN_STATUSES, result.status
        assert result.feasible, "a method returns only memory-feasible plans"
    else:
        assert result.status in (Status.INFEASIBLE, Status.TIME_LIMIT, Status.UNKNOWN, Status.ERROR)
        assert result.status not in PLAN_STATUSES
        assert result.message.strip(), "a result without a plan says why"
        assert result.evaluation is None and result.throughput == 0.0


def test_the_two_problems_are_one_of_each():
    """The cases above see both sides of the contract: greedy plans the first, nothing fits the second."""
    assert _solved("greedy", "fits")[0].plan is not None
    assert _solved("greedy", "does-not-fit")[0].plan is None

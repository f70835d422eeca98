"""Tests for ``solvers/sa.py``, the ``sa`` method behind ``solve()``: how a search outcome becomes
a :class:`Result`. (The search itself: ``tests/heuristics/search/test_anneal.py``; the Ray backend:
``tests/heuristics/search/test_distributed.py``.)"""

from __future__ import annotations

import pytest

from rpeg import solve
from rpeg.ir import build_graph
from rpeg.solvers import Status


def test_a_found_plan_reports_the_budget_spent(tiny_ppo, cluster_1x2x4):
    r = solve(tiny_ppo, cluster_1x2x4, "sa", k_eval=2, max_evaluations=40, seed=1)
    assert r.status is Status.FEASIBLE and r.feasible and r.method == "sa"
    n = r.extra["structures_searched"]
    assert r.message.startswith(f"searched {n} structures within a budget of 40 evaluations: ")
    assert f"{r.evaluations} evaluations" in r.message
    assert r.extra["history"] and all(len(h) == len(r.extra["history"][0]) for h in r.extra["history"])
    # the result carries the graph of the structure its plan was found for
    assert r.k_eval == 2 and r.graph.vertices == build_graph(tiny_ppo, r.structure).vertices


def test_no_plan_is_infeasible_with_the_searchs_reason(ppo_70b, a100_1x1x8):
    r = solve(ppo_70b, a100_1x1x8, "sa", k_eval=1, max_evaluations=20)
    assert r.status is Status.INFEASIBLE and r.plan is None and r.evaluation is None
    assert "does not fit" in r.message
    assert r.extra["structures_searched"] >= 1 and "history" in r.extra


@pytest.mark.parametrize(
    ("kw", "pattern"),
    [
        ({"backend": "dask"}, r"unknown backend 'dask'; known backends: 'local', 'ray'"),
        ({"started": 0.0}, r"method 'sa' takes no option\(s\) started; known: "),
        ({"chains": 2}, r"address and chains apply to backend='ray' only"),
    ],
)
def test_options_the_method_refuses(tiny_ppo, cluster_1x2x4, kw, pattern):
    with pytest.raises(ValueError, match=pattern):
        solve(tiny_ppo, cluster_1x2x4, "sa", max_evaluations=10, **kw)

"""Tests for ``solvers/solve.py``: the front door, the method registry, the :class:`Problem` that
checks itself once, and the two baselines. (The :class:`Result` and its file: ``test_result.py``;
what every method's result satisfies: ``test_contract.py``.)"""

from __future__ import annotations

import dataclasses
import math

import pytest

from rpeg import Cluster
from rpeg.ir.workload import MAX_K_EVAL
from rpeg.solvers import METHODS, Problem, Status, register, solve


# ---------------------------------------------------------------------------- front door
def test_unknown_method_lists_the_known_ones(tiny_ppo, cluster_1x2x4):
    with pytest.raises(ValueError, match="'nope'") as info:
        solve(tiny_ppo, cluster_1x2x4, method="nope")
    msg = str(info.value)
    assert "concurrent" in msg and "greedy" in msg


@pytest.mark.parametrize("method", ["greedy", "concurrent"])
def test_unknown_option_is_rejected_by_name(tiny_ppo, cluster_1x2x4, method):
    with pytest.raises(ValueError, match="frobnicate"):
        solve(tiny_ppo, cluster_1x2x4, method=method, frobnicate=3)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"time_limit": 0}, "time_limit"),
        ({"time_limit": -1.0}, "time_limit"),
        ({"k_eval": 0}, "k_eval"),
    ],
)
def test_bad_arguments_are_rejected_by_name(tiny_ppo, cluster_1x2x4, kw, field):
    with pytest.raises(ValueError, match=field):
        solve(tiny_ppo, cluster_1x2x4, **kw)


def test_arguments_of_the_wrong_type_are_a_type_error_naming_them(tiny_ppo, cluster_1x2x4):
    with pytest.raises(TypeError, match=r"k_eval must be a positive integer, got float 2\.5"):
        solve(tiny_ppo, cluster_1x2x4, k_eval=2.5)
    with pytest.raises(TypeError, match=r"workload must be a rpeg\.Workload"):
        solve("ppo", cluster_1x2x4)
    with pytest.raises(TypeError, match=r"cluster must be a rpeg\.Cluster"):
        solve(tiny_ppo, "1x2x4")


# ---------------------------------------------------------------------------- Problem
# (field, value, exception, message): the messages ``solve()`` gives, now from Problem itself
BAD_FIELDS = [
    ("workload", "ppo", TypeError, r"workload must be a rpeg\.Workload, got str 'ppo'"),
    ("cluster", "1x2x4", TypeError, r"cluster must be a rpeg\.Cluster, got str '1x2x4'"),
    ("time_limit", "3", TypeError, r"time_limit .*got str '3'"),
    ("time_limit", math.inf, ValueError, r"time_limit must be a positive finite number of seconds"),
    ("time_limit", 0, ValueError, r"time_limit must be a positive finite"),
    ("seed", 0.5, TypeError, r"seed must be an integer, got float 0\.5"),
    ("seed", True, TypeError, r"seed must be an integer"),
    ("k_eval", 0, ValueError, r"k_eval must be a positive integer, got 0"),
    ("k_eval", 2.5, TypeError, r"k_eval must be a positive integer, got float 2\.5"),
    ("k_eval", MAX_K_EVAL + 1, ValueError, rf"k_eval must be at most {MAX_K_EVAL}, got {MAX_K_EVAL + 1}"),
    (
        "objective",
        "speed",
        ValueError,
        r"objective must be one of 'throughput', 'throughput-util', got 'speed'",
    ),
    ("objective", 3, TypeError, r"objective must be 'throughput' or 'throughput-util'"),
    ("delta", 0, ValueError, r"delta must be in \(0, 1\], got 0"),
    ("delta", 1.5, ValueError, r"delta must be in \(0, 1\], got 1\.5"),
    ("delta", "0.1", TypeError, r"delta must be a number in \(0, 1\]"),
]


@pytest.mark.parametrize(
    ("field", "value", "exc", "pattern"), BAD_FIELDS, ids=[f"{c[0]}={c[1]!r}" for c in BAD_FIELDS]
)
def test_problem_checks_itself_with_the_front_doors_messages(
    tiny_ppo, cluster_1x2x4, field, value, exc, pattern
):
    kw = {"workload": tiny_ppo, "cluster": cluster_1x2x4, field: value}
    with pytest.raises(exc, match=pattern):
        Problem(**kw)
    with pytest.raises(exc, match=pattern):  # the front door says the same (it builds one)
        solve(**kw)


def test_problem_normalises_numbers_and_rechecks_on_replace(tiny_ppo, cluster_1x2x4):
    p = Problem(tiny_ppo, cluster_1x2x4, k_eval=2, delta=1, time_limit=3)
    assert isinstance(p.delta, float) and p.delta == 1.0
    assert isinstance(p.time_limit, float) and p.time_limit == 3.0
    assert Problem(tiny_ppo, cluster_1x2x4).time_limit is None
    with pytest.raises(ValueError, match="k_eval must be a positive integer"):
        dataclasses.replace(p, k_eval=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.seed = 3  # type: ignore[misc]


def test_registered_method_is_called_through_solve(tiny_ppo, cluster_1x2x4):
    seen = {}

    def toy(problem: Problem, **options):
        seen["problem"], seen["options"] = problem, options
        inner = METHODS["greedy"](problem)
        inner.method = "toy"
        return inner

    try:
        assert register("toy")(toy) is toy
        assert METHODS["toy"] is toy
        result = solve(tiny_ppo, cluster_1x2x4, method="toy", seed=7, k_eval=2, time_limit=3.0, flavour="x")
        p = seen["problem"]
        assert (p.workload, p.cluster) == (tiny_ppo, cluster_1x2x4)
        assert (p.seed, p.k_eval, p.time_limit, p.objective) == (7, 2, 3.0, "throughput")
        assert seen["options"] == {"flavour": "x"}
        assert result.method == "toy"
        assert result.k_eval == 2
        assert p.evaluator().k_eval == 2
        with pytest.raises(ValueError, match="already registered"):
            register("toy")(toy)
    finally:
        METHODS.pop("toy", None)
    assert "toy" not in METHODS
    with pytest.raises(ValueError, match="already registered"):
        register("greedy")(toy)


@pytest.mark.parametrize("method", ["greedy", "concurrent"])
def test_baselines_return_feasible_results(tiny_ppo, cluster_1x2x4, method):
    r = solve(tiny_ppo, cluster_1x2x4, method=method, k_eval=4)
    assert r.status is Status.FEASIBLE
    assert r.feasible
    assert r.method == method
    assert r.k_eval == 4
    assert r.evaluations >= 1
    assert r.runtime_s >= 0.0
    # real tokens (SPEC §14.1): tiny_ppo's default quantiles [(0.5, 64), (0.85, 128), (1.0, 256)]
    # give a mean response of 0.5·32 + 0.35·96 + 0.15·192 = 78.4 tokens, not the padded 256
    assert r.throughput == pytest.approx(4 * 64 * (128 + 78.4) / r.makespan, rel=1e-12)
    assert r.objective_bound is None


def test_infeasible_concurrent_result_says_by_how_much(tiny_ppo, cluster_1x2x4):
    # 30 GB GPUs: both trainers fit only on all 8 GPUs, and not together (greedy: 4.2 GiB over)
    # unless one offloads its Adam state to the host (SPEC §14.4), which these engines cannot
    hw = dataclasses.replace(cluster_1x2x4.hardware, gpu_memory_bytes=30e9)
    cluster = Cluster(*cluster_1x2x4.shape, hw, host_offload=False)
    assert solve(tiny_ppo, cluster, method="greedy").status is Status.INFEASIBLE
    r = solve(tiny_ppo, cluster, method="concurrent")
    assert r.status is Status.INFEASIBLE
    assert "GiB" in r.message and "actor_train" in r.message

"""Rule P9: the rollout engine's pipeline limit (``Cluster.generation_max_pp``) is known to every
method, survives the result file and is checked by the independent checker."""

from __future__ import annotations

import dataclasses

import pytest

from rpeg import Workload, hardware_preset, model_preset, solve
from rpeg.ir.cluster import NO_SPLITS, Cluster
from rpeg.ir.plan import check_strategy
from rpeg.ir.types import Role
from rpeg.solvers.result import Result

WL = Workload(
    "ppo",
    {"actor": model_preset("llama2-13b"), "critic": model_preset("7b"), "reward": model_preset("7b")},
    256,
    1,
    128,
    256,
)


def cluster(limit: int | None) -> Cluster:
    # four nodes of four: without the limit the concurrent plan pipelines the 13B generation over
    # two nodes (on two nodes of eight, tp=4 replicas with a paged KV cache are faster); without
    # host offload (SPEC §14.4), which frees the memory an unpipelined generation needs here, and
    # without SPEC §15's splits (context parallelism lets the trainers leave it more room); and
    # without the preset's rollout-engine step (its c_step per pipeline slot makes the unpipelined
    # generation the faster one here, and the test needs an instance that pipelines); and with
    # the vendor's 40 GB rather than the driver's 40,960 MiB, on which the unpipelined
    # generation fits
    hw = dataclasses.replace(hardware_preset("a100-40gb"), rollout_step=None, gpu_memory_bytes=40e9)
    return Cluster.from_shape("1x4x4", hw, generation_max_pp=limit, host_offload=False, **NO_SPLITS)


def generation_pp(result: Result) -> list[int]:
    assert result.plan is not None, result.message
    return [
        c.strategy.pp for v, c in zip(result.graph.vertices, result.plan.choices) if v.role is Role.GENERATION
    ]


def test_without_the_limit_this_instance_pipelines_generation():
    free = solve(WL, cluster(None), "concurrent")
    assert generation_pp(free) == [2]
    # so the limit binds: the same method plans otherwise, and no faster, under it
    bound = solve(WL, cluster(1), "concurrent")
    assert generation_pp(bound) == [1] and bound.throughput < free.throughput


@pytest.mark.parametrize(
    "method, kw",
    [
        ("greedy", {}),
        ("concurrent", {}),
        ("dp", {}),
        ("sa", {"max_evaluations": 300, "seed": 0}),
        ("cpsat", {"candidates": 2, "k_eval": 2, "time_limit": 10}),
    ],
)
def test_every_method_plans_generation_within_the_limit(method, kw):
    result = solve(WL, cluster(1), method, **kw)
    assert generation_pp(result) == [1]
    again = Result.from_json(result.to_json())
    assert again.cluster.generation_max_pp == 1 and generation_pp(again) == [1]


def test_the_rule_names_itself_and_the_limit():
    c = cluster(1)
    why = check_strategy(c, model_preset("llama2-13b"), Role.GENERATION, 256, (1, 1, 4), 1, 2, 2, 8)
    assert why is not None and why.startswith("P9: pp=2 exceeds the rollout engine's generation_max_pp=1")
    assert check_strategy(c, model_preset("llama2-13b"), Role.TRAINING, 256, (1, 1, 4), 1, 2, 2, 8) is None
    with pytest.raises(ValueError, match="generation_max_pp must be a positive integer or None, got 0"):
        cluster(0)

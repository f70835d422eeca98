"""The precision setting in the scorer (issue 31): an FP8 workload scores the same on the compiled
evaluator and the Python reference, faster than BF16 on H100, and is refused on an A100 cluster."""

import random
from dataclasses import replace

import pytest

from rpeg import Cluster, Workload, hardware_preset, model_preset
from rpeg.ir import Plan
from rpeg.scoring import fast
from rpeg.scoring.candidates import build_directories
from rpeg.scoring.evaluator import Evaluator


def _grpo(precision: str) -> Workload:
    actor = replace(model_preset("llama3.1-8b"), precision=precision)
    reward = replace(model_preset("qwen2.5-7b"), precision=precision)
    return Workload("grpo", {"actor": actor, "reward": reward}, 32, 4, 256, 512)


def _random_plans(ev: Evaluator, count: int, seed: str) -> list[Plan]:
    rng = random.Random(seed)
    dirs = build_directories(ev.costs)
    plans = []
    for _ in range(count):
        choices = []
        for d in dirs:
            options = d.choices(ev.cluster, rng.randrange(len(d)))
            choices.append(options[rng.randrange(len(options))])
        plans.append(Plan(tuple(choices)))
    return plans


def test_fp8_compiled_equals_reference():
    assert fast.warm_up(wait=True)
    cluster = Cluster.from_shape("1x2x4", hardware_preset("h100"))
    w = _grpo("fp8")
    ref = Evaluator(w, cluster, k_eval=4, backend="python")
    compiled = Evaluator(w, cluster, k_eval=4, backend="compiled")
    for plan in _random_plans(ref, 40, "fp8"):
        a, b = ref.evaluate(plan), compiled.evaluate(plan)
        assert a.makespan == b.makespan
        assert a.throughput == b.throughput
        assert a.feasible == b.feasible


def test_fp8_plans_run_faster_than_bf16_on_h100():
    cluster = Cluster.from_shape("1x2x4", hardware_preset("h100"))
    ev16 = Evaluator(_grpo("bf16"), cluster, k_eval=4, backend="python")
    ev8 = Evaluator(_grpo("fp8"), cluster, k_eval=4, backend="python")
    for plan in _random_plans(ev16, 10, "speed"):
        assert ev8.evaluate(plan).makespan < ev16.evaluate(plan).makespan


def test_fp8_is_refused_on_an_a100_cluster():
    cluster = Cluster.from_shape("1x1x8", hardware_preset("a100-80gb"))
    with pytest.raises(
        ValueError, match=r"precision 'fp8', but hardware 'a100-80gb' has no FP8 tensor cores"
    ):
        Evaluator(_grpo("fp8"), cluster)
    Evaluator(_grpo("bf16"), cluster)  # BF16 is fine

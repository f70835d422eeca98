"""The shared fixtures of the expert-parallelism tests (``etp``, ``ep_overlap``,
``flex_dispatch``): Qwen3-30B-A3B, one and two DGX H100 nodes, and a small mixture-of-experts
GRPO plan with one expert-parallel trainer for round trips, summaries and the runtime's
refusals."""

from __future__ import annotations

import dataclasses

from rpeg import Cluster, Structure, Workload, hardware_preset, model_preset

MOE = model_preset("qwen3-30b-a3b")  # 128 experts, 8 per token, 48 MoE layers, d = 2048, d_e = 768
H100 = hardware_preset("h100")
NODE = Cluster.from_shape("1x1x8", H100)
TWO_NODES = Cluster.from_shape("1x2x8", H100)


def small_moe_plan(extra: dict, cluster: Cluster = NODE):
    """GRPO of a scaled Qwen3-30B-A3B on one node: a TP-1 generation on 8 ranks and a trainer with
    ``ep = 8`` and the plan-entry fields ``extra``."""
    from rpeg.solvers.result import result_for_plan

    small = dataclasses.replace(MOE.scaled(layers=8, hidden=512, heads=8, vocab=4096), kv_heads=4)
    w = Workload("grpo", {"actor": small}, 16, 4, 512, 3584, reward="rule", kl_coef=0.0)
    every = ((0, 0, 0), (1, 1, 8))
    table = {
        "actor_gen": (*every, 8, 1, 1, 1, None, {}),
        "actor_train": (*every, 8, 1, 1, 8, "none", {"ep": 8, **extra}),
    }
    return result_for_plan(w, cluster, Structure("grpo", False, (("actor", 0),)), table)


def bundled_cluster() -> Cluster:
    """The plan space of the bundled engines apart from expert parallelism (ZeRO-2, no sequence
    or context parallelism) on one GH200-preset node."""
    return Cluster.from_shape(
        "1x1x8", hardware_preset("gh200"), max_zero_stage=2, sequence_parallel=False, context_parallel=False
    )

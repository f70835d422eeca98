"""Hand-written plans shared by the runtime tests."""

from __future__ import annotations

from rpeg.costmodel import hardware_preset
from rpeg.ir import Cluster, ModelSpec, Structure, Workload
from rpeg.ir.cluster import NO_SPLITS
from rpeg.solvers.result import Result, result_for_plan

TOY = ModelSpec("toy-1b", 16, 2048, 5504, 32000, 16, 16)

# Disaggregated plan on 1x1x4: TP=2 generation, PP=2 training (1F1B, 2 microbatches) on the same
# two devices (RESHARD), reference and reward/critic inference on the other two (phase-split
# generation → COMM), critic training DP=2 publishing to a one-device critic inference (weight COMM).
DISAGG = {
    "actor_gen": ((0, 0, 0), (1, 1, 2), 1, 1, 2, 1),
    "ref_inf": ((0, 0, 2), (1, 1, 1), 1, 1, 1, 1),
    "reward_inf": ((0, 0, 3), (1, 1, 1), 1, 1, 1, 1),
    "critic_inf": ((0, 0, 3), (1, 1, 1), 1, 1, 1, 1),
    "actor_train": ((0, 0, 0), (1, 1, 2), 1, 2, 1, 2),
    "critic_train": ((0, 0, 2), (1, 1, 2), 2, 1, 1, 1),
}
# Another layout of the same synchronous job: everything differs but the model and the data.
COLOCATED = {
    "actor_gen": ((0, 0, 0), (1, 1, 4), 4, 1, 1, 1),
    "ref_inf": ((0, 0, 0), (1, 1, 4), 2, 1, 2, 2),
    "reward_inf": ((0, 0, 0), (1, 1, 2), 1, 2, 1, 2),
    "critic_inf": ((0, 0, 2), (1, 1, 2), 2, 1, 1, 1),
    "actor_train": ((0, 0, 0), (1, 1, 4), 2, 1, 2, 2),
    "critic_train": ((0, 0, 0), (1, 1, 4), 1, 2, 2, 2),
}


# Every vertex of DISAGG re-laid out on ten workers (COLOCATED needs twenty): generation TP 2 →
# DP 2 (Split), reference and critic inference moved (Extend, Destroy), reward inference onto two
# devices, actor training PP 2 → TP 2 and critic training DP 2 → TP 2 (Merge) — all four kinds.
RELAID = {
    "actor_gen": ((0, 0, 0), (1, 1, 2), 2, 1, 1, 1),
    "ref_inf": ((0, 0, 0), (1, 1, 1), 1, 1, 1, 1),
    "reward_inf": ((0, 0, 2), (1, 1, 2), 2, 1, 1, 1),
    "critic_inf": ((0, 0, 2), (1, 1, 1), 1, 1, 1, 1),
    "actor_train": ((0, 0, 0), (1, 1, 2), 1, 1, 2, 2),
    "critic_train": ((0, 0, 2), (1, 1, 2), 1, 1, 2, 1),
}


#: GRPO on two devices: the trainer data-parallel (each device holds the whole model), the
#: generation tensor-parallel over the same two devices — the hybrid-engine layout, whose weights
#: move in place (tests/runtime/test_handover.py, benchmarks/weight_handover.py).
DP_TRAINER = {
    "actor_gen": ((0, 0, 0), (1, 1, 2), 1, 1, 2, 1),
    "ref_inf": ((0, 0, 0), (1, 1, 2), 2, 1, 1, 1),
    "reward_inf": ((0, 0, 0), (1, 1, 2), 2, 1, 1, 1),
    "actor_train": ((0, 0, 0), (1, 1, 2), 2, 1, 1, 1),
}


#: Prompts per step of the runs that check learning or compare two runs' weights: with 8
#: sequences a step's mean reward is too noisy to show learning within two updates.
BATCH = 32


def workload(algorithm: str = "ppo") -> Workload:
    models = {"actor": TOY, "reward": TOY} | ({"critic": TOY} if algorithm == "ppo" else {})
    return Workload(algorithm, models, 64, 1 if algorithm == "ppo" else 4, 256, 256)


def hand(wl: Workload, shape: str, table: dict, staleness: tuple) -> Result:
    """A result for a hand-written plan ``vertex → (origin, extent, dp, pp, tp, mb)``."""
    cluster = Cluster.from_shape(shape, hardware_preset("gh200"), max_zero_stage=2, **NO_SPLITS)
    return result_for_plan(wl, cluster, Structure(wl.algorithm, False, staleness), table)


# the example: generation TP 1 → 2, critic training DP 2 → 4 (everything else stays)
BEFORE = DISAGG | {
    "actor_gen": ((0, 0, 0), (1, 1, 2), 2, 1, 1, 1),
    "critic_train": ((0, 0, 2), (1, 1, 2), 2, 1, 1, 1),
}
AFTER = DISAGG | {
    "actor_gen": ((0, 0, 0), (1, 1, 2), 1, 1, 2, 1),
    "critic_train": ((0, 0, 0), (1, 1, 4), 4, 1, 1, 1),
}


# A small PPO plan on 1x1x2 with every mechanism and few workers (7): TP-2 generation and DP-2
# training of the actor on the same devices (RESHARDs), reference inference on device 0 and
# reward and critic (inference and training sharing one worker) on device 1 (COMMs).
SMALL = {
    "actor_gen": ((0, 0, 0), (1, 1, 2), 1, 1, 2, 1),
    "actor_train": ((0, 0, 0), (1, 1, 2), 2, 1, 1, 1),
    "ref_inf": ((0, 0, 0), (1, 1, 1), 1, 1, 1, 1),
    "reward_inf": ((0, 0, 1), (1, 1, 1), 1, 1, 1, 1),
    "critic_inf": ((0, 0, 1), (1, 1, 1), 1, 1, 1, 1),
    "critic_train": ((0, 0, 1), (1, 1, 1), 1, 1, 1, 1),
}
# GRPO on one device: three workers (the actor's generation and training share one).
ONE_DEVICE = {
    v: ((0, 0, 0), (1, 1, 1), 1, 1, 1, 1) for v in ("actor_gen", "ref_inf", "reward_inf", "actor_train")
}

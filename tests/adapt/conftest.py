"""Fixtures of the adaptation tests: a PPO 7B job on 32 H100 and its plan cache."""

from __future__ import annotations

import pytest

from rpeg import Cluster, Workload, hardware_preset, model_preset
from rpeg.adapt import PlanCache

INF = float("inf")


@pytest.fixture(scope="session")
def job() -> tuple[Workload, Cluster]:
    m = model_preset("llama2-7b")
    w = Workload("ppo", {"actor": m, "critic": m, "reward": m}, 128, 1, 256, 1024, name="ppo-7b")
    return w, Cluster.from_shape("1x4x8", hardware_preset("h100"))


@pytest.fixture(scope="session")
def cache(job) -> PlanCache:
    """Transition memory check off (the EMU layer's ZeRO-0 accounting; docs/adaptation.md)."""
    return PlanCache(*job, transition_capacity=INF)

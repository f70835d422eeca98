"""WorkerPool: a cleanly finished run's worker processes serve the next run — and compute what
fresh processes compute; a failed run's workers are not kept."""

from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from rpeg.runtime.controller import RunError  # noqa: E402
from rpeg.runtime.pool import WorkerPool, active_pool  # noqa: E402
from rpeg.runtime.runner import run  # noqa: E402
from tests.runtime.plans import ONE_DEVICE, SMALL, hand, workload  # noqa: E402

PPO_SYNC = (("actor", 0), ("critic", 0))

# the same job as SMALL on 1x1x2 in another layout: everything on device 0 but the reward
OTHER = {
    "actor_gen": ((0, 0, 0), (1, 1, 1), 1, 1, 1, 1),
    "actor_train": ((0, 0, 0), (1, 1, 2), 1, 1, 2, 1),
    "ref_inf": ((0, 0, 1), (1, 1, 1), 1, 1, 1, 1),
    "reward_inf": ((0, 0, 1), (1, 1, 1), 1, 1, 1, 1),
    "critic_inf": ((0, 0, 0), (1, 1, 1), 1, 1, 1, 1),
    "critic_train": ((0, 0, 0), (1, 1, 2), 2, 1, 1, 1),
}


@pytest.fixture(scope="module", autouse=True)
def ray_instance(ray_session):
    """The session's local Ray instance (tests/runtime/conftest.py)."""


def pids(report) -> set[int]:
    return {r["pid"] for g in report.trace.groups.values() for r in g["ranks"]}


def per_device(report) -> Counter:
    """Workers of the run on each device."""
    return Counter(g["devices"][r["rank"]] for g in report.trace.groups.values() for r in g["ranks"])


def test_pooled_processes_compute_what_fresh_ones_do():
    small = hand(workload("ppo"), "1x1x2", SMALL, PPO_SYNC)
    other = hand(workload("ppo"), "1x1x2", OTHER, PPO_SYNC)
    with WorkerPool(max_idle=0) as fresh_pool:  # keeps nothing: every run starts new processes
        fresh = run(small, steps=2, seed=3, return_weights=True)
        assert fresh_pool.idle == 0 and fresh_pool.reused == 0
    with WorkerPool() as pool:
        assert active_pool() is pool
        first = run(other, steps=2, seed=5)
        assert pool.idle == len(pids(first)) == 8
        again = run(small, steps=2, seed=3, return_weights=True)
        # on each device, as many workers of the second run as the first left there took one
        have, want = per_device(first), per_device(again)
        reusable = sum(min(have[d], want[d]) for d in want)
        assert reusable >= 6 and pool.reused == reusable == len(pids(again) & pids(first))
    assert pool.idle == 0  # leaving the block killed them
    assert again.problems == [] and again.rewards == fresh.rewards
    for model, weights in fresh.weights.items():
        for name, w in weights.items():
            assert torch.equal(w, again.weights[model][name]), (model, name)


def test_a_failed_run_keeps_no_workers():
    from rpeg.runtime.binding import bind
    from rpeg.runtime.trace import expected_graph

    one = hand(workload("grpo"), "1x1x1", ONE_DEVICE, (("actor", 0),))
    b = bind(one, expected_graph(one, 2), 2)
    worker = f"g{next(g.gid for g in b.groups if 'actor_train' in g.vertices)}/r0"
    with WorkerPool() as pool:
        with pytest.raises(RunError, match="injected fault"):
            run(one, steps=2, fail_at=(worker, "actor_train", 0))
        assert pool.idle == 0
        report = run(one, steps=1)  # new processes on the same devices
        assert report.problems == [] and pool.reused == 0 and pool.idle == 3


def test_pool_needs_ray_or_devices():
    if ray.is_initialized():
        # inside the session's instance the pool joins it
        with WorkerPool() as pool:
            assert pool.connected()
    with pytest.raises(ValueError, match="max_idle"):
        WorkerPool(max_idle=-1)
    with pytest.raises(ValueError, match="devices"):
        WorkerPool(devices=0)

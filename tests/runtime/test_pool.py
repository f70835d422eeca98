"""WorkerPool: a cleanly finished run's worker processes (one per device) serve the next run — and
compute what fresh processes compute; a failed run's processes are not kept."""

from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from rpeg.runtime.driver.controller import RunError  # noqa: E402
from rpeg.runtime.driver.pool import WorkerPool, active_pool  # noqa: E402
from rpeg.runtime.driver.runner import run  # noqa: E402
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
    """``small`` on new processes, then ``other`` on those of them its devices can take, then
    ``small`` again on processes that served ``other``: the same rewards and weights."""
    small = hand(workload("ppo"), "1x1x2", SMALL, PPO_SYNC)
    other = hand(workload("ppo"), "1x1x2", OTHER, PPO_SYNC)
    with WorkerPool() as pool:  # a pool of its own: no idle processes yet
        assert active_pool() is pool
        fresh = run(small, steps=2, seed=3, return_weights=True)
        # seven workers, one process per device holding them
        assert sum(per_device(fresh).values()) == 7 and len(per_device(fresh)) == 2
        assert pool.reused == 0 and pool.idle == len(pids(fresh)) == 2
        first = run(other, steps=2, seed=5)  # another layout of the job on each device's process
        assert pids(first) == pids(fresh) and pool.reused == 2
        again = run(small, steps=2, seed=3, return_weights=True)  # on processes that served ``other``
        assert pids(again) == pids(fresh) and pool.reused == 4
    assert pool.idle == 0  # leaving the block killed them
    assert again.problems == [] and again.rewards == fresh.rewards
    for model, weights in fresh.weights.items():
        for name, w in weights.items():
            assert torch.equal(w, again.weights[model][name]), (model, name)


def test_a_failed_run_keeps_no_workers_and_kept_ones_serve_every_node_shape():
    """A failed run's workers are killed. On a one-node instance the pool's devices are one
    placement group, so the processes of a 2-device run then serve a 1-device run and a run on
    two 1-device nodes (kept sets used to be filed by node shape: each started new processes)."""
    from rpeg.runtime.binding import bind
    from rpeg.runtime.trace.records import expected_graph

    grpo, sync = workload("grpo"), (("actor", 0),)
    one = hand(grpo, "1x1x1", ONE_DEVICE, sync)
    b = bind(one, expected_graph(one, 2), 2)
    worker = f"g{next(g.gid for g in b.groups if 'actor_train' in g.vertices)}/r0"
    with WorkerPool() as pool:
        with pytest.raises(RunError, match="injected fault"):
            run(one, steps=2, fail_at=(worker, "actor_train", 0))
        assert pool.idle == 0
        first = run(hand(grpo, "1x1x2", ONE_DEVICE, sync), steps=1)  # a new process (one device used)
        assert first.problems == [] and pool.reused == 0 and pool.idle == len(pids(first)) == 1
        again = run(one, steps=1)
        assert pids(again) == pids(first) and pool.reused == 1
        nodes = run(hand(grpo, "1x2x1", ONE_DEVICE, sync), steps=1)
        assert pids(nodes) == pids(first) and pool.reused == 2
    assert again.problems == nodes.problems == []


def test_pool_needs_ray_or_devices():
    if ray.is_initialized():
        # inside the session's instance the pool joins it
        with WorkerPool() as pool:
            assert pool.connected()
    with pytest.raises(ValueError, match="max_idle"):
        WorkerPool(max_idle=-1)
    with pytest.raises(ValueError, match="devices"):
        WorkerPool(devices=0)

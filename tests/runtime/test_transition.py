"""Transitions executed with real state (SPEC §10): a run that changes plan mid-way ends with the
same weights as the run that never changed, up to float reduction order.

Measured on this machine: TP 1→2 generation and DP 2→4 critic training after 2 of 3 steps,
max |Δw| 6e-8 (actor) and 4e-7 (critic); every vertex re-laid-out (DISAGG → COLOCATED, 21
primitives of all four kinds) 1.0e-6 / 1.7e-6. Dropping the Adam moments and counter at the
transition instead gives 3.6e-2 / 3.4e-2, so the tolerance below separates the two by 100×.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from rpeg.ir import Workload  # noqa: E402
from rpeg.runtime.runner import run  # noqa: E402
from tests.runtime.plans import COLOCATED, DISAGG, hand, workload  # noqa: E402

TOL = 1e-4  # max |Δw|: float reduction order (TP splits, DP sums); a lost optimizer state gives ~3e-2
SYNC = (("actor", 0), ("critic", 0))

# the example: generation TP 1 → 2, critic training DP 2 → 4 (everything else stays)
BEFORE = DISAGG | {
    "actor_gen": ((0, 0, 0), (1, 1, 2), 2, 1, 1, 1),
    "critic_train": ((0, 0, 2), (1, 1, 2), 2, 1, 1, 1),
}
AFTER = DISAGG | {
    "actor_gen": ((0, 0, 0), (1, 1, 2), 1, 1, 2, 1),
    "critic_train": ((0, 0, 0), (1, 1, 4), 4, 1, 1, 1),
}


@pytest.fixture(scope="module", autouse=True)
def ray_instance():
    ray.init(num_cpus=2, resources={"rpeg_device": 4}, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def max_diff(a: dict, b: dict) -> dict[str, float]:
    assert a.keys() == b.keys()
    return {m: max((a[m][k] - b[m][k]).abs().max().item() for k in a[m]) for m in a}


@pytest.mark.parametrize(
    "before, after, at, kinds",
    [
        (BEFORE, AFTER, 2, {"merge", "extend"}),
        (DISAGG, COLOCATED, 1, {"split", "merge", "extend", "destroy"}),
    ],
    ids=["gen-tp1to2-critic-dp2to4", "every-vertex-relayout"],
)
def test_transition_mid_run_keeps_the_weights(before, after, at, kinds):
    wl = workload("ppo")
    current, target = hand(wl, "1x1x4", before, SYNC), hand(wl, "1x1x4", after, SYNC)
    moved = run(current, steps=3, return_weights=True, transitions=[(at, target)])
    stayed = run(current, steps=3, return_weights=True)
    assert moved.problems == [] and stayed.problems == []
    assert len(moved.segments) == 2 and moved.segments[1].meta["step_offset"] == at
    assert moved.rewards == stayed.rewards  # same prompts, same sampling draws, same policy
    diff = max_diff(moved.weights, stayed.weights)
    assert all(d < TOL for d in diff.values()), diff
    (rec,) = moved.transitions
    assert rec.step == at and {p["kind"] for p in rec.primitives} == kinds
    assert all(p["bytes"] > 0 for p in rec.primitives if p["kind"] in ("extend", "split"))
    assert rec.total_s > 0 and rec.predicted_s > 0


def test_transition_inputs_are_checked():
    wl = workload("ppo")
    current = hand(wl, "1x1x4", DISAGG, SYNC)
    with pytest.raises(ValueError, match=r"step 3 must be an integer in 1\.\.2"):
        run(current, steps=3, transitions=[(3, current)])
    with pytest.raises(ValueError, match="must be a Result"):
        run(current, steps=3, transitions=[(1, "plan.json")])
    other = Workload("ppo", dict(wl.models), 32, 1, 256, 256)
    with pytest.raises(ValueError, match="batch 32 differs"):
        run(current, steps=3, transitions=[(1, hand(other, "1x1x4", DISAGG, SYNC))])
    with pytest.raises(ValueError, match="checkpoint"):
        run(current, steps=3, transitions=[(1, current)], checkpoint_dir="/tmp/x")

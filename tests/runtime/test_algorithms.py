"""ReMax and DPO through ``rpeg.run`` (local Ray, CPU workers, tiny models): traces that verify,
metrics that rise, the single-process reference loop of ``runtime/worker/rl.py`` reproduced, and two
layouts of each job ending with the same weights.

ReMax's metric is the task reward of the sampled rollouts; DPO's is the mean implicit reward
margin ``β·(h_w − h_l)`` of the step's preference pairs, which is exactly 0 at step 0 (the actor
starts as the reference), while its loss starts at ``log 2``. The responses are full length (one
response-length phase), as the reference loop generates them; phase-split greedy inputs are
checked on one worker in this process (no Ray).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from rpeg import solve  # noqa: E402
from rpeg.costmodel import hardware_preset  # noqa: E402
from rpeg.ir import Cluster, Workload  # noqa: E402
from rpeg.ir.cluster import NO_SPLITS  # noqa: E402
from rpeg.runtime.binding import bind  # noqa: E402
from rpeg.runtime.config import RLConfig  # noqa: E402
from rpeg.runtime.driver.runner import run  # noqa: E402
from rpeg.runtime.trace.records import expected_graph  # noqa: E402
from rpeg.runtime.trace.verify import verify  # noqa: E402
from rpeg.runtime.worker.rl import train_reference  # noqa: E402  # noqa: E402
from tests.runtime.plans import TOY, hand  # noqa: E402
from tests.runtime.workers import local_worker, node  # noqa: E402

WEIGHT_TOL = 1e-3  # as tests/runtime/test_run.py: float reduction order between layouts only
STEPS = 4
REMAX_RL = RLConfig(lr=2e-2)  # measured (reference loop, this seed): 0.293 → 0.438, 0.684; at 1e-2 → 0.371
REMAX = Workload("remax", {"actor": TOY, "reward": TOY}, 64, 4, 256, 256, quantiles=((1.0, 256),))
DPO = Workload("dpo", {"actor": TOY}, 64, 2, 256, 256)
ONE = ((0, 0, 0), (1, 1, 1), 1, 1, 1, 1)  # one device, no parallelism


@pytest.fixture(scope="module", autouse=True)
def ray_instance(ray_session):
    """The session's local Ray instance (tests/runtime/conftest.py)."""


def cluster(shape: str) -> Cluster:
    return Cluster.from_shape(shape, hardware_preset("gh200"), max_zero_stage=2, **NO_SPLITS)


def reference(result, *, batch: int, config: RLConfig | None = None) -> list[float]:
    """``train_reference`` from the weights the run's actor starts with: its group's seed and
    scaled spec (scaling a ``tiny`` spec again keeps its shape; weights depend on the seed and
    the parameter names only)."""
    wl = result.workload
    b = bind(result, expected_graph(result, 1), 1, batch=batch)
    group = next(g for g in b.groups if g.model == "actor")
    return train_reference(
        wl.algorithm,
        STEPS,
        seed=0,
        batch=batch,
        rollouts=b.shape.rollouts,
        spec=group.spec,
        actor_seed=group.seed,
        config=config,
    )


def max_diff(a: dict, b: dict) -> dict[str, float]:
    assert a.keys() == b.keys()
    return {m: max((a[m][k] - b[m][k]).abs().max().item() for k in a[m]) for m in a}


# ---------------------------------------------------------------------------------------------- ReMax
@pytest.fixture(scope="module")
def remax():
    """The greedy ReMax plan on one device (actor, reference and reward groups), 4 steps,
    8 prompts × 4 rollouts."""
    result = solve(REMAX, cluster("1x1x1"), "greedy")
    return result, run(result, steps=STEPS, batch=8, rl=REMAX_RL, return_weights=True)


def test_remax_runs_verifies_and_learns_like_the_reference(remax):
    result, report = remax
    assert report.problems == [] and verify(report.trace, result) == []
    greedy = [r for r in report.trace.records if r.vertex == "actor_greedy_gen" and r.kind == "op"]
    assert sorted(r.step for r in greedy) == list(range(STEPS))
    rewards = report.rewards
    assert sum(rewards[-2:]) / 2 > rewards[0] + 0.1, rewards
    assert rewards == pytest.approx(reference(result, batch=8, config=REMAX_RL), abs=1e-6)


def test_remax_two_layouts_same_weights(remax):
    """Against a two-device plan where every vertex has another layout: sampling and greedy
    decoding TP-2 over both devices (one group; the greedy rollouts reach the reward model on
    device 0 through a COMM), DP-2 training (RESHARDs to and from the generation), the reference
    on device 1. Measured max |Δw| 1.8e-5 after 4 steps."""
    _, a = remax
    table = {
        "actor_gen": ((0, 0, 0), (1, 1, 2), 1, 1, 2, 1),
        "actor_greedy_gen": ((0, 0, 0), (1, 1, 2), 1, 1, 2, 1),
        "ref_inf": ((0, 0, 1), (1, 1, 1), 1, 1, 1, 1),
        "reward_inf": ((0, 0, 0), (1, 1, 1), 1, 1, 1, 2),
        "actor_train": ((0, 0, 0), (1, 1, 2), 2, 1, 1, 1),
    }
    other = hand(REMAX, "1x1x2", table, (("actor", 0),))
    b = run(other, steps=STEPS, batch=8, rl=REMAX_RL, return_weights=True)
    assert b.problems == [] and verify(b.trace, other) == []
    assert {r.kind for r in b.trace.records} == {"op", "comm", "reshard"}
    assert a.rewards == pytest.approx(b.rewards, abs=1e-6)
    diff = max_diff(a.weights, b.weights)
    assert all(d < WEIGHT_TOL for d in diff.values()), diff


def test_remax_reward_inference_takes_phase_split_greedy_inputs():
    """A phase node of the reward inference may get one generation's phase and the other's whole
    step: it scores the sequences present in both, each against its own greedy rollout."""
    vertices = ("actor_gen", "actor_greedy_gen", "ref_inf", "reward_inf", "actor_train")
    result = hand(REMAX, "1x1x1", {v: ONE for v in vertices}, (("actor", 0),))
    b = bind(result, expected_graph(result, 1), 1, batch=2, prompt_len=4, response_len=4)
    n, R = b.shape.sequences, b.shape.rollouts
    with local_worker(b, "actor_gen") as w:
        sampled = w.op(node(b, "actor_gen"), {})[1]
        greedy = w.op(node(b, "actor_greedy_gen", greedy=True), {})[1]
        target = w.task.target
    # greedy decoding draws no noise: the R rollouts of a prompt share one greedy completion
    per_prompt = greedy["tokens"].reshape(n // R, R, -1)
    assert torch.equal(per_prompt, per_prompt[:, :1].expand_as(per_prompt))
    assert not torch.equal(sampled["tokens"], greedy["tokens"])
    half = {k: v[: n // 2] for k, v in sampled.items()}  # as if phase 1 of the sampled generation
    with local_worker(b, "reward_inf") as w:
        w.inbox[("reward_inf", 0, "actor_gen", 1)] = [half]
        w.inbox[("reward_inf", 0, "actor_greedy_gen", 1)] = [greedy]  # the whole step
        meta, out, _ = w.op(
            node(b, "reward_inf", phase=1, prefix={"actor_greedy_gen": "greedy_"}),
            {"actor_gen": [], "actor_greedy_gen": []},
        )
    assert torch.equal(out["ids"], half["ids"]) and meta["sequences"] == n  # n/2 sampled + n/2 greedy
    assert meta["reward_count"] == n // 2  # the step's reward counts the sampled rollouts only
    torch.testing.assert_close(out["baseline"], target[greedy["tokens"][: n // 2, 4:]].float().mean(dim=1))
    torch.testing.assert_close(out["rewards"], target[half["tokens"][:, 4:]].float().mean(dim=1))
    assert out["rm_baseline"].shape == (n // 2,)


# ---------------------------------------------------------------------------------------------- DPO
@pytest.fixture(scope="module")
def dpo():
    """The greedy DPO plan on one device (reference and actor groups), 4 steps, 18 pairs."""
    result = solve(DPO, cluster("1x1x1"), "greedy")
    return result, run(result, steps=STEPS, batch=18, return_weights=True)


def test_dpo_runs_verifies_and_learns_like_the_reference(dpo):
    """Measured: margins 0 → 0.044, 0.040, 0.216; losses 0.693 → 0.672, 0.676, 0.593."""
    result, report = dpo
    assert report.problems == [] and verify(report.trace, result) == []
    margins = report.rewards
    assert margins[0] == pytest.approx(0.0, abs=1e-6)  # the actor starts as the reference
    assert all(m > 0 for m in margins[1:]) and sum(margins[-2:]) / 2 > 0.05, margins
    losses = [m["losses"]["actor"] for m in report.trace.step_metrics]
    assert losses[0] == pytest.approx(math.log(2), abs=1e-5)
    assert all(loss < math.log(2) for loss in losses[1:]) and losses[-1] < losses[0] - 0.05, losses
    assert margins == pytest.approx(reference(result, batch=18), abs=1e-5)


def test_dpo_two_layouts_same_weights(dpo):
    """Against a four-device plan: the reference's inference on device 0 (its log-probs reach the
    training through a COMM), the actor's inference and training DP-2 × PP-2 over all four —
    FSDP2 under the 1F1B schedule, 2 microbatches of 9 sequences per DP rank (pairs straddle
    microbatches). Measured max |Δw| 8.3e-5 after 4 steps."""
    _, a = dpo
    table = {
        "ref_inf": ((0, 0, 0), (1, 1, 1), 1, 1, 1, 1),
        "actor_inf": ((0, 0, 0), (1, 1, 4), 2, 2, 1, 2),
        "actor_train": ((0, 0, 0), (1, 1, 4), 2, 2, 1, 2),
    }
    other = hand(DPO, "1x1x4", table, (("actor", 0),))
    b = run(other, steps=STEPS, batch=18, return_weights=True)
    assert b.problems == [] and verify(b.trace, other) == []
    assert {r.kind for r in b.trace.records} == {"op", "comm"}
    assert a.rewards == pytest.approx(b.rewards, abs=1e-5)
    diff = max_diff(a.weights, b.weights)
    assert all(d < WEIGHT_TOL for d in diff.values()), diff


def test_pipelined_training_needs_equal_microbatches():
    """1F1B sizes its buffers from the first microbatch: 32 sequences in 3 microbatches
    (11, 11, 10) are refused before anything starts, naming the vertex."""
    table = {
        "ref_inf": ONE,
        "actor_inf": ONE,
        "actor_train": ((0, 0, 0), (1, 1, 2), 1, 2, 1, 3),
    }
    result = hand(DPO, "1x1x2", table, (("actor", 0),))
    with pytest.raises(ValueError, match=r"'actor_train': pp=2 .* 32 sequences over dp=1 give 32 .* mb=3"):
        bind(result, expected_graph(result, 1), 1, batch=16)
    assert bind(result, expected_graph(result, 1), 1, batch=18).shape.sequences == 36

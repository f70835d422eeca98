"""``runtime/worker/ops.py``: one worker's generation, inference and training nodes on a
one-device GRPO plan, in this process (no Ray): shapes, masks, the task reward and one update."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rpeg.ir.cluster import NO_SPLITS  # noqa: E402
from rpeg.runtime.binding import bind  # noqa: E402
from rpeg.runtime.trace.records import expected_graph  # noqa: E402
from tests.runtime.plans import ONE_DEVICE, hand, workload  # noqa: E402
from tests.runtime.workers import local_worker, node  # noqa: E402


@pytest.fixture(scope="module")
def binding():
    result = hand(workload("grpo"), "1x1x1", ONE_DEVICE, (("actor", 0),))
    return bind(result, expected_graph(result, 1), 1, batch=2, prompt_len=4, response_len=4)


def test_generation_inference_and_training_of_one_step(binding):
    sh = binding.shape
    n = sh.sequences
    with local_worker(binding, "actor_gen") as w:
        meta, out, pub = w.op(node(binding, "actor_gen"), {})
        assert pub is None and meta["sequences"] == n and meta["worker_time"] >= 0
        assert meta["version_used"] == 0
        assert out["tokens"].shape == (n, sh.prompt_len + sh.response_len)
        assert torch.equal(out["ids"], torch.arange(n))  # step 0: sample ids 0..n-1
        assert torch.equal(
            out["tokens"][:, : sh.prompt_len], w.task.prompts(0, sh.batch).repeat_interleave(sh.rollouts, 0)
        )
        assert (out["logp"] <= 0).all() and set(out["mask"].unique().tolist()) <= {0.0, 1.0}
        again = w.op(node(binding, "actor_gen"), {})[1]
        assert torch.equal(again["tokens"], out["tokens"])  # noise keyed by seed, step and sample id
    with local_worker(binding, "reward_inf") as w:
        w.inbox[("reward_inf", 0, "actor_gen", 0)] = [out]
        meta, rewards, _ = w.op(node(binding, "reward_inf"), {"actor_gen": []})
        assert (
            rewards["rewards"].shape == (n,) and ((rewards["rewards"] >= 0) & (rewards["rewards"] <= 1)).all()
        )
        assert meta["reward_count"] == n and meta["reward_sum"] == pytest.approx(
            float(rewards["rewards"].sum())
        )
    with local_worker(binding, "ref_inf") as w:
        w.inbox[("ref_inf", 0, "actor_gen", 0)] = [out]
        _, ref, _ = w.op(node(binding, "ref_inf"), {"actor_gen": []})
        assert ref["ref_logp"].shape == (n, sh.response_len)
        assert torch.allclose(ref["ref_logp"], out["logp"], atol=1e-5)  # the same initial weights
    with local_worker(binding, "actor_train") as w:
        before = {k: v.clone() for k, v in w.model.state_dict().items()}
        inputs = {"actor_gen": out, "reward_inf": rewards, "ref_inf": ref}
        for src, part in inputs.items():
            w.inbox[("actor_train", 0, src, 0)] = [part]
        meta, data, _ = w.op(
            node(binding, "actor_train", keep_previous=True, keep=1), {src: [] for src in inputs}
        )
        assert data is None and meta["version"] == 1 and meta["version_used"] == 0
        assert meta["loss"] is not None and torch.isfinite(torch.tensor(meta["loss"]))
        assert w.version == 1 and sorted(w.snapshots) == [0]  # the version before, kept for readers
        assert any(not torch.equal(before[k], v) for k, v in w.model.state_dict().items())
        assert all(torch.equal(before[k], w.snapshots[0][k]) for k in before)


def test_stale_rollouts_train_with_the_decoupled_objective(binding):
    """A training node whose rollouts were sampled by an older version (``rollout_version`` below
    ``version``) trains with the decoupled objective; with ``stale_objective="coupled"``, or when
    the rollouts are the trained version's, it trains exactly as before (and only then reports
    the log-prob gap). The rollouts' log-probs are shifted to stand for an older policy."""
    from dataclasses import replace

    from rpeg.runtime.config import RLConfig

    with local_worker(binding, "actor_gen") as w:
        out = w.op(node(binding, "actor_gen"), {})[1]
    with local_worker(binding, "reward_inf") as w:
        w.inbox[("reward_inf", 0, "actor_gen", 0)] = [out]
        rewards = w.op(node(binding, "reward_inf"), {"actor_gen": []})[1]
    with local_worker(binding, "ref_inf") as w:
        w.inbox[("ref_inf", 0, "actor_gen", 0)] = [out]
        ref = w.op(node(binding, "ref_inf"), {"actor_gen": []})[1]
    older = {**out, "logp": out["logp"] - 0.4 * out["mask"]}  # μ ≠ the trained weights
    inputs = {"actor_gen": older, "reward_inf": rewards, "ref_inf": ref}

    def train(objective: str, rollout_version: int) -> tuple[dict, dict]:
        with local_worker(binding, "actor_train") as w:
            w.cfg = replace(RLConfig(), stale_objective=objective)
            for src, part in inputs.items():
                w.inbox[("actor_train", 0, src, 0)] = [part]
            n = node(binding, "actor_train", tau=1, rollout_version=rollout_version)
            meta = w.op(n, {src: [] for src in inputs})[0]
            return {k: v.detach().clone() for k, v in w.model.named_parameters()}, meta

    fresh, fresh_meta = train("decoupled", 0)
    coupled, coupled_meta = train("coupled", -1)
    decoupled, decoupled_meta = train("decoupled", -1)
    assert all(torch.equal(fresh[k], coupled[k]) for k in fresh)
    assert any(not torch.equal(decoupled[k], coupled[k]) for k in fresh)
    assert fresh_meta["logprob_gap"] == pytest.approx(0.4, abs=1e-4)
    assert "logprob_gap" not in coupled_meta and "logprob_gap" not in decoupled_meta


def test_a_node_of_a_version_the_worker_lacks_is_refused(binding):
    with (
        local_worker(binding, "actor_gen") as w,
        pytest.raises(RuntimeError, match="holds version 0 of actor but actor_gen step 0 needs 3"),
    ):
        w.op(node(binding, "actor_gen", version=3), {})


def test_a_shared_backbone_weights_its_value_loss_by_value_coef():
    """Actor–critic sharing: the shared model's loss is ``L_policy + c_v·L_value``, affine in
    ``c_v`` with the (positive) value loss as its slope."""
    from dataclasses import replace

    from rpeg.costmodel import hardware_preset
    from rpeg.ir import Cluster, Structure
    from rpeg.ir.types import Head
    from rpeg.runtime.config import RLConfig
    from rpeg.solvers.result import result_for_plan

    one = ((0, 0, 0), (1, 1, 1), 1, 1, 1, 1)
    vertices = ("actor_gen", "ref_inf", "reward_inf", "critic_inf", "actor_critic_train")
    result = result_for_plan(
        workload("ppo"),
        Cluster.from_shape("1x1x1", hardware_preset("gh200"), max_zero_stage=2, **NO_SPLITS),
        Structure("ppo", True, (("actor_critic", 0),)),
        dict.fromkeys(vertices, one),
    )
    b = bind(result, expected_graph(result, 1), 1, batch=2, prompt_len=4, response_len=4)
    sh = b.shape
    n, T, V = sh.sequences, sh.prompt_len + sh.response_len, sh.vocab
    gen = torch.Generator().manual_seed(0)
    output = torch.randn(n, T, V + 1, generator=gen)
    target = torch.zeros(n, sh.response_len, 7)  # _TOK, _OLD, _ADV, _MASK, _REF, _RET, _VAL
    target[..., 0] = torch.randint(0, V, (n, sh.response_len), generator=gen).float()
    target[..., 1] = -torch.rand(n, sh.response_len, generator=gen)
    target[..., 2] = torch.randn(n, sh.response_len, generator=gen)
    target[..., 3] = 1.0
    target[..., 5] = torch.randn(n, sh.response_len, generator=gen)
    with local_worker(b, "actor_critic_train") as w:
        assert w.group.head is Head.BOTH
        losses = []
        for c_v in (0.2, 0.6, 1.0):
            w.cfg = replace(RLConfig(), value_coef=c_v)
            losses.append(float(w._loss_fn("ppo", 1.0)(output, target)))
    assert losses[2] - losses[1] == pytest.approx(losses[1] - losses[0], rel=1e-5)
    assert losses[1] - losses[0] > 0

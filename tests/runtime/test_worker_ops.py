"""``runtime/worker_ops.py``: one worker's generation, inference and training nodes on a
one-device GRPO plan, in this process (no Ray): shapes, masks, the task reward and one update."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rpeg.runtime.binding import bind  # noqa: E402
from rpeg.runtime.trace import expected_graph  # noqa: E402
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


def test_a_node_of_a_version_the_worker_lacks_is_refused(binding):
    with (
        local_worker(binding, "actor_gen") as w,
        pytest.raises(RuntimeError, match="holds version 0 of actor but actor_gen step 0 needs 3"),
    ):
        w.op(node(binding, "actor_gen", version=3), {})

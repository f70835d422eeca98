"""``runtime/worker/checkpoints.py``: a worker's checkpoint file round trip and the rollback to
a step boundary, in this process (no Ray)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rpeg.runtime.binding import bind  # noqa: E402
from rpeg.runtime.trace.records import expected_graph  # noqa: E402
from tests.runtime.plans import ONE_DEVICE, hand, workload  # noqa: E402
from tests.runtime.workers import local_worker  # noqa: E402


@pytest.fixture(scope="module")
def binding():
    result = hand(workload("grpo"), "1x1x1", ONE_DEVICE, (("actor", 0),))
    return bind(result, expected_graph(result, 1), 1, batch=2, prompt_len=4, response_len=4)


def fake_update(w) -> None:
    """What a training node does to the state, without data: boundary copy, Adam step, version."""
    for p in w.model.parameters():
        p.grad = torch.ones_like(p)
    w._keep_boundary(None)
    w.optimizer.step()
    w.version += 1


def test_save_and_load_round_trip_and_refuse_another_layout(binding, tmp_path):
    with local_worker(binding, "actor_train") as w:
        fake_update(w)
        path = w.save(str(tmp_path / "g0-r0.pt"))
        saved = {k: v.clone() for k, v in w.model.state_dict().items()}
        assert not list(tmp_path.glob("*.tmp*"))  # written to a temporary name, then renamed
        fake_update(w)
        assert w.load(path) == 1  # the saved version; the loaded weights are version 0 of this run
        assert w.version == 0
        assert all(torch.equal(saved[k], v) for k, v in w.model.state_dict().items())
        state = torch.load(path, weights_only=False)
        state["layout"] = {**state["layout"], "tp": 2}
        torch.save(state, path)
        with pytest.raises(ValueError, match=r"was written by layout .*'tp': 2"):
            w.load(path)


def test_rollback_restores_the_copy_from_before_the_update(binding):
    with local_worker(binding, "actor_train", keep_boundary=True) as w:
        before = {k: v.clone() for k, v in w.model.state_dict().items()}
        w.inbox[("x",)] = []
        fake_update(w)
        assert w.rollback(0) == 0 and w.version == 0 and not w.inbox
        assert all(torch.equal(before[k], v) for k, v in w.model.state_dict().items())
        assert all(p.grad is None for p in w.model.parameters())
        with pytest.raises(RuntimeError, match="holds version 0; the boundary before step 2 needs 2"):
            w.rollback(2)


def test_rollback_without_a_boundary_copy_says_how_to_keep_one(binding):
    with local_worker(binding, "actor_train") as w:
        fake_update(w)
        with pytest.raises(RuntimeError, match="keeps no copy from before it"):
            w.rollback(0)

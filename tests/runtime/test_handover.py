"""Weight versions between colocated roles (SPEC §14.4): handed over in place in the device's
process, or through Ray's object store (:class:`~rpeg.runtime.config.RunConfig`
``weight_handover``).

Each route must install exactly the weights the other does; the trace says which one a transfer
took (``in_place_bytes``).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from rpeg.runtime.driver.runner import run  # noqa: E402
from rpeg.runtime.trace.verify import verify  # noqa: E402
from rpeg.runtime.worker.model import StageModel  # noqa: E402
from rpeg.runtime.worker.parallel import PackedShare, assemble, publication  # noqa: E402
from tests.runtime.plans import DISAGG, DP_TRAINER, hand, workload  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_session")


def _weight_records(report, model: str) -> list:
    return [
        r for r in report.trace.records if r.kind != "op" and model in r.versions_consumed and r.bytes > 1000
    ]


def _same_weights(a, b) -> None:
    for model, weights in a.weights.items():
        for name, w in weights.items():
            torch.testing.assert_close(b.weights[model][name], w, atol=0, rtol=0)


def test_a_data_parallel_trainer_hands_its_weights_over_in_place():
    """``auto``: each device's generation and trainer ranks share a process and the trainer keeps
    the whole model on every rank, so every weight transfer is read in place (``in_place_bytes``
    equals ``bytes``); through the object store (``store``) nothing is — and both runs give the
    same rewards and train the same weights."""
    result = hand(workload("grpo"), "1x1x2", DP_TRAINER, (("actor", 0),))
    reports = {
        mode: run(result, 2, batch=8, weight_handover=mode, return_weights=True) for mode in ("auto", "store")
    }
    for report in reports.values():
        assert report.problems == [] and verify(report.trace, result) == []
    in_place, store = _weight_records(reports["auto"], "actor"), _weight_records(reports["store"], "actor")
    assert len(in_place) == len(store) >= 2
    assert all(r.in_place_bytes == r.bytes > 0 for r in in_place)
    assert all(r.in_place_bytes == 0 for r in store)
    assert reports["auto"].rewards == reports["store"].rewards
    _same_weights(reports["store"], reports["auto"])


def test_a_pipelined_trainer_hands_its_weights_over_through_its_process_group():
    """DISAGG's actor trainer is pipelined over the two devices of its TP-2 generation: in place
    (``in_place``) each device reads its own stage's share in its process and the other stage's
    over the trainer's process group (``in_place_bytes`` is one stage, half of ``bytes``);
    ``auto`` on CPU takes the object store instead (shares would cross processes, which gloo's
    loopback does slower than Ray's shared memory). The critic's copy on another device reads the
    object store either way. Same rewards, same weights."""
    result = hand(workload("ppo"), "1x1x4", DISAGG, (("actor", 0), ("critic", 0)))
    reports = {
        mode: run(result, 2, batch=8, weight_handover=mode, return_weights=True)
        for mode in ("in_place", "auto")
    }
    for report in reports.values():
        assert report.problems == [] and verify(report.trace, result) == []
    actor = _weight_records(reports["in_place"], "actor")
    assert actor and all(0 < r.in_place_bytes < r.bytes for r in actor)
    assert all(abs(r.in_place_bytes - r.bytes / 2) <= 0.01 * r.bytes for r in actor)  # two equal-ish stages
    assert all(r.in_place_bytes == 0 for r in _weight_records(reports["auto"], "actor"))
    for report in reports.values():  # the critic's copy is on another device
        critic = _weight_records(report, "critic")
        assert critic and all(r.in_place_bytes == 0 for r in critic)
    assert reports["in_place"].rewards == reports["auto"].rewards
    _same_weights(reports["auto"], reports["in_place"])


def test_a_packed_share_holds_the_publication():
    """:class:`PackedShare` (one buffer per dtype) gives back the tensors :func:`publication`
    copies, by name, shape and TP dimension; a receiver's empty share from its header has the
    same layout."""
    from rpeg.ir import ModelSpec
    from rpeg.ir.types import Head

    spec = ModelSpec("t", 2, 32, 64, 16, 2, 2)
    model = StageModel(spec, Head.LM, seed=0)
    share = PackedShare.of(model, include_replicated=True)
    pub = publication(model, include_replicated=True)
    got = share.pieces()
    assert list(got) == list(pub)
    for name, (t, dim) in pub.items():
        assert got[name][1] == dim
        torch.testing.assert_close(got[name][0], t, atol=0, rtol=0)
    assert share.nbytes == sum(t.nbytes for t, _ in pub.values())
    empty = PackedShare.receiving(share.header, None)
    assert [b.shape for b in empty.buffers()] == [b.shape for b in share.buffers()]
    wanted = {next(iter(pub))}
    assert set(assemble([(0, share.pieces(wanted))])) == wanted

"""Tests of ``runtime/worker/parallel.py``'s :class:`FSDPAdam`: two gloo ranks of FSDP2 data parallelism
against one process with ``torch.optim.Adam`` on the whole batch.

Checked on every rank: the reduced gradient shard is the chunk of the whole batch's gradient (a
sum, not a mean), the updated parameters and the gathered Adam moments equal the single-process
ones, DP ranks may run different numbers of forwards and microbatches between updates, a
checkpointed optimizer state and a transition's full moments load back exactly, ``zero_grad``
drops a failed step's gradients, and weights written through ``set_masters`` are what the next
gather brings back. The same with full sharding (stage 3): only shards registered between
operations, layers freed after their backward, :meth:`FSDPAdam.gathered` bringing the full
weights for a block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from rpeg.ir.models import model_preset  # noqa: E402
from rpeg.ir.types import Head  # noqa: E402
from rpeg.runtime.binding import scale_spec  # noqa: E402
from rpeg.runtime.worker.model import StageModel  # noqa: E402
from rpeg.runtime.worker.parallel import FSDPAdam, local  # noqa: E402

V, LR, TOL = 16, 1e-3, 1e-5


def loss_of(model: torch.nn.Module, x: torch.Tensor, total: int) -> torch.Tensor:
    """A loss that is a sum over sequences divided by the global count, as the runtime's are."""
    return model(x).float().logsumexp(-1).sum() / total


def reference(spec, batches: list[torch.Tensor]) -> dict:
    """Single-process Adam over the whole batches: gradients of the first step, final weights and
    moments (flat, parameter order)."""
    model = StageModel(spec, Head.LM, seed=3)
    adam = torch.optim.Adam(model.parameters(), lr=LR)
    grads = None
    for x in batches:
        loss_of(model, x, len(x)).backward()
        if grads is None:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        adam.step()
        adam.zero_grad()
    params = list(model.parameters())
    return {
        "grads": grads,
        "weights": {n: p.detach().clone() for n, p in model.named_parameters()},
        "m": torch.cat([adam.state[p]["exp_avg"].reshape(-1) for p in params]),
        "v": torch.cat([adam.state[p]["exp_avg_sq"].reshape(-1) for p in params]),
    }


@contextlib.contextmanager
def _gloo_pair(rank: int, init_file: str) -> Iterator[object]:
    """Rank ``rank`` of a two-rank gloo group in this process; yields its 1-D device mesh."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        yield init_device_mesh("cpu", (2,))
    finally:
        dist.destroy_process_group()


def _rank(rank: int, init_file: str, spec, batches: list[torch.Tensor], ref: dict) -> None:
    from rpeg.runtime.worker.parallel import _dim0_chunk

    with _gloo_pair(rank, init_file) as mesh:
        model = StageModel(spec, Head.LM, seed=3)
        opt = FSDPAdam(model, mesh, dist.group.WORLD, lr=LR)
        assert all(not hasattr(p, "placements") for p in model.parameters())  # full between updates
        with torch.no_grad():  # DP ranks may run different numbers of forwards between updates
            for _ in range(rank + 2):
                model(batches[0][:1])
        for k, x in enumerate(batches):
            mine = torch.tensor_split(x, 2)[rank]
            chunks = [mine[:1], mine[1:]] if rank == 0 else [mine]  # uneven microbatches
            for i, c in enumerate(chunks):
                opt.sync_gradients(i == len(chunks) - 1)
                loss_of(model, c, len(x)).backward()
            if k == 0:
                for name, master in opt.masters.items():
                    want = _dim0_chunk(ref["grads"][name], 2, rank)
                    torch.testing.assert_close(local(master.grad), want, atol=1e-6, rtol=1e-5)
            opt.step()
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.detach(), ref["weights"][name], atol=TOL, rtol=0)
        m, v = opt.full_moments()
        torch.testing.assert_close(m, ref["m"], atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(v, ref["v"], atol=1e-9, rtol=1e-4)
        assert opt.t == len(batches)

        opt.sync_gradients(False)  # a failed step leaves gradients behind: zero_grad drops them
        loss_of(model, batches[0][:1], 1).backward()
        opt.zero_grad()
        assert all(p.grad is None for p in model.parameters())
        assert all(m.grad is None for m in opt.masters.values())
        assert model._get_fsdp_state()._fsdp_param_group.reduce_grads  # the next backward reduces

        saved = opt.state()
        opt.load_full_moments(torch.zeros_like(m), torch.zeros_like(v), 0)
        assert all(float(t.abs().max()) == 0 for t in opt.state()["m"])  # type: ignore[union-attr]
        opt.load_full_moments(m, v, 5)
        again = opt.state()
        assert again["t"] == 5
        for a, b in zip(saved["m"], again["m"]):  # type: ignore[call-overload]
            assert torch.equal(a, b)
        opt.load_state(saved)
        assert opt.t == len(batches)
        with pytest.raises(ValueError, match="same training layout"):
            opt.load_state({**saved, "shards": []})

        new = {n: torch.full_like(p.detach(), 0.5) for n, p in model.named_parameters()}
        opt.set_masters(new)
        model.reshard()
        model.unshard()  # the gather brings back what set_masters wrote
        assert all(torch.equal(p.detach(), new[n]) for n, p in model.named_parameters())


def _rank_zero3(rank: int, init_file: str, spec, batches: list[torch.Tensor], ref: dict) -> None:
    """Stage 3: layers as units of their own, only shards registered between operations."""
    with _gloo_pair(rank, init_file) as mesh:
        model = StageModel(spec, Head.LM, seed=3)
        layers = tuple(model.model.layers.values())
        opt = FSDPAdam(model, mesh, dist.group.WORLD, lr=LR, zero=3, units=layers)
        assert len(opt.units) == len(layers) + 1 and opt.resharded
        assert all(hasattr(p, "placements") for p in model.parameters())  # shards between operations
        for x in batches:
            mine = torch.tensor_split(x, 2)[rank]
            # every rank the same number of passes (each gathers every layer: a collective), of
            # uneven sizes
            chunks = [mine[:1], mine[1:]]
            for i, c in enumerate(chunks):
                opt.sync_gradients(i == len(chunks) - 1)
                loss_of(model, c, len(x)).backward()
            assert all(hasattr(p, "placements") for p in layers[0].parameters())  # freed after backward
            opt.step()
        assert all(hasattr(p, "placements") for p in model.parameters())
        with opt.gathered():
            assert not opt.resharded
            with opt.gathered():  # nested: gathers once
                pass
            for name, p in model.named_parameters():
                torch.testing.assert_close(local(p).detach(), ref["weights"][name], atol=TOL, rtol=0)
            with torch.no_grad():  # a forward inside keeps the layers gathered
                model(batches[0][:1])
            assert all(not hasattr(p, "placements") for p in layers[0].parameters())
        assert opt.resharded and all(hasattr(p, "placements") for p in model.parameters())
        m, v = opt.full_moments()
        torch.testing.assert_close(m, ref["m"], atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(v, ref["v"], atol=1e-9, rtol=1e-4)
        assert opt.resharded

        with opt.gathered():
            new = {n: torch.full_like(local(p).detach(), 0.5) for n, p in model.named_parameters()}
        opt.set_masters(new)
        with opt.gathered():  # the gather brings back what set_masters wrote
            assert all(torch.equal(local(p).detach(), new[n]) for n, p in model.named_parameters())


@pytest.mark.parametrize("ranks", [_rank, _rank_zero3], ids=["zero2", "zero3"])
def test_fsdp_adam_matches_single_process_adam(ranks, tmp_path):
    spec = scale_spec(model_preset("llama2-7b"), "tiny", vocab=V, min_layers=2)
    g = torch.Generator().manual_seed(5)
    batches = [torch.randint(0, V, (5, 6), generator=g) for _ in range(2)]
    ref = reference(spec, batches)
    mp.start_processes(
        ranks, args=(str(tmp_path / "rendezvous"), spec, batches, ref), nprocs=2, start_method="fork"
    )


def test_fsdp_adam_knows_two_stages():
    with pytest.raises(ValueError, match="zero=1 must be 2 or 3"):
        FSDPAdam(torch.nn.Linear(2, 2), None, None, lr=LR, zero=1)

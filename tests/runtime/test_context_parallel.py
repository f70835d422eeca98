"""Context parallelism on the torch engine (``worker/context.py``, SPEC §15.3): a StageModel split
over ``Pc`` gloo ranks by ring or Ulysses attention computes the unsplit model's outputs, and the
loss summed over its positions has the unsplit loss and gradients."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from rpeg.ir.models import ModelSpec  # noqa: E402
from rpeg.ir.types import Head  # noqa: E402

SPEC = ModelSpec(
    name="cp-test",
    layers=2,
    hidden=64,
    ffn_hidden=128,
    vocab=32,
    heads=4,
    kv_heads=2,
    head_dim=16,
    ffn_projections=3,
)
LENGTH = 16


def _loss(
    logits: torch.Tensor, values: torch.Tensor, tokens: torch.Tensor, own: torch.Tensor
) -> torch.Tensor:
    """A token-summed next-token loss plus a value regression over the positions ``own`` (all of
    them unsplit): both heads and every layer get gradients."""
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, tokens[:, 1:, None])[..., 0]
    return -(logp * own[:-1]).sum() + ((values - 1.0) ** 2 * own).sum()


def _rank(rank: int, size: int, kind: str, recompute: str, init_file: str) -> None:
    from rpeg.runtime.worker.context import ContextParallel
    from rpeg.runtime.worker.model import StageModel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size)
    try:
        tokens = torch.randint(0, SPEC.vocab, (3, LENGTH), generator=torch.Generator().manual_seed(1))
        ref = StageModel(SPEC, Head.BOTH, seed=7, recompute=recompute)
        cp = ContextParallel(dist.group.WORLD, size, rank, kind)
        model = StageModel(SPEC, Head.BOTH, seed=7, recompute=recompute, context=cp)
        logits, values = model(tokens)
        own = model.own_positions(LENGTH)
        # outputs: the ranks' zero-padded outputs sum to the unsplit ones
        whole = [logits.detach().clone(), values.detach().clone()]
        for t in whole:
            dist.all_reduce(t)
        want_logits, want_values = ref(tokens)
        torch.testing.assert_close(whole[0], want_logits, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(whole[1], want_values, rtol=1e-5, atol=1e-6)
        # loss and gradients: each rank's share over its own positions
        loss = _loss(logits, values, tokens, own.float())
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total)
        want = _loss(want_logits, want_values, tokens, torch.ones(LENGTH))
        want.backward()
        torch.testing.assert_close(total, want.detach(), rtol=1e-5, atol=1e-6)
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            g = p.grad.clone() if p.grad is not None else torch.zeros_like(p)
            dist.all_reduce(g)
            torch.testing.assert_close(g, q.grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("size", "kind", "recompute"),
    [(2, "ring", "none"), (2, "ulysses", "none"), (2, "ring", "full"), (4, "ring", "none")],
)
def test_context_parallel_matches_unsplit(tmp_path, size, kind, recompute):
    # a rank's failed assertion exits it non-zero: start_processes raises ProcessRaisedException
    mp.start_processes(
        _rank, args=(size, kind, recompute, str(tmp_path / "init")), nprocs=size, start_method="fork"
    )


def test_zigzag_positions_tile_the_sequence():
    from rpeg.runtime.worker.context import zigzag_positions

    for size in (1, 2, 4):
        parts = [zigzag_positions(LENGTH, size, c) for c in range(size)]
        assert sorted(torch.cat(parts).tolist()) == list(range(LENGTH))
        # balanced under a causal mask: every rank's queries see as many keys
        assert len({int((p + 1).sum()) for p in parts}) == 1
    with pytest.raises(ValueError, match="not a multiple of 8"):
        zigzag_positions(12, 4, 0)


# ---------------------------------------------------------------------------------------------- runs
def _cluster(shape: str = "1x1x2"):
    from rpeg.costmodel import hardware_preset
    from rpeg.ir import Cluster

    # context parallelism on, the splits the engines do not run off
    return Cluster.from_shape(
        shape, hardware_preset("gh200"), max_zero_stage=2, sequence_parallel=False, expert_parallel=False
    )


def _grpo_plan(trainer: dict | None, reference: dict | None, *, algorithm: str = "grpo", pp: int = 1):
    """GRPO (or DPO) on two devices: the trainer and the reference with the given parallelisms
    (``None``: data parallelism over both devices instead)."""
    from rpeg.ir import Structure
    from rpeg.solvers.result import result_for_plan
    from tests.runtime.plans import workload

    every = ((0, 0, 0), (1, 1, 2))

    def entry(split: dict | None, mb: int, recompute: str | None) -> tuple:
        if split is None:
            return (*every, 2, 1, 1, mb, recompute)
        return (*every, 1, pp, 1, mb, recompute, split)

    table = {"ref_inf": entry(reference, 1, None), "actor_train": entry(trainer, 2, "none")}
    if algorithm == "dpo":
        table["actor_inf"] = (*every, 2, 1, 1, 1)
    else:
        table |= {"actor_gen": (*every, 2, 1, 1, 1), "reward_inf": (*every, 2, 1, 1, 1)}
    if algorithm == "dpo":
        from rpeg.ir import Workload
        from tests.runtime.plans import TOY

        wl = Workload("dpo", {"actor": TOY}, 64, 2, 256, 256)
    else:
        wl = workload(algorithm)
    structure = Structure(algorithm, False, (("actor", 0),))
    return result_for_plan(wl, _cluster(), structure, table)


def test_the_torch_engine_runs_context_parallelism_and_refuses_what_it_cannot():
    """A one-stage CP plan passes the runtime's checks; pipeline stages, DPO and a move between
    plans are refused, naming the vertex, the reason and the switch."""
    from rpeg.runtime.driver.runner import check_engine_choices

    ring = {"cp": 2, "cp_kind": "ring"}
    check_engine_choices(_grpo_plan(ring, {"cp": 2, "cp_kind": "ulysses"}))
    with pytest.raises(ValueError, match=r"'actor_train': context parallelism \(cp=2, ring\).*moving"):
        check_engine_choices(_grpo_plan(ring, None), moves_state=True)
    with pytest.raises(ValueError, match=r"'actor_train'.*DPO's sequence-level loss.*--no-context-parallel"):
        check_engine_choices(_grpo_plan(ring, None, algorithm="dpo"))


def test_a_sequence_length_the_zigzag_split_cannot_cut_is_refused_at_binding():
    from rpeg.runtime.binding import run_shape

    result = _grpo_plan({"cp": 2, "cp_kind": "ring"}, None)
    with pytest.raises(ValueError, match=r"'actor_train'.*cp=2.*8 \+ 6 = 14 is not a multiple of 4"):
        run_shape(result, batch=None, prompt_len=8, response_len=6, vocab=16, max_rollouts=4)


def test_context_parallel_grpo_runs_verifies_learns_and_trains_the_unsplit_weights(ray_session):
    """GRPO with the trainer on ring CP 2 and the reference on Ulysses CP 2, against the same
    plan with both data-parallel: 3 steps each, verified traces, the same rewards (the rollouts
    are the same tokens) and, after three Adam updates, the same weights up to float32 summation
    order (measured: 2.0e-5 ring, 1.6e-5 Ulysses)."""
    from rpeg.runtime.driver.runner import run
    from tests.runtime.plans import BATCH

    split = run(
        _grpo_plan({"cp": 2, "cp_kind": "ring"}, {"cp": 2, "cp_kind": "ulysses"}),
        steps=3,
        batch=BATCH,
        return_weights=True,
    )
    assert split.problems == []
    assert sum(split.rewards[-2:]) / 2 > split.rewards[0] + 0.05, split.rewards  # test_run.rising
    layouts = {r.vertex: r.layout for r in split.trace.records if r.kind == "op"}
    assert layouts["actor_train"]["cp"] == 2 and layouts["ref_inf"]["cp"] == 2
    plain = run(_grpo_plan(None, None), steps=3, batch=BATCH, return_weights=True)
    assert plain.problems == []
    assert split.rewards == pytest.approx(plain.rewards)
    for name, w in plain.weights["actor"].items():
        assert (w - split.weights["actor"][name]).abs().max().item() < 1e-3, name  # test_run.WEIGHT_TOL

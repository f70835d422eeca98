"""Megatron-core engine on CPU (``runtime/engines/megatron_engine.py``): config mapping, rank layout,
GPTModel with converted Hugging Face weights, and distributed checkpoints with resharding.

Four ranks (gloo, one thread each, forked by one subprocess running this file, which imports
Megatron once) run every distributed check once per module (:func:`ranks`) and write their
measurements to JSON; the tests assert on them. Megatron's modules are applied one by one (QKV
split, RoPE, projections, MLP, norms, embedding, output layer); its full forward pass, schedules
and :func:`train_step` need CUDA and are not run: only the refusal is tested.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("megatron.core")

import torch

from rpeg.ir.models import ModelSpec
from rpeg.runtime.engines import megatron_engine as me

#: Llama-like: grouped-query attention, untied head, 3 layers (an uneven split over 2 stages).
LLAMA = ModelSpec(name="tiny-llama", layers=3, hidden=64, ffn_hidden=128, vocab=100, heads=4, kv_heads=2)
#: Qwen2-like: q/k/v biases, tied embeddings.
QWEN = ModelSpec(
    name="tiny-qwen2",
    layers=2,
    hidden=64,
    ffn_hidden=96,
    vocab=100,
    heads=4,
    kv_heads=2,
    tied_embeddings=True,
    family="qwen2",
)
#: Qwen3-MoE-like (the runtime's MoE architecture): 4 experts, 2 per token, layer 0 dense.
MOE = ModelSpec(
    name="tiny-moe",
    layers=2,
    hidden=64,
    ffn_hidden=128,
    vocab=100,
    heads=4,
    kv_heads=2,
    experts=4,
    experts_active=2,
    expert_ffn=32,
    dense_layers=(0,),
)
DIV = 64  # vocab 100 pads to 128 at TP=1 and at TP=2, so checkpoints reshard between them
EPS = 1e-5  # rms_norm_eps of the runtime's models (engines/hf_models.py)
WORLD = 4
LAYOUTS = [(2, 1, 2), (1, 2, 2), (2, 2, 1), (4, 1, 1)]  # (dp, pp, tp); the first writes the checkpoint
TOL = 1e-5  # float32: fused vs separate matmuls differ in summation order only


# ---------------------------------------------------------------------------------------------- sources
def hf_states() -> dict[str, dict[str, torch.Tensor]]:
    """Seeded Hugging Face state dicts of :data:`LLAMA` and :data:`QWEN`, from ``transformers``."""
    tf = pytest.importorskip("transformers")
    common = {"rms_norm_eps": EPS, "max_position_embeddings": 64, "rope_theta": 10000.0}
    torch.manual_seed(0)
    llama = tf.LlamaForCausalLM(
        tf.LlamaConfig(
            vocab_size=LLAMA.vocab,
            hidden_size=LLAMA.hidden,
            intermediate_size=LLAMA.ffn_hidden,
            num_hidden_layers=LLAMA.layers,
            num_attention_heads=LLAMA.heads,
            num_key_value_heads=LLAMA.kv_heads,
            tie_word_embeddings=False,
            **common,
        )
    )
    qwen = tf.Qwen2ForCausalLM(
        tf.Qwen2Config(
            vocab_size=QWEN.vocab,
            hidden_size=QWEN.hidden,
            intermediate_size=QWEN.ffn_hidden,
            num_hidden_layers=QWEN.layers,
            num_attention_heads=QWEN.heads,
            num_key_value_heads=QWEN.kv_heads,
            tie_word_embeddings=True,
            **common,
        )
    )
    moe = tf.Qwen3MoeForCausalLM(
        tf.Qwen3MoeConfig(
            vocab_size=MOE.vocab,
            hidden_size=MOE.hidden,
            intermediate_size=MOE.ffn_hidden,
            num_hidden_layers=MOE.layers,
            num_attention_heads=MOE.heads,
            num_key_value_heads=MOE.kv_heads,
            head_dim=MOE.hidden // MOE.heads,
            num_experts=MOE.experts,
            num_experts_per_tok=MOE.experts_active,
            moe_intermediate_size=MOE.expert_ffn,
            mlp_only_layers=list(MOE.dense_layers),
            tie_word_embeddings=False,
            **common,
        )
    )
    out = {}
    for name, model in (("llama", llama), ("qwen", qwen), ("moe", moe)):
        # Random norm weights (HF initialises them to 1), so a swapped norm would show.
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for k in state:
            if k.endswith("norm.weight"):
                state[k] = 1.0 + 0.1 * torch.randn_like(state[k])
        out[name] = state
    out["qwen"].pop("lm_head.weight", None)  # tied: the same tensor as the embedding
    from rpeg.runtime.engines.hf_models import checkpoint_state

    out["moe"] = checkpoint_state(out["moe"], MOE)  # the checkpoint's per-expert names
    return out


# ---------------------------------------------------------------------------------------------- ranks
def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def _rope(x: torch.Tensor, base: float) -> torch.Tensor:
    """Hugging Face Llama RoPE of ``x [s, b, heads, hd]`` at positions ``0..s-1`` (rotate_half)."""
    hd = x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(x.shape[0], dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1)[:, None, None, :]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()


def _components(model: Any, config: Any, hf: dict, spec: ModelSpec, tp: int, t: int, pp: int, p: int) -> dict:
    """Megatron's own modules of layer 0 of this stage, embedding and output layer, applied on CPU,
    against the same maps written with the Hugging Face weights; max |Δ| per component."""
    from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb

    g = torch.Generator().manual_seed(1)
    s, b, d = 5, 2, spec.hidden
    hd, heads, kv = spec.hidden // spec.heads, spec.heads // tp, spec.kv_heads // tp
    x = torch.randn(s, b, d, generator=g)
    i = me.stage_layers(spec.layers, pp, p)[0]
    a = f"model.layers.{i}."
    layer = model.decoder.layers[0]
    attn = layer.self_attention
    out: dict[str, float] = {}
    w = hf[a + "input_layernorm.weight"]
    out["input_layernorm"] = _max_diff(
        layer.input_layernorm(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w
    )

    def proj(name: str, n: int, lo: int) -> torch.Tensor:
        y = x @ hf[f"{a}self_attn.{name}_proj.weight"].T
        if f"{a}self_attn.{name}_proj.bias" in hf:
            y = y + hf[f"{a}self_attn.{name}_proj.bias"]
        return y.view(s, b, -1, hd)[:, :, lo : lo + n]

    with torch.no_grad():
        q, k, v = attn.get_query_key_value_tensors(x)
        out["q"] = _max_diff(q, proj("q", heads, t * heads))
        out["k"] = _max_diff(k, proj("k", kv, t * kv))
        out["v"] = _max_diff(v, proj("v", kv, t * kv))
        freqs = model.rotary_pos_emb.get_freqs_non_repeated(s)
        emb = torch.cat([freqs, freqs], dim=-1)[:, None, None, :]
        out["rope"] = _max_diff(
            apply_rotary_pos_emb(q, emb, config), _rope(proj("q", heads, t * heads), 10000.0)
        )
        ctx = torch.randn(s, b, spec.heads * hd, generator=g)
        local = ctx.chunk(tp, dim=-1)[t]
        out["linear_proj"] = _max_diff(attn.linear_proj(local)[0], ctx @ hf[a + "self_attn.o_proj.weight"].T)
        h = torch.nn.functional.silu(x @ hf[a + "mlp.gate_proj.weight"].T) * (
            x @ hf[a + "mlp.up_proj.weight"].T
        )
        out["mlp"] = _max_diff(layer.mlp(x)[0], h @ hf[a + "mlp.down_proj.weight"].T)
        w = hf[a + "post_attention_layernorm.weight"]
        out["pre_mlp_layernorm"] = _max_diff(
            layer.pre_mlp_layernorm(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w
        )
        vp = me.padded_vocab_size(spec.vocab, tp, DIV)
        rows = slice(t * vp // tp, (t + 1) * vp // tp)
        if p == 0:
            tokens = torch.randint(0, spec.vocab, (b, s), generator=g)
            out["embedding"] = _max_diff(
                model.embedding.word_embeddings(tokens), hf["model.embed_tokens.weight"][tokens]
            )
        if p == pp - 1:
            head = hf["model.embed_tokens.weight" if spec.tied_embeddings else "lm_head.weight"]
            padded = torch.cat([head, head.new_zeros(vp - spec.vocab, d)])
            weight = model.shared_embedding_or_output_weight() if spec.tied_embeddings else None
            logits = model.output_layer(x, weight=weight)[0]
            out["output_layer"] = _max_diff(logits, x @ padded[rows].T)
    return out


def _state_diff(model: Any, expected: dict) -> dict:
    """Keys missing either way and max |Δ| between ``model``'s state dict and ``expected``."""
    state = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    want = {k: v for k, v in expected.items() if v is not None}
    common = sorted(set(state) & set(want))
    return {
        "only_model": sorted(set(state) - set(want)),
        "only_expected": sorted(set(want) - set(state)),
        "max_diff": max(_max_diff(state[k], want[k]) for k in common),
        "keys": len(common),
    }


_CONFIG_FIELDS = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "gated_linear_unit",
    "normalization",
    "layernorm_epsilon",
    "add_bias_linear",
    "add_qkv_bias",
    "hidden_dropout",
    "attention_dropout",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "use_cpu_initialization",
    "bf16",
    "fp16",
)


def _config_fields(config: Any) -> dict[str, Any]:
    """The mapped ``TransformerConfig`` fields as JSON values."""
    out = {f: getattr(config, f) for f in _CONFIG_FIELDS}
    out["activation_func"] = config.activation_func.__name__
    out["params_dtype"] = str(config.params_dtype)
    out["pipeline_dtype"] = str(config.pipeline_dtype)
    layout = config.pipeline_model_parallel_layout
    out["pipeline_model_parallel_layout"] = (
        None if layout is None else [[x.name for x in stage[0]] for stage in layout.layout]
    )
    return out


def _rank_main(rank: int, port: int, workdir: Path) -> None:
    """One of the :data:`WORLD` ranks: every layout of :data:`LAYOUTS` in turn."""
    import torch.distributed as dist

    from rpeg.runtime.worker.parallel import world_mesh

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, WORLD, False, datetime.timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
    hf = {name: torch.load(workdir / f"{name}.pt") for name in ("llama", "qwen")}
    ckpt = workdir / "ckpt"
    res: dict[str, Any] = {"layouts": {}}
    for dp, pp, tp in LAYOUTS:
        key = f"{dp},{pp},{tp}"
        t_layout = time.perf_counter()
        layout = me.initialize_parallel(tp, pp)
        t_init = time.perf_counter() - t_layout
        from megatron.core import parallel_state as ps

        mesh = world_mesh(rank, dp, pp, tp, "cpu")
        ranks = dist.get_process_group_ranks
        r: dict[str, Any] = {
            "megatron": list(me.coordinates()),
            "rpeg": [mesh.d, mesh.p, mesh.t],
            "layout": list(layout.coordinates(rank)),
            "groups_megatron": [
                ranks(ps.get_data_parallel_group()),
                ranks(ps.get_pipeline_model_parallel_group()),
                ranks(ps.get_tensor_model_parallel_group()),
            ],
            "groups_rpeg": [ranks(mesh.dp_group), ranks(mesh.pp_group), ranks(mesh.tp_mesh.get_group())],
        }
        _, p, t = me.coordinates()
        config = me.transformer_config(LLAMA, tp=tp, pp=pp, dp=dp, microbatches=2, norm_epsilon=EPS)
        r["config"] = _config_fields(config)
        model = me.build_gpt_model(
            LLAMA, config, pre_process=p == 0, post_process=p == pp - 1, vocab_divisible_by=DIV
        )
        expected = me.hf_to_megatron(hf["llama"], LLAMA, tp=tp, t=t, pp=pp, p=p, vocab_divisible_by=DIV)
        r["state_keys"] = sorted(k for k in model.state_dict() if not k.endswith("_extra_state"))
        r["sharded_keys"] = {
            k: [v.key, list(getattr(v, "global_shape", ())), list(getattr(v, "global_offset", ()))]
            for k, v in model.sharded_state_dict().items()
            if k.startswith("decoder.layers.0.") and not k.endswith("_extra_state")
        }
        if (dp, pp, tp) == LAYOUTS[0]:
            missing = model.load_state_dict(expected, strict=True)
            r["strict"] = [list(missing.missing_keys), list(missing.unexpected_keys)]
            r["components"] = _components(model, config, hf["llama"], LLAMA, tp, t, pp, p)
            t0 = time.perf_counter()
            me.save_checkpoint(model, ckpt)
            r["save_s"] = time.perf_counter() - t0
            qcfg = me.transformer_config(QWEN, tp=tp, pp=pp, dp=dp, microbatches=1, norm_epsilon=EPS)
            qwen = me.build_gpt_model(QWEN, qcfg, pre_process=True, post_process=True, vocab_divisible_by=DIV)
            qwen.load_state_dict(
                me.hf_to_megatron(hf["qwen"], QWEN, tp=tp, t=t, vocab_divisible_by=DIV), strict=True
            )
            r["qwen_components"] = _components(qwen, qcfg, hf["qwen"], QWEN, tp, t, 1, 0)
            r["qwen_state_keys"] = sorted(k for k in qwen.state_dict() if not k.endswith("_extra_state"))
            r["qwen_config"] = _config_fields(qcfg)
            bf16 = me.transformer_config(LLAMA, tp=tp, pp=pp, dp=dp, microbatches=1, dtype=torch.bfloat16)
            r["bf16_config"] = _config_fields(bf16)
            try:
                me.transformer_config(LLAMA, tp=tp, pp=pp, dp=dp, microbatches=1, no_such_field=1)
            except ValueError as exc:
                r["override_error"] = str(exc)
        else:
            r["before_load"] = _state_diff(model, expected)["max_diff"]
            t0 = time.perf_counter()
            me.load_checkpoint(model, ckpt)
            r["load_s"] = time.perf_counter() - t0
            r["loaded"] = _state_diff(model, expected)
            if (dp, pp, tp) == (4, 1, 1):
                r["components"] = _components(model, config, hf["llama"], LLAMA, tp, t, pp, p)
                back = me.megatron_to_hf([model.state_dict()], LLAMA, tp=1)
                r["to_hf"] = max(_max_diff(back[k], hf["llama"][k]) for k in hf["llama"])
                r["to_hf_keys"] = sorted(back) == sorted(hf["llama"])
        dist.barrier()
        me.destroy_parallel()
        r["init_s"], r["layout_s"] = t_init, time.perf_counter() - t_layout
        res["layouts"][key] = r
    res["context"] = _context_parallel(rank, hf["llama"])
    res["experts"] = _expert_parallel(rank, torch.load(workdir / "moe.pt"))
    (workdir / f"rank{rank}.json").write_text(json.dumps(res))
    dist.destroy_process_group()


def _context_parallel(rank: int, hf: dict[str, torch.Tensor]) -> dict[str, Any]:
    """SPEC §15.3 on the four ranks: ``tp = 2``, ``cp = 2`` (ring) with sequence parallelism —
    Megatron's groups against :class:`LayoutMapping`'s formula, the mapped config, and what the
    GPTModel's CPU (local, Transformer-Engine-free) layers say of both: its attention refuses
    ``cp = 2`` and its torch norm sequence parallelism."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    ranks = dist.get_process_group_ranks
    layout = me.initialize_parallel(2, 1, cp=2)
    d, _, t = layout.coordinates(rank)
    cfg = me.transformer_config(LLAMA, tp=2, pp=1, dp=1, microbatches=2, norm_epsilon=EPS, cp=2, sp=True)
    out: dict[str, Any] = {
        "megatron": [
            ps.get_data_parallel_rank(),
            ps.get_context_parallel_rank(),
            ps.get_tensor_model_parallel_rank(),
        ],
        "layout": [d, layout.context_rank(rank), t],
        "cp_group": ranks(ps.get_context_parallel_group()),
        "tp_group": ranks(ps.get_tensor_model_parallel_group()),
        "dp_cp_group": ranks(ps.get_data_parallel_group(with_context_parallel=True)),
        "config": [cfg.context_parallel_size, cfg.cp_comm_type, cfg.sequence_parallel],
    }
    cp_cfg = me.transformer_config(LLAMA, tp=2, pp=1, dp=1, microbatches=2, norm_epsilon=EPS, cp=2)
    try:
        me.build_gpt_model(LLAMA, cp_cfg, pre_process=True, post_process=True, vocab_divisible_by=DIV)
    except AssertionError as exc:
        out["cp_build"] = str(exc)
    sp_cfg = me.transformer_config(LLAMA, tp=2, pp=1, dp=1, microbatches=2, norm_epsilon=EPS, cp=1, sp=True)
    try:
        me.build_gpt_model(LLAMA, sp_cfg, pre_process=True, post_process=True, vocab_divisible_by=DIV)
    except AssertionError as exc:
        out["sp_build"] = str(exc)
    dist.barrier()
    me.destroy_parallel()
    return out


def _expert_parallel(rank: int, hf: dict[str, torch.Tensor]) -> dict[str, Any]:
    """SPEC §15.2 on the four ranks: ``Pd = 4``, ``Pe = 2`` — Megatron's expert groups against
    :meth:`LayoutMapping.expert_rank`, the mapped MoE config, and the converted weights of EP rank
    ``e`` loaded strictly into Megatron's MoE GPTModel, its local experts computing the Hugging
    Face experts' FFN on CPU. The alltoall dispatcher's constructor needs CUDA (a
    ``torch.cuda.Stream``), so the CPU model is built with the allgather one (same weights)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    ranks = dist.get_process_group_ranks
    layout = me.initialize_parallel(1, 1, ep=2)
    e = layout.expert_rank(rank)
    cfg = me.transformer_config(MOE, tp=1, pp=1, dp=4, microbatches=1, norm_epsilon=EPS, ep=2)
    out: dict[str, Any] = {
        "megatron": ps.get_expert_model_parallel_rank(),
        "layout": e,
        "ep_group": ranks(ps.get_expert_model_parallel_group()),
        "expert_dp_group": ranks(ps.get_expert_data_parallel_group()),
        "config": [
            cfg.num_moe_experts,
            cfg.moe_router_topk,
            cfg.moe_ffn_hidden_size,
            list(cfg.moe_layer_freq),
            cfg.expert_model_parallel_size,
            cfg.expert_tensor_parallel_size,
            cfg.moe_token_dispatcher_type,
            cfg.qk_layernorm,
        ],
    }
    try:
        me.build_gpt_model(MOE, cfg, pre_process=True, post_process=True, vocab_divisible_by=DIV)
    except RuntimeError as exc:
        out["alltoall_build"] = str(exc)
    cpu = me.transformer_config(
        MOE, tp=1, pp=1, dp=4, microbatches=1, norm_epsilon=EPS, ep=2, moe_token_dispatcher_type="allgather"
    )
    model = me.build_gpt_model(MOE, cpu, pre_process=True, post_process=True, vocab_divisible_by=DIV)
    loaded = model.load_state_dict(
        me.hf_to_megatron(hf, MOE, tp=1, t=0, ep=2, e=e, vocab_divisible_by=DIV), strict=True
    )
    out["strict"] = [list(loaded.missing_keys), list(loaded.unexpected_keys)]
    out["mlp_kinds"] = [type(layer.mlp).__name__ for layer in model.decoder.layers]
    mlp = model.decoder.layers[1].mlp
    x = torch.randn(5, MOE.hidden, generator=torch.Generator().manual_seed(2))
    diffs = []
    with torch.no_grad():
        for j, expert in enumerate(mlp.experts.local_experts):
            a = f"model.layers.1.mlp.experts.{e * 2 + j}."
            h = torch.nn.functional.silu(x @ hf[a + "gate_proj.weight"].T) * (x @ hf[a + "up_proj.weight"].T)
            diffs.append(_max_diff(expert(x)[0], h @ hf[a + "down_proj.weight"].T))
    out["experts"] = diffs
    out["router"] = torch.equal(mlp.router.weight.detach(), hf["model.layers.1.mlp.gate.weight"])
    back = me.megatron_to_hf([model.state_dict()] * 2, MOE, tp=1, ep=2)  # both EP ranks' shards alike
    out["own_experts_back"] = all(
        torch.equal(
            back[f"model.layers.1.mlp.experts.{e * 2 + j}.{x}_proj.weight"],
            hf[f"model.layers.1.mlp.experts.{e * 2 + j}.{x}_proj.weight"],
        )
        for j in range(2)
        for x in ("gate", "up", "down")
    )
    dist.barrier()
    me.destroy_parallel()
    return out


@pytest.fixture(scope="module")
def sources() -> dict[str, dict[str, torch.Tensor]]:
    return hf_states()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, sources) -> dict[str, Any]:
    """Run :func:`_rank_main` on :data:`WORLD` ranks; per-rank results and the wall time.

    One subprocess imports torch and Megatron-core once and forks the ranks (:func:`_fork_ranks`):
    four separate interpreters would each pay the ~6 CPU-seconds of imports on a 2-core machine.
    """
    import torch.distributed as dist

    workdir = tmp_path_factory.mktemp("megatron")
    for name, state in sources.items():
        torch.save(state, workdir / f"{name}.pt")
    # The parent holds the rendezvous store on a port the OS picked (port 0): no fixed port, no race.
    store = dist.TCPStore(
        "127.0.0.1", 0, WORLD + 1, True, datetime.timedelta(seconds=120), wait_for_workers=False
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, str(store.port), str(workdir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - t0
    del store
    assert proc.returncode == 0, proc.stdout[-6000:]
    results = [json.loads((workdir / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return {"ranks": results, "wall_s": wall, "workdir": workdir}


# ---------------------------------------------------------------------------------------------- tests
def test_layout_mapping_is_rpegs_rank_formula():
    layout = me.LayoutMapping(dp=3, pp=2, tp=2, microbatches=4)
    assert layout.world == 12
    for rank in range(layout.world):
        d, p, t = layout.coordinates(rank)
        assert (d, p, t) == (rank // 4, (rank // 2) % 2, rank % 2)  # world_mesh's formula
        assert layout.rank(d, p, t) == rank
    with pytest.raises(ValueError, match=re.escape("rank=12 must be in 0..11")):
        layout.coordinates(12)
    with pytest.raises(ValueError, match="LayoutMapping: microbatches must be a positive integer, got 0"):
        me.LayoutMapping(dp=1, pp=1, tp=1, microbatches=0)


def test_layout_settings_and_vocab_padding():
    settings = me.LayoutMapping(dp=2, pp=2, tp=2, microbatches=4).settings(LLAMA, vocab_divisible_by=DIV)
    assert settings == {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 2,
        "context_parallel_size": 1,
        "cp_comm_type": "p2p",
        "sequence_parallel": False,
        "expert_model_parallel_size": 1,
        "expert_tensor_parallel_size": 2,
        "data_parallel_size": 2,
        "num_microbatches": 4,
        "world_size": 8,
        "order": "tp-cp-ep-pp-dp",
        "stage_layers": [[0, 2], [2, 3]],
        "pipeline_model_parallel_layout": [["embedding", "decoder", "decoder"], ["decoder", "loss"]],
        "padded_vocab_size": 128,
        "heads_per_rank": 2,
        "query_groups_per_rank": 1,
        "ffn_hidden_per_rank": 64,
    }
    assert me.LayoutMapping(dp=1, pp=3, tp=1).pipeline_layout(LLAMA) is None  # 3 | 3: Megatron's even split
    assert me.padded_vocab_size(32000, 1) == 32000
    assert me.padded_vocab_size(32000, 8) == 32768  # Llama-2 at TP=8, as Megatron-LM pads it
    assert me.padded_vocab_size(128256, 1) == 128256
    assert me.padded_vocab_size(128256, 8) == 129024
    assert me.padded_vocab_size(100, 1, 64) == me.padded_vocab_size(100, 2, 64) == 128
    assert [list(me.stage_layers(10, 4, p)) for p in range(4)] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]


def test_stage_split_is_the_runtimes():
    from rpeg.ir.plan import stage_layer_ranges

    for layers in range(1, 13):
        for pp in range(1, layers + 1):
            got = [me.stage_layers(layers, pp, p) for p in range(pp)]
            assert [(r.start, r.stop) for r in got] == stage_layer_ranges(layers, pp), (layers, pp)
    with pytest.raises(ValueError, match="pp=4 must be between 1 and layers=3"):
        me.stage_layers(3, 4, 0)


@pytest.mark.parametrize(
    ("spec", "layout", "message"),
    [
        (LLAMA, {"tp": 3}, "heads=4 is not divisible by tp=3"),
        (LLAMA, {"tp": 4}, "kv_heads=2 is not divisible by tp=4"),
        (ModelSpec("f", 2, 64, 102, 100, 4, 4), {"tp": 4}, "ffn_hidden=102 is not divisible by tp=4"),
        (LLAMA, {"pp": 4}, "layers=3 is fewer than pp=4 stages"),
        (LLAMA, {"dp": 0}, "dp must be a positive integer, got 0"),
        (LLAMA, {"microbatches": -1}, "microbatches must be a positive integer, got -1"),
        (LLAMA, {"dtype": torch.int64}, "dtype=torch.int64 must be float32, bfloat16 or float16"),
    ],
)
def test_transformer_config_errors_name_field_and_value(spec, layout, message):
    kwargs = {"tp": 1, "pp": 1, "dp": 1, "microbatches": 1} | layout
    with pytest.raises(ValueError, match=message):
        me.transformer_config(spec, **kwargs)


def test_transformer_config_values(ranks):
    r0 = ranks["ranks"][0]["layouts"]
    common = {
        "num_layers": 3,
        "hidden_size": 64,
        "ffn_hidden_size": 128,
        "num_attention_heads": 4,
        "num_query_groups": 2,
        "kv_channels": 16,
        "gated_linear_unit": True,
        "activation_func": "silu",
        "normalization": "RMSNorm",
        "layernorm_epsilon": EPS,
        "add_bias_linear": False,
        "add_qkv_bias": False,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "use_cpu_initialization": True,
        "params_dtype": "torch.float32",
        "bf16": False,
        "fp16": False,
    }
    assert r0["2,1,2"]["config"] == common | {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 1,
        "pipeline_dtype": "None",
        "pipeline_model_parallel_layout": None,
    }
    assert r0["1,2,2"]["config"] == common | {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 2,
        "pipeline_dtype": "torch.float32",
        "pipeline_model_parallel_layout": [["embedding", "decoder", "decoder"], ["decoder", "loss"]],
    }
    bf16 = r0["2,1,2"]["bf16_config"]
    assert (bf16["bf16"], bf16["params_dtype"], bf16["layernorm_epsilon"]) == (True, "torch.bfloat16", 1e-5)
    qwen = r0["2,1,2"]["qwen_config"]
    assert (qwen["add_qkv_bias"], qwen["ffn_hidden_size"], qwen["num_layers"]) == (True, 96, 2)
    assert "overrides ['no_such_field'] are not TransformerConfig fields" in r0["2,1,2"]["override_error"]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: "dp{}-pp{}-tp{}".format(*x))
def test_megatron_rank_coordinates_are_rpegs(ranks, layout):
    key = ",".join(map(str, layout))
    _, pp, tp = layout
    for rank, res in enumerate(ranks["ranks"]):
        r = res["layouts"][key]
        want = [rank // (pp * tp), (rank // tp) % pp, rank % tp]
        assert r["megatron"] == r["rpeg"] == r["layout"] == want, (rank, r)
        assert r["groups_megatron"] == r["groups_rpeg"], (rank, r)


def test_context_and_sequence_parallelism_map_onto_megatron(ranks):
    """SPEC §15.3 (ranks tp, cp, pp, dp: Megatron's tp-cp-ep-pp-dp): Megatron's context- and
    tensor-parallel groups are :class:`LayoutMapping`'s and the config carries ``cp``, its comm
    type and ``sp``. Neither builds a GPTModel on CPU: Megatron's local layers refuse both
    (Transformer Engine's attention and norms run them, on GPUs); the weight conversion is per
    ``(p, t)`` and the same with them (a context- or sequence-parallel rank holds its TP shard)."""
    layout = me.LayoutMapping(dp=1, pp=1, tp=2, cp=2, sp=True)
    for rank, res in enumerate(ranks["ranks"]):
        r = res["context"]
        assert r["megatron"] == r["layout"] == [0, rank // 2, rank % 2], (rank, r)
        assert r["cp_group"] == [rank % 2, rank % 2 + 2]  # stride Pt
        assert r["tp_group"] == [rank - rank % 2, rank - rank % 2 + 1]
        assert r["dp_cp_group"] == r["cp_group"]  # Pd = 1
        assert r["config"] == [2, "p2p", True]
        assert "only supported by TEDotProductAttention" in r["cp_build"]
        assert "sequence parallel not supported by torch LayerNorm" in r["sp_build"]
        assert layout.rank(0, 0, rank % 2, rank // 2) == rank
    settings = layout.settings(LLAMA, vocab_divisible_by=DIV)
    assert (settings["context_parallel_size"], settings["cp_comm_type"], settings["sequence_parallel"]) == (
        2,
        "p2p",
        True,
    )
    assert (
        me.LayoutMapping(dp=1, pp=1, tp=1, cp=2, cp_kind="ulysses").settings(LLAMA, vocab_divisible_by=DIV)[
            "cp_comm_type"
        ]
        == "a2a"
    )
    with pytest.raises(ValueError, match="sequence parallelism needs tp > 1"):
        me.LayoutMapping(dp=1, pp=1, tp=1, sp=True).check(LLAMA)
    with pytest.raises(ValueError, match="cp_kind must be"):
        me.LayoutMapping(dp=1, pp=1, tp=1, cp_kind="ulysses")


def test_expert_parallelism_maps_onto_megatron(ranks):
    """SPEC §15.2 (EP inside the data-parallel ranks, Megatron's tp-cp-ep-pp-dp): Megatron's
    expert groups are :meth:`LayoutMapping.expert_rank`'s (2 consecutive ranks; the ranks holding
    the same experts stride 2), the config carries the MoE shape, and EP rank ``e``'s converted
    weights load strictly into Megatron's MoE GPTModel (layer 0 dense, layer 1 a router and 2 local
    experts) whose experts compute the Hugging Face experts. The alltoall dispatcher is GPU-only."""
    for rank, res in enumerate(ranks["ranks"]):
        r = res["experts"]
        assert r["megatron"] == r["layout"] == rank % 2, (rank, r)
        assert r["ep_group"] == [rank - rank % 2, rank - rank % 2 + 1]
        assert r["expert_dp_group"] == [rank % 2, rank % 2 + 2]
        assert r["config"] == [4, 2, 32, [0, 1], 2, 1, "alltoall", True]
        assert "torch.cuda.Stream requires CUDA" in r["alltoall_build"]
        assert r["strict"] == [[], []]
        assert r["mlp_kinds"] == ["MLP", "MoELayer"]
        assert max(r["experts"]) < TOL and r["router"] and r["own_experts_back"], r


def test_moe_strategies_map_and_what_is_not_mapped_is_refused():
    from rpeg.ir import Strategy

    ep = me.LayoutMapping.from_strategy(Strategy((1, 1, 4), 4, 1, 1, 1, ep=4))
    assert (ep.world, ep.ep) == (4, 4)
    settings = me.LayoutMapping(dp=4, pp=1, tp=1, ep=2).settings(MOE, vocab_divisible_by=DIV)
    assert (settings["expert_model_parallel_size"], settings["expert_tensor_parallel_size"]) == (2, 1)
    cp = me.LayoutMapping.from_strategy(Strategy((1, 1, 4), 1, 1, 2, 2, cp=2, cp_kind="ulysses", sp=True))
    assert (cp.world, cp.cp, cp.cp_kind, cp.sp) == (4, 2, "ulysses", True)
    with pytest.raises(ValueError, match=r"ep=3 must divide the data- and context-parallel ranks dp·cp = 4"):
        me.LayoutMapping(dp=4, pp=1, tp=1, ep=3)
    with pytest.raises(ValueError, match="ep=2 but the model has no experts"):
        me.LayoutMapping(dp=2, pp=1, tp=1, ep=2).check(LLAMA)
    with pytest.raises(ValueError, match="ep=8 must divide the 4 experts"):
        me.LayoutMapping(dp=8, pp=1, tp=1, ep=8).check(MOE)
    shared = dataclasses.replace(MOE, shared_experts=1, shared_ffn=32)
    with pytest.raises(ValueError, match=r"shared experts \(1\) are not mapped"):
        me.LayoutMapping(dp=1, pp=1, tp=1).check(shared)


@pytest.mark.parametrize(("ep", "tp", "pp"), [(1, 1, 1), (2, 2, 1), (4, 1, 2)])
def test_moe_round_trip_is_exact(sources, ep, tp, pp):
    hf = sources["moe"]
    assert sorted(me.hf_shapes(MOE)) == sorted(hf)
    shards = [
        me.hf_to_megatron(hf, MOE, tp=tp, t=t, pp=pp, p=p, ep=ep, e=e, vocab_divisible_by=DIV)
        for e in range(ep)
        for p in range(pp)
        for t in range(tp)
    ]
    back = me.megatron_to_hf(shards, MOE, tp=tp, pp=pp, ep=ep)
    assert sorted(back) == sorted(hf)
    assert all(torch.equal(back[k], hf[k]) for k in hf)
    layer = 1 - (pp - 1)  # layer 1 is stage 1's first when pp = 2
    local = shards[-1][f"decoder.layers.{layer}.mlp.experts.local_experts.0.linear_fc1.weight"]
    assert tuple(local.shape) == (2 * MOE.expert_ffn // tp, MOE.hidden)


def test_converted_weights_load_strictly_and_compute_the_hf_maps(ranks):
    """TP=2 per rank and TP=1: Megatron's QKV split, RoPE, projections, MLP, norms, embedding and
    output layer on the converted weights give the Hugging Face results."""
    for rank, res in enumerate(ranks["ranks"]):
        for key in ("2,1,2", "4,1,1"):
            r = res["layouts"][key]
            components = r["components"]
            assert set(components) == {
                "input_layernorm", "q", "k", "v", "rope", "linear_proj", "mlp",
                "pre_mlp_layernorm", "embedding", "output_layer",
            }  # fmt: skip
            assert max(components.values()) < TOL, (rank, key, components)
        assert res["layouts"]["2,1,2"]["strict"] == [[], []]


def test_qwen2_biases_and_tied_embeddings(ranks):
    for res in ranks["ranks"]:
        r = res["layouts"]["2,1,2"]
        assert max(r["qwen_components"].values()) < TOL, r["qwen_components"]
        keys = r["qwen_state_keys"]
        assert "decoder.layers.1.self_attention.linear_qkv.bias" in keys
        assert "output_layer.weight" not in keys  # the head reads the embedding weight


def test_stage_state_dicts_number_layers_locally_checkpoints_globally(ranks):
    stage0, stage1 = (ranks["ranks"][r]["layouts"]["1,2,2"] for r in (0, 2))  # ranks (0,0,0), (0,1,0)
    assert {k.split(".")[2] for k in stage0["state_keys"] if k.startswith("decoder.layers.")} == {"0", "1"}
    assert {k.split(".")[2] for k in stage1["state_keys"] if k.startswith("decoder.layers.")} == {"0"}
    assert "embedding.word_embeddings.weight" in stage0["state_keys"]
    assert "output_layer.weight" in stage1["state_keys"] and "output_layer.weight" not in stage0["state_keys"]
    # Checkpoints stack a tensor over all layers on a leading axis: stage 1's layer 0 is global layer 2.
    sharded = stage1["sharded_keys"]
    assert sharded["decoder.layers.0.self_attention.linear_qkv.weight"] == [
        "decoder.layers.self_attention.linear_qkv.weight",
        [3, 128, 64],  # [layers, (heads + 2·kv_heads)·head_dim, hidden]: TP=2 shards of 64 rows
        [2, 0, 0],
    ]
    assert sharded["decoder.layers.0.input_layernorm.weight"] == [
        "decoder.layers.self_attention.linear_qkv.layer_norm_weight",  # the Transformer-Engine name
        [3, 64],
        [2, 0],
    ]
    assert (
        sharded["decoder.layers.0.pre_mlp_layernorm.weight"][0]
        == "decoder.layers.mlp.linear_fc1.layer_norm_weight"
    )
    assert stage0["sharded_keys"]["decoder.layers.0.self_attention.linear_proj.weight"][2] == [0, 0, 0]


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=lambda x: "dp{}-pp{}-tp{}".format(*x))
def test_checkpoint_written_at_tp2_loads_resharded(ranks, layout):
    """The checkpoint saved by the (dp, pp, tp) = (2, 1, 2) ranks loads into PP=2 and TP=1 layouts
    with exactly the converted Hugging Face weights of each rank's slice."""
    key = ",".join(map(str, layout))
    for rank, res in enumerate(ranks["ranks"]):
        r = res["layouts"][key]
        assert r["before_load"] > 1e-3, (rank, r["before_load"])  # the model did start elsewhere
        assert r["loaded"]["only_model"] == r["loaded"]["only_expected"] == []
        assert r["loaded"]["max_diff"] == 0.0, (rank, r["loaded"])
    if layout == (4, 1, 1):
        for res in ranks["ranks"]:
            assert res["layouts"][key]["to_hf"] == 0.0 and res["layouts"][key]["to_hf_keys"]
    ckpt = ranks["workdir"] / "ckpt"
    assert json.loads((ckpt / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    assert list(ckpt.glob("*.distcp")) and (ckpt / "common.pt").is_file()


def test_hf_names_and_shapes_are_transformers(sources):
    for name, spec in (("llama", LLAMA), ("qwen", QWEN)):
        state = sources[name]
        shapes = me.hf_shapes(spec)
        assert sorted(shapes) == sorted(state)
        assert all(tuple(state[k].shape) == v for k, v in shapes.items())


@pytest.mark.parametrize(
    ("name", "pp", "tp"),
    [
        (n, pp, tp)
        for n, layers in (("llama", 3), ("qwen", 2))
        for pp in range(1, layers + 1)
        for tp in (1, 2)
    ],
)
def test_round_trip_is_exact(sources, name, pp, tp):
    spec = {"llama": LLAMA, "qwen": QWEN}[name]
    hf = sources[name]
    stages = [
        [me.hf_to_megatron(hf, spec, tp=tp, t=t, pp=pp, p=p, vocab_divisible_by=DIV) for t in range(tp)]
        for p in range(pp)
    ]
    back = me.megatron_to_hf(stages, spec, tp=tp, pp=pp)
    assert sorted(back) == sorted(hf)
    assert all(torch.equal(back[k], hf[k]) for k in hf)
    flat = me.megatron_to_hf([s for stage in stages for s in stage], spec, tp=tp, pp=pp)
    assert all(torch.equal(flat[k], hf[k]) for k in hf)
    emb = stages[0][tp - 1]["embedding.word_embeddings.weight"]
    assert tuple(emb.shape) == (128 // tp, spec.hidden)
    assert torch.count_nonzero(emb[-(128 - spec.vocab) :]) == 0  # padding rows (last rank)
    qkv = stages[0][0]["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert tuple(qkv.shape) == ((spec.heads + 2 * spec.kv_heads) * 16 // tp, spec.hidden)


def test_qkv_rows_interleave_query_groups(sources):
    """``[q heads of group g, k_g, v_g]`` per group: group 1 (TP rank 1 at TP=2) starts with heads 2, 3."""
    hf, a = sources["llama"], "model.layers.0.self_attn."
    qkv = me.hf_to_megatron(hf, LLAMA, tp=2, t=1, vocab_divisible_by=DIV)[
        "decoder.layers.0.self_attention.linear_qkv.weight"
    ]
    q, k, v = (hf[a + f"{x}_proj.weight"] for x in "qkv")
    assert torch.equal(qkv, torch.cat([q[32:64], k[16:32], v[16:32]]))
    fc1 = me.hf_to_megatron(hf, LLAMA, tp=2, t=1, vocab_divisible_by=DIV)[
        "decoder.layers.0.mlp.linear_fc1.weight"
    ]
    gate, up = hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(fc1, torch.cat([gate[64:], up[64:]]))


def test_conversion_errors(sources):
    hf = dict(sources["llama"])
    with pytest.raises(ValueError, match=r"rank \(p=0, t=2, e=0\) is outside pp=1, tp=2, ep=1"):
        me.hf_to_megatron(hf, LLAMA, tp=2, t=2)
    with pytest.raises(ValueError, match="ffn_projections=2"):
        me.hf_to_megatron(hf, ModelSpec("g", 3, 64, 128, 100, 4, 2, ffn_projections=2), tp=1, t=0)
    with pytest.raises(ValueError, match="kv_heads=2 is not divisible by tp=4"):
        me.hf_to_megatron(hf, LLAMA, tp=4, t=0)
    del hf["model.layers.2.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=re.escape("model.layers.2.mlp.up_proj.weight is missing")):
        me.hf_to_megatron(hf, LLAMA, tp=1, t=0)
    hf["model.layers.2.mlp.up_proj.weight"] = torch.zeros(64, 64)
    with pytest.raises(
        ValueError, match=r"up_proj.weight has shape \(64, 64\), ModelSpec 'tiny-llama' gives \(128, 64\)"
    ):
        me.hf_to_megatron(hf, LLAMA, tp=1, t=0)
    hf["model.layers.2.mlp.up_proj.weight"] = sources["llama"]["model.layers.2.mlp.up_proj.weight"]
    hf["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    with pytest.raises(ValueError, match="are not weights of a llama model"):
        me.hf_to_megatron(hf, LLAMA, tp=1, t=0)
    with pytest.raises(ValueError, match="3 shards given, ep·pp·tp = 4 expected"):
        me.megatron_to_hf([{}, {}, {}], LLAMA, tp=2, pp=2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is the CPU behaviour")
def test_train_step_refuses_without_cuda():
    with pytest.raises(RuntimeError, match="Megatron-core training needs CUDA"):
        me.train_step(
            object(),
            object(),
            [{"tokens": torch.zeros(1, 4, dtype=torch.long)}],
            seq_length=4,
            micro_batch_size=1,
        )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is the CPU behaviour")
def test_tied_embeddings_with_pipeline_refuse_on_cpu():
    from types import SimpleNamespace

    config = SimpleNamespace(
        num_layers=2, hidden_size=64, num_attention_heads=4, pipeline_model_parallel_size=2
    )
    with pytest.raises(RuntimeError, match="tied embeddings with pp > 1 need CUDA"):
        me.build_gpt_model(QWEN, config, pre_process=True, post_process=False)


def _fork_ranks(port: int, workdir: Path) -> int:
    """Import the engine once, fork :data:`WORLD` ranks, wait; the number of failed ranks."""
    import multiprocessing
    import multiprocessing.connection

    import megatron.core.dist_checkpointing  # noqa: F401 - imported before the fork, once
    from megatron.core.models.gpt import gpt_layer_specs  # noqa: F401

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_rank_main, args=(r, port, workdir)) for r in range(WORLD)]
    for pr in procs:
        pr.start()
    running = list(procs)
    while running:  # a failed rank would leave the others waiting in a collective: stop them
        multiprocessing.connection.wait([pr.sentinel for pr in running])
        for pr in [pr for pr in running if pr.exitcode is not None]:
            running.remove(pr)
            if pr.exitcode:
                for other in running:
                    other.terminate()
    return sum(pr.exitcode != 0 for pr in procs)


if __name__ == "__main__":
    sys.exit(_fork_ranks(int(sys.argv[1]), Path(sys.argv[2])))

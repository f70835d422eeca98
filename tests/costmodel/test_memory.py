"""Per-device memory against hand-computed numbers (SPEC §6, §14; ``docs/cost-model.md`` §4, §8).

The tiny model: L = 4, d = 64, dff = 128, V = 1000, 4 heads of 16; W_layer = 32768, sb = 2.
"""

import dataclasses

import pytest

from rpeg.costmodel import (
    Layout,
    hardware_preset,
    kv_cache_bytes,
    kv_width_per_device,
    model_params,
    training_state_bytes,
    transient_bytes,
    weight_bytes,
    weight_shard_params,
)
from rpeg.costmodel.memory import (
    ROLLOUT_BATCH_TOKENS,
    ROLLOUT_MAX_SEQS,
    ZeroState,
    engine_workspace_bytes,
    generation_engine_bytes,
    kv_budget_tokens,
    kv_bytes_per_token,
    logits_bytes,
    zero_state_bytes,
)
from rpeg.ir.models import ModelSpec, model_preset
from rpeg.ir.plan import Strategy
from rpeg.ir.types import Head, Role


def make_layout(
    dp: int,
    pp: int,
    tp: int,
    mb: int,
    pp_tier: int = 0,
    dp_tier: int = 0,
    gpus_per_node: int = 8,
    **engine: object,
) -> Layout:
    """The cost model's :class:`Layout` of bare degrees (the strategy's extent is not priced);
    ``engine`` sets the SPEC §14 fields (``zero``, ``logits_chunk``, ``mem_fraction``, ...)."""
    s = Strategy((1, 1, dp * pp * tp), dp, pp, tp, mb, pp_tier, dp_tier)
    return Layout(s.variant(**engine) if engine else s, gpus_per_node)


TINY = ModelSpec(
    name="tiny",
    layers=4,
    hidden=64,
    ffn_hidden=128,
    vocab=1000,
    heads=4,
    kv_heads=4,
    ffn_projections=2,
)
TIED = dataclasses.replace(TINY, name="tiny-tied", tied_embeddings=True)
SEQ = {"sequences": 16, "prompt_len": 24, "response_len": 8}  # ℓ = 32


def test_model_params_per_head():
    assert model_params(TINY) == TINY.params == 259_648
    assert model_params(TINY, Head.SCALAR) == 259_648 - 64_000 + 64
    assert model_params(TINY, Head.BOTH) == 259_648 + 64
    assert model_params(TIED) == TIED.params == 259_648 - 64_000
    assert model_params(TIED, Head.BOTH) == 259_648 - 64_000 + 64


def test_weight_shard_by_hand():
    # Pp = 1: all 4 layers + embedding + LM head
    assert weight_shard_params(TINY, 1, 1) == 4 * 32768 + 64_000 + 64_000
    # Pp = 2, Pt = 2: (4/2)·32768/2 layer weights + the larger of embedding / head
    assert weight_shard_params(TINY, 2, 2) == 32768 + 64_000
    assert weight_shard_params(TINY, 2, 2, Head.SCALAR) == 32768 + 64_000
    assert weight_shard_params(TINY, 1, 1, Head.SCALAR) == 131_072 + 64_000 + 64
    assert weight_shard_params(TINY, 1, 1, Head.BOTH) == 131_072 + 64_000 + 64_064
    assert weight_shard_params(TINY, 2, 1, Head.BOTH) == 65_536 + 64_064
    # tied embeddings share storage only when first and last stage coincide
    assert weight_shard_params(TIED, 1, 1) == 131_072 + 64_000
    assert weight_shard_params(TIED, 1, 1, Head.BOTH) == 131_072 + 64_000 + 64
    assert weight_shard_params(TIED, 2, 1) == 65_536 + 64_000


def test_persistent_state_by_hand():
    layout = make_layout(dp=4, pp=2, tp=2, mb=2)
    assert training_state_bytes(TINY, layout) == 12 * 96_768 / 4
    assert weight_bytes(TINY, layout) == 96_768 * 2


def test_training_transient_by_hand():
    layout = make_layout(dp=2, pp=2, tp=2, mb=4)
    # L/Pp = 2, c = ⌊√2⌋ = 1, b = 16/(2·4) = 2,
    # buffer = max(2·64 + 6·64/2, 2·64 + 2·128/2) = 320 per token,
    # activations = 2·min(4, 2)·2·32·(2/1·64 + 1·320) = 114688
    activations = 2 * 2 * 2 * 32 * (2 * 64 + 320)
    weights = (32768 + 64_000) * 2
    # FP32 logits of one microbatch, T_mb = b·ℓ = 2·32 = 64 tokens, and as much again for their
    # gradient: 2·4·64·1000/Pt = 256000 (SPEC §14.6)
    logits = 2 * 4 * 64 * 1000 / 2
    expected = activations + logits + weights + weights / 2
    assert transient_bytes(TINY, Role.TRAINING, layout, **SEQ) == pytest.approx(expected)
    assert expected == 660_992
    # include_weights does not double count for training
    assert transient_bytes(TINY, Role.TRAINING, layout, **SEQ, include_weights=True) == expected
    # a chunked loss of 16 tokens holds 2·4·16·1000/2 = 64000 bytes of logits instead
    chunked = make_layout(dp=2, pp=2, tp=2, mb=4, logits_chunk=16)
    got = transient_bytes(TINY, Role.TRAINING, chunked, **SEQ)
    assert got == pytest.approx(activations + 64_000 + weights + weights / 2)
    # packed sequences of mean length ℓ = 20: b·ℓ = 40 tokens per microbatch everywhere
    packed = transient_bytes(TINY, Role.TRAINING, layout, **SEQ, tokens=20.0)
    acts20 = 2 * 2 * 2 * 20 * (2 * 64 + 320)
    assert packed == pytest.approx(acts20 + 2 * 4 * 40 * 1000 / 2 + weights + weights / 2)


def test_checkpoint_interval_is_floor_sqrt_layers_per_stage():
    deep = dataclasses.replace(TINY, name="deep", layers=16)
    layout = make_layout(dp=1, pp=1, tp=1, mb=1)
    # one sequence of ℓ = 32 tokens: training logits 2·4·32·1000 = 256000
    logits = 2 * 4 * 32 * 1000
    # c = 4: 16/4 checkpoints of d plus a 4-layer buffer of max(512, 384) per token
    activations = 2 * 1 * 1 * 32 * (4 * 64 + 4 * 512)
    weights = (16 * 32768 + 128_000) * 2
    got = transient_bytes(deep, Role.TRAINING, layout, sequences=1, prompt_len=24, response_len=8)
    assert got == pytest.approx(activations + logits + weights + weights)
    # L/Pp = 8: c = ⌊√8⌋ = 2 (not 3), 8/2 checkpoints plus a 2-layer buffer
    eight = dataclasses.replace(TINY, name="eight", layers=8)
    activations = 2 * 32 * (4 * 64 + 2 * 512)
    weights = (8 * 32768 + 128_000) * 2
    got = transient_bytes(eight, Role.TRAINING, layout, sequences=1, prompt_len=24, response_len=8)
    assert got == pytest.approx(activations + logits + 2 * weights)


def test_inference_transient_by_hand():
    layout = make_layout(dp=2, pp=1, tp=2, mb=2)
    # b = 4, ℓ = 32: T_mb = 128 tokens through the widest block buffer max(320, 256) = 320,
    # plus FP32 logits 4·128·1000/2 = 256000 (SPEC §14.6 replaces §6's d + V term)
    buffer = 2 * 128 * 320
    logits = 4 * 128 * 1000 / 2
    assert transient_bytes(TINY, Role.INFERENCE, layout, **SEQ) == buffer + logits == 337_920
    # a scalar head's one value per token is negligible: the block buffer alone
    assert transient_bytes(TINY, Role.INFERENCE, layout, **SEQ, head=Head.SCALAR) == buffer
    # both heads carry the LM head's logits
    assert transient_bytes(TINY, Role.INFERENCE, layout, **SEQ, head=Head.BOTH) == buffer + logits
    with_weights = transient_bytes(TINY, Role.INFERENCE, layout, **SEQ, include_weights=True)
    assert with_weights == buffer + logits + (65_536 + 128_000) * 2
    # a chunked loss of 32 tokens: 4·32·1000/2 = 64000 bytes of logits
    chunked = make_layout(dp=2, pp=1, tp=2, mb=2, logits_chunk=32)
    assert transient_bytes(TINY, Role.INFERENCE, chunked, **SEQ) == buffer + 64_000


def test_generation_transient_by_hand():
    layout = make_layout(dp=2, pp=2, tp=2, mb=2)
    # prefill activations at ℓ = Lp = 24 with b = 4: 2·4·24·1064
    # KV cache: 2·sb·(16/2)·(24 + 8)·(4/2)·(64/2) = 65536
    assert kv_cache_bytes(TINY, layout, sequences=16, prompt_len=24, response_len=8) == 65_536
    expected = 2 * 4 * 24 * 1064 + 65_536
    assert transient_bytes(TINY, Role.GENERATION, layout, **SEQ) == expected
    assert transient_bytes(TINY, Role.GENERATION, layout, **SEQ, include_weights=True) == (
        expected + 96_768 * 2
    )


# ---------------------------------------------------------------------------- SPEC §14
def test_logits_bytes_by_hand():
    layout = make_layout(dp=1, pp=1, tp=2, mb=1)
    # whole microbatch, T = 100 tokens: 4·100·1000/Pt = 200000; training ×2 for the gradient
    assert logits_bytes(TINY, Role.INFERENCE, layout, tokens=100) == 4 * 100 * 1000 / 2 == 200_000
    assert logits_bytes(TINY, Role.TRAINING, layout, tokens=100) == 2 * 4 * 100 * 1000 / 2
    # chunked loss of c = 64 tokens: T = min(64, 100)
    chunked = make_layout(dp=1, pp=1, tp=2, mb=1, logits_chunk=64)
    assert logits_bytes(TINY, Role.INFERENCE, chunked, tokens=100) == 4 * 64 * 1000 / 2
    assert logits_bytes(TINY, Role.TRAINING, chunked, tokens=100) == 2 * 4 * 64 * 1000 / 2
    # a chunk at least the microbatch's tokens changes nothing: T = min(4096, 100) = 100
    big = make_layout(dp=1, pp=1, tp=2, mb=1, logits_chunk=4096)
    assert logits_bytes(TINY, Role.INFERENCE, big, tokens=100) == 200_000
    # Pt = 1: the whole vocabulary on one rank
    assert logits_bytes(TINY, Role.INFERENCE, make_layout(1, 1, 1, 1), tokens=100) == 400_000
    # a scalar head: 0; both heads: the LM head's logits; generation: part of the engine
    for role in (Role.INFERENCE, Role.TRAINING):
        assert logits_bytes(TINY, role, layout, tokens=100, head=Head.SCALAR) == 0.0
    assert logits_bytes(TINY, Role.INFERENCE, layout, tokens=100, head=Head.BOTH) == 200_000
    assert logits_bytes(TINY, Role.GENERATION, layout, tokens=100) == 0.0


def test_zero_state_bytes_by_hand():
    # (Pd, Pp, Pt) = (4, 1, 2): N_s = 4·32768/2 + 64000 + 64000 = 193536 parameters;
    # ZeRO-3 gathers two layers 2·32768/2 and the root unit N_s − 4·32768/2 = 128000: N_g = 160768
    n_s, n_g = 193_536, 32_768 + 128_000
    assert weight_shard_params(TINY, 1, 2) == n_s

    def state(role, zero, head=Head.LM):
        return zero_state_bytes(TINY, role, make_layout(4, 1, 2, 1, zero=zero), head)

    adam = 12 * n_s / 4  # FP32 master weights and Adam moments, sharded over Pd = 4: 580608
    assert state(Role.TRAINING, 1) == ZeroState(adam, 2 * n_s + 2 * n_s)  # weights + full grads
    assert state(Role.TRAINING, 2) == ZeroState(adam, 2 * n_s + 2 * n_s / 4)  # SPEC §6
    assert state(Role.TRAINING, 3) == ZeroState(adam, 2 * 2 * n_s / 4 + 2 * n_g)  # FSDP2
    assert state(Role.TRAINING, 2).persistent == training_state_bytes(TINY, make_layout(4, 1, 2, 1))
    assert state(Role.TRAINING, 2) == ZeroState(580_608, 483_840)
    assert state(Role.TRAINING, 3) == ZeroState(580_608, 515_072)
    # forward-only: a replica per DP rank (z = 2) or a shard and the gathered layers (z = 3)
    assert state(Role.INFERENCE, 2) == ZeroState(2 * n_s, 0.0)
    assert state(Role.INFERENCE, 3) == ZeroState(2 * n_s / 4, 2 * n_g)
    assert state(Role.GENERATION, 2) == ZeroState(2 * n_s, 0.0)
    # a scalar head: N_s = 65536 + 64000 + 64, the root unit 64064
    assert state(Role.INFERENCE, 3, Head.SCALAR) == ZeroState(
        2 * (65_536 + 64_064) / 4, 2 * (32_768 + 64_064)
    )
    # with pipelining the root unit is the worst stage's embedding or head:
    # (2, 2, 2): N_s = 2·32768/2 + 64000 = 96768, N_g = 32768 + 64000 = 96768
    z3 = zero_state_bytes(TINY, Role.INFERENCE, make_layout(2, 2, 2, 2, zero=3))
    assert z3 == ZeroState(2 * 96_768 / 2, 2 * 96_768)


def test_zero_stages_in_the_transient_memory_by_hand():
    # (4, 1, 2), mb = 1, 16 sequences of 32 tokens: b = 4, T_mb = 128
    n_s, n_g = 193_536, 160_768
    # training under full recomputation: c = ⌊√4⌋ = 2, 4/2 checkpoints of d + 2 layers of 320
    acts = 2 * 1 * 4 * 32 * (2 * 64 + 2 * 320)
    logits = 2 * 4 * 128 * 1000 / 2
    for zero, state in ((1, 4 * n_s), (2, 2 * n_s + 2 * n_s / 4), (3, 4 * n_s / 4 + 2 * n_g)):
        lay = make_layout(4, 1, 2, 1, zero=zero)
        assert transient_bytes(TINY, Role.TRAINING, lay, **SEQ) == pytest.approx(acts + logits + state)
    # inference on z = 3: buffer + logits + the gathered layers; with the weights, the shard
    lay = make_layout(4, 1, 2, 1, zero=3)
    expected = 2 * 128 * 320 + 4 * 128 * 1000 / 2 + 2 * n_g
    assert transient_bytes(TINY, Role.INFERENCE, lay, **SEQ) == pytest.approx(expected)
    got = transient_bytes(TINY, Role.INFERENCE, lay, **SEQ, include_weights=True)
    assert got == pytest.approx(expected + 2 * n_s / 4)


def _small_gpu(kv_memory_fraction: float = 0.5):
    """A GPU of 10⁸ bytes whose rollout engine takes ``kv_memory_fraction`` of it by default."""
    return dataclasses.replace(
        hardware_preset("h100"), gpu_memory_bytes=1e8, kv_memory_fraction=kv_memory_fraction
    )


def test_kv_budget_tokens_by_hand():
    hw = _small_gpu()
    layout = make_layout(dp=1, pp=2, tp=2, mb=2)
    # κ = 2·sb·(L/Pp)·d_kv,local = 2·2·2·(4/2·16) = 256 bytes per token
    assert kv_bytes_per_token(TINY, layout) == 256
    # workspace: one step of 8192 tokens through max(320, 256) + FP32 logits of 1024 positions
    assert (ROLLOUT_BATCH_TOKENS, ROLLOUT_MAX_SEQS) == (8192, 1024)
    workspace = 2 * 8192 * 320 + 4 * 1024 * 1000 / 2
    assert engine_workspace_bytes(TINY, layout) == workspace == 7_290_880
    weights = 96_768 * 2
    # u = 0.5 (the hardware's default): (0.5·10⁸ − 193536 − 7290880)/256 = 166076.5 tokens
    assert kv_budget_tokens(TINY, layout, hw) == pytest.approx((0.5e8 - weights - workspace) / 256)
    assert kv_budget_tokens(TINY, layout, hw) == pytest.approx(166_076.5)
    # the strategy's fraction overrides it: u = 0.1
    lay01 = make_layout(dp=1, pp=2, tp=2, mb=2, mem_fraction=0.1)
    assert kv_budget_tokens(TINY, lay01, hw) == pytest.approx((1e7 - weights - workspace) / 256)
    # a scalar head samples no logits: the workspace is the block buffer alone
    got = kv_budget_tokens(TINY, layout, hw, Head.SCALAR)
    assert got == pytest.approx((0.5e8 - weights - 2 * 8192 * 320) / 256)
    # a fraction too small for the weights and workspace leaves a negative budget
    assert kv_budget_tokens(TINY, make_layout(1, 2, 2, 2, mem_fraction=0.05), hw) < 0


def test_generation_engine_bytes_by_hand():
    hw = _small_gpu()
    layout = make_layout(dp=1, pp=2, tp=2, mb=2)
    weights, workspace = 96_768 * 2, 7_290_880
    lengths = {"prompt_len": 24, "response_len": 8}
    # the engine holds u·M_GPU = 0.5·10⁸ per device, whatever the batch
    assert generation_engine_bytes(TINY, layout, hw, **lengths) == 5e7
    # u = 0.05 leaves less than one 32-token sequence: the least the engine starts with,
    # weights + workspace + κ·(Lp + Lr) = 193536 + 7290880 + 256·32 = 7492608
    small = make_layout(dp=1, pp=2, tp=2, mb=2, mem_fraction=0.05)
    least = weights + workspace + 256 * 32
    assert generation_engine_bytes(TINY, small, hw, **lengths) == least == 7_492_608
    # transient_bytes with the hardware: the engine less its weights, independent of the batch
    for n in (16, 1600):
        got = transient_bytes(TINY, Role.GENERATION, layout, sequences=n, **lengths, hardware=hw)
        assert got == 5e7 - weights
        got = transient_bytes(TINY, Role.GENERATION, small, sequences=n, **lengths, hardware=hw)
        assert got == least - weights
    got = transient_bytes(TINY, Role.GENERATION, layout, **SEQ, hardware=hw, include_weights=True)
    assert got == 5e7


def test_gqa_kv_heads_are_replicated_not_split_below_one_head():
    gqa = dataclasses.replace(TINY, name="gqa", kv_heads=2)
    assert gqa.kv_width == 32
    assert kv_width_per_device(gqa, 1) == 32
    assert kv_width_per_device(gqa, 2) == 16
    assert kv_width_per_device(gqa, 4) == 16  # one whole head of 16 per rank, not 32/4 = 8
    llama70 = model_preset("llama2-70b")  # 8 KV heads of 128
    assert kv_width_per_device(llama70, 8) == 128
    assert kv_width_per_device(llama70, 2) == 512


def test_longer_responses_need_more_kv_cache():
    model = model_preset("llama3.1-8b")
    layout = make_layout(dp=1, pp=1, tp=2, mb=1)
    sizes = [
        transient_bytes(model, Role.GENERATION, layout, sequences=64, prompt_len=512, response_len=lr)
        for lr in (128, 1024, 4096)
    ]
    assert sizes[0] < sizes[1] < sizes[2]
    # the paged engine (with the hardware) holds u·M_GPU whatever the response length
    h100 = hardware_preset("h100")
    paged = {
        transient_bytes(
            model, Role.GENERATION, layout, sequences=64, prompt_len=512, response_len=lr, hardware=h100
        )
        for lr in (128, 1024, 4096)
    }
    assert paged == {0.9 * h100.gpu_memory_bytes - weight_bytes(model, layout)}


def test_more_dp_less_training_state():
    model = model_preset("llama2-13b")
    states = [training_state_bytes(model, make_layout(dp=dp, pp=2, tp=4, mb=2)) for dp in (1, 2, 4)]
    assert states[0] > states[1] > states[2]
    assert states[0] == pytest.approx(2 * states[1])


def test_more_tp_and_pp_smaller_shards():
    model = model_preset("llama2-13b")
    assert weight_shard_params(model, 1, 1) > weight_shard_params(model, 1, 2)
    assert weight_shard_params(model, 1, 2) > weight_shard_params(model, 2, 2)


def test_llama2_70b_training_does_not_fit_one_a100_40gb():
    a100 = hardware_preset("a100-40gb")
    model = model_preset("llama2-70b")
    layout = make_layout(dp=1, pp=1, tp=1, mb=1)
    state = training_state_bytes(model, layout)
    transient = transient_bytes(model, Role.TRAINING, layout, sequences=1, prompt_len=128, response_len=128)
    assert state + transient > a100.m_eff
    # not even the BF16 weights alone fit
    assert weight_bytes(model, layout) > a100.m_eff


def test_llama2_7b_inference_fits_one_h100():
    h100 = hardware_preset("h100")
    model = model_preset("llama2-7b")
    layout = make_layout(dp=1, pp=1, tp=1, mb=1)
    need = transient_bytes(
        model,
        Role.INFERENCE,
        layout,
        sequences=8,
        prompt_len=512,
        response_len=512,
        include_weights=True,
    )
    assert 13e9 < need < h100.m_eff


def test_bad_arguments():
    with pytest.raises(ValueError, match="tp must be a positive integer"):
        weight_shard_params(TINY, 1, 0)
    with pytest.raises(ValueError, match="sequences"):
        transient_bytes(
            TINY, Role.INFERENCE, make_layout(1, 1, 1, 1), sequences=-2, prompt_len=1, response_len=1
        )

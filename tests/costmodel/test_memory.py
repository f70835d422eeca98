"""Per-device memory against hand-computed numbers (SPEC §6).

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
from rpeg.ir.models import ModelSpec, model_preset
from rpeg.ir.plan import Strategy
from rpeg.ir.types import Head, Role


def make_layout(
    dp: int, pp: int, tp: int, mb: int, pp_tier: int = 0, dp_tier: int = 0, gpus_per_node: int = 8
) -> Layout:
    """The cost model's :class:`Layout` of bare degrees (the strategy's extent is not priced)."""
    return Layout(Strategy((1, 1, dp * pp * tp), dp, pp, tp, mb, pp_tier, dp_tier), gpus_per_node)


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
    expected = activations + weights + weights / 2
    assert transient_bytes(TINY, Role.TRAINING, layout, **SEQ) == pytest.approx(expected)
    assert expected == 404_992
    # include_weights does not double count for training
    assert transient_bytes(TINY, Role.TRAINING, layout, **SEQ, include_weights=True) == expected


def test_checkpoint_interval_is_floor_sqrt_layers_per_stage():
    deep = dataclasses.replace(TINY, name="deep", layers=16)
    layout = make_layout(dp=1, pp=1, tp=1, mb=1)
    # c = 4: 16/4 checkpoints of d plus a 4-layer buffer of max(512, 384) per token
    activations = 2 * 1 * 1 * 32 * (4 * 64 + 4 * 512)
    weights = (16 * 32768 + 128_000) * 2
    got = transient_bytes(deep, Role.TRAINING, layout, sequences=1, prompt_len=24, response_len=8)
    assert got == pytest.approx(activations + weights + weights)
    # L/Pp = 8: c = ⌊√8⌋ = 2 (not 3), 8/2 checkpoints plus a 2-layer buffer
    eight = dataclasses.replace(TINY, name="eight", layers=8)
    activations = 2 * 32 * (4 * 64 + 2 * 512)
    weights = (8 * 32768 + 128_000) * 2
    got = transient_bytes(eight, Role.TRAINING, layout, sequences=1, prompt_len=24, response_len=8)
    assert got == pytest.approx(activations + 2 * weights)


def test_inference_transient_by_hand():
    layout = make_layout(dp=2, pp=1, tp=2, mb=2)
    # b = 4, ℓ = 32, widest intermediate: max(320, 256, d + V = 1064)
    assert transient_bytes(TINY, Role.INFERENCE, layout, **SEQ) == 2 * 4 * 32 * 1064
    # a scalar head needs only d + 1: the attention buffer (320) is widest
    assert transient_bytes(TINY, Role.INFERENCE, layout, **SEQ, head=Head.SCALAR) == (2 * 4 * 32 * 320)
    with_weights = transient_bytes(TINY, Role.INFERENCE, layout, **SEQ, include_weights=True)
    assert with_weights == 2 * 4 * 32 * 1064 + (65_536 + 128_000) * 2


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

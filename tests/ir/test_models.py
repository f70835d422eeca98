"""Model presets and Hugging Face config loading (SPEC §2)."""

import json

import numpy as np
import pytest

from rpeg.cli import main
from rpeg.ir.errors import InputError
from rpeg.ir.models import (
    HF_ARCHITECTURES,
    MAX_FFN_HIDDEN,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_LAYERS,
    MAX_VOCAB,
    MAX_WINDOW,
    MODEL_PRESETS,
    ModelSpec,
    ModelSpecFile,
    model_preset,
)

# Published parameter totals.
PUBLISHED = {
    "llama2-7b": 6.74e9,
    "llama2-13b": 13.0e9,
    "llama2-34b": 33.7e9,  # Code Llama 34B shape
    "llama2-70b": 68.98e9,
    "llama3.1-8b": 8.03e9,
    "llama3.3-70b": 70.6e9,
    "gpt3-175b": 175e9,
    # Qwen2.5 model cards: 7.61B (7B and Math-7B), 32.5B
    "qwen2.5-7b": 7.61e9,
    "qwen2.5-math-7b": 7.61e9,
    "qwen2.5-32b": 32.5e9,
    # mixture of experts, model cards (totals; the active counts: MOE_PUBLISHED)
    "qwen3-30b-a3b": 30.5e9,
    "qwen3-235b-a22b": 235e9,
    "mixtral-8x7b": 46.7e9,
    "deepseek-v3": 671e9,
    # OpenAI's gpt-oss model card (Table 1): 20.91B and 116.83B total
    "gpt-oss-20b": 20.91e9,
    "gpt-oss-120b": 116.83e9,
}

#: Published (total, active) parameters of the MoE presets and the tolerance of the active count:
#: Qwen3 model cards (30.5B / 3.3B, 235B / 22B) and Mistral's Mixtral announcement (46.7B /
#: 12.9B). 1%, except Qwen3-30B-A3B's "3.3B", given to two digits: the count is 3.353B (2.730B in
#: the blocks, 0.622B in the untied embeddings), which the card truncates; 2% covers that digit.
MOE_PUBLISHED = {
    "qwen3-30b-a3b": (30.5e9, 3.3e9, 0.02),
    "qwen3-235b-a22b": (235e9, 22e9, 0.01),
    "mixtral-8x7b": (46.7e9, 12.9e9, 0.01),
    # DeepSeek-V3 report: 671B / "37B activated", two digits: the count is 37.55B (1.85B of it the
    # embedding and the head), truncated by the report as Qwen3-30B-A3B's is
    "deepseek-v3": (671e9, 37e9, 0.02),
}

# config.json of meta-llama/Llama-3.1-8B (field values as published).
LLAMA31_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}


def _shape(spec: ModelSpec) -> dict:
    d = spec.to_dict()
    del d["name"]
    return d


@pytest.mark.parametrize(("name", "total"), sorted(PUBLISHED.items()))
def test_preset_parameter_counts_match_published_totals(name, total):
    assert model_preset(name).params == pytest.approx(total, rel=0.02)


def test_every_preset_is_checked():
    assert set(MODEL_PRESETS) == set(PUBLISHED)


def test_gqa_layer_params_by_hand():
    m = model_preset("llama3.1-8b")
    # 2·d·d_q + 2·d·d_kv + 3·d·dff with d_kv = 8·128 = 1024
    assert m.kv_width == 1024
    assert m.layer_params == 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    assert m.layer_params == 218_103_808
    # L·(W_layer + 2d) + V·d (embedding) + d (final norm) + V·d (untied head)
    assert m.params == 32 * (218_103_808 + 8192) + 2 * 128256 * 4096 + 4096


def test_plain_mha_layer_params_is_spec_form():
    m = model_preset("llama2-7b")
    d, dff = 4096, 11008
    assert m.layer_params == 4 * d * d + 3 * d * dff


def test_aliases_and_case():
    assert model_preset("70B") is model_preset("llama2-70b")
    assert model_preset("8b") is model_preset("llama3.1-8b")
    assert ModelSpec.preset("7b") is model_preset("llama2-7b")


def test_unknown_preset_lists_known_names():
    with pytest.raises(ValueError, match="unknown model preset 'llama9'") as err:
        model_preset("llama9")
    for name in MODEL_PRESETS:
        assert name in str(err.value)


def test_from_hf_config_llama31_8b(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA31_8B_CONFIG))
    spec = ModelSpec.from_hf_config(path, name="llama3.1-8b")
    assert spec == model_preset("llama3.1-8b")
    # a directory works too, and the name defaults to the model type
    from_dir = ModelSpec.from_hf_config(tmp_path)
    assert _shape(from_dir) == _shape(model_preset("llama3.1-8b"))
    assert from_dir.name == "llama"


def test_from_hf_config_gpt2_spelling(tmp_path):
    cfg = {
        "model_type": "gpt2",
        "n_layer": 12,
        "n_embd": 768,
        "n_head": 12,
        "vocab_size": 50257,
        "activation_function": "gelu_new",
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = ModelSpec.from_hf_config(tmp_path, name="gpt2")
    assert (spec.layers, spec.hidden, spec.ffn_hidden, spec.ffn_projections) == (12, 768, 3072, 2)
    assert spec.tied_embeddings and spec.kv_heads == 12 and spec.head_dim == 64
    # the GPT-2 small total: 124.4M parameters
    assert spec.params == pytest.approx(124.4e6, rel=0.01)


@pytest.mark.parametrize("field", ["num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads"])
def test_from_hf_config_missing_field_is_named(tmp_path, field):
    cfg = dict(LLAMA31_8B_CONFIG)
    del cfg[field]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f"missing config field.*{field}"):
        ModelSpec.from_hf_config(tmp_path)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("num_hidden_layers", 0, "'num_hidden_layers' must be a positive integer, got 0"),
        ("vocab_size", -5, "'vocab_size' must be a positive integer, got -5"),
        ("hidden_size", "big", "'hidden_size' must be a positive integer, got 'big'"),
        ("num_hidden_layers", 32.5, "'num_hidden_layers' must be a positive integer, got 32.5"),
        ("tie_word_embeddings", "yes", "'tie_word_embeddings' must be true or false"),
        ("num_key_value_heads", 5, "heads=32 is not a multiple of kv_heads=5"),
        ("hidden_size", 4100, "hidden=4100 is not divisible by heads=32"),
    ],
)
def test_from_hf_config_invalid_field_is_named(tmp_path, key, value, message):
    cfg = dict(LLAMA31_8B_CONFIG, **{key: value})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match=message) as info:
        ModelSpec.from_hf_config(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value)  # the file is named


def test_from_hf_config_missing_or_malformed_file_is_named(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        ModelSpec.from_hf_config(tmp_path / "nowhere" / "config.json")
    with pytest.raises(InputError, match="does not exist"):
        ModelSpec.from_hf_config(tmp_path / "empty-dir")  # neither a dir nor a file
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        ModelSpec.from_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(InputError, match="must be a JSON object"):
        ModelSpec.from_hf_config(tmp_path)


@pytest.mark.parametrize(
    ("field", "value"),
    [("layers", 0), ("hidden", 1.5), ("ffn_projections", 4), ("dtype_bytes", 3), ("head_dim", -1)],
)
def test_invalid_spec_field_is_named(field, value):
    kwargs = dict(name="bad", layers=2, hidden=64, ffn_hidden=128, vocab=100, heads=4, kv_heads=4)
    kwargs[field] = value
    with pytest.raises(ValueError, match=field):
        ModelSpec(**kwargs)


def test_to_dict_round_trip_and_scaled():
    m = model_preset("llama2-13b")
    assert ModelSpec(**m.to_dict()) == m
    small = m.scaled(layers=2, hidden=256, heads=4)
    assert (small.layers, small.hidden, small.heads, small.kv_heads) == (2, 256, 4, 4)
    assert small.ffn_hidden == round(256 * 13824 / 5120)
    assert small.vocab == m.vocab


# Mixture-of-experts and MLA configs: published config.json fields of each family (abridged to
# the shape fields and the fields that reveal the family).
QWEN3_30B_A3B_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 151936,
}

MIXTRAL_8X7B_CONFIG = {
    "architectures": ["MixtralForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}

DEEPSEEK_V3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "tie_word_embeddings": False,
    "topk_group": 4,
    "torch_dtype": "bfloat16",
    "v_head_dim": 128,
    "vocab_size": 129280,
}

# config.json of openai/gpt-oss-20b (no torch_dtype: bfloat16; the experts stored in MXFP4)
GPT_OSS_20B_CONFIG = {
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initial_context_length": 4096,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072,
    "model_type": "gpt_oss",
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "quantization_config": {
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
        "quant_method": "mxfp4",
    },
    "rms_norm_eps": 1e-05,
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "vocab_size": 201088,
}
# openai/gpt-oss-120b: 36 layers of 128 experts, the rest as the 20b's
GPT_OSS_120B_CONFIG = dict(
    GPT_OSS_20B_CONFIG,
    layer_types=["sliding_attention", "full_attention"] * 18,
    num_hidden_layers=36,
    num_local_experts=128,
)

# the text model of meta-llama/Llama-4-Scout-17B-16E (its text_config): chunked attention
LLAMA4_SCOUT_TEXT_CONFIG = {
    "attention_chunk_size": 8192,
    "head_dim": 128,
    "hidden_size": 5120,
    "interleave_moe_layer_step": 1,
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "model_type": "llama4_text",
    "num_attention_heads": 40,
    "num_experts_per_tok": 1,
    "num_hidden_layers": 48,
    "num_key_value_heads": 8,
    "num_local_experts": 16,
    "vocab_size": 202048,
}

#: MoE architectures rpeg does not read yet: config, the field that counts experts and its value.
UNREAD_MOE_CONFIGS = {
    "llama4-scout": (LLAMA4_SCOUT_TEXT_CONFIG, "num_local_experts", 16, "chunked-attention layers"),
}


def _refused(tmp_path, cfg) -> InputError:
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="mixture-of-experts") as info:
        ModelSpec.from_hf_config(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value)  # the file is named
    assert "misread as a dense model" in str(info.value)
    assert info.value.source == str(tmp_path / "config.json")
    return info.value


@pytest.mark.parametrize("family", sorted(UNREAD_MOE_CONFIGS))
def test_from_hf_config_refuses_moe_architectures_it_does_not_read(tmp_path, family):
    cfg, _, _, why = UNREAD_MOE_CONFIGS[family]
    err = _refused(tmp_path, cfg)
    assert f"field 'model_type' = {cfg['model_type']!r}" in str(err)
    assert why in str(err) and "not modelled yet" in str(err)
    assert err.field == "model_type"
    err = _refused(tmp_path, dict(QWEN3_30B_A3B_CONFIG, model_type="olmoe"))
    assert (
        "rpeg reads the mixture-of-experts architectures deepseek_v2, deepseek_v3, glm4_moe, gpt_oss, "
        "mixtral, qwen2_moe, qwen3_moe" in str(err)
    )


@pytest.mark.parametrize(
    "family", [*sorted(UNREAD_MOE_CONFIGS), "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3", "gpt-oss-20b"]
)
def test_from_hf_config_refuses_experts_under_any_model_type(tmp_path, family):
    # an unknown (or dense-looking) model_type does not hide the experts
    cfg, field, value = {
        **{k: v[:3] for k, v in UNREAD_MOE_CONFIGS.items()},
        "qwen3-30b-a3b": (QWEN3_30B_A3B_CONFIG, "num_experts", 128),
        "mixtral-8x7b": (MIXTRAL_8X7B_CONFIG, "num_local_experts", 8),
        "deepseek-v3": (DEEPSEEK_V3_CONFIG, "n_routed_experts", 256),
        "gpt-oss-20b": (GPT_OSS_20B_CONFIG, "num_local_experts", 32),
    }[family]
    for model_type in ("my_new_arch", "llama"):
        err = _refused(tmp_path, dict(cfg, model_type=model_type))
        assert f"field {field!r} = {value}" in str(err)
        assert err.field == field


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("num_experts", 64),
        ("num_local_experts", 16),
        ("n_routed_experts", 160),
        ("moe_num_experts", 64),
        ("num_experts_per_tok", 2),
        ("experts_per_token", 4),
        ("num_experts", [1, 64, 64]),  # per-layer counts
    ],
)
def test_from_hf_config_refuses_each_expert_field(tmp_path, key, value):
    err = _refused(tmp_path, dict(LLAMA31_8B_CONFIG, **{key: value}))
    assert f"field {key!r} = {value!r}" in str(err)


def test_from_hf_config_refuses_nested_experts_and_moe_in_the_type(tmp_path):
    # DBRX counts its experts in ffn_config
    nested = dict(LLAMA31_8B_CONFIG, model_type="x", ffn_config={"moe_num_experts": 16, "moe_top_k": 4})
    err = _refused(tmp_path, nested)
    assert "field 'ffn_config.moe_num_experts' = 16" in str(err)
    assert err.field == "ffn_config.moe_num_experts"
    # an unlisted MoE architecture that says so in its name
    err = _refused(tmp_path, dict(LLAMA31_8B_CONFIG, model_type="future_moe"))
    assert "field 'model_type' = 'future_moe'" in str(err)


@pytest.mark.parametrize(("key", "value"), [("kv_lora_rank", 512), ("q_lora_rank", 1536)])
def test_from_hf_config_refuses_mla(tmp_path, key, value):
    # a dense model with multi-head latent attention (MiniCPM3-like)
    (tmp_path / "config.json").write_text(json.dumps(dict(LLAMA31_8B_CONFIG, **{key: value})))
    with pytest.raises(
        InputError, match=f"field {key!r} = {value} marks multi-head latent attention"
    ) as info:
        ModelSpec.from_hf_config(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value)
    assert "not supported yet" in str(info.value)
    assert info.value.field == key


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"num_experts": 1},
        {"num_experts": None, "num_experts_per_tok": 1},
        {"num_local_experts": 1, "num_experts_per_tok": 1},
        {"n_routed_experts": None, "kv_lora_rank": None, "q_lora_rank": None},
        {"num_experts": 0},
    ],
)
def test_from_hf_config_dense_with_trivial_expert_fields_still_read(tmp_path, extra):
    (tmp_path / "config.json").write_text(json.dumps(dict(LLAMA31_8B_CONFIG, **extra)))
    assert ModelSpec.from_hf_config(tmp_path, name="llama3.1-8b") == model_preset("llama3.1-8b")


@pytest.mark.parametrize("model_type", ["qwen2", "mistral"])
def test_from_hf_config_dense_families_still_read(tmp_path, model_type):
    (tmp_path / "config.json").write_text(json.dumps(dict(LLAMA31_8B_CONFIG, model_type=model_type)))
    spec = ModelSpec.from_hf_config(tmp_path)
    assert spec.family == model_type
    assert _shape(spec) == dict(_shape(model_preset("llama3.1-8b")), family=model_type)


# ------------------------------------------------------------------ bounds and exact types (issue 33)
SMALL = dict(name="s", layers=2, hidden=64, ffn_hidden=128, vocab=100, heads=4, kv_heads=4)
LIMITS = {
    "layers": MAX_LAYERS,
    "hidden": MAX_HIDDEN,
    "ffn_hidden": MAX_FFN_HIDDEN,
    "vocab": MAX_VOCAB,
    "heads": MAX_HEADS,
    "kv_heads": MAX_HEADS,
    "head_dim": MAX_HEAD_DIM,
}


@pytest.mark.parametrize("field", sorted(LIMITS))
@pytest.mark.parametrize("excess", [1, 2**63 - 1, 10**200], ids=["bound+1", "2**63-1", "10**200"])
def test_every_figure_has_an_upper_bound(field, excess):
    value = excess if excess > 1 else LIMITS[field] + 1
    kwargs = dict(SMALL, **{field: value})
    with pytest.raises(ValueError, match=rf"ModelSpec 's': {field} = \S+.* is above MAX_"):
        ModelSpec(**kwargs)


def test_the_bounds_admit_the_largest_published_models():
    # Llama-3.1-405B, PaLM-540B, MT-NLG 530B, Falcon-180B's heads, Gemma-3's vocabulary
    ModelSpec("llama3.1-405b", 126, 16384, 53248, 128256, 128, 8)
    ModelSpec("palm-540b", 118, 18432, 73728, 256000, 48, 1, head_dim=256)
    ModelSpec("mt-nlg-530b", 105, 20480, 81920, 51200, 128, 128)
    ModelSpec("falcon-180b", 80, 14848, 59392, 65024, 232, 8, head_dim=64)
    ModelSpec("gemma3-27b", 62, 5376, 21504, 262208, 32, 16, head_dim=128)
    # and every figure at its bound at once
    ModelSpec("max", MAX_LAYERS, MAX_HIDDEN, MAX_FFN_HIDDEN, MAX_VOCAB, MAX_HEADS, MAX_HEADS, MAX_HEAD_DIM)


def test_a_bound_names_the_field_for_a_huge_integer_without_printing_it():
    with pytest.raises(ValueError, match=r"hidden = an integer of about \d+ digits is above MAX_HIDDEN"):
        ModelSpec(**dict(SMALL, hidden=10**200))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dtype_bytes", 2.0),
        ("dtype_bytes", True),
        ("ffn_projections", 3.0),
        ("layers", 2.0),
        ("vocab", 100.0),
        ("kv_heads", 4.0),
        ("head_dim", 0.0),
        ("head_dim", 16.0),
        ("head_dim", False),
    ],
)
def test_integer_fields_refuse_floats_and_bools(field, value):
    with pytest.raises(ValueError, match=rf"ModelSpec 's': {field} must be .*got {value!r}"):
        ModelSpec(**dict(SMALL, **{field: value}))


def test_numpy_integers_are_stored_as_int():
    spec = ModelSpec(
        **{k: np.int64(v) if isinstance(v, int) else v for k, v in SMALL.items()}, dtype_bytes=np.int32(2)
    )
    assert spec == ModelSpec(**SMALL)
    assert all(type(getattr(spec, f)) is int for f in (*LIMITS, "dtype_bytes", "ffn_projections"))


def test_from_hf_config_huge_figure_is_named(tmp_path, capsys):
    # json reads 10**200 as an int; it overflowed float arithmetic in the cost model (a traceback)
    (tmp_path / "config.json").write_text(
        json.dumps(LLAMA31_8B_CONFIG).replace('"hidden_size": 4096', '"hidden_size": ' + "1" + "0" * 200)
    )
    with pytest.raises(
        InputError,
        match=r"config\.json: field 'hidden_size' = an integer of about \d+ digits is above MAX_HIDDEN",
    ) as info:
        ModelSpec.from_hf_config(tmp_path)
    assert info.value.field == "hidden_size"
    workload = tmp_path / "w.toml"
    workload.write_text(
        'algorithm = "grpo"\n[batch]\nprompts = 8\nrollouts = 2\nprompt_len = 16\nresponse_len = 16\n'
        f'[models]\nactor = "{tmp_path / "config.json"}"\nreward = "llama2-7b"\n'
    )
    assert main(["solve", str(workload), "--method", "greedy"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "models.actor" in err and "'hidden_size'" in err


# ------------------------------------------------------------------ Hugging Face architectures (issue 33)
# Published config.json fields (abridged to those read and those that reveal the architecture).
GPT2_CONFIG = {  # openai-community/gpt2: no tie_word_embeddings (GPT2Config's default: tied)
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "vocab_size": 50257,
}
GEMMA_2B_CONFIG = {  # google/gemma-2b: gelu, a gated MLP; no tie_word_embeddings (tied)
    "architectures": ["GemmaForCausalLM"],
    "head_dim": 256,
    "hidden_act": "gelu",
    "hidden_size": 2048,
    "intermediate_size": 16384,
    "model_type": "gemma",
    "num_attention_heads": 8,
    "num_hidden_layers": 18,
    "num_key_value_heads": 1,
    "torch_dtype": "bfloat16",
    "vocab_size": 256000,
}
GEMMA_7B_CONFIG = dict(  # google/gemma-7b: head_dim 256 ≠ 3072/16
    GEMMA_2B_CONFIG, hidden_size=3072, intermediate_size=24576, num_attention_heads=16,
    num_hidden_layers=28, num_key_value_heads=16,
)  # fmt: skip
QWEN3_8B_CONFIG = {  # Qwen/Qwen3-8B
    "architectures": ["Qwen3ForCausalLM"],
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}
QWEN3_06B_CONFIG = dict(  # Qwen/Qwen3-0.6B: head_dim 128 ≠ 1024/16, tied
    QWEN3_8B_CONFIG, hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
    num_hidden_layers=28, tie_word_embeddings=True,
)  # fmt: skip
OPT_125M_CONFIG = {  # facebook/opt-125m: no tie_word_embeddings (tied)
    "activation_function": "relu",
    "ffn_dim": 3072,
    "hidden_size": 768,
    "model_type": "opt",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "torch_dtype": "float16",
    "vocab_size": 50272,
    "word_embed_proj_dim": 768,
}
PYTHIA_160M_CONFIG = {  # EleutherAI/pythia-160m
    "hidden_act": "gelu",
    "hidden_size": 768,
    "intermediate_size": 3072,
    "model_type": "gpt_neox",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "vocab_size": 50304,
}
PHI3_MINI_CONFIG = {  # microsoft/Phi-3-mini-4k-instruct
    "hidden_act": "silu",
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "model_type": "phi3",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "sliding_window": 2047,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32064,
}
# Gemma-2 and Gemma-3: sliding-window layers (abridged to the fields read and those that reveal
# the architecture; no torch_dtype: bfloat16). google/gemma-2-2b, -9b, -27b: a 4,096-token window
# on every other layer (Gemma2Config's default layer_types), tied embeddings.
GEMMA2_2B_CONFIG = {
    "architectures": ["Gemma2ForCausalLM"],
    "attn_logit_softcapping": 50.0,
    "cache_implementation": "hybrid",
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "model_type": "gemma2",
    "num_attention_heads": 8,
    "num_hidden_layers": 26,
    "num_key_value_heads": 4,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "vocab_size": 256000,
}
GEMMA2_9B_CONFIG = dict(
    GEMMA2_2B_CONFIG, hidden_size=3584, intermediate_size=14336, num_attention_heads=16,
    num_hidden_layers=42, num_key_value_heads=8,
)  # fmt: skip
GEMMA2_27B_CONFIG = dict(
    GEMMA2_2B_CONFIG, head_dim=128, hidden_size=4608, intermediate_size=36864, num_attention_heads=32,
    num_hidden_layers=46, num_key_value_heads=16, query_pre_attn_scalar=144,
)  # fmt: skip
# google/gemma-3-1b-pt: a 512-token window on five layers of six (sliding_window_pattern)
GEMMA3_1B_CONFIG = {
    "architectures": ["Gemma3ForCausalLM"],
    "cache_implementation": "hybrid",
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 26,
    "num_key_value_heads": 1,
    "query_pre_attn_scalar": 256,
    "rope_local_base_freq": 10000,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "torch_dtype": "bfloat16",
    "vocab_size": 262144,
}
# google/gemma-3-27b-it: the image-text model, its language model in text_config (the fields that
# differ from Gemma3TextConfig's defaults)
GEMMA3_27B_CONFIG = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "head_dim": 128,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "model_type": "gemma3_text",
        "num_attention_heads": 32,
        "num_hidden_layers": 62,
        "num_key_value_heads": 16,
        "query_pre_attn_scalar": 168,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
    },
}

# (config, read shape (projections, tied, head_dim, kv_heads), exact count by the ModelSpec
# formula, published total, tolerance): biases and learned position embeddings are not counted
HF_CASES = {
    "gpt2-124m": (GPT2_CONFIG, (2, True, 64, 12), 123_551_232, 124_439_808, 0.01),
    "gemma-2b": (GEMMA_2B_CONFIG, (3, True, 256, 1), 2_506_172_416, 2_506_172_416, 0),
    "gemma-7b": (GEMMA_7B_CONFIG, (3, True, 256, 16), 8_537_680_896, 8_537_680_896, 0),
    "gemma-7b, no head_dim": (dict(GEMMA_7B_CONFIG, head_dim=None), (3, True, 256, 16), 8_537_680_896, 8_537_680_896, 0),
    "qwen3-8b": (QWEN3_8B_CONFIG, (3, False, 128, 8), 8_190_726_144, 8.19e9, 0.001),
    "qwen3-0.6b, no head_dim": ({k: v for k, v in QWEN3_06B_CONFIG.items() if k != "head_dim"}, (3, True, 128, 8), 596_042_752, 0.6e9, 0.01),
    "opt-125m": (OPT_125M_CONFIG, (2, True, 64, 12), 123_562_752, 125_239_296, 0.015),
    "pythia-160m": (PYTHIA_160M_CONFIG, (2, False, 64, 12), 162_220_800, 162_322_944, 0.001),
    "phi-3-mini": (PHI3_MINI_CONFIG, (3, False, 96, 32), 3_821_079_552, 3.82e9, 0.001),
    # published: the safetensors totals, which count Gemma-2/3's four norms per block (and
    # Gemma-3's QK-norms): 2d (+ 2·head_dim) per block more than the two norms counted here
    "gemma-2-2b": (GEMMA2_2B_CONFIG, (3, True, 256, 4), 2_614_222_080, 2_614_341_888, 1e-4),
    "gemma-2-9b": (GEMMA2_9B_CONFIG, (3, True, 256, 8), 9_241_404_928, 9_241_705_984, 1e-4),
    "gemma-2-27b": (GEMMA2_27B_CONFIG, (3, True, 128, 16), 27_226_704_384, 27_227_128_320, 1e-4),
    "gemma-3-1b": (GEMMA3_1B_CONFIG, (3, True, 256, 1), 999_812_736, 999_885_952, 1e-4),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_from_hf_config_reads_each_architecture_as_transformers(tmp_path, case):
    cfg, (projections, tied, head_dim, kv_heads), exact, published, rel = HF_CASES[case]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = ModelSpec.from_hf_config(tmp_path)
    assert (spec.ffn_projections, spec.tied_embeddings, spec.head_dim, spec.kv_heads) == (
        projections,
        tied,
        head_dim,
        kv_heads,
    )
    assert spec.params == exact
    assert spec.params == pytest.approx(published, rel=rel)
    assert spec.family in ("llama", "qwen2", "mistral")  # non-runtime architectures plan as "llama"


@pytest.mark.parametrize(
    ("model_type", "extra", "projections"),
    [
        ("llama", {"hidden_act": "gelu"}, 3),  # gated by the architecture, not the activation
        ("mistral", {"hidden_act": "relu"}, 3),
        ("gpt_neox", {"hidden_act": "silu"}, 2),
    ],
)
def test_ffn_gating_is_the_architectures(tmp_path, model_type, extra, projections):
    cfg = dict(LLAMA31_8B_CONFIG, model_type=model_type, **extra)
    del cfg["num_key_value_heads"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert ModelSpec.from_hf_config(tmp_path).ffn_projections == projections


@pytest.mark.parametrize(
    ("model_type", "kv_heads"), [("llama", 32), ("mistral", 8), ("qwen2", 32), ("phi3", 32), ("gpt_neox", 32)]
)
def test_absent_kv_heads_read_as_the_config_class_default(tmp_path, model_type, kv_heads):
    cfg = {k: v for k, v in LLAMA31_8B_CONFIG.items() if k != "num_key_value_heads"}
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, model_type=model_type)))
    assert ModelSpec.from_hf_config(tmp_path).kv_heads == kv_heads
    (tmp_path / "config.json").write_text(
        json.dumps(dict(cfg, model_type=model_type, num_key_value_heads=None))
    )
    assert ModelSpec.from_hf_config(tmp_path).kv_heads == 32  # null: the query heads


def test_architecture_table_names_its_sources():
    assert set(HF_ARCHITECTURES) >= {
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "gemma",
        "phi3",
        "gpt2",
        "opt",
        "gpt_neox",
    }
    for arch in HF_ARCHITECTURES.values():
        assert "Config" in arch.source and arch.family in ("llama", "qwen2", "mistral")


AWQ = {"bits": 4, "group_size": 128, "quant_method": "awq", "version": "gemm", "zero_point": True}
GPTQ = {"bits": 4, "group_size": 128, "desc_act": False, "quant_method": "gptq", "sym": True}
BNB = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "quant_method": "bitsandbytes"}
FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}

REFUSED = [
    ("awq", dict(LLAMA31_8B_CONFIG, model_type="qwen2", quantization_config=AWQ), "quantization_config", r"field 'quantization_config' \(quant_method 'awq', bits 4\) marks a quantized checkpoint"),
    ("gptq", dict(LLAMA31_8B_CONFIG, quantization_config=GPTQ), "quantization_config", r"quant_method 'gptq', bits 4"),
    ("bitsandbytes", dict(LLAMA31_8B_CONFIG, quantization_config=BNB), "quantization_config", r"quant_method 'bitsandbytes', bits 4"),
    ("fp8", dict(QWEN3_8B_CONFIG, quantization_config=FP8), "quantization_config", r"quant_method 'fp8'\)"),
    ("no model_type", {k: v for k, v in LLAMA31_8B_CONFIG.items() if k != "model_type"}, "model_type", r"missing config field 'model_type'.*gemma, gemma2, gemma3_text, glm4_moe, gpt2, gpt_neox, gpt_oss, llama, mistral, mixtral, opt, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe"),
    ("unknown model_type", dict(LLAMA31_8B_CONFIG, model_type="falcon"), "model_type", r"field 'model_type' = 'falcon' is not an architecture rpeg reads; known: deepseek_v2, deepseek_v3, gemma, gemma2"),
    ("model_type not a string", dict(LLAMA31_8B_CONFIG, model_type=3), "model_type", r"field 'model_type' must be a string, got 3"),
    ("gemma3 image-text", GEMMA3_27B_CONFIG, "model_type", r"field 'model_type' = 'gemma3' is Gemma-3's image-text model .*SigLIP vision tower.* give its text_config table as a config.json of that model_type"),
    ("mxfp4 outside gpt-oss", dict(LLAMA31_8B_CONFIG, quantization_config={"quant_method": "mxfp4"}), "quantization_config", r"field 'quantization_config' \(quant_method 'mxfp4'\) marks a quantized checkpoint"),
    ("gpt-oss, another quantization", dict(GPT_OSS_20B_CONFIG, quantization_config=AWQ), "quantization_config", r"quant_method 'awq', bits 4\) marks a quantized checkpoint.*\(of 'gpt_oss' checkpoints rpeg reads quant_method 'mxfp4', as the unquantized model it dequantizes to\)"),
    ("gpt-oss, top-k twice", dict(GPT_OSS_20B_CONFIG, experts_per_token=2), "experts_per_token", r"field 'experts_per_token' = 2 differs from 'num_experts_per_tok' = 4"),
    ("window missing", {k: v for k, v in GEMMA2_9B_CONFIG.items() if k != "sliding_window"}, "sliding_window", r"missing config field 'sliding_window' \(21 of the 42 layers attend through a sliding window"),
    ("window null", dict(GPT_OSS_20B_CONFIG, sliding_window=None), "sliding_window", r"missing config field 'sliding_window' \(12 of the 24 layers"),
    ("window not a count", dict(GEMMA2_9B_CONFIG, sliding_window=4096.0), "sliding_window", r"field 'sliding_window' must be an integer from 1 to 16,777,216, got 4096.0"),
    ("pattern zero", dict(GEMMA3_1B_CONFIG, sliding_window_pattern=0), "sliding_window_pattern", r"field 'sliding_window_pattern' must be an integer from 1 to 4,096, got 0"),
    ("layer_types too short", dict(GPT_OSS_20B_CONFIG, layer_types=["sliding_attention", "full_attention"] * 11), "layer_types", r"field 'layer_types' must be a list of 24 layer kinds"),
    ("a chunked layer", dict(GEMMA2_9B_CONFIG, layer_types=["sliding_attention", "full_attention"] * 20 + ["chunked_attention", "full_attention"]), "layer_types", r"field 'layer_types'\[40\] = 'chunked_attention' is not a layer kind rpeg models"),
    ("a linear layer under llama", dict(LLAMA31_8B_CONFIG, layer_types=["full_attention"] * 31 + ["linear_attention"]), "layer_types", r"field 'layer_types'\[31\] = 'linear_attention' is not a layer kind"),
    ("bidirectional", dict(GEMMA3_1B_CONFIG, use_bidirectional_attention=True), "use_bidirectional_attention", r"field 'use_bidirectional_attention' = True makes attention bidirectional"),
    ("opt-350m projections", dict(OPT_125M_CONFIG, hidden_size=1024, word_embed_proj_dim=512), "word_embed_proj_dim", r"field 'word_embed_proj_dim' = 512 differs from 'hidden_size' = 1024"),
    ("missing FFN width", {k: v for k, v in OPT_125M_CONFIG.items() if k != "ffn_dim"}, "ffn_dim", r"missing config field 'ffn_dim'"),
]  # fmt: skip


@pytest.mark.parametrize(("cfg", "field", "pattern"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_from_hf_config_refuses_what_it_would_misread(tmp_path, cfg, field, pattern):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match=pattern) as info:
        ModelSpec.from_hf_config(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value)
    assert info.value.field == field


# ---------------------------------------------------------------------------- mixture of experts
# config.json of Qwen/Qwen1.5-MoE-A2.7B (qwen2_moe: one shared expert; 14.3B total, 2.7B active)
QWEN15_MOE_CONFIG = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "decoder_sparse_step": 1,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "model_type": "qwen2_moe",
    "moe_intermediate_size": 1408,
    "num_attention_heads": 16,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 16,
    "shared_expert_intermediate_size": 5632,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}

# config.json of zai-org/GLM-4.5-Air (glm4_moe: first layer dense, one shared expert; 106B total)
GLM45_AIR_CONFIG = {
    "architectures": ["Glm4MoeForCausalLM"],
    "first_k_dense_replace": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 10944,
    "model_type": "glm4_moe",
    "moe_intermediate_size": 1408,
    "n_routed_experts": 128,
    "n_shared_experts": 1,
    "num_attention_heads": 96,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 46,
    "num_key_value_heads": 8,
    "num_nextn_predict_layers": 1,
    "partial_rotary_factor": 0.5,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151552,
}


@pytest.mark.parametrize(("name", "published"), sorted(MOE_PUBLISHED.items()))
def test_moe_presets_count_every_expert_and_the_active_ones(name, published):
    """Totals count every routed expert, active counts ``k`` of them: both within 1% of the
    published figures (embeddings included, as those figures do)."""
    spec = model_preset(name)
    total, active, tolerance = published
    assert spec.is_moe
    assert spec.params == pytest.approx(total, rel=0.01)
    assert spec.active_params == pytest.approx(active, rel=tolerance)


@pytest.mark.parametrize(
    ("cfg", "preset"),
    [
        (QWEN3_30B_A3B_CONFIG, "qwen3-30b-a3b"),
        (MIXTRAL_8X7B_CONFIG, "mixtral-8x7b"),
        (DEEPSEEK_V3_CONFIG, "deepseek-v3"),
    ],
)
def test_from_hf_config_reads_moe_models_as_their_presets(tmp_path, cfg, preset):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = ModelSpec.from_hf_config(tmp_path, name=preset)
    assert spec == model_preset(preset)


def test_from_hf_config_reads_a_shared_expert_and_dense_layers(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN15_MOE_CONFIG))
    spec = ModelSpec.from_hf_config(tmp_path)
    assert (spec.experts, spec.experts_active, spec.expert_ffn) == (60, 4, 1408)
    assert (spec.shared_experts, spec.shared_ffn, spec.dense_layers) == (1, 5632, ())
    assert spec.params == pytest.approx(14.3e9, rel=0.01)
    assert spec.active_params == pytest.approx(2.7e9, rel=0.01)
    # Qwen-MoE's dense layers: mlp_only_layers, and the layers off the decoder_sparse_step
    (tmp_path / "config.json").write_text(
        json.dumps(dict(QWEN15_MOE_CONFIG, decoder_sparse_step=2, mlp_only_layers=[1, 4]))
    )
    spec = ModelSpec.from_hf_config(tmp_path)
    assert spec.dense_layers == (0, 1, 2, 4, *range(6, 24, 2))
    assert spec.moe_layers == 24 - len(spec.dense_layers)
    # GLM-4.5's first k layers are dense; its shared experts have the routed width
    (tmp_path / "config.json").write_text(json.dumps(GLM45_AIR_CONFIG))
    glm = ModelSpec.from_hf_config(tmp_path)
    assert (glm.dense_layers, glm.shared_experts, glm.shared_ffn) == ((0,), 1, 1408)
    assert glm.params == pytest.approx(106e9, rel=0.01)  # the MTP layer is not counted


@pytest.mark.parametrize(
    ("cfg", "change", "field", "message"),
    [
        (
            QWEN3_30B_A3B_CONFIG,
            {"moe_intermediate_size": None},
            "moe_intermediate_size",
            "missing config field",
        ),
        (
            QWEN3_30B_A3B_CONFIG,
            {"num_experts_per_tok": 129},
            "num_experts_per_tok",
            "above the 128 routed experts",
        ),
        (QWEN3_30B_A3B_CONFIG, {"num_experts": 2.5}, "num_experts", "must be an integer"),
        (QWEN3_30B_A3B_CONFIG, {"mlp_only_layers": [48]}, "mlp_only_layers", "layer indices in 0..47"),
        (QWEN3_30B_A3B_CONFIG, {"decoder_sparse_step": 0}, "decoder_sparse_step", "positive integer"),
        (MIXTRAL_8X7B_CONFIG, {"num_local_experts": None}, "num_local_experts", "missing config field"),
        (GLM45_AIR_CONFIG, {"first_k_dense_replace": 46}, "first_k_dense_replace", "no layer has experts"),
        (GLM45_AIR_CONFIG, {"n_shared_experts": -1}, "n_shared_experts", "from 0 to"),
    ],
)
def test_from_hf_config_names_a_bad_expert_field(tmp_path, cfg, change, field, message):
    doc = {k: v for k, v in {**cfg, **change}.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match=message) as info:
        ModelSpec.from_hf_config(tmp_path)
    assert info.value.field == field and str(tmp_path / "config.json") in str(info.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"experts": 1, "experts_active": 1, "expert_ffn": 8}, "experts must be 0 .dense. or at least 2"),
        (
            {"experts": 4, "experts_active": 0, "expert_ffn": 8},
            "experts_active must be between 1 and experts = 4",
        ),
        ({"experts": 4, "experts_active": 5, "expert_ffn": 8}, "experts_active must be between 1"),
        ({"experts": 4, "experts_active": 2}, "expert_ffn must be a positive integer"),
        ({"experts": 4, "experts_active": 2, "expert_ffn": 8, "shared_experts": 1}, "both 0"),
        (
            {"experts": 4, "experts_active": 2, "expert_ffn": 8, "dense_layers": (1, 0)},
            "increasing layer indices",
        ),
        (
            {"experts": 4, "experts_active": 2, "expert_ffn": 8, "dense_layers": (0, 1)},
            "no layer has experts",
        ),
        ({"experts_active": 2}, "experts_active = 2 but experts = 0"),
        ({"dense_layers": (0,)}, "dense_layers = .0,. but experts = 0"),
        ({"experts": 4, "experts_active": 2, "expert_ffn": 8, "dense_layers": "0"}, "tuple of layer indices"),
    ],
)
def test_inconsistent_expert_fields_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelSpec(**{**SMALL, **fields})


def test_a_moe_spec_round_trips_and_a_dense_one_writes_no_expert_fields():
    spec = ModelSpec(
        **SMALL,
        experts=4,
        experts_active=2,
        expert_ffn=32,
        shared_experts=1,
        shared_ffn=16,
        dense_layers=(0,),
    )
    doc = spec.to_dict()
    assert doc["dense_layers"] == [0]
    assert ModelSpec(**doc) == spec
    assert "experts" not in model_preset("llama2-7b").to_dict()


def test_moe_sizes_by_hand():
    """A two-layer toy with one dense layer, by hand: what a token goes through (``k`` routed
    experts, the shared one, the router) and what is stored (every expert)."""
    d, dff, de, ds = 64, 128, 32, 16
    spec = ModelSpec(
        **SMALL,
        experts=4,
        experts_active=2,
        expert_ffn=de,
        shared_experts=1,
        shared_ffn=ds,
        dense_layers=(0,),
    )
    attn = 4 * d * d
    moe_fixed = 3 * d * ds + d * 4
    assert spec.layer_params == attn + (3 * d * dff + 2 * 3 * d * de + moe_fixed) / 2
    assert spec.layer_weights == attn + (3 * d * dff + 4 * 3 * d * de + moe_fixed) / 2
    head = embed = 100 * d
    assert spec.params == 2 * (attn + 2 * d) + 3 * d * dff + 4 * 3 * d * de + moe_fixed + embed + d + head
    assert spec.active_params == spec.params - 2 * 3 * d * de
    assert spec.ffn_width == (dff + 2 * de + ds) / 2
    assert spec.routed_width == 2 * d / 2
    # one token reads its k experts; a long pass touches them all
    assert spec.layer_weights_read(1) == pytest.approx(spec.layer_params)
    assert spec.layer_weights_read(10_000) == pytest.approx(spec.layer_weights)
    assert spec.expert_flop_share == pytest.approx(2 * 3 * d * de / (2 * spec.layer_params))
    # scaled keeps the experts and scales their widths
    small = spec.scaled(layers=2, hidden=32, heads=2)
    assert (small.experts, small.experts_active, small.expert_ffn, small.shared_ffn) == (4, 2, 16, 8)


def test_latent_attention_by_hand():
    """DeepSeek-V3's attention: its weights, the 576 scalars a token caches per block (the 512-wide
    latent and the 64-wide rotary key; the dense reading cached 2·128·56 = 14,336, 25× more), and
    the core's width trained (keys and values expanded per head) and decoded (absorbed, over the
    latent)."""
    m = model_preset("deepseek-v3")
    d, h = 7168, 128
    query = d * 1536 + 1536 * h * 192
    kv = d * (512 + 64) + 512 * h * (128 + 128)
    assert m.attention_params == query + kv + h * 128 * d
    assert m.kv_cache_width == 576
    assert 2 * m.kv_heads * m.head_dim / m.kv_cache_width == pytest.approx(24.9, abs=0.1)
    assert m.attention_width == h * (192 + 128) / 2
    assert m.decode_attention_width == h * (2 * 512 + 64) / 2
    assert model_preset("llama3.1-8b").kv_cache_width == 2 * 8 * 128


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4}, "needs v_head_dim > 0"),
        ({"q_lora_rank": 16}, "q_lora_rank = 16 but kv_lora_rank = 0"),
    ],
)
def test_inconsistent_latent_attention_fields_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelSpec(**{**SMALL, **fields})


def test_from_hf_config_reads_deepseek_without_query_compression_and_names_a_missing_field(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(DEEPSEEK_V3_CONFIG, q_lora_rank=None)))
    spec = ModelSpec.from_hf_config(tmp_path)
    assert spec.q_lora_rank == 0 and spec.kv_lora_rank == 512
    assert spec.attention_params == 7168 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    doc = {k: v for k, v in DEEPSEEK_V3_CONFIG.items() if k != "v_head_dim"}
    (tmp_path / "config.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match="missing config field 'v_head_dim'") as info:
        ModelSpec.from_hf_config(tmp_path)
    assert info.value.field == "v_head_dim"
    (tmp_path / "config.json").write_text(json.dumps(dict(DEEPSEEK_V3_CONFIG, moe_layer_freq=2)))
    assert ModelSpec.from_hf_config(tmp_path).dense_layers == (0, 1, 2, *range(3, 61, 2))


# ---------------------------------------------------------------------------- sliding windows
#: OpenAI's gpt-oss model card (Table 1): (total, active). Its active counts hold the blocks'
#: active weights and one V·d matrix, the unembedding (an embedding lookup is no matmul), where
#: Qwen's and Mistral's (MOE_PUBLISHED) hold both embedding matrices.
GPT_OSS_PUBLISHED = {"gpt-oss-20b": (20.91e9, 3.61e9), "gpt-oss-120b": (116.83e9, 5.13e9)}


@pytest.mark.parametrize(("name", "published"), sorted(GPT_OSS_PUBLISHED.items()))
def test_gpt_oss_presets_match_the_model_card(name, published):
    spec = model_preset(name)
    total, active = published
    # biases and attention sinks left out: 20.908B and 116.789B
    assert spec.params == pytest.approx(total, rel=0.001)
    assert spec.active_params - spec.embedding_params == pytest.approx(active, rel=0.001)
    assert (spec.sliding_window, spec.sliding_layers) == (128, tuple(range(0, spec.layers, 2)))
    assert (spec.experts_active, spec.expert_ffn, spec.head_dim, spec.kv_heads) == (4, 2880, 64, 8)


@pytest.mark.parametrize(
    ("cfg", "preset"), [(GPT_OSS_20B_CONFIG, "gpt-oss-20b"), (GPT_OSS_120B_CONFIG, "gpt-oss-120b")]
)
def test_from_hf_config_reads_gpt_oss_as_its_presets(tmp_path, cfg, preset):
    """The published config.json (MXFP4 experts) reads as the BF16 model it dequantizes to; the
    window's layers come from layer_types, or GptOssConfig's default pattern without it."""
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = ModelSpec.from_hf_config(tmp_path, name=preset)
    assert spec == model_preset(preset)
    assert spec.dtype_bytes == 2
    unquantized = {k: v for k, v in cfg.items() if k not in ("quantization_config", "layer_types")}
    (tmp_path / "config.json").write_text(json.dumps(unquantized))
    assert ModelSpec.from_hf_config(tmp_path, name=preset) == spec
    # layer_types decides: a full first layer moves the window to the odd layers
    shifted = dict(cfg, layer_types=["full_attention", "sliding_attention"] * (spec.layers // 2))
    (tmp_path / "config.json").write_text(json.dumps(shifted))
    assert ModelSpec.from_hf_config(tmp_path).sliding_layers == tuple(range(1, spec.layers, 2))


def test_attention_sinks_are_read_checked_and_round_trip(tmp_path):
    """gpt-oss's config.json reads with attention sinks (its attention has one per head), other
    architectures without; the flag is written only when set and refused when not a bool."""
    (tmp_path / "config.json").write_text(json.dumps(GPT_OSS_20B_CONFIG))
    assert ModelSpec.from_hf_config(tmp_path).attention_sinks
    (tmp_path / "config.json").write_text(json.dumps(LLAMA31_8B_CONFIG))
    assert not ModelSpec.from_hf_config(tmp_path).attention_sinks
    oss = model_preset("gpt-oss-120b")
    assert oss.attention_sinks and oss.to_dict()["attention_sinks"] is True
    assert ModelSpec(**ModelSpecFile(**oss.to_dict()).model_dump()) == oss  # a workload's inline table
    assert "attention_sinks" not in model_preset("qwen3-30b-a3b").to_dict()
    assert oss.scaled(layers=4, hidden=256, heads=4).attention_sinks
    with pytest.raises(ValueError, match=r"attention_sinks must be True or False, got 'yes'"):
        ModelSpec(**SMALL, attention_sinks="yes")


def test_from_hf_config_reads_gemma_windows(tmp_path):
    def read(cfg):
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        return ModelSpec.from_hf_config(tmp_path)

    # Gemma-2: every other layer from the first (Gemma2Config's default), or layer_types
    gemma2 = read(GEMMA2_9B_CONFIG)
    assert (gemma2.sliding_window, gemma2.sliding_layers) == (4096, tuple(range(0, 42, 2)))
    assert gemma2.tied_embeddings and gemma2.ffn_projections == 3
    types = ["sliding_attention", "full_attention"] * 21
    assert read(dict(GEMMA2_9B_CONFIG, layer_types=types)) == gemma2
    # Gemma-3: five layers of six (layers 5, 11, 17, 23 attend in full); the pattern's default is 6
    gemma3 = read(GEMMA3_1B_CONFIG)
    assert gemma3.sliding_window == 512
    assert gemma3.sliding_layers == tuple(i for i in range(26) if i not in (5, 11, 17, 23))
    assert read({k: v for k, v in GEMMA3_1B_CONFIG.items() if k != "sliding_window_pattern"}) == gemma3
    assert read(dict(GEMMA3_1B_CONFIG, sliding_window_pattern=2)).sliding_layers == tuple(range(0, 26, 2))
    # every layer in full: no window, whatever sliding_window says
    dense = read(dict(GEMMA3_1B_CONFIG, layer_types=["full_attention"] * 26))
    assert (dense.sliding_window, dense.sliding_layers) == (0, ())
    # Gemma-3-27B's language model, as the refusal of its image-text config.json says to give it
    text = read(dict(GEMMA3_27B_CONFIG["text_config"], vocab_size=262208))
    assert (text.layers, text.head_dim, text.kv_heads, text.sliding_window) == (62, 128, 16, 1024)
    assert len(text.sliding_layers) == 52 and 59 not in text.sliding_layers
    d, dq, dkv, dff = 5376, 32 * 128, 16 * 128, 21504
    assert text.params == 62 * (2 * d * dq + 2 * d * dkv + 3 * d * dff + 2 * d) + 262208 * d + d


def test_from_hf_config_reads_other_windows_as_full_attention(tmp_path):
    """Mistral's, Qwen2's and Phi-3's windows are read as full attention (conservative), as
    before; their sliding layer_types too."""
    cfg = dict(
        LLAMA31_8B_CONFIG,
        model_type="qwen2",
        sliding_window=4096,
        use_sliding_window=True,
        layer_types=["full_attention"] * 28 + ["sliding_attention"] * 4,
    )
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = ModelSpec.from_hf_config(tmp_path)
    assert (spec.sliding_window, spec.sliding_layers) == (0, ())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sliding_window": 4}, "sliding_window = 4 but sliding_layers is empty"),
        ({"sliding_layers": (0,)}, r"sliding_layers = \[0\] but sliding_window = 0"),
        ({"sliding_window": 4, "sliding_layers": (1, 0)}, "increasing layer indices in 0..1"),
        ({"sliding_window": 4, "sliding_layers": (0, 0)}, "increasing layer indices in 0..1"),
        ({"sliding_window": 4, "sliding_layers": (2,)}, "increasing layer indices in 0..1"),
        ({"sliding_window": 4, "sliding_layers": "0"}, "sliding_layers must be a tuple of layer indices"),
        ({"sliding_window": 4, "sliding_layers": (True,)}, "sliding_layers must be a tuple of layer indices"),
        ({"sliding_window": -1, "sliding_layers": (0,)}, r"sliding_window must be a non-negative integer \(0: no window\)"),
        ({"sliding_window": 4.0, "sliding_layers": (0,)}, "sliding_window must be a non-negative integer"),
        ({"sliding_window": MAX_WINDOW + 1, "sliding_layers": (0,)}, "sliding_window = 16777217 is above MAX_WINDOW"),
    ],
)  # fmt: skip
def test_inconsistent_window_fields_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelSpec(**{**SMALL, **fields})


def test_a_windowed_spec_round_trips_as_data_and_scales():
    spec = ModelSpec(**SMALL, sliding_window=8, sliding_layers=[0])
    assert spec.sliding_layers == (0,) and spec.is_windowed
    doc = spec.to_dict()
    assert (doc["sliding_window"], doc["sliding_layers"]) == (8, [0])
    assert ModelSpec(**doc) == spec
    assert ModelSpec(**ModelSpecFile(**doc).model_dump()) == spec  # a workload's inline table
    assert "sliding_window" not in model_preset("llama3.1-8b").to_dict()
    oss = model_preset("gpt-oss-20b")
    assert ModelSpec(**oss.to_dict()) == oss
    small = oss.scaled(layers=4, hidden=256, heads=4)
    assert (small.sliding_window, small.sliding_layers) == (128, (0, 2))
    # no windowed layer left: no window
    odd = ModelSpec(**dict(SMALL, layers=4), sliding_window=8, sliding_layers=(3,))
    cut = odd.scaled(layers=2, hidden=64, heads=4)
    assert (cut.sliding_window, cut.sliding_layers) == (0, ())

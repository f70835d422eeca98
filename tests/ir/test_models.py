"""Model presets and Hugging Face config loading (SPEC §2)."""

import json

import pytest

from rpeg.ir.errors import InputError
from rpeg.ir.models import MODEL_PRESETS, ModelSpec, model_preset

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

GPT_OSS_20B_CONFIG = {
    "architectures": ["GptOssForCausalLM"],
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "model_type": "gpt_oss",
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "quantization_config": {"quant_method": "mxfp4"},
    "sliding_window": 128,
    "tie_word_embeddings": False,
    "vocab_size": 201088,
}

MOE_CONFIGS = {
    "qwen3-30b-a3b": (QWEN3_30B_A3B_CONFIG, "num_experts", 128),
    "mixtral-8x7b": (MIXTRAL_8X7B_CONFIG, "num_local_experts", 8),
    "deepseek-v3": (DEEPSEEK_V3_CONFIG, "n_routed_experts", 256),
    "gpt-oss-20b": (GPT_OSS_20B_CONFIG, "num_local_experts", 32),
}


def _refused(tmp_path, cfg) -> InputError:
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="mixture-of-experts models are not supported yet") as info:
        ModelSpec.from_hf_config(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value)  # the file is named
    assert "misread as a dense model" in str(info.value)
    assert info.value.source == str(tmp_path / "config.json")
    return info.value


@pytest.mark.parametrize("family", sorted(MOE_CONFIGS))
def test_from_hf_config_refuses_moe_model_type(tmp_path, family):
    cfg, _, _ = MOE_CONFIGS[family]
    err = _refused(tmp_path, cfg)
    assert f"field 'model_type' = {cfg['model_type']!r}" in str(err)
    assert err.field == "model_type"


@pytest.mark.parametrize("family", sorted(MOE_CONFIGS))
def test_from_hf_config_refuses_experts_under_any_model_type(tmp_path, family):
    # an unknown (or dense-looking) model_type does not hide the experts
    cfg, field, value = MOE_CONFIGS[family]
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

"""Model specifications: the shape of a decoder-only transformer and its parameter count.

A :class:`ModelSpec` is everything the cost model and the runtime need to know about a model:
layers ``L``, hidden size ``d``, FFN width ``dff``, vocabulary ``V``, attention heads and KV heads
(grouped-query attention), head dimension, number of FFN projections (2 for a plain MLP, 3 for a
gated/SwiGLU one), tied embeddings and the bytes per scalar (SPEC §2); for a mixture-of-experts
model also its routed and shared experts, the experts active per token and which layers keep a
dense FFN, and for a model with sliding-window attention its window and the layers that use it
(SPEC §15.1).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from .errors import InputError, Strict, read_json

__all__ = [
    "DEFAULT_LOAD_IMBALANCE",
    "FAMILIES",
    "GEMM_ELEMENT_BYTES",
    "HF_ARCHITECTURES",
    "MAX_EXPERTS",
    "MAX_FFN_HIDDEN",
    "MAX_HEADS",
    "MAX_HEAD_DIM",
    "MAX_HIDDEN",
    "MAX_LAYERS",
    "MAX_LOAD_IMBALANCE",
    "MAX_VOCAB",
    "MAX_WINDOW",
    "MODEL_PRESETS",
    "MXFP4_BYTES",
    "OPTIMIZER_BYTES_PER_PARAM",
    "PRECISIONS",
    "HFArchitecture",
    "ModelSpec",
    "ModelSpecFile",
    "model_preset",
]

#: Hugging Face architectures (``config.json``'s ``model_type``) the runtime builds and loads.
FAMILIES = ("llama", "qwen2", "mistral")

#: GEMM precisions a model runs with (:attr:`ModelSpec.precision`; ``docs/decisions.md``,
#: "The precision setting"): ``"bf16"`` everywhere, ``"fp8"`` — the transformer blocks'
#: weight GEMMs in FP8 as Transformer Engine runs them for Megatron-core (training, teacher-forced
#: inference) and as vLLM's ``quantization="fp8"`` runs them (generation, weights stored in FP8) —
#: or ``"nvfp4"``, the same GEMMs in NVFP4 (Transformer Engine's ``NVFP4BlockScaling`` recipe,
#: Megatron-Bridge's ``bf16_with_nvfp4_mixed``; vLLM's ModelOpt NVFP4 checkpoints on Blackwell) —
#: or ``"mxfp4"``, a mixture of experts whose routed experts a generation engine stores in MXFP4
#: and runs as weight-only GEMMs (W4A16: vLLM's ``Mxfp4Config``, which quantizes only the
#: ``FusedMoE`` layers — gpt-oss's published checkpoints; every other GEMM, training and the
#: teacher-forced passes stay BF16).
PRECISIONS = ("bf16", "fp8", "nvfp4", "mxfp4")

#: Bytes per weight of an MXFP4 routed expert (:attr:`ModelSpec.served_expert_bytes`): a 4-bit
#: E2M1 value plus one 8-bit E8M0 scale per block of 32 (``0.5 + 1/32``) — the OCP Microscaling
#: Formats (MX) Specification v1.0, §5 (MXFP4: k = 32, scale E8M0), as gpt-oss's checkpoints
#: store ``*_blocks`` (uint8, two values each) and ``*_scales`` (uint8, one per 32).
MXFP4_BYTES = 0.5 + 1.0 / 32.0

#: Bytes per element of a low-precision GEMM operand (:attr:`ModelSpec.gemm_bytes`): FP8
#: (E4M3/E5M2) is one byte; NVFP4 is a 4-bit E2M1 value plus one E4M3 scale per block of 16
#: (``0.5 + 1/16``; the one FP32 scale per tensor is negligible) — NVIDIA, "Pretraining Large
#: Language Models with NVFP4" (arXiv:2509.25149), §2, and Transformer Engine's NVFP4 recipe.
GEMM_ELEMENT_BYTES = {"fp8": 1.0, "nvfp4": 0.5 + 1.0 / 16.0}

# Upper bounds on a model's figures. Each is far above the largest published model's, so no real
# model is refused: Llama-3.1-405B has 126 layers, d = 16,384, dff = 53,248 and 128 heads;
# PaLM-540B 118 layers, d = 18,432, dff = 73,728; Megatron-Turing NLG 530B 105 layers,
# d = 20,480, dff = 81,920; Falcon-180B 232 heads; Gemma-3 V = 262,208 and head_dim 256 (the
# widest head_dim published is 512). The bounds keep every cost-model product (``L·d·dff`` per
# token, ~10¹⁹ at most) finite in float arithmetic and the plan search's loops over the divisors
# of ``L`` short: an unbounded figure overflowed (``hidden_size: 10**200``) or hung (``2**63 − 1``).
#: Most transformer blocks ``L`` (~32× Llama-3.1-405B's 126).
MAX_LAYERS = 4096
#: Widest model ``d`` (~50× MT-NLG's 20,480).
MAX_HIDDEN = 2**20
#: Widest FFN ``dff`` (~50× MT-NLG's 81,920).
MAX_FFN_HIDDEN = 2**22
#: Largest vocabulary ``V`` (64× Gemma-3's 262,208).
MAX_VOCAB = 2**24
#: Most query (and key/value) heads (~70× Falcon-180B's 232).
MAX_HEADS = 2**14
#: Widest head (32× the widest published, 512).
MAX_HEAD_DIM = 2**14
#: Most routed experts per layer (64× DeepSeek-V3's 256; Qwen3-MoE has 128, Mixtral 8).
MAX_EXPERTS = 2**14
#: Widest attention window in tokens (4,096× Gemma-2's 4,096; gpt-oss has 128, Gemma-3 512 and 1,024).
MAX_WINDOW = 2**24

#: Load imbalance ``λ`` of expert-parallel MoE layers, SPEC §15.2's default
#: (:attr:`ModelSpec.load_imbalance`): the busiest of the ``Pe`` ranks receives ``λ`` times the
#: mean tokens and every rank waits for it. SPEC's figure, not measured here.
DEFAULT_LOAD_IMBALANCE = 1.2
#: Largest ``λ`` a model may set: the busiest of ``Pe`` ranks receives at most ``Pe`` times the
#: mean, and 64 ranks' worth is far above any published measurement.
MAX_LOAD_IMBALANCE = 64.0

#: ``ModelSpec`` field → its bound (``head_dim`` may also be 0: derived from ``hidden // heads``).
_LIMITS = {
    "layers": ("MAX_LAYERS", MAX_LAYERS),
    "hidden": ("MAX_HIDDEN", MAX_HIDDEN),
    "ffn_hidden": ("MAX_FFN_HIDDEN", MAX_FFN_HIDDEN),
    "vocab": ("MAX_VOCAB", MAX_VOCAB),
    "heads": ("MAX_HEADS", MAX_HEADS),
    "kv_heads": ("MAX_HEADS", MAX_HEADS),
    "head_dim": ("MAX_HEAD_DIM", MAX_HEAD_DIM),
    "experts": ("MAX_EXPERTS", MAX_EXPERTS),
    "experts_active": ("MAX_EXPERTS", MAX_EXPERTS),
    "expert_ffn": ("MAX_FFN_HIDDEN", MAX_FFN_HIDDEN),
    "shared_experts": ("MAX_EXPERTS", MAX_EXPERTS),
    "shared_ffn": ("MAX_FFN_HIDDEN", MAX_FFN_HIDDEN),
    "q_lora_rank": ("MAX_HIDDEN", MAX_HIDDEN),
    "kv_lora_rank": ("MAX_HIDDEN", MAX_HIDDEN),
    "qk_nope_head_dim": ("MAX_HEAD_DIM", MAX_HEAD_DIM),
    "qk_rope_head_dim": ("MAX_HEAD_DIM", MAX_HEAD_DIM),
    "v_head_dim": ("MAX_HEAD_DIM", MAX_HEAD_DIM),
    "sliding_window": ("MAX_WINDOW", MAX_WINDOW),
}

#: ``ModelSpec`` figures that may be 0 (``head_dim``: derived; the expert figures: a dense model;
#: the latent-attention ranks: standard attention; ``sliding_window``: no window).
_ZERO_ALLOWED = frozenset(
    {
        "head_dim",
        "experts",
        "experts_active",
        "expert_ffn",
        "shared_experts",
        "shared_ffn",
        "q_lora_rank",
        "kv_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "sliding_window",
    }
)
#: The multi-head latent attention fields of :class:`ModelSpec` (all 0: standard attention).
_MLA_SPEC_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def _show(value: object) -> str:
    """``repr(value)``, or the digit count of an integer too long to print usefully."""
    if (
        isinstance(value, numbers.Integral)
        and not isinstance(value, bool)
        and abs(int(value)).bit_length() > 128
    ):
        return f"an integer of about {int(abs(int(value)).bit_length() * 0.30103)} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


#: ``model_type`` values of Hugging Face mixture-of-experts architectures; :meth:`ModelSpec.from_hf_config`
#: refuses those (and any ``model_type`` containing ``moe``) that :data:`HF_ARCHITECTURES` does not read.
_MOE_MODEL_TYPES = frozenset(
    {
        "arctic",
        "aria_text",
        "bailing_moe",
        "dbrx",
        "deepseek_v2",
        "deepseek_v3",
        "dots1",
        "ernie4_5_moe",
        "flex_olmo",
        "glm4_moe",
        "glm4v_moe",
        "gpt_oss",
        "granitemoe",
        "granitemoehybrid",
        "granitemoeshared",
        "hunyuan_v1_moe",
        "jamba",
        "jetmoe",
        "llama4",
        "llama4_text",
        "longcat_flash",
        "minimax",
        "minimax_m2",
        "mixtral",
        "nllb_moe",
        "olmoe",
        "phimoe",
        "qwen2_moe",
        "qwen3_moe",
        "qwen3_next",
        "qwen3_omni_moe",
        "qwen3_vl_moe",
        "switch_transformers",
    }
)

#: Why a mixture-of-experts architecture outside :data:`HF_ARCHITECTURES` is refused, where more
#: than "not read" is known.
_UNREAD_MOE = {
    "llama4": "its chunked-attention layers (attention_chunk_size) are not modelled yet",
    "llama4_text": "its chunked-attention layers (attention_chunk_size) are not modelled yet",
}

#: ``config.json`` fields that count experts (in total, then per token); a value above 1 marks a
#: mixture-of-experts model whatever its ``model_type``.
_EXPERT_FIELDS = (
    "num_experts",  # Qwen2/Qwen3-MoE, OLMoE, Jamba, Switch
    "num_local_experts",  # Mixtral, gpt-oss, PhiMoE, Granite-MoE, Llama 4
    "n_routed_experts",  # DeepSeek-V2/V3, GLM-4.5, dots.llm1
    "moe_num_experts",  # DBRX (in ffn_config), ERNIE-4.5-MoE
    "num_experts_per_tok",
    "experts_per_token",  # gpt-oss
    "moe_top_k",  # DBRX
    "moe_topk",  # Hunyuan
    "moe_k",  # ERNIE-4.5-MoE
)

#: Multi-head latent attention fields: read for DeepSeek-V2/V3 (:func:`_read_latent`), refused under
#: any other ``model_type`` (MiniCPM3), whose KV cache and parameters the dense formulas would get wrong.
_MLA_FIELDS = ("kv_lora_rank", "q_lora_rank")


@dataclass(frozen=True)
class HFArchitecture:
    """How :meth:`ModelSpec.from_hf_config` reads one dense ``model_type``: the ``config.json``
    field names and the defaults of its ``transformers`` config class, and the shape of its MLP.

    Parameters
    ----------
    source
        The ``transformers`` classes the entry was read from (config class and MLP).
    layers, hidden, ffn, heads
        Field names of ``L``, ``d``, ``dff`` and the query heads (required in the file).
    kv_heads
        Field name of the key/value heads; ``""``: the architecture has none (= query heads).
    head_dim
        Field name of the head width; ``""``: none (``hidden // heads``).
    kv_default
        K/V heads when the field is absent (the config class's default); ``0``: the query heads.
        A ``null`` always means the query heads (every config class's ``__post_init__``).
    head_dim_default
        Head width when the field is absent or ``null``; ``0``: ``hidden // heads``.
    ffn_default
        ``dff`` as a multiple of ``d`` when the FFN field is absent or ``null`` (GPT-2's
        ``n_inner``); ``0``: the field is required.
    gated
        Whether the MLP is gated (``gate, up, down``: 3 projections) whatever ``hidden_act`` says.
    tied
        ``tie_word_embeddings`` when absent or ``null`` (the config class's default).
    family
        :attr:`ModelSpec.family` (the runtime builds only :data:`FAMILIES`; others read as
        ``"llama"``).
    experts
        How the mixture-of-experts fields are read (:func:`_read_experts`): ``"qwen"``
        (Qwen2-MoE, Qwen3-MoE), ``"mixtral"`` (Mixtral), ``"glm"`` (GLM-4.5), ``"deepseek"``
        (DeepSeek-V2/V3); ``""``: a dense architecture.
    latent
        Whether attention is multi-head latent attention, read from ``q_lora_rank``,
        ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim`` and ``v_head_dim``
        (:func:`_read_latent`).
    window_period
        Whether some layers attend through a sliding window, read from ``sliding_window`` and
        ``layer_types`` (:func:`_read_window`); when ``layer_types`` is absent, layer ``i`` is
        windowed unless ``(i + 1) % window_period = 0`` (the config class's default pattern:
        2 for gpt-oss and Gemma-2, 6 for Gemma-3). ``0``: every layer is read as full attention
        (Mistral's, Qwen2's and Phi-3's windows too: conservative).
    window_period_field
        The field that overrides ``window_period`` (Gemma-3's ``sliding_window_pattern``); ``""``:
        none.
    dequantized
        The ``quantization_config.quant_method`` read as the unquantized model it dequantizes to
        (gpt-oss's ``"mxfp4"``, whose published checkpoint stores its experts so); ``""``: a
        quantized checkpoint is refused.
    sinks
        Whether the architecture's attention has a learned sink per head
        (:attr:`ModelSpec.attention_sinks`; gpt-oss's ``GptOssAttention.sinks``).
    """

    source: str
    layers: str = "num_hidden_layers"
    hidden: str = "hidden_size"
    ffn: str = "intermediate_size"
    heads: str = "num_attention_heads"
    kv_heads: str = "num_key_value_heads"
    head_dim: str = "head_dim"
    kv_default: int = 0
    head_dim_default: int = 0
    ffn_default: int = 0
    gated: bool = True
    tied: bool = False
    family: str = "llama"
    experts: str = ""
    latent: bool = False
    window_period: int = 0
    window_period_field: str = ""
    dequantized: str = ""
    sinks: bool = False


#: The ``model_type`` values :meth:`ModelSpec.from_hf_config` reads, each as its ``transformers``
#: (5.x) config class and MLP define it: dense ones and (``experts`` set) mixture-of-experts ones.
#: Any other ``model_type`` is refused.
HF_ARCHITECTURES: dict[str, HFArchitecture] = {
    "llama": HFArchitecture(
        "LlamaConfig (num_key_value_heads None → heads, head_dim None → d/heads, "
        "tie_word_embeddings False); LlamaMLP gate/up/down",
        family="llama",
    ),
    "mistral": HFArchitecture(
        "MistralConfig (num_key_value_heads 8, head_dim None → d/heads, tie_word_embeddings False); "
        "MistralMLP gate/up/down",
        kv_default=8,
        family="mistral",
    ),
    "qwen2": HFArchitecture(
        "Qwen2Config (num_key_value_heads 32, tie_word_embeddings False; Qwen2Attention reads a "
        "head_dim if given, else d/heads); Qwen2MLP gate/up/down",
        kv_default=32,
        family="qwen2",
    ),
    "qwen3": HFArchitecture(
        "Qwen3Config (num_key_value_heads 32, head_dim 128, tie_word_embeddings False); "
        "Qwen3MLP gate/up/down",
        kv_default=32,
        head_dim_default=128,
    ),
    "gemma": HFArchitecture(
        "GemmaConfig (num_key_value_heads 16, head_dim 256, tie_word_embeddings True); "
        "GemmaMLP gate/up/down (GeGLU, whatever hidden_act says)",
        kv_default=16,
        head_dim_default=256,
        tied=True,
    ),
    "phi3": HFArchitecture(
        "Phi3Config (num_key_value_heads None → heads, tie_word_embeddings False; Phi3Attention "
        "reads a head_dim if given, else d/heads); Phi3MLP gate_up_proj (2·dff) and down_proj",
    ),
    "gpt2": HFArchitecture(
        "GPT2Config (n_inner None → 4·n_embd, tie_word_embeddings True); GPT2MLP c_fc/c_proj",
        layers="n_layer",
        hidden="n_embd",
        ffn="n_inner",
        heads="n_head",
        kv_heads="",
        head_dim="",
        ffn_default=4,
        gated=False,
        tied=True,
    ),
    "opt": HFArchitecture(
        "OPTConfig (tie_word_embeddings True); OPTDecoderLayer fc1/fc2",
        ffn="ffn_dim",
        kv_heads="",
        head_dim="",
        gated=False,
        tied=True,
    ),
    "gpt_neox": HFArchitecture(
        "GPTNeoXConfig (tie_word_embeddings False); GPTNeoXMLP dense_h_to_4h/dense_4h_to_h",
        kv_heads="",
        head_dim="",
        gated=False,
    ),
    "qwen2_moe": HFArchitecture(
        "Qwen2MoeConfig (num_key_value_heads 16, tie_word_embeddings False); Qwen2MoeSparseMoeBlock: "
        "router d×E, num_experts Qwen2MoeMLP experts of moe_intermediate_size, one shared expert of "
        "shared_expert_intermediate_size (and its d×1 gate); dense Qwen2MoeMLP (intermediate_size) on "
        "mlp_only_layers and where (i + 1) % decoder_sparse_step ≠ 0",
        kv_default=16,
        experts="qwen",
    ),
    "qwen3_moe": HFArchitecture(
        "Qwen3MoeConfig (num_key_value_heads 4, head_dim 128 as Qwen3Attention reads it, "
        "tie_word_embeddings False); Qwen3MoeSparseMoeBlock: router d×E, num_experts experts of "
        "moe_intermediate_size, no shared expert; dense layers as Qwen2-MoE",
        kv_default=4,
        head_dim_default=128,
        experts="qwen",
    ),
    "mixtral": HFArchitecture(
        "MixtralConfig (num_key_value_heads 8, head_dim None → d/heads, tie_word_embeddings False); "
        "MixtralSparseMoeBlock: router d×E, num_local_experts experts of intermediate_size; no dense "
        "layer",
        kv_default=8,
        experts="mixtral",
    ),
    "glm4_moe": HFArchitecture(
        "Glm4MoeConfig (num_key_value_heads 8, head_dim 128, tie_word_embeddings False); "
        "Glm4MoeMoE: router d×E, n_routed_experts experts and n_shared_experts shared ones of "
        "moe_intermediate_size; dense Glm4MoeMLP (intermediate_size) on the first "
        "first_k_dense_replace layers",
        kv_default=8,
        head_dim_default=128,
        experts="glm",
    ),
    "deepseek_v3": HFArchitecture(
        "DeepseekV3Config (tie_word_embeddings False); DeepseekV3Attention: q_a_proj d×q_lora_rank "
        "(none when q_lora_rank is null), q_b_proj, kv_a_proj_with_mqa d×(kv_lora_rank + "
        "qk_rope_head_dim), kv_b_proj kv_lora_rank×H·(qk_nope_head_dim + v_head_dim), o_proj; "
        "DeepseekV3MoE: router d×E, n_routed_experts experts and n_shared_experts shared ones of "
        "moe_intermediate_size; dense DeepseekV3MLP (intermediate_size) below first_k_dense_replace "
        "and off moe_layer_freq",
        experts="deepseek",
        latent=True,
    ),
    "deepseek_v2": HFArchitecture(
        "DeepseekV2Config (tie_word_embeddings False); attention and MoE as DeepSeek-V3's",
        experts="deepseek",
        latent=True,
    ),
    "gemma2": HFArchitecture(
        "Gemma2Config (num_key_value_heads 4, head_dim 256, tie_word_embeddings True; layer_types "
        "None → sliding_window on the layers i with (i + 1) % 2 ≠ 0); Gemma2MLP gate/up/down (GeGLU)",
        kv_default=4,
        head_dim_default=256,
        tied=True,
        window_period=2,
    ),
    "gemma3_text": HFArchitecture(
        "Gemma3TextConfig (num_key_value_heads 4, head_dim 256, tie_word_embeddings True; layer_types "
        "None → sliding_window on the layers i with (i + 1) % sliding_window_pattern ≠ 0, pattern 6); "
        "Gemma3MLP gate/up/down (GeGLU)",
        kv_default=4,
        head_dim_default=256,
        tied=True,
        window_period=6,
        window_period_field="sliding_window_pattern",
    ),
    "gpt_oss": HFArchitecture(
        "GptOssConfig (num_key_value_heads 8, head_dim 64, tie_word_embeddings False; layer_types None "
        "→ sliding_window on the layers i with (i + 1) % 2 ≠ 0); GptOssAttention q/k/v/o with biases "
        "and one sink per head; GptOssMLP: router d×E with bias, num_local_experts GptOssExperts of "
        "intermediate_size (gate_up_proj d×2·dff, down_proj, with biases); no dense layer",
        kv_default=8,
        head_dim_default=64,
        experts="gpt_oss",
        window_period=2,
        dequantized="mxfp4",
        sinks=True,
    ),
}

#: ``model_type`` values refused with a reason beyond "not read": architectures next to one that
#: is read.
_REFUSED_MODEL_TYPES = {
    "gemma3": "Gemma-3's image-text model (Gemma3ForConditionalGeneration: a SigLIP vision tower and "
    "a projector beside the language model, not modelled); rpeg reads its language model, "
    "model_type 'gemma3_text': give its text_config table as a config.json of that model_type "
    "(with the shape fields: num_hidden_layers, hidden_size, intermediate_size, num_attention_heads, "
    "vocab_size, sliding_window)",
}

#: ``layer_types`` entries: the attention kinds :func:`_read_window` reads.
_LAYER_TYPES = ("full_attention", "sliding_attention")

#: FP32 master weights + two FP32 Adam moments: 3 × 4 bytes per trained parameter (SPEC §6); the
#: cost model's optimizer state (:mod:`rpeg.costmodel.memory`) and a training EMU's ``ω``.
OPTIMIZER_BYTES_PER_PARAM = 12


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer.

    Parameters
    ----------
    name
        Human-readable name (used in messages and result files).
    layers
        Number of transformer blocks ``L``, at most :data:`MAX_LAYERS`.
    hidden
        Model width ``d``, at most :data:`MAX_HIDDEN`.
    ffn_hidden
        FFN inner width ``dff``, at most :data:`MAX_FFN_HIDDEN`.
    vocab
        Vocabulary size ``V``, at most :data:`MAX_VOCAB`.
    heads
        Number of query heads, at most :data:`MAX_HEADS`.
    kv_heads
        Number of key/value heads (``kv_heads < heads`` is grouped-query attention).
    head_dim
        Width of one head, at most :data:`MAX_HEAD_DIM`; ``0`` means ``hidden // heads``.
    ffn_projections
        Matrices in the FFN: 2 for ``up, down``; 3 for gated ``gate, up, down`` (SwiGLU, GeGLU).
    tied_embeddings
        Whether the LM head shares the input embedding matrix.
    dtype_bytes
        Bytes per scalar ``sb`` of weights and activations (2 for BF16): the integer 1, 2 or 4.
    family
        Hugging Face architecture the runtime builds for this shape, one of :data:`FAMILIES`
        (``model_type`` of a ``config.json``). The cost model does not read it. A shape of another
        architecture (GPT-3's two-projection FFN; a Qwen3, Gemma, Phi-3, GPT-2, OPT or GPT-NeoX
        ``config.json``, which :meth:`from_hf_config` reads with family ``"llama"``) plans as
        itself and runs as a ``llama`` model of the runtime's scale
        (:func:`rpeg.runtime.binding.scale_spec`); the runtime refuses such a checkpoint's weights.
    checkpoint
        Local Hugging Face checkpoint directory (``config.json`` and ``*.safetensors``) whose
        weights the runtime runs this model with, at full size; ``""``: none (the runtime builds a
        scaled model with seeded weights). Set by :meth:`from_hf_config` when the directory holds
        safetensors files; the cost model does not read it.
    experts
        Routed experts ``E`` of each mixture-of-experts layer (SPEC §15.1); ``0``: a dense model
        (the expert fields below are then 0 and ``dense_layers`` empty).
    experts_active
        Routed experts ``k`` each token goes through (``1 ≤ k ≤ E``).
    expert_ffn
        FFN width ``d_e`` of one routed expert (same projections as the dense FFN).
    shared_experts, shared_ffn
        Shared experts ``S`` every token goes through, and the FFN width ``d_s`` of each
        (``0, 0``: none).
    dense_layers
        Layer indices (0-based, increasing) whose FFN is the dense one (``ffn_hidden``) in a
        mixture-of-experts model: DeepSeek's and GLM-4.5's first ``k`` layers, Qwen-MoE's
        ``mlp_only_layers``. The other layers are MoE layers.
    q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        Multi-head latent attention (DeepSeek-V2/V3; SPEC §15.1), all 0 for standard attention:
        the query's low-rank width (0: no query compression), the compressed K/V latent's width,
        each head's query/key width without and with rotary embedding (the rotary key is one
        shared head), each head's value width. ``kv_lora_rank > 0`` makes the model MLA, and then
        the last three are required; ``head_dim`` and ``kv_heads`` are not used for attention.
    sliding_window
        Attention window ``W`` in tokens of the layers in ``sliding_layers`` (SPEC §15.1): a query
        attends to the last ``min(c, W)`` of its ``c`` context tokens, and the KV cache of such a
        layer holds ``min(c, W)`` tokens per sequence (gpt-oss 128, Gemma-2 4,096, Gemma-3 512 or
        1,024); at most :data:`MAX_WINDOW`. ``0``: every layer attends in full.
    sliding_layers
        Layer indices (0-based, increasing) that attend through the window: gpt-oss's and
        Gemma-2's even layers, five of every six of Gemma-3's. Given exactly when
        ``sliding_window > 0``.
    precision
        The GEMM precision the engines run this model with, one of :data:`PRECISIONS`:
        ``"bf16"`` (default), ``"fp8"`` or ``"nvfp4"``. With ``"fp8"`` the transformer blocks'
        weight GEMMs (QKV, output projection, FFN and experts) run at the hardware's FP8 peak and
        read FP8 weights and inputs; the attention core and the LM head stay BF16; a generation
        engine (vLLM ``quantization="fp8"``) stores the blocks' weights in 1 byte, a trainer keeps
        BF16 weights with FP32 master copies (``docs/cost-model.md`` §11). ``"nvfp4"`` is the
        same with the FP4 peak and :data:`GEMM_ELEMENT_BYTES` ``["nvfp4"]`` (0.5625) bytes per
        weight and input. Both need ``dtype_bytes = 2`` (low-precision GEMMs of a BF16 model)
        and hardware with the matching peak (FP8: Hopper, Ada, Blackwell; NVFP4: Blackwell) to
        train or run teacher-forced; a generation engine without it serves the checkpoint as
        weight-only GEMMs, as vLLM's Marlin kernels do (``docs/cost-model.md`` §11).
        ``"mxfp4"`` (a mixture of experts only) changes generation alone: the engine stores the
        routed experts in MXFP4 (:data:`MXFP4_BYTES`, 0.53125 bytes per weight) and their GEMMs
        read those weights at the BF16 peak (weight-only, W4A16: vLLM's Marlin and Triton MoE
        kernels on Ampere and Hopper); attention, shared experts, dense layers, embedding and
        head stay BF16, and so do training, teacher-forced passes and weight transfers
        (``docs/cost-model.md`` §11).
    load_imbalance
        ``λ ≥ 1`` of SPEC §15.2 (a mixture of experts only): with expert parallelism the busiest
        rank's expert GEMMs take ``λ`` times the mean, and every rank waits for it. Default
        :data:`DEFAULT_LOAD_IMBALANCE` (1.2, SPEC's); 1 for a router that balances exactly
        (Megatron-core's ``moe_router_force_load_balancing``, which NVIDIA's benchmark recipes
        set), more for a router whose balance was measured worse; at most
        :data:`MAX_LOAD_IMBALANCE`.
    attention_sinks
        Whether each attention head adds a learned sink logit to its softmax's denominator
        (gpt-oss: one scalar per head and layer, ``GptOssAttention.sinks``). The model's work is
        the same; what changes is which kernels can run it: FlashAttention-2 cannot, so vLLM
        serves such a model on Ampere with its Triton attention kernel (``TRITON_ATTN``), whose
        rate a GPU preset's :attr:`~rpeg.ir.hardware.EngineStep.sink_attention_efficiency`
        carries (``docs/cost-model.md`` §8, "Attention sinks on the engine"). Default ``False``.

    Raises
    ------
    ValueError
        If a field is not of its type (an integer figure given as ``2.0`` or ``True``) or out of
        range (above its ``MAX_*`` bound too); the message names the field and its value.
        Integer figures may be NumPy integers; they are stored as ``int``.
    """

    name: str
    layers: int
    hidden: int
    ffn_hidden: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int = 0
    ffn_projections: int = 3
    tied_embeddings: bool = False
    dtype_bytes: int = 2
    family: str = "llama"
    checkpoint: str = ""
    experts: int = 0
    experts_active: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0
    shared_ffn: int = 0
    dense_layers: tuple[int, ...] = ()
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int = 0
    sliding_layers: tuple[int, ...] = ()
    precision: str = "bf16"
    load_imbalance: float = DEFAULT_LOAD_IMBALANCE
    attention_sinks: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"ModelSpec: name must be a string, got {self.name!r}")
        if not isinstance(self.checkpoint, str):
            raise TypeError(
                f"ModelSpec {self.name!r}: checkpoint must be a path string, got {self.checkpoint!r}"
            )
        # integers (NumPy's too, stored as int; never bool or float such as 2.0), within bounds
        for field, (bound, limit) in _LIMITS.items():
            value = getattr(self, field)
            low = 0 if field in _ZERO_ALLOWED else 1
            what = (
                "a positive integer"
                if low
                else "a non-negative integer (0: hidden // heads)"
                if field == "head_dim"
                else "a non-negative integer (0: no window)"
                if field == "sliding_window"
                else "a non-negative integer (0: a dense model)"
            )
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"ModelSpec {self.name!r}: {field} must be {what}, got {_show(value)}")
            value = int(value)
            object.__setattr__(self, field, value)
            if value < low:
                raise ValueError(f"ModelSpec {self.name!r}: {field} must be {what}, got {value!r}")
            if value > limit:
                raise ValueError(
                    f"ModelSpec {self.name!r}: {field} = {_show(value)} is above {bound} = {limit:,} "
                    "(far above any published model; rpeg refuses larger figures)"
                )
        for field, allowed in (("ffn_projections", (2, 3)), ("dtype_bytes", (1, 2, 4))):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value not in allowed:
                raise ValueError(
                    f"ModelSpec {self.name!r}: {field} must be one of the integers "
                    f"{', '.join(map(str, allowed))}, got {_show(value)}"
                )
            object.__setattr__(self, field, int(value))
        if self.head_dim == 0:
            if self.hidden % self.heads:
                raise ValueError(
                    f"ModelSpec {self.name!r}: hidden={self.hidden} is not divisible by heads={self.heads}; "
                    "give head_dim explicitly"
                )
            head_dim = self.hidden // self.heads
            if head_dim > MAX_HEAD_DIM:
                raise ValueError(
                    f"ModelSpec {self.name!r}: head_dim = hidden // heads = {head_dim} is above "
                    f"MAX_HEAD_DIM = {MAX_HEAD_DIM:,} (far above any published model)"
                )
            object.__setattr__(self, "head_dim", head_dim)
        if self.heads % self.kv_heads:
            raise ValueError(
                f"ModelSpec {self.name!r}: heads={self.heads} is not a multiple of kv_heads={self.kv_heads}"
            )
        for flag in ("tied_embeddings", "attention_sinks"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(
                    f"ModelSpec {self.name!r}: {flag} must be True or False, got {getattr(self, flag)!r}"
                )
        if not isinstance(self.family, str) or self.family not in FAMILIES:
            raise ValueError(
                f"ModelSpec {self.name!r}: family must be one of {', '.join(FAMILIES)}, got {self.family!r}"
            )
        self._check_experts()
        self._check_mla()
        self._check_window()
        self._check_precision()

    def _check_precision(self) -> None:
        """``precision`` is one of :data:`PRECISIONS`; ``"fp8"`` and ``"nvfp4"`` only for a BF16
        model."""
        if not isinstance(self.precision, str) or self.precision not in PRECISIONS:
            raise ValueError(
                f"ModelSpec {self.name!r}: precision must be one of "
                f"{', '.join(map(repr, PRECISIONS))}, got {_show(self.precision)}"
            )
        if self.precision != "bf16" and self.dtype_bytes != 2:
            raise ValueError(
                f"ModelSpec {self.name!r}: precision {self.precision!r} "
                + (
                    "quantizes the experts of"
                    if self.precision == "mxfp4"
                    else "runs the low-precision GEMMs of"
                )
                + f" a BF16 model (dtype_bytes = 2), got dtype_bytes = {self.dtype_bytes}"
            )
        if self.precision == "mxfp4" and not self.experts:
            raise ValueError(
                f"ModelSpec {self.name!r}: precision 'mxfp4' stores a mixture of experts' routed "
                "experts in MXFP4 (vLLM quantizes only the MoE layers), but the model has no "
                "experts (experts = 0); use precision 'bf16', 'fp8' or 'nvfp4'"
            )

    @property
    def is_fp8(self) -> bool:
        """Whether the blocks' weight GEMMs run in FP8 (``precision == "fp8"``)."""
        return self.precision == "fp8"

    @property
    def is_low_precision(self) -> bool:
        """Whether the blocks' weight GEMMs run below BF16 (``precision`` ``"fp8"`` or ``"nvfp4"``;
        ``"mxfp4"``'s GEMMs run at the BF16 peak)."""
        return self.precision in ("fp8", "nvfp4")

    @property
    def has_mxfp4_experts(self) -> bool:
        """Whether a generation engine stores the routed experts in MXFP4 and runs them as
        weight-only GEMMs (``precision == "mxfp4"``)."""
        return self.precision == "mxfp4"

    @property
    def served_expert_bytes(self) -> float:
        """Bytes per routed-expert weight in a generation engine: :data:`MXFP4_BYTES` (0.53125)
        under ``"mxfp4"``, else the blocks' :attr:`gemm_bytes` under FP8 or NVFP4, else ``sb``."""
        if self.has_mxfp4_experts:
            return MXFP4_BYTES
        return self.gemm_bytes if self.is_low_precision else float(self.dtype_bytes)

    @property
    def gemm_bytes(self) -> float:
        """Bytes per element of the blocks' GEMM operands: :data:`GEMM_ELEMENT_BYTES` of the
        precision (1 for FP8, 0.5625 for NVFP4), ``sb`` for BF16 and for MXFP4, whose GEMMs
        dequantize their weights and run on BF16 operands (:attr:`served_expert_bytes`)."""
        return GEMM_ELEMENT_BYTES.get(self.precision, float(self.dtype_bytes))

    def _layer_indices(self, field: str) -> tuple[int, ...]:
        """Field ``field`` (``dense_layers``, ``sliding_layers``) as a tuple of ints, stored back;
        a list is accepted, anything else but integers refused, naming the field."""
        value = getattr(self, field)
        layers = tuple(value) if isinstance(value, list) else value
        if not isinstance(layers, tuple) or any(
            isinstance(i, bool) or not isinstance(i, numbers.Integral) for i in layers
        ):
            raise ValueError(
                f"ModelSpec {self.name!r}: {field} must be a tuple of layer indices, got {_show(value)}"
            )
        layers = tuple(int(i) for i in layers)
        object.__setattr__(self, field, layers)
        return layers

    def _check_window(self) -> None:
        """``sliding_layers`` are increasing layer indices, given exactly when ``sliding_window > 0``."""
        where = f"ModelSpec {self.name!r}"
        layers = self._layer_indices("sliding_layers")
        if not self.sliding_window:
            if layers:
                raise ValueError(
                    f"{where}: sliding_layers = {_show(list(layers))} but sliding_window = 0 (no layer "
                    "has a window)"
                )
            return
        if not layers:
            raise ValueError(
                f"{where}: sliding_window = {self.sliding_window} but sliding_layers is empty (name the "
                "layers that attend through the window)"
            )
        if list(layers) != sorted(set(layers)) or any(not 0 <= i < self.layers for i in layers):
            raise ValueError(
                f"{where}: sliding_layers must be increasing layer indices in 0..{self.layers - 1}, "
                f"got {_show(list(layers))}"
            )

    def _check_mla(self) -> None:
        """The MLA fields are all 0, or describe a latent attention (SPEC §15.1)."""
        if not self.kv_lora_rank:
            extra = [f"{f} = {getattr(self, f)}" for f in _MLA_SPEC_FIELDS if getattr(self, f)]
            if extra:
                raise ValueError(
                    f"ModelSpec {self.name!r}: {', '.join(extra)} but kv_lora_rank = 0 (standard attention "
                    "has no latent-attention fields)"
                )
            return
        missing = [f for f in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim") if not getattr(self, f)]
        if missing:
            raise ValueError(
                f"ModelSpec {self.name!r}: multi-head latent attention (kv_lora_rank = {self.kv_lora_rank}) "
                f"needs {', '.join(missing)} > 0"
            )

    def _check_experts(self) -> None:
        """The mixture-of-experts fields agree with each other and with ``layers`` (SPEC §15.1)."""
        where = f"ModelSpec {self.name!r}"
        dense = self._layer_indices("dense_layers")
        lam = self.load_imbalance
        if (
            isinstance(lam, bool)
            or not isinstance(lam, numbers.Real)
            or not math.isfinite(lam)
            or not 1.0 <= lam <= MAX_LOAD_IMBALANCE
        ):
            raise ValueError(
                f"{where}: load_imbalance must be a number in [1, {MAX_LOAD_IMBALANCE:g}] (the busiest "
                f"expert-parallel rank's tokens over the mean), got {_show(lam)}"
            )
        object.__setattr__(self, "load_imbalance", float(lam))
        if self.experts == 0 and lam != DEFAULT_LOAD_IMBALANCE:
            raise ValueError(
                f"{where}: load_imbalance = {lam!r} but experts = 0 (a dense model has no experts to balance)"
            )
        if self.experts == 0:
            extra = [
                f"{f} = {getattr(self, f)!r}"
                for f in ("experts_active", "expert_ffn", "shared_experts", "shared_ffn", "dense_layers")
                if getattr(self, f)
            ]
            if extra:
                raise ValueError(
                    f"{where}: {', '.join(extra)} but experts = 0 (a dense model has no experts)"
                )
            return
        if self.experts < 2:
            raise ValueError(f"{where}: experts must be 0 (dense) or at least 2, got {self.experts}")
        if not 1 <= self.experts_active <= self.experts:
            raise ValueError(
                f"{where}: experts_active must be between 1 and experts = {self.experts}, got {self.experts_active}"
            )
        if self.expert_ffn < 1:
            raise ValueError(
                f"{where}: expert_ffn must be a positive integer for a model with experts, got 0"
            )
        if (self.shared_experts == 0) != (self.shared_ffn == 0):
            raise ValueError(
                f"{where}: shared_experts = {self.shared_experts} and shared_ffn = {self.shared_ffn} must be "
                "both 0 (no shared expert) or both positive"
            )
        if list(dense) != sorted(set(dense)) or any(not 0 <= i < self.layers for i in dense):
            raise ValueError(
                f"{where}: dense_layers must be increasing layer indices in 0..{self.layers - 1}, got {list(dense)}"
            )
        if len(dense) == self.layers:
            raise ValueError(f"{where}: every layer is in dense_layers, so no layer has experts")

    # ------------------------------------------------------------------ derived sizes
    @property
    def q_width(self) -> int:
        """Width of the query/output projections, ``heads · head_dim``."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width ``d_kv = kv_heads · head_dim`` of each of the K and V projections."""
        return self.kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        """Whether the model has mixture-of-experts layers (``E > 0``)."""
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        """Layers with experts, ``L_moe = L − |dense_layers|`` (0 for a dense model)."""
        return self.layers - len(self.dense_layers) if self.experts else 0

    @property
    def is_mla(self) -> bool:
        """Whether attention is multi-head latent attention (``kv_lora_rank > 0``)."""
        return self.kv_lora_rank > 0

    @property
    def attention_params(self) -> int:
        """Matmul parameters of one block's attention: ``2·d·d_q + 2·d·d_kv``; with latent
        attention (``H`` heads, query/key width ``d_qk = nope + rope``, value width ``d_v``)
        ``[d·r_q + r_q·H·d_qk or d·H·d_qk] + d·(r_kv + rope) + r_kv·H·(nope + d_v) + H·d_v·d``:
        the query's down and up projections (or one projection without ``r_q``), the joint K/V
        down projection with the shared rotary key, its up projection to every head's key and
        value, and the output."""
        d = self.hidden
        if not self.is_mla:
            return 2 * d * self.q_width + 2 * d * self.kv_width
        h, nope, rope, dv = self.heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim
        r_q, r_kv = self.q_lora_rank, self.kv_lora_rank
        query = d * r_q + r_q * h * (nope + rope) if r_q else d * h * (nope + rope)
        return query + d * (r_kv + rope) + r_kv * h * (nope + dv) + h * dv * d

    @property
    def attention_width(self) -> float:
        """``d_att``, the per-token width of the attention core, so that its FLOPs at context
        ``c`` are ``4·d_att·c``: ``d_q`` for standard attention (scores and the sum over ``V`` each
        ``2·d_q·c``); with latent attention, as trained and prefilled (keys and values expanded per
        head), ``H·(d_qk + d_v)/2``."""
        if not self.is_mla:
            return float(self.q_width)
        return self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim) / 2

    @property
    def decode_attention_width(self) -> float:
        """``d_att`` of one decode step: ``d_q``; with latent attention as engines decode it (the
        key and value up-projections absorbed into the query and output, attention over the
        cached latent), ``H·(2·r_kv + rope)/2``: scores over ``r_kv + rope``, the sum over
        ``r_kv``."""
        if not self.is_mla:
            return float(self.q_width)
        return self.heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim) / 2

    @property
    def kv_cache_width(self) -> int:
        """Scalars one token caches per block: ``2·d_kv`` (K and V); with latent attention
        ``r_kv + rope`` (the latent and the shared rotary key)."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_width

    @property
    def attention_activation_width(self) -> float:
        """Scalars a block's attention keeps per token for its backward, sharded over TP: ``Q``,
        ``K``, ``V`` and the output's input, ``2·d_q + 2·d_kv``; with latent attention
        ``2·H·d_qk + 2·H·d_v`` (the expanded per-head ones) plus the latents ``r_q + r_kv + rope``."""
        if not self.is_mla:
            return float(2 * self.q_width + 2 * self.kv_width)
        h, qk, dv = self.heads, self.qk_nope_head_dim + self.qk_rope_head_dim, self.v_head_dim
        return 2.0 * h * qk + 2.0 * h * dv + self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def is_windowed(self) -> bool:
        """Whether some layers attend through a sliding window (``sliding_window > 0``)."""
        return self.sliding_window > 0

    def attended(self, context: float, windowed: float | None = None) -> float:
        """Keys one query attends to at context ``c``, averaged over the blocks: ``c`` for a
        full-attention block, ``c_W = min(c, W)`` for a windowed one,
        ``((L − L_s)·c + L_s·c_W)/L`` with ``L_s`` = ``len(sliding_layers)``.

        The same figure is what a sequence at context ``c`` keeps in the blocks' KV caches, in
        full-attention tokens (a windowed block caches ``min(c, W)``). ``c`` itself for a model
        without a window.

        Parameters
        ----------
        context
            ``c``, or the mean context ``c̄`` of a stretch of decode steps.
        windowed
            The windowed blocks' mean ``E[min(c, W)]`` over that stretch (at most
            ``min(c̄, W)``); ``None``: ``min(c, W)``, exact for one context.

        Returns
        -------
        float
            Keys per query (tokens per sequence), averaged over the blocks.
        """
        if not self.sliding_window:
            return context
        c_w = min(context, self.sliding_window) if windowed is None else windowed
        n = len(self.sliding_layers)
        return ((self.layers - n) * context + n * c_w) / self.layers

    def windowed_mean(self, lo: float, hi: float) -> float:
        """``E[min(c, W)]`` for a context ``c`` uniform on ``[lo, hi]``,
        ``(lo + hi)/2 − ((hi − W)₊² − (lo − W)₊²)/(2·(hi − lo))`` (``min(lo, W)`` when
        ``hi = lo``): the windowed blocks' mean context over a stretch of decode steps (a model
        with a window)."""
        w = self.sliding_window
        if hi <= lo:
            return float(min(lo, w))
        excess = max(0.0, hi - w) ** 2 - max(0.0, lo - w) ** 2
        return 0.5 * (lo + hi) - excess / (2.0 * (hi - lo))

    def attended_square(self, tokens_sq: float, window_sq: float | None = None) -> float:
        """The ``ℓ²`` of the attention core, averaged over the blocks:
        ``((L − L_s)·E[ℓ²] + L_s·E[s_W(ℓ)])/L`` with ``s_W(ℓ) = ℓ² − (ℓ − W)₊²``.

        Under the causal mask a full-attention block does ``Σ_{c ≤ ℓ} 4·d_att·c ≈ 2·d_att·ℓ²``
        over a sequence of ``ℓ`` tokens, a windowed block ``Σ_{c ≤ ℓ} 4·d_att·min(c, W) ≈
        2·d_att·s_W(ℓ)``: ``ℓ²`` up to ``ℓ = W``, then ``2·W`` more per token. ``tokens_sq``
        itself for a model without a window.

        Parameters
        ----------
        tokens_sq
            ``E[ℓ²]`` (``ℓ²`` for one length).
        window_sq
            ``E[s_W(ℓ)]`` of the sequences' lengths; ``None``: ``s_W(√E[ℓ²])``, exact for one
            length and where no length exceeds ``W``, an upper bound otherwise (``s_W(√y)`` is
            concave in ``y``, so ``E[s_W(ℓ)] ≤ s_W(√E[ℓ²])`` by Jensen's inequality).

        Returns
        -------
        float
            Squared tokens per sequence, averaged over the blocks.
        """
        if not self.sliding_window:
            return tokens_sq
        if window_sq is None:
            excess = max(0.0, math.sqrt(tokens_sq) - self.sliding_window)
            window_sq = tokens_sq - excess * excess
        n = len(self.sliding_layers)
        return ((self.layers - n) * tokens_sq + n * window_sq) / self.layers

    @property
    def dense_ffn_params(self) -> int:
        """Matmul parameters of one dense FFN, ``n_ffn·d·dff``."""
        return self.ffn_projections * self.hidden * self.ffn_hidden

    @property
    def expert_params(self) -> int:
        """Matmul parameters of one routed expert, ``n_ffn·d·d_e`` (0 for a dense model)."""
        return self.ffn_projections * self.hidden * self.expert_ffn

    @property
    def _moe_fixed_params(self) -> int:
        """Parameters every token of a MoE layer uses besides its routed experts: the shared
        experts ``S·n_ffn·d·d_s`` and the router ``d·E``."""
        return (
            self.shared_experts * self.ffn_projections * self.hidden * self.shared_ffn
            + self.hidden * self.experts
        )

    @property
    def _ffn_weights_sum(self) -> int:
        """FFN weights of all blocks: ``(L − L_moe)·n_ffn·d·dff + L_moe·(E·n_ffn·d·d_e + S·n_ffn·d·d_s + d·E)``."""
        dense = (self.layers - self.moe_layers) * self.dense_ffn_params
        return dense + self.moe_layers * (self.experts * self.expert_params + self._moe_fixed_params)

    @property
    def _ffn_active_sum(self) -> int:
        """FFN parameters all blocks apply to one token: routed experts count ``k``, not ``E``."""
        dense = (self.layers - self.moe_layers) * self.dense_ffn_params
        return dense + self.moe_layers * (self.experts_active * self.expert_params + self._moe_fixed_params)

    @property
    def layer_params(self) -> float:
        """Matmul parameters one token goes through in a block, ``W_layer`` (per block, averaged
        over the blocks), which every FLOP count multiplies.

        Dense: ``W_layer = 2·d·d_q + 2·d·d_kv + n_ffn·d·dff``; without GQA (``d_kv = d_q = d``) this
        is the SPEC §6 form ``4d² + n_ffn·d·dff``. Mixture of experts (SPEC §15.1): the attention
        plus ``(1/L)·[(L − L_moe)·n_ffn·d·dff + L_moe·(k·n_ffn·d·d_e + S·n_ffn·d·d_s + d·E)]``: each
        token goes through ``k`` routed experts, the shared ones and the router. Norm weights
        (``2d``) are not matmul work and are counted only in :attr:`params`. An integer for a
        dense model.
        """
        if not self.experts:
            return self.attention_params + self.dense_ffn_params
        return self.attention_params + self._ffn_active_sum / self.layers

    @property
    def layer_weights(self) -> float:
        """Matmul parameters a block stores, per block averaged over the blocks: for a mixture of
        experts the attention plus ``(1/L)·[(L − L_moe)·n_ffn·d·dff + L_moe·(E·n_ffn·d·d_e +
        S·n_ffn·d·d_s + d·E)]`` — every routed expert; :attr:`layer_params` for a dense model.
        Weight memory, gradients and optimizer state multiply this."""
        if not self.experts:
            return self.layer_params
        return self.attention_params + self._ffn_weights_sum / self.layers

    def experts_touched(self, tokens: float, ep: int = 1) -> float:
        """Routed experts of one rank a pass of ``tokens`` tokens per rank reaches in a MoE block,
        in expectation under uniform routing (each token picks ``k`` of ``E``):
        ``(E/Pe)·(1 − (1 − k/E)^(n·Pe))`` with ``n = tokens`` and ``Pe = ep`` expert-parallel
        ranks, whose tokens all reach the rank's ``E/Pe`` experts (SPEC §15.2). All of them for a
        training microbatch, a fraction for a decode step of a few sequences. 0 for a dense
        model."""
        if not self.experts:
            return 0.0
        n = max(float(tokens), 0.0) * ep
        return self.experts / ep * (1.0 - (1.0 - self.experts_active / self.experts) ** n)

    def layer_weights_read(self, tokens: float, ep: int = 1) -> float:
        """Matmul weights a pass of ``tokens`` tokens reads from memory per block (averaged): a
        dense block all of :attr:`layer_params`; a MoE block its attention, shared experts and
        router, and of its ``E`` routed experts the ``E·(1 − (1 − k/E)^n)`` that ``n = tokens``
        tokens touch in expectation under uniform routing (each token picks ``k`` of ``E``) — a
        decode step of a few sequences reads a fraction of the experts, a training microbatch all
        of them. With ``ep = Pe`` expert-parallel ranks (SPEC §15.2) one rank holds ``E/Pe`` of
        the experts and receives the tokens of all ``Pe`` ranks: it reads
        ``(E/Pe)·(1 − (1 − k/E)^(n·Pe))`` experts."""
        if not self.experts:
            return self.layer_params
        touched = self.experts_touched(tokens, ep)
        dense = (self.layers - self.moe_layers) * self.dense_ffn_params
        moe = self.moe_layers * (touched * self.expert_params + self._moe_fixed_params)
        return self.attention_params + (dense + moe) / self.layers

    @property
    def expert_weights(self) -> float:
        """Routed-expert parameters a block stores, averaged over the blocks,
        ``L_moe·E·n_ffn·d·d_e/L`` (0 for a dense model): the part of :attr:`layer_weights` that
        expert parallelism shards (SPEC §15.2)."""
        return self.moe_layers * self.experts * self.expert_params / self.layers if self.experts else 0.0

    @property
    def ffn_width(self) -> float:
        """Intermediate FFN width one token has in a block, averaged over the blocks: ``dff`` for a
        dense block, ``k·d_e + S·d_s`` for a MoE block (the token's copies in its ``k`` routed
        experts and the shared ones). The activation and buffer terms multiply it."""
        if not self.experts:
            return float(self.ffn_hidden)
        moe = self.experts_active * self.expert_ffn + self.shared_experts * self.shared_ffn
        return ((self.layers - self.moe_layers) * self.ffn_hidden + self.moe_layers * moe) / self.layers

    @property
    def routed_width(self) -> float:
        """Token copies a MoE block dispatches, per token averaged over the blocks: ``k·d`` for a
        MoE block (each of the ``k`` routed experts gets the token's ``d`` hidden values), 0 for a
        dense one."""
        return self.moe_layers * self.experts_active * self.hidden / self.layers

    @property
    def expert_flop_share(self) -> float:
        """``φ``: the routed experts' share of a token's matmul FLOPs,
        ``L_moe·k·n_ffn·d·d_e / (L·W_layer)`` (0 for a dense model); their GEMMs run at the expert
        shape's efficiency (``docs/cost-model.md``)."""
        if not self.experts:
            return 0.0
        return self.moe_layers * self.experts_active * self.expert_params / (self.layers * self.layer_params)

    @property
    def embedding_params(self) -> int:
        """Input embedding ``V·d``."""
        return self.vocab * self.hidden

    def _total(self, ffn: int) -> int:
        d = self.hidden
        head = 0 if self.tied_embeddings else self.vocab * d
        norms = 2 * d + self.q_lora_rank + self.kv_lora_rank  # latent attention normalises its latents
        return self.layers * (self.attention_params + norms) + ffn + self.embedding_params + d + head

    @property
    def params(self) -> int:
        """Total parameter count ``N_m``.

        ``N = L·(W_layer + 2d) + V·d + d + (0 if tied else V·d)``: blocks with their two norms,
        the input embedding, the final norm and an untied LM head; with experts every routed
        expert counts (``L·W_layer`` is then ``L·``:attr:`layer_weights`).
        """
        return self._total(self._ffn_weights_sum)

    @property
    def active_params(self) -> int:
        """Parameters one token goes through, as :attr:`params` with ``k`` routed experts per MoE
        layer instead of ``E`` (the published "active" count); :attr:`params` for a dense model."""
        return self._total(self._ffn_active_sum)

    @property
    def weight_bytes(self) -> int:
        """Bytes of one full copy of the weights, ``N_m·sb``."""
        return self.params * self.dtype_bytes

    def scaled(
        self,
        *,
        layers: int,
        hidden: int,
        heads: int,
        kv_heads: int | None = None,
        ffn_hidden: int | None = None,
        vocab: int | None = None,
    ) -> ModelSpec:
        """A smaller model of the same family (for CPU runs and tests).

        ``ffn_hidden`` defaults to the original ratio ``dff/d`` applied to the new ``hidden``; a
        mixture of experts keeps its expert counts, scales the expert widths by ``hidden``'s ratio
        and keeps the dense layers that still exist; a sliding window stays on the windowed layers
        that still exist (none left: no window).
        """
        ratio = self.ffn_hidden / self.hidden
        scale = hidden / self.hidden
        return replace(
            self,
            name=f"{self.name}-scaled",
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads if kv_heads is not None else heads,
            head_dim=0,
            ffn_hidden=ffn_hidden if ffn_hidden is not None else max(1, round(hidden * ratio)),
            vocab=vocab if vocab is not None else self.vocab,
            checkpoint="",
            expert_ffn=max(1, round(self.expert_ffn * scale)) if self.experts else 0,
            shared_ffn=max(1, round(self.shared_ffn * scale)) if self.shared_experts else 0,
            dense_layers=tuple(i for i in self.dense_layers if i < min(layers, self.layers) - 1),
            sliding_window=self.sliding_window if any(i < layers for i in self.sliding_layers) else 0,
            sliding_layers=tuple(i for i in self.sliding_layers if i < layers),
        )

    # ------------------------------------------------------------------ constructors
    @classmethod
    def preset(cls, name: str) -> ModelSpec:
        """Return the preset called ``name`` (see :data:`MODEL_PRESETS`)."""
        return model_preset(name)

    @classmethod
    def from_hf_config(cls, path: str | Path, name: str | None = None) -> ModelSpec:
        """Read a Hugging Face ``config.json`` from disk (nothing is downloaded).

        The file is read as ``transformers`` reads it, per architecture: ``model_type`` picks an
        entry of :data:`HF_ARCHITECTURES` (dense: ``llama``, ``mistral``, ``qwen2``, ``qwen3``,
        ``gemma``, ``phi3``, ``gpt2``, ``opt``, ``gpt_neox``, and with sliding-window layers
        ``gemma2`` and ``gemma3_text``; mixture of experts: ``qwen2_moe``, ``qwen3_moe``,
        ``mixtral``, ``glm4_moe``, ``deepseek_v2``, ``deepseek_v3`` and, with sliding-window
        layers, ``gpt_oss``, whose expert fields — and DeepSeek's latent-attention fields,
        and the windows' width — are required and read as :func:`_read_experts`,
        :func:`_read_latent` and :func:`_read_window` say), which names the fields and gives the
        config class's defaults:

        * the shape fields are required: layers, width and query heads (``num_hidden_layers``,
          ``hidden_size``, ``num_attention_heads``; GPT-2: ``n_layer``, ``n_embd``, ``n_head``),
          ``vocab_size`` and the FFN width (``intermediate_size``; OPT: ``ffn_dim``; GPT-2's
          ``n_inner`` may be absent or ``null``: ``4·n_embd``);
        * ``num_key_value_heads`` absent: the class default (Mistral 8, Qwen2/Qwen3 32, Gemma 16,
          Gemma-2/3 4, gpt-oss 8; Llama, Phi-3: the query heads); ``null``, or an architecture
          without the field: the query heads;
        * ``head_dim`` absent or ``null``: the class default (Qwen3 128, Gemma, Gemma-2/3 256,
          gpt-oss 64; others ``hidden // heads``); GPT-2, OPT and GPT-NeoX have none;
        * ``tie_word_embeddings`` absent or ``null``: the class default (tied for GPT-2, OPT and
          Gemma-1/2/3; untied for the others);
        * the FFN is gated (3 projections: ``gate, up, down``) for Llama, Mistral, Qwen2, Qwen3,
          Gemma-1/2/3, Phi-3 and gpt-oss's experts whatever ``hidden_act`` says (Gemma's GeGLU
          has ``gelu``), and has 2 (``up, down``) for GPT-2, OPT and GPT-NeoX;
        * sliding-window layers (gpt-oss, Gemma-2, Gemma-3): those ``layer_types`` calls
          ``"sliding_attention"``, else the config class's pattern (every other layer from the
          first; Gemma-3 five of six, ``sliding_window_pattern``), with the required
          ``sliding_window``; a ``layer_types`` entry other than ``"full_attention"`` and
          ``"sliding_attention"`` is refused under any ``model_type``;
        * ``torch_dtype`` (or ``dtype``; default ``bfloat16``) gives the bytes per scalar.

        Biases, learned position embeddings and LayerNorm biases are not counted (as the norms,
        they are not matmul work): GPT-2 small reads as 123.6M parameters against its 124.4M.
        Nor are gpt-oss's attention sinks (one scalar per head and layer; read as
        ``attention_sinks = True``, which changes which kernels serve it), Gemma-2/3's two extra
        norms per block and Gemma-3's QK-norms (two norms per block count, ``2d``, for every
        architecture). Mistral's ``sliding_window`` (and Qwen2/Qwen3's with
        ``use_sliding_window``, Phi-3's) is not modelled: a window at least as long as the
        sequences changes nothing, a shorter one is over-counted (attention FLOPs and KV cache as
        full attention: conservative). gpt-oss's published ``quantization_config``
        (``quant_method`` ``"mxfp4"``: its experts stored in MXFP4) is read as the BF16 model it
        dequantizes to, the model RL trains (``precision = "mxfp4"`` on the spec prices rollouts
        served from the MXFP4 experts instead).
        ``ModelSpec.family`` is the ``model_type`` for the runtime's :data:`FAMILIES` and
        ``"llama"`` for the others: they plan as themselves and run as a scaled Llama model (the
        runtime refuses their checkpoints' weights). When the directory also holds
        ``*.safetensors`` weights, :attr:`checkpoint` is its absolute path.

        Refused, naming the field and its value: a missing ``model_type`` or one outside
        :data:`HF_ARCHITECTURES` (Gemma-3's image-text ``gemma3``: its vision tower); a quantized
        checkpoint (``quantization_config``: AWQ, GPTQ, bitsandbytes, FP8, ..., and MXFP4 outside
        gpt-oss; quantized weights are not modelled); bidirectional attention
        (``use_bidirectional_attention``); a missing ``sliding_window`` where layers are
        windowed, a ``layer_types`` of the wrong length or with another kind; OPT with a
        ``word_embed_proj_dim`` other than ``hidden_size``; a figure above its ``MAX_*`` bound;
        a missing or out-of-range expert field; mixture-of-experts architectures not in the table
        and multi-head-latent-attention models (read as dense models their parameters, FLOPs and
        KV cache would be wrong): a ``model_type`` of a known MoE architecture (or one containing
        ``moe``) without an expert reader (Llama 4: chunked attention; OLMoE, DBRX, ...), an
        expert count above 1 under such a ``model_type`` (``num_experts``,
        ``num_local_experts``, ``n_routed_experts``, ``moe_num_experts``,
        ``num_experts_per_tok``, ...; also inside a nested table such as DBRX's ``ffn_config``),
        or a non-null ``kv_lora_rank``/``q_lora_rank`` under a ``model_type`` other than DeepSeek's.

        Parameters
        ----------
        path
            The ``config.json`` file, or the directory that holds it.
        name
            The spec's name; defaults to ``_name_or_path``, then ``model_type``, then the folder.

        Returns
        -------
        ModelSpec
            The model the file describes.

        Raises
        ------
        InputError
            If the file is missing or not JSON, a field is missing, of the wrong type or out of
            range, or the model is of an architecture rpeg does not read (above); the message
            names the file, the field and its value.
        """
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        cfg = read_json(path, "model config")
        if not isinstance(cfg, dict):
            raise InputError(f"{path}: a model config must be a JSON object, got {type(cfg).__name__}")
        source = str(path)

        def pick(key: str, field: str, default: int | None = None) -> int:
            """``cfg[key]`` as a figure of ``ModelSpec.field`` (absent or null: ``default``)."""
            value = cfg.get(key)
            if value is None:
                if default is None:
                    raise InputError(f"{path}: missing config field {key!r}", source=source, field=key)
                return default
            bound, limit = _LIMITS[field]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(
                    f"{path}: field {key!r} must be a positive integer, got {_show(value)}",
                    source=source,
                    field=key,
                )
            if value > limit:
                raise InputError(
                    f"{path}: field {key!r} = {_show(value)} is above {bound} = {limit:,} (far above "
                    "any published model; rpeg refuses larger figures)",
                    source=source,
                    field=key,
                )
            return value

        def text(key: str, default: str) -> str:
            value = cfg.get(key, default)
            if value is None:
                return default
            if not isinstance(value, str):
                raise InputError(
                    f"{path}: field {key!r} must be a string, got {value!r}", source=source, field=key
                )
            return value

        _refuse_unsupported(cfg, path)
        arch = _architecture(cfg, path)
        hidden = pick(arch.hidden, "hidden")
        heads = pick(arch.heads, "heads")
        dtype = text("torch_dtype", text("dtype", "bfloat16"))
        dtypes = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "float8_e4m3fn": 1}
        if dtype not in dtypes:
            raise InputError(
                f"{path}: field 'torch_dtype' must be one of {', '.join(dtypes)}, got {dtype!r}",
                source=source,
                field="torch_dtype",
            )
        tied = cfg.get("tie_word_embeddings")
        if tied is None:
            tied = arch.tied
        if not isinstance(tied, bool):
            raise InputError(
                f"{path}: field 'tie_word_embeddings' must be true or false, got {tied!r}",
                source=source,
                field="tie_word_embeddings",
            )
        if arch.kv_heads and arch.kv_heads in cfg:  # a null: the query heads
            kv_heads = pick(arch.kv_heads, "kv_heads", default=heads)
        else:
            kv_heads = arch.kv_default or heads
        head_dim = pick(arch.head_dim, "head_dim", default=arch.head_dim_default) if arch.head_dim else 0
        ffn_default = arch.ffn_default * hidden if arch.ffn_default else None
        model_type = cfg["model_type"]
        label = name or text("_name_or_path", "") or model_type or path.parent.name
        fields = {
            "name": label,
            "layers": pick(arch.layers, "layers"),
            "hidden": hidden,
            "ffn_hidden": pick(arch.ffn, "ffn_hidden", default=ffn_default),
            "vocab": pick("vocab_size", "vocab"),
            "heads": heads,
            "kv_heads": kv_heads,
            "head_dim": head_dim,
            "ffn_projections": 3 if arch.gated else 2,
            "tied_embeddings": tied,
            "dtype_bytes": dtypes[dtype],
            "family": arch.family,
            "checkpoint": str(path.parent.resolve()) if any(path.parent.glob("*.safetensors")) else "",
            "attention_sinks": arch.sinks,
        }
        if arch.experts:
            fields.update(_read_experts(cfg, arch.experts, int(fields["layers"]), path))
        if arch.latent:
            fields.update(_read_latent(cfg, path))
        if arch.window_period:
            fields.update(_read_window(cfg, arch, int(fields["layers"]), path))
        else:  # the kinds must be known; a window of Mistral, Qwen2 or Phi-3 reads as full attention
            _layer_types(cfg, int(fields["layers"]), path)
        try:
            return cls(**fields)
        except ValueError as exc:
            raise InputError(f"{path}: {exc}", source=source) from None

    def to_dict(self) -> dict[str, object]:
        """Plain-data form (inverse of ``ModelSpec(**d)``)."""
        return (
            {
                "name": self.name,
                "layers": self.layers,
                "hidden": self.hidden,
                "ffn_hidden": self.ffn_hidden,
                "vocab": self.vocab,
                "heads": self.heads,
                "kv_heads": self.kv_heads,
                "head_dim": self.head_dim,
                "ffn_projections": self.ffn_projections,
                "tied_embeddings": self.tied_embeddings,
                "dtype_bytes": self.dtype_bytes,
                "family": self.family,
            }
            | ({"checkpoint": self.checkpoint} if self.checkpoint else {})
            | self._expert_fields()
            | ({f: getattr(self, f) for f in _MLA_SPEC_FIELDS} if self.is_mla else {})
            | (
                {"sliding_window": self.sliding_window, "sliding_layers": list(self.sliding_layers)}
                if self.sliding_window
                else {}
            )
            | ({"precision": self.precision} if self.precision != "bf16" else {})
            | ({"attention_sinks": True} if self.attention_sinks else {})
        )

    def _expert_fields(self) -> dict[str, object]:
        """The mixture-of-experts fields, for :meth:`to_dict` (none for a dense model, whose plain
        data is as before)."""
        if not self.experts:
            return {}
        return {
            "experts": self.experts,
            "experts_active": self.experts_active,
            "expert_ffn": self.expert_ffn,
            "shared_experts": self.shared_experts,
            "shared_ffn": self.shared_ffn,
            "dense_layers": list(self.dense_layers),
        } | ({"load_imbalance": self.load_imbalance} if self.load_imbalance != DEFAULT_LOAD_IMBALANCE else {})


def _expert_figure(cfg: dict, key: str, path: Path, *, low: int = 1) -> int:
    """``cfg[key]``, required, an integer ``≥ low`` within :data:`MAX_EXPERTS` (counts) or
    :data:`MAX_FFN_HIDDEN` (widths); otherwise :class:`InputError` naming the file and field."""
    value = cfg.get(key)
    if value is None:
        raise InputError(
            f"{path}: missing config field {key!r} (rpeg reads the expert and latent-attention fields "
            "from the file, not from a config class's defaults)",
            source=str(path),
            field=key,
        )
    limit = MAX_FFN_HIDDEN if "size" in key else MAX_EXPERTS
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= limit:
        raise InputError(
            f"{path}: field {key!r} must be an integer from {low} to {limit:,}, got {_show(value)}",
            source=str(path),
            field=key,
        )
    return value


def _read_experts(cfg: dict, kind: str, layers: int, path: Path) -> dict[str, object]:
    """The :class:`ModelSpec` expert fields of a mixture-of-experts ``config.json`` (SPEC §15.1),
    read as the ``transformers`` model of ``kind`` builds its layers (:data:`HF_ARCHITECTURES`).

    * ``"qwen"`` (Qwen2-MoE, Qwen3-MoE): ``num_experts``, ``num_experts_per_tok``,
      ``moe_intermediate_size``; Qwen2-MoE's one shared expert of
      ``shared_expert_intermediate_size`` (its ``d×1`` gate is not counted); layer ``i`` is dense
      when it is in ``mlp_only_layers`` or ``(i + 1) % decoder_sparse_step ≠ 0`` (both optional:
      ``[]`` and 1);
    * ``"mixtral"`` and ``"gpt_oss"``: ``num_local_experts``, ``num_experts_per_tok``, experts of
      ``intermediate_size``; no dense layer (gpt-oss: an ``experts_per_token`` that differs from
      ``num_experts_per_tok`` is refused);
    * ``"glm"`` (GLM-4.5) and ``"deepseek"`` (DeepSeek-V2/V3): ``n_routed_experts``,
      ``num_experts_per_tok``, ``moe_intermediate_size``, ``n_shared_experts`` shared experts of
      the same width, the first ``first_k_dense_replace`` layers dense (DeepSeek: and those off
      ``moe_layer_freq``, optional, 1). The multi-token-prediction layer
      (``num_nextn_predict_layers``) is not part of the model RL trains and is not counted.

    The expert fields are required (none is taken from a config class's default), and a field
    out of range is refused, named.
    """
    source = str(path)
    out: dict[str, object] = {}
    if kind == "qwen":
        out["experts"] = _expert_figure(cfg, "num_experts", path)
        out["experts_active"] = _expert_figure(cfg, "num_experts_per_tok", path)
        out["expert_ffn"] = _expert_figure(cfg, "moe_intermediate_size", path)
        if cfg.get("model_type") == "qwen2_moe":
            out["shared_experts"] = 1
            out["shared_ffn"] = _expert_figure(cfg, "shared_expert_intermediate_size", path)
        step = cfg.get("decoder_sparse_step", 1)
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise InputError(
                f"{path}: field 'decoder_sparse_step' must be a positive integer, got {_show(step)}",
                source=source,
                field="decoder_sparse_step",
            )
        only = cfg.get("mlp_only_layers") or []
        if not isinstance(only, list) or any(
            isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers for i in only
        ):
            raise InputError(
                f"{path}: field 'mlp_only_layers' must be a list of layer indices in 0..{layers - 1}, "
                f"got {_show(only)}",
                source=source,
                field="mlp_only_layers",
            )
        out["dense_layers"] = tuple(i for i in range(layers) if i in only or (i + 1) % step)
    elif kind in ("mixtral", "gpt_oss"):
        out["experts"] = _expert_figure(cfg, "num_local_experts", path)
        out["experts_active"] = _expert_figure(cfg, "num_experts_per_tok", path)
        out["expert_ffn"] = _expert_figure(cfg, "intermediate_size", path)
        alias = cfg.get("experts_per_token")  # gpt-oss's files carry OpenAI's name too
        if kind == "gpt_oss" and alias is not None and alias != out["experts_active"]:
            raise InputError(
                f"{path}: field 'experts_per_token' = {_show(alias)} differs from 'num_experts_per_tok' = "
                f"{out['experts_active']} (GptOssConfig reads the latter; the file contradicts itself)",
                source=source,
                field="experts_per_token",
            )
    elif kind in ("deepseek", "glm"):
        out["experts"] = _expert_figure(cfg, "n_routed_experts", path)
        out["experts_active"] = _expert_figure(cfg, "num_experts_per_tok", path)
        out["expert_ffn"] = _expert_figure(cfg, "moe_intermediate_size", path)
        shared = _expert_figure(cfg, "n_shared_experts", path, low=0)
        out["shared_experts"], out["shared_ffn"] = shared, out["expert_ffn"] if shared else 0
        first = _expert_figure(cfg, "first_k_dense_replace", path, low=0)
        freq = cfg.get("moe_layer_freq", 1) if kind == "deepseek" else 1  # GLM-4.5 has no such field
        if isinstance(freq, bool) or not isinstance(freq, int) or freq < 1:
            raise InputError(
                f"{path}: field 'moe_layer_freq' must be a positive integer, got {_show(freq)}",
                source=source,
                field="moe_layer_freq",
            )
        out["dense_layers"] = tuple(i for i in range(layers) if i < first or i % freq)
        if len(out["dense_layers"]) == layers:  # type: ignore[arg-type]
            raise InputError(
                f"{path}: field 'first_k_dense_replace' = {first} (with moe_layer_freq = {freq}) makes every "
                f"one of the {layers} layers dense: no layer has experts",
                source=source,
                field="first_k_dense_replace",
            )
    else:  # pragma: no cover - HF_ARCHITECTURES names only the kinds above
        raise ValueError(f"unknown expert reader {kind!r}")
    if int(out["experts_active"]) > int(out["experts"]):  # type: ignore[call-overload]
        key = "num_experts_per_tok"
        raise InputError(
            f"{path}: field {key!r} = {out['experts_active']} is above the {out['experts']} routed experts",
            source=source,
            field=key,
        )
    return out


def _read_latent(cfg: dict, path: Path) -> dict[str, int]:
    """The :class:`ModelSpec` latent-attention fields of a DeepSeek-V2/V3 ``config.json`` (SPEC
    §15.1): ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim`` and ``v_head_dim``
    required; ``q_lora_rank`` null or absent for no query compression (DeepSeek-V2-Lite)."""
    out = {
        "kv_lora_rank": _expert_figure(cfg, "kv_lora_rank", path),
        "qk_nope_head_dim": _expert_figure(cfg, "qk_nope_head_dim", path),
        "qk_rope_head_dim": _expert_figure(cfg, "qk_rope_head_dim", path),
        "v_head_dim": _expert_figure(cfg, "v_head_dim", path),
    }
    out["q_lora_rank"] = _expert_figure(cfg, "q_lora_rank", path) if cfg.get("q_lora_rank") is not None else 0
    return out


def _layer_types(cfg: dict, layers: int, path: Path) -> list[str] | None:
    """``cfg['layer_types']`` (``None`` when absent or null): one entry per layer, each one of
    :data:`_LAYER_TYPES`; anything else is refused, named (an attention kind rpeg does not model,
    such as ``chunked_attention`` or ``linear_attention``, would be misread as full attention)."""
    types = cfg.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != layers:
        raise InputError(
            f"{path}: field 'layer_types' must be a list of {layers} layer kinds (one per layer of "
            f"num_hidden_layers), got {_show(types)}",
            source=str(path),
            field="layer_types",
        )
    for i, kind in enumerate(types):
        if kind not in _LAYER_TYPES:
            raise InputError(
                f"{path}: field 'layer_types'[{i}] = {_show(kind)} is not a layer kind rpeg models "
                f"({', '.join(map(repr, _LAYER_TYPES))}; another would be misread as full attention)",
                source=str(path),
                field="layer_types",
            )
    return types


def _read_window(cfg: dict, arch: HFArchitecture, layers: int, path: Path) -> dict[str, object]:
    """The :class:`ModelSpec` sliding-window fields of a gpt-oss, Gemma-2 or Gemma-3 ``config.json``
    (SPEC §15.1), read as the ``transformers`` config class does: the windowed layers are those
    ``layer_types`` calls ``"sliding_attention"``; when ``layer_types`` is absent or null, the
    layers ``i`` with ``(i + 1) % p ≠ 0``, ``p`` the class's pattern (:attr:`HFArchitecture.window_period`,
    or Gemma-3's ``sliding_window_pattern``). ``sliding_window`` is required when some layer is
    windowed (a missing window is refused, named, not taken from a class default). No windowed
    layer: no fields (every layer attends in full)."""
    source = str(path)
    types = _layer_types(cfg, layers, path)
    if types is None:
        period = arch.window_period
        key = arch.window_period_field
        if key and cfg.get(key) is not None:
            period = cfg[key]
            if isinstance(period, bool) or not isinstance(period, int) or not 1 <= period <= MAX_LAYERS:
                raise InputError(
                    f"{path}: field {key!r} must be an integer from 1 to {MAX_LAYERS:,}, got {_show(period)}",
                    source=source,
                    field=key,
                )
        sliding = tuple(i for i in range(layers) if (i + 1) % period)
    else:
        sliding = tuple(i for i, kind in enumerate(types) if kind == "sliding_attention")
    if not sliding:
        return {}
    window = cfg.get("sliding_window")
    if window is None:
        raise InputError(
            f"{path}: missing config field 'sliding_window' ({len(sliding)} of the {layers} layers attend "
            "through a sliding window; rpeg reads its width from the file, not from a config class's "
            "default)",
            source=source,
            field="sliding_window",
        )
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= MAX_WINDOW:
        raise InputError(
            f"{path}: field 'sliding_window' must be an integer from 1 to {MAX_WINDOW:,}, got {_show(window)}",
            source=source,
            field="sliding_window",
        )
    return {"sliding_window": window, "sliding_layers": sliding}


def _many_experts(value: object) -> bool:
    """Whether an expert-count value is above 1 (a list, as Hunyuan's per-layer counts: any entry)."""
    if isinstance(value, list):
        return any(_many_experts(v) for v in value)
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 1


def _refuse_unsupported(cfg: dict, path: Path) -> None:
    """Raise :class:`InputError` if ``cfg`` is a mixture-of-experts model rpeg does not read, or an
    MLA model.

    Checked in order: ``model_type``, the expert counts, the MLA ranks; at the top level, then in
    each nested table (``text_config``, ``ffn_config``, ...). A top-level ``model_type`` whose
    :data:`HF_ARCHITECTURES` entry reads experts passes the first two checks (its reader takes
    its own fields). The message names the file, the field and its value.
    """
    tables = [("", cfg)] + [(f"{key}.", value) for key, value in cfg.items() if isinstance(value, dict)]
    top = cfg.get("model_type")
    read = isinstance(top, str) and top in HF_ARCHITECTURES and bool(HF_ARCHITECTURES[top].experts)
    readers = ", ".join(sorted(k for k, a in HF_ARCHITECTURES.items() if a.experts))
    dense = "it would otherwise be misread as a dense model, with wrong parameters, FLOPs and memory"
    for prefix, table in tables:
        model_type = table.get("model_type")
        if prefix == "" and read:
            continue
        if isinstance(model_type, str) and (
            model_type.lower() in _MOE_MODEL_TYPES or "moe" in model_type.lower()
        ):
            why = _UNREAD_MOE.get(
                model_type.lower(), f"rpeg reads the mixture-of-experts architectures {readers}"
            )
            raise InputError(
                f"{path}: field '{prefix}model_type' = {model_type!r} is a mixture-of-experts "
                f"architecture rpeg does not read yet: {why} ({dense})",
                source=str(path),
                field=f"{prefix}model_type",
            )
    for prefix, table in tables:
        if prefix == "" and read:
            continue
        for key in _EXPERT_FIELDS:
            if _many_experts(table.get(key)):
                raise InputError(
                    f"{path}: field '{prefix}{key}' = {table[key]!r} marks a mixture-of-experts model, "
                    f"but its model_type is not one rpeg reads experts of ({readers}; {dense})",
                    source=str(path),
                    field=prefix + key,
                )
    latent = isinstance(top, str) and top in HF_ARCHITECTURES and HF_ARCHITECTURES[top].latent
    for prefix, table in tables:
        if prefix == "" and latent:
            continue
        for key in _MLA_FIELDS:
            if table.get(key) is not None:
                raise InputError(
                    f"{path}: field '{prefix}{key}' = {table[key]!r} marks multi-head latent attention; "
                    "it is not supported yet (it would otherwise be misread as standard attention, with a "
                    "wrong KV cache and parameter count)",
                    source=str(path),
                    field=prefix + key,
                )


def _architecture(cfg: dict, path: Path) -> HFArchitecture:
    """The :data:`HF_ARCHITECTURES` entry of ``cfg``'s ``model_type``, or :class:`InputError`.

    Refused, naming the file, the field and its value: a missing or unknown ``model_type``
    (listing the known ones; Gemma-3's image-text ``gemma3`` with what to give instead), a
    quantized checkpoint (``quantization_config``; but for the method an architecture reads as the
    unquantized model, :attr:`HFArchitecture.dequantized`: gpt-oss's ``mxfp4``), bidirectional
    attention (``use_bidirectional_attention``) and an OPT ``word_embed_proj_dim`` other than
    ``hidden_size``.
    """
    source = str(path)
    known = ", ".join(sorted(HF_ARCHITECTURES))
    model_type = cfg.get("model_type")
    if model_type is None:
        raise InputError(
            f"{path}: missing config field 'model_type': rpeg reads each architecture's own fields "
            f"and defaults (as transformers' AutoConfig, which needs it too); add one of {known}",
            source=source,
            field="model_type",
        )
    if not isinstance(model_type, str):
        raise InputError(
            f"{path}: field 'model_type' must be a string, got {_show(model_type)}",
            source=source,
            field="model_type",
        )
    if model_type in _REFUSED_MODEL_TYPES:
        raise InputError(
            f"{path}: field 'model_type' = {model_type!r} is {_REFUSED_MODEL_TYPES[model_type]}",
            source=source,
            field="model_type",
        )
    if model_type not in HF_ARCHITECTURES:
        raise InputError(
            f"{path}: field 'model_type' = {_show(model_type)} is not an architecture rpeg reads; "
            f"known: {known}",
            source=source,
            field="model_type",
        )
    arch = HF_ARCHITECTURES[model_type]
    quant = cfg.get("quantization_config")
    if quant is not None:
        table = quant if isinstance(quant, dict) else {}
        method = table.get("quant_method")
        if not (arch.dequantized and method == arch.dequantized):
            bits = table.get("bits", table.get("w_bit"))  # AWQ, GPTQ (AutoAWQ: w_bit)
            if bits is None and (table.get("load_in_4bit") or table.get("load_in_8bit")):  # bitsandbytes
                bits = 4 if table.get("load_in_4bit") else 8
            what = f"quant_method {_show(method)}" + (f", bits {_show(bits)}" if bits is not None else "")
            read = (
                f" (of {model_type!r} checkpoints rpeg reads quant_method {arch.dequantized!r}, as the "
                "unquantized model it dequantizes to)"
                if arch.dequantized
                else ""
            )
            raise InputError(
                f"{path}: field 'quantization_config' ({what}) marks a "
                "quantized checkpoint; quantized weights are not modelled (they would be read as "
                f"unquantized, with wrong weight memory){read}; give the unquantized model's config.json",
                source=source,
                field="quantization_config",
            )
    if cfg.get("use_bidirectional_attention"):
        raise InputError(
            f"{path}: field 'use_bidirectional_attention' = "
            f"{_show(cfg['use_bidirectional_attention'])} makes attention bidirectional (an encoder, "
            "such as EmbeddingGemma); rpeg models causal decoders",
            source=source,
            field="use_bidirectional_attention",
        )
    if model_type == "opt":
        proj = cfg.get("word_embed_proj_dim")
        if proj is not None and proj != cfg.get("hidden_size"):
            raise InputError(
                f"{path}: field 'word_embed_proj_dim' = {_show(proj)} differs from 'hidden_size' = "
                f"{_show(cfg.get('hidden_size'))}; OPT's embedding projections are not modelled",
                source=source,
                field="word_embed_proj_dim",
            )
    return arch


class ModelSpecFile(Strict):
    """Schema of a model written as data (a workload's inline table, a result file's ``spec``):
    the fields of :class:`ModelSpec`, each of its exact type."""

    name: str
    layers: Annotated[int, Field(ge=1)]
    hidden: Annotated[int, Field(ge=1)]
    ffn_hidden: Annotated[int, Field(ge=1)]
    vocab: Annotated[int, Field(ge=1)]
    heads: Annotated[int, Field(ge=1)]
    kv_heads: Annotated[int, Field(ge=1)]
    head_dim: Annotated[int, Field(ge=0)] = 0
    ffn_projections: Literal[2, 3] = 3
    tied_embeddings: bool = False
    dtype_bytes: Literal[1, 2, 4] = 2
    family: Literal["llama", "qwen2", "mistral"] = "llama"
    checkpoint: str = ""
    experts: Annotated[int, Field(ge=0)] = 0
    experts_active: Annotated[int, Field(ge=0)] = 0
    expert_ffn: Annotated[int, Field(ge=0)] = 0
    shared_experts: Annotated[int, Field(ge=0)] = 0
    shared_ffn: Annotated[int, Field(ge=0)] = 0
    dense_layers: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    q_lora_rank: Annotated[int, Field(ge=0)] = 0
    kv_lora_rank: Annotated[int, Field(ge=0)] = 0
    qk_nope_head_dim: Annotated[int, Field(ge=0)] = 0
    qk_rope_head_dim: Annotated[int, Field(ge=0)] = 0
    v_head_dim: Annotated[int, Field(ge=0)] = 0
    sliding_window: Annotated[int, Field(ge=0)] = 0
    sliding_layers: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    precision: Literal["bf16", "fp8", "nvfp4", "mxfp4"] = "bf16"
    load_imbalance: Annotated[float, Field(ge=1.0, le=MAX_LOAD_IMBALANCE)] = DEFAULT_LOAD_IMBALANCE
    attention_sinks: bool = False


def _llama(name: str, L: int, d: int, dff: int, heads: int, kv: int, vocab: int) -> ModelSpec:
    return ModelSpec(name=name, layers=L, hidden=d, ffn_hidden=dff, vocab=vocab, heads=heads, kv_heads=kv)


def _qwen2(name: str, L: int, d: int, dff: int, heads: int, kv: int, vocab: int) -> ModelSpec:
    return ModelSpec(
        name=name, layers=L, hidden=d, ffn_hidden=dff, vocab=vocab, heads=heads, kv_heads=kv, family="qwen2"
    )


def _moe(
    name: str,
    L: int,
    d: int,
    dff: int,
    heads: int,
    kv: int,
    vocab: int,
    *,
    experts: int,
    active: int,
    d_e: int,
    head_dim: int = 128,
) -> ModelSpec:
    return ModelSpec(
        name=name,
        layers=L,
        hidden=d,
        ffn_hidden=dff,
        vocab=vocab,
        heads=heads,
        kv_heads=kv,
        head_dim=head_dim,
        experts=experts,
        experts_active=active,
        expert_ffn=d_e,
    )


def _gpt_oss(name: str, L: int, experts: int) -> ModelSpec:
    """gpt-oss (config.json of openai/gpt-oss-20b and -120b): ``d = dff = d_e = 2880``, 64 query
    heads and 8 KV heads of 64, 4 routed experts per token, untied embeddings of 201,088 tokens,
    a 128-token window on the even layers (``layer_types``: sliding, full, sliding, ...), one
    attention sink per head and layer."""
    return ModelSpec(
        name=name,
        layers=L,
        hidden=2880,
        ffn_hidden=2880,
        vocab=201088,
        heads=64,
        kv_heads=8,
        head_dim=64,
        experts=experts,
        experts_active=4,
        expert_ffn=2880,
        sliding_window=128,
        sliding_layers=tuple(range(0, L, 2)),
        attention_sinks=True,
    )


#: Presets with published parameter totals (checked to 2% in ``tests/ir/test_models.py``).
MODEL_PRESETS: dict[str, ModelSpec] = {
    "llama2-7b": _llama("llama2-7b", 32, 4096, 11008, 32, 32, 32000),  # 6.74B
    "llama2-13b": _llama("llama2-13b", 40, 5120, 13824, 40, 40, 32000),  # 13.0B
    # 34B-class: Llama-2 34B was never released; Code Llama 34B has its shape (33.7B).
    "llama2-34b": _llama("llama2-34b", 48, 8192, 22016, 64, 8, 32000),
    "llama2-70b": _llama("llama2-70b", 80, 8192, 28672, 64, 8, 32000),  # 69.0B
    "llama3.1-8b": _llama("llama3.1-8b", 32, 4096, 14336, 32, 8, 128256),  # 8.03B
    "llama3.3-70b": _llama("llama3.3-70b", 80, 8192, 28672, 64, 8, 128256),  # 70.6B
    # Qwen2.5 (config.json of Qwen/Qwen2.5-7B, -32B and Qwen2.5-Math-7B; untied embeddings;
    # the Q/K/V biases, 0.01% of the weights, are left out like the norms).
    "qwen2.5-7b": _qwen2("qwen2.5-7b", 28, 3584, 18944, 28, 4, 152064),  # 7.62B
    "qwen2.5-math-7b": _qwen2("qwen2.5-math-7b", 28, 3584, 18944, 28, 4, 152064),  # 7.62B
    "qwen2.5-32b": _qwen2("qwen2.5-32b", 64, 5120, 27648, 40, 8, 152064),  # 32.8B
    # Mixture of experts (SPEC §15.1; the shapes of the config.json files of Qwen/Qwen3-30B-A3B,
    # Qwen/Qwen3-235B-A22B and mistralai/Mixtral-8x7B-v0.1; the Qwen3 QK-norms, 256 weights per
    # layer, are left out like the other norms). Published: 30.5B total / 3.3B active, 235B / 22B,
    # 46.7B / 12.9B (checked to 1% in tests/ir/test_models.py).
    "qwen3-30b-a3b": _moe("qwen3-30b-a3b", 48, 2048, 6144, 32, 4, 151936, experts=128, active=8, d_e=768),
    "qwen3-235b-a22b": _moe(
        "qwen3-235b-a22b", 94, 4096, 12288, 64, 4, 151936, experts=128, active=8, d_e=1536
    ),
    "mixtral-8x7b": _moe(
        "mixtral-8x7b", 32, 4096, 14336, 32, 8, 32000, experts=8, active=2, d_e=14336, head_dim=0
    ),
    # config.json of deepseek-ai/DeepSeek-V3: latent attention, 256 routed experts and one shared,
    # the first three layers dense; published 671B total / 37B active (the multi-token-prediction
    # module, 14B more in the checkpoint, is not counted).
    "deepseek-v3": ModelSpec(
        name="deepseek-v3",
        layers=61,
        hidden=7168,
        ffn_hidden=18432,
        vocab=129280,
        heads=128,
        kv_heads=128,
        experts=256,
        experts_active=8,
        expert_ffn=2048,
        shared_experts=1,
        shared_ffn=2048,
        dense_layers=(0, 1, 2),
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
    ),
    # gpt-oss: sliding-window attention on every other layer (SPEC §15.1). OpenAI's model card:
    # 20.91B total / 3.61B active, 116.83B / 5.13B; its active counts hold the blocks' active
    # weights and one V·d matrix (the unembedding: an embedding lookup is no matmul). The attention
    # and expert biases and the 64 attention sinks per layer (0.03% of the weights) are left out
    # like the other biases.
    "gpt-oss-20b": _gpt_oss("gpt-oss-20b", 24, 32),
    "gpt-oss-120b": _gpt_oss("gpt-oss-120b", 36, 128),
    # 175B-class (GPT-3 shape) for the RPEG paper's 1,024-GPU configuration.
    "gpt3-175b": ModelSpec(
        name="gpt3-175b",
        layers=96,
        hidden=12288,
        ffn_hidden=49152,
        vocab=50257,
        heads=96,
        kv_heads=96,
        ffn_projections=2,
        tied_embeddings=True,
    ),
}

_ALIASES = {
    "7b": "llama2-7b",
    "13b": "llama2-13b",
    "34b": "llama2-34b",
    "70b": "llama2-70b",
    "8b": "llama3.1-8b",
    "175b": "gpt3-175b",
}


def model_preset(name: str) -> ModelSpec:
    """Look up a model preset by name (case-insensitive; ``7b``/``13b``/``34b``/``70b``/``8b``/``175b``
    are short for the Llama-2 sizes, Llama-3.1 8B and the 175B class).

    Raises
    ------
    ValueError
        For an unknown name, listing the known ones.
    """
    if not isinstance(name, str):
        raise TypeError(f"model preset name must be a string, got {type(name).__name__} {name!r}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in MODEL_PRESETS:
        known = ", ".join(sorted(MODEL_PRESETS) + sorted(_ALIASES))
        raise ValueError(f"unknown model preset {name!r}; known presets: {known}")
    return MODEL_PRESETS[key]

"""Hugging Face models from a :class:`~rpeg.ir.models.ModelSpec`: configs, classes, checkpoints.

The runtime's one model definition is a ``transformers`` decoder model of the spec's family
(``llama``, ``qwen2``, ``mistral``). This module maps a spec to that family's config
(:func:`hf_config`), names the family's building blocks (:func:`family_modules`, used by
:class:`~rpeg.runtime.model.StageModel`), and writes and reads checkpoints in the Hugging Face
layout — ``config.json`` plus ``model.safetensors`` with the ``…ForCausalLM`` parameter names —
which ``transformers.AutoModelForCausalLM.from_pretrained`` and vLLM load directly
(:func:`save_checkpoint`, :func:`load_checkpoint`, :func:`causal_lm`). Nothing is downloaded: a
checkpoint is a local directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...ir.errors import InputError
from ...ir.models import FAMILIES, ModelSpec
from . import require

if TYPE_CHECKING:
    import torch

__all__ = [
    "CHECKPOINT_FILE",
    "FamilyModules",
    "causal_lm",
    "family_modules",
    "hf_config",
    "load_checkpoint",
    "save_checkpoint",
]

#: The weights file of a checkpoint written by :func:`save_checkpoint`.
CHECKPOINT_FILE = "model.safetensors"

_PREFIX = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}
_RMS_EPS = 1e-5
_ROPE_THETA = 10000.0


@dataclass(frozen=True)
class FamilyModules:
    """The ``transformers`` classes of one family that a pipeline stage is built from."""

    DecoderLayer: type
    RMSNorm: type
    RotaryEmbedding: type
    ForCausalLM: type


def family_modules(family: str) -> FamilyModules:
    """``transformers.models.<family>.modeling_<family>``'s decoder layer, RMSNorm, rotary
    embedding and causal-LM classes.

    Raises
    ------
    ValueError
        For a family outside :data:`~rpeg.ir.models.FAMILIES`.
    EngineMissing
        If ``transformers`` is not installed.
    """
    if family not in _PREFIX:
        raise ValueError(f"unknown model family {family!r}; known: {', '.join(FAMILIES)}")
    mod = require(f"transformers.models.{family}.modeling_{family}", purpose="the runtime's models")
    p = _PREFIX[family]
    return FamilyModules(
        getattr(mod, f"{p}DecoderLayer"),
        getattr(mod, f"{p}RMSNorm"),
        getattr(mod, f"{p}RotaryEmbedding"),
        getattr(mod, f"{p}ForCausalLM"),
    )


def hf_config(spec: ModelSpec, *, max_positions: int = 4096) -> Any:
    """The ``transformers`` config of ``spec``'s family with ``spec``'s shape.

    ``num_hidden_layers = L``, ``hidden_size = d``, ``intermediate_size = dff``, ``vocab_size = V``,
    ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, RMSNorm ε = 1e-5, RoPE
    θ = 10⁴, SiLU-gated FFN, float32, untied embeddings (a tie across pipeline stages would couple
    two stages' updates: see :class:`~rpeg.runtime.model.StageModel`), no sliding window, SDPA
    attention (causal without a mask). Qwen2 keeps its q/k/v biases.
    """
    transformers = require("transformers", purpose="the runtime's models")
    extra: dict[str, Any] = {}
    if spec.family == "qwen2":
        extra["use_sliding_window"] = False
    if spec.family == "mistral":
        extra["sliding_window"] = None
    config = transformers.AutoConfig.for_model(
        spec.family,
        vocab_size=spec.vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.ffn_hidden,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=max_positions,
        rms_norm_eps=_RMS_EPS,
        rope_parameters={"rope_type": "default", "rope_theta": _ROPE_THETA},
        hidden_act="silu",
        tie_word_embeddings=False,
        dtype="float32",
        **extra,
    )
    config._attn_implementation = "sdpa"
    return config


def save_checkpoint(
    state: dict[str, torch.Tensor], spec: ModelSpec, directory: str | Path, *, max_positions: int = 4096
) -> Path:
    """Write ``state`` (a whole LM-head model, Hugging Face names) as a checkpoint directory.

    ``directory/config.json`` is :func:`hf_config` of ``spec`` (``architectures`` set to the
    family's ``…ForCausalLM``) and ``directory/model.safetensors`` the tensors, contiguous,
    float32. A ``value_head.*`` (critic or reward) is left out: ``transformers`` and vLLM load the
    LM part only.

    Raises
    ------
    ValueError
        If ``state`` lacks or has extra parameters for ``spec`` (the message lists a few).
    """
    st = require("safetensors.torch", purpose="Hugging Face checkpoints")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    config = hf_config(spec, max_positions=max_positions)
    config.architectures = [family_modules(spec.family).ForCausalLM.__name__]
    weights = {
        k: v.detach().float().contiguous() for k, v in state.items() if not k.startswith("value_head.")
    }
    expected = set(_expected_names(spec))
    missing, extra = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or extra:
        raise ValueError(
            f"save_checkpoint: state does not match {spec.name!r}: missing {missing[:3]}, extra {extra[:3]}"
        )
    config.save_pretrained(out)
    st.save_file(weights, str(out / CHECKPOINT_FILE), metadata={"format": "pt"})
    return out


def _expected_names(spec: ModelSpec) -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    bias = spec.family == "qwen2"
    for i in range(spec.layers):
        pre = f"model.layers.{i}."
        names += [f"{pre}self_attn.{p}_proj.weight" for p in "qkvo"]
        if bias:
            names += [f"{pre}self_attn.{p}_proj.bias" for p in "qkv"]
        names += [f"{pre}mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
        names += [f"{pre}input_layernorm.weight", f"{pre}post_attention_layernorm.weight"]
    return names


def load_checkpoint(directory: str | Path) -> tuple[ModelSpec, dict[str, torch.Tensor]]:
    """Read a local Hugging Face checkpoint: its spec (:meth:`ModelSpec.from_hf_config`) and every
    ``*.safetensors`` tensor in the directory, in float32.

    Raises
    ------
    InputError
        If the directory, its ``config.json`` or its safetensors files are missing, the
        architecture is not one of :data:`~rpeg.ir.models.FAMILIES`, or the tensors do not match
        the config; the message names the directory and what is wrong.
    """
    st = require("safetensors.torch", purpose="Hugging Face checkpoints")
    path = Path(directory)
    if not path.is_dir():
        raise InputError(f"{path}: a model checkpoint must be a directory with config.json and *.safetensors")
    spec = ModelSpec.from_hf_config(path)
    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    if model_type not in FAMILIES:
        raise InputError(
            f"{path / 'config.json'}: field 'model_type' must be one of {', '.join(FAMILIES)} for the "
            f"runtime, got {model_type!r}",
            source=str(path / "config.json"),
            field="model_type",
        )
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise InputError(f"{path}: no *.safetensors weights in the checkpoint directory", source=str(path))
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update({k: v.float() for k, v in st.load_file(str(f)).items()})
    if spec.tied_embeddings and "lm_head.weight" not in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    expected = set(_expected_names(spec))
    missing = sorted(expected - set(state))
    if missing:
        raise InputError(
            f"{path}: the safetensors files lack {len(missing)} tensors of the config, e.g. {missing[:3]}",
            source=str(path),
        )
    return spec, {k: state[k] for k in _expected_names(spec)}


def causal_lm(spec: ModelSpec, state: dict[str, torch.Tensor]) -> Any:
    """The family's ``…ForCausalLM`` with ``state`` loaded (float32, eval mode): the reference a
    rollout engine's log-probs are checked against.

    Raises
    ------
    RuntimeError
        If ``state`` does not fit the model (``load_state_dict(strict=True)``).
    """
    model = family_modules(spec.family).ForCausalLM(hf_config(spec))
    lm = {k: v for k, v in state.items() if not k.startswith("value_head.")}
    model.load_state_dict(lm, strict=True)
    return model.float().eval()

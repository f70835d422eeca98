"""Hugging Face models from a :class:`~rpeg.ir.models.ModelSpec`: configs, classes, checkpoints.

The runtime's one model definition is a ``transformers`` decoder model of the spec's family
(``llama``, ``qwen2``, ``mistral``). This module maps a spec to that family's config
(:func:`hf_config`), names the family's building blocks (:func:`family_modules`, used by
:class:`~rpeg.runtime.worker.model.StageModel`), and writes and reads checkpoints in the Hugging Face
layout — ``config.json`` plus ``model.safetensors`` with the ``…ForCausalLM`` parameter names —
which ``transformers.AutoModelForCausalLM.from_pretrained`` and vLLM load directly
(:func:`save_checkpoint`, :func:`load_checkpoint`, :func:`causal_lm`). Nothing is downloaded: a
checkpoint is a local directory.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...ir.errors import InputError
from ...ir.models import FAMILIES, ModelSpec
from . import require
from .checks import _check_model_type, _checkpoint_keys, _expected_names

if TYPE_CHECKING:
    import torch

__all__ = [
    "CHECKPOINT_FILE",
    "MOE_FAMILY",
    "FamilyModules",
    "causal_lm",
    "checkpoint_state",
    "family_modules",
    "hf_config",
    "load_checkpoint",
    "load_stage_weights",
    "runtime_family",
    "save_checkpoint",
]


#: The ``transformers`` architecture the runtime builds a mixture-of-experts model of (SPEC §15.1):
#: Qwen3-MoE's decoder layer — attention with per-head RMSNorm on queries and keys, a top-``k``
#: softmax router with the chosen weights renormalised, ``E`` SiLU-gated experts stored as two
#: stacked tensors (``mlp.experts.gate_up_proj`` ``[E, 2·d_e, d]``, ``mlp.experts.down_proj``
#: ``[E, d, d_e]``) and dense layers where ``dense_layers`` says (``mlp_only_layers``). Every
#: MoE spec without shared experts or latent attention runs as this class (Mixtral's layer is the
#: same but for the query/key norms).
MOE_FAMILY = "qwen3_moe"

#: The weights file of a checkpoint written by :func:`save_checkpoint`.
CHECKPOINT_FILE = "model.safetensors"

_PREFIX = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral", MOE_FAMILY: "Qwen3Moe"}
_RMS_EPS = 1e-5
_ROPE_THETA = 10000.0


@dataclass(frozen=True)
class FamilyModules:
    """The ``transformers`` classes of one family that a pipeline stage is built from."""

    DecoderLayer: type
    RMSNorm: type
    RotaryEmbedding: type
    ForCausalLM: type


def runtime_family(spec: ModelSpec) -> str:
    """The ``transformers`` family the runtime builds ``spec`` as: :data:`MOE_FAMILY` for a
    mixture-of-experts spec, ``spec.family`` otherwise."""
    return MOE_FAMILY if spec.is_moe else spec.family


def checkpoint_state(state: dict[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    """``state`` under the checkpoint names vLLM and the Hugging Face hub use: a
    mixture-of-experts layer's stacked experts split into ``mlp.experts.{e}.gate_proj.weight``
    (rows ``0 … d_e − 1`` of ``gate_up_proj[e]``), ``….up_proj.weight`` (rows ``d_e … 2·d_e − 1``)
    and ``….down_proj.weight`` (``down_proj[e]``), as ``transformers``' ``save_pretrained``
    writes them. A dense spec's state is returned as it is."""
    if not spec.is_moe:
        return state
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            pre = name[: -len("gate_up_proj")]
            gate, up = t.chunk(2, dim=1)
            for e in range(t.shape[0]):
                out[f"{pre}{e}.gate_proj.weight"] = gate[e]
                out[f"{pre}{e}.up_proj.weight"] = up[e]
        elif name.endswith("mlp.experts.down_proj"):
            pre = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{pre}{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    return out


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
        raise ValueError(f"unknown model family {family!r}; known: {', '.join((*FAMILIES, MOE_FAMILY))}")
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
    two stages' updates: see :class:`~rpeg.runtime.worker.model.StageModel`), no sliding window, SDPA
    attention (causal without a mask). Qwen2 keeps its q/k/v biases.

    A mixture-of-experts spec gets Qwen3-MoE's config (:data:`MOE_FAMILY`): ``num_experts = E``,
    ``num_experts_per_tok = k``, ``moe_intermediate_size = d_e``, ``intermediate_size = dff``
    (its dense layers'), ``mlp_only_layers`` its ``dense_layers``, the chosen weights renormalised.

    A spec with a :attr:`~rpeg.ir.models.ModelSpec.checkpoint` gets that directory's own
    ``config.json`` instead (its RoPE θ and scaling, norm ε, positions), with the same
    overrides: float32, untied embeddings, no sliding window, SDPA.
    """
    transformers = require("transformers", purpose="the runtime's models")
    if spec.checkpoint:
        config = transformers.AutoConfig.from_pretrained(spec.checkpoint, local_files_only=True)
        config.tie_word_embeddings = False
        config.dtype = "float32"
        if spec.family in ("qwen2", "mistral"):
            config.use_sliding_window = False
            config.sliding_window = None
        config._attn_implementation = "sdpa"
        return config
    extra: dict[str, Any] = {}
    if spec.family == "qwen2":
        extra["use_sliding_window"] = False
    if spec.family == "mistral":
        extra["sliding_window"] = None
    if spec.is_moe:
        extra |= {
            "num_experts": spec.experts,
            "num_experts_per_tok": spec.experts_active,
            "moe_intermediate_size": spec.expert_ffn,
            "decoder_sparse_step": 1,
            "mlp_only_layers": list(spec.dense_layers),
            "norm_topk_prob": True,
            "use_sliding_window": False,
        }
    config = transformers.AutoConfig.for_model(
        runtime_family(spec),
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
    if spec.is_moe:
        config._experts_implementation = "eager"  # the experts' own loop (no grouped-GEMM kernel on CPU)
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
    config.architectures = [family_modules(runtime_family(spec)).ForCausalLM.__name__]
    weights = {
        k: v.detach().float().contiguous()
        for k, v in checkpoint_state(state, spec).items()
        if not k.startswith("value_head.")
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
    _check_model_type(path, str(path / "config.json"))
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


def load_stage_weights(model: Any, directory: str | Path) -> list[str]:
    """Copy a checkpoint's tensors into a :class:`~rpeg.runtime.worker.model.StageModel` (or any module
    with the ``…ForCausalLM`` parameter names) before it is sharded: only the tensors of the
    parameters it holds are read (``safe_open``), in float32. ``lm_head.weight`` comes from
    ``model.embed_tokens.weight`` when the checkpoint ties them; a one-label ``score.weight``
    fills ``value_head.weight``. Returns the parameters left as they were (the value head of a
    critic started from a causal LM: it keeps its seeded start).

    Raises
    ------
    InputError
        A parameter other than the value head has no tensor in the directory, or a tensor's shape
        differs from the parameter's.
    """
    import torch

    safetensors = require("safetensors", purpose="Hugging Face checkpoints")
    path = Path(directory)
    keys = _checkpoint_keys(path)
    alias = {"value_head.weight": "score.weight"}
    if "lm_head.weight" not in keys:
        alias["lm_head.weight"] = "model.embed_tokens.weight"
    kept: list[str] = []
    handles: dict[Path, Any] = {}
    with contextlib.ExitStack() as stack, torch.no_grad():
        for name, param in model.named_parameters():
            key = name if name in keys else alias.get(name, name)
            if key not in keys:
                if name.startswith("value_head."):
                    kept.append(name)
                    continue
                raise InputError(f"checkpoint {str(path)!r} has no tensor {name!r}", source=str(path))
            f = keys[key]
            if f not in handles:
                handles[f] = stack.enter_context(safetensors.safe_open(str(f), framework="pt"))
            tensor = handles[f].get_tensor(key)
            if tuple(tensor.shape) != tuple(param.shape):
                raise InputError(
                    f"checkpoint {str(path)!r}: tensor {key!r} has shape {tuple(tensor.shape)}, the model's "
                    f"{name!r} {tuple(param.shape)}",
                    source=str(path),
                )
            param.copy_(tensor.float())
    return kept


def causal_lm(spec: ModelSpec, state: dict[str, torch.Tensor]) -> Any:
    """The family's ``…ForCausalLM`` with ``state`` loaded (float32, eval mode): the reference a
    rollout engine's log-probs are checked against.

    Raises
    ------
    RuntimeError
        If ``state`` does not fit the model (``load_state_dict(strict=True)``).
    """
    model = family_modules(runtime_family(spec)).ForCausalLM(hf_config(spec))
    lm = {k: v for k, v in state.items() if not k.startswith("value_head.")}
    model.load_state_dict(lm, strict=True)
    return model.float().eval()

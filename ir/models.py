"""Model specifications: the shape of a decoder-only transformer and its parameter count.

A :class:`ModelSpec` is everything the cost model and the runtime need to know about a model:
layers ``L``, hidden size ``d``, FFN width ``dff``, vocabulary ``V``, attention heads and KV heads
(grouped-query attention), head dimension, number of FFN projections (2 for a plain MLP, 3 for a
gated/SwiGLU one), tied embeddings and the bytes per scalar (SPEC §2).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from .errors import InputError, Strict, read_json

__all__ = [
    "FAMILIES",
    "MODEL_PRESETS",
    "OPTIMIZER_BYTES_PER_PARAM",
    "ModelSpec",
    "ModelSpecFile",
    "model_preset",
]

#: Hugging Face architectures (``config.json``'s ``model_type``) the runtime builds and loads.
FAMILIES = ("llama", "qwen2", "mistral")

#: ``model_type`` values of Hugging Face mixture-of-experts architectures; :meth:`ModelSpec.from_hf_config`
#: refuses them (as it does any ``model_type`` containing ``moe``) until MoE models are supported.
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

#: Multi-head latent attention (DeepSeek-V2/V3, MiniCPM3): compressed K/V and Q, whose KV cache
#: and parameters the dense formulas would get wrong.
_MLA_FIELDS = ("kv_lora_rank", "q_lora_rank")

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
        Number of transformer blocks ``L``.
    hidden
        Model width ``d``.
    ffn_hidden
        FFN inner width ``dff``.
    vocab
        Vocabulary size ``V``.
    heads
        Number of query heads.
    kv_heads
        Number of key/value heads (``kv_heads < heads`` is grouped-query attention).
    head_dim
        Width of one head; ``0`` means ``hidden // heads``.
    ffn_projections
        Matrices in the FFN: 2 for ``up, down``; 3 for gated ``gate, up, down`` (SwiGLU).
    tied_embeddings
        Whether the LM head shares the input embedding matrix.
    dtype_bytes
        Bytes per scalar ``sb`` of weights and activations (2 for BF16).
    family
        Hugging Face architecture the runtime builds for this shape, one of :data:`FAMILIES`
        (``model_type`` of a ``config.json``). The cost model does not read it. A shape of another
        architecture (GPT-3's two-projection FFN) plans as itself and runs as a ``llama`` model of
        the runtime's scale (:func:`rpeg.runtime.model.scale_spec`).
    checkpoint
        Local Hugging Face checkpoint directory (``config.json`` and ``*.safetensors``) whose
        weights the runtime runs this model with, at full size; ``""``: none (the runtime builds a
        scaled model with seeded weights). Set by :meth:`from_hf_config` when the directory holds
        safetensors files; the cost model does not read it.

    Raises
    ------
    ValueError
        If a field is out of range; the message names the field and its value.
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

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"ModelSpec: name must be a string, got {self.name!r}")
        if not isinstance(self.checkpoint, str):
            raise TypeError(
                f"ModelSpec {self.name!r}: checkpoint must be a path string, got {self.checkpoint!r}"
            )
        for field in ("layers", "hidden", "ffn_hidden", "vocab", "heads", "kv_heads"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"ModelSpec {self.name!r}: {field} must be a positive integer, got {value!r}"
                )
        if self.head_dim == 0:
            if self.hidden % self.heads:
                raise ValueError(
                    f"ModelSpec {self.name!r}: hidden={self.hidden} is not divisible by heads={self.heads}; "
                    "give head_dim explicitly"
                )
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int) or self.head_dim < 1:
            raise ValueError(f"ModelSpec {self.name!r}: head_dim must be positive, got {self.head_dim!r}")
        if self.heads % self.kv_heads:
            raise ValueError(
                f"ModelSpec {self.name!r}: heads={self.heads} is not a multiple of kv_heads={self.kv_heads}"
            )
        if not isinstance(self.tied_embeddings, bool):
            raise ValueError(
                f"ModelSpec {self.name!r}: tied_embeddings must be True or False, got {self.tied_embeddings!r}"
            )
        if isinstance(self.ffn_projections, bool) or self.ffn_projections not in (2, 3):
            raise ValueError(
                f"ModelSpec {self.name!r}: ffn_projections must be 2 or 3, got {self.ffn_projections!r}"
            )
        if self.family not in FAMILIES:
            raise ValueError(
                f"ModelSpec {self.name!r}: family must be one of {', '.join(FAMILIES)}, got {self.family!r}"
            )
        if isinstance(self.dtype_bytes, bool) or self.dtype_bytes not in (1, 2, 4):
            raise ValueError(
                f"ModelSpec {self.name!r}: dtype_bytes must be 1, 2 or 4, got {self.dtype_bytes!r}"
            )

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
    def layer_params(self) -> int:
        """Matmul parameters of one block, ``W_layer``.

        ``W_layer = 2·d·d_q + 2·d·d_kv + n_ffn·d·dff``; without GQA (``d_kv = d_q = d``) this is the
        SPEC §6 form ``4d² + n_ffn·d·dff``. Norm weights (``2d``) are not matmul work and are
        counted only in :attr:`params`.
        """
        d = self.hidden
        return 2 * d * self.q_width + 2 * d * self.kv_width + self.ffn_projections * d * self.ffn_hidden

    @property
    def embedding_params(self) -> int:
        """Input embedding ``V·d``."""
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Total parameter count ``N_m``.

        ``N = L·(W_layer + 2d) + V·d + d + (0 if tied else V·d)``: blocks with their two norms,
        the input embedding, the final norm and an untied LM head.
        """
        d = self.hidden
        head = 0 if self.tied_embeddings else self.vocab * d
        return self.layers * (self.layer_params + 2 * d) + self.embedding_params + d + head

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

        ``ffn_hidden`` defaults to the original ratio ``dff/d`` applied to the new ``hidden``.
        """
        ratio = self.ffn_hidden / self.hidden
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
        )

    # ------------------------------------------------------------------ constructors
    @classmethod
    def preset(cls, name: str) -> ModelSpec:
        """Return the preset called ``name`` (see :data:`MODEL_PRESETS`)."""
        return model_preset(name)

    @classmethod
    def from_hf_config(cls, path: str | Path, name: str | None = None) -> ModelSpec:
        """Read a Hugging Face ``config.json`` from disk (nothing is downloaded).

        Understands the Llama/Mistral/Qwen field names (``num_hidden_layers``, ``hidden_size``,
        ``intermediate_size``, ``vocab_size``, ``num_attention_heads``, ``num_key_value_heads``,
        ``head_dim``, ``tie_word_embeddings``, ``torch_dtype``) and the GPT-2/OPT spellings
        (``n_layer``, ``n_embd``, ``n_head``, ``n_inner``, ``ffn_dim``). Gated FFN (3 projections)
        is assumed for ``hidden_act`` in ``silu``/``swiglu``; 2 otherwise. When the directory
        also holds ``*.safetensors`` weights, :attr:`checkpoint` is its absolute path (the runtime
        then runs the model with them).

        Mixture-of-experts and multi-head-latent-attention models are refused (not supported yet:
        read as dense models their parameters, FLOPs and KV cache would be wrong): a ``model_type``
        of a known MoE architecture (or one containing ``moe``), an expert count above 1
        (``num_experts``, ``num_local_experts``, ``n_routed_experts``, ``moe_num_experts``,
        ``num_experts_per_tok``, ...; also inside a nested table such as DBRX's ``ffn_config``),
        or a non-null ``kv_lora_rank``/``q_lora_rank``.

        Parameters
        ----------
        path
            The ``config.json`` file, or the directory that holds it.
        name
            The spec's name; defaults to ``_name_or_path``, then ``model_type``, then the folder.

        Returns
        -------
        ModelSpec
            The dense model the file describes.

        Raises
        ------
        InputError
            If the file is missing or not JSON, or a field is missing or of the wrong type, or the
            model is a mixture of experts or uses multi-head latent attention; the message names
            the file, the field and its value.
        """
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        cfg = read_json(path, "model config")
        if not isinstance(cfg, dict):
            raise InputError(f"{path}: a model config must be a JSON object, got {type(cfg).__name__}")

        def pick(*keys: str, default: int | None = None) -> int:
            for key in keys:
                if key in cfg and cfg[key] is not None:
                    value = cfg[key]
                    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                        raise InputError(
                            f"{path}: field {key!r} must be a positive integer, got {value!r}",
                            source=str(path),
                            field=key,
                        )
                    return value
            if default is None:
                raise InputError(f"{path}: missing config field {' / '.join(keys)!r}", source=str(path))
            return default

        def text(key: str, default: str) -> str:
            value = cfg.get(key, default)
            if value is None:
                return default
            if not isinstance(value, str):
                raise InputError(f"{path}: field {key!r} must be a string, got {value!r}", source=str(path))
            return value

        _refuse_unsupported(cfg, path)
        hidden = pick("hidden_size", "n_embd", "d_model")
        heads = pick("num_attention_heads", "n_head", "num_heads")
        act = text("hidden_act", text("activation_function", "silu")).lower()
        dtype = text("torch_dtype", text("dtype", "bfloat16"))
        dtypes = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "float8_e4m3fn": 1}
        if dtype not in dtypes:
            raise InputError(
                f"{path}: field 'torch_dtype' must be one of {', '.join(dtypes)}, got {dtype!r}",
                source=str(path),
            )
        tied = cfg.get("tie_word_embeddings", False)
        if not isinstance(tied, bool):
            raise InputError(f"{path}: field 'tie_word_embeddings' must be true or false, got {tied!r}")
        head_dim = cfg.get("head_dim")
        head_dim = 0 if head_dim is None else pick("head_dim")
        model_type = text("model_type", "llama")
        family = model_type if model_type in FAMILIES else "llama"  # planning reads only the shape
        label = name or text("_name_or_path", "") or text("model_type", "") or path.parent.name
        fields = {
            "name": label,
            "layers": pick("num_hidden_layers", "n_layer", "num_layers"),
            "hidden": hidden,
            "ffn_hidden": pick("intermediate_size", "n_inner", "ffn_dim", default=4 * hidden),
            "vocab": pick("vocab_size"),
            "heads": heads,
            "kv_heads": pick("num_key_value_heads", default=heads),
            "head_dim": head_dim,
            "ffn_projections": 3 if act in ("silu", "swiglu", "swish") else 2,
            "tied_embeddings": tied,
            "dtype_bytes": dtypes[dtype],
            "family": family,
            "checkpoint": str(path.parent.resolve()) if any(path.parent.glob("*.safetensors")) else "",
        }
        try:
            return cls(**fields)
        except ValueError as exc:
            raise InputError(f"{path}: {exc}", source=str(path)) from None

    def to_dict(self) -> dict[str, object]:
        """Plain-data form (inverse of ``ModelSpec(**d)``)."""
        return {
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
        } | ({"checkpoint": self.checkpoint} if self.checkpoint else {})


def _many_experts(value: object) -> bool:
    """Whether an expert-count value is above 1 (a list, as Hunyuan's per-layer counts: any entry)."""
    if isinstance(value, list):
        return any(_many_experts(v) for v in value)
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 1


def _refuse_unsupported(cfg: dict, path: Path) -> None:
    """Raise :class:`InputError` if ``cfg`` is a mixture-of-experts or an MLA model.

    Checked in order: ``model_type``, the expert counts, the MLA ranks; at the top level, then in
    each nested table (``text_config``, ``ffn_config``, ...). The message names the file, the
    field and its value.
    """
    tables = [("", cfg)] + [(f"{key}.", value) for key, value in cfg.items() if isinstance(value, dict)]
    dense = "it would otherwise be misread as a dense model, with wrong parameters, FLOPs and memory"
    for prefix, table in tables:
        model_type = table.get("model_type")
        if isinstance(model_type, str) and (
            model_type.lower() in _MOE_MODEL_TYPES or "moe" in model_type.lower()
        ):
            raise InputError(
                f"{path}: field '{prefix}model_type' = {model_type!r} is a mixture-of-experts "
                f"architecture; mixture-of-experts models are not supported yet ({dense})",
                source=str(path),
                field=f"{prefix}model_type",
            )
    for prefix, table in tables:
        for key in _EXPERT_FIELDS:
            if _many_experts(table.get(key)):
                raise InputError(
                    f"{path}: field '{prefix}{key}' = {table[key]!r} marks a mixture-of-experts model; "
                    f"mixture-of-experts models are not supported yet ({dense})",
                    source=str(path),
                    field=prefix + key,
                )
    for prefix, table in tables:
        for key in _MLA_FIELDS:
            if table.get(key) is not None:
                raise InputError(
                    f"{path}: field '{prefix}{key}' = {table[key]!r} marks multi-head latent attention; "
                    "it is not supported yet (it would otherwise be misread as standard attention, with a "
                    "wrong KV cache and parameter count)",
                    source=str(path),
                    field=prefix + key,
                )


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


def _llama(name: str, L: int, d: int, dff: int, heads: int, kv: int, vocab: int) -> ModelSpec:
    return ModelSpec(name=name, layers=L, hidden=d, ffn_hidden=dff, vocab=vocab, heads=heads, kv_heads=kv)


def _qwen2(name: str, L: int, d: int, dff: int, heads: int, kv: int, vocab: int) -> ModelSpec:
    return ModelSpec(
        name=name, layers=L, hidden=d, ffn_hidden=dff, vocab=vocab, heads=heads, kv_heads=kv, family="qwen2"
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

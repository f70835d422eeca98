"""Megatron-core as the training engine of a plan group: configuration, rank layout, GPTModel,
Hugging Face ↔ Megatron weights and distributed checkpoints (extra ``megatron``).

What is here, and what has run where (``docs/megatron.md``):

* :class:`LayoutMapping` / :func:`transformer_config` map a :class:`~rpeg.ir.models.ModelSpec` and a
  plan layout ``(dp, pp, tp, mb)``, with context (ring or Ulysses) and sequence parallelism,
  onto Megatron-core 0.16.1 settings (expert parallelism too, for the runtime's Qwen3-MoE models);
  :func:`initialize_parallel` creates Megatron's process groups with the rank order
  :data:`MEGATRON_ORDER`, under which Megatron's ``(d, p, t)`` equal rpeg's
  ``rank = d·(Pp·Pt) + p·Pt + t`` (:func:`rpeg.runtime.worker.parallel.world_mesh`). Run on CPU (gloo).
* :func:`build_gpt_model` builds ``GPTModel`` with the local (Transformer-Engine-free) layer spec.
  Run on CPU (``use_cpu_initialization=True``).
* :func:`hf_to_megatron` / :func:`megatron_to_hf` convert a Llama-architecture Hugging Face state
  dict to the state dict of one ``(p, t)`` rank of the GPTModel and back, exactly. Run on CPU:
  ``load_state_dict(strict=True)`` per rank, and Megatron's own QKV split and MLP compared with the
  Hugging Face projections.
* Mixture-of-experts models (the runtime's Qwen3-MoE) map to Megatron's MoE settings with expert
  parallelism, and their experts convert to and from each EP rank's local experts. Run on CPU:
  expert groups, strict loading and the local experts' FFN; a MoE layer's forward (router,
  alltoall dispatcher) needs CUDA (docs/megatron.md).
* :func:`save_checkpoint` / :func:`load_checkpoint` write and read Megatron ``dist_checkpointing``
  checkpoints (format ``torch_dist``), resharding on load (TP=2 → TP=1, PP=1 → PP=2). Run on CPU.
  Megatron's own ``torch_dist`` save strategy calls ``torch.cuda.synchronize()``; saving goes
  through :func:`sync_save_strategy`, a Megatron save strategy that writes the same format
  with ``torch.distributed.checkpoint``'s synchronous ``FileSystemWriter``.
* :func:`train_step` runs one optimizer step over the plan's microbatches with
  ``get_forward_backward_func``. It cannot run on CPU (Megatron-core's forward pass, RNG tracker
  and pipeline schedules need CUDA) and has run on a GPU once: one H200, ``dp = pp = tp = 1``,
  float32, a 4-layer Llama (``benchmarks/gpu_check.py --megatron``; docs/megatron.md). Several GPUs
  (TP, PP, DP) and BF16 have not run.

Megatron-core is imported inside the functions (:func:`~rpeg.runtime.engines.require`), so importing
this module needs only torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ...ir.models import ModelSpec
from ...ir.plan import stage_layer_ranges
from . import require

if TYPE_CHECKING:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer import TransformerConfig

    from ...ir.plan import Strategy

__all__ = [
    "CP_COMM_TYPES",
    "MEGATRON_ORDER",
    "VOCAB_DIVISIBLE_BY",
    "LayoutMapping",
    "build_gpt_model",
    "coordinates",
    "destroy_parallel",
    "hf_shapes",
    "hf_to_megatron",
    "initialize_parallel",
    "load_checkpoint",
    "megatron_to_hf",
    "padded_vocab_size",
    "save_checkpoint",
    "stage_layers",
    "sync_save_strategy",
    "train_step",
    "transformer_config",
]

#: Megatron's rank order, innermost first: ``tp`` varies fastest, then ``pp``, then ``dp``, so
#: ``rank = d·(Pp·Pt) + p·Pt + t`` as in rpeg. Megatron's default ``"tp-cp-ep-dp-pp"`` would put
#: ``dp`` inside ``pp`` (``rank = p·(Pd·Pt) + d·Pt + t``). ``ep`` groups lie inside ``dp``.
MEGATRON_ORDER = "tp-cp-ep-pp-dp"
#: Megatron-core's ``cp_comm_type`` of each of rpeg's context-parallel kinds: ring attention's
#: P2P exchange of KV chunks, and the all-to-all that trades the sequence split for a head split.
CP_COMM_TYPES = {"ring": "p2p", "ulysses": "a2a"}

#: Megatron-LM's default ``--make-vocab-size-divisible-by``.
VOCAB_DIVISIBLE_BY = 128

_PURPOSE = "the Megatron-core engine"


def _mcore(module: str = "megatron.core") -> ModuleType:
    return require(module, purpose=_PURPOSE)


def _positive(owner: str, field: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{owner}: {field} must be a positive integer, got {value!r}")


# ---------------------------------------------------------------------------------------------- layout
def padded_vocab_size(vocab: int, tp: int, divisible_by: int = VOCAB_DIVISIBLE_BY) -> int:
    """Vocabulary size of the Megatron embedding and output layer.

    ``Vp = ⌈V / (m·Pt)⌉ · m·Pt`` with ``m = divisible_by`` (Megatron-LM's
    ``_vocab_size_with_padding``): both layers are split by rows over the ``Pt`` TP ranks, so
    ``Vp`` must be a multiple of ``Pt``. The padding rows are zeros after :func:`hf_to_megatron`.
    ``Vp`` depends on ``Pt`` unless ``V`` is a multiple of ``m·Pt``; a checkpoint can be resharded
    from one TP size to another only if both give the same ``Vp`` (choose ``divisible_by`` so).

    >>> padded_vocab_size(32000, 8), padded_vocab_size(100, 2, divisible_by=64)
    (32768, 128)
    """
    _positive("padded_vocab_size", "vocab", vocab)
    _positive("padded_vocab_size", "tp", tp)
    _positive("padded_vocab_size", "divisible_by", divisible_by)
    step = divisible_by * tp
    return math.ceil(vocab / step) * step


def stage_layers(layers: int, pp: int, p: int) -> range:
    """Global indices of the decoder layers of pipeline stage ``p``.

    rpeg's split (:func:`rpeg.ir.plan.stage_layer_ranges`): contiguous ranges, the first
    ``L mod Pp`` stages one layer longer. When ``Pp ∤ L`` the config carries the split to Megatron
    as ``pipeline_model_parallel_layout``. Megatron numbers a stage's layers from 0 in its state
    dict (``decoder.layers.{i - start}``); checkpoints place them at global offset ``i``.

    Raises
    ------
    ValueError
        If ``pp`` is not in ``1..layers`` or ``p`` not in ``0..pp-1``.
    """
    if not 1 <= pp <= layers:
        raise ValueError(f"stage_layers: pp={pp} must be between 1 and layers={layers}")
    if not 0 <= p < pp:
        raise ValueError(f"stage_layers: p={p} must be in 0..{pp - 1}")
    return range(*stage_layer_ranges(layers, pp)[p])


@dataclass(frozen=True, slots=True)
class LayoutMapping:
    """A plan group's layout ``(Pd, Pp, Pt, Pc, mb)`` as Megatron-core parallel settings.

    Ranks follow ``rank = t + Pt·(c + Pc·(p + Pp·d))`` in rpeg (tensor-parallel innermost, then
    context-parallel, pipeline, data-parallel; ``d·(Pp·Pt) + p·Pt + t`` without context
    parallelism) and, with :data:`MEGATRON_ORDER`, in Megatron. Context parallelism maps to
    ``context_parallel_size`` with ``cp_comm_type`` ``"p2p"`` (rpeg's ring) or ``"a2a"`` (its
    Ulysses), sequence parallelism to ``sequence_parallel``, expert parallelism to
    ``expert_model_parallel_size`` with ``expert_tensor_parallel_size = Pt`` (rpeg's expert-TP,
    Megatron's default): EP groups are ``Pe`` consecutive data-parallel ranks of each
    ``(p, t, c)`` coordinate, inside the ``Pd·Pc`` ranks as :data:`MEGATRON_ORDER` puts ``ep``
    inside ``dp``.

    Parameters
    ----------
    dp, pp, tp
        Data-, pipeline- and tensor-parallel degrees ``Pd, Pp, Pt``.
    microbatches
        Microbatches per step ``mb`` (``num_microbatches`` of the forward-backward schedule).
    cp, cp_kind, sp
        Context-parallel degree ``Pc``, ``"ring"`` or ``"ulysses"``, and sequence parallelism
        (SPEC §15.3).
    ep
        Expert-parallel degree ``Pe`` (SPEC §15.2), dividing ``Pd·Pc``.

    Raises
    ------
    ValueError
        If a degree or ``microbatches`` is not a positive integer, ``cp_kind`` is neither kind
        (or ``ulysses`` with ``cp = 1``), ``sp`` is not a boolean, or ``Pe ∤ Pd·Pc``.
    """

    dp: int
    pp: int
    tp: int
    microbatches: int = 1
    cp: int = 1
    cp_kind: str = "ring"
    sp: bool = False
    ep: int = 1

    def __post_init__(self) -> None:
        for field in ("dp", "pp", "tp", "microbatches", "cp", "ep"):
            _positive("LayoutMapping", field, getattr(self, field))
        if (self.dp * self.cp) % self.ep:
            raise ValueError(
                f"LayoutMapping: ep={self.ep} must divide the data- and context-parallel ranks "
                f"dp·cp = {self.dp * self.cp} (Megatron's expert groups lie inside them)"
            )
        if self.cp_kind not in CP_COMM_TYPES or (self.cp == 1 and self.cp_kind != "ring"):
            raise ValueError(
                f"LayoutMapping: cp_kind must be 'ring' or (with cp > 1) 'ulysses', got {self.cp_kind!r}"
            )
        if not isinstance(self.sp, bool):
            raise ValueError(f"LayoutMapping: sp must be True or False, got {self.sp!r}")

    @classmethod
    def from_strategy(cls, strategy: Strategy) -> LayoutMapping:
        """The layout of a plan's :class:`~rpeg.ir.plan.Strategy` (``dp, pp, tp, mb, cp,
        cp_kind, sp, ep``)."""
        return cls(
            dp=strategy.dp,
            pp=strategy.pp,
            tp=strategy.tp,
            microbatches=strategy.mb,
            cp=strategy.cp,
            cp_kind=strategy.cp_kind,
            sp=strategy.sp,
            ep=strategy.ep,
        )

    @property
    def world(self) -> int:
        """``Pd·Pp·Pt·Pc`` ranks."""
        return self.dp * self.pp * self.tp * self.cp

    def rank(self, d: int, p: int, t: int, c: int = 0) -> int:
        """``rank = t + Pt·(c + Pc·(p + Pp·d))``."""
        return t + self.tp * (c + self.cp * (p + self.pp * d))

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """``(d, p, t) = (rank // (Pp·Pt·Pc), (rank // (Pt·Pc)) mod Pp, rank mod Pt)``; the
        context-parallel index is :meth:`context_rank`."""
        if not 0 <= rank < self.world:
            raise ValueError(f"LayoutMapping: rank={rank} must be in 0..{self.world - 1}")
        return rank // (self.pp * self.tp * self.cp), (rank // (self.tp * self.cp)) % self.pp, rank % self.tp

    def context_rank(self, rank: int) -> int:
        """``c = (rank // Pt) mod Pc``."""
        self.coordinates(rank)  # the range check
        return (rank // self.tp) % self.cp

    def expert_rank(self, rank: int) -> int:
        """EP rank ``e = (d·Pc + c) mod Pe``: Megatron's expert groups are ``Pe`` consecutive
        ranks of the ``Pd·Pc`` data- and context-parallel ones (rpeg's runtime numbers its replicas
        the same way, ``worker/experts.py``)."""
        d, _, _ = self.coordinates(rank)
        return (d * self.cp + self.context_rank(rank)) % self.ep

    def check(self, spec: ModelSpec) -> None:
        """Raise ``ValueError`` if ``spec`` cannot be split by this layout.

        Megatron splits query heads, key/value groups and FFN columns over ``Pt`` and layers over
        ``Pp``: ``Pt | heads``, ``Pt | kv_heads`` (rpeg's converter keeps whole query groups per
        rank), ``Pt | ffn_hidden`` and ``Pp ≤ layers``; Ulysses needs ``Pc | heads/Pt``, sequence
        parallelism ``Pt > 1``. A mixture-of-experts spec is mapped as the runtime builds it
        (Qwen3-MoE, :data:`~rpeg.runtime.engines.hf_models.MOE_FAMILY`): it needs ``Pe | E`` and
        ``Pt | d_e``; shared experts and latent attention are refused (not mapped). Expert
        parallelism needs a mixture-of-experts spec.
        """
        owner = f"ModelSpec {spec.name!r} with tp={self.tp}, pp={self.pp}"
        if self.cp_kind == "ulysses" and (spec.heads // self.tp) % self.cp:
            raise ValueError(
                f"{owner}: cp={self.cp} (Ulysses, cp_comm_type 'a2a') does not divide the "
                f"heads per rank {spec.heads // self.tp}"
            )
        if self.sp and self.tp == 1:
            raise ValueError(f"{owner}: sequence parallelism needs tp > 1")
        if spec.is_mla or spec.shared_experts:
            raise ValueError(
                f"{owner}: latent attention (kv_lora_rank {spec.kv_lora_rank}) or shared experts "
                f"({spec.shared_experts}) are not mapped onto Megatron-core "
                "(multi_latent_attention, moe_shared_expert_intermediate_size)"
            )
        if self.ep > 1 and not spec.is_moe:
            raise ValueError(f"{owner}: ep={self.ep} but the model has no experts")
        if spec.is_moe and (spec.experts % self.ep or spec.expert_ffn % self.tp):
            raise ValueError(
                f"{owner}: ep={self.ep} must divide the {spec.experts} experts and tp={self.tp} "
                f"the expert FFN width {spec.expert_ffn}"
            )
        for field in ("heads", "kv_heads", "ffn_hidden"):
            value = getattr(spec, field)
            if value % self.tp:
                raise ValueError(f"{owner}: {field}={value} is not divisible by tp={self.tp}")
        if spec.heads % spec.kv_heads:
            raise ValueError(f"{owner}: heads={spec.heads} is not divisible by kv_heads={spec.kv_heads}")
        if self.pp > spec.layers:
            raise ValueError(f"{owner}: layers={spec.layers} is fewer than pp={self.pp} stages")

    def pipeline_layout(self, spec: ModelSpec) -> list[list[str]] | None:
        """Megatron's ``pipeline_model_parallel_layout`` for rpeg's stage split, or ``None`` when
        ``Pp | L`` (Megatron's even split is then the same)."""
        if self.pp == 1 or spec.layers % self.pp == 0:
            return None
        stages = [["decoder"] * len(stage_layers(spec.layers, self.pp, p)) for p in range(self.pp)]
        stages[0].insert(0, "embedding")
        stages[-1].append("loss")
        return stages

    def settings(self, spec: ModelSpec, *, vocab_divisible_by: int = VOCAB_DIVISIBLE_BY) -> dict[str, Any]:
        """Megatron-core settings of this layout for ``spec``, as plain data (docs and traces).

        Keys: ``tensor_model_parallel_size``, ``pipeline_model_parallel_size``,
        ``context_parallel_size``, ``cp_comm_type``, ``sequence_parallel``,
        ``expert_model_parallel_size``, ``expert_tensor_parallel_size``,
        ``data_parallel_size``, ``num_microbatches``, ``world_size``, ``order``
        (:data:`MEGATRON_ORDER`), ``stage_layers`` (``[start, stop)`` per stage),
        ``pipeline_model_parallel_layout`` (``None`` for an even split), ``padded_vocab_size``,
        ``heads_per_rank``, ``query_groups_per_rank``, ``ffn_hidden_per_rank``.
        """
        self.check(spec)
        return {
            "tensor_model_parallel_size": self.tp,
            "pipeline_model_parallel_size": self.pp,
            "context_parallel_size": self.cp,
            "cp_comm_type": CP_COMM_TYPES[self.cp_kind],
            "sequence_parallel": self.sp,
            "expert_model_parallel_size": self.ep,
            "expert_tensor_parallel_size": self.tp,
            "data_parallel_size": self.dp,
            "num_microbatches": self.microbatches,
            "world_size": self.world,
            "order": MEGATRON_ORDER,
            "stage_layers": [
                [r.start, r.stop] for r in (stage_layers(spec.layers, self.pp, p) for p in range(self.pp))
            ],
            "pipeline_model_parallel_layout": self.pipeline_layout(spec),
            "padded_vocab_size": padded_vocab_size(spec.vocab, self.tp, vocab_divisible_by),
            "heads_per_rank": spec.heads // self.tp,
            "query_groups_per_rank": spec.kv_heads // self.tp,
            "ffn_hidden_per_rank": spec.ffn_hidden // self.tp,
        }


def transformer_config(
    spec: ModelSpec,
    *,
    tp: int,
    pp: int,
    dp: int,
    microbatches: int,
    dtype: torch.dtype = torch.float32,
    norm_epsilon: float = 1e-5,
    cp: int = 1,
    cp_kind: str = "ring",
    sp: bool = False,
    ep: int = 1,
    **overrides: Any,
) -> TransformerConfig:
    """Megatron-core ``TransformerConfig`` of ``spec`` on the layout ``(dp, pp, tp, microbatches)``.

    ============================== =========================================================
    Megatron field                 value
    ============================== =========================================================
    ``num_layers``                 ``spec.layers``
    ``hidden_size``                ``spec.hidden``
    ``ffn_hidden_size``            ``spec.ffn_hidden``
    ``num_attention_heads``        ``spec.heads``
    ``num_query_groups``           ``spec.kv_heads``
    ``kv_channels``                ``spec.head_dim`` (``hidden // heads`` when 0)
    ``gated_linear_unit``          ``spec.ffn_projections == 3``
    ``activation_func``            ``silu`` (gated: SwiGLU) else ``gelu``
    ``normalization``              ``"RMSNorm"``, ``layernorm_epsilon = norm_epsilon``
    ``add_bias_linear``            ``False``; ``add_qkv_bias = spec.family == "qwen2"``
    ``hidden/attention_dropout``   ``0.0`` (Llama has none)
    ``tensor/pipeline_model_...``  ``tp``, ``pp``; ``pipeline_model_parallel_layout`` when
                                   ``pp ∤ layers`` (:meth:`LayoutMapping.pipeline_layout`)
    ``context_parallel_size``      ``cp``; ``cp_comm_type`` ``"p2p"`` (ring) or ``"a2a"``
                                   (Ulysses, :data:`CP_COMM_TYPES`)
    ``sequence_parallel``          ``sp``
    ``expert_model_parallel_size`` ``ep``; ``expert_tensor_parallel_size = tp``
    ``num_moe_experts``            MoE only: ``E``; ``moe_router_topk = k``,
                                   ``moe_ffn_hidden_size = d_e``, ``moe_layer_freq`` 0 on
                                   ``dense_layers`` and 1 elsewhere, ``qk_layernorm`` (Qwen3-MoE),
                                   softmax router renormalised over the top ``k`` (``pre_softmax``
                                   off: Qwen3's ``norm_topk_prob``), no load-balancing loss,
                                   ``moe_token_dispatcher_type = "alltoall"`` (the dispatch the
                                   cost model prices; its constructor needs CUDA in 0.16.1)
    ``params_dtype``               ``dtype``; ``bf16``/``fp16`` set to match; ``pipeline_dtype``
                                   ``= dtype`` when ``pp > 1``
    ``use_cpu_initialization``     ``True`` when CUDA is unavailable
    ============================== =========================================================

    ``dp`` and ``microbatches`` are not config fields (Megatron derives ``dp`` from the world size;
    ``microbatches`` goes to the schedule) but are validated here with the rest of the layout.

    Parameters
    ----------
    spec
        The model.
    tp, pp, dp, microbatches
        The plan group's layout.
    cp, cp_kind, sp
        Context parallelism (degree and kind) and sequence parallelism (SPEC §15.3).
    ep
        Expert parallelism (SPEC §15.2).
    dtype
        Parameter dtype (``float32``, ``bfloat16`` or ``float16``).
    norm_epsilon
        RMSNorm epsilon (``rms_norm_eps`` of the Hugging Face config; ``1e-5``, the runtime's
        models' value, :mod:`~rpeg.runtime.engines.hf_models`).
    **overrides
        Further ``TransformerConfig`` fields, applied last.

    Raises
    ------
    ValueError
        If the layout does not divide the model (:meth:`LayoutMapping.check`), ``dtype`` is not a
        floating type, or an override names no ``TransformerConfig`` field.
    EngineMissing
        If megatron-core is not installed.
    """
    layout = LayoutMapping(
        dp=dp, pp=pp, tp=tp, microbatches=microbatches, cp=cp, cp_kind=cp_kind, sp=sp, ep=ep
    )
    layout.check(spec)
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"transformer_config: dtype={dtype} must be float32, bfloat16 or float16")
    tc = _mcore("megatron.core.transformer")
    known = {f.name for f in dataclasses.fields(tc.TransformerConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"transformer_config: overrides {unknown} are not TransformerConfig fields")
    gated = spec.ffn_projections == 3
    fields: dict[str, Any] = {
        "num_layers": spec.layers,
        "hidden_size": spec.hidden,
        "ffn_hidden_size": spec.ffn_hidden,
        "num_attention_heads": spec.heads,
        "num_query_groups": spec.kv_heads,
        "kv_channels": spec.head_dim or spec.hidden // spec.heads,
        "gated_linear_unit": gated,
        "activation_func": torch.nn.functional.silu if gated else torch.nn.functional.gelu,
        "normalization": "RMSNorm",
        "layernorm_epsilon": norm_epsilon,
        "add_bias_linear": False,
        "add_qkv_bias": spec.family == "qwen2",
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp,
        "context_parallel_size": cp,
        "cp_comm_type": CP_COMM_TYPES[cp_kind],
        "sequence_parallel": sp,
        "pipeline_model_parallel_layout": layout.pipeline_layout(spec),
        "params_dtype": dtype,
        "bf16": dtype == torch.bfloat16,
        "fp16": dtype == torch.float16,
        "pipeline_dtype": dtype if pp > 1 else None,
        "use_cpu_initialization": not torch.cuda.is_available(),
        "expert_model_parallel_size": ep,
        "expert_tensor_parallel_size": tp,
    }
    if spec.is_moe:
        dense = set(spec.dense_layers)
        fields |= {
            "num_moe_experts": spec.experts,
            "moe_router_topk": spec.experts_active,
            "moe_ffn_hidden_size": spec.expert_ffn,
            "moe_layer_freq": [0 if i in dense else 1 for i in range(spec.layers)],
            "qk_layernorm": True,
            "moe_router_pre_softmax": False,
            "moe_router_score_function": "softmax",
            "moe_router_load_balancing_type": "none",
            "moe_aux_loss_coeff": 0.0,
            "moe_token_dispatcher_type": "alltoall",
        }
    fields.update(overrides)
    return tc.TransformerConfig(**fields)


# ---------------------------------------------------------------------------------------------- ranks
def initialize_parallel(tp: int, pp: int, cp: int = 1, ep: int = 1, **kwargs: Any) -> LayoutMapping:
    """Create Megatron-core's process groups on the initialised default group, in rpeg's rank order.

    Calls ``parallel_state.initialize_model_parallel(tp, pp, context_parallel_size=cp,
    expert_model_parallel_size=ep, expert_tensor_parallel_size=tp, order=MEGATRON_ORDER,
    **kwargs)``; ``Pd = world / (Pp·Pt·Pc)``. Megatron's expert-parallel rank then equals
    :meth:`LayoutMapping.expert_rank`. Afterwards
    :func:`coordinates` on rank ``r`` equals :meth:`LayoutMapping.coordinates` (``(r // (Pp·Pt),
    (r // Pt) mod Pp, r mod Pt)`` without context parallelism) and Megatron's context-parallel
    rank :meth:`LayoutMapping.context_rank`. On CPU the default group is gloo.

    Returns
    -------
    LayoutMapping
        The layout (``microbatches`` 1: the schedule takes it per step).

    Raises
    ------
    RuntimeError
        If ``torch.distributed`` is not initialised.
    ValueError
        If the world size is not a multiple of ``Pp·Pt``.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("initialize_parallel: torch.distributed is not initialised (init_process_group)")
    world = dist.get_world_size()
    _positive("initialize_parallel", "tp", tp)
    _positive("initialize_parallel", "pp", pp)
    _positive("initialize_parallel", "cp", cp)
    _positive("initialize_parallel", "ep", ep)
    if world % (tp * pp * cp):
        raise ValueError(
            f"initialize_parallel: world size {world} is not divisible by pp·tp·cp = {pp * tp * cp}"
        )
    ps = _mcore("megatron.core.parallel_state")
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=tp,
        order=MEGATRON_ORDER,
        **kwargs,
    )
    return LayoutMapping(dp=world // (tp * pp * cp), pp=pp, tp=tp, cp=cp, ep=ep)


def coordinates() -> tuple[int, int, int]:
    """This rank's ``(d, p, t)`` as Megatron's ``parallel_state`` sees it (data-, pipeline- and
    tensor-parallel ranks)."""
    ps = _mcore("megatron.core.parallel_state")
    return (
        ps.get_data_parallel_rank(),
        ps.get_pipeline_model_parallel_rank(),
        ps.get_tensor_model_parallel_rank(),
    )


def destroy_parallel() -> None:
    """Destroy Megatron's process groups (``parallel_state.destroy_model_parallel``); the default
    group stays."""
    _mcore("megatron.core.parallel_state").destroy_model_parallel()


# ---------------------------------------------------------------------------------------------- model
def build_gpt_model(
    spec: ModelSpec,
    config: TransformerConfig,
    *,
    pre_process: bool,
    post_process: bool,
    max_sequence_length: int = 4096,
    rotary_base: float = 10000.0,
    vocab_divisible_by: int = VOCAB_DIVISIBLE_BY,
    **kwargs: Any,
) -> GPTModel:
    """This rank's stage of ``GPTModel`` with the local layer spec and rotary position embeddings.

    ``GPTModel(config, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=Vp,
    position_embedding_type="rope", share_embeddings_and_output_weights=spec.tied_embeddings)``;
    a mixture-of-experts spec gets ``get_gpt_decoder_block_spec(config, use_transformer_engine=False)``
    — the same local modules per layer, with a router and Megatron's ``SequentialMLP`` of local
    experts where ``moe_layer_freq`` is 1, and query/key norms.
    with ``Vp = padded_vocab_size(spec.vocab, Pt, vocab_divisible_by)``. The local spec uses
    Megatron's own linear layers and torch's RMSNorm (no Transformer Engine, no Apex).
    ``parallel_state`` must be initialised (:func:`initialize_parallel`).

    Parameters
    ----------
    spec, config
        The model and its :func:`transformer_config`.
    pre_process, post_process
        Whether this stage holds the embedding (first stage) and the final norm and output layer
        (last stage).
    max_sequence_length, rotary_base
        ``GPTModel`` arguments (``rope_theta`` of the Hugging Face config for ``rotary_base``).
    vocab_divisible_by
        ``m`` of :func:`padded_vocab_size`.
    **kwargs
        Further ``GPTModel`` arguments (``rope_scaling=True`` for Llama-3.1 frequencies).

    Raises
    ------
    ValueError
        If ``config`` was made for another model.
    RuntimeError
        On CPU for tied embeddings with ``Pp > 1``: Megatron-core 0.16.1 copies the embedding to
        the last stage with ``.cuda()`` while building.
    """
    if (config.num_layers, config.hidden_size, config.num_attention_heads) != (
        spec.layers,
        spec.hidden,
        spec.heads,
    ):
        raise ValueError(
            f"build_gpt_model: config (layers={config.num_layers}, hidden={config.hidden_size}, "
            f"heads={config.num_attention_heads}) is not the config of ModelSpec {spec.name!r}"
        )
    if spec.tied_embeddings and config.pipeline_model_parallel_size > 1 and not torch.cuda.is_available():
        raise RuntimeError(
            "build_gpt_model: tied embeddings with pp > 1 need CUDA: Megatron-core 0.16.1 moves the "
            "embedding copy of the last stage to the GPU (.cuda()) while building the model"
        )
    gpt = _mcore("megatron.core.models.gpt")
    specs = _mcore("megatron.core.models.gpt.gpt_layer_specs")
    vocab = padded_vocab_size(spec.vocab, config.tensor_model_parallel_size, vocab_divisible_by)
    layer_spec = (
        # per layer: dense where moe_layer_freq says 0, this stage's layers only
        specs.get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm")
        if spec.is_moe
        else specs.get_gpt_layer_local_spec(normalization="RMSNorm")
    )
    return gpt.GPTModel(
        config,
        layer_spec,
        vocab_size=vocab,
        max_sequence_length=max_sequence_length,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=spec.tied_embeddings,
        position_embedding_type="rope",
        rotary_base=rotary_base,
        **kwargs,
    )


# ---------------------------------------------------------------------------------------------- weights
#: Linear layers of the local spec; each has an (empty) ``_extra_state`` entry in the state dict.
_LAYER_LINEARS = (
    "self_attention.linear_qkv",
    "self_attention.linear_proj",
    "mlp.linear_fc1",
    "mlp.linear_fc2",
)


def _dims(spec: ModelSpec) -> tuple[int, int, int]:
    """``(head_dim, heads per query group r, query groups)``."""
    return spec.head_dim or spec.hidden // spec.heads, spec.heads // spec.kv_heads, spec.kv_heads


def _fuse_qkv(q: Tensor, k: Tensor, v: Tensor, spec: ModelSpec, tp: int, t: int) -> Tensor:
    """Rows of ``linear_qkv`` on TP rank ``t``: for each of the rank's groups ``g`` in
    ``[t·G/Pt, (t+1)·G/Pt)``, the ``r`` query heads of ``g``, then ``k_g``, then ``v_g``."""
    hd, r, groups = _dims(spec)
    rest = q.shape[1:]
    fused = torch.cat(
        [q.reshape(groups, r * hd, *rest), k.reshape(groups, hd, *rest), v.reshape(groups, hd, *rest)], dim=1
    )
    per = groups // tp
    return fused[t * per : (t + 1) * per].reshape(-1, *rest).clone()


def _split_qkv(shards: Sequence[Tensor], spec: ModelSpec) -> tuple[Tensor, Tensor, Tensor]:
    """Inverse of :func:`_fuse_qkv` over all TP ranks: full ``q, k, v``."""
    hd, r, groups = _dims(spec)
    rest = shards[0].shape[1:]
    fused = torch.cat([s.reshape(-1, (r + 2) * hd, *rest) for s in shards], dim=0)
    if fused.shape[0] != groups:
        raise ValueError(
            f"megatron_to_hf: linear_qkv shards hold {fused.shape[0]} query groups, spec {groups}"
        )
    q, k, v = fused.split([r * hd, hd, hd], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def _rows(x: Tensor, tp: int, t: int) -> Tensor:
    return x.chunk(tp, dim=0)[t].clone()


def _cols(x: Tensor, tp: int, t: int) -> Tensor:
    return x.chunk(tp, dim=1)[t].clone()


def _pad_vocab(w: Tensor, padded: int) -> Tensor:
    if w.shape[0] > padded:
        raise ValueError(f"hf_to_megatron: vocabulary {w.shape[0]} exceeds the padded size {padded}")
    return torch.cat([w, w.new_zeros(padded - w.shape[0], *w.shape[1:])]) if w.shape[0] < padded else w


def hf_to_megatron(
    hf_state: Mapping[str, Tensor],
    spec: ModelSpec,
    *,
    tp: int,
    t: int,
    pp: int = 1,
    p: int = 0,
    ep: int = 1,
    e: int = 0,
    vocab_divisible_by: int = VOCAB_DIVISIBLE_BY,
) -> dict[str, Tensor | None]:
    """State dict of TP rank ``t`` of pipeline stage ``p`` (and EP rank ``e``) of
    :func:`build_gpt_model`'s GPTModel.

    ================================================ ==============================================
    Hugging Face ``…ForCausalLM`` (:func:`hf_shapes`) Megatron local spec, rank ``(p, t)``
    ================================================ ==============================================
    ``model.embed_tokens.weight`` ``[V, d]``          ``embedding.word_embeddings.weight``: rows
                                                      ``[t·Vp/Pt, (t+1)·Vp/Pt)`` of the padded
                                                      ``[Vp, d]`` (first stage)
    ``model.layers.{i}.input_layernorm.weight``       ``decoder.layers.{j}.input_layernorm.weight``
    ``...self_attn.{q,k,v}_proj.{weight,bias}``       ``...self_attention.linear_qkv.{weight,bias}``:
                                                      per query group ``g`` of the rank,
                                                      ``[q heads of g; k_g; v_g]``
    ``...self_attn.o_proj.weight`` ``[d, H·hd]``      ``...self_attention.linear_proj.weight``:
                                                      columns ``[t·H·hd/Pt, (t+1)·H·hd/Pt)``
    ``...post_attention_layernorm.weight``            ``decoder.layers.{j}.pre_mlp_layernorm.weight``
    ``...mlp.{gate,up}_proj.weight`` ``[F, d]``       ``...mlp.linear_fc1.weight``:
                                                      ``[gate rows of t; up rows of t]``
    ``...mlp.down_proj.weight`` ``[d, F]``            ``...mlp.linear_fc2.weight``: columns of ``t``
    ``model.norm.weight``                             ``decoder.final_layernorm.weight`` (last)
    ``lm_head.weight`` (tied: ``embed_tokens``)       ``output_layer.weight``: rows as the embedding
                                                      (last stage; tied: only if it is not first)
    ================================================ ==============================================

    ``j = i − start(p)`` for the global layers ``i`` of :func:`stage_layers`: the state dict numbers
    a stage's layers from 0 (checkpoints place them at global offset ``i``). Norm weights are replicated. Each
    linear layer's ``_extra_state`` key maps to ``None`` (the local spec keeps none, and
    ``load_state_dict(strict=True)`` expects the key). Megatron's ``glu`` applies the activation to
    the first half of ``linear_fc1``'s output, hence gate first.

    A mixture-of-experts layer (Qwen3-MoE names, :func:`hf_shapes`) maps ``mlp.gate.weight`` to
    ``mlp.router.weight`` (replicated), ``self_attn.{q,k}_norm.weight`` to
    ``self_attention.{q,k}_layernorm.weight``, and expert ``g = e·E/Pe + j`` of EP rank ``e`` to
    ``mlp.experts.local_experts.{j}.linear_fc1.weight`` (``[gate rows of t; up rows of t]``) and
    ``….linear_fc2.weight`` (its ``down_proj`` columns of ``t``): expert-TP is ``Pt``.

    Parameters
    ----------
    hf_state
        Full (unsharded) Hugging Face state dict; ``lm_head.weight`` is ignored when tied.
    spec
        The model (``ffn_projections`` must be 3: the Hugging Face Llama MLP is gated).
    tp, t, pp, p, ep, e
        TP size and rank, PP size and stage, EP size and rank.
    vocab_divisible_by
        ``m`` of :func:`padded_vocab_size`.

    Raises
    ------
    ValueError
        If a rank is out of range, the layout does not divide the model, or a weight is missing,
        has the wrong shape or is not one of ``spec``'s family (:func:`hf_shapes`).
    """
    LayoutMapping(dp=ep, pp=pp, tp=tp, ep=ep).check(spec)
    if not 0 <= t < tp or not 0 <= p < pp or not 0 <= e < ep:
        raise ValueError(f"hf_to_megatron: rank (p={p}, t={t}, e={e}) is outside pp={pp}, tp={tp}, ep={ep}")
    if spec.ffn_projections != 3:
        raise ValueError(
            f"hf_to_megatron: ModelSpec {spec.name!r} has ffn_projections={spec.ffn_projections}; "
            "the Hugging Face Llama architecture is gated (3)"
        )
    _check_hf_shapes(hf_state, spec)
    vp = padded_vocab_size(spec.vocab, tp, vocab_divisible_by)
    first, last = p == 0, p == pp - 1
    out: dict[str, Tensor | None] = {}
    if first:
        out["embedding.word_embeddings.weight"] = _rows(
            _pad_vocab(hf_state["model.embed_tokens.weight"], vp), tp, t
        )
    layers = stage_layers(spec.layers, pp, p)
    for j, i in enumerate(layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{j}."
        attn = src + "self_attn."
        out[dst + "input_layernorm.weight"] = hf_state[src + "input_layernorm.weight"].clone()
        out[dst + "self_attention.linear_qkv.weight"] = _fuse_qkv(
            *(hf_state[f"{attn}{x}_proj.weight"] for x in "qkv"), spec, tp, t
        )
        if spec.family == "qwen2":
            out[dst + "self_attention.linear_qkv.bias"] = _fuse_qkv(
                *(hf_state[f"{attn}{x}_proj.bias"] for x in "qkv"), spec, tp, t
            )
        out[dst + "self_attention.linear_proj.weight"] = _cols(hf_state[attn + "o_proj.weight"], tp, t)
        out[dst + "pre_mlp_layernorm.weight"] = hf_state[src + "post_attention_layernorm.weight"].clone()
        if spec.is_moe:
            for x in "qk":
                out[f"{dst}self_attention.{x}_layernorm.weight"] = hf_state[f"{attn}{x}_norm.weight"].clone()
        linears = _LAYER_LINEARS[:2]
        if _moe_layer(spec, i):
            out[dst + "mlp.router.weight"] = hf_state[src + "mlp.gate.weight"].clone()
            local = spec.experts // ep
            for j in range(local):
                ex, mx = f"{src}mlp.experts.{e * local + j}.", f"mlp.experts.local_experts.{j}."
                gate, up = hf_state[ex + "gate_proj.weight"], hf_state[ex + "up_proj.weight"]
                out[dst + mx + "linear_fc1.weight"] = torch.cat([_rows(gate, tp, t), _rows(up, tp, t)])
                out[dst + mx + "linear_fc2.weight"] = _cols(hf_state[ex + "down_proj.weight"], tp, t)
                linears += (mx + "linear_fc1", mx + "linear_fc2")
        else:
            gate, up = hf_state[src + "mlp.gate_proj.weight"], hf_state[src + "mlp.up_proj.weight"]
            out[dst + "mlp.linear_fc1.weight"] = torch.cat([_rows(gate, tp, t), _rows(up, tp, t)])
            out[dst + "mlp.linear_fc2.weight"] = _cols(hf_state[src + "mlp.down_proj.weight"], tp, t)
            linears = _LAYER_LINEARS
        for name in linears:
            out[f"{dst}{name}._extra_state"] = None
    if last:
        out["decoder.final_layernorm.weight"] = hf_state["model.norm.weight"].clone()
        head = "model.embed_tokens.weight" if spec.tied_embeddings else "lm_head.weight"
        if not spec.tied_embeddings or not first:
            out["output_layer.weight"] = _rows(_pad_vocab(hf_state[head], vp), tp, t)
        out["output_layer._extra_state"] = None
    return out


def _moe_layer(spec: ModelSpec, layer: int) -> bool:
    """Whether global layer ``layer`` of ``spec`` is a mixture-of-experts layer."""
    return spec.is_moe and layer not in spec.dense_layers


def hf_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the Hugging Face ``…ForCausalLM`` state dict of ``spec``: the Llama
    names (Mistral's are the same), q/k/v biases for ``family == "qwen2"``, ``lm_head.weight``
    only when untied; a mixture-of-experts spec as Qwen3-MoE's checkpoint names it (query/key
    norms, ``mlp.gate`` router, ``mlp.experts.{e}.{gate,up,down}_proj``; the runtime's
    ``hf_models.checkpoint_state``)."""
    hd, _, _ = _dims(spec)
    d, f, v = spec.hidden, spec.ffn_hidden, spec.vocab
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, d)}
    for i in range(spec.layers):
        a = f"model.layers.{i}."
        shapes |= {
            a + "input_layernorm.weight": (d,),
            a + "self_attn.q_proj.weight": (spec.heads * hd, d),
            a + "self_attn.k_proj.weight": (spec.kv_heads * hd, d),
            a + "self_attn.v_proj.weight": (spec.kv_heads * hd, d),
            a + "self_attn.o_proj.weight": (d, spec.heads * hd),
            a + "post_attention_layernorm.weight": (d,),
        }
        if spec.is_moe:
            shapes |= {a + "self_attn.q_norm.weight": (hd,), a + "self_attn.k_norm.weight": (hd,)}
        if _moe_layer(spec, i):
            de = spec.expert_ffn
            shapes[a + "mlp.gate.weight"] = (spec.experts, d)
            for x in range(spec.experts):
                ex = f"{a}mlp.experts.{x}."
                shapes |= {
                    ex + "gate_proj.weight": (de, d),
                    ex + "up_proj.weight": (de, d),
                    ex + "down_proj.weight": (d, de),
                }
        else:
            shapes |= {
                a + "mlp.gate_proj.weight": (f, d),
                a + "mlp.up_proj.weight": (f, d),
                a + "mlp.down_proj.weight": (d, f),
            }
        if spec.family == "qwen2" and not spec.is_moe:
            shapes |= {
                a + "self_attn.q_proj.bias": (spec.heads * hd,),
                a + "self_attn.k_proj.bias": (spec.kv_heads * hd,),
                a + "self_attn.v_proj.bias": (spec.kv_heads * hd,),
            }
    shapes["model.norm.weight"] = (d,)
    if not spec.tied_embeddings:
        shapes["lm_head.weight"] = (v, d)
    return shapes


def _check_hf_shapes(hf_state: Mapping[str, Tensor], spec: ModelSpec) -> None:
    shapes = hf_shapes(spec)
    for name, shape in shapes.items():
        if name not in hf_state:
            raise ValueError(f"hf_to_megatron: {name} is missing from the Hugging Face state dict")
        if tuple(hf_state[name].shape) != shape:
            raise ValueError(
                f"hf_to_megatron: {name} has shape {tuple(hf_state[name].shape)}, "
                f"ModelSpec {spec.name!r} gives {shape}"
            )
    # A tied model's state dict may list the head under its own name (the same tensor).
    unexpected = sorted(set(hf_state) - set(shapes) - ({"lm_head.weight"} if spec.tied_embeddings else set()))
    if unexpected:
        raise ValueError(
            f"hf_to_megatron: {unexpected[:3]} are not weights of a {spec.family} model of "
            f"ModelSpec {spec.name!r} ({len(unexpected)} unexpected)"
        )


def megatron_to_hf(
    shards: Sequence[Mapping[str, Tensor | None]] | Sequence[Sequence[Mapping[str, Tensor | None]]],
    spec: ModelSpec,
    *,
    tp: int,
    pp: int = 1,
    ep: int = 1,
) -> dict[str, Tensor]:
    """Inverse of :func:`hf_to_megatron`: the full Hugging Face state dict from all ranks' shards.

    Parameters
    ----------
    shards
        ``ep·pp·tp`` state dicts in rank order ``e·(Pp·Pt) + p·Pt + t`` (one list), or one list
        of ``tp`` per stage (``ep = 1``). ``_extra_state`` entries are ignored; vocabulary padding
        rows are dropped; the dense weights are read from EP rank 0, expert ``e·E/Pe + j`` from
        EP rank ``e``'s local expert ``j``.
    spec
        The model.
    tp, pp, ep
        TP, PP and EP sizes of the shards.

    Raises
    ------
    ValueError
        If the number of shards is not ``ep·pp·tp`` or a stage lacks a weight.
    """
    flat = [s for stage in shards for s in stage] if shards and not isinstance(shards[0], Mapping) else shards
    if len(flat) != ep * pp * tp:
        raise ValueError(f"megatron_to_hf: {len(flat)} shards given, ep·pp·tp = {ep * pp * tp} expected")

    def cat(p: int, name: str, dim: int, e: int = 0) -> Tensor:
        parts = [flat[(e * pp + p) * tp + t].get(name) for t in range(tp)]
        if any(x is None for x in parts):
            raise ValueError(f"megatron_to_hf: {name} is missing from a shard of stage {p}")
        return torch.cat(parts, dim=dim)  # type: ignore[arg-type]

    out: dict[str, Tensor] = {
        "model.embed_tokens.weight": cat(0, "embedding.word_embeddings.weight", 0)[: spec.vocab]
    }
    for p in range(pp):
        for j, i in enumerate(stage_layers(spec.layers, pp, p)):
            src, dst = f"decoder.layers.{j}.", f"model.layers.{i}."
            out[dst + "input_layernorm.weight"] = flat[p * tp][src + "input_layernorm.weight"].clone()
            qkv = [flat[p * tp + t][src + "self_attention.linear_qkv.weight"] for t in range(tp)]
            for x, w in zip("qkv", _split_qkv(qkv, spec), strict=True):
                out[f"{dst}self_attn.{x}_proj.weight"] = w.contiguous()
            if spec.family == "qwen2":
                qkv = [flat[p * tp + t][src + "self_attention.linear_qkv.bias"] for t in range(tp)]
                for x, b in zip("qkv", _split_qkv(qkv, spec), strict=True):
                    out[f"{dst}self_attn.{x}_proj.bias"] = b.contiguous()
            out[dst + "self_attn.o_proj.weight"] = cat(p, src + "self_attention.linear_proj.weight", 1)
            out[dst + "post_attention_layernorm.weight"] = flat[p * tp][
                src + "pre_mlp_layernorm.weight"
            ].clone()
            if spec.is_moe:
                for x in "qk":
                    out[f"{dst}self_attn.{x}_norm.weight"] = flat[p * tp][
                        f"{src}self_attention.{x}_layernorm.weight"
                    ].clone()
            mlps = [(f"{src}mlp.", f"{dst}mlp.", 0)]
            if _moe_layer(spec, i):
                out[dst + "mlp.gate.weight"] = flat[p * tp][src + "mlp.router.weight"].clone()
                local = spec.experts // ep
                mlps = [
                    (f"{src}mlp.experts.local_experts.{j}.", f"{dst}mlp.experts.{e * local + j}.", e)
                    for e in range(ep)
                    for j in range(local)
                ]
            for mg, hf, e in mlps:
                fc1 = [
                    flat[(e * pp + p) * tp + t][mg + "linear_fc1.weight"].chunk(2, dim=0) for t in range(tp)
                ]
                suffix = "_proj.weight"
                out[hf + "gate" + suffix] = torch.cat([g for g, _ in fc1])
                out[hf + "up" + suffix] = torch.cat([u for _, u in fc1])
                out[hf + "down" + suffix] = cat(p, mg + "linear_fc2.weight", 1, e)
    out["model.norm.weight"] = flat[(pp - 1) * tp]["decoder.final_layernorm.weight"].clone()
    if not spec.tied_embeddings:
        out["lm_head.weight"] = cat(pp - 1, "output_layer.weight", 0)[: spec.vocab]
    return out


# ---------------------------------------------------------------------------------------------- checkpoints
def sync_save_strategy() -> Any:
    """A Megatron ``SaveShardedStrategy`` writing the ``torch_dist`` format synchronously, without CUDA.

    Megatron-core 0.16.1's ``TorchDistSaveShardedStrategy`` stages tensors with
    ``torch.cuda.synchronize()`` and broadcasts its status through a CUDA tensor, so it fails on
    CPU. This strategy does what that one does before writing — Megatron's own
    ``_replace_state_dict_keys_with_sharded_keys`` (main replicas only) and
    ``mcore_to_pyt_state_dict`` — and writes with ``torch.distributed.checkpoint.save``, its
    ``FileSystemWriter`` and Megatron's ``MCoreSavePlanner``. ``dist_checkpointing.save`` around it
    writes ``common.pt`` and ``metadata.json`` (backend ``torch_dist``, version 1) as usual, so
    ``dist_checkpointing.load`` reads the result with its default strategy.
    """
    global _SYNC_STRATEGY
    if _SYNC_STRATEGY is None:
        base = _mcore("megatron.core.dist_checkpointing.strategies.base")
        mtorch = _mcore("megatron.core.dist_checkpointing.strategies.torch")
        import torch.distributed.checkpoint as dcp

        class _Sync(base.SaveShardedStrategy):
            def __init__(self) -> None:
                super().__init__("torch_dist", 1)

            @property
            def can_handle_sharded_objects(self) -> bool:
                return True

            def save(self, sharded_state_dict: Any, checkpoint_dir: str | Path) -> None:
                flat, _, _ = mtorch._replace_state_dict_keys_with_sharded_keys(
                    sharded_state_dict, keep_only_main_replica=True
                )
                pyt_state_dict = mtorch.mcore_to_pyt_state_dict(flat, False)
                dcp.save(
                    pyt_state_dict,
                    storage_writer=dcp.FileSystemWriter(str(checkpoint_dir), thread_count=1),
                    planner=mtorch.MCoreSavePlanner(dedup_replicated_tensors=False, flatten_state_dict=False),
                )

        _SYNC_STRATEGY = _Sync
    return _SYNC_STRATEGY()


_SYNC_STRATEGY: Any = None


def save_checkpoint(model: GPTModel, directory: str | Path) -> None:
    """Write ``model`` as a Megatron ``dist_checkpointing`` checkpoint (a collective: every rank calls it).

    ``dist_checkpointing.save(model.sharded_state_dict(), directory,
    sharded_strategy=sync_save_strategy())``. The checkpoint holds global tensors, whatever the
    layout that wrote it: a decoder-layer weight is one tensor stacked over all ``L`` layers on a
    leading axis (``decoder.layers.self_attention.linear_qkv.weight`` ``[L, (H + 2G)·hd, d]``; a
    stage writes the slab at its first global layer), a TP shard is a slice of the full tensor,
    and the norms are stored under the Transformer-Engine names
    (``decoder.layers.self_attention.linear_qkv.layer_norm_weight``,
    ``decoder.layers.mlp.linear_fc1.layer_norm_weight``), so any layout, and a model built with the
    Transformer-Engine layer spec, can load it. Data-parallel replicas write once (main replica).
    Megatron's own asynchronous strategy (the default of ``dist_checkpointing.save``) needs CUDA.
    """
    dc = _mcore("megatron.core.dist_checkpointing")
    Path(directory).mkdir(parents=True, exist_ok=True)
    dc.save(model.sharded_state_dict(), str(directory), sharded_strategy=sync_save_strategy())


def load_checkpoint(model: GPTModel, directory: str | Path) -> None:
    """Load a ``dist_checkpointing`` checkpoint into ``model`` (a collective), resharding to its layout.

    ``model.load_state_dict(dist_checkpointing.load(model.sharded_state_dict(), directory),
    strict=True)``: each rank reads the slices of the global tensors its TP rank and stage hold, so a
    checkpoint written with ``(Pp, Pt) = (1, 2)`` loads into ``(2, 1)``. The padded vocabulary must be
    the same in both layouts (:func:`padded_vocab_size`).

    Raises
    ------
    FileNotFoundError
        If ``directory`` has no ``metadata.json``.
    """
    if not (Path(directory) / "metadata.json").is_file():
        raise FileNotFoundError(f"load_checkpoint: {directory} is not a dist_checkpointing checkpoint")
    dc = _mcore("megatron.core.dist_checkpointing")
    state = dc.load(model.sharded_state_dict(), str(directory))
    model.load_state_dict(state, strict=True)


# ---------------------------------------------------------------------------------------------- training
def _nll_loss(token_logprobs: Tensor, batch: Mapping[str, Tensor]) -> Tensor:
    """``−Σ mask·log p / Σ mask`` over the microbatch (all tokens when ``batch`` has no ``loss_mask``)."""
    mask = batch.get("loss_mask")
    if mask is None:
        return -token_logprobs.float().mean()
    mask = mask.to(token_logprobs.device, torch.float32)
    return -(token_logprobs.float() * mask).sum() / mask.sum().clamp(min=1.0)


def train_step(
    model: Any,
    optimizer: Any,
    microbatches: Sequence[Mapping[str, Tensor]],
    *,
    seq_length: int,
    micro_batch_size: int,
    loss_fn: Callable[[Tensor, Mapping[str, Tensor]], Tensor] | None = None,
) -> list[float]:
    """One optimizer step of Megatron-core over a plan group's ``mb`` microbatches. It has run on
    one GPU only (an H200, ``dp = pp = tp = 1``, float32; docs/megatron.md); layouts over several
    GPUs have not run.

    ``get_forward_backward_func()`` picks the schedule from ``parallel_state`` (no pipelining for
    ``Pp = 1``, 1F1B otherwise) and runs ``num_microbatches = len(microbatches)`` forward and
    backward passes; each microbatch's forward is ``model(tokens, position_ids, None,
    labels=labels)``, which returns ``−log p(labels)`` per token ``[b, s]`` (Megatron's
    vocab-parallel cross entropy) on the last stage, and the loss is
    ``loss_fn(token_logprobs, microbatch)`` (default: mean negative log-likelihood over
    ``loss_mask``; a PPO loss takes the same log-probs). The schedule scales each microbatch's loss
    by ``1/mb``; then ``optimizer.step()``.

    Parameters
    ----------
    model
        This rank's GPTModel stage (or a list of virtual stages), wrapped in
        ``megatron.core.distributed.DistributedDataParallel`` when ``Pd > 1`` so that
        ``finalize_model_grads`` reduces gradients over the data-parallel group.
    optimizer
        A Megatron optimizer (``megatron.core.optimizer.get_megatron_optimizer``) or a torch one.
    microbatches
        ``mb`` dicts with ``tokens`` and ``labels`` ``[micro_batch_size, seq_length]`` (int64),
        optionally ``position_ids`` and ``loss_mask``; what ``loss_fn`` needs besides.
    seq_length, micro_batch_size
        Shape of the activations the pipeline stages exchange.
    loss_fn
        ``(token_logprobs [b, s], microbatch) -> scalar loss``.

    Returns
    -------
    list[float]
        Each microbatch's loss on the last pipeline stage (empty on the other stages).

    Raises
    ------
    RuntimeError
        Without CUDA, before anything touches it: Megatron-core's forward pass (attention buffer,
        RoPE frequencies), CUDA RNG tracker and pipeline schedules need a GPU. On CPU rpeg trains
        with its PyTorch engine.
    ValueError
        If ``microbatches`` is empty.
    """
    if not torch.cuda.is_available():
        raise RuntimeError(
            "Megatron-core training needs CUDA: its forward pass puts the attention buffer and RoPE "
            "frequencies on torch.cuda.current_device(), and the RNG tracker and pipeline schedules "
            "are CUDA-only; on CPU machines use rpeg's PyTorch engine"
        )
    if not microbatches:
        raise ValueError("train_step: microbatches is empty (a plan group runs mb >= 1 per step)")
    schedules = _mcore("megatron.core.pipeline_parallel")
    utils = _mcore("megatron.core.utils")
    chunks = list(model) if isinstance(model, list | tuple) else [model]
    config = utils.get_model_config(chunks[0])
    if config.finalize_model_grads_func is None and all(hasattr(m, "finish_grad_sync") for m in chunks):
        config.finalize_model_grads_func = _mcore("megatron.core.distributed").finalize_model_grads
    loss_of = loss_fn or _nll_loss
    device = torch.device("cuda", torch.cuda.current_device())

    def forward_step(data: Iterable[Mapping[str, Tensor]], stage: Any) -> tuple[Tensor, Callable]:
        batch = next(data)  # type: ignore[call-overload]
        tokens = batch["tokens"].to(device, non_blocking=True)
        positions = batch.get("position_ids")
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=device).expand_as(tokens)
        labels = batch["labels"].to(device, non_blocking=True)
        output = stage(tokens, positions.to(device), None, labels=labels)

        def loss(out: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            value = loss_of(-out, batch)
            return value, {"loss": value.detach()}

        return output, loss

    for m in chunks:
        if hasattr(m, "zero_grad_buffer"):
            m.zero_grad_buffer()
    optimizer.zero_grad()
    results = schedules.get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(microbatches),
        model=chunks if len(chunks) > 1 else chunks[0],
        num_microbatches=len(microbatches),
        seq_length=seq_length,
        micro_batch_size=micro_batch_size,
        forward_only=False,
    )
    optimizer.step()
    return [float(r["loss"]) for r in results]

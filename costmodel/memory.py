"""Per-device memory of one model invocation (SPEC §6, paper Appendix D-H to D-J).

Parameter counts are in scalars, everything else in bytes. ``sb`` is
:attr:`ModelSpec.dtype_bytes`; ``b = n/(Pd·mb)`` is the per-device microbatch for ``n`` sequences.

* :func:`weight_shard_params` — ``W_shard``, the worst pipeline stage's parameters per GPU;
* :func:`training_state_bytes` — persistent FP32 master + Adam moments, ZeRO-2 sharded;
* :func:`weight_bytes` — one BF16 copy of the shard (serving copy, frozen model, shadow copy);
* :func:`transient_bytes` — the peak an invocation allocates while it runs (activations,
  KV cache, materialised weights and gradients); training activations follow the strategy's
  recomputation mode (:func:`training_activation_bytes`);
* the engines' choices of SPEC §14: the ZeRO stage of a trainer's or a frozen model's state
  (:func:`zero_state_bytes`), the logits of a microbatch with or without a chunked loss
  (:func:`logits_bytes`), fused attention (no ``ℓ²`` buffer in any recomputation mode) and the
  rollout engine's memory fraction (:func:`generation_engine_bytes`, :func:`kv_budget_tokens`).

The caller combines them into ``peak(d) = Σ_m S(m, d) + max_v A(v)`` (SPEC §6).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ..ir.hardware import Hardware
from ..ir.models import OPTIMIZER_BYTES_PER_PARAM, ModelSpec
from ..ir.types import Head, Recompute, Role
from .layout import Layout

__all__ = [
    "LOGIT_BYTES",
    "OPTIMIZER_BYTES_PER_PARAM",
    "ZeroState",
    "engine_workspace_bytes",
    "generation_engine_bytes",
    "head_params",
    "inference_activation_bytes",
    "kv_budget_tokens",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "kv_scalars_per_device",
    "kv_width_per_device",
    "layout_shard",
    "logits_bytes",
    "memory_fraction",
    "model_params",
    "pipeline_alive",
    "quantized_saved_widths",
    "served_weight_bytes",
    "stored_activation_width",
    "training_activation_bytes",
    "training_state_bytes",
    "transient_bytes",
    "weight_bytes",
    "weight_shard_params",
    "zero_shard_params",
    "zero_state_bytes",
]

#: Bytes per logit: losses and log-probs are computed in FP32 (SPEC §14.6).
LOGIT_BYTES = 4


def model_params(model: ModelSpec, head: Head = Head.LM) -> int:
    """Total parameters ``N_m`` of the model carrying ``head``.

    ``N = L·(W_layer + 2d) + V·d + d + H`` with ``H = V·d`` for an untied LM head (``0`` when
    tied), ``d`` for a scalar head and their sum for both heads; for ``Head.LM`` this is
    :attr:`ModelSpec.params`. A critic or reward model built from an LM checkpoint drops the LM
    head and gains a value head.

    Parameters
    ----------
    model
        The model.
    head
        Output head(s).

    Returns
    -------
    int
        ``N_m``.
    """
    d = model.hidden
    lm = 0 if model.tied_embeddings else model.vocab * d
    base = model.params - lm
    if head is Head.LM:
        return base + lm
    if head is Head.SCALAR:
        return base + d
    if head is Head.BOTH:
        return base + lm + d
    raise ValueError(f"head must be a Head, got {head!r}")


def head_params(model: ModelSpec, head: Head) -> int:
    """Weights of the output head on the last stage: ``H = V·d`` (LM), ``d`` (scalar), or
    ``V·d + d`` (both).

    Raises
    ------
    ValueError
        If ``head`` is not a :class:`~rpeg.ir.types.Head`.
    """
    d = model.hidden
    if head is Head.LM:
        return model.vocab * d
    if head is Head.SCALAR:
        return d
    if head is Head.BOTH:
        return model.vocab * d + d
    raise ValueError(f"head must be a Head, got {head!r}")


def _check_degree(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def weight_shard_params(
    model: ModelSpec, pp: int, tp: int, head: Head = Head.LM, ep: int = 1, etp: int | None = None
) -> float:
    """Worst-stage parameter shard per GPU, ``W_shard`` (SPEC §6, paper Appendix D-H; §15.2).

    ``W_shard = max_p [ (L/Pp)·(W_block/Pt + W_exp/(Pet·Pe)) + [p = 1]·V·d + [p = Pp]·H ]`` with
    ``W_exp`` a block's routed experts (:attr:`~rpeg.ir.models.ModelSpec.expert_weights`, 0 for
    a dense model), ``W_block`` the rest of its weights and ``H = V·d`` (LM), ``d`` (scalar) or
    ``V·d + d`` (both). Block weights are split over the ``Pt`` TP ranks, routed experts over
    their ``Pet`` tensor-parallel ranks (``Pt`` by default) and the ``Pe`` expert-parallel ranks; the embedding and the heads are replicated on every
    TP rank. Norm weights (``2d`` per block) are left out, as in SPEC. With tied embeddings and
    ``Pp = 1`` the LM head *is* the input embedding and is stored once.

    Parameters
    ----------
    model
        The model.
    pp, tp
        Pipeline and tensor parallel degrees ``Pp``, ``Pt``.
    head
        Output head(s).
    ep
        Expert-parallel degree ``Pe``.
    etp
        The routed experts' tensor-parallel degree ``Pet`` (``None``: ``Pt``; ``1``: each
        expert whole on one rank, :attr:`Strategy.etp <rpeg.ir.plan.Strategy.etp>`).

    Returns
    -------
    float
        Parameters on the most loaded GPU.
    """
    _check_degree("pp", pp)
    _check_degree("tp", tp)
    _check_degree("ep", ep)
    if etp is not None:
        _check_degree("etp", etp)
    return _shard_params(model, pp, tp, Head(head), ep, None if etp == tp else etp)


def _block_params(model: ModelSpec, tp: int, ep: int, etp: int | None = None) -> float:
    """One block's parameters on one device, ``W_block/Pt + W_exp/(Pet·Pe)`` (averaged;
    ``Pet = Pt`` when ``etp`` is ``None``)."""
    experts = model.expert_weights
    return (model.layer_weights - experts) / tp + experts / ((tp if etp is None else etp) * ep)


@functools.lru_cache(maxsize=4096)
def _shard_params(
    model: ModelSpec, pp: int, tp: int, head: Head, ep: int = 1, etp: int | None = None
) -> float:
    """:func:`weight_shard_params` after its checks (memoised: a directory asks for each
    ``(model, Pp, Pt, head, Pe, Pet)`` thousands of times)."""
    layers = model.layers / pp * _block_params(model, tp, ep, etp)
    embedding = model.embedding_params
    head_w = head_params(model, head)
    if pp == 1:
        if model.tied_embeddings and head is not Head.SCALAR:
            head_w -= model.vocab * model.hidden  # the LM head shares the embedding
        return layers + embedding + head_w
    return layers + max(embedding, head_w)


def layout_shard(model: ModelSpec, layout: Layout, head: Head = Head.LM) -> float:
    """``W_shard`` of a layout's degrees (:func:`weight_shard_params` with its ``Pp, Pt, Pe, Pet``)."""
    s = layout.strategy
    return _shard_params(model, s.pp, s.tp, Head(head), s.ep, s.etp)


def zero_shard_params(model: ModelSpec, layout: Layout, head: Head = Head.LM) -> float:
    """Parameters whose state one device owns under ZeRO (SPEC §14.3, §15.2):
    ``(W_shard − X)/(Pd·Pc) + X/(Pt·Pd·Pc/(Pet·Pe))`` with ``X = (L/Pp)·W_exp/(Pet·Pe)`` the
    device's routed-expert share. The rest of the shard is replicated over the ``Pd·Pc`` data-
    and context-parallel ranks (Megatron's distributed optimizer shards over both), an expert's
    shard over the ``Pt·Pd·Pc/(Pet·Pe)`` ranks that hold it (``Pd·Pc/Pe`` with the default
    ``Pet = Pt``; Megatron's expert data-parallel group); ``W_shard/Pd`` for a dense model
    without context parallelism."""
    s = layout.strategy
    shard = layout_shard(model, layout, head)
    experts = model.layers / s.pp * model.expert_weights / (s.expert_tp * s.ep)
    group = s.dp * s.cp
    return (shard - experts) / group + experts * s.expert_tp * s.ep / (s.tp * group)


def training_state_bytes(model: ModelSpec, layout: Layout, head: Head = Head.LM) -> float:
    """Persistent optimizer state of a training device: ``12·N_z`` bytes (SPEC §6), ``N_z`` =
    :func:`zero_shard_params` (``W_shard/Pd`` for a dense model without context parallelism).

    FP32 master weights and two FP32 Adam moments (12 bytes per parameter), ZeRO-2 sharded over
    the data-parallel ranks (and the context-parallel ones).

    Parameters
    ----------
    model
        The trained model.
    layout
        Its training layout.
    head
        Output head(s).

    Returns
    -------
    float
        Bytes per device.
    """
    return OPTIMIZER_BYTES_PER_PARAM * zero_shard_params(model, layout, head)


def weight_bytes(model: ModelSpec, layout: Layout, head: Head = Head.LM) -> float:
    """One BF16 copy of the worst-stage shard: ``W_shard·sb`` bytes (SPEC §6).

    Used for a serving copy, a frozen model's weights or a shadow copy.

    Parameters
    ----------
    model
        The model.
    layout
        The layout the copy is sharded by.
    head
        Output head(s).

    Returns
    -------
    float
        Bytes per device.
    """
    return layout_shard(model, layout, head) * model.dtype_bytes


def kv_width_per_device(model: ModelSpec, tp: int) -> int:
    """Width of one of K or V held per TP rank: ``⌈kv_heads/Pt⌉·head_dim``.

    Equal to ``d_kv/Pt`` when the KV heads split evenly; when ``kv_heads < Pt`` each rank keeps
    (a replica of) one whole KV head, ``head_dim`` (grouped-query attention, paper Appendix D-I).

    Parameters
    ----------
    model
        The model.
    tp
        Tensor-parallel degree ``Pt``.

    Returns
    -------
    int
        Scalars per token, per layer, for K (and as many for V).
    """
    _check_degree("tp", tp)
    return math.ceil(model.kv_heads / tp) * model.head_dim


def kv_scalars_per_device(model: ModelSpec, tp: int) -> float:
    """Scalars one token caches per block on one TP rank: ``2·d_kv,local`` (K and V,
    :func:`kv_width_per_device`); with multi-head latent attention ``r_kv + rope`` — the latent and
    the shared rotary key, which every TP rank holds whole (vLLM's MLA backends shard heads, not
    the latent; SPEC §15.1).

    Parameters
    ----------
    model
        The model.
    tp
        Tensor-parallel degree ``Pt``.

    Returns
    -------
    float
        Scalars per token and block.
    """
    _check_degree("tp", tp)
    if model.is_mla:
        return float(model.kv_cache_width)
    return 2.0 * kv_width_per_device(model, tp)


def served_weight_bytes(model: ModelSpec, layout: Layout, head: Head = Head.LM) -> float:
    """A generation engine's resident weights per device: :func:`weight_bytes`, except that under
    ``precision = "fp8"`` vLLM (``quantization="fp8"``) stores the blocks' weights in FP8:
    ``W_shard·sb − (sb − 1)·(L/Pp)·N_ℓ`` with ``N_ℓ = W_block/Pt + W_exp/(Pt·Pe)`` one block's
    parameters on the device; the embedding and the LM head stay BF16 (vLLM quantizes every
    ``Linear`` module but ``lm_head``; ``docs/cost-model.md`` §11). ``precision = "nvfp4"``
    (vLLM's ModelOpt NVFP4 checkpoints) stores them at ``q = 0.5625`` bytes:
    ``W_shard·sb − (sb − q)·(L/Pp)·N_ℓ``. ``precision = "mxfp4"`` (vLLM's ``Mxfp4Config``, which
    quantizes only the MoE layers) stores the routed experts alone at ``q_e = 0.53125`` bytes
    (:data:`~rpeg.ir.models.MXFP4_BYTES`): ``W_shard·sb − (sb − q_e)·(L/Pp)·W_exp/(Pet·Pe)``.

    Parameters
    ----------
    model, layout, head
        The generated model, its layout and output head(s).

    Returns
    -------
    float
        Bytes per device.
    """
    full = weight_bytes(model, layout, head)
    s = layout.strategy
    if model.has_mxfp4_experts:
        experts = model.layers / s.pp * model.expert_weights / (s.expert_tp * s.ep)
        return full - (model.dtype_bytes - model.served_expert_bytes) * experts
    if not model.is_low_precision:
        return full
    blocks = model.layers / s.pp * _block_params(model, s.tp, s.ep, s.etp)
    return full - (model.dtype_bytes - model.gemm_bytes) * blocks


def _layer_buffer_width(model: ModelSpec, tp: int, sp: bool = False) -> float:
    """Per-token scalars of one block's largest intermediate: ``max(2d + 6d/Pt, 2d + 2dff/Pt)``
    (a MoE block: ``dff`` is the token's width in its experts, :attr:`~rpeg.ir.models.ModelSpec.ffn_width`);
    with sequence parallelism the replicated ``2d`` is split too, ``2d/Pt``."""
    d = model.hidden
    replicated = 2.0 * d / tp if sp else 2.0 * d
    return max(replicated + 6.0 * d / tp, replicated + 2.0 * model.ffn_width / tp)


def stored_activation_width(model: ModelSpec, tp: int, sp: bool = False) -> float:
    """Scalars one layer keeps per token for its backward, attention scores aside:
    ``a = 4d + (2·d_q + 2·d_kv)/Pt + 2·(n_ffn − 1)·dff/Pt`` (``docs/cost-model.md`` §4).

    Replicated over the TP ranks (no sequence parallelism): the inputs of the two norms and their
    outputs, which feed the QKV and the up/gate GEMMs (``4d``). Sharded: ``Q``, ``K``, ``V`` and
    the attention output that feeds the O projection (``(2·d_q + 2·d_kv)/Pt``), and the FFN
    intermediates (``4·dff/Pt`` gated — gate, up, ``SiLU(gate)`` and the product fed to the down
    projection; ``2·dff/Pt`` ungated — the activation's input and output). For a GPT block
    (``d_q = d_kv = d``, ``dff = 4d``, 2 bytes) this is Korthikanti et al. (2022)'s
    ``sbh(10 + 24/t)`` without its two 1-byte dropout masks (RL post-training runs without dropout).

    Mixture of experts (SPEC §15.1): ``dff`` is the token's width in its ``k`` routed and ``S``
    shared experts (:attr:`~rpeg.ir.models.ModelSpec.ffn_width`), and a MoE block also keeps the
    ``k`` dispatched copies of the token, ``k·d``, which the expert GEMMs' backward reads
    (:attr:`~rpeg.ir.models.ModelSpec.routed_width`, replicated over the TP ranks; averaged over
    the blocks with the dense ones):
    ``a = 4d + routed + (2·d_q + 2·d_kv + 2·(n_ffn − 1)·ffn_width)/Pt``.

    Sequence parallelism (Megatron SP, SPEC §15.3) splits the replicated part by sequence over
    the TP ranks: ``a = (4d + routed)/Pt + (…)/Pt`` (Korthikanti et al.'s ``sbh·34/t`` without
    its two dropout masks).

    Parameters
    ----------
    model
        The model.
    tp
        Tensor-parallel degree ``Pt``.
    sp
        Sequence parallelism.

    Returns
    -------
    float
        Scalars per token and layer.
    """
    _check_degree("tp", tp)
    d = model.hidden
    sharded = model.attention_activation_width + 2.0 * (model.ffn_projections - 1) * model.ffn_width
    replicated = 4.0 * d + model.routed_width
    return (replicated / tp if sp else replicated) + sharded / tp


def quantized_saved_widths(model: ModelSpec, tp: int, sp: bool = False) -> tuple[float, float]:
    """``(a_8, a_+)``: scalars per token and layer that a layer keeps quantized instead of BF16
    under ``precision = "fp8"`` or ``"nvfp4"``, and the quantized copies it keeps in addition
    (``docs/cost-model.md`` §11).

    Transformer Engine saves each FP8 GEMM's quantized input for the weight-gradient GEMM. Where
    no other operation keeps the BF16 tensor, that replaces it: the two norms' outputs
    (``LayerNormLinear`` emits them in FP8), a MoE block's dispatched copies and the FFN's
    down-projection input, ``a_8 = 2d + routed + ffn_width/Pt`` (the replicated ``2d + routed``
    over ``Pt`` too under sequence parallelism). The attention output is also kept in BF16 by the
    attention core (its backward reads it), so the output projection's FP8 copy is an addition:
    ``a_+ = d_o/Pt``, ``d_o = heads·head_dim`` (latent attention: ``heads·v_head_dim``).

    Parameters
    ----------
    model
        The model.
    tp
        Tensor-parallel degree ``Pt``.
    sp
        Sequence parallelism.

    Returns
    -------
    tuple of float
        ``(a_8, a_+)``, scalars per token and layer.
    """
    _check_degree("tp", tp)
    replicated = 2.0 * model.hidden + model.routed_width
    out_width = model.heads * model.v_head_dim if model.is_mla else model.q_width
    return (replicated / tp if sp else replicated) + model.ffn_width / tp, out_width / tp


def pipeline_alive(mb: int, pp: int, vp: int = 1) -> float:
    """Microbatches whose activations the first pipeline stage holds at once, in units of a
    whole stage's ``L/Pp`` layers.

    Plain 1F1B (``Pv = 1``): ``min(mb, Pp)``, the warm-up forwards plus the one in flight.
    Megatron-core's interleaved schedule (``Pv > 1`` chunks of ``L/(Pp·Pv)`` layers) warms the
    first rank up with ``2(Pp − 1) + (Pv − 1)·Pp`` chunk forwards (all ``Pv·mb`` when
    ``mb = Pp``; ``schedules.py``, ``get_pp_rank_microbatches``), so
    ``min(Pv·mb, (Pv + 1)·Pp − 1)/Pv = min(mb, Pp + (Pp − 1)/Pv)`` — once
    ``mb ≥ Pp + (Pp − 1)/Pv``, ``Pp·(1 + (Pp − 1)/(Pp·Pv))``, the factor Korthikanti et al. (2022,
    "Reducing activation recomputation") give for the interleaved schedule.

    Parameters
    ----------
    mb, pp, vp
        Microbatches, pipeline stages and chunks per stage.

    Returns
    -------
    float
        Stage-equivalents of activations alive.
    """
    if vp == 1:
        return float(min(mb, pp))
    return min(vp * mb, (vp + 1) * pp - 1) / vp


def training_activation_bytes(model: ModelSpec, layout: Layout, *, sequences: float, tokens: float) -> float:
    """Training activations under the strategy's recomputation mode (SPEC §6, §14.7, paper
    Appendix D-I; Korthikanti et al. 2022), with ``b = n/(Pd·mb)``, ``ℓ = tokens`` (the mean
    length of packed sequences), ``T_mb = b·ℓ`` tokens per microbatch and ``min(mb, Pp)``
    microbatches alive during 1F1B warm-up (:func:`pipeline_alive`: with ``Pv > 1`` chunks per
    stage, Megatron's interleaved warm-up):

    * ``full`` (SPEC's formula): ``sb·min(mb, Pp)·T_mb·((L/Pp)/c·d + c·max(2d + 6d/Pt,
      2d + 2dff/Pt))`` with checkpoint interval ``c = max(1, ⌊√(L/Pp)⌋)`` — one checkpoint of
      width ``d`` every ``c`` layers plus a recomputation buffer of ``c`` layers;
    * ``none`` and ``selective``: ``sb·min(mb, Pp)·T_mb·(L/Pp)·a`` — every layer keeps its
      activations, ``a`` = :func:`stored_activation_width`.

    Attention is fused (FlashAttention, SDPA; SPEC §14.7): no mode keeps or recomputes into an
    ``ℓ²`` buffer, so ``selective`` (recompute the attention core) keeps what ``none`` keeps
    (the core's inputs, ``Q, K, V``, are part of ``a``) and differs only in time.

    SPEC §15.3: context parallelism splits each microbatch's tokens over ``Pc`` ranks,
    ``T_mb/Pc`` per device; sequence parallelism splits the replicated widths (the checkpoint's
    ``d``, the buffer's ``2d``, :func:`stored_activation_width`'s ``4d + routed``) over ``Pt``.

    ``precision = "fp8"`` or ``"nvfp4"`` (``none``, ``selective``):
    ``min(mb, Pp)·T_mb·(L/Pp)·(sb·a − (sb − q)·a_8 + q·a_+)`` with :func:`quantized_saved_widths`
    and ``q`` the quantized element's bytes (1, 0.5625); ``full`` keeps its BF16 checkpoints and
    buffer.

    Parameters
    ----------
    model
        The model.
    layout
        Its layout (the strategy carries the recomputation mode).
    sequences
        ``n``, sequences trained on.
    tokens
        ``ℓ = Lp + Lr``.

    Returns
    -------
    float
        Bytes per device.
    """
    s = layout.strategy
    layers = model.layers / s.pp
    b = sequences / (s.dp * s.mb * s.cp)  # a microbatch's sequences' share on one CP rank
    alive = pipeline_alive(s.mb, s.pp, s.vp)
    mode = s.recompute
    if mode is Recompute.FULL:
        c = max(1, math.isqrt(int(layers)))
        checkpoint = model.hidden / s.tp if s.sp else model.hidden
        per_token = layers / c * checkpoint + c * _layer_buffer_width(model, s.tp, s.sp)
        return model.dtype_bytes * alive * b * tokens * per_token
    stored = layers * tokens * stored_activation_width(model, s.tp, s.sp)
    if model.is_low_precision:
        a8, extra = quantized_saved_widths(model, s.tp, s.sp)
        sb, q = model.dtype_bytes, model.gemm_bytes
        return alive * b * (sb * stored - layers * tokens * ((sb - q) * a8 - q * extra))
    return model.dtype_bytes * alive * b * stored


def inference_activation_bytes(
    model: ModelSpec, layout: Layout, *, sequences: float, tokens: float, head: Head = Head.LM
) -> float:
    """Forward-only activations (SPEC §6): ``sb·b·ℓ·max(2d + 6d/Pt, 2d + 2dff/Pt, d + h)``.

    ``h = V`` for an LM head (or both heads), ``1`` for a scalar head; ``b = n/(Pd·mb)``.
    (SPEC §6's form; a scoring pass of SPEC §14 uses :func:`transient_bytes`, which charges
    the logits in FP32 separately, :func:`logits_bytes`.)

    Parameters
    ----------
    model
        The model.
    layout
        Its layout.
    sequences
        ``n``, sequences.
    tokens
        ``ℓ`` (``Lp + Lr`` for inference, ``Lp`` for generation prefill).
    head
        Output head(s).

    Returns
    -------
    float
        Bytes per device.
    """
    d = model.hidden
    head_width = d + (1 if head is Head.SCALAR else model.vocab)
    s = layout.strategy
    width = max(_layer_buffer_width(model, s.tp, s.sp), float(head_width))
    b = sequences / (s.dp * s.mb * s.cp)
    return model.dtype_bytes * b * tokens * width


def kv_cache_bytes(
    model: ModelSpec, layout: Layout, *, sequences: float, prompt_len: int, response_len: int
) -> float:
    """Generation KV cache at full length: ``sb·(n/Pd)·(Lp + Lr)·(L/Pp)·c_local`` (SPEC §6).

    ``c_local`` is :func:`kv_scalars_per_device`: ``2·d_kv,local`` (``d_kv/Pt``, at least one
    head, :func:`kv_width_per_device`), or with latent attention ``r_kv + rope``; all ``n/Pd``
    local sequences are cached, not a microbatch. A sliding-window block caches
    ``min(Lp + Lr, W)`` tokens of each sequence: ``Lp + Lr`` is the blocks' average
    ``((L − L_s)·(Lp + Lr) + L_s·min(Lp + Lr, W))/L``
    (:meth:`~rpeg.ir.models.ModelSpec.attended`; SPEC §15.1).

    Parameters
    ----------
    model
        The model.
    layout
        Its layout.
    sequences
        ``n``, sequences generated.
    prompt_len, response_len
        ``Lp`` and ``Lr``.

    Returns
    -------
    float
        Bytes per device.
    """
    s = layout.strategy
    held = model.attended(prompt_len + response_len)
    per_seq = held * model.layers / s.pp * kv_scalars_per_device(model, s.tp)
    return model.dtype_bytes * sequences / s.dp * per_seq


#: Rollout-engine settings that size its workspace and bound its running batch (SPEC §14.5):
#: tokens per scheduler step (vLLM ``max_num_batched_tokens``) and sequences per step
#: (``max_num_seqs``), verl's rollout defaults (``verl/trainer/config/rollout/rollout.yaml``:
#: ``max_num_batched_tokens: 8192``, ``max_num_seqs: 1024``).
ROLLOUT_BATCH_TOKENS = 8192
ROLLOUT_MAX_SEQS = 1024


@dataclass(frozen=True, slots=True)
class ZeroState:
    """A model's state on one device under a ZeRO stage (SPEC §14.3), split as the memory
    model adds it up: ``persistent`` stays between invocations (FP32 master weights and Adam
    moments of a trainer; a forward-only invocation's resident BF16 weights), ``transient``
    exists while the invocation runs (a trainer's BF16 weights and gradients, gathered layers).
    """

    persistent: float
    transient: float


def _gathered_params(model: ModelSpec, layout: Layout, head: Head) -> float:
    """Parameters a ZeRO-3 rank holds gathered at once: two decoder layers ``2·N_ℓ`` (the one
    computing and the one prefetched; ``N_ℓ = W_block/Pt + W_exp/(Pet·Pe)`` per device) plus the
    root unit, the stage's embedding and head (``W_shard − (L/Pp)·N_ℓ``), which FSDP2 keeps
    gathered through the pass."""
    s = layout.strategy
    block = _block_params(model, s.tp, s.ep, s.etp)
    root = layout_shard(model, layout, head) - model.layers / s.pp * block
    return 2.0 * block + root


def zero_state_bytes(model: ModelSpec, role: Role, layout: Layout, head: Head = Head.LM) -> ZeroState:
    """Model state per device under the strategy's ZeRO stage ``z`` (SPEC §14.3), with
    ``N_s = W_shard`` (:func:`weight_shard_params`), ``N_g`` the gathered parameters of
    ``z = 3`` (two layers ``2·N_ℓ/Pt`` and the stage's embedding and head):

    * training, ``z = 1`` (distributed optimizer): persistent ``12·N_s/Pd``, transient
      ``sb·N_s`` weights + ``sb·N_s`` gradients;
    * training, ``z = 2``: persistent ``12·N_s/Pd``, transient ``sb·N_s + sb·N_s/Pd``
      (SPEC §6);
    * training, ``z = 3`` (FSDP2): persistent ``12·N_s/Pd``, transient ``2·sb·N_s/Pd`` (the
      weight and gradient shards) ``+ sb·N_g``;
    * inference and generation, ``z = 2``: persistent ``sb·N_s`` (a full copy per data-parallel
      rank), nothing transient;
    * inference, ``z = 3``: persistent ``sb·N_s/Pd``, transient ``sb·N_g``;
    * generation with ``precision = "fp8"``: persistent :func:`served_weight_bytes` (the
      blocks' weights in FP8; NVFP4 likewise, the routed experts in MXFP4 under ``"mxfp4"``),
      nothing transient.

    With context or expert parallelism (SPEC §15) every ``N_s/Pd`` above is the owned share
    :func:`zero_shard_params` (sharded over ``Pd·Pc``, an expert over ``Pd·Pc/Pe``) and
    ``W_shard`` counts the routed experts ``/Pe``.

    Parameters
    ----------
    model, role, layout, head
        The invocation (its strategy carries ``z``).

    Returns
    -------
    ZeroState
        Bytes per device.
    """
    s = layout.strategy
    sb = model.dtype_bytes
    shard = layout_shard(model, layout, head)
    owned = zero_shard_params(model, layout, head)
    gathered = _gathered_params(model, layout, head) if s.zero == 3 else 0.0
    if Role(role) is Role.TRAINING:
        state = training_state_bytes(model, layout, head)
        if s.zero == 1:
            return ZeroState(state, 2.0 * sb * shard)
        if s.zero == 2:
            return ZeroState(state, sb * shard + sb * owned)
        return ZeroState(state, 2.0 * sb * owned + sb * gathered)
    if s.zero == 3:
        return ZeroState(sb * owned, sb * gathered)
    if model.precision != "bf16" and Role(role) is Role.GENERATION:  # vLLM stores them quantized
        return ZeroState(served_weight_bytes(model, layout, head), 0.0)
    return ZeroState(sb * shard, 0.0)


def logits_bytes(
    model: ModelSpec, role: Role, layout: Layout, *, tokens: float, head: Head = Head.LM
) -> float:
    """FP32 logits of one microbatch on the last stage (SPEC §14.6): ``4·T·V/Pt`` with
    ``T = min(c, T_mb)`` for a chunked loss of ``c`` tokens (``logits_chunk``), else the
    microbatch's ``T_mb = b·ℓ`` tokens; training holds as much again for their gradient. A
    scalar head's one value per token is negligible (0); generation's logits are part of the
    engine's workspace (:func:`engine_workspace_bytes`).

    Parameters
    ----------
    model, role, layout
        The invocation.
    tokens
        ``T_mb``, tokens of one microbatch on one data-parallel rank.
    head
        Output head(s).

    Returns
    -------
    float
        Bytes per device.
    """
    role = Role(role)
    if head is Head.SCALAR or role is Role.GENERATION:
        return 0.0
    s = layout.strategy
    held = min(float(s.logits_chunk), tokens) if s.logits_chunk else tokens
    copies = 2.0 if role is Role.TRAINING else 1.0
    return copies * LOGIT_BYTES * held * model.vocab / s.tp


def kv_bytes_per_token(model: ModelSpec, layout: Layout) -> float:
    """``κ = sb·(L/Pp)·c_local``: KV-cache bytes one token takes on each device of a replica
    (SPEC §14.5), ``c_local`` = :func:`kv_scalars_per_device` (``2·d_kv,local``; latent attention:
    ``r_kv + rope``). A token of every block: with sliding-window blocks a sequence at context
    ``c`` holds :meth:`~rpeg.ir.models.ModelSpec.attended` ``(c)`` such tokens, not ``c``."""
    s = layout.strategy
    return model.dtype_bytes * model.layers / s.pp * kv_scalars_per_device(model, s.tp)


def memory_fraction(layout: Layout, hw: Hardware) -> float:
    """The rollout engine's memory fraction ``u``: the strategy's, or the hardware's default
    (:attr:`~rpeg.ir.hardware.Hardware.kv_memory_fraction`) when it names none."""
    return layout.strategy.mem_fraction or hw.kv_memory_fraction


def engine_workspace_bytes(model: ModelSpec, layout: Layout, head: Head = Head.LM) -> float:
    """The rollout engine's activation workspace per device: one scheduler step of
    ``T = ROLLOUT_BATCH_TOKENS`` tokens through the widest block buffer,
    ``sb·T·max(2d + 6d/Pt, 2d + 2dff/Pt)``, plus FP32 logits of the ``S = ROLLOUT_MAX_SEQS``
    positions it samples, ``4·S·V/Pt`` (vLLM profiles a dummy step of that size to size its
    cache)."""
    s = layout.strategy
    width = _layer_buffer_width(model, s.tp)
    logits = LOGIT_BYTES * ROLLOUT_MAX_SEQS * model.vocab / s.tp if head is not Head.SCALAR else 0.0
    return model.dtype_bytes * ROLLOUT_BATCH_TOKENS * width + logits


def kv_budget_tokens(model: ModelSpec, layout: Layout, hw: Hardware, head: Head = Head.LM) -> float:
    """Tokens the paged KV cache of one replica holds (SPEC §14.5):
    ``K/κ`` with ``K = u·M_GPU − W_shard·sb − workspace`` (:func:`memory_fraction`,
    :func:`served_weight_bytes`: FP8 blocks under ``precision = "fp8"``,
    :func:`engine_workspace_bytes`, :func:`kv_bytes_per_token`);
    may be 0 or negative when the fraction leaves no room. Tokens of every block: a sequence
    at context ``c`` takes :meth:`~rpeg.ir.models.ModelSpec.attended` ``(c)`` of them (``c``
    without sliding-window blocks)."""
    budget = (
        memory_fraction(layout, hw) * hw.gpu_memory_bytes
        - served_weight_bytes(model, layout, head)
        - engine_workspace_bytes(model, layout, head)
    )
    return budget / kv_bytes_per_token(model, layout)


def generation_engine_bytes(
    model: ModelSpec,
    layout: Layout,
    hw: Hardware,
    *,
    prompt_len: int,
    response_len: int,
    head: Head = Head.LM,
) -> float:
    """What a rollout engine holds per device (SPEC §14.5): ``u·M_GPU`` (weights, workspace and
    the paged KV cache), or, when that leaves the cache less than one sequence at full length,
    the least it can run with, ``W_shard·sb + workspace + κ·(Lp + Lr)`` (``W_shard·sb`` the
    :func:`served_weight_bytes`, FP8 blocks under ``precision = "fp8"``; the engine would
    refuse to start with less; the candidate directories drop such a fraction). With
    sliding-window blocks the sequence holds ``κ``·:meth:`~rpeg.ir.models.ModelSpec.attended`
    ``(Lp + Lr)``: a windowed block caches at most ``W`` of its tokens (SPEC §15.1).

    Parameters
    ----------
    model, layout, hw
        The generation's model, layout (its memory fraction) and hardware (``M_GPU``).
    prompt_len, response_len
        ``Lp`` and ``Lr``.
    head
        Output head(s).

    Returns
    -------
    float
        Bytes per device, weights included.
    """
    least = (
        served_weight_bytes(model, layout, head)
        + engine_workspace_bytes(model, layout, head)
        + kv_bytes_per_token(model, layout) * model.attended(prompt_len + response_len)
    )
    return max(memory_fraction(layout, hw) * hw.gpu_memory_bytes, least)


def transient_bytes(
    model: ModelSpec,
    role: Role,
    layout: Layout,
    *,
    sequences: float,
    prompt_len: int,
    response_len: int,
    head: Head = Head.LM,
    include_weights: bool = False,
    tokens: float | None = None,
    hardware: Hardware | None = None,
) -> float:
    """Peak transient memory ``A(v)`` of one invocation on one device (SPEC §6, §14).

    With ``ℓ = tokens`` (the mean length of packed sequences, SPEC §14.1; ``Lp + Lr`` when
    ``None``: padded) and ``T_mb = b·ℓ/Pc``, ``b = n/(Pd·mb)`` (a microbatch's tokens on one
    context-parallel rank, SPEC §15.3):

    * training: :func:`training_activation_bytes` + :func:`logits_bytes` (and their gradient)
      + the ZeRO stage's transient state (:func:`zero_state_bytes`: BF16 weights and gradients,
      or shards and gathered layers) — weights are always materialised, so
      ``include_weights`` does not apply;
    * inference: ``sb·T_mb·max(2d + 6d/Pt, 2d + 2dff/Pt)`` (the widest block buffer) +
      :func:`logits_bytes` + the ZeRO-3 gathered layers;
    * generation, with ``hardware``: the rollout engine's paged memory
      (:func:`generation_engine_bytes`) less its weights ``W_shard·sb``; without it, SPEC §6's
      :func:`inference_activation_bytes` at ``ℓ = Lp`` + :func:`kv_cache_bytes` (every
      sequence cached at full length, as the CPU runtime's engine sizes it).

    For inference and generation ``include_weights`` adds the serving copy of
    :func:`zero_state_bytes` (set it when the device holds no persistent copy of the model).

    Parameters
    ----------
    model
        The model.
    role
        The invocation's role.
    layout
        Its layout.
    sequences
        ``n``, sequences processed (``B·R`` or a fraction).
    prompt_len, response_len
        ``Lp`` and ``Lr``.
    head
        Output head(s).
    include_weights
        Add a transient BF16 weight copy (inference and generation only).
    tokens
        ``E[ℓ]`` of packed sequences; ``None`` pads each to ``Lp + Lr``.
    hardware
        The hardware (``M_GPU``): a generation is then the paged rollout engine of SPEC §14.5.

    Returns
    -------
    float
        Bytes per device.

    Raises
    ------
    ValueError
        For negative ``sequences`` or lengths.
    """
    if not sequences >= 0:
        raise ValueError(f"sequences must be non-negative, got {sequences!r}")
    if prompt_len < 0 or response_len < 0:
        raise ValueError(
            f"prompt_len and response_len must be non-negative, got {prompt_len!r}, {response_len!r}"
        )
    role = Role(role)
    ell = float(prompt_len + response_len) if tokens is None else tokens
    s = layout.strategy
    t_mb = sequences / (s.dp * s.mb * s.cp) * ell  # a microbatch's tokens on one CP rank
    state = zero_state_bytes(model, role, layout, head)
    if role is Role.TRAINING:
        activations = training_activation_bytes(model, layout, sequences=sequences, tokens=ell)
        return activations + logits_bytes(model, role, layout, tokens=t_mb, head=head) + state.transient
    if role is Role.INFERENCE:
        total = model.dtype_bytes * t_mb * _layer_buffer_width(model, s.tp, s.sp)
        total += logits_bytes(model, role, layout, tokens=t_mb, head=head) + state.transient
    elif hardware is not None:
        engine = generation_engine_bytes(
            model, layout, hardware, prompt_len=prompt_len, response_len=response_len, head=head
        )
        total = engine - served_weight_bytes(model, layout, head)
    else:
        total = inference_activation_bytes(
            model, layout, sequences=sequences, tokens=prompt_len, head=head
        ) + kv_cache_bytes(
            model, layout, sequences=sequences, prompt_len=prompt_len, response_len=response_len
        )
    if include_weights:
        total += state.persistent
    return total

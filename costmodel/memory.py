"""Per-device memory of one model invocation (SPEC §6, paper Appendix D-H to D-J).

Parameter counts are in scalars, everything else in bytes. ``sb`` is
:attr:`ModelSpec.dtype_bytes`; ``b = n/(Pd·mb)`` is the per-device microbatch for ``n`` sequences.

* :func:`weight_shard_params` — ``W_shard``, the worst pipeline stage's parameters per GPU;
* :func:`training_state_bytes` — persistent FP32 master + Adam moments, ZeRO-2 sharded;
* :func:`weight_bytes` — one BF16 copy of the shard (serving copy, frozen model, shadow copy);
* :func:`transient_bytes` — the peak an invocation allocates while it runs (activations,
  KV cache, materialised weights and gradients); training activations follow the strategy's
  recomputation mode (:func:`training_activation_bytes`).

The caller combines them into ``peak(d) = Σ_m S(m, d) + max_v A(v)`` (SPEC §6).
"""

from __future__ import annotations

import math

from ..ir.models import OPTIMIZER_BYTES_PER_PARAM, ModelSpec
from ..ir.types import Head, Recompute, Role
from .layout import Layout

__all__ = [
    "OPTIMIZER_BYTES_PER_PARAM",
    "inference_activation_bytes",
    "kv_cache_bytes",
    "kv_width_per_device",
    "model_params",
    "stored_activation_width",
    "training_activation_bytes",
    "training_state_bytes",
    "transient_bytes",
    "weight_bytes",
    "weight_shard_params",
]


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


def _head_params(model: ModelSpec, head: Head) -> int:
    """Weights of the output head on the last stage: ``V·d`` (LM), ``d`` (scalar), both."""
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


def weight_shard_params(model: ModelSpec, pp: int, tp: int, head: Head = Head.LM) -> float:
    """Worst-stage parameter shard per GPU, ``W_shard`` (SPEC §6, paper Appendix D-H).

    ``W_shard = max_p [ (L/Pp)·W_layer/Pt + [p = 1]·V·d + [p = Pp]·H ]`` with ``H = V·d`` (LM),
    ``d`` (scalar) or ``V·d + d`` (both). Block weights are split over the ``Pt`` TP ranks; the
    embedding and the heads are replicated on every TP rank. Norm weights (``2d`` per block)
    are left out, as in SPEC. With tied embeddings and ``Pp = 1`` the LM head *is* the input
    embedding and is stored once.

    Parameters
    ----------
    model
        The model.
    pp, tp
        Pipeline and tensor parallel degrees ``Pp``, ``Pt``.
    head
        Output head(s).

    Returns
    -------
    float
        Parameters on the most loaded GPU.
    """
    _check_degree("pp", pp)
    _check_degree("tp", tp)
    layers = model.layers / pp * model.layer_params / tp
    embedding = model.embedding_params
    head_params = _head_params(model, head)
    if pp == 1:
        if model.tied_embeddings and head is not Head.SCALAR:
            head_params -= model.vocab * model.hidden  # the LM head shares the embedding
        return layers + embedding + head_params
    return layers + max(embedding, head_params)


def training_state_bytes(model: ModelSpec, layout: Layout, head: Head = Head.LM) -> float:
    """Persistent optimizer state of a training device: ``12·W_shard/Pd`` bytes (SPEC §6).

    FP32 master weights and two FP32 Adam moments (12 bytes per parameter), ZeRO-2 sharded over
    the ``Pd`` data-parallel ranks.

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
    s = layout.strategy
    shard = weight_shard_params(model, s.pp, s.tp, head)
    return OPTIMIZER_BYTES_PER_PARAM * shard / s.dp


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
    return weight_shard_params(model, layout.strategy.pp, layout.strategy.tp, head) * model.dtype_bytes


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


def _layer_buffer_width(model: ModelSpec, tp: int) -> float:
    """Per-token scalars of one block's largest intermediate: ``max(2d + 6d/Pt, 2d + 2dff/Pt)``."""
    d = model.hidden
    return max(2.0 * d + 6.0 * d / tp, 2.0 * d + 2.0 * model.ffn_hidden / tp)


def stored_activation_width(model: ModelSpec, tp: int) -> float:
    """Scalars one layer keeps per token for its backward, attention scores aside:
    ``a = 4d + (2·d_q + 2·d_kv)/Pt + 2·(n_ffn − 1)·dff/Pt`` (``docs/cost-model.md`` §4).

    Replicated over the TP ranks (no sequence parallelism): the inputs of the two norms and their
    outputs, which feed the QKV and the up/gate GEMMs (``4d``). Sharded: ``Q``, ``K``, ``V`` and
    the attention output that feeds the O projection (``(2·d_q + 2·d_kv)/Pt``), and the FFN
    intermediates (``4·dff/Pt`` gated — gate, up, ``SiLU(gate)`` and the product fed to the down
    projection; ``2·dff/Pt`` ungated — the activation's input and output). For a GPT block
    (``d_q = d_kv = d``, ``dff = 4d``, 2 bytes) this is Korthikanti et al. (2022)'s
    ``sbh(10 + 24/t)`` without its two 1-byte dropout masks (RL post-training runs without dropout).

    Parameters
    ----------
    model
        The model.
    tp
        Tensor-parallel degree ``Pt``.

    Returns
    -------
    float
        Scalars per token and layer.
    """
    _check_degree("tp", tp)
    d = model.hidden
    sharded = (
        2.0 * model.q_width + 2.0 * model.kv_width + 2.0 * (model.ffn_projections - 1) * model.ffn_hidden
    )
    return 4.0 * d + sharded / tp


def _score_scalars(model: ModelSpec, tp: int, tokens: float) -> float:
    """Attention-probability scalars one layer keeps per sequence: ``2·(heads/Pt)·ℓ²``."""
    return 2.0 * model.heads / tp * tokens * tokens


def training_activation_bytes(model: ModelSpec, layout: Layout, *, sequences: float, tokens: float) -> float:
    """Training activations under the strategy's recomputation mode (SPEC §6, paper Appendix
    D-I; Korthikanti et al. 2022), with ``b = n/(Pd·mb)``, ``ℓ = tokens`` and ``min(mb, Pp)``
    microbatches alive during 1F1B warm-up:

    * ``full`` (SPEC's formula): ``sb·min(mb, Pp)·b·ℓ·((L/Pp)/c·d + c·max(2d + 6d/Pt,
      2d + 2dff/Pt))`` with checkpoint interval ``c = max(1, ⌊√(L/Pp)⌋)`` — one checkpoint of
      width ``d`` every ``c`` layers plus a recomputation buffer of ``c`` layers;
    * ``none``: ``sb·min(mb, Pp)·b·(L/Pp)·(ℓ·a + 2·(heads/Pt)·ℓ²)`` — every layer keeps its
      activations, ``a`` = :func:`stored_activation_width`, and the unfused attention its
      probabilities (the softmax output and the tensor the ``·V`` GEMM reads, one scalar each per
      score);
    * ``selective``: ``sb·b·(min(mb, Pp)·(L/Pp)·ℓ·a + 2·(heads/Pt)·ℓ²)`` — the attention core is
      recomputed in the backward, so no layer keeps its probabilities; one layer's recomputed
      probabilities of one microbatch are the buffer.

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
    b = sequences / (s.dp * s.mb)
    alive = min(s.mb, s.pp)
    mode = s.recompute
    if mode is Recompute.FULL:
        c = max(1, math.isqrt(int(layers)))
        per_token = layers / c * model.hidden + c * _layer_buffer_width(model, s.tp)
        return model.dtype_bytes * alive * b * tokens * per_token
    stored = layers * tokens * stored_activation_width(model, s.tp)
    scores = _score_scalars(model, s.tp, tokens)
    if mode is Recompute.NONE:
        return model.dtype_bytes * alive * b * (stored + layers * scores)
    return model.dtype_bytes * b * (alive * stored + scores)


def inference_activation_bytes(
    model: ModelSpec, layout: Layout, *, sequences: float, tokens: float, head: Head = Head.LM
) -> float:
    """Forward-only activations (SPEC §6): ``sb·b·ℓ·max(2d + 6d/Pt, 2d + 2dff/Pt, d + h)``.

    ``h = V`` for an LM head (or both heads), ``1`` for a scalar head; ``b = n/(Pd·mb)``.

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
    width = max(_layer_buffer_width(model, s.tp), float(head_width))
    b = sequences / (s.dp * s.mb)
    return model.dtype_bytes * b * tokens * width


def kv_cache_bytes(
    model: ModelSpec, layout: Layout, *, sequences: float, prompt_len: int, response_len: int
) -> float:
    """Generation KV cache at full length: ``2·sb·(n/Pd)·(Lp + Lr)·(L/Pp)·d_kv,local`` (SPEC §6).

    ``d_kv,local`` is :func:`kv_width_per_device` (``d_kv/Pt``, at least one head); all ``n/Pd``
    local sequences are cached, not a microbatch.

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
    width = kv_width_per_device(model, s.tp)
    per_seq = (prompt_len + response_len) * model.layers / s.pp * width
    return 2.0 * model.dtype_bytes * sequences / s.dp * per_seq


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
) -> float:
    """Peak transient memory ``A(v)`` of one invocation on one device (SPEC §6).

    * training: :func:`training_activation_bytes` at ``ℓ = Lp + Lr`` + BF16 weights
      ``W_shard·sb`` + ZeRO-2 gradients ``W_shard·sb/Pd`` (weights are always materialised, so
      ``include_weights`` does not apply);
    * inference: :func:`inference_activation_bytes` at ``ℓ = Lp + Lr``;
    * generation: :func:`inference_activation_bytes` at ``ℓ = Lp`` + :func:`kv_cache_bytes`;

    for inference and generation ``include_weights`` adds a BF16 serving copy ``W_shard·sb``
    (set it when the device holds no persistent copy of the model).

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
    ell = prompt_len + response_len
    if role is Role.TRAINING:
        weights = weight_bytes(model, layout, head)
        activations = training_activation_bytes(model, layout, sequences=sequences, tokens=ell)
        return activations + weights + weights / layout.strategy.dp
    if role is Role.INFERENCE:
        total = inference_activation_bytes(model, layout, sequences=sequences, tokens=ell, head=head)
    else:
        total = inference_activation_bytes(
            model, layout, sequences=sequences, tokens=prompt_len, head=head
        ) + kv_cache_bytes(
            model, layout, sequences=sequences, prompt_len=prompt_len, response_len=response_len
        )
    if include_weights:
        total += weight_bytes(model, layout, head)
    return total

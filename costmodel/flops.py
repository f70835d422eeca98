"""Leading-order work (FLOPs) of the three invocation roles (SPEC §6; derivation in
``docs/cost-model.md``).

Per token and transformer block:

* dense matmuls ``2·W_layer`` (a multiply and an add per weight; ``W_layer`` from
  :attr:`ModelSpec.layer_params`, which already shrinks K/V under grouped-query attention);
* attention ``4·d_q·c`` at context length ``c`` (``2·d_q·c`` for ``QKᵀ`` and as much for the
  weighted sum of ``V``), ``d_q = heads·head_dim`` (``= d`` for every preset);

plus, per token, the output head: ``2·d·V`` (LM head), ``2·d`` (scalar head) or both.

A teacher-forced pass over ``ℓ`` tokens sees contexts ``1..ℓ`` under the causal mask, so its
attention is ``Σ 4·d_q·c ≈ 2·d_q·ℓ²`` per block and sequence (the ``4·d_q·c`` term halved by
causal averaging). Decode step ``t`` of the response (``t = 0, 1, …``) processes one token at
context ``Lp + t``; a window of steps ``[t0, t1)`` costs ``(t1 − t0)`` tokens at the mean context
``Lp + (t0 + t1)/2``. Prefill plus decode over the whole response therefore adds up to the
attention of a teacher-forced pass over ``Lp + Lr`` tokens, ``2·d_q·(Lp + Lr)²``.

A block with a sliding window ``W`` (SPEC §15.1) attends to ``min(c, W)`` keys at context ``c``:
its pass costs ``2·d_q·s_W(ℓ)``, ``s_W(ℓ) = ℓ² − (ℓ − W)₊²``, and a decode step ``4·d_q·min(c, W)``.
The formulas below average the blocks: ``ℓ²`` becomes
:meth:`~rpeg.ir.models.ModelSpec.attended_square` and ``c``
:meth:`~rpeg.ir.models.ModelSpec.attended` (both the plain figure for a model without a window).

Training is ``f`` forward-equivalents (:func:`training_passes`), ``f`` set by the invocation's
activation recomputation: ``4`` (``full``), ``3`` (``none``) or ``3`` plus the attention core's
share of a forward (``selective``).
"""

from __future__ import annotations

from ..ir.models import ModelSpec
from ..ir.types import Head, Recompute

__all__ = [
    "attention_core_flops",
    "decode_attention_flops",
    "decode_flops",
    "decode_flops_at",
    "forward_flops",
    "generation_flops",
    "head_flops_per_token",
    "head_nongemm_scalars",
    "inference_flops",
    "layer_nongemm_scalars",
    "prefill_flops",
    "reference_nongemm_scalars",
    "training_flops",
    "training_passes",
]

#: FFN width over hidden width of the layer whose non-GEMM work a hardware file's ``c_ng`` times
#: (both calibration layers of :mod:`rpeg.runtime.calibrate.measure`: 11,008/4,096 on a GPU,
#: 688/256 on a CPU, a Llama-7B-shaped SwiGLU layer).
REFERENCE_FFN_RATIO = 11008 / 4096

#: Forward-equivalent passes of one training step under full recomputation: forward, recompute
#: of the checkpointed forward and a backward pass that costs two forwards (SPEC §6).
TRAINING_PASSES = 4


def head_flops_per_token(model: ModelSpec, head: Head = Head.LM) -> float:
    """Output-head FLOPs for one token: ``2·d·V`` (LM), ``2·d`` (scalar) or ``2·d·V + 2·d`` (both).

    Parameters
    ----------
    model
        The model.
    head
        Which head(s) the invocation evaluates.

    Returns
    -------
    float
        FLOPs per token.
    """
    d = model.hidden
    if head is Head.LM:
        return 2.0 * d * model.vocab
    if head is Head.SCALAR:
        return 2.0 * d
    if head is Head.BOTH:
        return 2.0 * d * model.vocab + 2.0 * d
    raise ValueError(f"head must be a Head, got {head!r}")


def forward_flops(
    model: ModelSpec,
    tokens: float,
    head: Head = Head.LM,
    tokens_sq: float | None = None,
    window_sq: float | None = None,
) -> float:
    """One teacher-forced forward pass of one sequence over ``ℓ = tokens`` tokens.

    ``W_fwd(ℓ) = L·(2·W_layer·ℓ + 2·d_q·ℓ²) + h·ℓ`` with ``h`` the head FLOPs per token
    (:func:`head_flops_per_token`): matmuls, causally averaged attention, head on every position.
    For packed sequences of varying length (SPEC §14.1) the mean over them is
    ``L·(2·W_layer·E[ℓ] + 2·d_q·E[ℓ²]) + h·E[ℓ]``: pass ``tokens = E[ℓ]`` and
    ``tokens_sq = E[ℓ²]``. With sliding-window blocks ``ℓ²`` is their average
    ``((L − L_s)·E[ℓ²] + L_s·E[s_W(ℓ)])/L`` (:meth:`~rpeg.ir.models.ModelSpec.attended_square`).

    Parameters
    ----------
    model
        The model.
    tokens
        ``ℓ`` (or ``E[ℓ]``), tokens of the sequence.
    head
        Output head(s).
    tokens_sq
        ``E[ℓ²]``; ``None`` for ``ℓ²`` (one length).
    window_sq
        ``E[s_W(ℓ)]`` of the windowed blocks; ``None``: from ``tokens`` and ``tokens_sq`` (exact
        for one length, an upper bound otherwise). Ignored without a window.

    Returns
    -------
    float
        FLOPs for one sequence.
    """
    ell = float(tokens)
    sq = ell * ell if tokens_sq is None else float(tokens_sq)
    sq = model.attended_square(sq, window_sq)
    per_layer = 2.0 * model.layer_params * ell + 2.0 * model.attention_width * sq
    return model.layers * per_layer + head_flops_per_token(model, head) * ell


def inference_flops(
    model: ModelSpec,
    *,
    sequences: float,
    prompt_len: int,
    response_len: int,
    head: Head = Head.LM,
    tokens: float | None = None,
    tokens_sq: float | None = None,
    window_sq: float | None = None,
) -> float:
    """Teacher-forced inference: ``W_I = n·W_fwd(Lp + Lr)`` for ``n`` sequences (SPEC §6), or
    ``n·W_fwd(E[ℓ], E[ℓ²])`` for packed sequences of varying length (SPEC §14.1).

    Parameters
    ----------
    model
        The model.
    sequences
        ``n``, sequences processed (``B·R`` or a fraction of it).
    prompt_len, response_len
        ``Lp`` and ``Lr``.
    head
        Output head(s).
    tokens, tokens_sq
        ``E[ℓ]`` and ``E[ℓ²]`` of the sequences; ``None``: every one has ``Lp + Lr`` tokens.
    window_sq
        ``E[s_W(ℓ)]`` for sliding-window blocks (:func:`forward_flops`).

    Returns
    -------
    float
        FLOPs.
    """
    ell = prompt_len + response_len if tokens is None else tokens
    return sequences * forward_flops(model, ell, head, tokens_sq, window_sq)


def attention_core_flops(
    model: ModelSpec, tokens: float, tokens_sq: float | None = None, window_sq: float | None = None
) -> float:
    """The attention core of one teacher-forced forward of one sequence: ``L·2·d_q·ℓ²``
    (sliding-window blocks: ``ℓ²`` averaged with their ``s_W(ℓ)``, as in :func:`forward_flops`).

    The score product ``QKᵀ`` and the weighted sum over ``V`` (``4·d_q·c`` per token at context
    ``c``, causally averaged to ``2·d_q·ℓ`` per token): the ``ℓ²`` term of
    :func:`forward_flops`, the work selective recomputation repeats (no weight GEMM).

    Parameters
    ----------
    model
        The model.
    tokens
        ``ℓ``, tokens of the sequence.
    tokens_sq, window_sq
        ``E[ℓ²]`` and ``E[s_W(ℓ)]`` of packed sequences (:func:`forward_flops`).

    Returns
    -------
    float
        FLOPs for one sequence.
    """
    ell = float(tokens)
    sq = ell * ell if tokens_sq is None else float(tokens_sq)
    sq = model.attended_square(sq, window_sq)
    return model.layers * 2.0 * model.attention_width * sq


def training_passes(
    model: ModelSpec,
    recompute: Recompute | str,
    tokens: float,
    head: Head = Head.LM,
    tokens_sq: float | None = None,
    window_sq: float | None = None,
) -> float:
    """Forward-equivalents ``f`` of one training step over ``ℓ = tokens`` (``W_T = f·W_I``).

    * ``full``: ``f = 4`` — forward, recompute of the checkpointed forward, backward (two
      forwards: gradients with respect to activations and to weights; SPEC §6);
    * ``none``: ``f = 3`` — forward and backward, nothing recomputed;
    * ``selective``: ``f = 3 + L·2·d_q·ℓ²/W_fwd(ℓ)`` — the backward recomputes the attention core
      (:func:`attention_core_flops`) of every layer, a fraction of one forward
      (:func:`forward_flops`).

    Parameters
    ----------
    model
        The model.
    recompute
        The invocation's :class:`~rpeg.ir.types.Recompute` mode.
    tokens
        ``ℓ = Lp + Lr`` (``E[ℓ]`` for packed sequences).
    head
        Output head(s) (part of ``W_fwd``).
    tokens_sq
        ``E[ℓ²]`` for packed sequences; ``None`` for ``ℓ²``.
    window_sq
        ``E[s_W(ℓ)]`` for sliding-window blocks (:func:`forward_flops`).

    Returns
    -------
    float
        ``f``.
    """
    mode = Recompute(recompute)
    if mode is Recompute.FULL:
        return float(TRAINING_PASSES)
    if mode is Recompute.NONE:
        return 3.0
    core = attention_core_flops(model, tokens, tokens_sq, window_sq)
    return 3.0 + core / forward_flops(model, tokens, head, tokens_sq, window_sq)


def training_flops(
    model: ModelSpec,
    *,
    sequences: float,
    prompt_len: int,
    response_len: int,
    head: Head = Head.LM,
    recompute: Recompute | str = Recompute.FULL,
    tokens: float | None = None,
    tokens_sq: float | None = None,
    window_sq: float | None = None,
) -> float:
    """Training: ``W_T = f·W_I`` with ``f`` the forward-equivalents of the recomputation mode
    (:func:`training_passes`): ``4·W_I`` for ``full`` (SPEC §6), ``3·W_I`` for ``none``,
    ``3·W_I + n·L·2·d_q·ℓ²`` for ``selective``.

    Parameters
    ----------
    model
        The model.
    sequences
        ``n``, sequences processed.
    prompt_len, response_len
        ``Lp`` and ``Lr``.
    head
        Output head(s).
    recompute
        Activation recomputation (default ``full``, SPEC's 4 forward-equivalents).
    tokens, tokens_sq
        ``E[ℓ]`` and ``E[ℓ²]`` of packed sequences (SPEC §14.1); ``None``: ``Lp + Lr`` each.
    window_sq
        ``E[s_W(ℓ)]`` for sliding-window blocks (:func:`forward_flops`).

    Returns
    -------
    float
        FLOPs.
    """
    ell = prompt_len + response_len if tokens is None else tokens
    passes = training_passes(model, recompute, ell, head, tokens_sq, window_sq)
    return passes * inference_flops(
        model,
        sequences=sequences,
        prompt_len=prompt_len,
        response_len=response_len,
        head=head,
        tokens=tokens,
        tokens_sq=tokens_sq,
        window_sq=window_sq,
    )


def prefill_flops(model: ModelSpec, *, sequences: float, prompt_len: int, head: Head = Head.LM) -> float:
    """Generation prefill over the prompt: ``n·(L·(2·W_layer·Lp + 2·d_q·Lp²) + h)``
    (sliding-window blocks: ``Lp²`` averaged with their ``s_W(Lp) = Lp² − (Lp − W)₊²``).

    The blocks run over all ``Lp`` prompt tokens; the head runs on the last prompt position only
    (the one whose logits give the first response token), as generation engines do.

    Parameters
    ----------
    model
        The model.
    sequences
        ``n``, sequences.
    prompt_len
        ``Lp``.
    head
        Output head(s).

    Returns
    -------
    float
        FLOPs.
    """
    ell = float(prompt_len)
    if model.is_windowed:
        core = 2.0 * model.attention_width * model.attended_square(ell * ell)
    else:  # the product in this order: costs without a window stay what they were, bit for bit
        core = 2.0 * model.attention_width * ell * ell
    layers = model.layers * (2.0 * model.layer_params * ell + core)
    return sequences * (layers + head_flops_per_token(model, head))


def decode_flops(
    model: ModelSpec,
    *,
    sequences: float,
    prompt_len: int,
    window: tuple[int, int],
    head: Head = Head.LM,
) -> float:
    """Decode steps ``t0 ≤ t < t1`` of one token each at context ``Lp + t``.

    ``n·(t1 − t0)·(L·(2·W_layer + 4·d_q·c̄) + h)`` with the mean context
    ``c̄ = Lp + (t0 + t1)/2``; sliding-window blocks attend to ``E[min(c, W)]`` over the
    window's contexts (:meth:`~rpeg.ir.models.ModelSpec.windowed_mean`), averaged with the
    others' ``c̄`` (:meth:`~rpeg.ir.models.ModelSpec.attended`).

    Parameters
    ----------
    model
        The model.
    sequences
        ``n``, sequences still decoding in the window.
    prompt_len
        ``Lp``.
    window
        ``(t0, t1)``, the response positions decoded.
    head
        Output head(s).

    Returns
    -------
    float
        FLOPs.
    """
    t0, t1 = window
    steps = t1 - t0
    if steps <= 0:
        return 0.0
    context = prompt_len + 0.5 * (t0 + t1)
    windowed = model.windowed_mean(prompt_len + t0, prompt_len + t1) if model.is_windowed else None
    return decode_flops_at(
        model, sequences=sequences, steps=steps, context=context, head=head, windowed=windowed
    )


def decode_flops_at(
    model: ModelSpec,
    *,
    sequences: float,
    steps: float,
    context: float,
    head: Head = Head.LM,
    windowed: float | None = None,
) -> float:
    """``steps`` decode steps of ``n`` running sequences at mean context ``c̄``:
    ``n·steps·(L·(2·W_layer + 4·d_q·c̄) + h)`` (SPEC §14.5's continuous batching evaluates
    each stretch of steps at its running batch and mean context). With sliding-window blocks
    ``c̄`` is the blocks' average ``((L − L_s)·c̄ + L_s·c̄_W)/L``
    (:meth:`~rpeg.ir.models.ModelSpec.attended`), ``c̄_W = E[min(c, W)]`` the windowed blocks'
    mean context.

    Parameters
    ----------
    model
        The model.
    sequences
        ``n``, sequences decoding in each step.
    steps
        Decode steps (may be fractional: a mean over an engine's schedule).
    context
        ``c̄``, their mean context in tokens.
    head
        Output head(s).
    windowed
        ``c̄_W``; ``None``: ``min(c̄, W)`` (exact for one context, an upper bound for a stretch).

    Returns
    -------
    float
        FLOPs.
    """
    per_token = model.layers * (
        2.0 * model.layer_params + 4.0 * model.decode_attention_width * model.attended(context, windowed)
    ) + head_flops_per_token(model, head)
    return sequences * steps * per_token


def decode_attention_flops(
    model: ModelSpec, *, sequences: float, steps: float, context: float, windowed: float | None = None
) -> float:
    """The attention core of ``steps`` decode steps of ``n`` running sequences at mean context
    ``c̄``: ``n·steps·L·4·d_dec·c̄`` — each new token's scores against, and weighted sum over, the
    ``c̄`` cached positions (``d_dec`` =
    :attr:`~rpeg.ir.models.ModelSpec.decode_attention_width`; with sliding-window blocks ``c̄`` is
    the blocks' average, :meth:`~rpeg.ir.models.ModelSpec.attended`). The part of
    :func:`decode_flops_at` that is not a weight GEMM or the head.

    Parameters
    ----------
    model, sequences, steps, context, windowed
        As for :func:`decode_flops_at`.

    Returns
    -------
    float
        FLOPs.
    """
    return (
        sequences
        * steps
        * model.layers
        * 4.0
        * model.decode_attention_width
        * model.attended(context, windowed)
    )


def generation_flops(
    model: ModelSpec,
    *,
    sequences: float,
    prompt_len: int,
    response_len: int,
    head: Head = Head.LM,
    decode: tuple[int, int] | None = None,
    prefill: bool = True,
) -> float:
    """Generation: prefill over ``Lp`` (if ``prefill``) plus the decode window (SPEC §6).

    Parameters
    ----------
    model
        The model.
    sequences
        ``n``, sequences.
    prompt_len, response_len
        ``Lp`` and ``Lr``.
    head
        Output head(s).
    decode
        ``(t0, t1)``; default ``(0, Lr)``, i.e. ``Lr`` decode steps.
    prefill
        Whether the prefill is part of this invocation (the first response-length phase).

    Returns
    -------
    float
        FLOPs.
    """
    window = (0, response_len) if decode is None else decode
    work = decode_flops(model, sequences=sequences, prompt_len=prompt_len, window=window, head=head)
    if prefill:
        work += prefill_flops(model, sequences=sequences, prompt_len=prompt_len, head=head)
    return work


def _activation_scalars(width: int, projections: int) -> float:
    """Scalars the FFN activation of one token moves at FFN width ``width``: the gated
    ``act(gate)·up`` reads two inputs and writes one (``3·w``), a plain ``act(x)`` reads and
    writes one (``2·w``)."""
    return (3.0 if projections == 3 else 2.0) * width


def layer_nongemm_scalars(model: ModelSpec, tp: int = 1, sp: bool = False) -> float:
    """Scalars one device's memory-bound (non-GEMM) kernels read and write per token and block in
    one forward, averaged over the blocks (``docs/cost-model.md`` §2 "Non-GEMM work").

    Counted as Megatron-core with Transformer Engine runs a block (fused kernels: each reads its
    inputs and writes its outputs once; the attention softmax lives inside the fused attention
    core and is not counted here):

    * replicated on every tensor-parallel rank unless sequence parallelism splits it
      (``/Pt`` under SP): two norms (read and write ``d`` each, ``4d``), two fused residual adds
      (read ``2d``, write ``d`` each, ``6d``); a MoE block adds the router's probabilities
      (``2E``) and the token permutation around the experts (dispatch copies ``k`` rows,
      ``2kd``; the weighted combine reads ``k`` rows and writes one, ``kd + d``); latent
      attention adds its two latent norms (``2·(r_q + r_kv)``);
    * split over the ``Pt`` ranks: rotary embedding of queries and keys (read and write,
      ``2·(d_q + d_kv)``; latent attention rotates ``H·rope + rope``) and the FFN activation
      (gated ``3·w``, plain ``2·w``; a MoE block ``k·act(d_e) + S·act(d_s)``).

    So ``σ = ρ·(10d + σ_rep) + (σ_rot + σ_act)/Pt`` with ``ρ = 1/Pt`` under SP, else 1; dense
    and MoE blocks are averaged by their counts.

    Parameters
    ----------
    model
        The model.
    tp
        Tensor-parallel degree ``Pt``.
    sp
        Whether sequence parallelism splits the replicated work.

    Returns
    -------
    float
        Scalars per token and block (multiply by the bytes per scalar for bytes).
    """
    d = model.hidden
    rho = 1.0 / tp if sp else 1.0
    if model.is_mla:
        rot = 2.0 * (model.heads * model.qk_rope_head_dim + model.qk_rope_head_dim)
        rep = 10.0 * d + 2.0 * (model.q_lora_rank + model.kv_lora_rank)
    else:
        rot = 2.0 * (model.q_width + model.kv_width)
        rep = 10.0 * d
    dense = rho * rep + (rot + _activation_scalars(model.ffn_hidden, model.ffn_projections)) / tp
    if not model.is_moe:
        return dense
    k, proj = model.experts_active, model.ffn_projections
    act = k * _activation_scalars(model.expert_ffn, proj)
    if model.shared_experts:
        act += model.shared_experts * _activation_scalars(model.shared_ffn, proj)
    route = 2.0 * model.experts + 3.0 * k * d + d
    moe = rho * (rep + route) + (rot + act) / tp
    n_moe = model.moe_layers
    return (n_moe * moe + (model.layers - n_moe) * dense) / model.layers


def head_nongemm_scalars(model: ModelSpec, head: Head = Head.LM, tp: int = 1, sp: bool = False) -> float:
    """Scalars the output head's memory-bound kernels move per token in one forward: the final
    norm (``2d``, replicated unless SP) and, for an LM head, the vocabulary-parallel softmax over
    the token's ``V/Pt`` logits (read twice: its maximum, then the exponentials' sum and the
    target's log-probability, ``2V/Pt``); a scalar head adds nothing beyond the norm.

    Parameters
    ----------
    model
        The model.
    head
        Which head(s) the invocation evaluates.
    tp, sp
        Tensor-parallel degree and sequence parallelism, as in :func:`layer_nongemm_scalars`.

    Returns
    -------
    float
        Scalars per token.
    """
    norm = 2.0 * model.hidden / (tp if sp else 1)
    if head in (Head.LM, Head.BOTH):
        return norm + 2.0 * model.vocab / tp
    return norm


def reference_nongemm_scalars(hidden: float) -> float:
    """:func:`layer_nongemm_scalars` of the reference block a hardware file's ``c_ng`` times, at
    width ``d = hidden``: dense, ``d_q = d_kv = d``, SwiGLU of width ``(11,008/4,096)·d``, one
    device: ``10d + 4d + 3·(11,008/4,096)·d ≈ 22.06·d``.

    Parameters
    ----------
    hidden
        The reference width ``d_cal``.

    Returns
    -------
    float
        Scalars per token.
    """
    return (14.0 + 3.0 * REFERENCE_FFN_RATIO) * hidden

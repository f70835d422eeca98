"""The precision setting (BF16 / FP8 / NVFP4 GEMMs) as the engines run it (issue 31; derivation
in ``docs/cost-model.md`` §11, choices in ``docs/decisions.md``, "The precision setting").

With :attr:`ModelSpec.precision <rpeg.ir.models.ModelSpec.precision>` ``= "fp8"``:

* the transformer blocks' weight GEMMs — QKV, output projection, FFN, experts, the FLOPs
  ``2·W_layer`` per token and layer (:func:`block_gemm_flops`) — run at the FP8 peak
  ``F_peak,8`` (:attr:`Hardware.peak_flops_fp8 <rpeg.ir.hardware.Hardware.peak_flops_fp8>`):
  Transformer Engine's ``Linear``/``LayerNormLinear``/``GroupedLinear`` under ``fp8_autocast``
  (Megatron-core training and its teacher-forced forwards) and vLLM's ``Fp8LinearMethod``
  (generation, ``quantization="fp8"``);
* the attention core stays BF16 in both (Megatron-core's ``fp8_dot_product_attention`` is off
  by default; vLLM's FlashAttention runs on the BF16 KV cache unless ``kv_cache_dtype=fp8``),
  and so does the LM head (Megatron-core's output layer is a plain ``ColumnParallelLinear``
  outside TE unless ``fp8_output_proj``; vLLM quantizes every ``Linear`` module except
  ``lm_head``): their FLOPs run at the BF16 peak, and a node's compute-bound rate is the
  work-weighted harmonic mean :func:`mixed_peak`;
* the GEMMs read FP8 weights and FP8 inputs (1 byte) and write BF16 outputs, which the roofline
  intensity uses (:func:`gemm_weight_bytes`, :func:`gemm_activation_bytes`);
* Transformer Engine quantizes each FP8 GEMM's BF16 input and, in the backward, its BF16 output
  gradient, in memory-bound kernels of their own (:func:`quantize_scalars`, charged with the
  non-GEMM work of a training or teacher-forced node; vLLM's are not modelled);
* a generation engine stores the blocks' weights in FP8
  (:func:`~rpeg.costmodel.memory.served_weight_bytes`); a trainer
  and a teacher-forced pass keep BF16 weights (FP32 master copies and Adam moments unchanged:
  no ``fp8_param_gather``), so their memory and every weight transfer stay BF16.

``"nvfp4"`` is the same model with NVFP4 GEMMs (Transformer Engine's ``NVFP4BlockScaling``:
forward, data- and weight-gradient GEMMs in E2M1 with an E4M3 scale per 16 elements; vLLM's
ModelOpt NVFP4 checkpoints, W4A4, on Blackwell): the blocks' weight GEMMs run at
``F_peak,4`` (:attr:`Hardware.peak_flops_fp4 <rpeg.ir.hardware.Hardware.peak_flops_fp4>`),
every operand of ``q = 0.5625`` bytes (:attr:`ModelSpec.gemm_bytes
<rpeg.ir.models.ModelSpec.gemm_bytes>`) where FP8 has 1 — the roofline's bytes, the quantize
kernels' writes, the saved GEMM inputs and a generation engine's weights.

``"mxfp4"`` (a mixture of experts) is no GEMM precision: vLLM's ``Mxfp4Config`` stores the
routed experts in MXFP4 and runs them as weight-only GEMMs at the BF16 peak, so every function
here returns the BF16 figure for it; the engine's stored weights
(:func:`~rpeg.costmodel.memory.served_weight_bytes`) and the bytes its expert GEMMs read
(:class:`~rpeg.costmodel.time._Roofline`) are what change. Any hardware runs it: Marlin on
Ampere, OpenAI's Triton kernels on Hopper, vLLM's CPU kernels. On Blackwell vLLM prefers
FlashInfer's MXFP4 × MXFP8 GEMMs, which run on the FP8 tensor cores; rpeg prices them at the
BF16 peak too, which makes a compute-bound prefill slower than it is (``docs/decisions.md``).

Without the matching tensor cores (FP8 on A100, NVFP4 before Blackwell) a trainer and a
teacher-forced pass are refused (:func:`check_precision`); a generation engine serves the
checkpoint as weight-only GEMMs (:func:`served_weight_only`), priced like MXFP4 experts.

``"bf16"`` changes nothing: every function here returns the BF16 figure, and the cost model's
BF16 arithmetic is the same, bit for bit.
"""

from __future__ import annotations

from ..ir.hardware import Hardware
from ..ir.models import ModelSpec

__all__ = [
    "block_gemm_flops",
    "check_precision",
    "gemm_activation_bytes",
    "gemm_peaks",
    "gemm_weight_bytes",
    "mixed_peak",
    "quantize_scalars",
    "served_weight_only",
]


def served_weight_only(model: ModelSpec, hw: Hardware) -> bool:
    """Whether a generation engine serves the model's FP8 or NVFP4 checkpoint as weight-only
    GEMMs on this hardware: the hardware lacks the matching tensor cores (FP8 on A100, NVFP4
    before Blackwell), so vLLM keeps the quantized weights and runs BF16 GEMMs that dequantize
    them in the tile (its Marlin kernels: ``Fp8LinearMethod`` and the FP8 and FP4 MoE methods
    fall back to them without the tensor cores; W8A16 or W4A16)."""
    if model.is_fp8:
        return hw.peak_flops_fp8 is None
    if model.precision == "nvfp4":
        return hw.peak_flops_fp4 is None
    return False


def check_precision(model: ModelSpec, hw: Hardware, *, served: bool = False) -> None:
    """Refuse a model whose precision the hardware cannot run.

    ``precision = "fp8"`` needs FP8 tensor cores (Hopper, Ada, Blackwell): hardware without an
    FP8 peak (``peak_flops_fp8`` is ``None``: A100, the CPU runtime, a calibration file) is refused
    rather than priced silently at BF16. ``precision = "nvfp4"`` needs FP4 tensor cores
    (Blackwell: ``peak_flops_fp4``); Hopper, on which Transformer Engine does not train in NVFP4,
    is refused too. A generation engine (``served``) is the exception: vLLM serves such a
    checkpoint as weight-only GEMMs (:func:`served_weight_only`), which the cost model prices;
    a trainer and a teacher-forced pass are refused.

    Parameters
    ----------
    model
        The model (its :attr:`~rpeg.ir.models.ModelSpec.precision`).
    hw
        The hardware.
    served
        Whether the model runs in a generation engine.

    Raises
    ------
    ValueError
        Naming the model, its precision and the hardware.
    """
    if served:
        return
    engine = " (a generation engine serves it as weight-only GEMMs; a trainer and a teacher-forced pass cannot run it)"
    if model.is_fp8 and hw.peak_flops_fp8 is None:
        raise ValueError(
            f"model {model.name!r} has precision 'fp8', but hardware {hw.name!r} has no FP8 tensor "
            "cores (no peak_flops_fp8: A100 and the CPU runtime have none)" + engine + "; use "
            "precision 'bf16' or hardware with an FP8 peak (h100, h200, gh200, h20, b200, b300, "
            "gb200-nvl72, gb300-nvl72)"
        )
    if model.precision == "nvfp4" and hw.peak_flops_fp4 is None:
        raise ValueError(
            f"model {model.name!r} has precision 'nvfp4', but hardware {hw.name!r} has no FP4 tensor "
            "cores (no peak_flops_fp4: only Blackwell has them)" + engine + "; use precision 'fp8' "
            "or 'bf16', or hardware with an FP4 peak (b200, b300, gb200-nvl72, gb300-nvl72)"
        )


def gemm_peaks(model: ModelSpec, hw: Hardware, *, served: bool = False) -> tuple[float, float | None]:
    """``(F_peak, F_peak,q)``: the BF16 peak and, for an FP8 or NVFP4 model, the peak of its
    low-precision GEMMs, ``F_peak,8`` or ``F_peak,4`` (``None`` for BF16, and for a generation
    engine's weight-only GEMMs, :func:`served_weight_only`, which run at the BF16 peak).

    Parameters
    ----------
    model, hw
        The model and the hardware.
    served
        Whether the model runs in a generation engine.

    Returns
    -------
    tuple
        ``(hw.peak_flops, F_peak,8 or F_peak,4 or None)``.

    Raises
    ------
    ValueError
        For a precision the hardware has no peak for, outside a generation engine
        (:func:`check_precision`).
    """
    check_precision(model, hw, served=served)
    return hw.peak_flops, {"fp8": hw.peak_flops_fp8, "nvfp4": hw.peak_flops_fp4}.get(model.precision)


def mixed_peak(peak: float, peak_fp8: float, fp8_share: float) -> float:
    """The compute-bound rate of work whose share ``ψ = fp8_share`` runs at the low-precision
    peak ``F_peak,q`` (FP8 or NVFP4) and the rest at ``F_peak``: the two kinds of GEMM take their
    times one after the other, so ``F_mix = 1/(ψ/F_peak,q + (1 − ψ)/F_peak)``.

    Parameters
    ----------
    peak, peak_fp8
        ``F_peak`` (BF16) and ``F_peak,q``, FLOP/s.
    fp8_share
        ``ψ ∈ [0, 1]``, the low-precision GEMMs' share of the FLOPs.

    Returns
    -------
    float
        FLOP/s.
    """
    psi = min(1.0, max(0.0, fp8_share))
    return 1.0 / (psi / peak_fp8 + (1.0 - psi) / peak)


def block_gemm_flops(model: ModelSpec, tokens: float) -> float:
    """FLOPs of the blocks' weight GEMMs for ``tokens`` tokens in one forward: ``L·2·W_layer·T``
    (the ``2·W_layer`` matmul term of :func:`~rpeg.costmodel.flops.forward_flops`, without the
    attention core and the head). These are the GEMMs FP8 runs.

    Parameters
    ----------
    model
        The model.
    tokens
        ``T``, tokens through the blocks (all sequences of the node).

    Returns
    -------
    float
        FLOPs.
    """
    return model.layers * 2.0 * model.layer_params * tokens


def gemm_weight_bytes(model: ModelSpec) -> float:
    """Bytes per weight the blocks' GEMMs read: ``q`` (:attr:`~rpeg.ir.models.ModelSpec.gemm_bytes`)
    under FP8 (1) and NVFP4 (0.5625) — TE casts the BF16 weights once per step and the GEMMs read
    that copy; vLLM stores them so — else ``sb``."""
    return model.gemm_bytes if model.is_low_precision else model.dtype_bytes


def gemm_activation_bytes(model: ModelSpec) -> float:
    """Bytes per activation scalar a block GEMM moves, its input read plus its output written:
    ``q + sb`` under FP8 or NVFP4 (quantized inputs, BF16 outputs), ``2·sb`` under BF16 (the
    roofline's ``Ω_A = 2·b·ℓ·d·sb·L/Pp``)."""
    return model.gemm_bytes + model.dtype_bytes if model.is_low_precision else 2 * model.dtype_bytes


def quantize_scalars(
    model: ModelSpec, tp: int = 1, sp: bool = False, *, training: bool = True, recomputed: bool = False
) -> float:
    """Scalar-equivalents (2 bytes each) Transformer Engine's FP8 or NVFP4 quantize kernels move
    per token and block of one device, averaged over the blocks (``docs/cost-model.md`` §11, "The
    quantize kernels"); 0 for a BF16 model.

    Counted as Megatron-core runs a block under ``fp8_autocast``. A ``Linear`` (``GroupedLinear``
    for the experts) quantizes its BF16 input in a kernel of its own; with gradients enabled one
    fused cast-transpose writes the FP8 copy and its transpose for the weight gradient (read 2,
    write 1 + 1 bytes: 2 scalar-equivalents per element), without (a teacher-forced pass) only
    the copy (read 2, write 1: 1.5). A ``LayerNormLinear`` (QKV and a dense FFN's first
    projection) gets its FP8 input from the fused norm and pays only the transpose in the backward
    (read 1, write 1: 1). The backward quantizes every GEMM's output gradient with a
    cast-transpose (2 per element). Per token, with ``ρ = 1/Pt`` under sequence parallelism (else
    1) for what tensor parallelism replicates:

    * forward inputs ``x_f``: the output projection's ``d_q/Pt``; a dense FFN's second projection
      ``dff/Pt``; a MoE block's dispatched rows ``k·d·ρ`` into the experts' first projection and
      ``k·d_e/Pt`` into their second, a shared expert's ``d·ρ`` and ``d_s/Pt``; latent attention's
      down projections (``2·d·ρ``, or ``d·ρ`` without a query latent) and output ``H·d_v/Pt``
      (its latent norms fuse into the up projections);
    * backward output gradients ``x_b``: QKV ``(d_q + 2·d_kv)/Pt`` (latent attention: the
      latents ``(r_q + r_kv + rope)·ρ`` and the up projections ``H·(d_qk + nope + d_v)/Pt``), the
      output projection ``d·ρ``, the FFN's ``(n_in·dff)/Pt + d·ρ`` (experts ``n_in·k·d_e/Pt +
      k·d·ρ``, a shared expert ``n_in·d_s/Pt + d·ρ``), ``n_in`` = 2 for a gated FFN, else 1;
    * norm transposes ``x_t``: QKV's and a dense FFN's ``d`` each (latent attention: its
      latents' ``r_q + r_kv``), on every tensor-parallel rank even under sequence parallelism:
      TE transposes the input it gathered over the sequence for the weight gradient.

    So FP8 training moves ``2·x_f + 2·x_b + x_t`` (``4·x_f + 2·x_b + x_t`` under full
    recomputation, whose second forward quantizes its inputs again) and a teacher-forced pass
    ``1.5·x_f``. The LM head and the router stay BF16 and are not counted; TE's weight casts (once
    per step, not per token) are not either.

    NVFP4 runs the same kernels with ``q = 0.5625``-byte outputs
    (:attr:`~rpeg.ir.models.ModelSpec.gemm_bytes`; the row-wise copy for the forward and
    data-gradient GEMMs, the column-wise one, Hadamard-transformed in the same pass, for the
    weight gradient): a cast-transpose reads 2 bytes and writes ``2q`` (``1 + q``
    scalar-equivalents), a copy ``1 + q/2``, a transpose of a quantized input ``q``, so training
    moves ``(1 + q)·x_f + (1 + q)·x_b + q·x_t`` (``2·(1 + q)·x_f`` for the forwards under full
    recomputation) and a teacher-forced pass ``(1 + q/2)·x_f`` — the FP8 counts at ``q = 1``.

    Parameters
    ----------
    model
        The model.
    tp
        Tensor-parallel degree ``Pt``.
    sp
        Whether sequence parallelism splits the replicated work.
    training
        Whether the pass computes gradients (training) or not (a teacher-forced forward).
    recomputed
        Whether a training step runs each block's forward twice (full recomputation).

    Returns
    -------
    float
        Scalar-equivalents per token and block.
    """
    if not model.is_low_precision:
        return 0.0
    q = model.gemm_bytes
    d = model.hidden
    rho = 1.0 / tp if sp else 1.0
    n_in = 2 if model.ffn_projections == 3 else 1
    if model.is_mla:
        h, rope = model.heads, model.qk_rope_head_dim
        r_q, r_kv = model.q_lora_rank, model.kv_lora_rank
        qk = model.qk_nope_head_dim + rope
        att_f = (2.0 if r_q else 1.0) * d * rho + h * model.v_head_dim / tp
        # the latents' and the heads' projections (without a query latent, r_q = 0: one query
        # projection straight to the heads), and the output
        att_b = (
            (r_q + r_kv + rope) * rho + h * (qk + model.qk_nope_head_dim + model.v_head_dim) / tp + d * rho
        )
        att_t = float(r_q + r_kv)
    else:
        att_f = model.q_width / tp
        att_b = (model.q_width + 2 * model.kv_width) / tp + d * rho
        att_t = float(d)

    def block(forward: float, backward: float, transposes: float) -> float:
        if training:
            return (2.0 if recomputed else 1.0) * (1.0 + q) * forward + (1.0 + q) * backward + q * transposes
        return (1.0 + 0.5 * q) * forward

    dense_ffn = (model.ffn_hidden / tp, n_in * model.ffn_hidden / tp + d * rho, float(d))
    dense = block(att_f + dense_ffn[0], att_b + dense_ffn[1], att_t + dense_ffn[2])
    if not model.is_moe:
        return dense
    k, de = model.experts_active, model.expert_ffn
    moe_f = k * d * rho + k * de / tp
    moe_b = n_in * k * de / tp + k * d * rho
    if model.shared_experts:
        ds = model.shared_experts * model.shared_ffn
        moe_f += d * rho + ds / tp
        moe_b += n_in * ds / tp + d * rho
    moe = block(att_f + moe_f, att_b + moe_b, att_t)
    n_moe = model.moe_layers
    return (n_moe * moe + (model.layers - n_moe) * dense) / model.layers

"""The precision setting (BF16 / FP8 GEMMs) as the engines run it (issue 31; derivation in
``docs/cost-model.md`` §11, choices in ``docs/decisions.md``, "The precision setting").

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
* a generation engine stores the blocks' weights in FP8
  (:func:`~rpeg.costmodel.memory.served_weight_bytes`); a trainer
  and a teacher-forced pass keep BF16 weights (FP32 master copies and Adam moments unchanged:
  no ``fp8_param_gather``), so their memory and every weight transfer stay BF16.

``"bf16"`` changes nothing: every function here returns the BF16 figure, and the cost model's
BF16 arithmetic is the same, bit for bit.
"""

from __future__ import annotations

from ..ir.hardware import Hardware
from ..ir.models import ModelSpec

__all__ = [
    "FP8_BYTES",
    "block_gemm_flops",
    "check_precision",
    "gemm_activation_bytes",
    "gemm_peaks",
    "gemm_weight_bytes",
    "mixed_peak",
]

#: Bytes of one FP8 (E4M3 or E5M2) scalar.
FP8_BYTES = 1


def check_precision(model: ModelSpec, hw: Hardware) -> None:
    """Refuse a model whose precision the hardware cannot run.

    ``precision = "fp8"`` needs FP8 tensor cores (Hopper, Ada, Blackwell): hardware without an
    FP8 peak (``peak_flops_fp8`` is ``None``: A100, the CPU runtime, a calibration file) is refused
    rather than priced silently at BF16.

    Parameters
    ----------
    model
        The model (its :attr:`~rpeg.ir.models.ModelSpec.precision`).
    hw
        The hardware.

    Raises
    ------
    ValueError
        Naming the model, its precision and the hardware.
    """
    if model.is_fp8 and hw.peak_flops_fp8 is None:
        raise ValueError(
            f"model {model.name!r} has precision 'fp8', but hardware {hw.name!r} has no FP8 tensor "
            "cores (no peak_flops_fp8: A100 and the CPU runtime have none); use precision 'bf16' or "
            "hardware with an FP8 peak (h100, h200, gh200, h20, b200, gb200-nvl72)"
        )


def gemm_peaks(model: ModelSpec, hw: Hardware) -> tuple[float, float | None]:
    """``(F_peak, F_peak,8)``: the BF16 peak and, for an FP8 model, the FP8 peak (``None`` for BF16).

    Parameters
    ----------
    model, hw
        The model and the hardware.

    Returns
    -------
    tuple
        ``(hw.peak_flops, hw.peak_flops_fp8 or None)``.

    Raises
    ------
    ValueError
        For an FP8 model on hardware without an FP8 peak (:func:`check_precision`).
    """
    check_precision(model, hw)
    return hw.peak_flops, (hw.peak_flops_fp8 if model.is_fp8 else None)


def mixed_peak(peak: float, peak_fp8: float, fp8_share: float) -> float:
    """The compute-bound rate of work whose share ``ψ = fp8_share`` runs at ``F_peak,8`` and the
    rest at ``F_peak``: the two kinds of GEMM take their times one after the other, so
    ``F_mix = 1/(ψ/F_peak,8 + (1 − ψ)/F_peak)``.

    Parameters
    ----------
    peak, peak_fp8
        ``F_peak`` (BF16) and ``F_peak,8``, FLOP/s.
    fp8_share
        ``ψ ∈ [0, 1]``, the FP8 GEMMs' share of the FLOPs.

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


def gemm_weight_bytes(model: ModelSpec) -> int:
    """Bytes per weight the blocks' GEMMs read: 1 under FP8 (TE casts the BF16 weights to FP8 once
    per step and the GEMMs read that copy; vLLM stores them in FP8), else ``sb``."""
    return FP8_BYTES if model.is_fp8 else model.dtype_bytes


def gemm_activation_bytes(model: ModelSpec) -> int:
    """Bytes per activation scalar a block GEMM moves, its input read plus its output written:
    ``1 + sb`` under FP8 (FP8 inputs, BF16 outputs), ``2·sb`` under BF16 (the roofline's
    ``Ω_A = 2·b·ℓ·d·sb·L/Pp``)."""
    return FP8_BYTES + model.dtype_bytes if model.is_fp8 else 2 * model.dtype_bytes

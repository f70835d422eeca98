"""Hardware description: the figures the cost model reads, as data (an input, SPEC §2).

A :class:`Hardware` holds GPU memory ``M_GPU``, effective compute ``F_peak``, HBM bandwidth
``BW_mem``, the GEMM-shape constants ``γM, γK``, the non-GEMM constant ``c_ng`` measured at
``B_cal`` sequences of ``ℓ_cal`` tokens of width ``d_cal``, and ``(α, β)`` pairs for collectives
and point-to-point transfers at three tiers (SPEC §2):

* tier 0 — inside a node (NVLink/NVSwitch),
* tier 1 — between nodes of one rack,
* tier 2 — between racks.

Beyond SPEC, a hardware file can carry what a calibration through the execution engines
measured (``rpeg calibrate``; docs/cost-model.md §2 "Engine terms"): per engine (``vllm``,
``torch``, …) and operation class (:data:`OP_CLASSES`) an :class:`OpTerms` — a GEMM efficiency
and fixed overheads per call, per layer pass and per decode step — and the engine's weight-sync
link; :attr:`Hardware.engine_for` says which engine runs which role, and ``dispatch_s`` is the
controller's fixed cost of dispatching one node. Presets carry none of these (every term is
neutral), so their predictions are SPEC's.

Bundled presets live as JSON files in ``costmodel/presets/`` (nominal vendor figures,
derated, each link figure's source in ``sources``); calibration writes the same format
(see :meth:`Hardware.save`). The format is ``rpeg.hardware/2``; ``/1`` files predate the
per-token non-GEMM reference (``l_cal``, ``d_cal``) and are refused with a message saying so.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from .errors import InputError, Strict, read_json, validate

__all__ = [
    "ENGINE_ALLREDUCE_RANKS",
    "ENGINE_ROLES",
    "FIGURE_RANGES",
    "FORMAT",
    "OP_CLASSES",
    "TIER_NAMES",
    "AttentionRate",
    "EngineStep",
    "EngineTerms",
    "Hardware",
    "Link",
    "OpTerms",
    "figure_problem",
]

TIER_NAMES = ("intra-node", "inter-node", "inter-rack")

#: The hardware file format this version writes and reads.
FORMAT = "rpeg.hardware/2"

#: ``BW_host`` of a hardware file that names none (bytes/s per GPU and direction): PCIe 5.0 ×16
#: at 0.8 of its 63 GB/s line rate (:class:`Hardware`, ``host_bandwidth``).
DEFAULT_HOST_BANDWIDTH = 50.4e9

#: Operation classes with their own engine terms: generation's prefill and decode, teacher-forced
#: inference, training.
OP_CLASSES = ("prefill", "decode", "inference", "training")

#: The tensor-parallel degrees vLLM's custom all-reduce runs at (``CustomAllreduce.
#: _SUPPORTED_WORLD_SIZES`` in ``vllm/distributed/device_communicators/custom_all_reduce.py``,
#: 2, 4, 6 and 8 since the kernel was added; 16 is a later multi-node NVLink case rpeg does not
#: place): any other degree, NCCL's ring (:meth:`EngineStep.allreduce_link`).
ENGINE_ALLREDUCE_RANKS = (2, 4, 6, 8)

#: The roles an engine is chosen for (:attr:`Hardware.engine_for`).
ENGINE_ROLES = ("generation", "inference", "training")


def _is_number(value: object) -> bool:
    """A finite int or float (``bool`` is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


#: The plausible range ``(lowest, highest, unit)`` of every hardware figure, both ends included.
#: A figure outside it is a typo or a unit slip (GB for bytes, µs for s), and the cost model's
#: arithmetic would leave the floats with it: 1e308 FLOP/s and bytes/s make times of 0 s and a
#: division by zero, 1e-300 make times of inf s and a NaN makespan. Wide enough for every preset,
#: every calibration (a 1-thread CPU worker at ~1e11 FLOP/s; an engine term whose GEMM time the
#: fit cannot resolve is written with η = 1e6, and in-situ factors scale it) and the tests' tiny
#: devices. The JSON reader (:class:`_HardwareFile`) and :class:`Hardware`'s constructor both check it
#: (:func:`figure_problem`), the latter for its links and engine terms too (a lone :class:`Link` or
#: :class:`OpTerms` checks its sign only: a unit link is a fit's probe). ``memory_headroom`` ∈ [0, 1),
#: ``kv_memory_fraction`` ∈ (0, 1] and ``gpus_per_node`` ∈ 1..:data:`MAX_GPUS_PER_NODE` are
#: bounded by their meaning.
FIGURE_RANGES: dict[str, tuple[float, float, str]] = {
    # per-GPU figures: 1 MB (a test's toy device) .. 100 TB of memory; 1 GFLOP/s (one slow CPU
    # core) .. 1 EFLOP/s (400x a B200's dense BF16); 1 MB/s .. 1 PB/s (over 100x HBM3e)
    "gpu_memory_bytes": (1e6, 1e14, "bytes"),
    "peak_flops": (1e9, 1e18, "FLOP/s"),
    "peak_flops_fp8": (1e9, 1e18, "FLOP/s"),
    "peak_flops_fp4": (1e9, 1e18, "FLOP/s"),
    "mem_bandwidth": (1e6, 1e15, "bytes/s"),
    "host_bandwidth": (1e6, 1e15, "bytes/s"),
    # GEMM-shape constants (tokens, width; 0: no shape loss); the calibration fit's grid ends at 1e7
    "gamma_m": (0.0, 1e9, "tokens"),
    "gamma_k": (0.0, 1e9, ""),
    # the non-GEMM reference: B_cal sequences of l_cal tokens of width d_cal
    "b_cal": (1.0, 1e6, "sequences"),
    "l_cal": (1.0, 1e7, "tokens"),
    "d_cal": (1.0, 1e6, ""),
    # fixed seconds: per layer, per dispatched node, per call/layer pass/decode step, a link's α
    "c_nongemm": (0.0, 60.0, "s"),
    "dispatch_s": (0.0, 60.0, "s"),
    "per_call_s": (0.0, 60.0, "s"),
    "per_layer_s": (0.0, 60.0, "s"),
    "per_step_s": (0.0, 60.0, "s"),
    "alpha": (0.0, 60.0, "s"),
    # a link's β, seconds per byte: 0 (free) .. 1e-6 (1 MB/s)
    "beta": (0.0, 1e-6, "s/byte"),
    # an engine's share of the roofline, and its forward memory per byte of SPEC's activations
    "efficiency": (1e-6, 1e9, ""),
    "memory_factor": (1e-3, 1e3, ""),
    # a fused attention kernel's sustained FLOP/s (forward, backward), and the head width it was
    # measured at
    "forward": (1e9, 1e18, "FLOP/s"),
    "backward": (1e9, 1e18, "FLOP/s"),
    "head_dim": (1.0, 4096.0, ""),
    # a rollout engine's scheduler step (EngineStep): tokens and sequences per step
    "token_budget": (1.0, 1e8, "tokens"),
    "max_seqs": (1.0, 1e7, "sequences"),
}

#: The largest node :attr:`Hardware.gpus_per_node` describes.
MAX_GPUS_PER_NODE = 1024


def _num(x: float) -> str:
    """``1e+09`` as ``1e9``: a bound as a user would write it."""
    return re.sub(r"e\+?(-?)0*(\d)", r"e\1\2", f"{x:g}")


def figure_problem(key: str, value: object) -> str | None:
    """Why ``value`` is not a valid hardware figure ``key`` (:data:`FIGURE_RANGES`), or ``None``.

    Examples
    --------
    >>> figure_problem("peak_flops", 1e-300)
    'must be a number in [1e9, 1e18] FLOP/s'
    """
    lo, hi, unit = FIGURE_RANGES[key]
    if _is_number(value) and lo <= value <= hi:  # type: ignore[operator]
        return None
    return f"must be a number in [{_num(lo)}, {_num(hi)}]" + (f" {unit}" if unit else "")


def _check_figures(owner: str, obj: object, keys: tuple[str, ...]) -> None:
    """Raise ``ValueError`` naming ``owner``, the field and the value of the first figure of
    ``obj`` outside :data:`FIGURE_RANGES`."""
    for key in keys:
        value = getattr(obj, key)
        why = figure_problem(key, value)
        if why:
            raise ValueError(f"{owner}{key} {why}, got {value!r}")


@dataclass(frozen=True)
class Link:
    """Latency/bandwidth pair of the α–β model: a transfer of ``M`` bytes takes ``α + M·β``.

    Parameters
    ----------
    alpha
        Start-up latency in seconds.
    beta
        Seconds per byte (the inverse of the bandwidth).
    """

    alpha: float
    beta: float

    def __post_init__(self) -> None:
        # a Link is also the cost model's unit probe (α = 0, β = 1: coefficients of a fit), so it
        # checks only the sign; a Hardware holds its links to FIGURE_RANGES
        ok = all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0.0
            for v in (self.alpha, self.beta)
        )
        if not ok:
            raise ValueError(
                f"Link alpha and beta must be non-negative, got alpha={self.alpha!r}, beta={self.beta!r}"
            )


@dataclass(frozen=True)
class OpTerms:
    """What one engine adds to the cost model for one operation class (docs/cost-model.md §2).

    An OP node of the class takes ``T_gemm/η + c_call + n_pass·c_layer + n_step·c_step`` on top of
    SPEC's other terms (:func:`~rpeg.costmodel.time.op_time` counts ``n_pass`` and ``n_step``).

    Parameters
    ----------
    efficiency
        ``η_e > 0``: the share of the roofline ``F_eff`` the engine's kernels reach.
    per_call_s
        ``c_call``: fixed seconds per OP node (the engine's entry, batching, output gathering).
    per_layer_s
        ``c_layer``: fixed seconds per layer per forward-equivalent pass per microbatch (kernel
        launches, Python per module).
    per_step_s
        ``c_step``: fixed seconds per decode step per microbatch (scheduler, sampling); the
        prefill counts as one step.
    memory_factor
        ``μ > 0``: a no-grad forward pass's peak private memory per byte of SPEC's forward
        activations (``1``: SPEC's count of the tensors live at once). Used by the runtime's
        memory prediction of the inference engine's workers
        (:func:`rpeg.runtime.trace.report.predicted_memory`); fitted by ``rpeg calibrate --in-situ``.
    """

    efficiency: float = 1.0
    per_call_s: float = 0.0
    per_layer_s: float = 0.0
    per_step_s: float = 0.0
    memory_factor: float = 1.0

    def __post_init__(self) -> None:
        # the sign only, as Link; a Hardware holds its engines' terms to FIGURE_RANGES
        if not (_is_number(self.efficiency) and self.efficiency > 0):
            raise ValueError(f"OpTerms efficiency must be positive, got {self.efficiency!r}")
        if not (_is_number(self.memory_factor) and self.memory_factor > 0):
            raise ValueError(f"OpTerms memory_factor must be positive, got {self.memory_factor!r}")
        for name in ("per_call_s", "per_layer_s", "per_step_s"):
            value = getattr(self, name)
            if not (_is_number(value) and value >= 0):
                raise ValueError(f"OpTerms {name} must be non-negative, got {value!r}")


#: The neutral terms: SPEC's cost model unchanged.
NEUTRAL = OpTerms()


@dataclass(frozen=True)
class AttentionRate:
    """The sustained rate of the fused attention kernel the engines run (FlashAttention, cuDNN's
    fused attention through Transformer Engine) on one GPU, at one head width
    (``docs/cost-model.md`` §2 "The attention core").

    Parameters
    ----------
    head_dim
        The head width the rates were measured at.
    forward
        FLOP/s of the forward kernel, counting ``4·d_head·c`` per query and head at context ``c``
        (halved by a causal mask), as the kernel benchmarks count.
    backward
        FLOP/s of the backward kernel, counting 2.5 times the forward's FLOPs (its five matmuls
        against the forward's two), as the kernel benchmarks count.
    """

    head_dim: int
    forward: float
    backward: float

    def __post_init__(self) -> None:
        if isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int) or self.head_dim < 1:
            raise ValueError(f"AttentionRate head_dim must be a positive integer, got {self.head_dim!r}")
        _check_figures("AttentionRate ", self, ("forward", "backward"))


@dataclass(frozen=True)
class EngineTerms:
    """One engine's measured terms: an :class:`OpTerms` per operation class it was measured for,
    the link weights take into it (``α + bytes·β`` per weight sync; generation engines) and the
    link of its data-parallel update (training engines): ``(α, β)`` of each of the ReduceScatter
    of the gradients and the AllGather of the parameters as the engine runs them, priced with the
    ring formulas in place of the tier's ``collective`` link, and the link of its tensor-parallel
    AllReduces (generation engines: vLLM's own all-reduce between its ranks, in place of the
    tier-0 ``collective`` link in a generation node's ``T_tp``) (docs/cost-model.md §2, "Engine
    terms")."""

    name: str
    prefill: OpTerms | None = None
    decode: OpTerms | None = None
    inference: OpTerms | None = None
    training: OpTerms | None = None
    weight_sync: Link | None = None
    data_parallel: Link | None = None
    tensor_parallel: Link | None = None

    def classes(self) -> tuple[str, ...]:
        """The operation classes this engine has terms for."""
        return tuple(c for c in OP_CLASSES if getattr(self, c) is not None)


@dataclass(frozen=True)
class EngineStep:
    """A continuously batching rollout engine's scheduler step on a GPU (docs/cost-model.md §8,
    "The engine step"): what every step of vLLM V1's engine loop costs besides the roofline of
    its tokens, and how many tokens and sequences one step takes.

    A step processes at most ``B = token_budget`` tokens of at most ``S = max_seqs`` running
    sequences (one token per decoding sequence, the rest prefill chunks, vLLM's chunked prefill)
    and takes the roofline of those tokens plus ``c_step = step_s`` (scheduling, input
    preparation, sampling and output processing on the host; with :attr:`async_scheduling`
    only :meth:`exposed_step_s` of it) plus, without CUDA graphs, ``(L/Pp)·eager_layer_s`` of
    kernel launches on a decode-only step (a step with a prefill chunk hides them behind its
    GEMMs).

    Parameters
    ----------
    token_budget
        ``B``: tokens per step (vLLM ``max_num_batched_tokens``).
    max_seqs
        ``S``: sequences per step (vLLM ``max_num_seqs``).
    step_s
        ``c_step``: fixed seconds per step with CUDA graphs.
    eager_layer_s
        ``c_launch``: seconds of kernel launches per layer on a decode-only step without CUDA
        graphs (vLLM ``enforce_eager``).
    cuda_graphs
        Whether decode steps replay CUDA graphs (vLLM's default) or run eagerly.
    allreduce
        ``(α_ar, β_ar)`` of the engine's own one-kernel all-reduce between its tensor-parallel
        ranks on one node (vLLM's custom all-reduce over NVLink): one AllReduce of ``M`` bytes
        over ``p`` ranks takes ``α_ar + 2·((p − 1)/p)·M·β_ar`` (``None``: the tier-0
        ``collective`` link's ring prices every AllReduce; docs/cost-model.md §8, "The engine's
        all-reduce").
    allreduce_max_bytes
        The size of that kernel's buffer (vLLM's custom all-reduce ``max_size``): an AllReduce
        of fewer bytes runs on it, one of as many or more goes to NCCL, the tier-0 ring
        (``CustomAllreduce.should_custom_ar``: ``inp_size < self.max_size``).
    async_scheduling
        Whether the engine schedules step ``n + 1`` on the host while the GPU runs step ``n``
        (vLLM's ``--async-scheduling``: opt-in in v0.10–v0.11, on by default in later releases
        unless an option rules it out; ``SchedulerConfig.async_scheduling``): a step's ``c_step``
        is then hidden behind its GPU time but for :attr:`async_host_s`
        (:meth:`exposed_step_s`). ``True`` in the GPU presets: the bundled vLLM's default
        (``VllmConfig`` turns an unset ``async_scheduling`` on where the executor supports it),
        and verl sets nothing else; their ``c_step`` was measured on the synchronous loop, which
        ``False`` prices. The field's default, ``False``, is a file that does not say.
    async_host_s
        ``c_w``: the seconds of ``c_step`` that asynchronous scheduling leaves on the critical
        path (the worker's input preparation and the sampled tokens' bookkeeping between one
        step's kernels and the next; the scheduler's part runs ahead): with
        :attr:`async_scheduling` a step exposes ``min(c_w, c_step) + max(0, c_step − c_w − t_GPU)``
        (:meth:`exposed_step_s`). ``0``: everything hides. The presets' figure is fitted on
        published pairs of serving runs with and without the flag (docs/cost-model.md §8).
    weight_only_efficiency
        ``ε_w ∈ (0, 1]``: the share of ``F_peak`` the engine's weight-only MoE GEMMs (MXFP4
        experts run W4A16: Marlin on Ampere, OpenAI's Triton ``matmul_ogs`` on Hopper) reach
        once compute-bound; they dequantize every weight tile again for each tile of rows, on
        the CUDA cores, so many rows cost more than BF16 GEMMs of the same shape
        (docs/cost-model.md §11, "MXFP4 experts"). ``1``: no such loss.
    sink_attention_efficiency
        ``ε_s ∈ (0, 1]``: the share of its usual rate (the hardware's fused-attention forward
        rate, else ``F_peak``) the engine's attention kernel reaches for a model with attention
        sinks (:attr:`~rpeg.ir.models.ModelSpec.attention_sinks`) where the GPU's FlashAttention
        cannot serve them: vLLM runs gpt-oss on Ampere with its Triton attention kernel
        (``TRITON_ATTN``; FlashAttention-2 has no sinks), on Hopper and Blackwell with
        FlashAttention-3 and FlashInfer, which have them (docs/cost-model.md §8, "Attention
        sinks on the engine"). A decode step's kernel stays bound by its KV reads. ``1``: no
        such loss.
    """

    token_budget: int = 8192
    max_seqs: int = 1024
    step_s: float = 0.0
    eager_layer_s: float = 0.0
    cuda_graphs: bool = True
    allreduce: Link | None = None
    allreduce_max_bytes: int = 0
    weight_only_efficiency: float = 1.0
    async_scheduling: bool = False
    async_host_s: float = 0.0
    sink_attention_efficiency: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.async_scheduling, bool):
            raise ValueError(
                f"EngineStep async_scheduling must be true or false, got {self.async_scheduling!r}"
            )
        if not (_is_number(self.async_host_s) and self.async_host_s >= 0):
            raise ValueError(f"EngineStep async_host_s must be non-negative, got {self.async_host_s!r}")
        for name in ("weight_only_efficiency", "sink_attention_efficiency"):
            eff = getattr(self, name)
            if not (_is_number(eff) and 0.0 < eff <= 1.0):
                raise ValueError(f"EngineStep {name} must be in (0, 1], got {eff!r}")
        for name in ("token_budget", "max_seqs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"EngineStep {name} must be a positive integer, got {value!r}")
        for name in ("step_s", "eager_layer_s"):
            value = getattr(self, name)
            if not (_is_number(value) and value >= 0):
                raise ValueError(f"EngineStep {name} must be non-negative, got {value!r}")
        if not isinstance(self.cuda_graphs, bool):
            raise ValueError(f"EngineStep cuda_graphs must be true or false, got {self.cuda_graphs!r}")
        if self.allreduce is not None and not isinstance(self.allreduce, Link):
            raise ValueError(f"EngineStep allreduce must be a Link or None, got {self.allreduce!r}")
        size = self.allreduce_max_bytes
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"EngineStep allreduce_max_bytes must be a non-negative integer, got {size!r}")
        if (self.allreduce is None) != (size == 0):
            raise ValueError(
                "EngineStep allreduce and allreduce_max_bytes go together: an all-reduce link needs "
                f"the largest buffer it takes and a buffer size needs the link, got allreduce="
                f"{self.allreduce!r}, allreduce_max_bytes={size!r}"
            )

    def allreduce_link(self, ranks: int, nbytes: float) -> Link | None:
        """The engine's one-kernel all-reduce link for an AllReduce of ``nbytes`` over
        ``ranks``, or ``None`` (NCCL's ring then) when it has none, the buffer is not smaller
        than ``allreduce_max_bytes`` or the kernel does not run at that rank count
        (:data:`ENGINE_ALLREDUCE_RANKS`)."""
        if self.allreduce is None or ranks not in ENGINE_ALLREDUCE_RANKS:
            return None
        return self.allreduce if nbytes < self.allreduce_max_bytes else None

    def exposed_step_s(self, gpu_s: float = 0.0) -> float:
        """The host seconds of one step that the GPU waits for: ``c_step``, or with
        :attr:`async_scheduling` ``min(c_w, c_step) + max(0, c_step − c_w − t_GPU)`` for a step
        whose GPU work takes ``t_GPU = gpu_s`` seconds (the next step is scheduled while this
        one runs; ``c_w = async_host_s`` of it is not)."""
        if self.async_scheduling:
            unhidden = min(self.async_host_s, self.step_s)
            return unhidden + max(0.0, self.step_s - unhidden - gpu_s)
        return self.step_s

    def decode_step_s(self, layers: float, gpu_s: float = 0.0) -> float:
        """Fixed seconds of one decode-only step over ``layers = L/Pp`` layers whose GPU work
        takes ``gpu_s``: :meth:`exposed_step_s` with CUDA graphs, plus ``(L/Pp)·c_launch``
        without."""
        return self.exposed_step_s(gpu_s) + (0.0 if self.cuda_graphs else layers * self.eager_layer_s)


#: Each :class:`EngineStep` figure and the :data:`FIGURE_RANGES` entry that bounds it.
_STEP_FIGURES = {
    "token_budget": "token_budget",
    "max_seqs": "max_seqs",
    "step_s": "per_step_s",
    "eager_layer_s": "per_layer_s",
    "async_host_s": "per_step_s",
}


#: The :class:`Hardware` fields checked against :data:`FIGURE_RANGES`.
_HARDWARE_FIGURES = (
    "gpu_memory_bytes",
    "peak_flops",
    "mem_bandwidth",
    "gamma_m",
    "gamma_k",
    "c_nongemm",
    "b_cal",
    "l_cal",
    "d_cal",
    "dispatch_s",
    "host_bandwidth",
)
#: The figures of each link (tiers, engine links) and engine term a :class:`Hardware` holds.
_LINK_FIGURES = ("alpha", "beta")
_OP_FIGURES = ("efficiency", "per_call_s", "per_layer_s", "per_step_s", "memory_factor")


@dataclass(frozen=True)
class Hardware:
    """Per-GPU and interconnect figures of one cluster type.

    Parameters
    ----------
    name
        Preset or file name.
    gpu_memory_bytes
        ``M_GPU``, bytes of device memory per GPU.
    peak_flops
        ``F_peak``, dense BF16 FLOP/s per GPU the GEMMs can reach (already derated).
    peak_flops_fp8
        ``F_peak,8``, dense FP8 FLOP/s per GPU the GEMMs can reach, derated by the rule of
        ``peak_flops`` (``docs/cost-model.md`` §5, §11); ``None`` (the default, and A100's and the
        CPU's): no FP8 tensor cores, and a model with ``precision = "fp8"`` is refused
        (:func:`~rpeg.costmodel.precision.gemm_peaks`).
    peak_flops_fp4
        ``F_peak,4``, dense NVFP4 FLOP/s per GPU, derated by the same rule (Blackwell presets);
        ``None`` (the default): no FP4 tensor cores, and ``precision = "nvfp4"`` is refused.
    mem_bandwidth
        ``BW_mem``, HBM bytes/s per GPU.
    gamma_m, gamma_k
        GEMM-shape constants of ``η = (b·ℓ/(b·ℓ + γM))·(k/(k + γK))``.
    c_nongemm
        ``c_ng``, seconds of non-GEMM work (norms, softmax, elementwise) per layer at batch
        ``b_cal`` sequences, at the reference sequence length folded into the constant.
    b_cal
        ``B_cal``, the batch at which ``c_nongemm`` was measured.
    collective
        ``(α, β)`` of collectives at tiers 0, 1, 2.
    p2p
        ``(α, β)`` of point-to-point transfers at tiers 0, 1, 2.
    memory_headroom
        ``ε``; usable memory is ``M_eff = (1 − ε)·M_GPU``.
    gpus_per_node
        The node size this hardware ships in (a default for cluster shapes).
    l_cal, d_cal
        ``ℓ_cal`` and ``d_cal``: tokens per sequence and hidden width at which ``c_nongemm`` was
        measured (non-GEMM work scales with the tokens·width a device processes).
    dispatch_s
        Fixed seconds the controller spends dispatching one OP or COMM node (0 in presets).
    kv_memory_fraction
        The rollout engine's default memory fraction ``u`` (SPEC §14.5): what a generation
        whose strategy names none holds per device, and the largest fraction the planner
        considers. Default 0.9, vLLM's ``gpu_memory_utilization`` default
        (``vllm/engine/arg_utils.py``, ``EngineArgs.gpu_memory_utilization``).
    host_bandwidth
        ``BW_host``, bytes/s per GPU and direction between device and host memory (SPEC §14.4:
        what host offload and sleep/wake colocation move). Default ``50.4e9``: PCIe 5.0 ×16,
        32 GT/s × 16 lanes × 128/130 = 63 GB/s per direction, at the presets' 0.8 of line
        rate (PCI-SIG, PCIe 5.0 base specification; the host link of H100, H200 and H20).
    engines
        Measured :class:`EngineTerms` (none in presets).
    engine_for
        ``(generation, inference, training)`` engine names; ``""`` for SPEC's terms.
    rollout_step
        The rollout engine's scheduler step (:class:`EngineStep`) on this GPU: its token budget,
        sequence cap and fixed seconds per step. ``None`` (the CPU preset, calibrated files):
        the prefill is one step and the per-step costs are the calibrated engine terms alone.
    sources
        Where each figure comes from (``"collective.inter-node": "NVIDIA DGX A100 user guide …"``).
    attention
        Measured :class:`AttentionRate` of the fused attention kernel at one or more head widths
        (increasing); empty: the attention core runs at the GEMM roofline.
    expert_efficiency
        ``ε_e`` ∈ (0, 1]: a mixture of experts' routed-expert GEMMs in a training or teacher-forced
        pass run at ``ε_e`` times the shape rule's rate (``η_e``'s compute end; its row knee moves
        with it, ``ε_e·r_e/(r_e + ε_e·γM)``), standing for the expert layer's grouped GEMMs and
        the work around them that the model does not price apart (``docs/cost-model.md`` §9,
        "The expert layer's efficiency"). Default 1 (none: calibrated files and the CPU preset);
        the GPU presets carry one fitted figure. A generation engine's experts keep their own
        (``EngineStep.weight_only_efficiency``).
    """

    name: str
    gpu_memory_bytes: float
    peak_flops: float
    mem_bandwidth: float
    gamma_m: float
    gamma_k: float
    c_nongemm: float
    b_cal: float
    collective: tuple[Link, Link, Link]
    p2p: tuple[Link, Link, Link]
    memory_headroom: float = 0.10
    gpus_per_node: int = 8
    notes: str = field(default="", compare=False)
    l_cal: float = 640.0
    d_cal: float = 4096.0
    dispatch_s: float = 0.0
    kv_memory_fraction: float = 0.9
    host_bandwidth: float = DEFAULT_HOST_BANDWIDTH
    engines: tuple[EngineTerms, ...] = ()
    engine_for: tuple[str, str, str] = ("", "", "")
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    attention: tuple[AttentionRate, ...] = ()
    peak_flops_fp8: float | None = None
    rollout_step: EngineStep | None = None
    peak_flops_fp4: float | None = None
    expert_efficiency: float = 1.0

    def __post_init__(self) -> None:
        _check_figures(f"Hardware {self.name!r}: ", self, _HARDWARE_FIGURES)
        for low in ("peak_flops_fp8", "peak_flops_fp4"):
            if getattr(self, low) is not None:
                _check_figures(f"Hardware {self.name!r}: ", self, (low,))
        if self.rollout_step is not None:
            step = self.rollout_step
            for key, figure in _STEP_FIGURES.items():
                why = figure_problem(figure, getattr(step, key))
                if why:
                    raise ValueError(
                        f"Hardware {self.name!r}: rollout_step.{key} {why}, got {getattr(step, key)!r}"
                    )
            if step.allreduce is not None:
                _check_figures(
                    f"Hardware {self.name!r}: rollout_step.allreduce.", step.allreduce, _LINK_FIGURES
                )
        rates = []
        for i, r in enumerate(self.attention):
            try:
                rates.append(r if isinstance(r, AttentionRate) else AttentionRate(*r))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"Hardware {self.name!r}: attention[{i}]: {exc}") from None
        widths = [r.head_dim for r in rates]
        if widths != sorted(set(widths)):
            raise ValueError(
                f"Hardware {self.name!r}: attention rates must have increasing, distinct head_dim, got {widths}"
            )
        object.__setattr__(self, "attention", tuple(rates))
        n = self.gpus_per_node
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_GPUS_PER_NODE:
            raise ValueError(
                f"Hardware {self.name!r}: gpus_per_node must be an integer in [1, {MAX_GPUS_PER_NODE}], got {n!r}"
            )
        if not (_is_number(self.expert_efficiency) and 0.0 < self.expert_efficiency <= 1.0):
            raise ValueError(
                f"Hardware {self.name!r}: expert_efficiency must be in (0, 1], got {self.expert_efficiency!r}"
            )
        if not (_is_number(self.kv_memory_fraction) and 0.0 < self.kv_memory_fraction <= 1.0):
            raise ValueError(
                f"Hardware {self.name!r}: kv_memory_fraction must be in (0, 1], got {self.kv_memory_fraction!r}"
            )
        if not (_is_number(self.memory_headroom) and 0.0 <= self.memory_headroom < 1.0):
            raise ValueError(
                f"Hardware {self.name!r}: memory_headroom must be in [0, 1), got {self.memory_headroom!r}"
            )
        for name in ("collective", "p2p"):
            links = getattr(self, name)
            if len(links) != 3:
                raise ValueError(f"Hardware {self.name!r}: {name} needs 3 tiers, got {len(links)}")
            tiers = []
            for i, lk in enumerate(links):
                try:
                    tiers.append(lk if isinstance(lk, Link) else Link(*lk))
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"Hardware {self.name!r}: {name}[{i}]: {exc}") from None
                _check_figures(f"Hardware {self.name!r}: {name}[{i}].", tiers[-1], _LINK_FIGURES)
            object.__setattr__(self, name, tuple(tiers))
        object.__setattr__(self, "engines", tuple(self.engines))
        for e in self.engines:
            for c in e.classes():
                _check_figures(f"Hardware {self.name!r}: engines.{e.name}.{c}.", getattr(e, c), _OP_FIGURES)
            for kind in ("weight_sync", "data_parallel", "tensor_parallel"):
                if getattr(e, kind) is not None:
                    _check_figures(
                        f"Hardware {self.name!r}: engines.{e.name}.{kind}.", getattr(e, kind), _LINK_FIGURES
                    )
        object.__setattr__(self, "engine_for", tuple(self.engine_for))
        object.__setattr__(self, "sources", tuple(tuple(kv) for kv in self.sources))
        names = [e.name for e in self.engines]
        if len(set(names)) != len(names):
            raise ValueError(f"Hardware {self.name!r}: engine names repeat: {names}")
        if len(self.engine_for) != 3:
            raise ValueError(
                f"Hardware {self.name!r}: engine_for needs 3 names {ENGINE_ROLES}, got {self.engine_for!r}"
            )
        for role, engine in zip(ENGINE_ROLES, self.engine_for):
            if engine and engine not in names:
                raise ValueError(
                    f"Hardware {self.name!r}: engine_for.{role} = {engine!r} has no measured terms "
                    f"(engines: {', '.join(names) or 'none'})"
                )

    # ------------------------------------------------------------------ engine terms
    def with_rollout_scheduling(self, asynchronous: bool) -> Hardware:
        """This hardware with its rollout engine scheduling asynchronously (``True``: vLLM's
        default since PR #27614, the presets') or on the synchronous loop (``False``: vLLM
        before it, which exposes every step's ``c_step``); :attr:`EngineStep.async_scheduling`.

        Raises
        ------
        ValueError
            If the hardware has no :class:`EngineStep` (a calibrated CPU file: its prefill and
            decode terms are fitted in situ and carry no step of a GPU engine), or
            ``asynchronous`` is not a bool.
        """
        if not isinstance(asynchronous, bool):
            raise ValueError(
                f"rollout scheduling must be asynchronous (true) or not (false), got {asynchronous!r}"
            )
        if self.rollout_step is None:
            raise ValueError(
                f"hardware {self.name!r} has no rollout engine step (rollout_step): its generation "
                "terms are the calibrated ones, and the rollout scheduling applies to a GPU preset or "
                "a hardware file with a rollout_step"
            )
        return replace(self, rollout_step=replace(self.rollout_step, async_scheduling=asynchronous))

    def engine(self, role: str) -> EngineTerms | None:
        """The :class:`EngineTerms` of the engine that runs ``role`` (``None``: SPEC's terms)."""
        name = self.engine_for[ENGINE_ROLES.index(role)]
        return next((e for e in self.engines if e.name == name), None) if name else None

    def terms(self, op_class: str) -> OpTerms:
        """The :class:`OpTerms` of ``op_class`` for the engine that runs it; neutral when that
        engine has none (a preset, or a class the calibration did not measure)."""
        role = "generation" if op_class in ("prefill", "decode") else op_class
        eng = self.engine(role)
        found = getattr(eng, op_class) if eng is not None else None
        return found if found is not None else NEUTRAL

    def weight_sync(self) -> Link | None:
        """The generation engine's weight-sync link, if it has one."""
        eng = self.engine("generation")
        return eng.weight_sync if eng is not None else None

    def data_parallel(self) -> Link | None:
        """The training engine's data-parallel update link, if it has one (``None``: the tier's
        ``collective`` link prices ``T_dp``)."""
        eng = self.engine("training")
        return eng.data_parallel if eng is not None else None

    def tensor_parallel(self) -> Link | None:
        """The generation engine's tensor-parallel AllReduce link, if it has one (``None``: the
        tier-0 ``collective`` link prices a generation node's ``T_tp``)."""
        eng = self.engine("generation")
        return eng.tensor_parallel if eng is not None else None

    def with_engine(self, engine: EngineTerms) -> Hardware:
        """A copy whose engine of ``engine.name`` is ``engine`` (terms replaced, not merged).

        Raises
        ------
        ValueError
            If the hardware has no engine of that name.
        """
        if all(e.name != engine.name for e in self.engines):
            raise ValueError(
                f"Hardware.with_engine: no engine {engine.name!r} "
                f"(engines: {', '.join(e.name for e in self.engines) or 'none'})"
            )
        return replace(self, engines=tuple(engine if e.name == engine.name else e for e in self.engines))

    def using(self, **roles: str) -> Hardware:
        """A copy whose ``engine_for`` names ``roles`` (``generation="vllm"``); an engine without
        measured terms gives SPEC's terms for its role (``""``).

        Raises
        ------
        ValueError
            For a role outside :data:`ENGINE_ROLES`.
        """
        bad = set(roles) - set(ENGINE_ROLES)
        if bad:
            raise ValueError(
                f"Hardware.using: unknown role(s) {sorted(bad)}; roles: {', '.join(ENGINE_ROLES)}"
            )
        names = {e.name for e in self.engines}
        chosen = list(self.engine_for)
        for role, engine in roles.items():
            chosen[ENGINE_ROLES.index(role)] = engine if engine in names else ""
        return replace(self, engine_for=tuple(chosen))  # type: ignore[arg-type]

    def attention_rates(self, head_dim: float) -> tuple[float, float] | None:
        """``(r_fwd, r_bwd)``, the fused attention kernel's FLOP/s at head width ``head_dim``:
        linear in the head width between the two measured widths around it, the nearest one's
        outside them; ``None`` when the hardware has no measured rates (the attention core then
        runs at the GEMM roofline, SPEC's model).
        """
        rates = self.attention
        if not rates:
            return None
        if head_dim <= rates[0].head_dim:
            return rates[0].forward, rates[0].backward
        for lo, hi in zip(rates, rates[1:]):
            if head_dim <= hi.head_dim:
                w = (head_dim - lo.head_dim) / (hi.head_dim - lo.head_dim)
                return (
                    lo.forward + w * (hi.forward - lo.forward),
                    lo.backward + w * (hi.backward - lo.backward),
                )
        return rates[-1].forward, rates[-1].backward

    @property
    def m_eff(self) -> float:
        """Usable memory per GPU, ``M_eff = (1 − ε)·M_GPU`` (SPEC §6)."""
        return (1.0 - self.memory_headroom) * self.gpu_memory_bytes

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, object]:
        """JSON-ready form; the inverse of :meth:`from_dict`."""
        d = asdict(self)
        d["format"] = FORMAT
        d["collective"] = [{"tier": TIER_NAMES[i], **asdict(lk)} for i, lk in enumerate(self.collective)]
        d["p2p"] = [{"tier": TIER_NAMES[i], **asdict(lk)} for i, lk in enumerate(self.p2p)]
        engines: dict[str, dict[str, object]] = {}
        for e in self.engines:
            entry: dict[str, object] = {c: asdict(getattr(e, c)) for c in e.classes()}
            for link in ("weight_sync", "data_parallel", "tensor_parallel"):
                if getattr(e, link) is not None:
                    entry[link] = asdict(getattr(e, link))
            engines[e.name] = entry
        d["engines"] = engines
        d["engine_for"] = dict(zip(ENGINE_ROLES, self.engine_for))
        d["sources"] = dict(self.sources)
        d["attention"] = [asdict(a) for a in self.attention]
        if not self.attention:  # no measured attention kernel: the file says nothing (as before)
            del d["attention"]
        if self.peak_flops_fp8 is None:  # no FP8 tensor cores: the file says nothing (as before)
            del d["peak_flops_fp8"]
        if self.peak_flops_fp4 is None:  # no FP4 tensor cores: the file says nothing (as before)
            del d["peak_flops_fp4"]
        if self.expert_efficiency == 1.0:  # no expert-layer loss: the file says nothing (as before)
            del d["expert_efficiency"]
        if self.rollout_step is None:
            del d["rollout_step"]
        else:
            if self.rollout_step.allreduce is None:  # no engine all-reduce: the file says nothing
                del d["rollout_step"]["allreduce"], d["rollout_step"]["allreduce_max_bytes"]
            if self.rollout_step.weight_only_efficiency == 1.0:  # no weight-only loss: likewise
                del d["rollout_step"]["weight_only_efficiency"]
            if not self.rollout_step.async_scheduling:  # the synchronous loop: likewise
                del d["rollout_step"]["async_scheduling"]
            if self.rollout_step.async_host_s == 0.0:  # everything hides: likewise
                del d["rollout_step"]["async_host_s"]
            if self.rollout_step.sink_attention_efficiency == 1.0:  # no sink-kernel loss: likewise
                del d["rollout_step"]["sink_attention_efficiency"]
        return d

    @classmethod
    def from_dict(cls, data: object, source: str = "<dict>") -> Hardware:
        """Build from the form :meth:`to_dict` writes, strictly (:class:`_HardwareFile`).

        Raises
        ------
        InputError
            If a field is missing, unknown, of the wrong type (a string where a number belongs)
            or out of range (a negative bandwidth); the message names ``source``, the tier and
            the field.
        """
        if isinstance(data, dict) and data.get("format", "rpeg.hardware/1") == "rpeg.hardware/1":
            raise InputError(
                f"{source}: format 'rpeg.hardware/1' is no longer read: since {FORMAT} the non-GEMM constant "
                "c_nongemm is charged per token and needs the reference it was measured at (fields l_cal, "
                "tokens per sequence, and d_cal, hidden width). Re-run `rpeg calibrate --out FILE`, or add "
                f'"l_cal" and "d_cal" and set "format": "{FORMAT}" (docs/cost-model.md §5).',
                source=source,
            )
        doc = validate(_HardwareFile, data, source)
        try:
            return cls(
                name=doc.name,
                gpu_memory_bytes=doc.gpu_memory_bytes,
                peak_flops=doc.peak_flops,
                mem_bandwidth=doc.mem_bandwidth,
                gamma_m=doc.gamma_m,
                gamma_k=doc.gamma_k,
                c_nongemm=doc.c_nongemm,
                b_cal=doc.b_cal,
                collective=tuple(Link(lk.alpha, lk.beta) for lk in doc.collective),  # type: ignore[arg-type]
                p2p=tuple(Link(lk.alpha, lk.beta) for lk in doc.p2p),  # type: ignore[arg-type]
                memory_headroom=doc.memory_headroom,
                gpus_per_node=doc.gpus_per_node,
                notes=doc.notes,
                l_cal=doc.l_cal,
                d_cal=doc.d_cal,
                dispatch_s=doc.dispatch_s,
                kv_memory_fraction=doc.kv_memory_fraction,
                host_bandwidth=doc.host_bandwidth,
                engines=tuple(
                    EngineTerms(
                        name,
                        **{
                            c: OpTerms(**getattr(e, c).model_dump())
                            for c in OP_CLASSES
                            if getattr(e, c) is not None
                        },
                        weight_sync=None
                        if e.weight_sync is None
                        else Link(e.weight_sync.alpha, e.weight_sync.beta),
                        data_parallel=None
                        if e.data_parallel is None
                        else Link(e.data_parallel.alpha, e.data_parallel.beta),
                        tensor_parallel=None
                        if e.tensor_parallel is None
                        else Link(e.tensor_parallel.alpha, e.tensor_parallel.beta),
                    )
                    for name, e in doc.engines.items()
                ),
                engine_for=(doc.engine_for.generation, doc.engine_for.inference, doc.engine_for.training),
                sources=tuple(doc.sources.items()),
                attention=tuple(AttentionRate(a.head_dim, a.forward, a.backward) for a in doc.attention),
                peak_flops_fp8=doc.peak_flops_fp8,
                peak_flops_fp4=doc.peak_flops_fp4,
                expert_efficiency=doc.expert_efficiency,
                rollout_step=None if doc.rollout_step is None else _engine_step(doc.rollout_step),
            )
        except ValueError as exc:
            raise InputError(f"{source}: {exc}", source=source) from None

    def save(self, path: str | Path) -> None:
        """Write the JSON form to ``path``."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Hardware:
        """Read a hardware JSON file written by :meth:`save` or by calibration.

        Raises
        ------
        InputError
            If the file is missing, not JSON, or fails :meth:`from_dict`'s checks.
        """
        return cls.from_dict(read_json(path, "hardware file"), source=str(path))


# ---------------------------------------------------------------------------- the JSON file
def _figure(key: str) -> object:
    """The schema type of hardware figure ``key``: a finite number in :data:`FIGURE_RANGES`."""

    def check(value: float) -> float:
        why = figure_problem(key, value)
        if why:
            raise ValueError(why)
        return value

    return Annotated[float, AfterValidator(check)]


Alpha = _figure("alpha")
Beta = _figure("beta")


class _LinkEntry(Strict):
    tier: Literal["intra-node", "inter-node", "inter-rack"] | None = None
    alpha: Alpha
    beta: Beta


def _in_tier_order(links: list[_LinkEntry]) -> list[_LinkEntry]:
    for i, lk in enumerate(links):
        if lk.tier is not None and lk.tier != TIER_NAMES[i]:
            raise ValueError(f"entry {i} must be tier {TIER_NAMES[i]!r}, got {lk.tier!r}")
    return links


Tiers = Annotated[list[_LinkEntry], Field(min_length=3, max_length=3), AfterValidator(_in_tier_order)]


class _OpTermsEntry(Strict):
    efficiency: _figure("efficiency") = 1.0  # type: ignore[valid-type]
    per_call_s: _figure("per_call_s") = 0.0  # type: ignore[valid-type]
    per_layer_s: _figure("per_layer_s") = 0.0  # type: ignore[valid-type]
    per_step_s: _figure("per_step_s") = 0.0  # type: ignore[valid-type]
    memory_factor: _figure("memory_factor") = 1.0  # type: ignore[valid-type]


class _SyncEntry(Strict):
    alpha: Alpha
    beta: Beta


class _EngineEntry(Strict):
    prefill: _OpTermsEntry | None = None
    decode: _OpTermsEntry | None = None
    inference: _OpTermsEntry | None = None
    training: _OpTermsEntry | None = None
    weight_sync: _SyncEntry | None = None
    data_parallel: _SyncEntry | None = None
    tensor_parallel: _SyncEntry | None = None


class _RolloutStepEntry(Strict):
    token_budget: Annotated[int, Field(ge=1, le=10**8)]
    max_seqs: Annotated[int, Field(ge=1, le=10**7)]
    step_s: _figure("per_step_s")  # type: ignore[valid-type]
    eager_layer_s: _figure("per_layer_s")  # type: ignore[valid-type]
    cuda_graphs: bool = True
    allreduce: _SyncEntry | None = None
    allreduce_max_bytes: Annotated[int, Field(ge=0, le=2**40)] = 0
    weight_only_efficiency: Annotated[float, Field(gt=0, le=1)] = 1.0
    async_scheduling: bool = False
    async_host_s: _figure("per_step_s") = 0.0  # type: ignore[valid-type]
    sink_attention_efficiency: Annotated[float, Field(gt=0, le=1)] = 1.0


def _engine_step(entry: _RolloutStepEntry) -> EngineStep:
    """The :class:`EngineStep` of a file's ``rollout_step`` entry."""
    fields = entry.model_dump()
    link = entry.allreduce
    fields["allreduce"] = None if link is None else Link(link.alpha, link.beta)
    return EngineStep(**fields)


class _EngineFor(Strict):
    generation: str = ""
    inference: str = ""
    training: str = ""


class _AttentionEntry(Strict):
    head_dim: Annotated[int, Field(ge=1, le=4096)]
    forward: _figure("forward")  # type: ignore[valid-type]
    backward: _figure("backward")  # type: ignore[valid-type]


class _HardwareFile(Strict):
    """Schema of ``rpeg.hardware/2``: every figure a finite number in its plausible range
    (:data:`FIGURE_RANGES`)."""

    format: Literal["rpeg.hardware/2"]
    name: Annotated[str, Field(min_length=1)]
    gpu_memory_bytes: _figure("gpu_memory_bytes")  # type: ignore[valid-type]
    peak_flops: _figure("peak_flops")  # type: ignore[valid-type]
    peak_flops_fp8: _figure("peak_flops_fp8") | None = None  # type: ignore[valid-type]
    peak_flops_fp4: _figure("peak_flops_fp4") | None = None  # type: ignore[valid-type]
    mem_bandwidth: _figure("mem_bandwidth")  # type: ignore[valid-type]
    gamma_m: _figure("gamma_m")  # type: ignore[valid-type]
    gamma_k: _figure("gamma_k")  # type: ignore[valid-type]
    c_nongemm: _figure("c_nongemm")  # type: ignore[valid-type]
    b_cal: _figure("b_cal")  # type: ignore[valid-type]
    collective: Tiers
    p2p: Tiers
    memory_headroom: Annotated[float, Field(ge=0, lt=1)] = 0.10
    gpus_per_node: Annotated[int, Field(ge=1, le=MAX_GPUS_PER_NODE)] = 8
    notes: str = ""
    l_cal: _figure("l_cal")  # type: ignore[valid-type]
    d_cal: _figure("d_cal")  # type: ignore[valid-type]
    dispatch_s: _figure("dispatch_s") = 0.0  # type: ignore[valid-type]
    kv_memory_fraction: Annotated[float, Field(gt=0, le=1)] = 0.9
    host_bandwidth: _figure("host_bandwidth") = DEFAULT_HOST_BANDWIDTH  # type: ignore[valid-type]
    engines: dict[str, _EngineEntry] = Field(default_factory=dict)
    engine_for: _EngineFor = _EngineFor()
    sources: dict[str, str] = Field(default_factory=dict)
    attention: list[_AttentionEntry] = Field(default_factory=list)
    rollout_step: _RolloutStepEntry | None = None
    expert_efficiency: Annotated[float, Field(gt=0, le=1)] = 1.0

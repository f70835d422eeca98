"""Calibration: measure the cost model's hardware figures on the machine at hand (SPEC §6).

Microbenchmarks, each fitted to the formula the cost model uses, produce a
:class:`~rpeg.ir.hardware.Hardware` in the ``rpeg.hardware/1`` format:

* **GEMM-shape sweep** → ``F_peak, γM, γK``: ``torch.matmul`` of ``(M × K) @ (K × n)`` over a grid
  of ``M = b·ℓ`` and ``K``, fitted to ``F = F_peak·(M/(M + γM))·(K/(K + γK))`` (:func:`fit_gemm`).
* **Memory copy** → ``BW_mem = 2·bytes/t`` (bytes read plus bytes written) of a large tensor copy.
* **Non-GEMM work** → ``c_ng`` at ``B_cal``: two RMSNorms, the causal softmax of the attention
  scores, ``SiLU(gate)·up`` and two residual adds of one transformer layer's forward pass at
  ``B_cal`` sequences of a reference length (:class:`NonGemmShape`).
* **Collectives and P2P** → ``(α, β)`` of tier 0: ``p`` processes on this host
  (``torch.multiprocessing``, gloo on CPU, NCCL on GPUs) time AllReduce, AllGather, ReduceScatter,
  AlltoAll and ping-pong send/recv over a range of message sizes; ``α`` and ``β`` come from least
  squares on the α- and β-coefficient columns of the SPEC formulas (:func:`fit_alpha_beta`).

One machine only reaches tier 0 (inside a node). Tiers 1 and 2, and the memory figures on CPU,
are copied from the ``base`` hardware; the result's ``notes`` list every figure as measured or
inherited.

The CPU path (``device="cpu"``, float32 as the CPU runtime computes, gloo) is the one exercised
by the tests. The GPU path (``device="cuda"``: bfloat16 GEMMs and non-GEMM work, NCCL, one
process per GPU) follows the same code but is **untested here**: no GPU was available when it
was written.

Importing this module does not import torch; the measuring functions do.

Example
-------
>>> from rpeg.costmodel.calibrate import calibrate          # doctest: +SKIP
>>> report = calibrate(quick=True, max_ranks=2)              # doctest: +SKIP
>>> print(report.table()); report.hardware.save("hw.json")   # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..ir.errors import InputError, check_output
from ..ir.hardware import TIER_NAMES, Hardware, Link
from .hardware import load_hardware

__all__ = [
    "COLLECTIVES",
    "DEVICES",
    "CalibrationReport",
    "CommSample",
    "CopySample",
    "GemmFit",
    "GemmSample",
    "LinkFit",
    "NonGemmShape",
    "calibrate",
    "comm_coefficients",
    "fit_alpha_beta",
    "fit_gemm",
    "gemm_efficiency",
    "measure_comm",
    "measure_copy",
    "measure_gemm",
    "measure_nongemm",
    "register_cli",
]

#: Devices :func:`calibrate` knows.
DEVICES = ("cpu", "cuda")
#: Collective primitives timed (P2P is timed separately, as ``"p2p"``).
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall")

KIB = 1024
MIB = 1024 * KIB

Progress = Callable[[str], None]


# ---------------------------------------------------------------------------- data
@dataclass(frozen=True)
class GemmSample:
    """One timed ``(M × K) @ (K × n)`` matmul: ``2·M·K·n`` FLOPs in ``seconds`` (median)."""

    m: int
    k: int
    n: int
    seconds: float

    @property
    def flops_per_s(self) -> float:
        """Achieved ``2·M·K·n/t``."""
        return 2.0 * self.m * self.k * self.n / self.seconds


@dataclass(frozen=True)
class CopySample:
    """One timed copy of ``nbytes`` into another buffer (``2·nbytes`` of memory traffic)."""

    nbytes: int
    seconds: float

    @property
    def bandwidth(self) -> float:
        """``2·nbytes/t`` (bytes read plus bytes written per second)."""
        return 2.0 * self.nbytes / self.seconds


@dataclass(frozen=True)
class CommSample:
    """One timed collective or P2P transfer: median ``seconds`` for ``p`` ranks and ``nbytes``.

    ``nbytes`` follows :mod:`.collectives`: the per-rank buffer (AllReduce, ReduceScatter input),
    the gathered buffer (AllGather), all bytes a rank exchanges (AlltoAll), the payload (P2P).
    """

    primitive: str
    p: int
    nbytes: int
    seconds: float


@dataclass(frozen=True)
class NonGemmShape:
    """The layer whose non-GEMM work defines ``c_ng`` (SPEC §6).

    Parameters
    ----------
    hidden, ffn_hidden, heads
        ``d``, ``dff`` and the attention heads of the layer.
    seq_len
        Reference sequence length ``ℓ_ref`` folded into ``c_ng``.
    batch
        ``B_cal``, sequences per timed layer.
    """

    hidden: int = 256
    ffn_hidden: int = 688
    heads: int = 4
    seq_len: int = 128
    batch: int = 4

    def __post_init__(self) -> None:
        for name in ("hidden", "ffn_hidden", "heads", "seq_len", "batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"NonGemmShape: {name} must be a positive integer, got {value!r}")


#: Default non-GEMM layer per device: a tiny CPU-runtime layer, a Llama-2-7B layer on GPUs
#: (``d = 4096`` at ``8 × 640`` tokens, as the GPU presets' nominal ``c_ng`` assumes).
DEFAULT_NONGEMM = {
    "cpu": NonGemmShape(),
    "cuda": NonGemmShape(hidden=4096, ffn_hidden=11008, heads=32, seq_len=640, batch=8),
}


@dataclass(frozen=True)
class GemmFit:
    """Fitted ``F = F_peak·(M/(M + γM))·(K/(K + γK))`` with its relative RMS residual."""

    peak_flops: float
    gamma_m: float
    gamma_k: float
    rel_rms: float
    n_samples: int


@dataclass(frozen=True)
class LinkFit:
    """Fitted ``t = a·α + b·β`` with its relative RMS residual."""

    alpha: float
    beta: float
    rel_rms: float
    n_samples: int

    @property
    def link(self) -> Link:
        """The fitted pair as a :class:`~rpeg.ir.hardware.Link`."""
        return Link(self.alpha, self.beta)


@dataclass
class CalibrationReport:
    """What :func:`calibrate` measured and fitted.

    Attributes
    ----------
    hardware
        The fitted hardware description (save it with :meth:`Hardware.save`).
    device
        ``"cpu"`` or ``"cuda"``.
    quick
        Whether the reduced sweep ran.
    dtype
        Dtype of the GEMM and non-GEMM timings.
    threads
        ``torch.get_num_threads()`` of the measuring process.
    gemm, gemm_fit
        GEMM samples and the shape-efficiency fit.
    copies
        Memory-copy samples (one per repeat); ``BW_mem`` is the median bandwidth.
    nongemm_shape, nongemm_seconds
        The non-GEMM layer and its per-repeat times; ``c_ng`` is the median.
    comm
        Collective and P2P samples (empty when none could be measured).
    collective_fit, p2p_fit
        Tier-0 ``(α, β)`` fits over all collective samples and over P2P samples (``None`` when
        not measured).
    primitive_fits
        ``(α, β)`` per collective primitive, for inspection (not written to the hardware file).
    unsupported
        Primitives the backend refused.
    measured, inherited
        Hardware fields measured here, and those copied from ``base``.
    elapsed
        Wall-clock seconds of the whole calibration.
    """

    hardware: Hardware
    device: str
    quick: bool
    dtype: str
    threads: int
    gemm: list[GemmSample]
    gemm_fit: GemmFit
    copies: list[CopySample]
    nongemm_shape: NonGemmShape
    nongemm_seconds: list[float]
    comm: list[CommSample]
    collective_fit: LinkFit | None
    p2p_fit: LinkFit | None
    primitive_fits: dict[str, LinkFit] = field(default_factory=dict)
    unsupported: tuple[str, ...] = ()
    measured: tuple[str, ...] = ()
    inherited: tuple[str, ...] = ()
    elapsed: float = 0.0

    @property
    def copy_spread(self) -> float:
        """Relative RMS deviation of the copy bandwidths from their median."""
        return _spread([s.bandwidth for s in self.copies])

    @property
    def nongemm_spread(self) -> float:
        """Relative RMS deviation of the non-GEMM times from their median."""
        return _spread(self.nongemm_seconds)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready raw measurements, fits and the hardware (``rpeg.calibration/1``)."""

        def fit(f: object) -> object:
            return None if f is None else asdict(f)  # type: ignore[call-overload]

        return {
            "format": "rpeg.calibration/1",
            "device": self.device,
            "quick": self.quick,
            "dtype": self.dtype,
            "threads": self.threads,
            "elapsed_s": self.elapsed,
            "hardware": self.hardware.to_dict(),
            "gemm": [asdict(s) for s in self.gemm],
            "gemm_fit": fit(self.gemm_fit),
            "copies": [asdict(s) for s in self.copies],
            "nongemm_shape": asdict(self.nongemm_shape),
            "nongemm_seconds": list(self.nongemm_seconds),
            "comm": [asdict(s) for s in self.comm],
            "collective_fit": fit(self.collective_fit),
            "p2p_fit": fit(self.p2p_fit),
            "primitive_fits": {k: asdict(v) for k, v in self.primitive_fits.items()},
            "unsupported": list(self.unsupported),
            "measured": list(self.measured),
            "inherited": list(self.inherited),
        }

    def table(self) -> str:
        """A plain-text table of the fitted figures, their fit errors and where they come from."""
        hw = self.hardware
        g = self.gemm_fit
        rows: list[tuple[str, str, str, str]] = [
            (
                "F_peak",
                f"{hw.peak_flops / 1e9:.3g} GFLOP/s",
                "measured",
                f"fit {g.rel_rms:.1%}, {g.n_samples} shapes",
            ),
            ("γM", f"{hw.gamma_m:.3g}", "measured", "same fit"),
            ("γK", f"{hw.gamma_k:.3g}", "measured", "same fit"),
            (
                "BW_mem",
                f"{hw.mem_bandwidth / 1e9:.3g} GB/s",
                "measured",
                f"spread {self.copy_spread:.1%}, {len(self.copies)} copies",
            ),
            (
                "c_ng",
                f"{hw.c_nongemm * 1e3:.3g} ms/layer",
                "measured",
                f"spread {self.nongemm_spread:.1%}, {len(self.nongemm_seconds)} runs",
            ),
            ("B_cal", f"{hw.b_cal:g} seq × {self.nongemm_shape.seq_len} tok", "measured", "(definition)"),
        ]
        for kind, fitted in (("collective", self.collective_fit), ("p2p", self.p2p_fit)):
            links = getattr(hw, kind)
            for tier, lk in enumerate(links):
                src = "measured" if tier == 0 and fitted is not None else "inherited"
                err = f"fit {fitted.rel_rms:.1%}, {fitted.n_samples} points" if src == "measured" else ""
                rows.append(
                    (
                        f"{kind} t{tier}",
                        f"α {lk.alpha * 1e6:.3g} µs, 1/β {_bandwidth(lk.beta)}",
                        src,
                        err,
                    )
                )
        for name, f in self.primitive_fits.items():
            rows.append(
                (
                    f"  {name} t0",
                    f"α {f.alpha * 1e6:.3g} µs, 1/β {_bandwidth(f.beta)}",
                    "(detail)",
                    f"fit {f.rel_rms:.1%}, {f.n_samples} points",
                )
            )
        rows.append(("M_GPU", f"{hw.gpu_memory_bytes / 1e9:.3g} GB", _source("gpu_memory_bytes", self), ""))
        head = ("figure", "value", "source", "fit error")
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
        lines = [
            f"calibration of {hw.name} on {self.device} ({self.dtype}, {self.threads} threads, "
            f"{'quick' if self.quick else 'full'}, {self.elapsed:.1f} s)",
            "  ".join(h.ljust(w) for h, w in zip(head, widths)),
            "  ".join("-" * w for w in widths),
        ]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        if self.unsupported:
            lines.append(f"unsupported by the backend: {', '.join(self.unsupported)}")
        return "\n".join(lines)


def _source(name: str, report: CalibrationReport) -> str:
    return "measured" if name in report.measured else "inherited"


def _bandwidth(beta: float) -> str:
    return "∞" if beta <= 0 else f"{1.0 / beta / 1e9:.3g} GB/s"


def _spread(values: Sequence[float]) -> float:
    if not values:
        return float("nan")
    med = statistics.median(values)
    return math.sqrt(sum((v / med - 1.0) ** 2 for v in values) / len(values))


# ---------------------------------------------------------------------------- fits
def gemm_efficiency(m: np.ndarray | float, k: np.ndarray | float, gamma_m: float, gamma_k: float) -> Any:
    """Shape efficiency ``η = (M/(M + γM))·(K/(K + γK))`` of SPEC §6."""
    m = np.asarray(m, dtype=float)
    k = np.asarray(k, dtype=float)
    return m / (m + gamma_m) * k / (k + gamma_k)


def fit_gemm(m: Sequence[float], k: Sequence[float], flops_per_s: Sequence[float]) -> GemmFit:
    """Fit ``F = F_peak·(M/(M + γM))·(K/(K + γK))`` to measured GEMM throughputs (SPEC §6).

    Least squares on ``log F``: for fixed ``γM, γK`` the best ``log F_peak`` is the mean of
    ``log F − log η``, so a log-spaced grid over ``(γM, γK) ∈ {0} ∪ [10⁻², 10⁷]²`` is searched
    exhaustively, refined around its best point, and polished by Gauss–Newton steps in
    ``(log F_peak, log γM, log γK)``. Working in logs weighs every shape by its relative error.

    Parameters
    ----------
    m, k
        Rows ``M = b·ℓ`` and inner dimension ``K`` of each sample.
    flops_per_s
        Achieved throughput ``2·M·K·n/t`` of each sample.

    Returns
    -------
    GemmFit
        ``F_peak, γM, γK`` and ``rel_rms = √(mean((F_fit/F − 1)²))``.

    Raises
    ------
    ValueError
        With fewer than 3 samples, mismatched lengths or non-positive values.
    """
    M = np.asarray(m, dtype=float)
    K = np.asarray(k, dtype=float)
    F = np.asarray(flops_per_s, dtype=float)
    if not (M.shape == K.shape == F.shape and M.ndim == 1):
        raise ValueError(
            f"fit_gemm: m, k and flops_per_s must be 1-D of one length, got {M.shape}, {K.shape}, {F.shape}"
        )
    if M.size < 3:
        raise ValueError(f"fit_gemm: needs at least 3 samples, got {M.size}")
    if not (np.all(M > 0) and np.all(K > 0) and np.all(F > 0)):
        raise ValueError("fit_gemm: m, k and flops_per_s must all be positive")
    y = np.log(F)

    def sse_grid(gm: np.ndarray, gk: np.ndarray) -> np.ndarray:
        # r[i, j, s] = y_s − log ηM(gm_i) − log ηK(gk_j); best log F_peak is its mean over s
        lm = np.log(M[None, :] / (M[None, :] + gm[:, None]))
        lk = np.log(K[None, :] / (K[None, :] + gk[:, None]))
        r = y[None, None, :] - lm[:, None, :] - lk[None, :, :]
        return ((r - r.mean(axis=2, keepdims=True)) ** 2).sum(axis=2)

    grid = np.concatenate([[0.0], np.logspace(-2, 7, 91)])
    s = sse_grid(grid, grid)
    i, j = np.unravel_index(np.argmin(s), s.shape)
    gm, gk = grid[i], grid[j]
    fine_m = _refine(grid, i)
    fine_k = _refine(grid, j)
    s = sse_grid(fine_m, fine_k)
    i, j = np.unravel_index(np.argmin(s), s.shape)
    gm, gk = fine_m[i], fine_k[j]
    gm, gk = _gauss_newton(M, K, y, gm, gk)
    log_fp = float(np.mean(y - np.log(gemm_efficiency(M, K, gm, gk))))
    pred = math.exp(log_fp) * gemm_efficiency(M, K, gm, gk)
    rel = float(np.sqrt(np.mean((pred / F - 1.0) ** 2)))
    return GemmFit(math.exp(log_fp), float(gm), float(gk), rel, int(M.size))


def _refine(grid: np.ndarray, i: int) -> np.ndarray:
    lo = grid[max(i - 1, 0)]
    hi = grid[min(i + 1, grid.size - 1)]
    if lo <= 0.0:  # the bracket touches γ = 0: keep 0 and sweep up to the next grid point
        return np.concatenate([[0.0], np.logspace(-4, math.log10(hi), 61)])
    return np.logspace(math.log10(lo), math.log10(hi), 61)


def _gauss_newton(M: np.ndarray, K: np.ndarray, y: np.ndarray, gm: float, gk: float) -> tuple[float, float]:
    """Polish positive ``γ``s by Gauss–Newton in log space (a ``γ`` at 0 stays 0)."""

    def sse(a: float, b: float) -> float:
        r = y - np.log(gemm_efficiency(M, K, a, b))
        return float(((r - r.mean()) ** 2).sum())

    free = [gm > 0.0, gk > 0.0]
    if not any(free):
        return gm, gk
    theta = np.log([max(gm, 1e-300), max(gk, 1e-300)])
    best = sse(gm, gk)
    for _ in range(50):
        a, b = np.exp(theta)
        a, b = (a if free[0] else 0.0), (b if free[1] else 0.0)
        eta = gemm_efficiency(M, K, a, b)
        log_fp = np.mean(y - np.log(eta))
        r = y - log_fp - np.log(eta)
        # ∂(−log ηM)/∂log γM = γM/(M + γM); the mean-removed columns eliminate log F_peak
        cols = [c for c, f in zip((a / (M + a), b / (K + b)), free) if f]
        J = np.column_stack([c - c.mean() for c in cols])
        step, *_ = np.linalg.lstsq(J, -(r - r.mean()), rcond=None)
        full = np.zeros(2)
        full[np.array(free)] = step
        t = 1.0
        improved = False
        while t > 1e-4:
            cand = theta + t * full
            ca, cb = np.exp(cand)
            value = sse(ca if free[0] else 0.0, cb if free[1] else 0.0)
            if value < best:
                theta, best, improved = cand, value, True
                break
            t /= 2.0
        if not improved or np.max(np.abs(t * full)) < 1e-10:
            break
    a, b = np.exp(theta)
    return (float(a) if free[0] else 0.0), (float(b) if free[1] else 0.0)


def comm_coefficients(primitive: str, p: int, nbytes: float) -> tuple[float, float]:
    """α- and β-coefficients ``(a, b)`` of ``t = a·α + b·β`` for one primitive (SPEC §6).

    ======================  =============  ================
    primitive               ``a``          ``b``
    ======================  =============  ================
    ``allreduce``           ``2(p − 1)``   ``2((p − 1)/p)·M``
    ``allgather``           ``p − 1``      ``((p − 1)/p)·M``
    ``reducescatter``       ``p − 1``      ``((p − 1)/p)·M``
    ``alltoall``            ``p − 1``      ``M``
    ``p2p``                 ``1``          ``M``
    ======================  =============  ================

    ``M`` follows :mod:`.collectives` (see :class:`CommSample`).

    Raises
    ------
    ValueError
        For an unknown primitive or ``p < 2`` (``p < 1`` for P2P).
    """
    if primitive == "p2p":
        return 1.0, float(nbytes)
    if primitive not in COLLECTIVES:
        raise ValueError(f"unknown primitive {primitive!r}; known: {', '.join((*COLLECTIVES, 'p2p'))}")
    if p < 2:
        raise ValueError(f"{primitive}: p must be at least 2 to be timed, got {p!r}")
    if primitive == "allreduce":
        return 2.0 * (p - 1), 2.0 * (p - 1) / p * nbytes
    if primitive == "alltoall":
        return float(p - 1), float(nbytes)
    return float(p - 1), (p - 1) / p * nbytes


def fit_alpha_beta(a: Sequence[float], b: Sequence[float], seconds: Sequence[float]) -> LinkFit:
    """Fit ``t = a·α + b·β`` with ``α, β ≥ 0`` by relative least squares (SPEC §6).

    Minimises ``Σ ((a_i·α + b_i·β)/t_i − 1)²`` — each row divided by its time, so a 1 KiB
    message weighs as much as a 16 MiB one and ``α`` is not drowned by the large messages. If the
    unconstrained solution has a negative component, the better of the two one-parameter fits
    (``α = 0`` or ``β = 0``) is taken.

    Parameters
    ----------
    a, b
        α- and β-coefficient columns (:func:`comm_coefficients`).
    seconds
        Measured times.

    Returns
    -------
    LinkFit
        ``α`` (s), ``β`` (s/B) and ``rel_rms = √(mean((t_fit/t − 1)²))``.

    Raises
    ------
    ValueError
        With fewer than 2 samples, mismatched lengths or non-positive times.
    """
    A = np.column_stack([np.asarray(a, dtype=float), np.asarray(b, dtype=float)])
    t = np.asarray(seconds, dtype=float)
    if A.shape[0] != t.shape[0] or t.ndim != 1:
        raise ValueError(
            f"fit_alpha_beta: a, b and seconds must have one length, got {A.shape[0]}, {t.shape}"
        )
    if t.size < 2:
        raise ValueError(f"fit_alpha_beta: needs at least 2 samples, got {t.size}")
    if not np.all(t > 0):
        raise ValueError("fit_alpha_beta: seconds must all be positive")
    W = A / t[:, None]
    ones = np.ones_like(t)

    def rel_sse(x: np.ndarray) -> float:
        return float(((W @ x - ones) ** 2).sum())

    x, *_ = np.linalg.lstsq(W, ones, rcond=None)
    if np.any(x < 0):
        candidates = []
        for col in (0, 1):
            w = W[:, col]
            denom = float(w @ w)
            value = max(float(w @ ones) / denom, 0.0) if denom > 0 else 0.0
            cand = np.zeros(2)
            cand[col] = value
            candidates.append(cand)
        x = min(candidates, key=rel_sse)
    rel = math.sqrt(rel_sse(x) / t.size)
    return LinkFit(float(x[0]), float(x[1]), rel, int(t.size))


def _fit_samples(samples: Sequence[CommSample]) -> LinkFit:
    coef = [comm_coefficients(s.primitive, s.p, s.nbytes) for s in samples]
    return fit_alpha_beta([c[0] for c in coef], [c[1] for c in coef], [s.seconds for s in samples])


# ---------------------------------------------------------------------------- measurements
def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a base dependency
        raise ImportError("calibration needs torch: pip install torch") from exc
    return torch


def _dtype(device: str):
    torch = _torch()
    return torch.float32 if device == "cpu" else torch.bfloat16


def _sync(device: str) -> None:
    if device == "cuda":
        _torch().cuda.synchronize()


def _time_call(fn: Callable[[], object], device: str, repeats: int, min_seconds: float = 2e-3) -> list[float]:
    """Per-call seconds of ``fn``, ``repeats`` times; each time averages enough back-to-back calls
    to last ``min_seconds`` (so microsecond kernels are not lost in timer resolution)."""
    fn()  # warm-up: allocations, kernel selection
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    one = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, min(10_000, int(min_seconds / one)))
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(device)
        out.append((time.perf_counter() - t0) / inner)
    return out


def measure_gemm(
    ms: Sequence[int],
    ks: Sequence[int],
    n: int,
    *,
    device: str = "cpu",
    repeats: int = 5,
    seed: int = 0,
) -> list[GemmSample]:
    """Time ``torch.matmul`` of ``(M × K) @ (K × n)`` for every ``(M, K)`` in ``ms × ks``.

    float32 on CPU (the CPU runtime's dtype), bfloat16 on CUDA. The shapes run in an order
    shuffled by ``seed`` so that drift in a shared machine's load does not line up with shape.

    Returns
    -------
    list[GemmSample]
        Median seconds of ``repeats`` timings per shape.
    """
    torch = _torch()
    dtype = _dtype(device)
    gen = torch.Generator().manual_seed(seed)
    shapes = [(m, k) for m in ms for k in ks]
    order = np.random.default_rng(seed).permutation(len(shapes))
    out: dict[tuple[int, int], GemmSample] = {}
    for idx in order:
        m, k = shapes[idx]
        a = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype)
        b = torch.randn(k, n, generator=gen).to(device=device, dtype=dtype)
        times = _time_call(lambda a=a, b=b: torch.matmul(a, b), device, repeats)
        out[(m, k)] = GemmSample(m, k, n, statistics.median(times))
    return [out[s] for s in shapes]


def measure_copy(nbytes: int, *, device: str = "cpu", repeats: int = 5) -> list[CopySample]:
    """Time ``dst.copy_(src)`` of an ``nbytes`` float32 tensor, ``repeats`` times.

    ``BW_mem`` is the median of ``2·nbytes/t`` (every byte read once and written once).
    """
    torch = _torch()
    numel = max(1, nbytes // 4)
    src = torch.ones(numel, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    times = _time_call(lambda: dst.copy_(src), device, repeats, min_seconds=0.0)
    return [CopySample(numel * 4, t) for t in times]


def measure_nongemm(
    shape: NonGemmShape, *, device: str = "cpu", repeats: int = 5, seed: int = 0
) -> list[float]:
    """Seconds of one layer's non-GEMM forward work at ``shape.batch`` sequences, per repeat.

    With ``N = B_cal·ℓ_ref`` tokens, ``d``, ``dff`` and ``h`` heads, one timed call runs

    * two RMSNorms of ``N × d`` (``x·rsqrt(mean(x²) + ε)·w``: before attention and before the FFN);
    * the causal softmax of the attention scores, ``B_cal·h × ℓ_ref × ℓ_ref`` (additive mask,
      then softmax over the last axis);
    * the gated activation ``SiLU(gate)·up`` of ``N × dff``;
    * two residual adds of ``N × d``.

    Matmuls, rotary embeddings and the output head are not included. The cost model uses the
    median as ``c_ng`` at ``B_cal = shape.batch``: ``T_nongemm = (L/Pp)·c_ng·(1 − 1/Pt)·(b/B_cal)``.
    """
    torch = _torch()
    dtype = _dtype(device)
    gen = torch.Generator().manual_seed(seed)
    n_tok = shape.batch * shape.seq_len
    d, dff, h, ell = shape.hidden, shape.ffn_hidden, shape.heads, shape.seq_len

    def rand(*size: int):
        return torch.randn(*size, generator=gen).to(device=device, dtype=dtype)

    x, res, w1, w2 = rand(n_tok, d), rand(n_tok, d), rand(d), rand(d)
    scores = rand(shape.batch * h, ell, ell)
    mask = torch.full((ell, ell), float("-inf"), device=device, dtype=dtype).triu(1)
    gate, up = rand(n_tok, dff), rand(n_tok, dff)
    eps = 1e-6

    def layer() -> None:
        a = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w1
        torch.softmax(scores + mask, dim=-1)
        y = a + res
        b = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps) * w2
        torch.nn.functional.silu(gate) * up
        b + y

    return _time_call(layer, device, repeats)


def _comm_worker(
    rank: int, world: int, rendezvous: str, device: str, sizes: list[int], repeats: int, out: str
) -> None:
    """One rank of :func:`measure_comm` (top level so that ``spawn`` can pickle it).

    The ranks meet through a file store in a private temporary folder, not a TCP port: a port
    picked free and bound later can be taken in between on a loaded machine (EADDRINUSE)."""
    torch = _torch()
    import torch.distributed as dist

    torch.set_num_threads(1)
    backend = "gloo" if device == "cpu" else "nccl"
    dev = "cpu"
    if device == "cuda":
        torch.cuda.set_device(rank)
        dev = f"cuda:{rank}"
    dist.init_process_group(backend, init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    samples: list[dict[str, object]] = []
    unsupported: set[str] = set()

    def timed(op: Callable[[], object], group, inner: int) -> float:
        times = []
        for _ in range(repeats):
            dist.barrier(group=group)
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(inner):
                op()
            _sync(device)
            times.append((time.perf_counter() - t0) / inner)
        return statistics.median(times)

    def inner_for(nbytes: int) -> int:
        return max(1, min(8, (4 * MIB) // max(nbytes, 1)))

    groups = {
        p: (dist.new_group(list(range(p))) if p < world else dist.group.WORLD) for p in range(2, world + 1)
    }
    for p, group in groups.items():
        member = rank < p
        for prim in COLLECTIVES:
            for size in sizes:
                if not member or prim in unsupported:
                    continue
                numel = max(p, (size // 4) // p * p)  # float32, divisible by p
                nbytes = numel * 4
                if prim == "allreduce":
                    buf = torch.ones(numel, device=dev)

                    def op(buf=buf, group=group):
                        return dist.all_reduce(buf, group=group)
                elif prim == "allgather":
                    full, part = torch.empty(numel, device=dev), torch.ones(numel // p, device=dev)

                    def op(full=full, part=part, group=group):
                        return gather(full, part, group=group)
                elif prim == "reducescatter":
                    full, part = torch.ones(numel, device=dev), torch.empty(numel // p, device=dev)

                    def op(full=full, part=part, group=group):
                        return scatter(part, full, group=group)
                else:
                    src, dst = torch.ones(numel, device=dev), torch.empty(numel, device=dev)

                    def op(src=src, dst=dst, group=group):
                        return dist.all_to_all_single(dst, src, group=group)

                try:
                    op()  # warm-up
                except (RuntimeError, NotImplementedError):
                    unsupported.add(prim)
                    continue
                seconds = timed(op, group, inner_for(nbytes))
                samples.append({"primitive": prim, "p": p, "nbytes": nbytes, "seconds": seconds})
        dist.barrier()
    # P2P ping-pong between ranks 0 and 1; one transfer is half a round trip
    for size in sizes:
        numel = max(1, size // 4)
        buf = torch.ones(numel, device=dev)
        inner = inner_for(numel * 4)
        times = []
        for it in range(repeats + 1):
            dist.barrier()
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(inner):
                if rank == 0:
                    dist.send(buf, dst=1)
                    dist.recv(buf, src=1)
                elif rank == 1:
                    dist.recv(buf, src=0)
                    dist.send(buf, dst=0)
            _sync(device)
            if it > 0:  # the first round trip is the warm-up
                times.append((time.perf_counter() - t0) / (2 * inner))
        if rank == 0:
            samples.append(
                {"primitive": "p2p", "p": 2, "nbytes": numel * 4, "seconds": statistics.median(times)}
            )
    dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps({"samples": samples, "unsupported": sorted(unsupported)}))
    dist.destroy_process_group()


def measure_comm(
    max_ranks: int, sizes: Sequence[int], *, device: str = "cpu", repeats: int = 5
) -> tuple[list[CommSample], tuple[str, ...]]:
    """Time the collectives for ``p = 2..max_ranks`` and P2P between two ranks, all on this host.

    Spawns ``max_ranks`` processes once (``torch.multiprocessing``, ``tcp://127.0.0.1``; gloo on
    CPU, NCCL with one GPU per rank on CUDA) and times each primitive on the sub-group of the first
    ``p`` ranks. Each sample is rank 0's median over ``repeats`` of (barrier, then ``inner``
    back-to-back operations, ``inner = clamp(4 MiB/M, 1, 8)``) divided by ``inner``. P2P is a
    ping-pong between ranks 0 and 1; a transfer is half a round trip.

    Returns
    -------
    tuple[list[CommSample], tuple[str, ...]]
        The samples and the primitives the backend refused.
    """
    _torch()
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="rpeg-calibrate-") as tmp:
        out = os.path.join(tmp, "comm.json")
        rendezvous = os.path.join(tmp, "rendezvous")
        args = (max_ranks, rendezvous, device, [int(s) for s in sizes], repeats, out)
        try:
            mp.spawn(_comm_worker, args=args, nprocs=max_ranks, join=True)
        except Exception as exc:  # a rank failed: report its error, not a missing file
            raise RuntimeError(
                f"collective benchmark failed on {device} with {max_ranks} ranks: {exc}"
            ) from exc
        data = json.loads(Path(out).read_text())
    samples = [
        CommSample(str(s["primitive"]), int(s["p"]), int(s["nbytes"]), float(s["seconds"]))
        for s in data["samples"]
    ]
    return samples, tuple(data["unsupported"])


# ---------------------------------------------------------------------------- calibrate
@dataclass(frozen=True)
class _Plan:
    ms: tuple[int, ...]
    ks: tuple[int, ...]
    n: int
    gemm_repeats: int
    copy_bytes: int
    repeats: int
    sizes: tuple[int, ...]


def _plan(device: str, quick: bool) -> _Plan:
    if device == "cpu":
        if quick:
            return _Plan(
                (1, 16, 128, 1024), (32, 256, 1024), 256, 3, 32 * MIB, 3, (1 * KIB, 32 * KIB, 1 * MIB)
            )
        return _Plan(
            (1, 4, 16, 64, 256, 1024, 2048),
            (16, 64, 256, 1024, 2048),
            512,
            5,
            128 * MIB,
            7,
            tuple(KIB * 4**i for i in range(8)),  # 1 KiB … 16 MiB
        )
    if quick:
        return _Plan((16, 256, 4096), (256, 1024, 4096), 4096, 3, 1024 * MIB, 3, (KIB, 64 * KIB, 16 * MIB))
    return _Plan(
        (1, 16, 64, 256, 1024, 4096, 16384),
        (128, 512, 1024, 2048, 4096, 8192),
        4096,
        7,
        2048 * MIB,
        7,
        tuple(KIB * 4**i for i in range(10)),  # 1 KiB … 256 MiB
    )


def _check_args(device: str, max_ranks: int) -> None:
    if device not in DEVICES:
        raise ValueError(f"calibrate: device must be one of {', '.join(DEVICES)}, got {device!r}")
    if isinstance(max_ranks, bool) or not isinstance(max_ranks, int) or max_ranks < 2:
        raise ValueError(f"calibrate: max_ranks must be an integer ≥ 2, got {max_ranks!r}")


def _resolve_base(base: Hardware | str) -> Hardware:
    try:
        return load_hardware(base)
    except ValueError as exc:
        raise ValueError(f"calibrate: base {base!r} is not a hardware preset or file ({exc})") from exc


def calibrate(
    *,
    device: str = "cpu",
    base: Hardware | str = "cpu",
    quick: bool = False,
    max_ranks: int = 4,
    seed: int = 0,
    progress: Progress | None = None,
    nongemm: NonGemmShape | None = None,
    threads: int | None = None,
) -> CalibrationReport:
    """Measure this machine and fit a :class:`~rpeg.ir.hardware.Hardware` (SPEC §6, Calibration).

    Fits, in order (see the module docstring for what is timed):

    * ``F = F_peak·(M/(M + γM))·(K/(K + γK))`` to the GEMM sweep (:func:`fit_gemm`);
    * ``BW_mem = median(2·bytes/t)`` of large copies;
    * ``c_ng = median(t_layer)`` of one layer's non-GEMM work at ``B_cal`` sequences;
    * tier-0 collective ``(α, β)`` from AllReduce ``2(p−1)α + 2((p−1)/p)Mβ``, AllGather and
      ReduceScatter ``(p−1)α + ((p−1)/p)Mβ`` and AlltoAll ``(p−1)α + Mβ`` jointly, and tier-0 P2P
      ``(α, β)`` from ``α + Mβ`` (:func:`fit_alpha_beta`).

    Tiers 1 and 2 are copied from ``base`` (one machine cannot measure them), as are the memory
    figures on CPU (on CUDA ``M_GPU`` is the device's memory and ``gpus_per_node`` its count).
    The ``notes`` of the result say which figures were measured and which inherited.

    Parameters
    ----------
    device
        ``"cpu"`` (float32, gloo) or ``"cuda"`` (bfloat16, NCCL; untested here).
    base
        Preset name, JSON file or :class:`Hardware` supplying the figures not measured.
    quick
        A reduced sweep (12 GEMM shapes, a 32 MiB copy, 3 repeats, 3 message sizes) that runs in
        seconds; the full sweep took ~21 s on a 2-core CPU.
    max_ranks
        Largest ``p`` of the collectives (``p = 2..max_ranks``); on CUDA at most the GPU count.
    seed
        Seeds the input data and the order of the GEMM shapes.
    progress
        Called with a short message before each stage.
    nongemm
        The non-GEMM layer (default :data:`DEFAULT_NONGEMM` of the device).
    threads
        torch intra-op threads while measuring (restored afterwards). Default on CPU: 1, because
        the CPU runtime runs one worker process per "device" and several share the host's cores;
        on a shared machine a second thread also waits for a time slice at every parallel
        region, which turns microsecond GEMMs into milliseconds. Default on CUDA: unchanged.

    Returns
    -------
    CalibrationReport
        The hardware, the raw samples and the fit residuals.

    Raises
    ------
    ValueError
        For an unknown device, ``max_ranks < 2``, an unknown base preset or an unavailable
        device; the message names the field and the value.
    """
    _check_args(device, max_ranks)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"calibrate: threads must be a positive integer, got {threads!r}")
    base_hw = _resolve_base(base)
    torch = _torch()
    saved_threads = torch.get_num_threads()
    if threads is None and device == "cpu":
        threads = 1
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _calibrate(device, base_hw, quick, max_ranks, seed, progress, nongemm)
    finally:
        torch.set_num_threads(saved_threads)


def _calibrate(
    device: str,
    base_hw: Hardware,
    quick: bool,
    max_ranks: int,
    seed: int,
    progress: Progress | None,
    nongemm: NonGemmShape | None,
) -> CalibrationReport:
    started = time.perf_counter()
    say = progress or (lambda _msg: None)
    torch = _torch()
    n_gpus = 0
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("calibrate: device 'cuda' requested but torch.cuda.is_available() is False")
        n_gpus = torch.cuda.device_count()
    torch.manual_seed(seed)
    plan = _plan(device, quick)
    shape = nongemm or DEFAULT_NONGEMM[device]
    repeats = plan.repeats

    say(f"GEMM sweep: {len(plan.ms) * len(plan.ks)} shapes, n = {plan.n}")
    gemm = measure_gemm(plan.ms, plan.ks, plan.n, device=device, repeats=plan.gemm_repeats, seed=seed)
    gfit = fit_gemm([s.m for s in gemm], [s.k for s in gemm], [s.flops_per_s for s in gemm])

    say(f"memory copy: {plan.copy_bytes // MIB} MiB")
    copies = measure_copy(plan.copy_bytes, device=device, repeats=repeats)
    bw = statistics.median(s.bandwidth for s in copies)

    say(f"non-GEMM layer: d = {shape.hidden}, {shape.batch} × {shape.seq_len} tokens")
    ng = measure_nongemm(shape, device=device, repeats=repeats, seed=seed)
    c_ng = statistics.median(ng)

    comm: list[CommSample] = []
    unsupported: tuple[str, ...] = ()
    coll_fit = p2p_fit = None
    primitive_fits: dict[str, LinkFit] = {}
    ranks = max_ranks if device == "cpu" else min(max_ranks, n_gpus)
    comm_note = ""
    if ranks >= 2:
        say(f"collectives and P2P: p = 2..{ranks}, {len(plan.sizes)} message sizes")
        comm, unsupported = measure_comm(ranks, plan.sizes, device=device, repeats=repeats)
        coll = [s for s in comm if s.primitive in COLLECTIVES]
        p2p = [s for s in comm if s.primitive == "p2p"]
        if len(coll) >= 2:
            coll_fit = _fit_samples(coll)
            for prim in COLLECTIVES:
                subset = [s for s in coll if s.primitive == prim]
                if len(subset) >= 2:
                    primitive_fits[prim] = _fit_samples(subset)
        if len(p2p) >= 2:
            p2p_fit = _fit_samples(p2p)
        if device == "cpu" and max_ranks > (os.cpu_count() or 1):
            comm_note = f" ({max_ranks} ranks on {os.cpu_count()} cores: oversubscribed)"
    else:
        comm_note = f" (not measured: {n_gpus} GPU(s), collectives need 2)"

    measured = ["peak_flops", "gamma_m", "gamma_k", "mem_bandwidth", "c_nongemm", "b_cal"]
    inherited = ["memory_headroom"]
    if device == "cuda":
        gpu_memory = float(torch.cuda.get_device_properties(0).total_memory)
        per_node = n_gpus
        measured += ["gpu_memory_bytes", "gpus_per_node"]
    else:
        gpu_memory, per_node = base_hw.gpu_memory_bytes, base_hw.gpus_per_node
        inherited += ["gpu_memory_bytes", "gpus_per_node"]
    collective = list(base_hw.collective)
    p2p_links = list(base_hw.p2p)
    if coll_fit is not None:
        collective[0] = coll_fit.link
        measured.append("collective[0]")
    else:
        inherited.append("collective[0]")
    if p2p_fit is not None:
        p2p_links[0] = p2p_fit.link
        measured.append("p2p[0]")
    else:
        inherited.append("p2p[0]")
    inherited += ["collective[1]", "collective[2]", "p2p[1]", "p2p[2]"]

    dtype = "float32" if device == "cpu" else "bfloat16"
    threads = torch.get_num_threads()
    host = socket.gethostname() or "host"
    notes = (
        f"Calibrated on {host} ({device}, {dtype} GEMMs, {threads} torch threads, "
        f"{'quick' if quick else 'full'} sweep, seed {seed}). "
        f"Measured: F_peak/γM/γK (GEMM fit, rel. RMS {gfit.rel_rms:.1%}), BW_mem (copy), "
        f"c_nongemm at B_cal={shape.batch} sequences × {shape.seq_len} tokens, d={shape.hidden}, "
        f"dff={shape.ffn_hidden}, {shape.heads} heads (RMSNorm×2, causal softmax, SiLU·mul, "
        "residual adds)"
        + (f", tier-0 collective (rel. RMS {coll_fit.rel_rms:.1%})" if coll_fit else "")
        + (f", tier-0 P2P (rel. RMS {p2p_fit.rel_rms:.1%})" if p2p_fit else "")
        + comm_note
        + f". Inherited from {base_hw.name!r}: "
        + ", ".join(
            f"{name} ({TIER_NAMES[int(name[-2])]})" if name.endswith("]") else name for name in inherited
        )
        + "."
        + (" Unsupported by the backend: " + ", ".join(unsupported) + "." if unsupported else "")
    )
    hardware = Hardware(
        name=f"calibrated-{host}",
        gpu_memory_bytes=gpu_memory,
        peak_flops=gfit.peak_flops,
        mem_bandwidth=bw,
        gamma_m=gfit.gamma_m,
        gamma_k=gfit.gamma_k,
        c_nongemm=c_ng,
        b_cal=float(shape.batch),
        collective=tuple(collective),  # type: ignore[arg-type]
        p2p=tuple(p2p_links),  # type: ignore[arg-type]
        memory_headroom=base_hw.memory_headroom,
        gpus_per_node=per_node,
        notes=notes,
    )
    return CalibrationReport(
        hardware=hardware,
        device=device,
        quick=quick,
        dtype=dtype,
        threads=threads,
        gemm=gemm,
        gemm_fit=gfit,
        copies=copies,
        nongemm_shape=shape,
        nongemm_seconds=list(ng),
        comm=comm,
        collective_fit=coll_fit,
        p2p_fit=p2p_fit,
        primitive_fits=primitive_fits,
        unsupported=unsupported,
        measured=tuple(measured),
        inherited=tuple(inherited),
        elapsed=time.perf_counter() - started,
    )


# ---------------------------------------------------------------------------- CLI
def _cmd_calibrate(args: argparse.Namespace) -> int:
    def say(msg: str) -> None:
        print(f"calibrate: {msg}", file=sys.stderr, flush=True)

    check_output(args.out, "--out", (".json",))  # before minutes of measuring, not after
    check_output(args.raw, "--raw", (".json",))
    load_hardware(args.base)  # a bad --base is named now, too
    if args.max_ranks < 2:
        raise InputError(f"--max-ranks must be at least 2, got {args.max_ranks}")
    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads must be a positive integer, got {args.threads}")
    report = calibrate(
        device=args.device,
        base=args.base,
        quick=args.quick,
        max_ranks=args.max_ranks,
        seed=args.seed,
        threads=args.threads,
        progress=None if args.no_progress else say,
    )
    print(report.table())
    report.hardware.save(args.out)
    print(f"\nwrote {args.out}")
    if args.raw:
        Path(args.raw).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        print(f"wrote {args.raw}")
    return 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    """Add ``rpeg calibrate --out HW.json [--quick] [--device cpu|cuda] [--base PRESET]
    [--max-ranks N] [--seed N] [--threads N] [--raw RAW.json] [--no-progress]`` to the sub-command parsers ``sub``."""
    c = sub.add_parser("calibrate", help="measure this machine and write a hardware JSON file")
    c.add_argument("--out", required=True, metavar="HW.json", help="hardware file to write (rpeg.hardware/1)")
    c.add_argument("--quick", action="store_true", help="reduced sweep that runs in seconds")
    c.add_argument(
        "--device", default="cpu", choices=list(DEVICES), help="cpu (gloo) or cuda (NCCL, untested)"
    )
    c.add_argument(
        "--base",
        default="cpu",
        metavar="PRESET|FILE.json",
        help="figures not measurable here (tiers 1-2, CPU memory); with --device cuda pass the GPU's preset",
    )
    c.add_argument(
        "--max-ranks", type=int, default=4, metavar="N", help="collectives for p = 2..N (default 4)"
    )
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--threads", type=int, metavar="N", help="torch threads while measuring (CPU default 1)")
    c.add_argument("--raw", metavar="RAW.json", help="also write every sample and fit (rpeg.calibration/1)")
    c.add_argument("--no-progress", action="store_true", help="no stage messages on stderr")
    c.set_defaults(fn=_cmd_calibrate)

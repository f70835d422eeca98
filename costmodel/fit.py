"""Calibration fits: turn microbenchmark samples into the cost model's hardware figures (SPEC §6).

Each measurement is fitted to the formula the cost model uses, and the fits together make a
:class:`~rpeg.ir.hardware.Hardware` in the ``rpeg.hardware/2`` format (:func:`fit_hardware`):

* **GEMM-shape sweep** → ``F_peak, γM, γK``: throughputs of ``(M × K) @ (K × n)`` matmuls over a
  grid of ``M = b·ℓ`` and ``K``, fitted to ``F = F_peak·(M/(M + γM))·(K/(K + γK))``
  (:func:`fit_gemm`).
* **Memory copy** → ``BW_mem = median(2·bytes/t)`` (bytes read plus bytes written) of large copies.
* **Non-GEMM work** → ``c_ng = median(t_layer)`` of one layer's non-GEMM forward work at ``B_cal``
  sequences of a reference length (:class:`NonGemmShape`).
* **Collectives and P2P** → ``(α, β)`` of tier 0: least squares on the α- and β-coefficient
  columns of the SPEC formulas (:func:`comm_coefficients`, :func:`fit_alpha_beta`).

One machine only reaches tier 0 (inside a node). Tiers 1 and 2, and the memory figures on CPU,
are copied from the ``base`` hardware; the result's ``notes`` list every figure as measured or
inherited.

The measuring itself (torch microbenchmarks, one process per rank) is
:mod:`rpeg.runtime.calibrate.measure`; this module is numpy only and never imports torch.

Example
-------
>>> from rpeg.runtime.calibrate.measure import calibrate                # doctest: +SKIP
>>> report = calibrate(quick=True, max_ranks=2)              # doctest: +SKIP
>>> print(report.table()); report.hardware.save("hw.json")   # doctest: +SKIP
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from ..ir.hardware import TIER_NAMES, Hardware, Link

__all__ = [
    "COLLECTIVES",
    "CalibrationReport",
    "CommSample",
    "CopySample",
    "GemmFit",
    "GemmSample",
    "LinkFit",
    "Measurements",
    "NonGemmShape",
    "comm_coefficients",
    "compute_bound_gemms",
    "fit_alpha_beta",
    "fit_gemm",
    "fit_hardware",
    "gemm_efficiency",
]

#: Collective primitives timed (P2P is timed separately, as ``"p2p"``).
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall")


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


@dataclass(frozen=True)
class GemmFit:
    """Fitted ``F = F_peak·(M/(M + γM))·(K/(K + γK))`` with its relative RMS residual."""

    peak_flops: float
    gamma_m: float
    gamma_k: float
    rel_rms: float
    n_samples: int
    n_excluded: int = 0
    """Shapes of the sweep left out of the fit as bandwidth- or dispatch-bound
    (:func:`compute_bound_gemms`)."""


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
    """What a calibration measured (:func:`~rpeg.runtime.calibrate.measure.calibrate`) and fitted.

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
                f"fit {g.rel_rms:.1%}, {g.n_samples} shapes"
                + (f" ({g.n_excluded} bandwidth-/dispatch-bound left out)" if g.n_excluded else ""),
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

    def summary(self) -> str:
        """The measured figures on two lines (:meth:`table` has every figure with its source)."""
        hw, g = self.hardware, self.gemm_fit
        head = (
            f"calibration of {hw.name} on {self.device} ({'quick' if self.quick else 'full'}, {self.elapsed:.1f} s): "
            f"F_peak {hw.peak_flops / 1e9:.3g} GFLOP/s (fit {g.rel_rms:.1%}), BW_mem {hw.mem_bandwidth / 1e9:.3g} GB/s, "
            f"c_ng {hw.c_nongemm * 1e3:.3g} ms/layer"
        )
        links = [
            f"{kind} α {getattr(hw, kind)[0].alpha * 1e6:.3g} µs 1/β {_bandwidth(getattr(hw, kind)[0].beta)}"
            for kind, fitted in (("collective", self.collective_fit), ("p2p", self.p2p_fit))
            if fitted is not None
        ]
        return head + ("\n  measured links (tier 0): " + ", ".join(links) if links else "")


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


# ---------------------------------------------------------------------------- the hardware file
@dataclass(frozen=True)
class Measurements:
    """The raw samples of one calibration run, what :func:`fit_hardware` fits.

    Parameters
    ----------
    device
        ``"cpu"`` or ``"cuda"``.
    quick
        Whether the reduced sweep ran.
    seed
        Seed of the input data and of the order of the GEMM shapes.
    dtype
        Dtype of the GEMM and non-GEMM timings.
    threads
        torch intra-op threads of the measuring process.
    host
        Name of the measured machine (the hardware is called ``calibrated-<host>``).
    gemm, copies
        GEMM and memory-copy samples.
    nongemm_shape, nongemm_seconds
        The non-GEMM layer and its per-repeat times.
    comm
        Collective and P2P samples (empty when none could be measured).
    unsupported
        Primitives the backend refused.
    comm_note
        Why the collectives are missing or suspect, as a note (``""`` when nothing to say).
    gpu_memory_bytes, gpus_per_node
        The device's memory and count when measured (CUDA); ``None`` to inherit them.
    """

    device: str
    quick: bool
    seed: int
    dtype: str
    threads: int
    host: str
    gemm: list[GemmSample]
    copies: list[CopySample]
    nongemm_shape: NonGemmShape
    nongemm_seconds: list[float]
    comm: list[CommSample] = field(default_factory=list)
    unsupported: tuple[str, ...] = ()
    comm_note: str = ""
    gpu_memory_bytes: float | None = None
    gpus_per_node: int | None = None
    dispatch_floor: float = 0.0
    """Seconds per call of a ``1 × 1`` matmul issued back to back: the dispatch floor under which
    no GEMM time says anything about ``F_peak`` (0: not measured)."""


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per scalar of the dtypes a calibration times its GEMMs in."""

COMPUTE_BOUND_MARGIN = 2.0
"""A GEMM sample enters the ``F_peak, γM, γK`` fit only when its time is at least this many times
both its memory time and the dispatch floor (:func:`compute_bound_gemms`)."""


def compute_bound_gemms(
    samples: Sequence[GemmSample], *, bandwidth: float, dtype_bytes: int, floor: float = 0.0
) -> list[GemmSample]:
    """The samples whose time compute dominates: ``t ≥ 2·max(t_floor, sb·(MK + Kn + Mn)/BW_mem)``.

    The cost model takes ``F_eff = min(F_peak·η, I·BW_mem)`` (SPEC §6), so a shape whose time
    is set by streaming its operands, or by the host issuing the call, is predicted by the
    bandwidth roofline or not at all; fitting ``η`` to it drives ``F_peak``, ``γM`` and
    ``γK`` to figures no large shape reaches (on an H200 the whole sweep gave ``F_peak`` 2.4
    PFLOP/s, 2.5 × the chip's 989 TFLOP/s dense BF16; benchmarks/RESULTS.md, "gpu-check").

    Parameters
    ----------
    samples
        The GEMM sweep.
    bandwidth
        ``BW_mem`` in bytes per second (the copy's).
    dtype_bytes
        ``sb`` of the timed GEMMs.
    floor
        The dispatch floor in seconds (0: not measured).

    Returns
    -------
    list[GemmSample]
        The compute-bound samples, in the sweep's order.
    """
    keep = []
    for s in samples:
        memory = dtype_bytes * (s.m * s.k + s.k * s.n + s.m * s.n) / bandwidth
        if s.seconds >= COMPUTE_BOUND_MARGIN * max(floor, memory):
            keep.append(s)
    return keep


def _link_fits(comm: Sequence[CommSample]) -> tuple[LinkFit | None, LinkFit | None, dict[str, LinkFit]]:
    """Tier-0 ``(α, β)`` over all collective samples, over the P2P samples, and per collective
    primitive (each needs at least 2 samples; ``None`` / absent otherwise)."""
    coll = [s for s in comm if s.primitive in COLLECTIVES]
    p2p = [s for s in comm if s.primitive == "p2p"]
    coll_fit = p2p_fit = None
    primitive_fits: dict[str, LinkFit] = {}
    if len(coll) >= 2:
        coll_fit = _fit_samples(coll)
        for prim in COLLECTIVES:
            subset = [s for s in coll if s.primitive == prim]
            if len(subset) >= 2:
                primitive_fits[prim] = _fit_samples(subset)
    if len(p2p) >= 2:
        p2p_fit = _fit_samples(p2p)
    return coll_fit, p2p_fit, primitive_fits


def fit_hardware(m: Measurements, base: Hardware) -> CalibrationReport:
    """Fit the samples of one calibration run and assemble the hardware file (SPEC §6).

    * ``F_peak, γM, γK`` from ``F = F_peak·(M/(M + γM))·(K/(K + γK))`` (:func:`fit_gemm`);
    * ``BW_mem = median(2·bytes/t)`` of the copies;
    * ``c_ng = median(t_layer)`` at ``B_cal = nongemm_shape.batch`` sequences;
    * tier-0 collective ``(α, β)`` from AllReduce ``2(p−1)α + 2((p−1)/p)Mβ``, AllGather and
      ReduceScatter ``(p−1)α + ((p−1)/p)Mβ`` and AlltoAll ``(p−1)α + Mβ`` jointly, and tier-0 P2P
      ``(α, β)`` from ``α + Mβ`` (:func:`fit_alpha_beta`).

    Every other figure (tiers 1 and 2, the memory headroom, and ``M_GPU`` / ``Ng`` unless
    measured) is copied from ``base``; the hardware's ``notes`` say which figures were measured
    and which inherited.

    Parameters
    ----------
    m
        The raw samples.
    base
        Supplies the figures not measured.

    Returns
    -------
    CalibrationReport
        The hardware, the samples and the fit residuals (``elapsed`` 0: the caller times the run).

    Raises
    ------
    ValueError
        When a fit has too few or non-positive samples (:func:`fit_gemm`).
    """
    bandwidth = statistics.median(s.bandwidth for s in m.copies)
    if m.dtype not in DTYPE_BYTES:
        raise ValueError(f"fit_hardware: dtype must be one of {', '.join(DTYPE_BYTES)}, got {m.dtype!r}")
    fitted = compute_bound_gemms(
        m.gemm, bandwidth=bandwidth, dtype_bytes=DTYPE_BYTES[m.dtype], floor=m.dispatch_floor
    )
    if len(fitted) < 3:
        fitted = list(m.gemm)
    gfit = fit_gemm([s.m for s in fitted], [s.k for s in fitted], [s.flops_per_s for s in fitted])
    gfit = replace(gfit, n_excluded=len(m.gemm) - len(fitted))
    coll_fit, p2p_fit, primitive_fits = _link_fits(m.comm)
    measured = ["peak_flops", "gamma_m", "gamma_k", "mem_bandwidth", "c_nongemm", "b_cal", "l_cal", "d_cal"]
    inherited = ["memory_headroom"]
    if m.gpu_memory_bytes is not None and m.gpus_per_node is not None:
        gpu_memory, per_node = m.gpu_memory_bytes, m.gpus_per_node
        measured += ["gpu_memory_bytes", "gpus_per_node"]
    else:
        gpu_memory, per_node = base.gpu_memory_bytes, base.gpus_per_node
        inherited += ["gpu_memory_bytes", "gpus_per_node"]
    collective = list(base.collective)
    p2p_links = list(base.p2p)
    for name, links, fitted in (("collective", collective, coll_fit), ("p2p", p2p_links, p2p_fit)):
        if fitted is not None:
            links[0] = fitted.link
            measured.append(f"{name}[0]")
        else:
            inherited.append(f"{name}[0]")
    inherited += ["collective[1]", "collective[2]", "p2p[1]", "p2p[2]"]
    shape = m.nongemm_shape
    hardware = Hardware(
        name=f"calibrated-{m.host}",
        gpu_memory_bytes=gpu_memory,
        peak_flops=gfit.peak_flops,
        mem_bandwidth=bandwidth,
        gamma_m=gfit.gamma_m,
        gamma_k=gfit.gamma_k,
        c_nongemm=statistics.median(m.nongemm_seconds),
        b_cal=float(shape.batch),
        l_cal=float(shape.seq_len),
        d_cal=float(shape.hidden),
        collective=tuple(collective),  # type: ignore[arg-type]
        p2p=tuple(p2p_links),  # type: ignore[arg-type]
        memory_headroom=base.memory_headroom,
        gpus_per_node=per_node,
        notes=_notes(m, base, gfit, coll_fit, p2p_fit, inherited),
        sources=_sources(m, base, measured, inherited),
    )
    return CalibrationReport(
        hardware=hardware,
        device=m.device,
        quick=m.quick,
        dtype=m.dtype,
        threads=m.threads,
        gemm=list(m.gemm),
        gemm_fit=gfit,
        copies=list(m.copies),
        nongemm_shape=shape,
        nongemm_seconds=list(m.nongemm_seconds),
        comm=list(m.comm),
        collective_fit=coll_fit,
        p2p_fit=p2p_fit,
        primitive_fits=primitive_fits,
        unsupported=m.unsupported,
        measured=tuple(measured),
        inherited=tuple(inherited),
    )


def _source_key(figure: str) -> str:
    """``collective[1]`` → ``collective.inter-node`` (the presets' ``sources`` keys)."""
    if figure.endswith("]"):
        table, tier = figure[:-1].split("[")
        return f"{table}.{TIER_NAMES[int(tier)]}"
    return figure


def _sources(
    m: Measurements, base: Hardware, measured: Sequence[str], inherited: Sequence[str]
) -> tuple[tuple[str, str], ...]:
    """``sources`` of a calibrated file: each measured figure names the calibration, each
    inherited one the base and what the base cites for it."""
    cited = dict(base.sources)
    out = {
        _source_key(f): f"measured by rpeg calibrate on {m.host} ({m.device}, {m.dtype})" for f in measured
    }
    for f in inherited:
        key = _source_key(f)
        why = cited.get(key)
        out[key] = f"inherited from {base.name!r}" + (f": {why}" if why else "")
    return tuple(out.items())


def _notes(
    m: Measurements,
    base: Hardware,
    gfit: GemmFit,
    coll_fit: LinkFit | None,
    p2p_fit: LinkFit | None,
    inherited: Sequence[str],
) -> str:
    """The hardware's ``notes``: how it was measured, each fit's error, what is inherited."""
    shape = m.nongemm_shape
    return (
        f"Calibrated on {m.host} ({m.device}, {m.dtype} GEMMs, {m.threads} torch threads, "
        f"{'quick' if m.quick else 'full'} sweep, seed {m.seed}). "
        f"Measured: F_peak/γM/γK (GEMM fit, rel. RMS {gfit.rel_rms:.1%}, "
        + (
            f"{gfit.n_samples} compute-bound of {gfit.n_samples + gfit.n_excluded} shapes"
            if gfit.n_excluded
            else f"all {gfit.n_samples} shapes"
        )
        + (f", dispatch floor {m.dispatch_floor * 1e6:.1f} µs" if m.dispatch_floor else "")
        + "), BW_mem (copy), "
        f"c_nongemm at B_cal={shape.batch} sequences × {shape.seq_len} tokens, d={shape.hidden}, "
        f"dff={shape.ffn_hidden}, {shape.heads} heads (RMSNorm×2, causal softmax, SiLU·mul, "
        "residual adds)"
        + (f", tier-0 collective (rel. RMS {coll_fit.rel_rms:.1%})" if coll_fit else "")
        + (f", tier-0 P2P (rel. RMS {p2p_fit.rel_rms:.1%})" if p2p_fit else "")
        + m.comm_note
        + f". Inherited from {base.name!r}: "
        + ", ".join(
            f"{name} ({TIER_NAMES[int(name[-2])]})" if name.endswith("]") else name for name in inherited
        )
        + "."
        + (" Unsupported by the backend: " + ", ".join(m.unsupported) + "." if m.unsupported else "")
    )

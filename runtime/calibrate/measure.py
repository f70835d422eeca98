"""Calibration microbenchmarks: measure the cost model's hardware figures on this machine (SPEC §6).

What is timed (:mod:`rpeg.costmodel.fit` fits each to the formula the cost model uses and
assembles the :class:`~rpeg.ir.hardware.Hardware`):

* **GEMM-shape sweep** (:func:`measure_gemm`): ``torch.matmul`` of ``(M × K) @ (K × n)`` over a
  grid of ``M = b·ℓ`` and ``K`` → ``F_peak, γM, γK``, fitted over the shapes that compute
  dominates (:func:`~rpeg.costmodel.fit.compute_bound_gemms`: at least twice both their memory
  time and the dispatch floor that :func:`measure_dispatch` times).
* **Memory copy** (:func:`measure_copy`): ``BW_mem = 2·bytes/t`` (bytes read plus bytes written)
  of a large tensor copy.
* **Non-GEMM work** (:func:`measure_nongemm`): two RMSNorms, the causal softmax of the attention
  scores, ``SiLU(gate)·up`` and two residual adds of one transformer layer's forward pass at
  ``B_cal`` sequences of a reference length (:class:`~rpeg.costmodel.fit.NonGemmShape`) → ``c_ng``.
* **Collectives and P2P** (:func:`measure_comm`): ``p`` processes on this host
  (``torch.multiprocessing``, gloo on CPU, NCCL on GPUs) time AllReduce, AllGather, ReduceScatter,
  AlltoAll and ping-pong send/recv over a range of message sizes → tier-0 ``(α, β)``.

:func:`calibrate` runs them all and fits the result (:func:`~rpeg.costmodel.fit.fit_hardware`).

The CPU path (``device="cpu"``, float32 as the CPU runtime computes, gloo) is the one exercised
by the tests. The GPU path (``device="cuda"``: bfloat16 GEMMs and non-GEMM work, NCCL, one
process per GPU) follows the same code; its single-GPU part ran once on an H200
(benchmarks/RESULTS.md, "gpu-check"; no suite test can run it), its collectives never (one GPU).

Importing this module does not import torch; the measuring functions do.

Example
-------
>>> from rpeg.runtime.calibrate.measure import calibrate                # doctest: +SKIP
>>> report = calibrate(quick=True, max_ranks=2)              # doctest: +SKIP
>>> print(report.table()); report.hardware.save("hw.json")   # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...costmodel.fit import (
    COLLECTIVES,
    CalibrationReport,
    CommSample,
    CopySample,
    GemmSample,
    Measurements,
    NonGemmShape,
    fit_hardware,
)
from ...costmodel.hardware import load_hardware
from ...ir.hardware import Hardware

__all__ = [
    "DEFAULT_NONGEMM",
    "DEVICES",
    "calibrate",
    "measure_comm",
    "measure_copy",
    "measure_dispatch",
    "measure_gemm",
    "measure_nongemm",
]

#: Devices :func:`calibrate` knows.
DEVICES = ("cpu", "cuda")

KIB = 1024
MIB = 1024 * KIB

Progress = Callable[[str], None]

#: Default non-GEMM layer per device: a tiny CPU-runtime layer, a Llama-2-7B layer on GPUs
#: (``d = 4096`` at ``8 × 640`` tokens, as the GPU presets' nominal ``c_ng`` assumes).
DEFAULT_NONGEMM = {
    "cpu": NonGemmShape(),
    "cuda": NonGemmShape(hidden=4096, ffn_hidden=11008, heads=32, seq_len=640, batch=8),
}


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


def measure_dispatch(*, device: str = "cpu", repeats: int = 5) -> float:
    """Median seconds per ``torch.matmul`` of two ``1 × 1`` tensors issued back to back: the
    dispatch floor under which a GEMM's time says nothing about the device's arithmetic
    (:func:`~rpeg.costmodel.fit.compute_bound_gemms`)."""
    torch = _torch()
    a = torch.ones(1, 1, device=device, dtype=_dtype(device))
    return statistics.median(_time_call(lambda: torch.matmul(a, a), device, repeats))


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

    Spawns ``max_ranks`` processes once (``torch.multiprocessing``, meeting through a file store in
    a private temporary folder; gloo on CPU, NCCL with one GPU per rank on CUDA) and times each primitive on the sub-group of the first
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

    * ``F = F_peak·(M/(M + γM))·(K/(K + γK))`` to the GEMM sweep (:func:`~rpeg.costmodel.fit.fit_gemm`);
    * ``BW_mem = median(2·bytes/t)`` of large copies;
    * ``c_ng = median(t_layer)`` of one layer's non-GEMM work at ``B_cal`` sequences;
    * tier-0 collective ``(α, β)`` from AllReduce ``2(p−1)α + 2((p−1)/p)Mβ``, AllGather and
      ReduceScatter ``(p−1)α + ((p−1)/p)Mβ`` and AlltoAll ``(p−1)α + Mβ`` jointly, and tier-0 P2P
      ``(α, β)`` from ``α + Mβ`` (:func:`~rpeg.costmodel.fit.fit_alpha_beta`).

    Tiers 1 and 2 are copied from ``base`` (one machine cannot measure them), as are the memory
    figures on CPU (on CUDA ``M_GPU`` is the device's memory and ``gpus_per_node`` its count).
    The ``notes`` of the result say which figures were measured and which inherited.

    Parameters
    ----------
    device
        ``"cpu"`` (float32, gloo) or ``"cuda"`` (bfloat16, NCCL; ran on one H200, never on several
        GPUs; no suite test can run it).
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
        started = time.perf_counter()
        report = fit_hardware(_measure(device, quick, max_ranks, seed, progress, nongemm), base_hw)
        report.elapsed = time.perf_counter() - started
        return report
    finally:
        torch.set_num_threads(saved_threads)


def _measure(
    device: str,
    quick: bool,
    max_ranks: int,
    seed: int,
    progress: Progress | None,
    nongemm: NonGemmShape | None,
) -> Measurements:
    """Run every microbenchmark of :func:`calibrate` (module docstring) and collect the samples."""
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
    floor = measure_dispatch(device=device, repeats=plan.gemm_repeats)

    say(f"memory copy: {plan.copy_bytes // MIB} MiB")
    copies = measure_copy(plan.copy_bytes, device=device, repeats=repeats)

    say(f"non-GEMM layer: d = {shape.hidden}, {shape.batch} × {shape.seq_len} tokens")
    ng = measure_nongemm(shape, device=device, repeats=repeats, seed=seed)

    comm: list[CommSample] = []
    unsupported: tuple[str, ...] = ()
    ranks = max_ranks if device == "cpu" else min(max_ranks, n_gpus)
    comm_note = ""
    if ranks >= 2:
        say(f"collectives and P2P: p = 2..{ranks}, {len(plan.sizes)} message sizes")
        comm, unsupported = measure_comm(ranks, plan.sizes, device=device, repeats=repeats)
        if device == "cpu" and max_ranks > (os.cpu_count() or 1):
            comm_note = f" ({max_ranks} ranks on {os.cpu_count()} cores: oversubscribed)"
    else:
        comm_note = f" (not measured: {n_gpus} GPU(s), collectives need 2)"

    cuda = device == "cuda"
    return Measurements(
        device=device,
        quick=quick,
        seed=seed,
        dtype="float32" if device == "cpu" else "bfloat16",
        threads=torch.get_num_threads(),
        host=socket.gethostname() or "host",
        gemm=gemm,
        copies=copies,
        nongemm_shape=shape,
        nongemm_seconds=list(ng),
        comm=comm,
        unsupported=unsupported,
        comm_note=comm_note,
        gpu_memory_bytes=float(torch.cuda.get_device_properties(0).total_memory) if cuda else None,
        gpus_per_node=n_gpus if cuda else None,
        dispatch_floor=floor,
    )

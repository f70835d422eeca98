"""Calibration fits (``costmodel/fit.py``): the fits recover known figures, and samples of a
known machine make the hardware file they describe. The measuring is tested in
``tests/runtime/test_measure.py``."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rpeg.costmodel import Hardware, allgather_time, allreduce_time, alltoall_time, hardware_preset, p2p_time
from rpeg.costmodel.collectives import reduce_scatter_time
from rpeg.costmodel.fit import (
    COLLECTIVES,
    CommSample,
    CopySample,
    GemmSample,
    Measurements,
    NonGemmShape,
    comm_coefficients,
    compute_bound_gemms,
    fit_alpha_beta,
    fit_gemm,
    fit_hardware,
    gemm_efficiency,
)
from rpeg.ir.hardware import Link

COSTMODEL = Path(__file__).resolve().parents[2] / "costmodel"

GEMM_TRUTH = (150e9, 12.0, 48.0)  # F_peak, γM, γK
GRID_M = np.array([1, 4, 16, 64, 256, 1024, 2048], dtype=float)
GRID_K = np.array([16, 64, 256, 1024, 2048], dtype=float)


def _gemm_data(noise: float, seed: int = 0):
    m, k = (a.ravel() for a in np.meshgrid(GRID_M, GRID_K, indexing="ij"))
    f_peak, gm, gk = GEMM_TRUTH
    flops = f_peak * gemm_efficiency(m, k, gm, gk)
    rng = np.random.default_rng(seed)
    return m, k, flops * (1.0 + noise * rng.uniform(-1.0, 1.0, size=flops.size))


def test_fit_gemm_recovers_exact_parameters():
    fit = fit_gemm(*_gemm_data(0.0))
    assert fit.peak_flops == pytest.approx(GEMM_TRUTH[0], rel=1e-6)
    assert fit.gamma_m == pytest.approx(GEMM_TRUTH[1], rel=1e-5)
    assert fit.gamma_k == pytest.approx(GEMM_TRUTH[2], rel=1e-5)
    assert fit.rel_rms < 1e-8
    assert fit.n_samples == GRID_M.size * GRID_K.size


def test_fit_gemm_with_5_percent_noise():
    fit = fit_gemm(*_gemm_data(0.05, seed=3))
    assert fit.peak_flops == pytest.approx(GEMM_TRUTH[0], rel=0.05)
    assert fit.gamma_m == pytest.approx(GEMM_TRUTH[1], rel=0.25)
    assert fit.gamma_k == pytest.approx(GEMM_TRUTH[2], rel=0.25)
    assert 0.01 < fit.rel_rms < 0.05  # uniform ±5 % noise has RMS 2.9 %


def test_fit_gemm_handles_a_gamma_of_zero():
    m, k = (a.ravel() for a in np.meshgrid(GRID_M, GRID_K, indexing="ij"))
    fit = fit_gemm(m, k, 80e9 * gemm_efficiency(m, k, 0.0, 30.0))
    assert fit.gamma_m < 1e-3
    assert fit.gamma_k == pytest.approx(30.0, rel=1e-4)
    assert fit.peak_flops == pytest.approx(80e9, rel=1e-4)


def test_fit_gemm_rejects_bad_input():
    with pytest.raises(ValueError, match="at least 3"):
        fit_gemm([1, 2], [1, 2], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        fit_gemm([1, 2, 3], [1, 2, 3], [1.0, 0.0, 2.0])


SIZES = [1024 * 4**i for i in range(8)]
TIMES = {
    "allreduce": allreduce_time,
    "allgather": allgather_time,
    "reducescatter": reduce_scatter_time,
    "alltoall": alltoall_time,
}


def _comm_data(link: Link, noise: float, seed: int = 0, p2p: bool = False):
    rows = []
    if p2p:
        rows = [("p2p", 2, m, p2p_time(m, link)) for m in SIZES]
    else:
        rows = [
            (prim, p, m, TIMES[prim](p, m, link)) for prim in COLLECTIVES for p in (2, 3, 4) for m in SIZES
        ]
    rng = np.random.default_rng(seed)
    a, b, t = [], [], []
    for prim, p, m, seconds in rows:
        ca, cb = comm_coefficients(prim, p, m)
        a.append(ca)
        b.append(cb)
        t.append(seconds * (1.0 + noise * rng.uniform(-1.0, 1.0)))
    return a, b, t


@pytest.mark.parametrize("p2p", [False, True])
def test_fit_alpha_beta_recovers_exact_parameters(p2p):
    truth = Link(alpha=60e-6, beta=1 / 3e9)
    fit = fit_alpha_beta(*_comm_data(truth, 0.0, p2p=p2p))
    assert fit.alpha == pytest.approx(truth.alpha, rel=1e-9)
    assert fit.beta == pytest.approx(truth.beta, rel=1e-9)
    assert fit.rel_rms < 1e-9


@pytest.mark.parametrize("p2p", [False, True])
def test_fit_alpha_beta_with_5_percent_noise(p2p):
    truth = Link(alpha=60e-6, beta=1 / 3e9)
    fit = fit_alpha_beta(*_comm_data(truth, 0.05, seed=1, p2p=p2p))
    assert fit.alpha == pytest.approx(truth.alpha, rel=0.1)
    assert fit.beta == pytest.approx(truth.beta, rel=0.1)
    assert fit.rel_rms < 0.05


def test_fit_alpha_beta_never_goes_negative():
    # times that fall with size would want α > t and β < 0; the fit clamps β at 0
    fit = fit_alpha_beta([1, 1, 1], [1e3, 1e5, 1e6], [3e-4, 2e-4, 1e-4])
    assert fit.alpha > 0 and fit.beta == 0.0
    Link(fit.alpha, fit.beta)  # a valid link


def test_comm_coefficients_match_the_cost_model():
    link = Link(alpha=1.0, beta=0.0)
    for prim in COLLECTIVES:
        assert comm_coefficients(prim, 4, 0)[0] == TIMES[prim](4, 0, link)
    link = Link(alpha=0.0, beta=1.0)
    for prim in COLLECTIVES:
        assert comm_coefficients(prim, 4, 4096)[1] == pytest.approx(TIMES[prim](4, 4096, link))
    assert comm_coefficients("p2p", 2, 4096) == (1.0, 4096.0)
    with pytest.raises(ValueError, match="broadcast"):
        comm_coefficients("broadcast", 2, 1)


# ---------------------------------------------------------------------------- the hardware file
LINK = Link(alpha=60e-6, beta=1 / 3e9)
P2P = Link(alpha=20e-6, beta=1 / 5e9)
SHAPE = NonGemmShape()


def _measurements(comm=True, **kwargs) -> Measurements:
    """Samples of a machine with known figures: exact GEMM throughputs, a 10 GB/s copy, a 2 ms
    non-GEMM layer, and (``comm``) exact tier-0 collective and P2P times for p = 2, 3."""
    f_peak, gm, gk = GEMM_TRUTH
    gemm = [
        GemmSample(int(m), int(k), 256, 2.0 * m * k * 256 / (f_peak * gemm_efficiency(m, k, gm, gk)))
        for m in GRID_M
        for k in GRID_K
    ]
    copies = [CopySample(1 << 20, 2.0 * (1 << 20) / bw) for bw in (9e9, 10e9, 11e9)]
    samples = []
    if comm:
        samples = [
            CommSample(prim, p, m, TIMES[prim](p, m, LINK))
            for prim in COLLECTIVES
            for p in (2, 3)
            for m in SIZES
        ]
        samples += [CommSample("p2p", 2, m, p2p_time(m, P2P)) for m in SIZES]
    fields = {
        "device": "cpu",
        "quick": True,
        "seed": 0,
        "dtype": "float32",
        "threads": 1,
        "host": "testhost",
        "gemm": gemm,
        "copies": copies,
        "nongemm_shape": SHAPE,
        "nongemm_seconds": [1.9e-3, 2.0e-3, 2.2e-3],
        "comm": samples,
    }
    return Measurements(**{**fields, **kwargs})


def test_fit_hardware_recovers_the_machine_and_inherits_the_rest():
    base = hardware_preset("cpu")
    r = fit_hardware(_measurements(), base)
    hw = r.hardware
    assert hw.name == "calibrated-testhost"
    assert hw.peak_flops == pytest.approx(GEMM_TRUTH[0], rel=1e-6)
    assert (hw.gamma_m, hw.gamma_k) == pytest.approx(GEMM_TRUTH[1:], rel=1e-5)
    assert hw.mem_bandwidth == pytest.approx(10e9)  # the median copy
    assert hw.c_nongemm == 2.0e-3 and hw.b_cal == SHAPE.batch
    assert hw.collective[0].alpha == pytest.approx(LINK.alpha) and hw.collective[0].beta == pytest.approx(
        LINK.beta
    )
    assert hw.p2p[0].alpha == pytest.approx(P2P.alpha) and hw.p2p[0].beta == pytest.approx(P2P.beta)
    assert set(r.primitive_fits) == set(COLLECTIVES)
    # what one machine cannot measure comes from the base
    assert hw.collective[1:] == base.collective[1:] and hw.p2p[1:] == base.p2p[1:]
    assert hw.gpu_memory_bytes == base.gpu_memory_bytes and hw.gpus_per_node == base.gpus_per_node
    assert hw.memory_headroom == base.memory_headroom
    assert r.measured == (
        "peak_flops", "gamma_m", "gamma_k", "mem_bandwidth", "c_nongemm", "b_cal", "l_cal", "d_cal",
        "collective[0]", "p2p[0]",
    )  # fmt: skip
    assert "collective[1]" in r.inherited and "gpu_memory_bytes" in r.inherited
    assert "Inherited from 'cpu'" in hw.notes and "Measured:" in hw.notes and "tier-0 P2P" in hw.notes
    assert r.elapsed == 0.0  # the measuring side times the run
    # every figure says where it comes from: this calibration, or the base and what it cites
    sources = dict(hw.sources)
    assert sources["peak_flops"].startswith("measured by rpeg calibrate on testhost")
    assert sources["collective.intra-node"].startswith("measured")
    assert sources["collective.inter-node"] == (
        f"inherited from 'cpu': {dict(base.sources)['collective.inter-node']}"
    )
    assert sources["gpu_memory_bytes"].startswith("inherited from 'cpu'")
    table = r.table()
    assert "inherited" in table and "measured" in table and "collective t0" in table
    brief = r.summary().splitlines()  # the figures measured here, on two lines
    assert len(brief) == 2 and "F_peak" in brief[0] and "BW_mem" in brief[0]
    assert brief[1].startswith("  measured links (tier 0): collective α ")
    assert json.loads(json.dumps(r.to_dict()))["format"] == "rpeg.calibration/1"


def _gpu_like_sweep(floor: float) -> tuple[list[GemmSample], tuple[float, float, float], float]:
    """The CUDA plan's sweep timed on a device that is a dispatch floor, a bandwidth roofline and
    ``F_peak·η`` at once: ``t = max(t_floor, sb·(MK + Kn + Mn)/BW, 2MKn/(F_peak·η))``."""
    truth, bw, n = (800e12, 300.0, 400.0), 4e12, 4096
    samples = []
    for m in (1, 16, 64, 256, 1024, 4096, 16384):
        for k in (128, 512, 1024, 2048, 4096, 8192):
            compute = 2.0 * m * k * n / (truth[0] * gemm_efficiency(m, k, *truth[1:]))
            samples.append(GemmSample(m, k, n, max(floor, 2 * (m * k + k * n + m * n) / bw, float(compute))))
    return samples, truth, bw


def test_the_gemm_fit_leaves_out_bandwidth_and_dispatch_bound_shapes():
    """Fitted over every shape, ``η`` bends to the small shapes' roofline and floor and
    ``F_peak`` lands far from the truth (as on the H200); over the compute-bound ones it is exact."""
    floor = 8e-6
    samples, truth, bw = _gpu_like_sweep(floor)
    keep = compute_bound_gemms(samples, bandwidth=bw, dtype_bytes=2, floor=floor)
    assert 0 < len(keep) < len(samples)
    assert all(s.m >= 256 for s in keep) and not any(s.m == 1 for s in keep)
    naive = fit_gemm([s.m for s in samples], [s.k for s in samples], [s.flops_per_s for s in samples])
    assert abs(naive.peak_flops / truth[0] - 1.0) > 0.2
    copies = [CopySample(1 << 30, 2.0 * (1 << 30) / bw)]
    m = _measurements(
        gemm=samples, copies=copies, dtype="bfloat16", device="cuda", comm=[], dispatch_floor=floor
    )
    r = fit_hardware(m, hardware_preset("h200"))
    assert r.hardware.peak_flops == pytest.approx(truth[0], rel=1e-6)
    assert (r.hardware.gamma_m, r.hardware.gamma_k) == pytest.approx(truth[1:], rel=1e-5)
    assert r.gemm_fit.n_samples == len(keep) and r.gemm_fit.n_excluded == len(samples) - len(keep)
    assert f"{len(keep)} compute-bound of {len(samples)} shapes" in r.hardware.notes
    assert "dispatch floor 8.0 µs" in r.hardware.notes
    assert "bandwidth-/dispatch-bound left out" in r.table()


def test_the_gemm_fit_takes_every_shape_when_too_few_are_compute_bound():
    samples, _, bw = _gpu_like_sweep(floor=1.0)  # a floor of a second: nothing is compute-bound
    copies = [CopySample(1 << 30, 2.0 * (1 << 30) / bw)]
    assert compute_bound_gemms(samples, bandwidth=bw, dtype_bytes=2, floor=1.0) == []
    m = _measurements(gemm=samples, copies=copies, dtype="bfloat16", comm=[], dispatch_floor=1.0)
    # every shape at the floor: F_peak·η ∝ M·K has no finite fit (γ and F_peak run away, ~9e40
    # FLOP/s), which the hardware's plausible ranges refuse, naming the figure (issue 33)
    with pytest.raises(ValueError, match=r"peak_flops must be a number in \[1e9, 1e18\] FLOP/s, got 9"):
        fit_hardware(m, hardware_preset("h200"))
    # a floor measured above all but the largest shape's time: too few compute-bound, fitted over all
    samples = _gpu_like_sweep(8e-6)[0]
    assert len(compute_bound_gemms(samples, bandwidth=bw, dtype_bytes=2, floor=5e-4)) < 3
    m = _measurements(gemm=samples, copies=copies, dtype="bfloat16", comm=[], dispatch_floor=5e-4)
    r = fit_hardware(m, hardware_preset("h200"))
    assert r.gemm_fit.n_samples == len(samples) and r.gemm_fit.n_excluded == 0
    assert f"all {len(samples)} shapes" in r.hardware.notes


def test_fit_hardware_refuses_an_unknown_dtype():
    with pytest.raises(ValueError, match=r"dtype must be one of .*got 'int8'"):
        fit_hardware(_measurements(dtype="int8"), hardware_preset("cpu"))


def test_fit_hardware_without_collectives_inherits_tier_0_and_says_why(tmp_path):
    note = " (not measured: 1 GPU(s), collectives need 2)"
    r = fit_hardware(
        _measurements(comm=False, comm_note=note, gpu_memory_bytes=80e9, gpus_per_node=1),
        hardware_preset("h100"),
    )
    hw = r.hardware
    assert r.collective_fit is None and r.p2p_fit is None and not r.primitive_fits
    assert hw.collective == hardware_preset("h100").collective
    assert "collective[0]" in r.inherited and "p2p[0]" in r.inherited
    assert hw.gpu_memory_bytes == 80e9 and hw.gpus_per_node == 1 and "gpu_memory_bytes" in r.measured
    assert note in hw.notes
    path = tmp_path / "hw.json"
    hw.save(path)
    assert Hardware.load(path) == hw


def test_fit_hardware_names_unsupported_primitives():
    r = fit_hardware(_measurements(unsupported=("alltoall",)), hardware_preset("cpu"))
    assert "Unsupported by the backend: alltoall." in r.hardware.notes
    assert "unsupported by the backend: alltoall" in r.table()


# ---------------------------------------------------------------------------- no torch
def test_no_module_of_the_cost_model_imports_torch():
    """Not at the top, not inside a function: the cost model is numpy only."""
    for path in sorted(COSTMODEL.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            assert not any(n == "torch" or n.startswith("torch.") for n in names), (
                f"{path.name} imports torch"
            )


def test_importing_the_cost_model_does_not_import_torch():
    modules = sorted(f"rpeg.costmodel.{p.stem}" for p in COSTMODEL.glob("*.py") if p.stem != "__init__")
    assert "rpeg.costmodel.fit" in modules
    code = f"import sys, rpeg.costmodel, {', '.join(modules)}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

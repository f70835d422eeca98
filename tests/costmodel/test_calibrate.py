"""Calibration: the fits recover known figures; a quick run yields a usable hardware file."""

import argparse
import json
import subprocess
import sys

import numpy as np
import pytest

from rpeg.costmodel import Hardware, allgather_time, allreduce_time, alltoall_time, p2p_time
from rpeg.costmodel.calibrate import (
    COLLECTIVES,
    CalibrationReport,
    calibrate,
    comm_coefficients,
    fit_alpha_beta,
    fit_gemm,
    gemm_efficiency,
    register_cli,
)
from rpeg.costmodel.collectives import reduce_scatter_time
from rpeg.costmodel.time import Layout, op_time
from rpeg.ir import Cluster, model_preset
from rpeg.ir.hardware import Link
from rpeg.ir.types import Role

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


# ---------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def quick_report() -> CalibrationReport:
    return calibrate(quick=True, max_ranks=2, seed=0)


def test_quick_calibration_measures_what_it_claims(quick_report):
    r = quick_report
    hw = r.hardware
    assert hw.name.startswith("calibrated-")
    assert r.device == "cpu" and r.dtype == "float32" and r.quick
    # every measured figure comes from samples in the report
    assert hw.peak_flops == r.gemm_fit.peak_flops and len(r.gemm) == r.gemm_fit.n_samples >= 9
    assert hw.mem_bandwidth == pytest.approx(float(np.median([s.bandwidth for s in r.copies])))
    assert hw.c_nongemm == pytest.approx(float(np.median(r.nongemm_seconds)))
    assert hw.b_cal == r.nongemm_shape.batch
    assert {s.primitive for s in r.comm} == {*COLLECTIVES, "p2p"} - set(r.unsupported)
    assert {s.p for s in r.comm} == {2}
    assert hw.collective[0] == r.collective_fit.link
    assert hw.p2p[0] == r.p2p_fit.link
    for fit in (r.gemm_fit, r.collective_fit, r.p2p_fit):
        assert np.isfinite(fit.rel_rms)
    assert r.elapsed < 30


def test_quick_calibration_inherits_and_says_so(quick_report):
    hw, base = quick_report.hardware, Hardware.load(_preset_path("cpu"))
    assert hw.collective[1:] == base.collective[1:] and hw.p2p[1:] == base.p2p[1:]
    assert hw.gpu_memory_bytes == base.gpu_memory_bytes
    assert "collective[1]" in quick_report.inherited and "peak_flops" in quick_report.measured
    assert "Inherited from 'cpu'" in hw.notes and "Measured:" in hw.notes
    table = quick_report.table()
    assert "inherited" in table and "measured" in table and "fit" in table


def _preset_path(name):
    from rpeg.costmodel import hardware

    return hardware._PRESET_DIR / f"{name}.json"


def test_calibrated_hardware_round_trips_and_prices_an_op(quick_report, tmp_path):
    path = tmp_path / "hw.json"
    quick_report.hardware.save(path)
    hw = Hardware.load(path)
    assert hw == quick_report.hardware
    assert json.loads(path.read_text())["format"] == "rpeg.hardware/1"
    json.dumps(quick_report.to_dict())  # raw report is JSON-ready
    cluster = Cluster.from_shape("1x1x4", hw)
    model = model_preset("7b").scaled(layers=2, hidden=256, heads=4, vocab=1000)
    t = op_time(
        model, Role.INFERENCE, Layout(dp=1, pp=1, tp=2, mb=1, gpus_per_node=4), cluster.hardware,
        sequences=4, prompt_len=64, response_len=64,
    )  # fmt: skip
    assert t.total > 0 and t.tp_comm > 0 and t.nongemm > 0


# ---------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"device": "tpu"}, "device.*'tpu'"),
        ({"max_ranks": 1}, "max_ranks.*1"),
        ({"base": "no-such-gpu"}, "base 'no-such-gpu'"),
        ({"threads": 0}, "threads.*0"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        calibrate(quick=True, **kwargs)


def test_importing_the_cost_model_does_not_import_torch():
    code = "import sys, rpeg.costmodel, rpeg.costmodel.calibrate; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------------- CLI
def test_cli_writes_a_valid_file(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="rpeg")
    register_cli(parser.add_subparsers(dest="command", required=True))
    out, raw = tmp_path / "hw.json", tmp_path / "raw.json"
    args = parser.parse_args(
        ["calibrate", "--out", str(out), "--quick", "--max-ranks", "2", "--raw", str(raw), "--no-progress"]
    )
    assert args.fn(args) == 0
    hw = Hardware.load(out)
    assert hw.name.startswith("calibrated-")
    assert json.loads(raw.read_text())["format"] == "rpeg.calibration/1"
    printed = capsys.readouterr().out
    assert "F_peak" in printed and "collective t0" in printed and f"wrote {out}" in printed


def test_cli_rejects_an_unknown_device():
    parser = argparse.ArgumentParser(prog="rpeg")
    register_cli(parser.add_subparsers(dest="command", required=True))
    with pytest.raises(SystemExit):
        parser.parse_args(["calibrate", "--out", "x.json", "--device", "tpu"])

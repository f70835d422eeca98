"""Calibration microbenchmarks (``runtime/calibrate/measure.py``): a quick run measures what it claims
and yields a usable hardware file; ``rpeg calibrate`` writes it. The fits themselves are tested
in ``tests/costmodel/test_fit.py``."""

import json

import numpy as np
import pytest

from rpeg.cli import main
from rpeg.costmodel import Hardware
from rpeg.costmodel.fit import COLLECTIVES, CalibrationReport
from rpeg.costmodel.layout import Layout
from rpeg.costmodel.time import op_time
from rpeg.ir import Cluster, model_preset
from rpeg.ir.plan import Strategy
from rpeg.ir.types import Role
from rpeg.runtime.calibrate.measure import calibrate, measure_gemm


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
    assert hw.peak_flops == r.gemm_fit.peak_flops
    assert len(r.gemm) == r.gemm_fit.n_samples + r.gemm_fit.n_excluded and r.gemm_fit.n_samples >= 3
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
    assert json.loads(path.read_text())["format"] == "rpeg.hardware/2"
    json.dumps(quick_report.to_dict())  # raw report is JSON-ready
    cluster = Cluster.from_shape("1x1x4", hw)
    model = model_preset("7b").scaled(layers=2, hidden=256, heads=4, vocab=1000)
    t = op_time(
        model, Role.INFERENCE, Layout(Strategy((1, 1, 2), 1, 1, 2, 1), 4), cluster.hardware,
        sequences=4, prompt_len=64, response_len=64,
    )  # fmt: skip
    assert t.total > 0 and t.tp_comm > 0 and t.nongemm > 0


def test_gemm_samples_come_back_in_grid_order():
    samples = measure_gemm([1, 8], [16, 32], 16, repeats=1, seed=3)  # timed in a shuffled order
    assert [(s.m, s.k, s.n) for s in samples] == [(1, 16, 16), (1, 32, 16), (8, 16, 16), (8, 32, 16)]
    assert all(s.seconds > 0 and s.flops_per_s > 0 for s in samples)


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


# ---------------------------------------------------------------------------- CLI
def test_cli_writes_a_valid_file(tmp_path, capsys):
    out, raw = tmp_path / "hw.json", tmp_path / "raw.json"
    argv = ["calibrate", "--out", str(out), "--quick", "--max-ranks", "2", "--raw", str(raw), "--no-progress"]
    argv += ["--engines", "none"]  # the engines' calibration: tests/runtime/test_engine_calibration.py
    assert main(argv) == 0
    hw = Hardware.load(out)
    assert hw.name.startswith("calibrated-")
    assert json.loads(raw.read_text())["format"] == "rpeg.calibration/1"
    printed = capsys.readouterr().out
    assert "F_peak" in printed and "collective t0" in printed and f"wrote {out}" in printed


def test_cli_rejects_an_unknown_device(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--out", "x.json", "--device", "tpu"])
    assert exc.value.code == 2 and "invalid choice: 'tpu'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--out", "hw.txt"], "--out"),
        (["--out", "hw.json", "--max-ranks", "1"], "--max-ranks must be at least 2, got 1"),
        (["--out", "hw.json", "--threads", "0"], "--threads must be a positive integer, got 0"),
        (["--out", "hw.json", "--base", "no-such-gpu"], "no-such-gpu"),
        (["--out", "hw.json", "--engines", "torch,sglang"], "--engines: expected 'none' or a comma list"),
        (
            ["--out", "hw.json", "--engines", "torch", "--device", "cuda"],
            "GPU engine calibration is not implemented",
        ),
        (["--out", "hw.json", "--engines", "none", "--in-situ"], "--in-situ scales the engine terms"),
        (["--out", "hw.json", "--engines", "vllm", "--in-situ"], "must include torch"),
        (
            ["--out", "hw.json", "--in-situ", "--in-situ-steps", "1"],
            "--in-situ-steps must be at least 2 (step 0 is warm-up), got 1",
        ),
    ],
)
def test_cli_names_a_bad_flag_before_measuring(flags, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", *flags]) == 2
    assert message in capsys.readouterr().err

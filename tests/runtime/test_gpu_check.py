"""``benchmarks/gpu_check.py`` on CPU: the GPU script's stages run with a tiny model and a quick
calibration, and its report puts rpeg's predictions beside every measured row.

The script ran on one H200 on 2026-12-04 (benchmarks/RESULTS.md, "gpu-check"); this checks the
part that can run here, so that a change breaks here before it wastes a GPU lease.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import load_benchmark

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpu_check():
    return load_benchmark("gpu_check")


@pytest.fixture(scope="module")
def measured(gpu_check, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    return gpu_check.measure(out, "cpu", tiny=True, seed=0)


def test_measure_runs_every_stage_and_row(gpu_check, measured):
    data = json.loads(Path(measured).read_text())
    assert "hardware" in data["calibration"], data["calibration"]
    assert Path(measured).with_name("gpu_calibrated.json").exists()
    rows = [(r["kind"], r["b"], r["ell"]) for r in data["rows"]]
    assert rows == [(kind, b, ell) for kind, shapes in gpu_check.TINY_ROWS.items() for b, ell in shapes]
    for row in data["rows"]:
        assert "oom" not in row
        assert row["seconds"] > 0 and len(row["times"]) == 3
    assert data["adam"]["params"] == gpu_check.ADAM_PARAMS_TINY and data["adam"]["seconds"] > 0
    assert "megatron" not in data  # CUDA only


def test_measure_runs_the_decode_sweep(gpu_check, measured):
    data = json.loads(Path(measured).read_text())
    assert [(r["b"], r["c"]) for r in data["decode"]] == gpu_check.DECODE_ROWS_TINY
    steps = gpu_check.DECODE_STEPS_TINY
    for row in data["decode"]:
        assert "oom" not in row and row["steps"] == steps and len(row["step_times"]) == steps - 1
        assert row["timed_steps"] == steps - 1 - gpu_check.DECODE_WARMUP
        assert row["prefill_s"] > 0 and row["tokens_per_s"] == pytest.approx(
            row["b"] * row["timed_steps"] / row["decode_s"]
        )


def test_report_predicts_every_row(gpu_check, measured):
    lines = gpu_check.report(measured, write=False)
    table = [line for line in lines if line.startswith(("| train", "| logprob"))]
    data = json.loads(Path(measured).read_text())
    assert len(table) == len(data["rows"])
    for line, row in zip(table, data["rows"]):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == row["kind"] and cells[1] == f"{row['b']} × {row['ell']}"
        # measured, then seconds and ratio on the preset and on the calibrated figures
        assert float(cells[3]) > 0 and float(cells[5]) > 0
    assert any(line.startswith("| peak_flops") for line in lines)
    assert sum("AdamW" in line for line in lines) == 2
    decode = [line for line in lines if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert len(decode) == len(data["decode"])
    assert any(line.startswith("Megatron-core RL loop (stage 5): not run") for line in lines)


def test_predictions_follow_the_recomputation_mode(gpu_check):
    """Full recomputation keeps less than none and costs more time (the terms compared on GPU)."""
    from rpeg.costmodel import hardware_preset
    from rpeg.ir.models import model_preset

    spec, hw = model_preset(gpu_check.GPU_MODEL), hardware_preset("h200")
    none = gpu_check.predict({"kind": "train-none", "b": 1, "ell": 8192}, spec, hw)
    full = gpu_check.predict({"kind": "train-full", "b": 1, "ell": 8192}, spec, hw)
    logp = gpu_check.predict({"kind": "logprob", "b": 1, "ell": 8192}, spec, hw)
    assert full["memory"] < none["memory"] and full["seconds"] > none["seconds"]
    assert full["logits"] == none["logits"] == 2 * logp["logits"]  # training holds their gradient too
    assert logp["seconds"] < none["seconds"] / 2
    # a chunked loss holds c tokens' logits (and their gradient) and recomputes the head's forward
    chunked = gpu_check.predict({"kind": "train-full-chunk", "b": 4, "ell": 8192, "chunk": 4096}, spec, hw)
    whole = gpu_check.predict({"kind": "train-full", "b": 4, "ell": 8192}, spec, hw)
    assert chunked["logits"] == whole["logits"] * 4096 / (4 * 8192)
    assert whole["seconds"] < chunked["seconds"] < 1.05 * whole["seconds"]


def test_megatron_outcome_is_reported_in_words(gpu_check):
    spec = gpu_check.MEGATRON_SPEC
    ok = {"spec": spec, "logprob_gap_vs_hf": 3e-6, "mean_logprob_hf": -6.9, "seconds_6_steps": 1.0}
    fell = gpu_check.megatron_lines({**ok, "losses": [[6.9, 6.95], *[[6.0]] * 4, [5.0, 5.2]]})
    assert "fell, 6.9250 → 5.1000" in fell[0] and "3.00e-06" in fell[0]
    flat = gpu_check.megatron_lines({**ok, "losses": [[6.9], [7.0]]})
    assert "**did not fall**" in flat[0]
    assert "failed: RuntimeError: x" in gpu_check.megatron_lines({"error": "RuntimeError: x"})[0]
    assert "not run" in gpu_check.megatron_lines(None)[0]

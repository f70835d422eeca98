"""NVFP4 GEMMs (issue 31; ``docs/cost-model.md`` §11, "NVFP4"): the Blackwell presets' FP4 peaks,
the hardware file's optional ``peak_flops_fp4``, the refusal elsewhere, and the NVFP4 operand of
``q = 0.5625`` bytes where FP8 has 1 — in the roofline, the quantize kernels, the saved GEMM
inputs and a generation engine's weights."""

import json
from dataclasses import replace

import pytest

from rpeg.costmodel import Hardware, hardware_preset
from rpeg.costmodel.layout import Layout
from rpeg.costmodel.memory import (
    quantized_saved_widths,
    served_weight_bytes,
    stored_activation_width,
    training_activation_bytes,
    weight_bytes,
    zero_state_bytes,
)
from rpeg.costmodel.precision import check_precision, gemm_peaks, quantize_scalars
from rpeg.costmodel.time import op_time
from rpeg.ir.errors import InputError
from rpeg.ir.models import model_preset
from rpeg.ir.plan import Strategy
from rpeg.ir.types import Role
from tests.conftest import load_benchmark

M = model_preset("llama3.1-8b")
M8 = replace(M, precision="fp8")
M4 = replace(M, precision="nvfp4")
Q = 0.5 + 1 / 16

# Published dense FP4 tensor-core peaks (each preset's ``sources["peak_flops_fp4"]``), FLOP/s.
FP4_DENSE = {"b200": 9000e12, "b300": 13125e12, "gb200-nvl72": 10000e12, "gb300-nvl72": 15000e12}


def _fp4_efficiency() -> float:
    return load_benchmark("gpu_fidelity").FP4_EFFICIENCY


def _layout(tp=1, pp=1, dp=1, mb=1, **kw):
    return Layout(Strategy((1, 1, tp * pp * dp), dp=dp, pp=pp, tp=tp, mb=mb, **kw), gpus_per_node=8)


# ---------------------------------------------------------------------------- hardware
@pytest.mark.parametrize("name", sorted(FP4_DENSE))
def test_fp4_peaks_are_the_published_dense_figures_derated_and_the_fitted_efficiency(name):
    """``F_peak,4 = 0.70 × dense FP4 × η_4``: the rule of every peak and the one NVFP4
    efficiency for Blackwell, fitted by ``benchmarks/gpu_fidelity.py`` (its FP4_EFFICIENCY)."""
    hw = hardware_preset(name)
    assert hw.peak_flops_fp4 == pytest.approx(0.70 * _fp4_efficiency() * FP4_DENSE[name], rel=1e-6)
    src = dict(hw.sources)["peak_flops_fp4"]
    assert "https://" in src and "dense" in src and "fitted" in src and str(_fp4_efficiency()) in src


@pytest.mark.parametrize("name", ["h100", "h200", "gh200", "h20", "a100-80gb", "cpu"])
def test_no_fp4_peak_before_blackwell(name):
    hw = hardware_preset(name)
    assert hw.peak_flops_fp4 is None
    assert "peak_flops_fp4" not in hw.to_dict()  # the file says nothing, as before


def test_hardware_file_round_trips_the_fp4_peak_and_reads_files_without_it(tmp_path):
    hw = hardware_preset("gb200-nvl72")
    hw.save(tmp_path / "h.json")
    back = Hardware.load(tmp_path / "h.json")
    assert back == hw and back.peak_flops_fp4 == hw.peak_flops_fp4
    data = hw.to_dict()
    del data["peak_flops_fp4"]  # a file written before the field existed
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert Hardware.load(tmp_path / "old.json").peak_flops_fp4 is None


def test_a_bad_fp4_peak_in_a_file_names_file_field_and_value(tmp_path):
    data = hardware_preset("b200").to_dict() | {"peak_flops_fp4": "fast"}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as exc:
        Hardware.load(path)
    msg = str(exc.value)
    assert "bad.json" in msg and "peak_flops_fp4" in msg and "fast" in msg
    with pytest.raises(ValueError, match=r"peak_flops_fp4 must be a number in \[1e9, 1e18\] FLOP/s, got 5.0"):
        replace(hardware_preset("b200"), peak_flops_fp4=5.0)


# ---------------------------------------------------------------------------- refusal
@pytest.mark.parametrize("name", ["h100", "a100-80gb", "cpu"])
@pytest.mark.parametrize("role", [Role.TRAINING, Role.INFERENCE])
def test_nvfp4_is_refused_without_fp4_tensor_cores(name, role):
    hw = hardware_preset(name)
    with pytest.raises(
        ValueError, match=rf"precision 'nvfp4', but hardware '{name}' has no FP4 tensor cores"
    ):
        op_time(M4, role, _layout(), hw, sequences=4, prompt_len=16, response_len=16)
    check_precision(M, hw)


def test_each_precision_takes_its_own_peak():
    hw = hardware_preset("gb300-nvl72")
    assert gemm_peaks(M, hw) == (hw.peak_flops, None)
    assert gemm_peaks(M8, hw) == (hw.peak_flops, hw.peak_flops_fp8)
    assert gemm_peaks(M4, hw) == (hw.peak_flops, hw.peak_flops_fp4)


# ---------------------------------------------------------------------------- time
def test_nvfp4_runs_the_weight_gemms_at_the_fp4_peak_and_not_the_core_or_head():
    """A compute-bound training step: the weight GEMMs' share ψ at ``F_peak,4``, the core and
    the head at ``F_peak``: ``T_bf16/T_nvfp4 = 1/(ψ·F/F_4 + 1 − ψ)`` exactly (the core at the
    roofline, no kernel rates)."""
    hw = replace(hardware_preset("gb200-nvl72"), attention=())
    ell, n = 4096, 4096
    lay = _layout(mb=64, recompute="none")
    kw = {"sequences": n, "prompt_len": ell // 2, "response_len": ell // 2}
    t16 = op_time(M, Role.TRAINING, lay, hw, **kw).gemm
    t4 = op_time(M4, Role.TRAINING, lay, hw, **kw).gemm
    weights = 2.0 * M.layer_params * ell * M.layers
    core = 2.0 * M.attention_width * ell * ell * M.layers
    head = 2.0 * M.hidden * M.vocab * ell
    psi = weights / (weights + core + head)
    ratio = hw.peak_flops / hw.peak_flops_fp4
    assert t16 / t4 == pytest.approx(1.0 / (psi * ratio + 1.0 - psi), rel=1e-9)


def test_nvfp4_decode_reads_its_quantized_weights():
    """One memory-bound decode step of one sequence (no shape loss): bytes = the weights at
    ``q`` each, the GEMMs' activations ``d·(q + 2)·L`` and the BF16 KV reads."""
    hw = replace(hardware_preset("b200"), gamma_m=0.0, gamma_k=0.0)
    kw = {"sequences": 1, "prompt_len": 1000, "response_len": 1, "decode": (0, 1), "prefill": False}
    t4 = op_time(M4, Role.GENERATION, _layout(), hw, **kw).gemm
    L, d = M.layers, M.hidden
    kv = 1000.5 * 2 * M.kv_heads * M.head_dim * 2 * L
    assert t4 == pytest.approx((L * M.layer_params * Q + d * (Q + 2) * L + kv) / hw.mem_bandwidth, rel=1e-9)


def test_nvfp4_quantize_kernels_write_q_bytes_where_fp8_writes_one():
    """Per element: a cast-transpose reads 2 bytes and writes ``2q`` (``1 + q`` two-byte
    scalar-equivalents), a copy ``1 + q/2``, a transpose of a quantized input ``q``; FP8 is
    ``q = 1`` (2, 1.5, 1). Llama-3.1-8B at Pt = 2 with SP, by hand."""
    d, dq, dkv, f = 4096, 4096, 1024, 14336
    rho = 0.5
    x_f = dq / 2 + f / 2
    x_b = (dq + 2 * dkv) / 2 + d * rho + 2 * f / 2 + d * rho
    x_t = 2 * d
    assert quantize_scalars(M4, 2, True) == pytest.approx((1 + Q) * x_f + (1 + Q) * x_b + Q * x_t)
    assert quantize_scalars(M4, 2, True, training=False) == pytest.approx((1 + Q / 2) * x_f)
    assert quantize_scalars(M4, 2, True, recomputed=True) == pytest.approx(
        2 * (1 + Q) * x_f + (1 + Q) * x_b + Q * x_t
    )
    assert quantize_scalars(M8, 2, True) == pytest.approx(2 * x_f + 2 * x_b + x_t)
    assert quantize_scalars(M, 2, True) == 0.0


# ---------------------------------------------------------------------------- memory
def test_vllm_nvfp4_block_weights_take_q_bytes_and_the_head_stays_bf16():
    lay = _layout(tp=2)
    full = weight_bytes(M, lay)
    blocks = M.layers * M.layer_weights / 2  # parameters of the blocks' shard
    assert served_weight_bytes(M4, lay) == pytest.approx(full - (2 - Q) * blocks)
    assert zero_state_bytes(M4, Role.GENERATION, lay).persistent == pytest.approx(full - (2 - Q) * blocks)
    # a trainer keeps BF16 weights and FP32 state
    assert zero_state_bytes(M4, Role.TRAINING, lay) == zero_state_bytes(M, Role.TRAINING, lay)


def test_nvfp4_training_keeps_the_saved_gemm_inputs_at_q_bytes():
    lay = _layout(tp=2, dp=4, mb=2, recompute="none", sp=True)
    kw = {"sequences": 64, "tokens": 1024.0}
    a8, extra = quantized_saved_widths(M, 2, True)
    per_token_layer = (64 / (4 * 2)) * 1024 * M.layers
    b16 = training_activation_bytes(M, lay, **kw)
    assert b16 == pytest.approx(2 * per_token_layer * stored_activation_width(M, 2, True))
    assert b16 - training_activation_bytes(M4, lay, **kw) == pytest.approx(
        per_token_layer * ((2 - Q) * a8 - Q * extra)
    )
    # FP8 saves them at one byte: NVFP4 keeps less
    assert training_activation_bytes(M4, lay, **kw) < training_activation_bytes(M8, lay, **kw) < b16

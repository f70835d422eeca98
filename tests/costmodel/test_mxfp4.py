"""MXFP4 experts (issue 31; ``docs/cost-model.md`` §11, "MXFP4 experts"): ``precision = "mxfp4"``
stores a mixture of experts' routed experts in MXFP4 in a generation engine and runs them as
weight-only GEMMs at the BF16 peak; training, teacher-forced passes and everything but the routed
experts stay BF16. The engine's weight-only GEMM efficiency ``ε_w`` and its file form."""

import json
from dataclasses import replace

import pytest

from rpeg import load_workload
from rpeg.costmodel import Hardware, hardware_preset
from rpeg.costmodel.layout import Layout
from rpeg.costmodel.memory import served_weight_bytes, weight_bytes, zero_state_bytes
from rpeg.costmodel.time import _Roofline, generation_times, op_time
from rpeg.ir.errors import InputError
from rpeg.ir.hardware import EngineStep
from rpeg.ir.models import MXFP4_BYTES, model_preset
from rpeg.ir.plan import Strategy
from rpeg.ir.types import Role
from rpeg.ir.workload import quantile_buckets

OSS = model_preset("gpt-oss-120b")
OSS4 = replace(OSS, precision="mxfp4")
QWEN = model_preset("qwen3-30b-a3b")
QWEN4 = replace(QWEN, precision="mxfp4")
H100 = hardware_preset("h100")


def _layout(tp=1, pp=1, dp=1, mb=1, **kw):
    return Layout(Strategy((1, 1, tp * pp * dp), dp=dp, pp=pp, tp=tp, mb=mb, **kw), gpus_per_node=8)


# ---------------------------------------------------------------------------- the model
def test_mxfp4_bytes_are_a_4_bit_value_and_an_8_bit_scale_per_32():
    assert MXFP4_BYTES == 0.5 + 1 / 32 == 0.53125
    assert OSS4.served_expert_bytes == MXFP4_BYTES and OSS4.has_mxfp4_experts
    # no GEMM runs below BF16: the GEMMs' operands stay two bytes
    assert not OSS4.is_low_precision and not OSS4.is_fp8 and OSS4.gemm_bytes == 2.0
    assert OSS.served_expert_bytes == 2.0 and replace(OSS, precision="fp8").served_expert_bytes == 1.0


def test_mxfp4_needs_experts_and_a_bf16_model():
    with pytest.raises(ValueError, match=r"precision 'mxfp4' stores a mixture of experts' .*experts = 0"):
        replace(model_preset("llama3.1-8b"), precision="mxfp4")
    with pytest.raises(ValueError, match=r"'mxfp4' quantizes the experts of a BF16 model .*dtype_bytes = 4"):
        replace(QWEN, dtype_bytes=4, precision="mxfp4")


def test_mxfp4_round_trips_through_plain_data():
    d = OSS4.to_dict()
    assert d["precision"] == "mxfp4"
    assert type(OSS4)(**{**d, "sliding_layers": tuple(d["sliding_layers"])}) == OSS4


# ---------------------------------------------------------------------------- memory
@pytest.mark.parametrize(("tp", "ep", "pp"), [(1, 1, 1), (2, 1, 1), (1, 4, 1), (2, 2, 2)])
def test_the_engine_stores_the_routed_experts_in_mxfp4_and_the_rest_in_bf16(tp, ep, pp):
    """``W_shard·sb − (sb − q_e)·(L/Pp)·W_exp/(Pet·Pe)``; a trainer and a teacher-forced pass
    keep BF16 weights, bit for bit."""
    lay = _layout(tp=tp, pp=pp, dp=ep, ep=ep)
    experts = QWEN.layers / pp * QWEN.expert_weights / (tp * ep)
    want = weight_bytes(QWEN, lay) - (2.0 - MXFP4_BYTES) * experts
    assert served_weight_bytes(QWEN4, lay) == pytest.approx(want, rel=1e-12)
    assert zero_state_bytes(QWEN4, Role.GENERATION, lay).persistent == pytest.approx(want, rel=1e-12)
    for role in (Role.TRAINING, Role.INFERENCE):
        assert zero_state_bytes(QWEN4, role, lay) == zero_state_bytes(QWEN, role, lay)


def test_gpt_oss_120b_served_in_mxfp4_fits_one_h100_as_vllm_serves_it():
    """116.8B parameters: 217 GiB in BF16, 60.7 GiB with MXFP4 experts (the checkpoint's 65 GB)."""
    lay = _layout()
    assert weight_bytes(OSS, lay) / 2**30 > 200
    assert 60 < served_weight_bytes(OSS4, lay) / 2**30 < 61.5
    assert served_weight_bytes(OSS4, lay) < 0.9 * H100.gpu_memory_bytes


# ---------------------------------------------------------------------------- time
@pytest.mark.parametrize("role", [Role.TRAINING, Role.INFERENCE])
def test_training_and_teacher_forced_passes_are_bf16_bit_for_bit(role):
    lay = _layout(tp=2, dp=4, ep=4, mb=2)
    args = dict(sequences=16, prompt_len=512, response_len=512)
    assert op_time(QWEN4, role, lay, H100, **args) == op_time(QWEN, role, lay, H100, **args)


def test_bf16_generation_is_unchanged_by_the_served_flag():
    """The served roofline is the same arithmetic as before for a model without MXFP4 experts."""
    lay = _layout(tp=2)
    hw = replace(H100, expert_efficiency=1.0)  # a training pass's expert-layer efficiency aside
    for b in (1.0, 64.0, 8192.0):
        assert _Roofline(QWEN, lay, hw, b, True).flops(1e12, 1, 0.0, 0.9) == _Roofline(
            QWEN, lay, hw, b, False
        ).flops(1e12, 1, 0.0, 0.9)


@pytest.mark.parametrize("tp", [1, 2])
def test_the_served_experts_are_read_at_mxfp4_bytes(tp):
    """Memory-bound (a decode step of a few sequences, no row loss): the intensity's weight
    bytes are ``(W_read − W_routed)·sb/Pt + W_routed·q_e/Pt``."""
    hw = replace(H100, gamma_m=0.0, gamma_k=0.0)
    lay = _layout(tp=tp)
    rows, work = 4.0, 1e9
    roof = _Roofline(QWEN4, lay, hw, rows, served=True)
    touched = QWEN.experts_touched(rows)
    routed = QWEN.moe_layers * touched * QWEN.expert_params / QWEN.layers
    rest = QWEN.layer_weights_read(rows) - routed
    omega_w = QWEN.layers * (rest * 2.0 + routed * MXFP4_BYTES) / tp
    omega_a = 4.0 * rows * QWEN.hidden * QWEN.layers
    assert roof.flops(work, 1, 0.0, 0.9) == pytest.approx(
        work / (omega_w + omega_a) * hw.mem_bandwidth, rel=1e-12
    )
    # the same node unserved (a teacher-forced pass) reads BF16 experts: slower
    assert _Roofline(QWEN4, lay, hw, rows).flops(work, 1, 0.0, 0.9) < roof.flops(work, 1, 0.0, 0.9)


def test_the_expert_row_knee_moves_with_the_weight_bytes_and_the_compute_end_with_eps():
    """``η_e`` row factor ``ε·r/(r + ε·γM·q_e/sb)``: about ``r/(γM·q_e/sb)`` for few rows
    (bound by the weights, whatever ``ε``), ``ε`` for many."""
    lay = _layout()
    for eps in (1.0, 0.5):
        hw = replace(H100, rollout_step=replace(H100.rollout_step, weight_only_efficiency=eps))
        roof = _Roofline(QWEN4, lay, hw, 1.0, served=True)
        assert roof.gamma_e == pytest.approx(H100.gamma_m * MXFP4_BYTES / 2.0)
        assert roof.eps_w == eps
    # without an engine step (a calibrated CPU file) there is no weight-only efficiency
    assert _Roofline(QWEN4, lay, replace(H100, rollout_step=None), 1.0, served=True).eps_w == 1.0
    # an unserved node (a training or teacher-forced pass) has BF16 experts at the expert-layer
    # efficiency ε_e instead (docs/cost-model.md §9)
    plain = _Roofline(QWEN4, lay, H100, 1.0)
    assert plain.gamma_e == H100.gamma_m and plain.eps_w == H100.expert_efficiency


def _generation(model, hw, n, lp, lr):
    buckets = quantile_buckets(((0.0, lr - 1), (1.0, lr)))  # every response lr tokens
    return generation_times(model, _layout(), hw, sequences=n, prompt_len=lp, buckets=buckets)[0].total


def test_decode_gets_faster_and_a_compute_bound_prefill_slower_with_a_lower_eps():
    """MXFP4 experts: a decode-bound generation is faster than BF16 (a quarter of the expert
    bytes); ``ε_w < 1`` slows the compute-bound prefill of long prompts and barely moves decode."""
    slow = replace(H100, rollout_step=replace(H100.rollout_step, weight_only_efficiency=0.5))
    fast = replace(H100, rollout_step=replace(H100.rollout_step, weight_only_efficiency=1.0))
    decode = dict(n=64, lp=16, lr=512)
    assert _generation(QWEN4, fast, **decode) < 0.5 * _generation(QWEN, fast, **decode)
    assert _generation(QWEN4, slow, **decode) == pytest.approx(_generation(QWEN4, fast, **decode), rel=0.05)
    prefill = dict(n=64, lp=8192, lr=512)
    assert _generation(QWEN4, slow, **prefill) > 1.15 * _generation(QWEN4, fast, **prefill)
    # BF16 experts have no weight-only loss
    assert _generation(QWEN, slow, **prefill) == _generation(QWEN, fast, **prefill)


def test_op_time_prices_a_generation_with_the_served_experts():
    lay = _layout()
    args = dict(sequences=64, prompt_len=16, response_len=512)
    assert (
        op_time(QWEN4, Role.GENERATION, lay, H100, **args).total
        < 0.8 * op_time(QWEN, Role.GENERATION, lay, H100, **args).total
    )


# ---------------------------------------------------------------------------- hardware
@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan"), "0.7", None])
def test_a_bad_weight_only_efficiency_is_refused(bad):
    with pytest.raises(ValueError, match=r"EngineStep weight_only_efficiency must be in \(0, 1\], got "):
        EngineStep(weight_only_efficiency=bad)


def test_the_weight_only_efficiency_round_trips_and_is_silent_at_one(tmp_path):
    d = H100.to_dict()
    assert d["rollout_step"]["weight_only_efficiency"] == H100.rollout_step.weight_only_efficiency < 1
    assert Hardware.from_dict(d) == H100
    neutral = replace(H100, rollout_step=replace(H100.rollout_step, weight_only_efficiency=1.0))
    assert "weight_only_efficiency" not in neutral.to_dict()["rollout_step"]
    d["rollout_step"]["weight_only_efficiency"] = 1.2
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(d))
    with pytest.raises(InputError, match=r"hw\.json.*weight_only_efficiency"):
        Hardware.load(path)


@pytest.mark.parametrize("name", ["b200", "gb200-nvl72", "h20", "gh200", "cpu"])
def test_presets_without_a_fit_have_no_weight_only_loss(name):
    hw = hardware_preset(name)
    assert hw.rollout_step is None or hw.rollout_step.weight_only_efficiency == 1.0


# ---------------------------------------------------------------------------- the workload file
WORKLOAD = """
name = "mx-job"
algorithm = "ppo"
{top}
[batch]
prompts = 8
rollouts = 1
prompt_len = 128
response_len = 256

[models]
actor = "gpt-oss-20b"
critic = {critic}
reward = "llama3.1-8b"
"""


def _write(tmp_path, top="", critic='"llama3.1-8b"'):
    path = tmp_path / "w.toml"
    path.write_text(WORKLOAD.format(top=top, critic=critic))
    return path


def test_a_top_level_mxfp4_goes_to_the_mixtures_of_experts_only(tmp_path):
    wf = load_workload(_write(tmp_path, top='precision = "mxfp4"'))
    assert wf.workload.models["actor"].precision == "mxfp4"
    assert wf.workload.models["critic"].precision == "bf16"  # a dense model has no experts to store so


def test_a_top_level_mxfp4_without_experts_is_an_error(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text(
        WORKLOAD.replace('"gpt-oss-20b"', '"llama3.1-8b"').format(
            top='precision = "mxfp4"', critic='"llama3.1-8b"'
        )
    )
    with pytest.raises(InputError, match=r"w\.toml: field 'precision' = 'mxfp4' but no model has experts"):
        load_workload(path)


def test_an_inline_dense_model_with_mxfp4_is_named(tmp_path):
    critic = '{ name = "c", layers = 2, hidden = 64, ffn_hidden = 128, vocab = 100, heads = 4, kv_heads = 4, precision = "mxfp4" }'
    with pytest.raises(InputError, match=r"w\.toml.*models\.critic.*precision 'mxfp4'.*experts = 0"):
        load_workload(_write(tmp_path, critic=critic))


# ---------------------------------------------------------------------------- weight-only checkpoints
L8 = model_preset("llama3.1-8b")
A100 = hardware_preset("a100-80gb")


@pytest.mark.parametrize(("precision", "name", "q"), [("fp8", "a100-80gb", 1.0), ("nvfp4", "h100", 0.5625)])
def test_a_served_checkpoint_without_its_tensor_cores_runs_weight_only(precision, name, q):
    """vLLM serves an FP8 checkpoint on A100 (an NVFP4 one before Blackwell) with its Marlin
    kernels: ``q``-byte weights, BF16 activations and peak, the knee ``γM·q/sb`` and ``ε_w``
    for every block GEMM; a trainer and a teacher-forced pass are still refused."""
    hw = hardware_preset(name)
    m = replace(L8, precision=precision)
    roof = _Roofline(m, _layout(), hw, 4.0, served=True)
    eps = hw.rollout_step.weight_only_efficiency
    assert roof.peak_fp8 is None and roof.w_bytes == q and roof.act_bytes == 4.0
    assert roof.gamma_d == pytest.approx(hw.gamma_m * q / 2.0) and roof.eps_d == eps
    # compute-bound (many rows): ε_w of the BF16 peak times the width factor
    big = _Roofline(m, _layout(), hw, 1e7, served=True)
    assert big.flops(1e18, 1, 0.0, 1.0) == pytest.approx(hw.peak_flops * eps * big.eta_k, rel=1e-3)
    # memory-bound (a decode step of 4 rows): the q-byte weights against the BF16 ones
    bf = _Roofline(L8, _layout(), replace(hw, gamma_m=0.0), 4.0, served=True)
    wo = _Roofline(m, _layout(), replace(hw, gamma_m=0.0), 4.0, served=True)
    assert wo.flops(1e9, 1, 0.0, 1.0) > bf.flops(1e9, 1, 0.0, 1.0) * (2.0 / q) * 0.9
    # a decode of a few sequences reads half (a quarter of) the bytes: its GEMMs beat BF16's (the
    # step's host seconds, which asynchronous scheduling hides behind the longer BF16 step, aside)
    args = dict(sequences=4, prompt_len=16, response_len=256)
    assert (
        op_time(m, Role.GENERATION, _layout(), hw, **args).gemm
        < 0.8 * op_time(L8, Role.GENERATION, _layout(), hw, **args).gemm
    )
    for role in (Role.TRAINING, Role.INFERENCE):
        with pytest.raises(ValueError, match=r"a generation engine serves it as weight-only GEMMs"):
            op_time(m, role, _layout(), hw, **args)


def test_an_fp8_checkpoint_with_its_tensor_cores_is_not_weight_only():
    roof = _Roofline(replace(L8, precision="fp8"), _layout(), H100, 4.0, served=True)
    assert roof.peak_fp8 == H100.peak_flops_fp8 and roof.gamma_d == H100.gamma_m and roof.eps_d == 1.0

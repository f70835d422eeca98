"""The precision setting in the cost model (issue 31; ``docs/cost-model.md`` §11): the presets'
FP8 peaks, the hardware file's optional ``peak_flops_fp8``, FP8 GEMMs in the roofline, vLLM's FP8
weights in memory, the trainer's BF16 state, and the refusal of FP8 without FP8 tensor cores."""

import json
from dataclasses import replace

import pytest

from rpeg.costmodel import Hardware, hardware_preset
from rpeg.costmodel.flops import reference_nongemm_scalars
from rpeg.costmodel.layout import Layout
from rpeg.costmodel.memory import (
    kv_budget_tokens,
    kv_bytes_per_token,
    served_weight_bytes,
    training_activation_bytes,
    training_state_bytes,
    transient_bytes,
    weight_bytes,
    zero_state_bytes,
)
from rpeg.costmodel.precision import check_precision, mixed_peak
from rpeg.costmodel.time import op_time
from rpeg.ir.errors import InputError
from rpeg.ir.models import model_preset
from rpeg.ir.plan import Strategy
from rpeg.ir.types import Role

M = model_preset("llama3.1-8b")
M8 = replace(M, precision="fp8")
MOE = model_preset("qwen3-30b-a3b")

# Published dense FP8 tensor-core peaks (each preset's ``sources["peak_flops_fp8"]``), FLOP/s.
FP8_DENSE = {
    "h100": 1978.9e12,
    "h200": 1978.9e12,
    "gh200": 1978.9e12,
    "h20": 296e12,
    "b200": 4500e12,
    "b300": 4500e12,
    "gb200-nvl72": 5000e12,
    "gb300-nvl72": 5000e12,
}


def _layout(tp=1, pp=1, dp=1, mb=1, **kw):
    return Layout(Strategy((1, 1, tp * pp * dp), dp=dp, pp=pp, tp=tp, mb=mb, **kw), gpus_per_node=8)


# ---------------------------------------------------------------------------- hardware
@pytest.mark.parametrize("name", sorted(FP8_DENSE))
def test_fp8_peaks_are_the_published_dense_figures_derated_like_bf16(name):
    hw = hardware_preset(name)
    assert hw.peak_flops_fp8 == pytest.approx(0.70 * FP8_DENSE[name])
    # FP8 tensor cores run twice the BF16 rate on Hopper and Blackwell (989.4 → 1,978.9 rounds)
    assert hw.peak_flops_fp8 / hw.peak_flops == pytest.approx(2.0, rel=2e-4)
    src = dict(hw.sources)["peak_flops_fp8"]
    assert "https://" in src and "derated" in src and "dense" in src


@pytest.mark.parametrize("name", ["a100-40gb", "a100-80gb", "cpu"])
def test_no_fp8_peak_where_there_are_no_fp8_tensor_cores(name):
    hw = hardware_preset(name)
    assert hw.peak_flops_fp8 is None
    assert "peak_flops_fp8" not in hw.to_dict()  # the file says nothing, as before


def test_hardware_file_round_trips_the_fp8_peak_and_reads_files_without_it(tmp_path):
    hw = hardware_preset("h200")
    hw.save(tmp_path / "h.json")
    back = Hardware.load(tmp_path / "h.json")
    assert back == hw and back.peak_flops_fp8 == hw.peak_flops_fp8
    data = hw.to_dict()
    del data["peak_flops_fp8"]  # a calibration file written before the field existed
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert Hardware.load(tmp_path / "old.json").peak_flops_fp8 is None


def test_a_bad_fp8_peak_in_a_file_names_file_field_and_value(tmp_path):
    data = hardware_preset("h100").to_dict() | {"peak_flops_fp8": -1.0}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as exc:
        Hardware.load(path)
    msg = str(exc.value)
    assert "bad.json" in msg and "peak_flops_fp8" in msg and "-1" in msg
    with pytest.raises(ValueError, match=r"peak_flops_fp8 must be a number in \[1e9, 1e18\] FLOP/s, got 5.0"):
        replace(hardware_preset("h100"), peak_flops_fp8=5.0)


# ---------------------------------------------------------------------------- refusal
@pytest.mark.parametrize("name", ["a100-80gb", "cpu"])
@pytest.mark.parametrize("role", [Role.TRAINING, Role.INFERENCE])
def test_fp8_is_refused_without_fp8_tensor_cores(name, role):
    """A trainer and a teacher-forced pass cannot run FP8 GEMMs there; a generation engine
    serves the checkpoint as weight-only GEMMs (``tests/costmodel/test_mxfp4.py``)."""
    hw = hardware_preset(name)
    with pytest.raises(
        ValueError,
        match=rf"precision 'fp8', but hardware '{name}' has no FP8 tensor cores \(.*\) \(a generation engine",
    ):
        op_time(M8, role, _layout(), hw, sequences=4, prompt_len=16, response_len=16)
    check_precision(M, hw)  # BF16 runs anywhere
    check_precision(M8, hw, served=True)  # and a served FP8 checkpoint, weight-only


# ---------------------------------------------------------------------------- time
def test_mixed_peak_is_the_work_weighted_harmonic_mean():
    assert mixed_peak(1.0, 2.0, 0.0) == 1.0
    assert mixed_peak(1.0, 2.0, 1.0) == 2.0
    assert mixed_peak(1.0, 2.0, 0.5) == pytest.approx(1 / (0.25 + 0.5))


def test_fp8_doubles_the_rate_of_the_weight_gemms_and_not_of_the_attention_core_or_head():
    """A compute-bound training step (4,096 sequences of 4,096 tokens on one H100): the weight
    GEMMs' share ψ of the work runs at 2·F_peak, the attention core and the LM head at F_peak,
    so ``T_bf16/T_fp8 = 1/(ψ/2 + 1 − ψ)`` exactly; ψ from the FLOP formulas by hand."""
    hw = hardware_preset("h100")
    # exactly twice; the attention core at the roofline (no fused-kernel rates), so that ψ is the
    # weight GEMMs' share of one roofline (with rates the core keeps its own BF16 time either way)
    hw = replace(hw, peak_flops_fp8=2.0 * hw.peak_flops, attention=())
    ell, n = 4096, 4096
    lay = _layout(mb=64, recompute="none")
    kw = {"sequences": n, "prompt_len": ell // 2, "response_len": ell // 2}
    t16 = op_time(M, Role.TRAINING, lay, hw, **kw).gemm
    t8 = op_time(M8, Role.TRAINING, lay, hw, **kw).gemm
    weights = 2.0 * M.layer_params * ell * M.layers
    core = 2.0 * M.attention_width * ell * ell * M.layers
    head = 2.0 * M.hidden * M.vocab * ell
    psi = weights / (weights + core + head)
    assert 0.6 < psi < 0.9  # the core and the head are a real share: the test sees them
    assert t16 / t8 == pytest.approx(1.0 / (psi / 2.0 + 1.0 - psi), rel=1e-9)
    # the same model with every FLOP at the FP8 rate would be twice as fast: it is not
    assert t16 / t8 < 1.9


def test_fp8_decode_reads_one_byte_weights_and_a_bf16_kv_cache():
    """One memory-bound decode step of one sequence: ``T = bytes·mb·steps/BW``, bytes = the
    weights ``L·W_layer·w/Pt`` (w = 2 → 1), the GEMMs' activations ``b·d·(in + out)·L`` (4 → 3)
    and the KV reads ``b·c̄·2·d_kv·2·L`` (BF16 in both). (No GEMM-shape loss, ``γM = γK = 0``,
    so the step is bound by the memory, not by the one-row GEMMs' ``η``.)"""
    hw = replace(hardware_preset("h100"), gamma_m=0.0, gamma_k=0.0)
    lay = _layout()
    kw = {"sequences": 1, "prompt_len": 1000, "response_len": 1, "decode": (0, 1), "prefill": False}
    t16 = op_time(M, Role.GENERATION, lay, hw, **kw).gemm
    t8 = op_time(M8, Role.GENERATION, lay, hw, **kw).gemm
    L, d = M.layers, M.hidden
    kv = 1000.5 * 2 * M.kv_heads * M.head_dim * 2 * L
    bytes16 = L * M.layer_params * 2 + d * 4 * L + kv
    bytes8 = L * M.layer_params * 1 + d * 3 * L + kv
    assert t16 == pytest.approx(bytes16 / hw.mem_bandwidth, rel=1e-9)
    assert t8 == pytest.approx(bytes8 / hw.mem_bandwidth, rel=1e-9)


def test_bf16_ignores_the_fp8_peak():
    hw = hardware_preset("h100")
    lay = _layout(tp=2, dp=4)
    for role in Role:
        a = op_time(M, role, lay, hw, sequences=64, prompt_len=512, response_len=512)
        b = op_time(
            M, role, lay, replace(hw, peak_flops_fp8=None), sequences=64, prompt_len=512, response_len=512
        )
        assert a == b


def test_fp8_moe_expert_gemms_run_at_the_fp8_peak_too():
    hw = hardware_preset("h100")
    lay = _layout(dp=8, ep=8, mb=8, recompute="none")
    kw = {"sequences": 512, "prompt_len": 2048, "response_len": 2048}
    t16 = op_time(MOE, Role.TRAINING, lay, hw, **kw).gemm
    t8 = op_time(replace(MOE, precision="fp8"), Role.TRAINING, lay, hw, **kw).gemm
    assert 1.2 < t16 / t8 < 2.0


# ---------------------------------------------------------------------------- memory
def test_vllm_fp8_block_weights_take_half_the_memory_and_the_head_stays_bf16():
    lay = _layout(tp=2)
    full = weight_bytes(M, lay)
    blocks = M.layers * M.layer_weights / 2 * 2  # bytes of the blocks' BF16 shard
    assert served_weight_bytes(M, lay) == full
    assert served_weight_bytes(M8, lay) == pytest.approx(full - blocks / 2)
    assert zero_state_bytes(M8, Role.GENERATION, lay).persistent == pytest.approx(full - blocks / 2)
    # the cache gets what the weights give back
    hw = hardware_preset("h100")
    gained = (kv_budget_tokens(M8, lay, hw) - kv_budget_tokens(M, lay, hw)) * kv_bytes_per_token(M, lay)
    assert gained == pytest.approx(blocks / 2)


def test_trainer_and_teacher_forced_memory_stay_bf16():
    """Megatron-core keeps BF16 weights and FP32 master weights and moments under FP8 (no
    ``fp8_param_gather``): a trainer's and a forward pass's memory do not change (under full
    recomputation the kept activations are BF16 checkpoints)."""
    lay = _layout(tp=2, dp=4, mb=2)
    for role in (Role.TRAINING, Role.INFERENCE):
        assert zero_state_bytes(M8, role, lay) == zero_state_bytes(M, role, lay)
        kw = {"sequences": 64, "prompt_len": 512, "response_len": 512}
        assert transient_bytes(M8, role, lay, **kw) == transient_bytes(M, role, lay, **kw)
    assert training_state_bytes(M8, lay) == training_state_bytes(M, lay)


@pytest.mark.parametrize("sp", [False, True])
def test_fp8_training_keeps_the_gemm_inputs_te_saves_in_one_byte(sp):
    """Without recomputation a layer keeps ``a`` scalars per token (:func:`stored_activation_width`);
    under FP8 the norm outputs and the down projection's input are saved in FP8 (1 byte instead
    of 2) and the output projection adds an FP8 copy of the attention output, by hand for
    Llama-3.1-8B (d = 4096, dff = 14336, d_q = 4096) at Pt = 2."""
    lay = _layout(tp=2, dp=4, mb=2, recompute="none", sp=sp)
    kw = {"sequences": 64, "tokens": 1024.0}
    b16 = training_activation_bytes(M, lay, **kw)
    b8 = training_activation_bytes(M8, lay, **kw)
    per_token_layer = 1 * (64 / (4 * 2)) * 1024 * 32  # min(mb, Pp) · b · ℓ · L, b = n/(Pd·mb)
    replicated = 2 * 4096 / (2 if sp else 1)
    saved = (replicated + 14336 / 2) * (2 - 1) - 4096 / 2
    assert b16 - b8 == pytest.approx(per_token_layer * saved)
    full = _layout(tp=2, dp=4, mb=2)
    assert training_activation_bytes(M8, full, **kw) == training_activation_bytes(M, full, **kw)


# ------------------------------------------------------------------- the quantize kernels
def test_quantize_scalars_of_a_dense_block_by_hand():
    """Llama-3.1-8B (d 4096, d_q 4096, d_kv 1024, gated dff 14336) at Pt = 2: forward inputs
    (output projection, second FFN projection), backward output gradients (QKV, output, both FFN
    projections) and the two fused norms' transposes, with ρ = 1/Pt under SP for what TP
    replicates (not the transposes: TE transposes the input it gathered over the sequence)."""
    from rpeg.costmodel.precision import quantize_scalars

    d, dq, dkv, f = 4096, 4096, 1024, 14336
    assert (M.hidden, M.q_width, M.kv_width, M.ffn_hidden, M.ffn_projections) == (d, dq, dkv, f, 3)
    assert quantize_scalars(M, 2) == 0.0  # BF16: nothing
    for sp, rho in ((False, 1.0), (True, 0.5)):
        x_f = dq / 2 + f / 2
        x_b = (dq + 2 * dkv) / 2 + d * rho + 2 * f / 2 + d * rho
        x_t = 2 * d  # transposed after the sequence-parallel gather: every rank, whole
        assert quantize_scalars(M8, 2, sp) == pytest.approx(2 * x_f + 2 * x_b + x_t)
        assert quantize_scalars(M8, 2, sp, training=False) == pytest.approx(1.5 * x_f)
        assert quantize_scalars(M8, 2, sp, recomputed=True) == pytest.approx(4 * x_f + 2 * x_b + x_t)


def test_quantize_scalars_of_a_moe_model_average_its_dense_and_expert_blocks():
    """Qwen3-30B-A3B: every block has experts (k = 8 of width 768, no shared expert), so the
    FFN's casts are the dispatched rows' and the experts' (no fused norm before the experts)."""
    from rpeg.costmodel.precision import quantize_scalars

    m8 = replace(MOE, precision="fp8")
    d, k, de = MOE.hidden, MOE.experts_active, MOE.expert_ffn
    assert MOE.moe_layers == MOE.layers and not MOE.shared_experts
    x_f = MOE.q_width + k * d + k * de
    x_b = MOE.q_width + 2 * MOE.kv_width + d + 2 * k * de + k * d
    x_t = d
    assert quantize_scalars(m8) == pytest.approx(2 * x_f + 2 * x_b + x_t)
    # the expert work is most of it: a fine-grained MoE block casts far more than a dense one of
    # the same width would at the same active FFN width
    assert quantize_scalars(m8) > 2 * (MOE.q_width + k * de)


@pytest.mark.parametrize(
    ("role", "recompute"), [(Role.TRAINING, "none"), (Role.TRAINING, "full"), (Role.INFERENCE, "full")]
)
def test_an_fp8_node_pays_the_quantize_kernels_at_hbm_speed_with_its_non_gemm_work(role, recompute):
    """``T_nongemm(fp8) − T_nongemm(bf16) = mb·b·ℓ·(L/Pp)·σ_cast·κ``, ``κ = 2 bytes/BW_mem`` on a
    GPU preset (its ``c_ng`` is derived that way), and nothing else in the breakdown but the GEMM
    time changes."""
    from rpeg.costmodel.precision import quantize_scalars

    hw = hardware_preset("h100")
    lay = _layout(tp=2, pp=2, dp=2, mb=4, recompute=recompute, sp=True)
    kw = {"sequences": 64, "prompt_len": 1024, "response_len": 1024}
    a = op_time(M, role, lay, hw, **kw)
    b = op_time(M8, role, lay, hw, **kw)
    training = role is Role.TRAINING
    sigma = quantize_scalars(M8, 2, True, training=training, recomputed=training and recompute == "full")
    tokens_per_device = 64 / 2 * 2048  # mb·b·ℓ = n/Pd·ℓ
    kappa = hw.c_nongemm / (hw.b_cal * hw.l_cal * reference_nongemm_scalars(hw.d_cal))
    assert kappa == pytest.approx(2 / hw.mem_bandwidth, rel=1e-3)  # c_ng is derived from BW_mem
    expected = tokens_per_device * (M.layers / 2) * sigma * kappa
    assert b.nongemm - a.nongemm == pytest.approx(expected, rel=1e-9)
    assert (b.tp_comm, b.pp_comm, b.dp_comm, b.opt) == (a.tp_comm, a.pp_comm, a.dp_comm, a.opt)

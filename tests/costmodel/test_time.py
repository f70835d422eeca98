"""OP / COMM / RESHARD node times against hand-computed numbers (SPEC §6).

The tiny model: L = 4, d = 64, dff = 128, V = 1000, 4 heads of 16 (no GQA), plain 2-matrix FFN.
``W_layer = 2·64·64 + 2·64·64 + 2·64·128 = 32768``; ``N_m = 4·(32768 + 128) + 2·64000 + 64 =
259648``. Hardware: F_peak = 1e12, BW_mem = 1e11, γM = γK = 64, c_ng = 1e-3 at B_cal = 4.
"""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpeg.costmodel import (
    Hardware,
    Layout,
    Link,
    TimeBreakdown,
    comm_time,
    decode_flops,
    forward_flops,
    generation_flops,
    hardware_preset,
    head_flops_per_token,
    inference_flops,
    op_time,
    prefill_flops,
    publication_bytes,
    reshard_time,
    training_flops,
)
from rpeg.ir.models import ModelSpec, model_preset
from rpeg.ir.plan import Strategy
from rpeg.ir.types import Head, Role


def make_layout(
    dp: int, pp: int, tp: int, mb: int, pp_tier: int = 0, dp_tier: int = 0, gpus_per_node: int = 8
) -> Layout:
    """The cost model's :class:`Layout` of bare degrees (the strategy's extent is not priced)."""
    return Layout(Strategy((1, 1, dp * pp * tp), dp, pp, tp, mb, pp_tier, dp_tier), gpus_per_node)


TINY = ModelSpec(
    name="tiny",
    layers=4,
    hidden=64,
    ffn_hidden=128,
    vocab=1000,
    heads=4,
    kv_heads=4,
    ffn_projections=2,
)
HW = Hardware(
    name="test",
    gpu_memory_bytes=1e10,
    peak_flops=1e12,
    mem_bandwidth=1e11,
    gamma_m=64.0,
    gamma_k=64.0,
    c_nongemm=1e-3,
    b_cal=4.0,
    collective=(Link(1e-5, 1e-10), Link(2e-5, 1e-9), Link(5e-5, 2e-9)),
    p2p=(Link(1e-6, 1e-10), Link(1e-5, 5e-10), Link(2e-5, 1e-9)),
    l_cal=32.0,  # c_ng measured at B_cal = 4 sequences of 32 tokens of TINY's width
    d_cal=64.0,
)
SLOW_HBM = dataclasses.replace(HW, name="slow-hbm", mem_bandwidth=1e9)
#: HW's seconds per non-GEMM scalar: c_ng over the reference block's scalars at its calibration,
#: κ = c_ng/(B_cal·ℓ_cal·σ_ref(d_cal)), σ_ref(d) = (14 + 3·11008/4096)·d (flops.reference_nongemm_scalars)
KAPPA = 1e-3 / (4 * 32 * (14 + 3 * 11008 / 4096) * 64)
SEQ = {"sequences": 8, "prompt_len": 24, "response_len": 8}  # ℓ = 32


def test_tiny_model_shape():
    assert TINY.layer_params == 32768
    assert TINY.params == 259648


# ---------------------------------------------------------------- work terms
def test_work_terms_by_hand():
    assert head_flops_per_token(TINY, Head.LM) == 2 * 64 * 1000
    assert head_flops_per_token(TINY, Head.SCALAR) == 128
    assert head_flops_per_token(TINY, Head.BOTH) == 128128
    # ℓ = 32: L·(2·W_layer·ℓ + 2·d·ℓ²) + 2dV·ℓ = 4·(2097152 + 131072) + 4096000
    assert forward_flops(TINY, 32) == 13_008_896
    assert inference_flops(TINY, **SEQ) == 8 * 13_008_896
    assert training_flops(TINY, **SEQ) == 4 * 8 * 13_008_896
    # prefill over Lp = 24, head on the last prompt position only:
    # 8·(4·(2·32768·24 + 2·64·24²) + 128000) = 8·6714368
    assert prefill_flops(TINY, sequences=8, prompt_len=24) == 53_714_944
    # decode steps 0..7 at mean context 24 + 4 = 28: 8·8·(4·(65536 + 4·64·28) + 128000)
    assert decode_flops(TINY, sequences=8, prompt_len=24, window=(0, 8)) == 26_804_224
    assert generation_flops(TINY, **SEQ) == 53_714_944 + 26_804_224
    assert generation_flops(TINY, **SEQ, prefill=False) == 26_804_224


def test_generation_attention_adds_up_to_a_teacher_forced_pass():
    # With a scalar head the only difference to inference over Lp + Lr is the head:
    # generation evaluates it 1 + Lr times, inference ℓ = Lp + Lr times.
    gen = generation_flops(TINY, **SEQ, head=Head.SCALAR)
    inf = inference_flops(TINY, **SEQ, head=Head.SCALAR)
    assert gen == pytest.approx(inf + 8 * 128 * (1 + 8 - 32))


def test_decode_windows_partition_the_work():
    whole = decode_flops(TINY, sequences=8, prompt_len=24, window=(0, 8))
    parts = sum(decode_flops(TINY, sequences=8, prompt_len=24, window=w) for w in [(0, 2), (2, 4), (4, 8)])
    assert parts == pytest.approx(whole)
    assert decode_flops(TINY, sequences=8, prompt_len=24, window=(3, 3)) == 0.0


# ---------------------------------------------------------------- inference
def test_inference_tp2_by_hand():
    t = op_time(TINY, Role.INFERENCE, make_layout(dp=1, pp=1, tp=2, mb=1), HW, **SEQ)
    # b = 8, ℓ = 32, k = 64/2 = 32: η = (256/(256 + 64))·(32/(32 + 64)) = 0.8/3.
    # I = (W/2)/(Ω_W + Ω_A) = 52035584/(131072 + 262144) ≈ 132 FLOP/B → I·BW ≫ F_peak·η.
    assert t.gemm == pytest.approx(104_071_168 / (2 * 1e12 * 0.8 / 3))
    assert t.bubble == 0.0
    # 2·L·mb = 8 AllReduces of 8·32·64·2 = 32768 B over 2 ranks: 2α + M·β
    assert t.tp_comm == pytest.approx(8 * (2e-5 + 32768 * 1e-10))
    assert t.pp_comm == 0.0 and t.dp_comm == 0.0 and t.opt == 0.0
    # T·(L·σ_layer + σ_head)·κ, T = mb·b·ℓ = 256 tokens (docs/cost-model.md §2 "Non-GEMM work"):
    # σ_layer = 10d + (2·(d_q + d_kv) + 2·dff)/Pt = 640 + 512/2, σ_head = 2d + 2V/Pt = 128 + 1000
    assert t.nongemm == pytest.approx(256 * (4 * (640 + 512 / 2) + 1128) * KAPPA)
    assert t.total == pytest.approx(t.gemm + t.tp_comm + t.nongemm)


def test_inference_memory_bound_gemm():
    t = op_time(TINY, Role.INFERENCE, make_layout(dp=1, pp=1, tp=2, mb=1), SLOW_HBM, **SEQ)
    intensity = 52_035_584 / (131_072 + 262_144)  # FLOP per byte
    assert t.gemm == pytest.approx(104_071_168 / (2 * intensity * 1e9))


def test_inference_pipeline_by_hand():
    # two GPUs per node, TP 2 → one stage per node: the single boundary is inter-node.
    layout = make_layout(dp=1, pp=2, tp=2, mb=2, pp_tier=1, gpus_per_node=2)
    assert layout.pp_boundaries == (0, 1)
    t = op_time(TINY, Role.INFERENCE, layout, HW, **SEQ)
    # b = 4, rows = 128: η = (128/192)·(1/3) = 2/9; P = 4
    assert t.gemm == pytest.approx(104_071_168 / (4 * 1e12 * 2 / 9))
    assert t.bubble == pytest.approx(t.gemm * (2 + 2 - 1) / 2 - t.gemm)
    # mb + Pp − 2 = 2 P2P steps of 8·32·64·2/(1·2·2) = 8192 B at tier 1
    assert t.pp_comm == pytest.approx(2 * (1e-5 + 8192 * 5e-10))
    # 2·(L/Pp)·mb = 8 AllReduces of 8·32·64·2/2 = 16384 B
    assert t.tp_comm == pytest.approx(8 * (2e-5 + 16384 * 1e-10))
    # T·((L/Pp)·σ_layer + σ_head)·κ: both microbatches of b = 4 count, T = 2·4·32 = 256
    # (SPEC's (b/B_cal) charged one microbatch)
    assert t.nongemm == pytest.approx(256 * (2 * (640 + 512 / 2) + 1128) * KAPPA)


def test_pipeline_boundaries_split_by_tier():
    # 4 GPUs per node, TP 2 → 2 stages per node: boundaries intra, inter, intra.
    layout = make_layout(dp=1, pp=4, tp=2, mb=4, pp_tier=2, gpus_per_node=4)
    assert layout.pp_boundaries == (2, 1)
    t = op_time(TINY, Role.INFERENCE, layout, HW, **SEQ)
    nbytes = 8 * 32 * 64 * 2 / (2 * 4)  # 4096 B per microbatch
    step = 2 / 3 * (1e-6 + nbytes * 1e-10) + 1 / 3 * (2e-5 + nbytes * 1e-9)
    assert t.pp_comm == pytest.approx((4 + 4 - 2) * step)
    # an inter-node boundary is never costed as NVLink, even with pp_tier = 0
    low = op_time(
        TINY, Role.INFERENCE, make_layout(dp=1, pp=4, tp=2, mb=4, pp_tier=0, gpus_per_node=4), HW, **SEQ
    )
    step1 = 2 / 3 * (1e-6 + nbytes * 1e-10) + 1 / 3 * (1e-5 + nbytes * 5e-10)
    assert low.pp_comm == pytest.approx(6 * step1)


def test_pipeline_inside_one_node_is_tier_zero():
    layout = make_layout(dp=1, pp=2, tp=1, mb=4, pp_tier=2)
    assert layout.pp_boundaries == (1, 0)
    t = op_time(TINY, Role.TRAINING, layout, HW, **SEQ)
    # training: mb + 2Pp − 3 = 5 steps of 8·32·64·2/4 = 8192 B at tier 0
    assert t.pp_comm == pytest.approx(5 * (1e-6 + 8192 * 1e-10))


# ---------------------------------------------------------------- training
def test_training_dp2_by_hand():
    layout = make_layout(dp=2, pp=1, tp=1, mb=1, dp_tier=1)
    t = op_time(TINY, Role.TRAINING, layout, HW, **SEQ)
    # W = 4·104071168; b = 4, rows = 128, k = 64: η = (128/192)·(64/128) = 1/3
    assert t.gemm == pytest.approx(4 * 104_071_168 / (2 * 1e12 / 3))
    assert t.tp_comm == 0.0 and t.pp_comm == 0.0
    # non-GEMM work at Pt = 1 too: 4 forward-equivalents of T = 128 tokens, σ_layer = 640 + 512,
    # σ_head = 128 + 2000
    assert t.nongemm == pytest.approx(4 * 128 * (4 * 1152 + 2128) * KAPPA)
    # ReduceScatter + AllGather of N_m·sb = 519296 B over 2 ranks at tier 1
    assert t.dp_comm == pytest.approx(2 * (2e-5 + 0.5 * 519_296 * 1e-9))
    # 18·N_m/(P·BW_mem)
    assert t.opt == pytest.approx(18 * 259_648 / (2 * 1e11))


def test_training_memory_bound_uses_one_forward_equivalent():
    t = op_time(TINY, Role.TRAINING, make_layout(dp=2, pp=1, tp=1, mb=1), SLOW_HBM, **SEQ)
    # I = (W_T/(4·P·mb))/(Ω_W + Ω_A) = 52035584/(262144 + 131072), then I·BW < F_peak·η
    intensity = 52_035_584 / (262_144 + 131_072)
    assert t.gemm == pytest.approx(4 * 104_071_168 / (2 * intensity * 1e9))


def test_dp_message_is_the_pp_tp_shard():
    layout = make_layout(dp=2, pp=2, tp=2, mb=2, dp_tier=2)
    t = op_time(TINY, Role.TRAINING, layout, HW, **SEQ)
    # N_m·sb/(Pp·Pt) = 519296/4 = 129824 B, ReduceScatter + AllGather over 2 ranks at tier 2
    assert t.dp_comm == pytest.approx(2 * (5e-5 + 0.5 * 129_824 * 2e-9))
    assert t.opt == pytest.approx(18 * 259_648 / (8 * 1e11))


def test_training_tp2_by_hand():
    t = op_time(TINY, Role.TRAINING, make_layout(dp=1, pp=1, tp=2, mb=1), HW, **SEQ)
    # 6·L·mb = 24 AllReduces of 32768 B over 2 ranks
    assert t.tp_comm == pytest.approx(24 * (2e-5 + 32768 * 1e-10))
    # ×4 forward-equivalents (full recomputation) of the inference's
    assert t.nongemm == pytest.approx(4 * 256 * (4 * (640 + 512 / 2) + 1128) * KAPPA)
    # intensity per forward-equivalent equals inference's: the same η = 0.8/3 bound
    assert t.gemm == pytest.approx(4 * 104_071_168 / (2 * 1e12 * 0.8 / 3))


def test_training_scalar_head_changes_parameter_count():
    lm = op_time(TINY, Role.TRAINING, make_layout(dp=2, pp=1, tp=1, mb=1), HW, **SEQ)
    scalar = op_time(TINY, Role.TRAINING, make_layout(dp=2, pp=1, tp=1, mb=1), HW, **SEQ, head=Head.SCALAR)
    assert scalar.opt == pytest.approx(18 * (259_648 - 64_000 + 64) / (2 * 1e11))
    assert scalar.gemm < lm.gemm


# ---------------------------------------------------------------- generation
def test_generation_by_hand():
    t = op_time(TINY, Role.GENERATION, make_layout(dp=1, pp=1, tp=2, mb=1), HW, **SEQ)
    # prefill: b·Lp = 192 rows, η = (192/256)·(1/3) = 0.25, compute bound
    prefill = 53_714_944 / (2 * 1e12 * 0.25)
    # decode: 8 rows, η = (8/72)·(1/3) = 1/27; I = 1675264/(131072 + 8192 + 114688) ≈ 6.6
    # (KV reads: b·c̄·2·d_kv/Pt·sb·L = 8·28·2·32·2·4 = 114688 B) → I·BW = 6.6e11 > F_peak·η
    decode = 26_804_224 / (2 * 1e12 / 27)
    assert t.gemm == pytest.approx(prefill + decode)
    # prefill: 8 AllReduces of 8·24·64·2 = 24576 B; decode: 2·L·(Lr − 1) = 56 of 8·64·2 = 1024 B
    assert t.tp_comm == pytest.approx(8 * (2e-5 + 24576e-10) + 56 * (2e-5 + 1024e-10))
    assert t.nongemm == 0.0 and t.opt == 0.0 and t.dp_comm == 0.0


def test_decode_memory_bound():
    t = op_time(TINY, Role.GENERATION, make_layout(dp=1, pp=1, tp=2, mb=1), SLOW_HBM, **SEQ, prefill=False)
    intensity = 1_675_264 / (131_072 + 8_192 + 114_688)
    assert t.gemm == pytest.approx(26_804_224 / (2 * intensity * 1e9))


def test_generation_phases_add_up_to_the_whole_decode():
    layout = make_layout(dp=1, pp=2, tp=2, mb=2, gpus_per_node=8)
    whole = op_time(TINY, Role.GENERATION, layout, HW, **SEQ)
    phases = [
        op_time(TINY, Role.GENERATION, layout, HW, **SEQ, decode=w, prefill=(w[0] == 0))
        for w in [(0, 2), (2, 4), (4, 8)]
    ]
    # Decode AllReduce and P2P rounds sum to the whole response's; the GEMM work does too,
    # though per-window F_eff differs (KV reads at different contexts).
    assert sum(p.tp_comm for p in phases) == pytest.approx(whole.tp_comm)
    assert sum(p.pp_comm for p in phases) == pytest.approx(whole.pp_comm)
    assert sum(p.gemm for p in phases) == pytest.approx(whole.gemm, rel=0.05)


def test_fewer_sequences_in_a_later_phase_cost_less():
    layout = make_layout(dp=1, pp=1, tp=1, mb=1)
    full = op_time(TINY, Role.GENERATION, layout, HW, **SEQ, decode=(4, 8), prefill=False)
    half = op_time(
        TINY,
        Role.GENERATION,
        layout,
        HW,
        sequences=4.0,
        prompt_len=24,
        response_len=8,
        decode=(4, 8),
        prefill=False,
    )
    assert 0 < half.gemm < full.gemm


# ---------------------------------------------------------------- monotonicity on a real model
H100 = hardware_preset("h100")
LLAMA7 = model_preset("llama2-7b")
WORK = {"sequences": 256, "prompt_len": 512, "response_len": 512}


@pytest.mark.parametrize("role", list(Role))
def test_more_tp_less_gemm_more_tp_comm(role):
    times = [op_time(LLAMA7, role, make_layout(dp=1, pp=1, tp=tp, mb=1), H100, **WORK) for tp in (1, 2, 4, 8)]
    gemm = [t.gemm for t in times]
    comm = [t.tp_comm for t in times]
    assert gemm == sorted(gemm, reverse=True) and gemm[0] > gemm[-1]
    assert comm[0] == 0.0 and comm == sorted(comm) and comm[1] < comm[-1]


def test_longer_responses_take_longer_to_generate():
    layout = make_layout(dp=2, pp=1, tp=4, mb=1)
    times = [
        op_time(LLAMA7, Role.GENERATION, layout, H100, sequences=256, prompt_len=512, response_len=lr).total
        for lr in (128, 512, 2048)
    ]
    assert times[0] < times[1] < times[2]


def test_bubble_shrinks_with_more_microbatches():
    def bubble_ratio(mb):
        t = op_time(LLAMA7, Role.TRAINING, make_layout(dp=1, pp=4, tp=2, mb=mb), H100, **WORK)
        return t.bubble / t.gemm

    assert bubble_ratio(4) == pytest.approx(3 / 4)
    assert bubble_ratio(16) == pytest.approx(3 / 16)


@settings(max_examples=30, deadline=None)
@given(
    role=st.sampled_from(list(Role)),
    n=st.floats(1, 512),
    extra=st.floats(1, 512),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 4]),
)
def test_more_sequences_take_longer(role, n, extra, tp, pp):
    layout = make_layout(dp=2, pp=pp, tp=tp, mb=pp, pp_tier=1, dp_tier=1)
    a = op_time(LLAMA7, role, layout, H100, sequences=n, prompt_len=256, response_len=256)
    b = op_time(LLAMA7, role, layout, H100, sequences=n + extra, prompt_len=256, response_len=256)
    assert b.total > a.total > 0
    for t in (a, b):
        assert all(x >= 0 for x in (t.gemm, t.bubble, t.tp_comm, t.pp_comm, t.dp_comm, t.nongemm))


# ---------------------------------------------------------------- validation
def test_time_breakdown_total_and_comm():
    t = TimeBreakdown(gemm=1.0, bubble=2.0, tp_comm=3.0, pp_comm=4.0, dp_comm=5.0, nongemm=6.0, opt=7.0)
    assert t.comm == 12.0
    assert t.total == 28.0
    assert dataclasses.replace(t, overhead=0.5).total == 28.5


def test_nongemm_scales_with_the_tokens_and_width_a_device_processes():
    """Doubling the microbatches at a fixed microbatch size or the sequence length doubles the
    non-GEMM term; halving it over twice the data-parallel ranks halves it; a wider model moves
    more scalars per token (its blocks' share doubles with the width, the head's norm too)."""
    layout = make_layout(dp=1, pp=1, tp=2, mb=1)
    base = op_time(TINY, Role.INFERENCE, layout, HW, **SEQ).nongemm
    more_mb = op_time(
        TINY,
        Role.INFERENCE,
        make_layout(dp=1, pp=1, tp=2, mb=2),
        HW,
        sequences=16,
        prompt_len=24,
        response_len=8,
    )
    longer = op_time(TINY, Role.INFERENCE, layout, HW, sequences=8, prompt_len=56, response_len=8)
    wider = op_time(dataclasses.replace(TINY, hidden=128, head_dim=32), Role.INFERENCE, layout, HW, **SEQ)
    dp2 = op_time(TINY, Role.INFERENCE, make_layout(dp=2, pp=1, tp=2, mb=1), HW, **SEQ)
    assert more_mb.nongemm == pytest.approx(2 * base)
    assert longer.nongemm == pytest.approx(2 * base)
    # σ = L·(10d + (2·(d_q + d_kv) + 2·dff)/Pt) + 2d + 2V/Pt at d = d_q = d_kv = 64 → 128, dff = 128
    assert wider.nongemm / base == pytest.approx(
        (4 * (1280 + 768 / 2) + 256 + 1000) / (4 * (640 + 512 / 2) + 1128)
    )
    assert dp2.nongemm == pytest.approx(base / 2)


def _with_engines(**changes):
    from rpeg.ir.hardware import EngineTerms, OpTerms

    eng = EngineTerms(
        "e",
        prefill=OpTerms(efficiency=0.5, per_call_s=1e-3, per_layer_s=1e-4, per_step_s=2e-4),
        decode=OpTerms(efficiency=0.25, per_call_s=7e-3, per_layer_s=3e-5, per_step_s=4e-4),
        inference=OpTerms(efficiency=0.8, per_call_s=2e-3, per_layer_s=5e-5),
        training=OpTerms(efficiency=0.4, per_call_s=3e-3, per_layer_s=6e-5),
        weight_sync=Link(1e-2, 1e-9),
    )
    return dataclasses.replace(HW, engines=(eng,), engine_for=("e", "e", "e"), **changes)


def test_engine_terms_by_hand():
    """η divides T_gemm (and so the bubble); the fixed costs are counted per call, per layer
    pass on the 1F1B critical path and per decode step; the weight sync comes with the prefill."""
    hw = _with_engines(dispatch_s=5e-4)
    layout = make_layout(dp=1, pp=2, tp=1, mb=2)  # slots = mb + Pp − 1 = 3, L/Pp = 2 layers
    spec_inf = op_time(TINY, Role.INFERENCE, layout, HW, **SEQ)
    inf = op_time(TINY, Role.INFERENCE, layout, hw, **SEQ)
    assert inf.gemm == pytest.approx(spec_inf.gemm / 0.8)
    assert inf.bubble == pytest.approx(spec_inf.bubble / 0.8)
    assert inf.overhead == pytest.approx(2e-3 + 1 * 3 * 2 * 5e-5 + 5e-4)
    assert inf.tp_comm == spec_inf.tp_comm and inf.nongemm == spec_inf.nongemm
    train = op_time(TINY, Role.TRAINING, layout, hw, **SEQ)
    assert train.gemm == pytest.approx(op_time(TINY, Role.TRAINING, layout, HW, **SEQ).gemm / 0.4)
    assert train.overhead == pytest.approx(3e-3 + 4 * 3 * 2 * 6e-5 + 5e-4)  # f = 4 (full)
    one = make_layout(dp=1, pp=1, tp=1, mb=1)
    spec_gen = op_time(TINY, Role.GENERATION, one, HW, **SEQ, decode=(0, 8))
    gen = op_time(TINY, Role.GENERATION, one, hw, **SEQ, decode=(0, 8))
    pre = op_time(TINY, Role.GENERATION, one, HW, **SEQ, decode=(0, 0))
    assert gen.gemm == pytest.approx(pre.gemm / 0.5 + (spec_gen.gemm - pre.gemm) / 0.25)
    sync = 1e-2 + 259_648 * 2 * 1e-9  # N_m·sb·β
    per_step = lambda c_step, c_layer: c_step + 4 * c_layer  # noqa: E731 (L/Pp = 4)
    assert gen.overhead == pytest.approx(1e-3 + per_step(2e-4, 1e-4) + sync + 8 * per_step(4e-4, 3e-5) + 5e-4)
    later = op_time(TINY, Role.GENERATION, one, hw, **SEQ, decode=(4, 8), prefill=False)
    assert later.overhead == pytest.approx(7e-3 + 4 * per_step(4e-4, 3e-5) + 5e-4)  # a decode call, no sync


def test_training_engine_data_parallel_link_prices_intra_node_dp_only():
    """``T_dp`` = ReduceScatter + AllGather of ``N_m·sb/(Pp·Pt)`` over ``Pd`` with the training
    engine's data-parallel link at tier 0; inter-node DP keeps the tier's collective link."""
    from rpeg.ir.hardware import EngineTerms

    link = Link(2e-2, 3e-9)
    hw = dataclasses.replace(HW, engines=(EngineTerms("t", data_parallel=link),), engine_for=("", "", "t"))
    layout = make_layout(dp=4, pp=1, tp=1, mb=1)
    shard = 259_648 * 2  # N_m·sb, Pp = Pt = 1
    got = op_time(TINY, Role.TRAINING, layout, hw, **SEQ).dp_comm
    assert got == pytest.approx(2 * (3 * 2e-2 + 3 / 4 * shard * 3e-9))
    assert op_time(TINY, Role.TRAINING, layout, HW, **SEQ).dp_comm != pytest.approx(got)
    inter = make_layout(dp=4, pp=1, tp=1, mb=1, dp_tier=1)
    assert op_time(TINY, Role.TRAINING, inter, hw, **SEQ).dp_comm == pytest.approx(
        op_time(TINY, Role.TRAINING, inter, HW, **SEQ).dp_comm
    )


def test_generation_engine_tensor_parallel_link_prices_generation_only():
    """A generation node's ``T_tp`` — ``2·L`` AllReduces per prefill microbatch and per decoded
    token — uses the generation engine's own link; inference and training keep the tier-0
    collective link."""
    from rpeg.ir.hardware import EngineTerms

    link = Link(4e-5, 2e-10)
    hw = dataclasses.replace(HW, engines=(EngineTerms("v", tensor_parallel=link),), engine_for=("v", "", ""))
    layout = make_layout(dp=1, pp=1, tp=2, mb=1)
    n, lp, lr, d, sb, layers = 8, 24, 8, TINY.hidden, TINY.dtype_bytes, TINY.layers
    prefill = 2 * layers * (2 * (1 * link.alpha + 0.5 * n * lp * d * sb * link.beta))
    decode = 2 * layers * (lr - 1) * (2 * (1 * link.alpha + 0.5 * n * d * sb * link.beta))
    got = op_time(TINY, Role.GENERATION, layout, hw, **SEQ).tp_comm
    assert got == pytest.approx(prefill + decode)
    assert op_time(TINY, Role.GENERATION, layout, HW, **SEQ).tp_comm != pytest.approx(got)
    for role in (Role.INFERENCE, Role.TRAINING):
        assert op_time(TINY, role, layout, hw, **SEQ).tp_comm == pytest.approx(
            op_time(TINY, role, layout, HW, **SEQ).tp_comm
        )


def test_dispatch_reaches_comm_and_reshard_nodes():
    hw = dataclasses.replace(HW, dispatch_s=1e-3)
    assert comm_time(1e6, 2, 4, 0, hw) == pytest.approx(comm_time(1e6, 2, 4, 0, HW) + 1e-3)
    assert reshard_time(TINY, 4, 0, hw) == pytest.approx(reshard_time(TINY, 4, 0, HW) + 1e-3)


def test_op_time_rejects_bad_arguments():
    layout = make_layout(dp=1, pp=1, tp=1, mb=1)
    with pytest.raises(ValueError, match="decode window"):
        op_time(TINY, Role.INFERENCE, layout, HW, **SEQ, decode=(0, 4))
    with pytest.raises(ValueError, match="decode window must satisfy"):
        op_time(TINY, Role.GENERATION, layout, HW, **SEQ, decode=(5, 3))
    with pytest.raises(ValueError, match="decode window must satisfy"):
        op_time(TINY, Role.GENERATION, layout, HW, **SEQ, decode=(0, 9))
    with pytest.raises(ValueError, match="sequences"):
        op_time(TINY, Role.TRAINING, layout, HW, sequences=-1, prompt_len=4, response_len=4)


# ---------------------------------------------------------------- COMM / RESHARD nodes
def test_comm_time_by_hand():
    # α_p2p + M·β_p2p/min(4, 8) at tier 1
    assert comm_time(1e6, 4, 8, 1, HW) == pytest.approx(1e-5 + 1e6 * 5e-10 / 4)
    assert comm_time(1e6, 8, 4, 2, HW) == pytest.approx(2e-5 + 1e6 * 1e-9 / 4)
    with pytest.raises(ValueError, match="tier"):
        comm_time(1e6, 4, 8, 3, HW)
    with pytest.raises(ValueError, match="src_size"):
        comm_time(1e6, 0, 8, 1, HW)


def test_reshard_time_by_hand():
    # AlltoAll over 4 ranks of N_m·sb/4 = 129824 B at tier 0: 3α + M·β
    assert reshard_time(TINY, 4, 0, HW) == pytest.approx(3e-5 + 129_824 * 1e-10)
    assert reshard_time(TINY, 1, 0, HW) == 0.0


def test_publication_bytes_by_hand():
    full = 259_648 * 2
    assert publication_bytes(TINY, 4, 8, 0) == full
    assert publication_bytes(TINY, 4, 8, 2) == pytest.approx(full * 6 / 8)
    assert publication_bytes(TINY, 8, 8, 8) == 0.0
    assert publication_bytes(TINY, 4, 8, 0, head=Head.SCALAR) == (259_648 - 64_000 + 64) * 2
    with pytest.raises(ValueError, match="overlap"):
        publication_bytes(TINY, 4, 8, 5)

"""Issue 31's GPU terms of a training or inference node: the memory-bound (non-GEMM) work at
every tensor-parallel degree, and the fused attention kernel's own rates
(``docs/cost-model.md`` §2 "Non-GEMM work" and "The attention core")."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rpeg.costmodel.collectives import alltoall_time, hierarchical_alltoall_time
from rpeg.costmodel.flops import (
    REFERENCE_FFN_RATIO,
    attention_core_flops,
    head_nongemm_scalars,
    inference_flops,
    layer_nongemm_scalars,
    reference_nongemm_scalars,
    training_flops,
)
from rpeg.costmodel.hardware import HARDWARE_PRESETS, hardware_preset
from rpeg.costmodel.layout import Layout
from rpeg.costmodel.time import op_time
from rpeg.ir.errors import InputError
from rpeg.ir.hardware import AttentionRate, Hardware, Link
from rpeg.ir.models import ModelSpec, model_preset
from rpeg.ir.plan import Strategy
from rpeg.ir.types import Head, Role

GPU_PRESETS = tuple(name for name in HARDWARE_PRESETS if name != "cpu")

#: d = 64, GQA (4 query heads, 2 KV heads of 16), SwiGLU of 160, V = 1000, 4 layers
DENSE = ModelSpec("dense", layers=4, hidden=64, ffn_hidden=160, vocab=1000, heads=4, kv_heads=2)


def _layout(dp: int = 1, tp: int = 1, mb: int = 1, **kw: object) -> Layout:
    return Layout(Strategy((1, 1, dp * tp), dp=dp, pp=1, tp=tp, mb=mb, **kw), gpus_per_node=8)


def _kappa(hw: Hardware) -> float:
    return hw.c_nongemm / (hw.b_cal * hw.l_cal * reference_nongemm_scalars(hw.d_cal))


# ------------------------------------------------------------------------------ non-GEMM work
def test_a_dense_blocks_scalars_by_hand():
    # replicated: 2 norms (4d) + 2 residual adds (6d) = 640; split: rotary of Q and K,
    # 2·(64 + 32) = 192, and SwiGLU 3·160 = 480
    assert layer_nongemm_scalars(DENSE) == 640 + 192 + 480
    assert layer_nongemm_scalars(DENSE, tp=2) == 640 + (192 + 480) / 2
    assert layer_nongemm_scalars(DENSE, tp=2, sp=True) == (640 + 192 + 480) / 2
    plain = dataclasses.replace(DENSE, ffn_projections=2)  # GELU: read and write dff
    assert layer_nongemm_scalars(plain) == 640 + 192 + 2 * 160
    # the head: the final norm and two reads of the token's V/Pt logits; a scalar head the norm
    assert head_nongemm_scalars(DENSE, Head.LM, tp=4) == 128 + 2 * 1000 / 4
    assert head_nongemm_scalars(DENSE, Head.SCALAR) == 128


def test_a_moe_block_adds_its_router_and_token_permutation():
    moe = dataclasses.replace(DENSE, experts=8, experts_active=2, expert_ffn=32, dense_layers=(0,))
    # router 2E = 16, permute 2kd + combine kd + d = 3·2·64 + 64, experts' SwiGLU k·3·d_e = 192
    moe_block = 640 + 16 + 3 * 2 * 64 + 64 + 192 + 2 * 3 * 32
    dense_block = 640 + 192 + 480
    assert layer_nongemm_scalars(moe) == pytest.approx((3 * moe_block + dense_block) / 4)
    shared = dataclasses.replace(moe, shared_experts=1, shared_ffn=48)
    assert layer_nongemm_scalars(shared) - layer_nongemm_scalars(moe) == pytest.approx(3 / 4 * 3 * 48)


def test_the_reference_block_is_the_calibration_layers_shape():
    assert REFERENCE_FFN_RATIO == 11008 / 4096 == 688 / 256
    ref = ModelSpec("ref", layers=1, hidden=4096, ffn_hidden=11008, vocab=8, heads=32, kv_heads=32)
    assert reference_nongemm_scalars(4096) == pytest.approx(layer_nongemm_scalars(ref))


@pytest.mark.parametrize("name", GPU_PRESETS)
def test_a_gpu_presets_c_nongemm_is_the_reference_blocks_bytes_at_its_bandwidth(name):
    hw = hardware_preset(name)
    derived = hw.b_cal * hw.l_cal * reference_nongemm_scalars(hw.d_cal) * 2 / hw.mem_bandwidth
    assert hw.c_nongemm == pytest.approx(derived, rel=1e-3)
    assert "derived" in dict(hw.sources)["c_nongemm"]


def test_non_gemm_work_is_charged_at_tp_1_and_tp_shrinks_only_its_split_part():
    """The issue's held-out finding: at ``Pt = 1`` the old term ``c_ng·(1 − 1/Pt)`` was 0."""
    hw = hardware_preset("h100")
    m = model_preset("llama3.1-8b")
    args = {"sequences": 16, "prompt_len": 1024, "response_len": 1024}
    one = op_time(m, Role.INFERENCE, _layout(), hw, **args).nongemm
    two = op_time(m, Role.INFERENCE, _layout(tp=2), hw, **args).nongemm
    sp = op_time(m, Role.INFERENCE, _layout(tp=2, sp=True), hw, **args).nongemm
    tokens = 16 * 2048
    sigma = m.layers * layer_nongemm_scalars(m) + head_nongemm_scalars(m)
    assert one == pytest.approx(tokens * sigma * _kappa(hw))
    # a preset's κ is 2 bytes per scalar at the derated HBM bandwidth
    assert _kappa(hw) == pytest.approx(2 / hw.mem_bandwidth, rel=1e-3)
    assert one / 2 < two < one  # the norms and residual adds stay whole on each TP rank
    assert sp == pytest.approx(one / 2)


def test_training_charges_the_non_gemm_work_per_forward_equivalent():
    hw = hardware_preset("h100")
    m = model_preset("llama3.1-8b")
    args = {"sequences": 8, "prompt_len": 512, "response_len": 512}
    inf = op_time(m, Role.INFERENCE, _layout(), hw, **args).nongemm
    none = op_time(m, Role.TRAINING, _layout(recompute="none"), hw, **args).nongemm
    full = op_time(m, Role.TRAINING, _layout(recompute="full"), hw, **args).nongemm
    assert none == pytest.approx(3 * inf) and full == pytest.approx(4 * inf)


# ------------------------------------------------------------------------- the attention core
def test_attention_rates_interpolate_in_the_head_width():
    hw = hardware_preset("h100")
    assert hw.attention_rates(64) == (408e12, 417e12)
    assert hw.attention_rates(128) == (609e12, 499e12)
    assert hw.attention_rates(96) == pytest.approx((508.5e12, 458e12))
    assert hw.attention_rates(32) == hw.attention_rates(64)  # the nearest measured width outside
    assert hw.attention_rates(256) == hw.attention_rates(128)
    assert hardware_preset("b200").attention_rates(128) is None  # no published rates: roofline


def test_the_attention_core_runs_at_the_kernels_rates():
    """Compute-bound passes (``F_eff = F_peak·η`` whatever the work): the rest of the work keeps
    the roofline's rate, the core ``A`` takes ``A/r_fwd`` per forward and ``2.5·A/r_bwd`` per
    backward (``Hardware.attention_rates`` at the head width 128)."""
    hw = hardware_preset("h100")
    roof = dataclasses.replace(hw, attention=())
    m = model_preset("llama3.1-8b")
    assert m.attention_width / m.heads == 128
    n, args = 8, {"sequences": 8, "prompt_len": 4096, "response_len": 4096}
    core = n * attention_core_flops(m, 8192)
    r_f, r_b = 609e12, 499e12

    rated = op_time(m, Role.INFERENCE, _layout(), hw, **args).gemm
    plain = op_time(m, Role.INFERENCE, _layout(), roof, **args).gemm
    work = inference_flops(m, **args)
    assert rated == pytest.approx(plain * (work - core) / work + core / r_f, rel=1e-9)

    for mode, forwards in (("none", 1), ("selective", 2), ("full", 2)):
        lay = _layout(recompute=mode)
        rated = op_time(m, Role.TRAINING, lay, hw, **args).gemm
        plain = op_time(m, Role.TRAINING, lay, roof, **args).gemm
        work = training_flops(m, recompute=mode, **args)
        in_work = (forwards + 2) * core  # rpeg counts a backward as two forwards
        expect = plain * (work - in_work) / work + core * (forwards / r_f + 2.5 / r_b)
        assert rated == pytest.approx(expect, rel=1e-9), mode


def test_a_ring_hides_behind_the_rated_core():
    hw = dataclasses.replace(hardware_preset("h100"), collective=(hardware_preset("h100").collective[0],) * 3)
    m = model_preset("llama3.1-8b")
    s = Strategy((1, 1, 8), dp=1, pp=1, tp=2, mb=8, cp=4, sp=True, recompute="none")
    args = {"sequences": 8, "prompt_len": 1024, "response_len": 31744}
    t = op_time(m, Role.TRAINING, Layout(s, gpus_per_node=8), hw, **args)
    roof = op_time(
        m, Role.TRAINING, Layout(s, gpus_per_node=8), dataclasses.replace(hw, attention=()), **args
    )
    # the core at cuDNN's rates is slower than at the roofline, so it hides at least as much ring
    assert t.cp_comm <= roof.cp_comm


# ------------------------------------------------------------------------- the hardware file
def test_attention_rates_round_trip_and_bad_entries_are_named(tmp_path):
    hw = hardware_preset("h100")
    assert Hardware.from_dict(hw.to_dict()) == hw
    doc = hw.to_dict()
    doc["attention"] = [
        {"head_dim": 128, "forward": 1e14, "backward": 1e14},
        {"head_dim": 64, "forward": 1e14, "backward": 1e14},
    ]
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"hw\.json.*increasing, distinct head_dim"):
        Hardware.load(path)
    doc["attention"] = [{"head_dim": 64, "forward": -1.0, "backward": 1e14}]
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"attention.*forward"):
        Hardware.load(path)
    with pytest.raises(ValueError, match="head_dim must be a positive integer"):
        AttentionRate(0, 1e14, 1e14)


# ------------------------------------------------------------------ an AlltoAll across nodes
def test_an_alltoall_across_nodes_sends_only_the_off_node_share_between_them():
    intra, inter = Link(1e-6, 1e-11), Link(1e-5, 1e-10)
    m = 1e9
    # 16 ranks, 8 per node: 7/15 of the bytes inside the node, 8/15 between nodes, at once
    near = 7 * 1e-6 + m * 7 / 15 * 1e-11
    far = 8 * 1e-5 + m * 8 / 15 * 1e-10
    assert hierarchical_alltoall_time(16, 8, m, intra, inter) == pytest.approx(max(near, far))
    assert hierarchical_alltoall_time(16, 1, m, intra, inter) == pytest.approx(alltoall_time(16, m, inter))
    assert hierarchical_alltoall_time(16, 16, m, intra, inter) == pytest.approx(alltoall_time(16, m, intra))
    with pytest.raises(ValueError, match="local must be in"):
        hierarchical_alltoall_time(4, 5, m, intra, inter)


def test_the_expert_groups_ranks_per_node_follow_the_rank_order():
    def lay(**kw: int) -> Layout:
        ep, dp = kw.pop("ep"), kw.pop("dp")
        s = Strategy((1, 2, 8), dp=dp, ep=ep, **kw)
        return Layout(s, gpus_per_node=8)

    assert lay(dp=16, pp=1, tp=1, mb=1, ep=16).ep_ranks_per_node == 8  # consecutive devices
    assert lay(dp=4, pp=4, tp=1, mb=4, ep=4).ep_ranks_per_node == 2  # DP ranks 4 devices apart
    assert lay(dp=2, pp=1, tp=2, mb=1, cp=2, ep=4).ep_ranks_per_node == 4  # devices 0, 2, 4, 6
    assert Layout(Strategy((1, 2, 8), dp=1, pp=1, tp=2, mb=1, cp=8), 8).cp_ranks_per_node == 4


def test_expert_parallelism_over_two_nodes_pays_the_nic_for_half_its_peers():
    hw = hardware_preset("h100")
    m = model_preset("qwen3-30b-a3b")
    s = Strategy((1, 2, 8), dp=16, pp=1, tp=1, mb=8, ep=16, ep_tier=1, recompute="none")
    args = {"sequences": 128, "prompt_len": 2048, "response_len": 2048}
    t = op_time(m, Role.TRAINING, Layout(s, gpus_per_node=8), hw, **args).ep_comm
    tokens = 128 / (16 * 8) * 4096
    nbytes = tokens * m.experts_active * m.hidden * m.dtype_bytes * 15 / 16
    one = hierarchical_alltoall_time(16, 8, nbytes, hw.collective[0], hw.collective[1])
    assert t == pytest.approx(4 * m.moe_layers * 8 * one)  # 2 forward + 2 backward per layer and microbatch
    flat = 4 * m.moe_layers * 8 * alltoall_time(16, nbytes, hw.collective[1])
    assert t < 0.6 * flat  # half the bytes stay on NVLink

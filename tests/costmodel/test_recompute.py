"""Activation recomputation (``none`` / ``selective`` / ``full``) in the cost model, against
hand-computed numbers (``docs/cost-model.md`` §1, §2, §4). Attention is fused (SPEC §14.7): no
mode keeps an ``ℓ²`` buffer, so ``selective`` keeps what ``none`` keeps and only costs time.

The small model: L = 2, d = 8, dff = 16, V = 10, 2 heads of 4 (no GQA), gated FFN, sb = 2;
``W_layer = 2·8·8 + 2·8·8 + 3·8·16 = 640``.
"""

import dataclasses

import pytest

from rpeg.costmodel import (
    Layout,
    attention_core_flops,
    forward_flops,
    hardware_preset,
    inference_flops,
    op_time,
    stored_activation_width,
    training_activation_bytes,
    training_flops,
    training_passes,
    transient_bytes,
)
from rpeg.ir.models import ModelSpec
from rpeg.ir.plan import Strategy
from rpeg.ir.types import Head, Recompute, Role

SMALL = ModelSpec(name="small", layers=2, hidden=8, ffn_hidden=16, vocab=10, heads=2, kv_heads=2)
MODES = tuple(Recompute)


def layout(dp: int, pp: int, tp: int, mb: int, mode: Recompute | str) -> Layout:
    return Layout(Strategy((1, 1, dp * pp * tp), dp, pp, tp, mb, recompute=mode), 8)


# ---------------------------------------------------------------------------- work
def test_forward_equivalents_by_hand():
    # ℓ = 4: W_fwd = L·(2·640·4 + 2·8·16) + 2·8·10·4 = 2·(5120 + 256) + 640 = 11392;
    # attention core L·2·d_q·ℓ² = 2·2·8·16 = 512
    assert forward_flops(SMALL, 4) == 11392
    assert attention_core_flops(SMALL, 4) == 512
    assert training_passes(SMALL, "full", 4) == 4.0
    assert training_passes(SMALL, "none", 4) == 3.0
    assert training_passes(SMALL, "selective", 4) == pytest.approx(3 + 512 / 11392)


def test_training_flops_per_mode():
    lengths = {"sequences": 5, "prompt_len": 1, "response_len": 3}
    w_i = inference_flops(SMALL, **lengths)
    assert w_i == 5 * 11392
    assert training_flops(SMALL, **lengths) == 4 * w_i  # default: SPEC's full recomputation
    assert training_flops(SMALL, **lengths, recompute="none") == 3 * w_i
    assert training_flops(SMALL, **lengths, recompute="selective") == pytest.approx(3 * w_i + 5 * 512)


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="recompute must be one of none, selective, full"):
        Strategy((1, 1, 1), 1, 1, 1, 1, recompute="partial")
    with pytest.raises(ValueError):
        training_passes(SMALL, "partial", 4)


# ---------------------------------------------------------------------------- time
def _times(dp, pp, tp, mb, **kw):
    # the attention core at the roofline (no kernel rates), so that the GEMM time is ∝ f
    hw = dataclasses.replace(hardware_preset("h100"), attention=())
    model = kw.pop("model", SMALL)
    return {
        m: op_time(model, Role.TRAINING, layout(dp, pp, tp, mb, m), hw, sequences=64, **kw) for m in MODES
    }


def test_training_time_terms_scale_with_the_forward_equivalents():
    t = _times(2, 2, 2, 4, prompt_len=128, response_len=384)
    full, none, sel = t[Recompute.FULL], t[Recompute.NONE], t[Recompute.SELECTIVE]
    f_sel = training_passes(SMALL, "selective", 512)
    # same intensity (one forward-equivalent per microbatch) ⇒ same F_eff: GEMM time ∝ f
    assert none.gemm == pytest.approx(0.75 * full.gemm)
    assert sel.gemm == pytest.approx(f_sel / 4 * full.gemm)
    assert none.bubble == pytest.approx(0.75 * full.bubble)
    # TP AllReduces: 6 per layer and microbatch with the recompute, 4 without (selective too)
    assert none.tp_comm == pytest.approx(4 / 6 * full.tp_comm)
    assert sel.tp_comm == pytest.approx(none.tp_comm)
    # the non-GEMM residual ×f; pipeline, DP and optimizer terms do not depend on the mode
    assert none.nongemm == pytest.approx(0.75 * full.nongemm)
    assert sel.nongemm == pytest.approx(f_sel / 4 * full.nongemm)
    for m in (none, sel):
        assert (m.pp_comm, m.dp_comm, m.opt) == (full.pp_comm, full.dp_comm, full.opt)
    assert none.total < sel.total < full.total


def test_non_training_roles_ignore_the_mode():
    hw = hardware_preset("h100")
    for role in (Role.INFERENCE, Role.GENERATION):
        got = {
            op_time(SMALL, role, layout(1, 1, 2, 1, m), hw, sequences=8, prompt_len=16, response_len=16)
            for m in MODES
        }
        assert len(got) == 1


# ---------------------------------------------------------------------------- memory
def test_stored_activation_width_by_hand():
    # 4d + (2·d_q + 2·d_kv + 2·(n_ffn − 1)·dff)/Pt = 32 + (16 + 16 + 64)/Pt
    assert stored_activation_width(SMALL, 1) == 128
    assert stored_activation_width(SMALL, 2) == 80


def test_stored_activation_width_is_korthikanti_without_dropout_masks():
    # GPT block (d_q = d_kv = d, ungated dff = 4d), 2 bytes: Korthikanti et al. (2022) store
    # sbh·(10 + 24/t) per layer with tensor parallelism, 2·sbh of which are dropout masks
    d = 256
    gpt = ModelSpec(
        name="gpt", layers=2, hidden=d, ffn_hidden=4 * d, vocab=10, heads=4, kv_heads=4, ffn_projections=2
    )
    for t in (1, 2, 4):
        assert 2 * stored_activation_width(gpt, t) == pytest.approx(d * (10 + 24 / t) - 2 * d)


def test_training_activations_by_hand():
    # dp = pp = mb = 1, tp = 2, n = 4 sequences (b = 4), ℓ = 4: a = 80 per token and layer;
    # fused attention keeps no probabilities, so none and selective store b·ℓ·(L/Pp)·a;
    # full: c = ⌊√2⌋ = 1, width 2/1·8 + 1·max(8·2 + 48/2, 16 + 32/2) = 56
    got = {m: training_activation_bytes(SMALL, layout(1, 1, 2, 1, m), sequences=4, tokens=4) for m in MODES}
    assert got[Recompute.NONE] == 2 * 1 * 4 * (2 * 4 * 80) == 5120
    assert got[Recompute.SELECTIVE] == got[Recompute.NONE]  # same memory, more time
    assert got[Recompute.FULL] == 2 * 1 * 4 * 4 * 56 == 1792  # SPEC's formula
    # no ℓ² term: doubling ℓ doubles every mode's activations
    twice = {m: training_activation_bytes(SMALL, layout(1, 1, 2, 1, m), sequences=4, tokens=8) for m in MODES}
    for m in MODES:
        assert twice[m] == pytest.approx(2 * got[m])


def test_activations_under_pipelining_by_hand():
    # dp = 1, pp = 2, tp = 1, mb = 4, n = 8 (b = 2), ℓ = 4: L/Pp = 1 layer, min(mb, Pp) = 2 alive
    # a = 128; full: c = 1, width 1/1·8 + 1·max(16 + 48, 16 + 32) = 72
    got = {m: training_activation_bytes(SMALL, layout(1, 2, 1, 4, m), sequences=8, tokens=4) for m in MODES}
    assert got[Recompute.NONE] == 2 * 2 * 2 * (1 * 4 * 128) == 4096
    assert got[Recompute.SELECTIVE] == got[Recompute.NONE]
    assert got[Recompute.FULL] == 2 * 2 * 2 * 4 * 72 == 2304
    # mb = 1 with pp = 2 would be illegal; mb = 2 keeps min(2, 2) = 2 microbatches of b = 4
    got2 = training_activation_bytes(SMALL, layout(1, 2, 1, 2, "none"), sequences=8, tokens=4)
    assert got2 == 2 * 2 * 4 * (1 * 4 * 128)


def test_transient_training_memory_orders_the_modes():
    lay = {m: layout(2, 1, 2, 1, m) for m in MODES}
    a = {
        m: transient_bytes(SMALL, Role.TRAINING, lay[m], sequences=16, prompt_len=64, response_len=64)
        for m in MODES
    }
    # fused attention: selective keeps what none keeps; full keeps less
    assert a[Recompute.FULL] < a[Recompute.SELECTIVE] == a[Recompute.NONE]
    # the weights, gradients and logits are the same; only the activations differ
    diff = a[Recompute.NONE] - a[Recompute.FULL]
    acts = {m: training_activation_bytes(SMALL, lay[m], sequences=16, tokens=128) for m in MODES}
    assert diff == pytest.approx(acts[Recompute.NONE] - acts[Recompute.FULL])
    # b = 16/2 = 8, ℓ = 128, a = 80: none stores 2·8·128·2·80; full 2·8·128·56
    assert acts[Recompute.NONE] == 2 * 8 * 128 * 2 * 80
    assert acts[Recompute.FULL] == 2 * 8 * 128 * 56
    # selective costs time, not memory: slower than none at the same memory
    hw = hardware_preset("h100")
    t = {
        m: op_time(SMALL, Role.TRAINING, lay[m], hw, sequences=16, prompt_len=64, response_len=64).total
        for m in MODES
    }
    assert t[Recompute.NONE] < t[Recompute.SELECTIVE] < t[Recompute.FULL]
    # inference memory ignores the mode
    inf = {
        transient_bytes(
            SMALL, Role.INFERENCE, lay[m], sequences=16, prompt_len=64, response_len=64, head=Head.LM
        )
        for m in MODES
    }
    assert len(inf) == 1

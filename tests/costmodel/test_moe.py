"""The cost model on mixture-of-experts shapes (SPEC §15.1, docs/cost-model.md §9): FLOPs count
the active experts, memory every expert, a pass reads the experts its tokens touch, and the
expert GEMMs run at their own efficiency. A dense model's figures are unchanged (the rest of the
suite pins them)."""

from __future__ import annotations

import dataclasses

import pytest

from rpeg import Cluster, Workload, hardware_preset, model_preset, solve
from rpeg.costmodel.flops import decode_flops_at, prefill_flops
from rpeg.costmodel.layout import Layout
from rpeg.costmodel.memory import (
    kv_bytes_per_token,
    kv_scalars_per_device,
    stored_activation_width,
    training_state_bytes,
    weight_shard_params,
)
from rpeg.costmodel.time import _Roofline
from rpeg.ir import Strategy
from rpeg.ir.errors import InputError
from rpeg.ir.hardware import Hardware
from rpeg.ir.types import Head

QWEN3_MOE = model_preset("qwen3-30b-a3b")
MIXTRAL = model_preset("mixtral-8x7b")


def _dense_reading(spec):
    """What the dense reader made of a MoE config.json: one FFN of the dense width, no experts."""
    return dataclasses.replace(
        spec, experts=0, experts_active=0, expert_ffn=0, shared_experts=0, shared_ffn=0, dense_layers=()
    )


def test_flops_count_the_active_experts():
    """Forward FLOPs per token (short prompt: the attention scores vanish) are twice the active
    non-embedding parameters plus the head: Mixtral's 2 of 8 experts, not one dense FFN."""
    per_token = prefill_flops(MIXTRAL, sequences=1, prompt_len=1, head=Head.LM)
    matmuls = MIXTRAL.active_params - 2 * MIXTRAL.embedding_params - (2 * MIXTRAL.layers + 1) * MIXTRAL.hidden
    head = 2 * MIXTRAL.hidden * MIXTRAL.vocab
    assert per_token == pytest.approx(2 * matmuls + head + 2 * MIXTRAL.layers * MIXTRAL.q_width, rel=1e-9)
    dense = prefill_flops(_dense_reading(MIXTRAL), sequences=1, prompt_len=1, head=Head.LM)
    assert dense / per_token == pytest.approx(0.56, abs=0.01)  # the misreading
    # a decode step: the same weights per token
    step = decode_flops_at(MIXTRAL, sequences=1, steps=1, context=0, head=Head.LM)
    assert step == pytest.approx(per_token - 2 * MIXTRAL.layers * MIXTRAL.q_width)


def test_memory_counts_every_expert():
    """Weights and optimizer state hold all 128 experts: Qwen3-30B-A3B's shard on one device is
    its 30.5B parameters (norms aside), nine times what the dense reading held."""
    shard = weight_shard_params(QWEN3_MOE, 1, 1)
    assert shard == pytest.approx(QWEN3_MOE.params, rel=1e-3)
    assert shard / weight_shard_params(_dense_reading(QWEN3_MOE), 1, 1) > 9
    lay = Layout(Strategy((1, 1, 8), 8, 1, 1, 1))
    assert training_state_bytes(QWEN3_MOE, lay) == pytest.approx(12 * shard / 8)
    # activations: the token's k expert widths and its k dispatched copies
    k, d, de = QWEN3_MOE.experts_active, QWEN3_MOE.hidden, QWEN3_MOE.expert_ffn
    a = stored_activation_width(QWEN3_MOE, 1)
    assert a == pytest.approx(4 * d + k * d + 2 * QWEN3_MOE.q_width + 2 * QWEN3_MOE.kv_width + 4 * k * de)


def test_a_decode_step_reads_the_experts_its_tokens_touch():
    """Ω_W: one sequence's decode step reads its 8 experts; 8 sequences about 52 of 128; a
    prefill microbatch all of them."""
    m = QWEN3_MOE
    expert = m.expert_params
    fixed = m.attention_params + m.hidden * m.experts
    assert m.layer_weights_read(1) == pytest.approx(fixed + 8 * expert)
    assert (m.layer_weights_read(8) - fixed) / expert == pytest.approx(51.6, abs=0.1)
    assert m.layer_weights_read(4096) == pytest.approx(m.layer_weights)


def test_expert_gemms_run_at_their_own_efficiency():
    """With few rows per expert (b·ℓ·k/E) the expert GEMMs are less efficient than the dense ones:
    the MoE model's compute-bound F_eff is below the dense reading's, by the harmonic blend of the
    two efficiencies over the experts' share φ·ψ of the work; a dense model is unchanged (φ = 0).
    The shape rule alone: the expert-layer efficiency ε_e at 1 (its own test below)."""
    hw = dataclasses.replace(hardware_preset("h100"), expert_efficiency=1.0)
    lay = Layout(Strategy((1, 1, 1), 1, 1, 1, 1))
    moe, dense = _Roofline(QWEN3_MOE, lay, hw, 1.0), _Roofline(_dense_reading(QWEN3_MOE), lay, hw, 1.0)
    work, tokens = 1e18, 512.0  # huge work per byte: compute-bound
    rows = tokens
    eta = rows / (rows + hw.gamma_m) * dense.eta_k
    r_e = rows * 8 / 128  # 512 tokens touch every expert: (1 − 8/128)^512 < 1e-14
    eta_e = r_e / (r_e + hw.gamma_m) * moe.eta_e
    phi = QWEN3_MOE.expert_flop_share
    for psi in (1.0, 0.6):  # all the work in the blocks' GEMMs; 40 % attention core and head
        blend = hw.peak_flops / ((1 - phi * psi) / eta + phi * psi / eta_e)
        assert moe.flops(work, tokens, 0.0, psi) == pytest.approx(blend, rel=1e-12)
    assert moe.flops(work, tokens, 0.0, 0.6) > moe.flops(work, tokens, 0.0, 1.0)
    assert moe.flops(work, tokens, 0.0, 1.0) < dense.flops(work, tokens, 0.0, 1.0)
    assert dense.flops(work, tokens, 0.0, 1.0) == pytest.approx(hw.peak_flops * eta)


def test_the_expert_layer_efficiency_scales_a_training_passs_expert_gemms_only():
    """ε_e (Hardware.expert_efficiency, docs/cost-model.md §9) is the expert GEMMs' compute end in a
    training or teacher-forced pass, its row knee moving with it: η_e = ε_e·r_e/(r_e + ε_e·γM)·η_k,e.
    A dense model, and a generation engine's experts (served), do not see it."""
    eps = 0.4
    base = dataclasses.replace(hardware_preset("h100"), expert_efficiency=1.0)
    hw = dataclasses.replace(base, expert_efficiency=eps)
    lay = Layout(Strategy((1, 1, 1), 1, 1, 1, 1))
    work, tokens, psi = 1e18, 512.0, 0.6  # compute-bound
    moe = _Roofline(QWEN3_MOE, lay, hw, 1.0)
    dense = _Roofline(_dense_reading(QWEN3_MOE), lay, hw, 1.0)
    eta = tokens / (tokens + hw.gamma_m) * dense.eta_k
    r_e = tokens * 8 / 128
    eta_e = eps * r_e / (r_e + eps * hw.gamma_m) * moe.eta_e
    phi = QWEN3_MOE.expert_flop_share
    blend = hw.peak_flops / ((1 - phi * psi) / eta + phi * psi / eta_e)
    assert moe.flops(work, tokens, 0.0, psi) == pytest.approx(blend, rel=1e-12)
    assert moe.flops(work, tokens, 0.0, psi) < _Roofline(QWEN3_MOE, lay, base, 1.0).flops(
        work, tokens, 0.0, psi
    )
    assert dense.flops(work, tokens, 0.0, psi) == _Roofline(_dense_reading(QWEN3_MOE), lay, base, 1.0).flops(
        work, tokens, 0.0, psi
    )
    served = _Roofline(QWEN3_MOE, lay, hw, 1.0, served=True)
    assert served.flops(work, tokens, 0.0, psi) == _Roofline(QWEN3_MOE, lay, base, 1.0, served=True).flops(
        work, tokens, 0.0, psi
    )


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5, float("nan")])
def test_an_expert_efficiency_outside_zero_one_is_refused(bad):
    """ε_e ∈ (0, 1]: the constructor and the hardware file's schema refuse another value, naming it."""
    with pytest.raises(ValueError, match="expert_efficiency"):
        dataclasses.replace(hardware_preset("h100"), expert_efficiency=bad)
    doc = hardware_preset("h100").to_dict()
    doc["expert_efficiency"] = bad
    with pytest.raises(InputError, match="expert_efficiency"):
        Hardware.from_dict(doc, source="hw.json")


def test_the_gpu_presets_carry_the_expert_efficiency_and_a_file_round_trips_it():
    """Every GPU preset carries ε_e with its source; the CPU preset none (1, and its file says
    nothing); to_dict/from_dict keep it."""
    from rpeg.costmodel.hardware import HARDWARE_PRESETS

    for name in HARDWARE_PRESETS:
        hw = hardware_preset(name)
        if name == "cpu":
            assert hw.expert_efficiency == 1.0 and "expert_efficiency" not in hw.to_dict()
            continue
        assert 0.0 < hw.expert_efficiency < 1.0, name
        assert "FITTED" in dict(hw.sources)["expert_efficiency"], name
        assert Hardware.from_dict(hw.to_dict()).expert_efficiency == hw.expert_efficiency


def test_an_expert_gemm_gets_the_rows_of_the_experts_a_step_touches():
    """A decode step of b sequences reaches E_t = E·(1 − (1 − k/E)^b) experts; each runs a GEMM of
    b·k/E_t rows (one row per touched expert for b = 1), not b·k/E: an untouched expert runs
    nothing. Expert parallelism: the rank's E/Pe experts receive the b·Pe tokens' b·k
    assignments."""
    hw = dataclasses.replace(hardware_preset("h100"), expert_efficiency=1.0)  # the shape rule alone
    work = 1e18  # compute-bound
    for ep, b in [(1, 1.0), (1, 7.0), (4, 3.0)]:
        lay = Layout(Strategy((1, 1, 1), 4 if ep > 1 else 1, 1, 1, 1, ep=ep))
        roof = _Roofline(QWEN3_MOE, lay, hw, b)
        touched = 128 / ep * (1 - (1 - 8 / 128) ** (b * ep))
        assert QWEN3_MOE.experts_touched(b, ep) == pytest.approx(touched)
        r_e = b * 8 / touched
        eta = b / (b + hw.gamma_m) * roof.eta_k
        eta_e = r_e / (r_e + hw.gamma_m) * roof.eta_e
        phi = QWEN3_MOE.expert_flop_share
        lam = 1.2 if ep > 1 else 1.0
        expect = hw.peak_flops / ((1 - phi) / eta + lam * phi / eta_e)
        assert roof.flops(work, 1.0, 0.0, 1.0) == pytest.approx(expect, rel=1e-12)
    assert QWEN3_MOE.experts_touched(1.0) == pytest.approx(8.0)  # one token: its k experts
    assert _dense_reading(QWEN3_MOE).experts_touched(100.0) == 0.0


def test_a_moe_grpo_job_plans_with_its_true_memory():
    """GRPO of Qwen3-30B-A3B on 8 H100: the plan holds the optimizer state of 30.5B parameters
    (at least ``12·N/8`` bytes on the busiest device, whatever sharding greedy picks), where the
    dense reading held 3.3B; with the same active FLOPs it is predicted slower than that reading,
    because its passes move every expert's weights."""
    wl = Workload("grpo", {"actor": QWEN3_MOE}, 64, 8, 512, 2048, reward="rule", kl_coef=0.0)
    cluster = Cluster.from_shape("1x1x8", hardware_preset("h100"))
    result = solve(wl, cluster, "greedy", seed=0)
    assert result.plan is not None and result.feasible
    assert max(result.evaluation.memory.peak) >= 12 * QWEN3_MOE.params / 8
    doc = result.to_dict()["models"]["actor"]
    assert (doc["params"], doc["active_params"]) == (QWEN3_MOE.params, QWEN3_MOE.active_params)
    dense = solve(
        dataclasses.replace(wl, models={"actor": _dense_reading(QWEN3_MOE)}), cluster, "greedy", seed=0
    )
    assert result.evaluation.makespan > dense.evaluation.makespan


def test_latent_attention_caches_its_latent_on_every_tp_rank():
    """DeepSeek-V3 caches 576 scalars per token and block on every TP rank (the latent is not
    split over heads), against 2·⌈kv_heads/Pt⌉·head_dim for standard attention; the KV bytes of a
    generation replica follow."""
    ds = model_preset("deepseek-v3")
    assert [kv_scalars_per_device(ds, tp) for tp in (1, 8)] == [576.0, 576.0]
    llama = model_preset("llama3.1-8b")
    assert [kv_scalars_per_device(llama, tp) for tp in (1, 8, 16)] == [2048.0, 256.0, 256.0]
    lay = Layout(Strategy((1, 1, 8), 1, 1, 8, 1))
    assert kv_bytes_per_token(ds, lay) == pytest.approx(ds.dtype_bytes * 61 * 576)

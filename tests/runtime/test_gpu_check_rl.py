"""The parts of ``benchmarks/gpu_check.py``'s decode sweep and GRPO-like Megatron stage that run
on CPU: the rollout engine, the rule reward, GRPO's advantages and clipped loss, the decode
predictions, and the report's words for stage 5. The stage itself needs CUDA (Megatron-core)
and has never run."""

from __future__ import annotations

import math

import pytest

from tests.conftest import load_benchmark

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gc():
    return load_benchmark("gpu_check")


def test_rollout_samples_group_responses_after_each_prompt(gc):
    from rpeg.runtime.engines.hf_models import family_modules, hf_config

    spec = gc._tiny_spec()
    torch.manual_seed(0)
    model = family_modules(spec.family).ForCausalLM(hf_config(spec, max_positions=64)).eval()
    prompts = torch.randint(0, spec.vocab, (2, 5), generator=torch.Generator().manual_seed(1))
    seqs = gc.rollout(torch, model, prompts, 3, 4, torch.Generator().manual_seed(2))
    assert seqs.shape == (6, 9)
    assert torch.equal(seqs[:3, :5], prompts[0].expand(3, 5)) and torch.equal(
        seqs[3:, :5], prompts[1].expand(3, 5)
    )
    assert int(seqs.max()) < spec.vocab
    # sampled, not greedy: a group's responses are not all alike
    assert len({tuple(r.tolist()) for r in seqs[:3, 5:]}) > 1


def test_reward_and_advantages(gc):
    resp = torch.tensor([[0, 1, 900, 901], [0, 1, 2, 3], [800, 801, 802, 803], [5, 900, 6, 7]])
    r = gc.rule_reward(torch, resp, 1024)
    assert r.tolist() == [0.5, 1.0, 0.0, 0.75]
    a = gc.grpo_advantages(torch, r, 2)
    assert a.view(2, 2).sum(dim=1).abs().max() < 1e-6  # zero mean per group
    assert a[1] > 0 > a[0] and a[3] > 0 > a[2]
    # a group whose samples score alike learns nothing from them
    assert gc.grpo_advantages(torch, torch.tensor([0.3, 0.3]), 2).abs().max() == 0


def test_grpo_loss_is_the_clipped_surrogate_over_the_mask(gc):
    old = torch.zeros(2, 3)
    batch = {
        "old_logprobs": old,
        "advantages": torch.tensor([1.0, -2.0]),
        "loss_mask": torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]]),
    }
    # at ρ = 1: −Σ m·A/Σ m = −(1 + 1 − 2)/3
    lp = torch.zeros(2, 3, requires_grad=True)
    loss = gc.grpo_loss(torch, lp, batch)
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-7)
    loss.backward()
    assert lp.grad[0, 0] == 0 and lp.grad[1, 1] == 0  # masked tokens get no gradient
    assert float(lp.grad[0, 1]) == pytest.approx(-1 / 3) and float(lp.grad[1, 2]) == pytest.approx(2 / 3)
    # ρ = e for A > 0 clips at 1.2 and passes no gradient; for A < 0 the unclipped ρ·A is the min
    lp = torch.ones(2, 3, requires_grad=True)
    loss = gc.grpo_loss(torch, lp, batch)
    assert float(loss.detach()) == pytest.approx(-(1.2 + 1.2 - 2 * math.e) / 3, rel=1e-6)
    loss.backward()
    assert lp.grad[0, 1] == 0 and lp.grad[1, 2] != 0


def test_decode_predictions_add_up(gc):
    from rpeg.costmodel import hardware_preset
    from rpeg.costmodel.layout import Layout
    from rpeg.costmodel.time import op_time
    from rpeg.ir.models import model_preset
    from rpeg.ir.plan import Strategy
    from rpeg.ir.types import Role

    spec, hw = model_preset(gc.GPU_MODEL), hardware_preset("h200")
    steps, w = gc.DECODE_STEPS_GPU, gc.DECODE_WARMUP
    preds = [
        gc.predict_decode({"b": b, "c": c, "steps": steps, "warmup": w}, spec, hw)
        for b, c in gc.DECODE_ROWS_GPU
    ]
    by = {bc: p for bc, p in zip(gc.DECODE_ROWS_GPU, preds)}
    # a larger batch at the same context decodes more tokens per second; a longer context fewer
    assert by[(32, 2048)]["tokens_per_s"] > by[(8, 2048)]["tokens_per_s"]
    assert by[(1, 8192)]["tokens_per_s"] < by[(1, 512)]["tokens_per_s"]
    # generation_times of responses of exactly `steps` tokens is the prefill plus `steps` decode
    # steps (half a step less: the last bucket's drain), as op_time prices the whole response
    layout = Layout(Strategy((1, 1, 1), dp=1, pp=1, tp=1, mb=1), gpus_per_node=1)
    for (b, c), p in by.items():
        whole = op_time(
            spec, Role.GENERATION, layout, hw, sequences=b, prompt_len=c, response_len=steps
        ).total
        assert p["generation_s"] == pytest.approx(whole, rel=0.02)
        assert p["prefill_s"] + p["decode_s"] < p["generation_s"]


def test_rl_outcome_is_reported_in_words(gc):
    it = {
        "reward": 0.5,
        "gap_engine_vs_trainer": 1e-6,
        "gap_after_push": 2e-6,
        "moved": 0.1,
        "generate_s": 1.0,
        "old_logprob_s": 0.5,
        "train_s": 0.25,
        "push_s": 0.125,
        "losses": [0.1, 0.2],
    }
    rl = {
        "prompts": 4,
        "group": 4,
        "prompt_len": 16,
        "response_len": 16,
        "iterations": [it, {**it, "reward": 0.6}],
    }
    line = gc.rl_lines(rl)[0]
    assert "0.500, 0.600" in line and "after a push 2.00e-06" in line and "generate 2.00" in line
    assert "failed: RuntimeError: x" in gc.rl_lines({"error": "RuntimeError: x"})[0]
    assert "not run" in gc.rl_lines(None)[0]

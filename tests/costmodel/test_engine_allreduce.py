"""The generation engine's own all-reduce on a GPU (issue 31): vLLM's one-kernel custom
all-reduce prices a tensor-parallel AllReduce up to its buffer, NCCL's ring the rest, and the
preset figures are the fit of the published kernel timings they cite (docs/cost-model.md §8,
"The engine's all-reduce")."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from rpeg import hardware_preset, model_preset
from rpeg.costmodel.collectives import allreduce_time, one_kernel_allreduce_time
from rpeg.costmodel.hardware import HARDWARE_PRESETS
from rpeg.costmodel.layout import Layout
from rpeg.costmodel.time import _decode_terms, _Node, generation_times
from rpeg.ir import Strategy
from rpeg.ir.errors import InputError
from rpeg.ir.hardware import ENGINE_ALLREDUCE_RANKS, EngineStep, EngineTerms, Hardware, Link
from rpeg.ir.types import Head
from rpeg.ir.workload import LengthBucket

MiB = 1024 * 1024
MODEL = model_preset("qwen2.5-7b")
H100 = hardware_preset("h100")

#: The "vllm" column of sgl-project/sglang PR #2904 (H100, without CUDA graphs): microseconds
#: per AllReduce of float32 tensors of ``size`` elements at TP 2, 4 and 8.
H100_POINTS = {
    512: (9.5, 9.1, 10.1),
    4096: (8.8, 8.5, 9.3),
    32768: (8.7, 9.2, 11.8),
    262144: (12.9, 20.6, 24.1),
    524288: (17.7, 26.9, 30.4),
    1048576: (26.6, 40.2, 45.0),
}
#: The "vllm time" column of sgl-project/sglang PR #2688 (A100): ``(ranks, size, µs)``.
A100_POINTS = [
    *(
        (2, s, t)
        for s, t in zip(
            (512, 4096, 32768, 262144, 524288, 1048576, 2097152), (13.0, 11.3, 12.1, 17.6, 22.3, 32.5, 55.3)
        )
    ),
    *(
        (4, s, t)
        for s, t in zip((512, 4096, 32768, 262144, 524288, 1048576), (13.5, 12.1, 13.5, 23.9, 31.3, 47.1))
    ),
    (8, 512, 14.0),
    (8, 4096, 14.2),
]


def _fit(points: list[tuple[int, int, float]]) -> tuple[float, float]:
    """Least squares of ``t = α + 2·((p−1)/p)·M·β`` over ``(p, elements, µs)``, ``M = 4·elements``."""
    x = np.array([[1.0, 2.0 * (p - 1) / p * 4 * size] for p, size, _ in points])
    y = np.array([t * 1e-6 for _, _, t in points])
    alpha, beta = np.linalg.lstsq(x, y, rcond=None)[0]
    return float(alpha), float(beta)


def _h100_points() -> list[tuple[int, int, float]]:
    return [(p, size, t) for size, ts in H100_POINTS.items() for p, t in zip((2, 4, 8), ts)]


def test_the_presets_figures_are_the_fit_of_the_published_timings_they_cite() -> None:
    expected = {"hopper": _fit(_h100_points()), "ampere": _fit(A100_POINTS)}
    generation = {
        "h100": "hopper",
        "h200": "hopper",
        "h20": "hopper",
        "a100-80gb": "ampere",
        "a100-40gb": "ampere",
    }
    for name in HARDWARE_PRESETS:
        hw = hardware_preset(name)
        step = hw.rollout_step
        if name not in generation:  # no published table for the kernel on it: NCCL's ring
            assert step is None or (step.allreduce is None and step.allreduce_max_bytes == 0), name
            continue
        alpha, beta = expected[generation[name]]
        assert step.allreduce.alpha == pytest.approx(alpha, rel=1e-3), name
        assert step.allreduce.beta == pytest.approx(beta, rel=1e-3), name
        assert step.allreduce_max_bytes == 8 * MiB, name  # vLLM's custom all-reduce buffer
        source = dict(hw.sources)["rollout_step.allreduce"]
        pr = "pull/2904" if generation[name] == "hopper" else "pull/2688"
        assert f"https://github.com/sgl-project/sglang/{pr}" in source and "float32" in source, name
    # the fit reproduces its table to the stated mean error (9.9 % on the H100 points)
    alpha, beta = expected["hopper"]
    link = Link(alpha, beta)
    errors = [
        abs(one_kernel_allreduce_time(p, 4 * size, link) * 1e6 - t) / t for p, size, t in _h100_points()
    ]
    assert np.mean(errors) == pytest.approx(0.099, abs=0.002)


def test_one_kernel_is_one_start_up_and_the_rings_bytes() -> None:
    link = Link(1e-5, 5e-12)
    assert one_kernel_allreduce_time(1, 1e6, link) == 0.0
    assert one_kernel_allreduce_time(8, 1e6, link) == pytest.approx(1e-5 + 2 * 7 / 8 * 1e6 * 5e-12)
    # the ring pays its start-up at each of its 2(p−1) steps
    assert allreduce_time(8, 0.0, link) == pytest.approx(14 * one_kernel_allreduce_time(8, 0.0, link))
    with pytest.raises(ValueError, match="positive integer"):
        one_kernel_allreduce_time(0, 1.0, link)


def _node(hw: Hardware, tp: int, sequences: float = 64) -> _Node:
    return _Node(MODEL, Layout(Strategy((1, 1, tp), 1, 1, tp, 1), 8), hw, sequences)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_an_allreduce_within_the_buffer_runs_on_the_kernel_and_a_larger_one_on_the_ring(tp: int) -> None:
    node = _node(H100, tp)
    kernel, ring = H100.rollout_step.allreduce, H100.collective[0]
    for nbytes in (4096.0, 1.0 * MiB, 8.0 * MiB - 16):
        assert node.engine_tp_rounds(10, nbytes) == pytest.approx(
            10 * one_kernel_allreduce_time(tp, nbytes, kernel)
        )
    # a decode step's buffer (a few hundred sequences' hidden states): one start-up, not 2(p−1)
    if tp >= 4:
        assert node.engine_tp_rounds(10, 256 * 4096 * 2) < 0.5 * node.tp_rounds(10, 256 * 4096 * 2)
    big = 8.0 * MiB  # vLLM: inp_size < max_size, so a full buffer goes to NCCL
    assert node.engine_tp_rounds(10, big) == pytest.approx(10 * allreduce_time(tp, big, ring))


def test_other_rank_counts_measured_links_and_hardware_without_the_kernel_keep_the_ring() -> None:
    step = H100.rollout_step
    assert ENGINE_ALLREDUCE_RANKS == (2, 4, 6, 8)
    assert step.allreduce_link(3, 1024) is None and step.allreduce_link(16, 1024) is None
    assert step.allreduce_link(6, 1024) == step.allreduce
    # a calibrated engine's measured tensor-parallel link wins (the ring formula on it)
    measured = Link(2e-5, 1e-11)
    calibrated = dataclasses.replace(
        H100, engines=(EngineTerms("vllm", tensor_parallel=measured),), engine_for=("vllm", "", "")
    )
    node = _node(calibrated, 4)
    assert node.engine_tp_rounds(3, 1e5) == pytest.approx(3 * allreduce_time(4, 1e5, measured))
    # B200 has no published table for the kernel: the tier-0 ring, as before
    b200 = hardware_preset("b200")
    node = _node(b200, 4)
    assert b200.rollout_step.allreduce is None
    assert node.engine_tp_rounds(3, 1e5) == pytest.approx(3 * allreduce_time(4, 1e5, b200.collective[0]))


def test_a_tp_decode_pays_the_kernel_per_layer_and_decoded_token() -> None:
    node = _node(H100, 4, sequences=256)
    steps = 10
    _, t_tp, _, _ = _decode_terms(node, 1024.0, steps, steps, Head.LM)
    nbytes = 256 * MODEL.hidden * MODEL.dtype_bytes
    assert t_tp == pytest.approx(
        2 * MODEL.layers * steps * one_kernel_allreduce_time(4, nbytes, H100.rollout_step.allreduce)
    )
    # the whole generation: the kernel cuts the TP time, nothing else moves
    ring = dataclasses.replace(
        H100, rollout_step=dataclasses.replace(H100.rollout_step, allreduce=None, allreduce_max_bytes=0)
    )
    layout = Layout(Strategy((1, 1, 4), 1, 1, 4, 1), 8)
    buckets = (LengthBucket(0.0, 0, 127), LengthBucket(1.0, 127, 128))
    # the synchronous loop: asynchronous scheduling (the preset's) exposes more of a shorter
    # step's host seconds, so there the overhead moves too
    fast_hw, slow_hw = H100.with_rollout_scheduling(False), ring.with_rollout_scheduling(False)
    (fast,) = generation_times(MODEL, layout, fast_hw, sequences=256, prompt_len=512, buckets=buckets)
    (slow,) = generation_times(MODEL, layout, slow_hw, sequences=256, prompt_len=512, buckets=buckets)
    assert fast.tp_comm < slow.tp_comm  # the prefill's 8192-token chunks stay on the ring
    assert fast.total - fast.tp_comm == pytest.approx(slow.total - slow.tp_comm, rel=1e-12)


def test_a_hardware_file_round_trips_the_kernel_and_names_a_bad_figure(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    H100.save(path)
    assert Hardware.load(path).rollout_step == H100.rollout_step
    doc = json.loads(path.read_text())
    doc["rollout_step"]["allreduce"]["alpha"] = -1.0
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"gpu\.json.*rollout_step\.allreduce\.alpha"):
        Hardware.load(path)
    doc["rollout_step"]["allreduce"]["alpha"] = 1e-5
    doc["rollout_step"]["allreduce_max_bytes"] = 0
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"gpu\.json.*allreduce_max_bytes"):
        Hardware.load(path)
    # a file without the kernel writes neither key (as before the kernel was modelled)
    b200 = hardware_preset("b200").to_dict()["rollout_step"]
    assert "allreduce" not in b200 and "allreduce_max_bytes" not in b200
    with pytest.raises(ValueError, match="allreduce_max_bytes"):
        EngineStep(allreduce_max_bytes=-1)
    with pytest.raises(ValueError, match="go together"):
        EngineStep(allreduce=Link(1e-5, 5e-12))

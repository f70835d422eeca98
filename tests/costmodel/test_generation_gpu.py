"""The rollout engine's step on a GPU (issue 31): fixed seconds per step with and without CUDA
graphs, the token budget's prefill chunks, the prefill chunks riding in the capped stretch's
decode steps, and neutrality where the hardware names no step (docs/cost-model.md §8, "The
engine step")."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from rpeg import hardware_preset, model_preset
from rpeg.costmodel.flops import attention_core_flops, decode_attention_flops, decode_flops_at, prefill_flops
from rpeg.costmodel.hardware import HARDWARE_PRESETS
from rpeg.costmodel.layout import Layout
from rpeg.costmodel.memory import kv_budget_tokens, kv_scalars_per_device
from rpeg.costmodel.precision import block_gemm_flops
from rpeg.costmodel.time import (
    _decode_terms,
    _Node,
    _prefill_chunks,
    _prefill_terms,
    _Roofline,
    decode_schedule,
    generation_times,
    op_time,
)
from rpeg.ir import Strategy
from rpeg.ir.errors import InputError
from rpeg.ir.hardware import EngineStep, Hardware
from rpeg.ir.types import Head, Role
from rpeg.ir.workload import LengthBucket
from tests.conftest import load_benchmark

MODEL = model_preset("qwen2.5-7b")
#: the H100 preset with the synchronous engine loop: these tests pin ``c_step``'s arithmetic,
#: which asynchronous scheduling (the presets' default) hides behind the GPU
#: (tests/costmodel/test_async_scheduling.py)
H100 = hardware_preset("h100").with_rollout_scheduling(False)
LAYOUT = Layout(Strategy((1, 1, 1), 1, 1, 1, 1), 8)
#: one response length of 64 tokens (a point mass)
BUCKETS = (LengthBucket(0.0, 0, 63), LengthBucket(1.0, 63, 64))


def _with_step(hw: Hardware, **figures: object) -> Hardware:
    return dataclasses.replace(hw, rollout_step=dataclasses.replace(hw.rollout_step, **figures))


def _total(hw: Hardware, *, sequences: float, prompt_len: int, layout: Layout = LAYOUT) -> float:
    (bd,) = generation_times(MODEL, layout, hw, sequences=sequences, prompt_len=prompt_len, buckets=BUCKETS)
    return bd.total


def _uncapped(hw: Hardware, sequences: float, prompt_len: int) -> None:
    """The cases below must not hit the KV cap (one stretch per bucket, no capped stretch)."""
    kv = kv_budget_tokens(MODEL, LAYOUT, hw)
    segs = decode_schedule(
        sequences=sequences, dp=1, prompt_len=prompt_len, buckets=BUCKETS, kv_tokens=kv, model=MODEL
    )
    assert len(segs) == len(BUCKETS)


def test_every_gpu_preset_names_a_cited_engine_step_and_the_cpu_preset_none() -> None:
    for name in HARDWARE_PRESETS:
        hw = hardware_preset(name)
        if name == "cpu":
            assert hw.rollout_step is None
            continue
        step = hw.rollout_step
        assert step is not None, name
        assert (step.token_budget, step.max_seqs, step.cuda_graphs, step.async_scheduling) == (
            8192,
            1024,
            True,
            True,
        )
        assert step.step_s == pytest.approx(5.5e-3)
        assert step.eager_layer_s == pytest.approx((1 / 30 - 1 / 69) / 32, rel=1e-3)
        sources = dict(hw.sources)
        for key in ("token_budget", "max_seqs", "step_s", "eager_layer_s", "async_scheduling"):
            assert "http" in sources[f"rollout_step.{key}"] or "verl" in sources[f"rollout_step.{key}"], key


def test_a_decode_step_pays_c_step_once_per_step() -> None:
    n, lp = 64, 256  # 16k prompt tokens: 2 prefill chunks of 8192; 64 decode steps
    _uncapped(H100, n, lp)
    base = _total(_with_step(H100, step_s=0.0), sequences=n, prompt_len=lp)
    c = 0.01
    got = _total(_with_step(H100, step_s=c), sequences=n, prompt_len=lp)
    steps = 64 + math.ceil(n * lp / 8192)
    assert got - base == pytest.approx(steps * c, rel=1e-9)


def test_the_step_cost_counts_per_pipeline_slot() -> None:
    lay = Layout(Strategy((1, 1, 2), 1, 2, 1, 3), 8)  # Pp = 2, mb = 3: 4 slots per step
    n, lp = 48, 128
    kw = {"sequences": n, "prompt_len": lp, "layout": lay}
    base = _total(_with_step(H100, step_s=0.0), **kw)
    got = _total(_with_step(H100, step_s=0.01), **kw)
    chunks = math.ceil((n / 3) * lp / 8192)
    assert got - base == pytest.approx((3 + 2 - 1) * (64 + chunks) * 0.01, rel=1e-9)


def test_without_cuda_graphs_a_decode_step_pays_the_launches_of_its_layers() -> None:
    n, lp = 64, 256
    graphs = _total(H100, sequences=n, prompt_len=lp)
    eager = _total(_with_step(H100, cuda_graphs=False), sequences=n, prompt_len=lp)
    # decode-only steps pay L·c_launch; the prefill chunks hide their launches behind their GEMMs
    assert eager - graphs == pytest.approx(64 * MODEL.layers * H100.rollout_step.eager_layer_s, rel=1e-9)
    assert eager > graphs


def test_a_long_prompt_takes_ceil_lp_over_budget_prefill_steps() -> None:
    for n, lp, budget in [(1, 20000, 8192), (3, 1000, 2048), (1, 8192, 8192), (2, 100, 8192)]:
        hw = _with_step(H100, token_budget=budget)
        node = _Node(MODEL, LAYOUT, hw, n)
        assert _prefill_chunks(node, lp) == math.ceil(n * lp / budget)
        # the chunks' c_step, and nothing else, is what the step seconds add to the prefill
        kw = {"sequences": n, "prompt_len": lp, "response_len": 1, "decode": (0, 0)}
        with_c = op_time(MODEL, Role.GENERATION, LAYOUT, _with_step(hw, step_s=0.02), **kw)
        without = op_time(MODEL, Role.GENERATION, LAYOUT, _with_step(hw, step_s=0.0), **kw)
        assert with_c.overhead - without.overhead == pytest.approx(math.ceil(n * lp / budget) * 0.02)


def test_chunking_reads_the_weights_once_per_chunk() -> None:
    """A prefill split into more chunks reads the weights more often: with a small budget on a
    memory-bound prompt the GEMM time grows; a budget above the prompt changes nothing."""
    kw = {"sequences": 1, "prompt_len": 64, "response_len": 1, "decode": (0, 0)}
    whole = op_time(MODEL, Role.GENERATION, LAYOUT, _with_step(H100, token_budget=8192), **kw)
    exact = op_time(MODEL, Role.GENERATION, LAYOUT, _with_step(H100, token_budget=64), **kw)
    assert whole.gemm == pytest.approx(exact.gemm)  # one chunk either way
    split = op_time(MODEL, Role.GENERATION, LAYOUT, _with_step(H100, token_budget=8), **kw)
    assert split.gemm > 4 * whole.gemm


def test_the_capped_stretch_carries_the_admitted_prompts_chunks_in_its_steps() -> None:
    lay = Layout(Strategy((1, 1, 1), 1, 1, 1, 1, mem_fraction=0.3), 8)
    n, lp = 400, 2048
    hw = _with_step(H100, step_s=0.0)
    kv = kv_budget_tokens(MODEL, lay, hw)
    segs = decode_schedule(sequences=n, dp=1, prompt_len=lp, buckets=BUCKETS, kv_tokens=kv, model=MODEL)
    capped = segs[0]
    assert len(segs) == len(BUCKETS) + 1 and capped.steps > 0
    chunks = math.ceil(n * lp / 8192)
    shared = min(capped.steps, chunks * capped.done)
    assert 0 < shared < chunks
    base = _total(hw, sequences=n, prompt_len=lp, layout=lay)
    got = _total(_with_step(H100, step_s=0.01), sequences=n, prompt_len=lp, layout=lay)
    steps = chunks + sum(s.steps for s in segs) - shared
    assert got - base == pytest.approx(steps * 0.01, rel=1e-9)


def test_the_sequence_cap_bounds_the_running_batch() -> None:
    n, lp = 600, 16
    few = _with_step(H100, max_seqs=100)
    kv = kv_budget_tokens(MODEL, LAYOUT, few)
    segs = decode_schedule(
        sequences=n, dp=1, prompt_len=lp, buckets=BUCKETS, kv_tokens=kv, model=MODEL, max_seqs=100
    )
    assert segs[0].running == pytest.approx(100)
    assert _total(few, sequences=n, prompt_len=lp) > _total(H100, sequences=n, prompt_len=lp)


def test_hardware_without_a_step_is_unchanged() -> None:
    """No EngineStep (the CPU preset, calibrated files): the prefill is one step, the per-step
    costs are the calibrated engine terms alone, S is ROLLOUT_MAX_SEQS, and a decode stretch is
    one roofline over its weight GEMMs, attention core and KV reads (SPEC §6), as calibrated."""
    bare = dataclasses.replace(H100, rollout_step=None)
    for n, context, steps in [(1, 32768, 3), (64, 2048, 5), (700, 300, 2)]:
        node = _Node(MODEL, LAYOUT, bare, n)
        w = decode_flops_at(MODEL, sequences=n, steps=steps, context=context)
        kv = n * context * kv_scalars_per_device(MODEL, 1) * MODEL.dtype_bytes * MODEL.layers
        one_roofline = node.gemm(w, w / steps, 1, kv, block_gemm_flops(MODEL, n * steps))
        assert _decode_terms(node, context, steps, steps, Head.LM)[0] == pytest.approx(
            one_roofline, rel=1e-12
        )
    cpu = hardware_preset("cpu")
    assert cpu.rollout_step is None
    node = _Node(MODEL, LAYOUT, cpu, 1000)
    assert _prefill_chunks(node, 4096) == 1
    calibrated = Path(__file__).resolve().parents[2] / "benchmarks" / "hw-this-machine.json"
    assert Hardware.load(calibrated).rollout_step is None


def test_a_hardware_file_round_trips_its_step_and_names_a_bad_field(tmp_path: Path) -> None:
    hw = _with_step(H100, cuda_graphs=False, token_budget=2048)
    path = tmp_path / "gpu.json"
    hw.save(path)
    assert Hardware.load(path).rollout_step == hw.rollout_step
    doc = json.loads(path.read_text())
    doc["rollout_step"]["step_s"] = "5ms"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"gpu\.json.*rollout_step\.step_s"):
        Hardware.load(path)
    doc["rollout_step"]["step_s"] = 0.005
    doc["rollout_step"]["token_budget"] = 0
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"rollout_step\.token_budget.*0"):
        Hardware.load(path)
    with pytest.raises(ValueError, match="token_budget"):
        EngineStep(token_budget=0)
    with pytest.raises(ValueError, match="cuda_graphs"):
        EngineStep(cuda_graphs="no")  # type: ignore[arg-type]


def _fidelity_script():
    return load_benchmark("gpu_fidelity")


def test_the_benchmark_prices_each_row_with_vllm_serves_budget_and_lists_the_front_end_case_apart() -> None:
    fid = _fidelity_script()
    rows = [r for r in fid.load_vllm_rows() if fid.vllm_why_not(r) is None]
    a100 = next(r for r in rows if r["gpu"] == "A100")
    h100 = next(r for r in rows if r["gpu"] == "H100")
    step = fid.vllm_engine_step(a100, hardware_preset("a100-80gb"))
    assert (step.token_budget, step.max_seqs, step.cuda_graphs) == (2048, 256, True)
    step = fid.vllm_engine_step(h100, hardware_preset("h100"))
    assert (step.token_budget, step.max_seqs) == (8192, 1024)
    flagged = dict(
        h100, serve_command=h100["serve_command"] + " --max-num-batched-tokens 512 --enforce-eager"
    )
    step = fid.vllm_engine_step(flagged, hardware_preset("h100"))
    assert (step.token_budget, step.cuda_graphs) == (512, False)
    apart = [r for r in rows if fid.vllm_front_end_bound(r)]
    assert apart and all((r["input_len"], r["output_len"]) == (128, 4) for r in apart)
    assert all(not fid.vllm_front_end_bound(r) for r in rows if r["dataset"] == "sharegpt")


def test_a_gpu_decode_prices_its_attention_core_as_a_kernel_of_its_own() -> None:
    """On a GPU engine a decode stretch is its weight GEMMs at the running batch's η, then the
    attention kernel: its FLOPs at F_peak capped by its KV reads over BW_mem, no row efficiency.
    At 32k context a few sequences' core is bound by the KV reads: the step costs the weights'
    time plus the reads', not the core's FLOPs at the η of a 7-row GEMM."""
    for n, context, steps in [(7, 32768, 4), (256, 4096, 3), (1, 128, 2)]:
        node = _Node(MODEL, LAYOUT, H100, n)
        w = decode_flops_at(MODEL, sequences=n, steps=steps, context=context)
        core = decode_attention_flops(MODEL, sequences=n, steps=steps, context=context)
        kv = n * context * kv_scalars_per_device(MODEL, 1) * MODEL.dtype_bytes * MODEL.layers
        rest = w - core
        t_core = core / min(H100.peak_flops, core / steps / kv * H100.mem_bandwidth)
        expect = node.gemm(rest, rest / steps, 1, 0.0, block_gemm_flops(MODEL, n * steps)) + t_core
        assert _decode_terms(node, context, steps, steps, Head.LM)[0] == pytest.approx(expect, rel=1e-12)
        if context == 32768:
            assert t_core == pytest.approx(steps * kv / H100.mem_bandwidth, rel=1e-12)  # read-bound
            one = node.gemm(w, w / steps, 1, kv, block_gemm_flops(MODEL, n * steps))
            assert expect < one  # the single roofline charged the core's FLOPs at η(7 rows)


def test_a_gpu_prefill_runs_its_attention_core_at_the_kernel_rate() -> None:
    """The prompts' causal core (n·A(Lp)) runs at the preset's fused-attention forward rate (H100:
    cuDNN's, at the model's head width); the rest of the prefill at the roofline of its chunks;
    an unrated preset runs the core at F_peak. The engine's prefill efficiency ``η_p`` (Hopper's
    vLLM, fitted: docs/cost-model.md §8; 1 on B200) divides the roofline's part only: the kernel's
    rate is its own figure."""
    n, lp = 16, 4096
    for hw in (H100, hardware_preset("b200")):
        node = _Node(MODEL, LAYOUT, hw, n)
        chunks = _prefill_chunks(node, lp)
        assert chunks == 8
        w = prefill_flops(MODEL, sequences=n, prompt_len=lp)
        core = n * attention_core_flops(MODEL, lp)
        rest = w - core
        rates = hw.attention_rates(MODEL.attention_width / MODEL.heads) if hw.attention else None
        rate = rates[0] if rates else hw.peak_flops
        roof = _Roofline(MODEL, LAYOUT, hw, n / chunks)
        f = roof.flops(rest / chunks, lp, 0.0, block_gemm_flops(MODEL, n * lp) / rest)
        eta = hw.terms("prefill").efficiency
        assert _prefill_terms(node, lp, Head.LM)[0] == pytest.approx(rest / f / eta + core / rate, rel=1e-12)
    assert H100.attention and not hardware_preset("b200").attention
    assert (
        H100.terms("prefill").efficiency == 0.484
        and hardware_preset("b200").terms("prefill").efficiency == 1.0
    )


def test_a_model_with_attention_sinks_runs_its_attention_at_the_sink_kernel_efficiency() -> None:
    """gpt-oss (attention sinks) on A100: vLLM's Triton kernel runs the prompts' core at
    ``ε_s·F_peak`` (the preset's fitted ``sink_attention_efficiency``); the same shape without
    sinks, and gpt-oss on H100 (FlashAttention-3 has sinks), keep the kernel's usual rate. The
    weight GEMMs do not change. A long-context decode step stays bound by its KV reads."""
    oss = model_preset("gpt-oss-20b")
    plain = dataclasses.replace(oss, attention_sinks=False)
    a100 = hardware_preset("a100-80gb")
    eps = a100.rollout_step.sink_attention_efficiency
    assert oss.attention_sinks and 0.0 < eps < 1.0
    n, lp = 8, 8192
    core = n * attention_core_flops(oss, lp)
    t_sink = _prefill_terms(_Node(oss, LAYOUT, a100, n), lp, Head.LM)[0]
    t_plain = _prefill_terms(_Node(plain, LAYOUT, a100, n), lp, Head.LM)[0]
    assert t_sink - t_plain == pytest.approx(
        core / (eps * a100.peak_flops) - core / a100.peak_flops, rel=1e-9
    )
    h100 = hardware_preset("h100")
    assert h100.rollout_step.sink_attention_efficiency == 1.0
    assert _prefill_terms(_Node(oss, LAYOUT, h100, n), lp, Head.LM) == _prefill_terms(
        _Node(plain, LAYOUT, h100, n), lp, Head.LM
    )
    # decode at 32k context: the core reads its KV cache at BW_mem either way
    node, node_plain = _Node(oss, LAYOUT, a100, 64), _Node(plain, LAYOUT, a100, 64)
    assert _decode_terms(node, 32768, 100, 100, Head.LM) == pytest.approx(
        _decode_terms(node_plain, 32768, 100, 100, Head.LM), rel=1e-12
    )


def test_the_sink_kernel_efficiency_is_checked_and_round_trips(tmp_path: Path) -> None:
    for bad in (0.0, 1.5, "0.2", True):
        with pytest.raises(ValueError, match="sink_attention_efficiency"):
            EngineStep(sink_attention_efficiency=bad)  # type: ignore[arg-type]
    a100 = hardware_preset("a100-80gb")
    path = tmp_path / "a100.json"
    a100.save(path)
    assert Hardware.load(path).rollout_step == a100.rollout_step
    doc = json.loads(path.read_text())
    doc["rollout_step"]["sink_attention_efficiency"] = 0
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"a100\.json.*rollout_step\.sink_attention_efficiency"):
        Hardware.load(path)
    # a file that does not say has no such loss, and one without the loss does not write it
    assert "sink_attention_efficiency" not in hardware_preset("h100").to_dict()["rollout_step"]

"""``runtime/calibrate/engine_terms.py``: the exact NNLS, the fits of the engine terms (they recover
terms that generated the samples through the cost model), and one real measurement of the torch
engine's nodes on a tiny grid (in this process, no Ray)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from rpeg.costmodel import hardware_preset
from rpeg.costmodel.layout import Layout
from rpeg.costmodel.memory import model_params
from rpeg.costmodel.time import op_time
from rpeg.ir.hardware import EngineTerms, Link, OpTerms
from rpeg.ir.models import ModelSpec
from rpeg.ir.plan import Strategy
from rpeg.ir.types import Head, Role
from rpeg.runtime.calibrate.engine_terms import EngineSample, fit_engine_terms, nnls


def test_nnls_matches_the_unconstrained_optimum_when_it_is_feasible_and_clips_otherwise():
    rng = np.random.default_rng(0)
    a = rng.random((20, 3))
    x = np.array([0.5, 2.0, 1.0])
    assert nnls(a, a @ x) == pytest.approx(x)
    # b pulls the second coefficient negative: the optimum sets it to 0 and refits the rest
    b = a @ np.array([1.0, -3.0, 2.0])
    got = nnls(a, b)
    assert got[1] == 0.0 and (got >= 0).all()
    sub, *_ = np.linalg.lstsq(a[:, [0, 2]], b, rcond=None)
    assert np.sum((a @ got - b) ** 2) <= np.sum((a[:, [0, 2]] @ np.clip(sub, 0, None) - b) ** 2) + 1e-12
    with pytest.raises(ValueError, match="at most 8 columns"):
        nnls(np.ones((10, 9)), np.ones(10))


SPECS = (
    ModelSpec("a", 2, 512, 1024, 16, 8, 8, dtype_bytes=4),
    ModelSpec("b", 6, 384, 768, 16, 6, 6, dtype_bytes=4),
)


def _truth():
    return (
        EngineTerms(
            "vllm",
            prefill=OpTerms(0.4, per_call_s=3e-3, per_layer_s=2e-4),
            decode=OpTerms(0.2, per_step_s=1.5e-3, per_layer_s=1e-4),
            weight_sync=Link(5e-3, 4e-9),
            tensor_parallel=Link(3e-5, 2e-10),
        ),
        EngineTerms(
            "torch",
            inference=OpTerms(0.8, per_call_s=4e-3, per_layer_s=6e-4),
            training=OpTerms(0.6, per_call_s=9e-3, per_layer_s=8e-4),
            data_parallel=Link(2e-2, 3e-9),
        ),
    )


def _synthetic_samples() -> list[EngineSample]:
    """Samples timed by the cost model itself with known engine terms (one device)."""
    base = hardware_preset("cpu")
    vllm, torch_ = _truth()
    # the timed generations push no weights (the sync is its own sample, as measure_vllm times it)
    hw = replace(
        base, engines=(replace(vllm, weight_sync=None), torch_), engine_for=("vllm", "torch", "torch")
    )
    lay = Layout(Strategy((1, 1, 1), 1, 1, 1, 1))
    out = []
    for spec in SPECS:
        for b, lp, n in [(2, 32, 1), (2, 32, 16), (8, 128, 1), (8, 128, 64), (16, 32, 16), (4, 64, 64)]:
            t = op_time(spec, Role.GENERATION, lay, hw, sequences=b, prompt_len=lp, response_len=n).total
            out.append(EngineSample("vllm", "generation", spec, "lm", b, lp, n, t))
        # two ranks: the one-rank terms plus the engine's AllReduce link
        tp2 = Layout(Strategy((1, 1, 2), 1, 1, 2, 1))
        for b, lp, n in [(2, 32, 16), (16, 128, 64), (8, 32, 1)]:
            t = op_time(spec, Role.GENERATION, tp2, hw, sequences=b, prompt_len=lp, response_len=n).total
            out.append(EngineSample("vllm", "generation", spec, "lm", b, lp, n, t, tp=2))
        for b, lp, lr in [(2, 32, 32), (8, 32, 32), (4, 96, 64), (8, 64, 128)]:
            for role, cls in ((Role.INFERENCE, "inference"), (Role.TRAINING, "training")):
                size = {"sequences": b, "prompt_len": lp, "response_len": lr}
                t = op_time(spec, role, lay, hw, **size, head=Head.SCALAR).total
                out.append(EngineSample("torch", cls, spec, "scalar", b, lp, lr, t, recompute="full"))
        nbytes = 4 * 1_000_000 * spec.layers
        out.append(EngineSample("vllm", "sync", spec, "lm", 0, 0, 0, 5e-3 + nbytes * 4e-9, nbytes=nbytes))
        # one FSDP2 update over 2 and 4 ranks: ReduceScatter + AllGather, priced as T_dp prices them
        for ranks in (2, 4):
            dp = Layout(Strategy((1, 1, ranks), ranks, 1, 1, 1))
            t_dp = op_time(spec, Role.TRAINING, dp, hw, sequences=8, prompt_len=8, response_len=8).dp_comm
            nbytes = spec.params * spec.dtype_bytes
            out.append(
                EngineSample("torch", "data_parallel", spec, "lm", 0, 0, 0, t_dp, nbytes=nbytes, ranks=ranks)
            )
    return out


def test_fits_recover_the_terms_that_timed_the_samples():
    terms, fits = fit_engine_terms(_synthetic_samples(), hardware_preset("cpu"))
    got = {e.name: e for e in terms}
    for truth in _truth():
        for cls in truth.classes():
            want, have = getattr(truth, cls), getattr(got[truth.name], cls)
            assert have.efficiency == pytest.approx(want.efficiency, rel=1e-6), (truth.name, cls)
            for name in ("per_call_s", "per_layer_s", "per_step_s"):
                assert getattr(have, name) == pytest.approx(getattr(want, name), rel=1e-6, abs=1e-12), (
                    cls,
                    name,
                )
        for link in ("weight_sync", "data_parallel", "tensor_parallel"):
            want = getattr(truth, link)
            if want is not None:
                assert getattr(got[truth.name], link).alpha == pytest.approx(want.alpha), link
                assert getattr(got[truth.name], link).beta == pytest.approx(want.beta), link
    assert all(f.mape < 1e-6 for f in fits)
    assert {(f.engine, f.op_class) for f in fits} == {
        ("vllm", "generation"), ("vllm", "sync"), ("vllm", "tensor_parallel"), ("torch", "inference"),
        ("torch", "training"), ("torch", "data_parallel"),
    }  # fmt: skip
    # the brief report: one line, each engine's classes with their fit MAPE
    from rpeg.runtime.calibrate.engine_terms import EngineCalibration

    brief = EngineCalibration(hardware_preset("cpu"), _synthetic_samples(), fits).summary()
    assert brief == (
        "engine terms fitted, MAPE: torch inference 0.0%, training 0.0%, data_parallel 0.0%; "
        "vllm generation 0.0%, sync 0.0%, tensor_parallel 0.0%"
    )


def test_torch_engine_nodes_are_measured_and_fitted():
    """A real run of the worker's nodes (one tiny model, one shape): every class is timed, every
    sample is positive, and each class gets fitted terms."""
    pytest.importorskip("torch")
    from rpeg.runtime.calibrate.engine_terms import measure_torch_engine

    samples = measure_torch_engine(
        repeats=1, scales=({"layers": 1, "hidden": 64, "heads": 4},), shapes=((2, 8, 8),)
    )
    assert [s.op_class for s in samples] == ["generation"] + ["inference"] * 3 + ["training"] * 2
    assert [s.head for s in samples] == ["lm", "lm", "scalar", "scalar", "lm", "scalar"]
    assert all(s.seconds > 0 and s.engine == "torch" and s.sequences == 2 for s in samples)
    assert 1 <= samples[0].response_len <= 8  # the longest response decoded
    terms, fits = fit_engine_terms(samples, hardware_preset("cpu"))
    assert [e.name for e in terms] == ["torch"] and set(terms[0].classes()) == {
        "prefill", "decode", "inference", "training"
    }  # fmt: skip
    assert len(fits) == 3


def test_neighbour_load_pins_this_process_and_restores_its_cores():
    import os

    from rpeg.runtime.calibrate.engine_terms import neighbour_load

    allowed = os.sched_getaffinity(0)
    with neighbour_load(False) as loaded:
        assert loaded == 0 and os.sched_getaffinity(0) == allowed
    with neighbour_load(True) as loaded:
        assert loaded == len(allowed) - 1
        if loaded:
            assert os.sched_getaffinity(0) == {min(allowed)}
    assert os.sched_getaffinity(0) == allowed


def test_data_parallel_update_is_measured_on_two_gloo_ranks():
    """A real FSDP2 update on two spawned gloo ranks (the quick grid: two model sizes): positive
    seconds, the models' full parameter bytes, and a link the fit accepts. Bad arguments are
    refused before any process starts."""
    pytest.importorskip("torch")
    from rpeg.runtime.calibrate.engine_terms import measure_data_parallel

    samples = measure_data_parallel(quick=True, repeats=1)
    assert [s.op_class for s in samples] == ["data_parallel"] * 2
    for s in samples:
        assert s.seconds > 0 and s.ranks == 2 and s.engine == "torch"
        assert s.nbytes == 4 * model_params(s.spec, Head.LM)
    terms, _ = fit_engine_terms(samples, hardware_preset("cpu"))
    link = terms[0].data_parallel
    assert link is not None and link.alpha >= 0 and link.beta >= 0 and link.alpha + link.beta > 0
    with pytest.raises(ValueError, match="world"):
        measure_data_parallel(world=1)
    with pytest.raises(ValueError, match="repeats"):
        measure_data_parallel(repeats=0)


def test_vllm_tensor_parallel_generation_is_measured_on_two_ranks():
    """A real two-rank vLLM engine (one tiny model, the quick grid: one shape): a positive time
    tagged ``tp = 2``, which the fit turns into the engine's AllReduce link on top of one-rank
    terms."""
    import os

    pytest.importorskip("vllm")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two cores")
    from rpeg.runtime.calibrate.engine_terms import measure_vllm_tp

    tiny = {"layers": 1, "hidden": 64, "heads": 2}  # head size 32: vLLM-CPU's smallest
    samples = measure_vllm_tp(quick=True, repeats=1, scales=(tiny,))
    assert len(samples) == 1 and samples[0].tp == 2 and samples[0].seconds > 0
    one_rank = [
        s for s in _synthetic_samples() if s.engine == "vllm" and s.op_class == "generation" and s.tp == 1
    ]
    terms, fits = fit_engine_terms([*one_rank, *samples], hardware_preset("cpu"))
    assert terms[0].tensor_parallel is not None and ("vllm", "tensor_parallel") in {
        (f.engine, f.op_class) for f in fits
    }

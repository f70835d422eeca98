"""Bundled hardware presets and the hardware JSON format."""

import dataclasses
import json
import re
from pathlib import Path

import pytest

from rpeg.costmodel import HARDWARE_PRESETS, Hardware, Link, hardware_preset, load_hardware
from rpeg.ir.errors import InputError
from rpeg.ir.hardware import FIGURE_RANGES, OpTerms


def test_bundled_presets_are_listed():
    assert set(HARDWARE_PRESETS) == {
        "a100-40gb",
        "a100-80gb",
        "b200",
        "b300",
        "cpu",
        "gb200-nvl72",
        "gb300-nvl72",
        "gh200",
        "h100",
        "h20",
        "h200",
    }


@pytest.mark.parametrize(
    "name", ["a100-40gb", "a100-80gb", "b200", "b300", "gh200", "h100", "h20", "h200", "cpu"]
)
def test_presets_load_and_are_sane(name):
    hw = hardware_preset(name)
    assert hw.name == name
    assert hw.memory_headroom == pytest.approx(0.10)
    assert hw.m_eff == pytest.approx(0.9 * hw.gpu_memory_bytes)
    assert "calibrat" in hw.notes  # says the figures are nominal until calibrated
    for links in (hw.collective, hw.p2p):
        # intra-node faster than inter-node, faster than inter-rack
        assert links[0].beta < links[1].beta < links[2].beta
        assert links[0].alpha <= links[1].alpha < links[2].alpha


@pytest.mark.parametrize(
    ("name", "per_node", "memory", "nominal_flops"),
    [
        # the driver's total (nvidia-smi, MiB) where a listing is cited; else the vendor's figure
        ("a100-40gb", 8, 40960 * 2**20, 312e12),
        ("a100-80gb", 8, 81920 * 2**20, 312e12),
        ("b200", 8, 183359 * 2**20, 2250e12),
        ("b300", 8, 288e9, 2250e12),
        ("gb200-nvl72", 4, 186e9, 2500e12),
        ("gb300-nvl72", 4, 288e9, 2500e12),
        ("gh200", 4, 96e9, 990e12),
        ("h100", 8, 81559 * 2**20, 990e12),
        ("h200", 8, 143771 * 2**20, 990e12),
    ],
)
def test_gpu_preset_figures(name, per_node, memory, nominal_flops):
    hw = hardware_preset(name)
    assert hw.gpus_per_node == per_node
    assert hw.gpu_memory_bytes == memory
    # derated, but not absurdly
    assert 0.5 * nominal_flops <= hw.peak_flops < nominal_flops


def test_h200_has_more_bandwidth_than_h100_and_a100():
    a100, h100, h200 = (hardware_preset(n) for n in ("a100-40gb", "h100", "h200"))
    assert a100.mem_bandwidth < h100.mem_bandwidth < h200.mem_bandwidth


def test_lookup_is_case_insensitive():
    assert hardware_preset(" H100 ") == hardware_preset("h100")
    assert hardware_preset("GB200-NVL72") == hardware_preset("gb200-nvl72")
    assert hardware_preset("B200").name == "b200" and load_hardware("a100-80gb").name == "a100-80gb"


def test_unknown_preset_lists_known_names():
    with pytest.raises(ValueError, match="unknown hardware preset 'mi300x'") as err:
        hardware_preset("mi300x")
    for name in HARDWARE_PRESETS:
        assert name in str(err.value)


def test_json_round_trip(tmp_path):
    hw = Hardware(
        name="test",
        gpu_memory_bytes=24e9,
        peak_flops=1.5e14,
        mem_bandwidth=9e11,
        gamma_m=100.0,
        gamma_k=50.0,
        c_nongemm=2e-4,
        b_cal=4.0,
        collective=(Link(1e-5, 1e-11), Link(2e-5, 1e-10), Link(3e-5, 2e-10)),
        p2p=(Link(2e-6, 2e-11), Link(4e-6, 2e-10), Link(6e-6, 4e-10)),
        memory_headroom=0.05,
        gpus_per_node=4,
        notes="round trip",
    )
    path = tmp_path / "hw.json"
    hw.save(path)
    back = Hardware.load(path)
    assert back == hw
    assert back.notes == "round trip"
    assert load_hardware(str(path)) == hw
    assert load_hardware(path) == hw


def test_preset_round_trip(tmp_path):
    hw = hardware_preset("gh200")
    hw.save(tmp_path / "gh200.json")
    assert Hardware.load(tmp_path / "gh200.json") == hw


def test_load_hardware_resolves_names_and_passes_objects_through():
    hw = hardware_preset("cpu")
    assert load_hardware(hw) is hw
    assert load_hardware("cpu") == hw


def test_missing_field_is_named(tmp_path):
    data = hardware_preset("h100").to_dict()
    del data["peak_flops"]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"missing field.*peak_flops"):
        Hardware.load(path)


def test_invalid_field_is_named(tmp_path):
    data = hardware_preset("h100").to_dict()
    data["mem_bandwidth"] = -1.0
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    with pytest.raises(
        InputError,
        match=r"broken\.json: field 'mem_bandwidth': must be a number in \[1e6, 1e15\] bytes/s \(got -1\.0\)",
    ):
        Hardware.load(path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(peak_flops="fast"), r"field 'peak_flops': .*valid number \(got 'fast'\)"),
        (
            lambda d: d["collective"][1].update(beta=-2e-11),
            r"field 'collective\[1\]\.beta': .*must be a number in \[0, 1e-6\] s/byte",
        ),
        (lambda d: d["p2p"][2].update(alpha="1us"), r"field 'p2p\[2\]\.alpha'"),
        (lambda d: d["p2p"].pop(), r"field 'p2p': .*at least 3"),
        (
            lambda d: d["collective"][0].update(tier="inter-rack"),
            r"'collective'.*entry 0 must be tier 'intra-node'",
        ),
        (lambda d: d.update(gpus_per_node=8.5), r"field 'gpus_per_node'"),
        (lambda d: d.update(memory_headroom=1.5), r"field 'memory_headroom'"),
        (lambda d: d.update(format="rpeg.hardware/9"), r"field 'format'"),
        (lambda d: d.update(peak_flop=1.0), r"unknown key 'peak_flop', did you mean 'peak_flops'"),
    ],
)
def test_malformed_hardware_file_names_the_file_tier_and_field(tmp_path, edit, message):
    data = hardware_preset("h100").to_dict()
    edit(data)
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=message) as info:
        Hardware.load(path)
    assert str(info.value).startswith(str(path))


def test_missing_or_unreadable_hardware_file_is_named(tmp_path):
    with pytest.raises(InputError, match=r"hardware file 'missing\.json' does not exist"):
        load_hardware("missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(InputError, match="not valid JSON"):
        load_hardware(tmp_path / "bad.json")
    (tmp_path / "nan.json").write_text('{"peak_flops": NaN}')
    with pytest.raises(InputError, match="NaN is not a number JSON allows"):
        load_hardware(tmp_path / "nan.json")
    with pytest.raises(TypeError, match="hardware preset name must be a string"):
        hardware_preset(None)
    with pytest.raises(InputError, match="unknown hardware preset 'h1000'"):
        load_hardware("h1000")


# ---------------------------------------------------------------------------- rpeg.hardware/2
def _engines_hw() -> Hardware:
    from rpeg.ir.hardware import EngineTerms, OpTerms

    vllm = EngineTerms(
        "vllm",
        prefill=OpTerms(0.5, 2e-3, 1e-4, 0.0),
        decode=OpTerms(0.25, 0.0, 5e-5, 1e-3),
        weight_sync=Link(1e-2, 1e-9),
        tensor_parallel=Link(4e-5, 2e-10),
    )
    torch_ = EngineTerms(
        "torch",
        inference=OpTerms(0.8, 1e-3, 2e-4, 0.0),
        training=OpTerms(0.7, 3e-3, 3e-4, 0.0),
        data_parallel=Link(2e-2, 3e-9),
    )
    base = hardware_preset("cpu")
    from dataclasses import replace

    return replace(
        base,
        name="engines",
        l_cal=64.0,
        d_cal=512.0,
        dispatch_s=2.5e-3,
        engines=(vllm, torch_),
        engine_for=("vllm", "torch", "torch"),
        sources=(("peak_flops", "measured"),),
    )


def test_engine_terms_round_trip_and_lookup(tmp_path):
    hw = _engines_hw()
    path = tmp_path / "hw.json"
    hw.save(path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "rpeg.hardware/2"
    assert doc["engine_for"] == {"generation": "vllm", "inference": "torch", "training": "torch"}
    assert set(doc["engines"]["vllm"]) == {"prefill", "decode", "weight_sync", "tensor_parallel"}
    back = Hardware.load(path)
    assert back == hw and back.sources == hw.sources
    assert back.terms("decode").per_step_s == 1e-3 and back.terms("training").efficiency == 0.7
    assert back.weight_sync() == Link(1e-2, 1e-9)
    assert back.tensor_parallel() == Link(4e-5, 2e-10)
    assert back.using(generation="torch").tensor_parallel() is None
    assert set(doc["engines"]["torch"]) == {"inference", "training", "data_parallel"}
    assert back.data_parallel() == Link(2e-2, 3e-9)
    assert back.using(training="megatron").data_parallel() is None
    # the torch engine has no generation terms: SPEC's (neutral) terms when it generates
    torch_gen = back.using(generation="torch")
    assert torch_gen.terms("decode").efficiency == 1.0 and torch_gen.weight_sync() is None
    # an engine the file never measured: neutral too, not an error
    assert back.using(generation="megatron").engine_for[0] == ""
    with pytest.raises(ValueError, match="unknown role"):
        back.using(decoding="vllm")
    # one engine's terms replaced by name, the others and the roles kept
    vllm = back.engine("generation")
    swapped = back.with_engine(dataclasses.replace(vllm, weight_sync=Link(0.0, 2e-9)))
    assert swapped.weight_sync() == Link(0.0, 2e-9) and swapped.engine_for == back.engine_for
    assert swapped.engine("training") == back.engine("training")
    with pytest.raises(ValueError, match="no engine 'megatron'"):
        back.with_engine(dataclasses.replace(vllm, name="megatron"))


#: The presets with the fitted vLLM prefill efficiency: the H100 and H200 parts it was fitted and
#: reported on (GH200 and H20 keep the roofline).
FITTED_PREFILL = ("h100", "h200")


def test_presets_have_neutral_engine_terms_but_hoppers_vllm_prefill():
    """Presets carry SPEC's terms, except the one fitted figure: vLLM's prefill efficiency on
    H100 and H200 (``docs/cost-model.md`` §8, "vLLM's prefill on Hopper")."""
    assert set(FITTED_PREFILL) <= set(HARDWARE_PRESETS)
    for name in HARDWARE_PRESETS:
        hw = hardware_preset(name)
        assert hw.dispatch_s == 0.0 and hw.weight_sync() is None and hw.tensor_parallel() is None
        assert hw.data_parallel() is None
        for cls in ("prefill", "decode", "inference", "training"):
            t = hw.terms(cls)
            eta = 0.484 if (name, cls) in {(h, "prefill") for h in FITTED_PREFILL} else 1.0
            assert (t.efficiency, t.per_call_s, t.per_layer_s, t.per_step_s) == (eta, 0.0, 0.0, 0.0)
        assert hw.engine_for == (("vllm", "", "") if name in FITTED_PREFILL else ("", "", ""))
        assert (hw.engines == ()) == (name not in FITTED_PREFILL)


def test_version_1_files_are_refused_with_what_to_do(tmp_path):
    doc = hardware_preset("cpu").to_dict()
    doc["format"] = "rpeg.hardware/1"
    del doc["l_cal"], doc["d_cal"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(
        InputError, match=r"old\.json: format 'rpeg.hardware/1' is no longer read.*l_cal.*d_cal"
    ):
        load_hardware(str(path))


@pytest.mark.parametrize(
    ("edit", "pattern"),
    [
        (lambda d: d["engine_for"].update(generation="sglang"), r"engine_for\.generation = 'sglang' has no measured terms"),
        (lambda d: d["engines"]["vllm"]["decode"].update(efficiency=0.0), r"engines\.vllm\.decode\.efficiency"),
        (lambda d: d["engines"]["vllm"]["decode"].update(per_step_ms=1.0), r"per_step_ms"),
        (lambda d: d.update(l_cal="64"), r"l_cal"),
        (lambda d: d.pop("d_cal"), r"d_cal"),
        (lambda d: d.update(dispatch_s=-1.0), r"dispatch_s"),
    ],
)  # fmt: skip
def test_bad_engine_fields_name_the_field(tmp_path, edit, pattern):
    doc = _engines_hw().to_dict()
    edit(doc)
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=pattern) as info:
        load_hardware(str(path))
    assert "hw.json" in str(info.value)


# ---------------------------------------------------------------------------- plausible ranges (issue 33)
OUT_OF_RANGE = [
    ("peak_flops", 1e-300),
    ("peak_flops", 1e308),
    ("peak_flops", 0.0),
    ("mem_bandwidth", 1e-300),
    ("host_bandwidth", 1e16),
    ("gpu_memory_bytes", 1e308),
    ("gamma_m", 1e308),
    ("gamma_k", -1.0),
    ("c_nongemm", 1e308),
    ("b_cal", 1e-300),
    ("l_cal", 1e308),
    ("d_cal", 1e308),
    ("dispatch_s", 1e5),
    ("collective[1].beta", 1.0),
    ("p2p[2].alpha", 1e308),
    ("engines.vllm.decode.efficiency", 1e-300),
    ("engines.vllm.prefill.per_step_s", 1e308),
    ("engines.torch.training.per_call_s", 1e308),
    ("engines.torch.inference.memory_factor", 1e308),
    ("engines.vllm.weight_sync.beta", 1e308),
    ("engines.torch.data_parallel.alpha", 1e308),
]


def _set(doc: dict, path: str, value: float) -> None:
    """``doc`` at the dotted ``path`` (``collective[1].beta``) set to ``value``."""
    *parents, last = path.replace("[", ".").replace("]", "").split(".")
    for part in parents:
        doc = doc[int(part)] if part.isdigit() else doc[part]
    doc[last] = value


@pytest.mark.parametrize(("path", "value"), OUT_OF_RANGE, ids=[f"{p}={v:g}" for p, v in OUT_OF_RANGE])
def test_a_figure_out_of_its_plausible_range_is_refused_naming_file_field_and_value(tmp_path, path, value):
    # 1e308 everywhere ended in a ZeroDivisionError, 1e-300 in a NaN makespan written as "feasible"
    doc = _engines_hw().to_dict()
    _set(doc, path, value)
    file = tmp_path / "hw.json"
    file.write_text(json.dumps(doc))
    want = rf"hw\.json: field '{re.escape(path)}': must be a number in \[[-0-9e.]+, [-0-9e.]+\].* \(got {re.escape(repr(value))}\)"
    with pytest.raises(InputError, match=want):
        load_hardware(str(file))


@pytest.mark.parametrize(
    "field", sorted(f for f in FIGURE_RANGES if f in {x.name for x in dataclasses.fields(Hardware)})
)
def test_a_hardware_built_in_python_is_held_to_the_same_ranges(field):
    lo, hi, _ = FIGURE_RANGES[field]
    hw = _engines_hw()
    for value in (hi * 10 or 1.0, lo / 10 if lo > 0 else -1.0, float("nan")):
        with pytest.raises(
            ValueError,
            match=rf"Hardware 'engines': {field} must be a number in \[.*got {re.escape(repr(value))}",
        ):
            dataclasses.replace(hw, **{field: value})
    assert dataclasses.replace(hw, **{field: hi}).name == "engines"  # the bounds themselves are in
    with pytest.raises(
        ValueError, match=r"Hardware 'engines': gpus_per_node must be an integer in \[1, 1024\], got 0"
    ):
        dataclasses.replace(hw, gpus_per_node=0)


def test_links_and_engine_terms_of_a_hardware_are_held_to_the_ranges():
    # a Link or OpTerms alone checks its sign only (a unit link is a fit's probe); a Hardware
    # holding one checks it against FIGURE_RANGES, naming where it sits
    assert Link(0.0, 1.0).beta == 1.0
    hw = hardware_preset("h100")
    with pytest.raises(
        ValueError, match=r"Hardware 'h100': p2p\[2\]\.alpha must be a number in \[0, 60\] s, got 1e\+308"
    ):
        dataclasses.replace(hw, p2p=(hw.p2p[0], hw.p2p[1], (1e308, 1e-9)))
    with pytest.raises(
        ValueError,
        match=r"Hardware 'h100': collective\[0\]\.beta must be a number in \[0, 1e-6\] s/byte, got 1\.0",
    ):
        dataclasses.replace(hw, collective=(Link(0.0, 1.0), *hw.collective[1:]))
    with pytest.raises(
        ValueError, match=r"Hardware 'h100': p2p\[1\]: Link alpha and beta must be non-negative"
    ):
        dataclasses.replace(hw, p2p=(hw.p2p[0], (-1.0, 1e-9), hw.p2p[2]))
    engines = _engines_hw()
    vllm = engines.engines[0]
    with pytest.raises(
        ValueError,
        match=r"Hardware 'engines': engines\.vllm\.decode\.efficiency must be a number in \[1e-6, 1e9\], got 1e-300",
    ):
        engines.with_engine(dataclasses.replace(vllm, decode=OpTerms(efficiency=1e-300)))
    with pytest.raises(
        ValueError,
        match=r"Hardware 'engines': engines\.vllm\.weight_sync\.beta must be a number in \[0, 1e-6\] s/byte, got 1e\+308",
    ):
        engines.with_engine(dataclasses.replace(vllm, weight_sync=Link(0.0, 1e308)))


def test_every_preset_and_calibration_file_is_in_range():
    # the ranges must not refuse a real machine: every bundled preset and the calibrated file
    for name in HARDWARE_PRESETS:
        hardware_preset(name)
    root = Path(__file__).resolve().parents[2] / "benchmarks"
    calibrated = [p for p in root.rglob("*.json") if '"rpeg.hardware/2"' in p.read_text(errors="replace")]
    assert root / "hw-this-machine.json" in calibrated
    for path in calibrated:
        if json.loads(path.read_text()).get("format") == "rpeg.hardware/2":
            load_hardware(path)

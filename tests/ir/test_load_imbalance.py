"""The expert-parallel load imbalance ``λ`` as a model setting (SPEC §15.2: "default 1.2,
calibrated where measured"): ``ModelSpec.load_imbalance``, its file forms and its errors."""

from dataclasses import replace

import pytest

from rpeg import load_workload, model_preset
from rpeg.ir.errors import InputError, validate
from rpeg.ir.models import DEFAULT_LOAD_IMBALANCE, ModelSpec, ModelSpecFile

MOE = model_preset("qwen3-30b-a3b")
DENSE = model_preset("llama3.1-8b")

WORKLOAD = """
name = "moe-job"
algorithm = "grpo"
reward = "rule"
{top}
[batch]
prompts = 8
rollouts = 4
prompt_len = 128
response_len = 256

[models]
actor = {actor}
reference = "llama3.1-8b"
"""
INLINE = (
    '{{ name = "tiny-moe", layers = 2, hidden = 64, ffn_hidden = 128, vocab = 100, heads = 4, kv_heads = 4, '
    "experts = 8, experts_active = 2, expert_ffn = 32{extra} }}"
)


def _write(tmp_path, top="", actor='"qwen3-30b-a3b"'):
    path = tmp_path / "w.toml"
    path.write_text(WORKLOAD.format(top=top, actor=actor))
    return path


def test_default_is_specs_and_the_plain_data_is_as_before():
    assert DEFAULT_LOAD_IMBALANCE == 1.2 == MOE.load_imbalance == DENSE.load_imbalance
    assert "load_imbalance" not in MOE.to_dict() and "load_imbalance" not in DENSE.to_dict()


def test_a_set_imbalance_round_trips_through_plain_data_and_the_file_schema():
    m = replace(MOE, load_imbalance=1)
    assert m.load_imbalance == 1.0 and isinstance(m.load_imbalance, float) and m != MOE
    d = m.to_dict()
    assert d["load_imbalance"] == 1.0
    assert ModelSpec(**validate(ModelSpecFile, d, "result.json").model_dump()) == m


@pytest.mark.parametrize("bad", [0.5, 0.0, 65.0, float("nan"), float("inf"), True, "1.1", None])
def test_a_bad_imbalance_is_named(bad):
    with pytest.raises(ValueError, match=r"load_imbalance must be a number in \[1, 64\] .*got "):
        replace(MOE, load_imbalance=bad)


def test_a_dense_model_takes_no_imbalance():
    with pytest.raises(ValueError, match=r"load_imbalance = 1.0 but experts = 0"):
        replace(DENSE, load_imbalance=1.0)


def test_a_bad_imbalance_in_a_result_file_names_file_field_and_value():
    d = MOE.to_dict() | {"load_imbalance": 0.9}
    with pytest.raises(InputError) as exc:
        validate(ModelSpecFile, d, "plan.json")
    msg = str(exc.value)
    assert "plan.json" in msg and "load_imbalance" in msg and "0.9" in msg


def test_workload_file_imbalance_applies_to_every_mixture_of_experts(tmp_path):
    models = load_workload(_write(tmp_path, top="load_imbalance = 1.0")).workload.models
    assert models["actor"].load_imbalance == 1.0
    assert models["reference"].load_imbalance == DEFAULT_LOAD_IMBALANCE  # dense: nothing to balance


def test_an_inline_table_may_set_its_own(tmp_path):
    wf = load_workload(_write(tmp_path, actor=INLINE.format(extra=", load_imbalance = 1.5")))
    assert wf.workload.models["actor"].load_imbalance == 1.5


def test_workload_file_contradicting_imbalances_are_refused(tmp_path):
    path = _write(tmp_path, top="load_imbalance = 1.0", actor=INLINE.format(extra=", load_imbalance = 1.5"))
    with pytest.raises(InputError, match=r"models\.actor\.load_imbalance' = 1.5 contradicts .*1.0") as exc:
        load_workload(path)
    assert exc.value.field == "models.actor.load_imbalance"


def test_workload_file_imbalance_without_a_mixture_of_experts_is_refused(tmp_path):
    path = _write(tmp_path, top="load_imbalance = 1.0", actor='"llama3.1-8b"')
    with pytest.raises(InputError, match=r"'load_imbalance' = 1.0 but no model has experts") as exc:
        load_workload(path)
    assert "w.toml" in str(exc.value) and exc.value.field == "load_imbalance"


@pytest.mark.parametrize("bad", ["0.5", '"high"', "true"])
def test_workload_file_bad_imbalance_is_named(tmp_path, bad):
    with pytest.raises(InputError) as exc:
        load_workload(_write(tmp_path, top=f"load_imbalance = {bad}"))
    msg = str(exc.value)
    assert "w.toml" in msg and "load_imbalance" in msg

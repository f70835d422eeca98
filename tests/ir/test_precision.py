"""The precision setting (issue 31): ``ModelSpec.precision``, its file forms and its errors."""

from dataclasses import replace

import pytest

from rpeg import load_workload, model_preset
from rpeg.ir.errors import InputError, validate
from rpeg.ir.models import PRECISIONS, ModelSpec, ModelSpecFile

M = model_preset("llama3.1-8b")

WORKLOAD = """
name = "fp8-job"
algorithm = "grpo"
{top}
[batch]
prompts = 8
rollouts = 4
prompt_len = 128
response_len = 256

[models]
actor = "llama3.1-8b"
reward = {reward}
"""
INLINE = '{{ name = "rm", layers = 2, hidden = 64, ffn_hidden = 128, vocab = 100, heads = 4, kv_heads = 4{extra} }}'


def _write(tmp_path, top="", extra=""):
    path = tmp_path / "w.toml"
    path.write_text(WORKLOAD.format(top=top, reward=INLINE.format(extra=extra)))
    return path


def test_default_is_bf16_and_the_plain_data_is_as_before():
    assert PRECISIONS == ("bf16", "fp8", "nvfp4", "mxfp4")
    assert M.precision == "bf16" and not M.is_fp8 and not M.is_low_precision
    assert M.gemm_bytes == M.dtype_bytes == 2
    assert "precision" not in M.to_dict()  # BF16 result files are byte-identical to before


def test_gemm_operand_bytes_per_precision():
    """FP8: one byte; NVFP4: a 4-bit value and an E4M3 scale per 16 (0.5 + 1/16)."""
    assert replace(M, precision="fp8").gemm_bytes == 1.0
    m4 = replace(M, precision="nvfp4")
    assert m4.gemm_bytes == 0.5625 and m4.is_low_precision and not m4.is_fp8


def test_nvfp4_round_trips_through_plain_data_and_the_file_schema():
    m4 = replace(M, precision="nvfp4")
    d = m4.to_dict()
    assert d["precision"] == "nvfp4"
    assert ModelSpec(**validate(ModelSpecFile, d, "result.json").model_dump()) == m4


def test_fp8_round_trips_through_plain_data_and_the_file_schema():
    m8 = replace(M, precision="fp8")
    assert m8.is_fp8 and m8 != M
    d = m8.to_dict()
    assert d["precision"] == "fp8"
    assert ModelSpec(**d) == m8
    back = validate(ModelSpecFile, d, "result.json")
    assert ModelSpec(**back.model_dump()) == m8


@pytest.mark.parametrize("bad", ["fp4", "FP8", "NVFP4", "MXFP4", "mxfp8", "", 8, None])
def test_a_bad_precision_is_named(bad):
    with pytest.raises(ValueError, match=r"precision must be one of 'bf16', 'fp8', 'nvfp4', 'mxfp4', got "):
        replace(M, precision=bad)


@pytest.mark.parametrize("precision", ["fp8", "nvfp4"])
def test_low_precision_needs_a_bf16_model(precision):
    with pytest.raises(
        ValueError,
        match=rf"precision '{precision}' runs the low-precision GEMMs of a BF16 model .*dtype_bytes = 4",
    ):
        replace(M, dtype_bytes=4, precision=precision)


def test_a_bad_precision_in_a_result_file_names_file_field_and_value():
    d = M.to_dict() | {"precision": "int4"}
    with pytest.raises(InputError) as exc:
        validate(ModelSpecFile, d, "plan.json")
    msg = str(exc.value)
    assert "plan.json" in msg and "precision" in msg and "int4" in msg


def test_workload_file_precision_applies_to_every_model(tmp_path):
    wf = load_workload(_write(tmp_path, top='precision = "fp8"'))
    models = wf.workload.models
    assert {role: spec.precision for role, spec in models.items()} == {
        "actor": "fp8",
        "reward": "fp8",
        "reference": "fp8",
    }
    # the workload block of a result file carries it, and reads back
    actor = wf.workload.to_dict()["models"]["actor"]
    assert actor["precision"] == "fp8"
    assert ModelSpec(**validate(ModelSpecFile, actor, "r.json").model_dump()) == models["actor"]


def test_workload_file_takes_nvfp4(tmp_path):
    wf = load_workload(_write(tmp_path, top='precision = "nvfp4"'))
    assert {spec.precision for spec in wf.workload.models.values()} == {"nvfp4"}


def test_workload_file_without_precision_stays_bf16_and_an_inline_table_may_set_its_own(tmp_path):
    wf = load_workload(_write(tmp_path, extra=', precision = "fp8"'))
    assert wf.workload.models["actor"].precision == "bf16"
    assert wf.workload.models["reward"].precision == "fp8"


def test_workload_file_bad_precision_is_named(tmp_path):
    with pytest.raises(InputError) as exc:
        load_workload(_write(tmp_path, top='precision = "fp16"'))
    msg = str(exc.value)
    assert "w.toml" in msg and "precision" in msg and "fp16" in msg


def test_workload_file_contradicting_precisions_are_refused(tmp_path):
    with pytest.raises(InputError, match=r"models\.reward\.precision' = 'bf16' contradicts .*'fp8'") as exc:
        load_workload(_write(tmp_path, top='precision = "fp8"', extra=', precision = "bf16"'))
    assert exc.value.field == "models.reward.precision"

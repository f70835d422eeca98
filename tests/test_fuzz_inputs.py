"""Property-based fuzzing of every file format rpeg reads: workload TOML, hardware JSON, result
JSON and trace JSON.

Each generated document is a valid one with a few random edits (a key dropped, a value replaced
by a value of a random type — NaN, huge or negative numbers, strings, lists, tables — or an
unknown key added). Reading it must either work or raise :class:`~rpeg.ir.errors.InputError`
naming the file; any other exception is a bug (it would be a traceback for the user).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rpeg
from rpeg.ir.errors import InputError
from rpeg.ir.workload import load_workload

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,  # the same inputs on every run: a failure is reproducible
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, 1, -1, 2, 3, 7, 8, 95, 10**15]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 0.5, 1.0, 95.7, -1.0, math.nan, math.inf]),
    st.text(max_size=12),
    st.sampled_from(
        ["ppo", "no", "yes", "true", "1x2x4", "h100", "llama2-7b", "x/config.json", "", "rpeg.result/9"]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside ``doc`` (dict keys and list indices)."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated(draw, base: dict[str, Any], edits: int = 3) -> dict[str, Any]:
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, edits))):
        paths = _paths(doc)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        key = path[-1]
        action = draw(st.sampled_from(["replace", "replace", "drop", "add"]))
        if action == "replace":
            parent[key] = draw(values)
        elif action == "drop":
            del parent[key]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(values)
        else:
            parent.append(draw(values))
    return doc


def _reads_or_input_error(read, path: Path) -> None:
    try:
        read(path)
    except InputError as exc:
        assert str(path) in str(exc), f"the message does not name the file: {exc}"
    # anything else propagates and fails the test with the traceback a user would have seen


# ---------------------------------------------------------------------------- TOML
def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def to_toml(doc: dict[str, Any]) -> str:
    """Top-level scalars, then one ``[table]`` per top-level dict (nested dicts inline)."""
    lines = [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for k, v in doc.items():
        if isinstance(v, dict):
            lines.append(f"[{json.dumps(k)}]")
            lines += [f"{json.dumps(kk)} = {_toml_value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"


WORKLOAD = {
    "name": "fuzz",
    "algorithm": "ppo",
    "batch": {"prompts": 64, "rollouts": 1, "prompt_len": 128, "response_len": 256, "quantiles": [[0.5, 64], [1.0, 256]]},
    "models": {
        "actor": "llama2-7b",
        "critic": {"name": "c", "layers": 4, "hidden": 256, "ffn_hidden": 512, "vocab": 1000, "heads": 4, "kv_heads": 2},
        "reward": "7b",
    },
    "structure": {"staleness": {"actor": [0, 1], "critic": [0]}, "ac_sharing": False},
    "cluster": {"shape": "1x2x4", "hardware": "h100", "k_eval": 2},
}  # fmt: skip


def test_the_fuzzed_workload_is_valid_before_edits(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text(to_toml(WORKLOAD))
    assert load_workload(path).workload.models["critic"].kv_heads == 2


@SETTINGS
@given(doc=mutated(WORKLOAD))
def test_workload_toml_reads_or_names_the_problem(tmp_path, doc):
    path = tmp_path / "w.toml"
    path.write_text(to_toml(doc))
    _reads_or_input_error(load_workload, path)


# ---------------------------------------------------------------------------- hardware JSON
HARDWARE = rpeg.hardware_preset("h100").to_dict()


@SETTINGS
@given(doc=mutated(HARDWARE))
def test_hardware_json_reads_or_names_the_problem(tmp_path, doc):
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(doc))  # NaN/Infinity are written as JS literals: refused on read
    _reads_or_input_error(rpeg.load_hardware, path)


# ---------------------------------------------------------------------------- result JSON
@pytest.fixture(scope="module")
def small_result() -> dict[str, Any]:
    wf = rpeg.load_workload(rpeg.example_path("ppo-1b-4gpu"))
    cluster = rpeg.Cluster.from_shape("1x1x4", rpeg.hardware_preset("h100"))
    result = rpeg.solve(wf.workload, cluster, method="greedy", k_eval=1)
    doc = result.to_dict()
    doc["nodes"] = doc["nodes"][:2]  # unread by the reader; keeps the mutation space on what is read
    return doc


@SETTINGS
@given(data=st.data())
def test_result_json_reads_or_names_the_problem(tmp_path, small_result, data):
    doc = data.draw(mutated(small_result))
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    _reads_or_input_error(rpeg.Result.from_json, path)


# ---------------------------------------------------------------------------- trace JSON
#: A real one-step trace of ``ppo-1b-4gpu`` (greedy plan, k_eval=1), written by ``rpeg run``.
TRACE = json.loads((Path(__file__).parent / "data" / "trace-small.json").read_text())


def test_the_shipped_trace_reads():
    from rpeg.runtime.trace.records import Trace

    assert len(Trace.from_json(Path(__file__).parent / "data" / "trace-small.json").records) == 6


@SETTINGS
@given(doc=mutated(TRACE))
def test_trace_json_reads_or_names_the_problem(tmp_path, doc):
    from rpeg.runtime.trace.records import Trace

    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    _reads_or_input_error(Trace.from_json, path)

"""Tests for ``solvers/result.py``: the :class:`Result` (its constructors and summary), the
``rpeg.result/2`` round trip (and reading ``rpeg.result/1``), the statuses a planless result may
have, and plan validation (the one check the reader and :func:`result_for_plan` share)."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpeg import Cluster, Workload, example_names, hardware_preset, model_preset
from rpeg.ir import Plan, Role, structures
from rpeg.ir.errors import InputError
from rpeg.ir.types import Recompute
from rpeg.scoring.candidates import build_directories
from rpeg.scoring.evaluator import Evaluator
from rpeg.solvers import Result, Status, solve
from rpeg.solvers.result import FORMAT, plan_from_entries, result_for_plan

ENGINE_FIELDS = ("zero", "mem_fraction", "logits_chunk", "packing")
WORKLOAD_V2_FIELDS = ("reward", "reward_cost_s", "kl_coef", "old_logprob", "mini_batches")
# tiny_ppo's responses follow SPEC §2's default quantiles for Lr = 256,
# [(0.5, 64), (0.85, 128), (1.0, 256)]: Ē = 0.5·32 + 0.35·96 + 0.15·192 = 78.4 tokens
TINY_REAL_TOKENS = 64 * (128 + 78.4)


@pytest.fixture(scope="module")
def concurrent(tiny_ppo, cluster_1x2x4):
    # plain 1F1B: the tests below take the trainer's data-parallel plan (pp = 1) as their premise
    return solve(
        tiny_ppo, dataclasses.replace(cluster_1x2x4, virtual_pipeline_parallel=False), method="concurrent"
    )


# ---------------------------------------------------------------------------- JSON
@pytest.mark.parametrize("method", ["greedy", "concurrent"])
@pytest.mark.parametrize("name", example_names())
def test_result_json_round_trip_is_identical(problem_of, name, method):
    workload, cluster, k_eval = problem_of(name)
    r = solve(workload, cluster, method=method, k_eval=k_eval)
    text = r.to_json()
    back = Result.from_json(text)
    assert back.to_json() == text
    assert back.throughput == r.throughput
    assert back.plan == r.plan
    assert back.status is r.status


def test_result_json_through_a_file(concurrent, tmp_path):
    path = tmp_path / "r.json"
    text = concurrent.to_json(path)
    assert path.read_text() == text
    doc = json.loads(text)
    assert doc["format"] == FORMAT == "rpeg.result/2"
    assert doc["throughput"] == concurrent.throughput
    # real tokens (SPEC §14.1), not the padded B·R·(Lp + Lr)
    assert doc["throughput"] == pytest.approx(doc["k_eval"] * TINY_REAL_TOKENS / doc["makespan"], rel=1e-12)
    for key in WORKLOAD_V2_FIELDS:
        assert key in doc["workload"], key
    for e in doc["plan"]:
        assert set(ENGINE_FIELDS) <= set(e), e
    assert len(doc["nodes"]) > 0
    assert Result.from_json(path).to_json() == text


def test_from_json_rejects_another_format(concurrent):
    doc = concurrent.to_dict()
    doc["format"] = "rpeg.result/0"
    with pytest.raises(ValueError, match=r"'format' must be one of 'rpeg\.result/1', 'rpeg\.result/2'"):
        Result.from_dict(doc)
    doc = concurrent.to_dict()
    del doc["k_eval"]
    with pytest.raises(ValueError, match="k_eval"):
        Result.from_dict(doc)


def test_infeasible_result(ppo_70b, a100_1x1x8):
    r = solve(ppo_70b, a100_1x1x8, method="concurrent")
    assert r.status is Status.INFEASIBLE
    assert r.status.value == "infeasible"
    assert r.plan is None and r.evaluation is None
    assert not r.feasible
    assert r.throughput == 0.0
    assert "'actor_train'" in r.message and "GiB over" in r.message
    assert "NO FEASIBLE PLAN" in r.summary()
    text = r.to_json()
    doc = json.loads(text)
    assert doc["status"] == "infeasible"
    assert doc["plan"] == [] and doc["nodes"] == []
    assert "actor_train" in doc["message"]
    back = Result.from_json(text)
    assert back.plan is None
    assert back.to_json() == text


# ---------------------------------------------------------------------------- random plans
SEVEN = model_preset("7b")
TINY = {
    "ppo": Workload("ppo", {"actor": SEVEN, "critic": SEVEN, "reward": SEVEN}, 64, 1, 128, 256),
    "grpo": Workload("grpo", {"actor": SEVEN, "reward": SEVEN}, 16, 4, 128, 256),
    "remax": Workload("remax", {"actor": SEVEN, "reward": SEVEN}, 64, 1, 128, 256),
    "dpo": Workload("dpo", {"actor": SEVEN}, 32, 2, 128, 256),
}
CASES = [(algo, s) for algo, w in TINY.items() for s in structures(w)]


@cache
def _setup(algo, structure):
    cluster = Cluster.from_shape("1x2x4", hardware_preset("gh200"))
    ev = Evaluator(TINY[algo], cluster, structure, k_eval=4)
    return ev, build_directories(ev.costs)


@st.composite
def random_results(draw):
    algo, structure = draw(st.sampled_from(CASES))
    ev, dirs = _setup(algo, structure)
    choices = [draw(st.sampled_from(d.choices(ev.cluster, draw(st.integers(0, len(d) - 1))))) for d in dirs]
    plan = Plan(tuple(choices))
    e = ev.evaluate(plan, keep=True)
    status = Status.FEASIBLE if e.feasible else Status.INFEASIBLE
    return Result.scored(ev, plan, status, "random", runtime_s=0.5, evaluation=e, evaluations=1)


def test_random_result_cases_cover_every_structure():
    assert len(CASES) == 6 + 2 + 2 + 2
    assert any(s.ac_sharing for _, s in CASES)


@settings(max_examples=40, deadline=None)
@given(random_results())
def test_any_plan_gives_a_checked_result_that_round_trips(checker, r):
    # the independent checker accepts every lowered, scheduled plan of every structure
    # (memory-infeasible ones with the penalised throughput), and the file round-trips
    text = r.to_json()
    doc = json.loads(text)
    assert checker.check(doc) == []
    assert doc["memory_feasible"] is r.evaluation.feasible
    back = Result.from_json(text)
    assert back.to_json() == text
    assert back.structure == r.structure


# ---------------------------------------------------------------------------- plan entries
@pytest.fixture
def entries(concurrent):
    return copy.deepcopy(concurrent.to_dict()["plan"])


@pytest.fixture(scope="module")
def ev(concurrent):
    return Evaluator(concurrent.workload, concurrent.cluster)


def _entry(entries, name):
    return next(e for e in entries if e["vertex"] == name)


def test_plan_entries_round_trip(ev, entries, concurrent):
    assert plan_from_entries(ev, entries) == concurrent.plan
    # order of the entries does not matter
    assert plan_from_entries(ev, entries[::-1]) == concurrent.plan


def test_odd_pp_is_rejected(ev, entries):
    _entry(entries, "ref_inf").update(pp=3)
    with pytest.raises(ValueError, match=r"'ref_inf' is illegal: P2: pp=3"):
        plan_from_entries(ev, entries)


def test_tp_must_divide_gpus_per_node(ev, entries):
    _entry(entries, "reward_inf").update(tp=3)
    with pytest.raises(ValueError, match=r"'reward_inf' is illegal: P1: tp=3"):
        plan_from_entries(ev, entries)


def test_degrees_must_fill_the_extent(ev, entries):
    _entry(entries, "ref_inf").update(dp=2)  # extent [1, 1, 4] holds 4 GPUs
    with pytest.raises(ValueError, match=r"'ref_inf' is illegal: P6"):
        plan_from_entries(ev, entries)


def test_pp_without_microbatches_is_rejected(ev, entries):
    e = _entry(entries, "actor_train")
    e.update(extent=[1, 1, 4], origin=[0, 0, 0], dp=1, pp=4, tp=1, mb=2)
    with pytest.raises(ValueError, match=r"'actor_train' is illegal: P5: mb=2 must be ≥ pp=4"):
        plan_from_entries(ev, entries)


def test_microbatches_without_pipelining_for_training_and_inference(ev, entries):
    # SPEC §14.2: gradient accumulation, 1 ≤ mb ≤ B_local (B·R/dp = 64/4 = 16 here)
    train, ref = _entry(entries, "actor_train"), _entry(entries, "ref_inf")
    assert (train["dp"], train["pp"], ref["dp"], ref["pp"]) == (4, 1, 4, 1)
    train["mb"], ref["mb"] = 16, 3  # 3 does not divide 16: allowed (the last one is smaller)
    plan = plan_from_entries(ev, entries)
    assert [plan.choices[ev.graph.index[n]].strategy.mb for n in ("actor_train", "ref_inf")] == [16, 3]
    train["mb"] = 17
    with pytest.raises(ValueError, match=r"'actor_train' is illegal: P4: mb=17 exceeds B_local=16"):
        plan_from_entries(ev, entries)


def test_a_generation_without_pipelining_keeps_one_microbatch(ev, entries):
    _entry(entries, "actor_gen")["mb"] = 2
    with pytest.raises(ValueError, match=r"'actor_gen' is illegal: P4: a generation with pp=1 requires mb=1"):
        plan_from_entries(ev, entries)


def test_misaligned_origin_is_rejected(ev, entries):
    e = _entry(entries, "critic_inf")
    e.update(extent=[1, 1, 2], dp=2, pp=1, tp=1, mb=1, origin=[0, 1, 1])
    with pytest.raises(ValueError, match=r"'critic_inf'.*not aligned.*P7"):
        plan_from_entries(ev, entries)


def test_origin_outside_the_cluster_is_rejected(ev, entries):
    _entry(entries, "critic_train").update(origin=[0, 2, 0])
    with pytest.raises(ValueError, match=r"'critic_train'.*leaves the cluster"):
        plan_from_entries(ev, entries)


def test_unknown_vertex_is_rejected(ev, entries):
    entries.append({**entries[0], "vertex": "value_head"})
    with pytest.raises(ValueError, match=r"unknown vertex 'value_head'"):
        plan_from_entries(ev, entries)


@pytest.mark.parametrize("field", ["origin", "extent", "dp", "pp", "tp", "mb"])
def test_missing_field_is_named(ev, entries, field):
    del _entry(entries, "reward_inf")[field]
    with pytest.raises(ValueError, match=rf"'reward_inf': missing field '{field}'"):
        plan_from_entries(ev, entries)


def test_missing_vertex_is_named(ev, entries):
    entries = [e for e in entries if e["vertex"] != "critic_train"]
    with pytest.raises(ValueError, match=r"no entry for vertex.*critic_train"):
        plan_from_entries(ev, entries)


@pytest.mark.parametrize("bad", ["actor_gen", 3, None])
def test_entry_that_is_not_an_object_is_a_value_error(ev, entries, bad):
    entries[0] = bad
    with pytest.raises(ValueError):
        plan_from_entries(ev, entries)


def test_duplicate_entries_for_a_vertex_are_rejected(ev, entries):
    entries.append({**_entry(entries, "reward_inf"), "origin": [0, 0, 0]})
    with pytest.raises(ValueError, match="reward_inf"):
        plan_from_entries(ev, entries)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dp", 4.7),  # not truncated to 4
        ("dp", "four"),
        ("mb", True),
        ("origin", None),
        ("origin", [0, 0]),
        ("extent", [1, 1, 4.0]),
    ],
)
def test_malformed_field_is_a_value_error_naming_vertex_and_field(ev, entries, field, value):
    _entry(entries, "ref_inf")[field] = value
    with pytest.raises(ValueError, match=rf"'ref_inf'.*'{field}'"):
        plan_from_entries(ev, entries)


# ---------------------------------------------------------------------------- engine fields (SPEC §14)
@pytest.mark.parametrize(
    ("vertex", "field", "value", "kind"),
    [
        ("actor_train", "zero", "3", "int"),
        ("actor_train", "zero", 3.0, "int"),
        ("ref_inf", "zero", True, "int"),
        ("actor_gen", "mem_fraction", "0.5", "float"),
        ("actor_gen", "mem_fraction", True, "float"),
        ("ref_inf", "logits_chunk", 4096.0, "int"),
        ("critic_train", "packing", 0, "bool"),
        ("critic_train", "packing", "false", "bool"),
    ],
)
def test_a_wrong_typed_engine_field_names_vertex_and_field(
    concurrent, ev, entries, vertex, field, value, kind
):
    _entry(entries, vertex)[field] = value
    want = rf"plan entry for '{vertex}': field '{field}' must be {kind}, got {re.escape(repr(value))}"
    with pytest.raises(ValueError, match=want):
        plan_from_entries(ev, entries)
    doc = concurrent.to_dict()
    doc["plan"] = entries
    with pytest.raises(InputError, match=want) as info:
        Result.from_dict(doc, source="r.json")
    assert str(info.value).startswith("r.json: ") and info.value.field == "plan"


def test_null_engine_fields_read_as_their_defaults(ev, entries):
    for e in entries:
        e.update(dict.fromkeys(ENGINE_FIELDS))
    for c in plan_from_entries(ev, entries).choices:
        s = c.strategy
        assert (s.zero, s.mem_fraction, s.logits_chunk, s.packing) == (2, 0.0, 0, True)


def _as_v1(doc: dict) -> dict:
    """``doc`` as an ``rpeg.result/1`` file: no engine field in the plan entries and none of
    SPEC §14's fields in the workload block."""
    doc["format"] = "rpeg.result/1"
    for key in WORKLOAD_V2_FIELDS:
        del doc["workload"][key]
    for e in doc["plan"]:
        for key in ENGINE_FIELDS:
            del e[key]
    return doc


def test_a_v1_file_reads_with_the_defaults(concurrent, tmp_path):
    # the concurrent plan chose engine variants, which a /1 file cannot say
    assert any(c.strategy.zero != 2 or c.strategy.mem_fraction for c in concurrent.plan.choices)
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(_as_v1(concurrent.to_dict())))
    back = Result.from_json(path)
    w = back.workload
    assert (w.reward, w.reward_cost_s, w.kl_coef, w.old_logprob, w.mini_batches) == (
        "model",
        0.0,
        0.01,
        "rollout",
        1,
    )
    assert back.graph.vertices == concurrent.graph.vertices
    for mine, theirs in zip(back.plan.choices, concurrent.plan.choices):
        s, t = mine.strategy, theirs.strategy
        assert (s.zero, s.mem_fraction, s.logits_chunk, s.packing) == (2, 0.0, 0, True)
        assert (s.extent, s.dp, s.pp, s.tp, s.mb, s.recompute) == (
            t.extent,
            t.dp,
            t.pp,
            t.tp,
            t.mb,
            t.recompute,
        )
        assert mine.allocation == theirs.allocation
    # re-scored under the current model (real tokens) and written as /2 with the defaults spelled out
    assert back.throughput == pytest.approx(back.k_eval * TINY_REAL_TOKENS / back.makespan, rel=1e-12)
    text = back.to_json()
    doc = json.loads(text)
    assert doc["format"] == "rpeg.result/2"
    assert [(e["zero"], e["mem_fraction"], e["logits_chunk"], e["packing"]) for e in doc["plan"]] == [
        (2, 0.0, 0, True)
    ] * len(doc["plan"])
    assert Result.from_json(text).to_json() == text


# a choice of every engine field, on every role that may make it (legal: Z1–Z2, P4–P5)
V2_CHOICES: dict[str, dict] = {
    "actor_gen": {"mem_fraction": 0.5},
    "ref_inf": {"zero": 3, "logits_chunk": 2048},
    "reward_inf": {"packing": False},
    "actor_train": {"zero": 1, "logits_chunk": 4096, "packing": False, "recompute": "selective", "mb": 4},
    "critic_train": {"zero": 2, "mb": 2},
}


@pytest.fixture(scope="module")
def with_engine_choices(concurrent):
    doc = concurrent.to_dict()
    for e in doc["plan"]:
        e.update(V2_CHOICES.get(e["vertex"], {}))
    return Result.from_dict(doc)


def test_engine_fields_round_trip(concurrent, with_engine_choices, tmp_path, checker):
    r = with_engine_choices
    got = {v.name: c.strategy for v, c in zip(r.graph.vertices, r.plan.choices)}
    assert got["actor_gen"].mem_fraction == 0.5
    assert (got["ref_inf"].zero, got["ref_inf"].logits_chunk) == (3, 2048)
    assert got["reward_inf"].packing is False
    t = got["actor_train"]
    assert (t.zero, t.logits_chunk, t.packing, t.recompute, t.mb) == (1, 4096, False, Recompute.SELECTIVE, 4)
    assert got["critic_inf"] == concurrent.plan.choices[r.graph.index["critic_inf"]].strategy
    path = tmp_path / "v2.json"
    text = r.to_json(path)
    written = json.loads(text)
    assert written["format"] == "rpeg.result/2"
    for e in written["plan"]:
        for key, value in V2_CHOICES.get(e["vertex"], {}).items():
            assert e[key] == value and type(e[key]) is type(value), (e["vertex"], key, e[key])
    again = Result.from_json(path)
    assert again.plan == r.plan and again.to_json() == text
    assert checker.check(written) == []
    # scored, not only carried: time and memory are not the plain plan's
    assert r.makespan != concurrent.makespan
    assert r.evaluation.memory.max_peak != concurrent.evaluation.memory.max_peak


def test_summary_shows_tokens_per_microbatch_and_engine_choices(with_engine_choices):
    r = with_engine_choices
    lines = r.summary().splitlines()
    (header,) = [line for line in lines if line.startswith("invocation")]
    assert re.search(r"\bmb\s+tok/mb\s+engine choices\s+time/step s$", header), header
    assert "recompute" not in header
    rows = {line.split()[0]: line for line in lines[lines.index(header) + 2 :]}
    assert set(rows) == {v.name for v in r.graph.vertices}
    expected = {
        "actor_gen": "kv u=0.5",
        "ref_inf": "zero-3 chunk=2048",
        "reward_inf": "replicated padded",
        "critic_inf": "replicated",
        "actor_train": "rc=selective zero-1 chunk=4096 padded",
        "critic_train": "rc=none zero-2",
    }
    for v, c in zip(r.graph.vertices, r.plan.choices):
        s, row = c.strategy, rows[v.name]
        if v.role is Role.GENERATION:
            tokens = "-"
        else:
            # T_mb = B_local·ℓ/mb, ℓ = Lp + Ē packed (78.4 here), Lp + Lr padded
            ell = 128 + (78.4 if s.packing else 256)
            tokens = f"{v.sequences / (s.dp * s.mb) * ell:,.0f}"
        assert re.search(rf" {s.mb} +{re.escape(tokens)} {re.escape(expected[v.name])} +[0-9.]+$", row), row
    plain = Result.from_dict(_as_v1(r.to_dict())).summary()
    # a /1 file's generation runs at the hardware's memory fraction
    assert f"kv u={r.cluster.hardware.kv_memory_fraction:g} " in plain


# ---------------------------------------------------------------------------- result_for_plan
def _table(result: Result) -> dict[str, tuple]:
    """``result``'s plan as a :func:`result_for_plan` table: the 6 layout items, the recomputation
    (``None`` but for training) and a mapping of the engine choices."""
    table = {}
    for v, c in zip(result.graph.vertices, result.plan.choices):
        s, a = c.strategy, c.allocation
        rc = s.recompute.value if v.role is Role.TRAINING else None
        engine = {key: getattr(s, key) for key in ENGINE_FIELDS}
        table[v.name] = (a.origin, a.extent, s.dp, s.pp, s.tp, s.mb, rc, engine)
    return table


def _hand(result: Result, table: dict[str, tuple]) -> Result:
    return result_for_plan(result.workload, result.cluster, result.structure, table, k_eval=result.k_eval)


def test_result_for_plan_takes_the_engine_choices(with_engine_choices):
    r = with_engine_choices
    hand = _hand(r, _table(r))
    assert hand.plan == r.plan
    assert hand.throughput == r.throughput
    # without the 8th item, the defaults
    table = {name: row[:7] for name, row in _table(r).items()}
    plain = _hand(r, table)
    for c in plain.plan.choices:
        s = c.strategy
        assert (s.zero, s.mem_fraction, s.logits_chunk, s.packing) == (2, 0.0, 0, True)


def test_result_for_plan_accepts_gradient_accumulation_that_reads_back(concurrent, checker):
    table = _table(concurrent)
    origin, extent, dp, pp, tp, _, rc, engine = table["actor_train"]
    assert pp == 1
    table["actor_train"] = (origin, extent, dp, pp, tp, 4, rc, engine)  # SPEC §4's P4 refused it
    hand = _hand(concurrent, table)
    s = hand.plan.choices[hand.graph.index["actor_train"]].strategy
    assert (s.pp, s.mb) == (1, 4)
    text = hand.to_json()
    back = Result.from_json(text)
    assert back.plan == hand.plan and back.throughput == hand.throughput
    assert checker.check(json.loads(text)) == []


REFUSED = [
    ("actor_gen", {"mb": 2}, "P4: a generation with pp=1 requires mb=1"),
    ("actor_train", {"mb": 17}, "P4: mb=17 exceeds B_local=16"),
    ("actor_train", {"extent": (1, 1, 4), "origin": (0, 0, 0), "dp": 1, "pp": 4, "tp": 1, "mb": 2}, "P5: mb=2 must be ≥ pp=4"),
    ("actor_gen", {"zero": 3}, "Z1: zero=3 is not a ZeRO stage generation may use (2)"),
    ("ref_inf", {"zero": 1}, "Z1: zero=1 is not a ZeRO stage inference may use (2, 3)"),
    ("actor_train", {"mem_fraction": 0.5}, "Z2: mem_fraction=0.5 is a rollout engine's"),
    ("actor_gen", {"logits_chunk": 4096}, "Z2: a generation neither chunks a loss nor pads"),
    ("actor_gen", {"packing": False}, "Z2: a generation neither chunks a loss nor pads"),
    ("ref_inf", {"pp": 3}, "P2: pp=3 must divide layers=32 and be 1 or even"),
]  # fmt: skip


@pytest.mark.parametrize(("vertex", "change", "rule"), REFUSED, ids=[f"{c[0]}-{c[2][:2]}" for c in REFUSED])
def test_result_for_plan_refuses_what_the_reader_refuses(concurrent, vertex, change, rule):
    table = _table(concurrent)
    origin, extent, dp, pp, tp, mb, rc, engine = table[vertex]
    row = {"origin": origin, "extent": extent, "dp": dp, "pp": pp, "tp": tp, "mb": mb}
    engine = dict(engine)
    for key, value in change.items():
        (engine if key in ENGINE_FIELDS else row)[key] = value
    table[vertex] = (*row.values(), rc, engine)
    want = rf"plan entry for '{vertex}' is illegal: {re.escape(rule)}"
    with pytest.raises(ValueError, match=want):
        _hand(concurrent, table)
    # the reader refuses the same entry in the same words
    doc = concurrent.to_dict()
    e = next(x for x in doc["plan"] if x["vertex"] == vertex)
    e.update({k: list(v) if isinstance(v, tuple) else v for k, v in change.items()})
    with pytest.raises(InputError, match=want):
        Result.from_dict(doc)


def test_result_for_plan_names_a_wrong_typed_engine_field(concurrent):
    table = _table(concurrent)
    *row, engine = table["actor_train"]
    table["actor_train"] = (*row, {**engine, "zero": "3"})
    with pytest.raises(ValueError, match=r"plan entry for 'actor_train': field 'zero' must be int, got '3'"):
        _hand(concurrent, table)


@pytest.mark.parametrize("tau", [5, 1000])
def test_a_staleness_the_workload_does_not_allow_is_refused_by_builder_and_reader(concurrent, tau):
    # issue 33: the workload allows τ ∈ {0, 1}; the reader scored τ = 5 or 1000 all the same
    assert concurrent.workload.staleness["actor"] == (0, 1)
    want = rf"structure\.staleness\.actor is {tau}, but the workload allows \[0, 1\]"
    stale = dataclasses.replace(concurrent.structure, staleness=(("actor", tau), ("critic", 0)))
    with pytest.raises(ValueError, match=want):
        result_for_plan(concurrent.workload, concurrent.cluster, stale, _table(concurrent), k_eval=2)
    doc = concurrent.to_dict()
    doc["structure"]["staleness"]["actor"] = tau
    with pytest.raises(InputError, match=rf"field 'structure': {want}"):
        Result.from_dict(doc)
    # a staleness the workload allows reads and builds
    doc["structure"]["staleness"]["actor"] = 1
    assert Result.from_dict(doc).structure.tau == {"actor": 1, "critic": 0}
    allowed = dataclasses.replace(concurrent.structure, staleness=(("actor", 1), ("critic", 0)))
    assert result_for_plan(concurrent.workload, concurrent.cluster, allowed, _table(concurrent)).feasible


def test_sharing_the_workload_does_not_allow_is_refused(concurrent):
    workload = dataclasses.replace(concurrent.workload, ac_sharing=False)
    shared = dataclasses.replace(concurrent.structure, ac_sharing=True, staleness=(("actor_critic", 0),))
    with pytest.raises(ValueError, match=r"structure\.ac_sharing is true, but the workload does not allow"):
        result_for_plan(workload, concurrent.cluster, shared, {})


def test_an_unknown_key_is_refused_by_builder_and_reader(concurrent):
    # issue 33: a misspelt "recomput" was ignored and the entry scored with recompute = "full"
    doc = concurrent.to_dict()
    entry = next(e for e in doc["plan"] if e["vertex"] == "actor_train")
    entry["recomput"] = entry.pop("recompute")
    with pytest.raises(
        InputError, match=r"plan entry for 'actor_train': unknown key 'recomput', did you mean 'recompute'\?"
    ):
        Result.from_dict(doc)
    table = _table(concurrent)
    *row, engine = table["actor_train"]
    table["actor_train"] = (*row, {**engine, "zer": 3})
    with pytest.raises(
        ValueError, match=r"'actor_train': unknown engine choice 'zer', did you mean 'zero'\?"
    ):
        _hand(concurrent, table)
    table = {**_table(concurrent), "actor_trian": _table(concurrent)["actor_train"]}
    with pytest.raises(ValueError, match=r"table: unknown vertex 'actor_trian'"):
        _hand(concurrent, table)


@pytest.mark.parametrize(
    ("block", "key", "hint"),
    [("workload", "kl_coeff", "kl_coef"), ("cluster", "host_ofload", "host_offload"), ("structure", "acsharing", "ac_sharing")],
)  # fmt: skip
def test_an_unknown_key_in_a_block_is_refused(concurrent, block, key, hint):
    doc = concurrent.to_dict()
    doc[block][key] = 0.0
    with pytest.raises(InputError, match=rf"unknown key '{key}' in \[{block}\], did you mean '{hint}'\?"):
        Result.from_dict(doc)


def test_the_cluster_copies_of_hardware_figures_must_agree(concurrent):
    doc = concurrent.to_dict()
    doc["cluster"]["gpu_memory_bytes"] = 1e9
    with pytest.raises(
        InputError, match=r"field 'cluster\.gpu_memory_bytes' is 1000000000\.0 but cluster\.hardware"
    ):
        Result.from_dict(doc)


def test_the_writer_refuses_nan_and_infinity(concurrent, tmp_path):
    # issue 33: makespan NaN and throughput Infinity were written into the result file
    path = tmp_path / "r.json"
    for edit, field in [
        (lambda r: setattr(r, "objective_bound", float("nan")), "objective_bound"),
        (lambda r: r.extra.update(model_throughput=float("inf")), "extra.model_throughput"),
        (
            lambda r: setattr(r, "evaluation", dataclasses.replace(r.evaluation, makespan=float("nan"))),
            "makespan",
        ),
    ]:
        r = copy.copy(concurrent)
        r.extra = dict(concurrent.extra)
        edit(r)
        with pytest.raises(
            ValueError, match=rf"field '{re.escape(field)}' is (nan|inf).*finite numbers only"
        ):
            r.to_json(path)
        assert not path.exists()


# ---------------------------------------------------------------------------- constructors, statuses
@pytest.mark.parametrize(
    ("status", "headline"),
    [
        (Status.INFEASIBLE, "NO FEASIBLE PLAN: "),
        (Status.TIME_LIMIT, "NO FEASIBLE PLAN: "),
        (Status.UNKNOWN, "NO PLAN (the engine ended with status unknown): "),
        (Status.ERROR, "NO PLAN (the engine failed): "),
    ],
)
def test_every_planless_status_is_written_read_and_checked(ev, checker, status, headline):
    r = Result.infeasible(ev, "cpsat", "why there is none", runtime_s=0.25, status=status)
    assert (r.plan, r.evaluation, r.status, r.k_eval) == (None, None, status, ev.k_eval)
    text = r.to_json()
    doc = json.loads(text)
    assert doc["status"] == status.value and doc["plan"] == [] and doc["nodes"] == []
    assert checker.check(doc) == []
    back = Result.from_json(text)
    assert back.status is status and back.to_json() == text
    assert f"{headline}why there is none" in r.summary().splitlines()[-1]


@pytest.mark.parametrize("status", [Status.OPTIMAL, Status.FEASIBLE])
def test_a_planless_result_cannot_claim_a_plan(ev, status):
    with pytest.raises(ValueError, match=f"without a plan cannot have status '{status.value}'"):
        Result.infeasible(ev, "greedy", "none", runtime_s=0.0, status=status)


def test_scored_carries_the_evaluators_problem(ev, concurrent):
    r = Result.scored(ev, concurrent.plan, Status.OPTIMAL, "x", runtime_s=1.5, objective_bound=2.0)
    assert (r.workload, r.cluster, r.structure, r.graph, r.k_eval) == (
        ev.workload,
        ev.cluster,
        ev.structure,
        ev.graph,
        ev.k_eval,
    )
    assert r.evaluation is not None and r.throughput == concurrent.throughput
    assert (r.runtime_s, r.objective_bound, r.evaluations) == (1.5, 2.0, ev.evaluations)


@pytest.mark.parametrize("status", [Status.UNKNOWN, Status.ERROR, Status.INFEASIBLE])
def test_a_fitting_plan_cannot_say_there_is_none(ev, concurrent, status):
    with pytest.raises(ValueError, match=f"with a plan cannot have status '{status.value}'"):
        Result.scored(ev, concurrent.plan, status, "x", runtime_s=0.0)


def test_a_plan_that_does_not_fit_may_be_scored_infeasible(tiny_ppo, cluster_1x2x4, concurrent):
    small = Cluster(*cluster_1x2x4.shape, dataclasses.replace(cluster_1x2x4.hardware, gpu_memory_bytes=20e9))
    ev = Evaluator(tiny_ppo, small)
    r = Result.scored(ev, concurrent.plan, Status.INFEASIBLE, "evaluate", runtime_s=0.0)
    assert r.plan is not None and not r.feasible and "DOES NOT FIT" in r.summary()


def test_summary_names_each_model_with_its_experts():
    """The summary's models line: parameters of each model; a mixture of experts also its active
    parameters and experts per token, latent attention said, a sliding window's width and layers
    (SPEC §15.1)."""
    from rpeg import Cluster, Workload, hardware_preset, model_preset, solve

    moe, mla = model_preset("qwen3-30b-a3b"), model_preset("deepseek-v3")
    wl = Workload("grpo", {"actor": moe, "reward": model_preset("llama3.1-8b")}, 64, 8, 512, 2048)
    lines = solve(wl, Cluster.from_shape("1x1x8", hardware_preset("h100")), "greedy").summary().splitlines()
    (line,) = [x for x in lines if x.startswith("models")]
    assert "actor qwen3-30b-a3b 30.5B (3.4B active: 8 of 128 experts per token, load imbalance 1.2)" in line
    assert "reward llama3.1-8b 8.0B;" in line or line.endswith("reward llama3.1-8b 8.0B")
    dsv3 = Workload("grpo", {"actor": mla}, 64, 4, 512, 1024, reward="rule", kl_coef=0.0)
    planless = solve(dsv3, Cluster.from_shape("1x1x8", hardware_preset("h100")), "greedy")
    assert (
        "actor deepseek-v3 671.0B (37.6B active: 8 of 256 experts per token, load imbalance 1.2) latent attention"
        in planless.summary()
    )
    oss = Workload(
        "grpo", {"actor": model_preset("gpt-oss-20b")}, 16, 4, 512, 1024, reward="rule", kl_coef=0.0
    )
    summary = solve(oss, Cluster.from_shape("1x1x8", hardware_preset("h100")), "greedy").summary()
    assert (
        "actor gpt-oss-20b 20.9B (4.2B active: 4 of 32 experts per token, load imbalance 1.2) 128-token window on 12 of 24 layers"
        in summary
    )
    # a precision other than BF16 is said; BF16, the default, is not
    fp8 = dataclasses.replace(model_preset("llama3.1-8b"), precision="fp8")
    wl8 = Workload("grpo", {"actor": fp8}, 16, 4, 512, 1024, reward="rule", kl_coef=0.0)
    summary8 = solve(wl8, Cluster.from_shape("1x1x8", hardware_preset("h100")), "greedy").summary()
    assert "actor llama3.1-8b 8.0B FP8 GEMMs" in summary8 and "GEMMs" not in summary
    # MXFP4 experts are no GEMM precision: said as what they are
    mx = dataclasses.replace(model_preset("gpt-oss-20b"), precision="mxfp4")
    wlm = Workload("grpo", {"actor": mx}, 16, 4, 512, 1024, reward="rule", kl_coef=0.0)
    summarym = solve(wlm, Cluster.from_shape("1x1x8", hardware_preset("h100")), "greedy").summary()
    assert "layers MXFP4 experts in generation" in summarym and "GEMMs" not in summarym


def test_summary_says_how_the_rollout_engine_schedules():
    """The cluster line says whether the hardware's rollout engine schedules asynchronously (the
    GPU presets, vLLM's default) or on the synchronous loop; hardware without an engine step (a
    calibrated CPU file) says nothing of it."""
    from rpeg import Cluster, Workload, hardware_preset, model_preset, solve

    wl = Workload("grpo", {"actor": model_preset("qwen2.5-7b")}, 16, 4, 512, 1024, reward="rule", kl_coef=0.0)
    h100 = hardware_preset("h100")
    sync = h100.with_rollout_scheduling(False)

    def cluster_line(hw):
        lines = solve(wl, Cluster.from_shape("1x1x8", hw), "greedy").summary().splitlines()
        (line,) = [x for x in lines if x.startswith("cluster")]
        return line

    assert cluster_line(h100).endswith("GiB each; rollout engine: asynchronous scheduling)")
    assert cluster_line(sync).endswith("GiB each; rollout engine: synchronous loop)")
    assert "rollout engine" not in cluster_line(hardware_preset("cpu"))

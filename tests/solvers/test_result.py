"""Tests for ``solvers/result.py``: the :class:`Result` (its constructors and summary), the
``rpeg.result/1`` round trip, the statuses a planless result may have, and plan validation."""

from __future__ import annotations

import copy
import dataclasses
import json
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpeg import Cluster, Workload, example_names, hardware_preset, model_preset
from rpeg.ir import Plan, structures
from rpeg.scoring.candidates import build_directories
from rpeg.scoring.evaluator import Evaluator
from rpeg.solvers import Result, Status, solve
from rpeg.solvers.result import plan_from_entries


@pytest.fixture(scope="module")
def concurrent(tiny_ppo, cluster_1x2x4):
    return solve(tiny_ppo, cluster_1x2x4, method="concurrent")


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
    assert doc["format"] == "rpeg.result/1"
    assert doc["throughput"] == concurrent.throughput
    assert len(doc["nodes"]) > 0
    assert Result.from_json(path).to_json() == text


def test_from_json_rejects_another_format(concurrent):
    doc = concurrent.to_dict()
    doc["format"] = "rpeg.result/0"
    with pytest.raises(ValueError, match="format"):
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
def ev(tiny_ppo, cluster_1x2x4):
    return Evaluator(tiny_ppo, cluster_1x2x4)


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
    with pytest.raises(ValueError, match=r"'actor_train' is illegal: P5"):
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

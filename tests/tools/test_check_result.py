"""Tests for ``tests/tools/check_result.py``, the independent checker of ``rpeg.result/1`` and
``rpeg.result/2`` files.

A small valid result is built by hand (1×1×4 cluster, a generation vertex split into three
response-length phases feeding an inference vertex through COMM nodes, two steps), as a ``/1``
file (padded tokens, SPEC §4's microbatch rules for every role) and as a ``/2`` file (real
tokens, SPEC §14's microbatches for training and inference and the engine fields Z1–Z2); each
must pass with no violation; each test then corrupts one thing and asserts that the matching
check names it. Property tests compare the device-exclusivity sweep with a brute-force pairwise test on
random list schedules.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

_PATH = Path(__file__).with_name("check_result.py")
_spec = importlib.util.spec_from_file_location("rpeg_check_result", _PATH)
assert _spec is not None and _spec.loader is not None
cr = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = cr
_spec.loader.exec_module(cr)

GEN, INF = "actor_gen", "ref_inf"
DURATIONS = {("op", GEN): (1.0, 0.8, 0.6), ("comm", INF): (0.1,) * 3, ("op", INF): (0.5,) * 3}


def _schedule(nodes: list[dict[str, Any]], durations: dict[int, float]) -> None:
    """List-schedule ``nodes`` in list order (which must be topological), in place."""
    finish: dict[int, float] = {}
    free: dict[int, float] = {}
    for node in nodes:
        start = max([finish[p] for p in node["preds"]] + [free.get(d, 0.0) for d in node["devices"]])
        node["start"] = start
        node["finish"] = start + durations[node["id"]]
        finish[node["id"]] = node["finish"]
        for d in node["devices"]:
            free[d] = node["finish"]


def make_result() -> dict[str, Any]:
    """A valid ``rpeg.result/1`` object on a 1×1×4 cluster with ``k_eval = 2``.

    ``actor_gen`` (dp=2) runs on GPUs 0–1 in three phases; each phase's output goes through a
    COMM node to ``ref_inf`` (pp=2, mb=2) on GPUs 2–3, itself split in three phases.
    """
    k_eval, B, R, Lp, Lr = 2, 16, 2, 8, 24
    alloc = {GEN: [0, 1], INF: [2, 3]}
    nodes: list[dict[str, Any]] = []
    durations: dict[int, float] = {}

    def add(kind: str, vertex: str, step: int, phase: int, preds: list[int], **extra: Any) -> int:
        node_id = len(nodes)
        nodes.append(
            {
                "id": node_id,
                "kind": kind,
                "vertex": vertex,
                "step": step,
                "phase": phase,
                "devices": list(alloc[vertex]),
                "start": 0.0,
                "finish": 0.0,
                "preds": preds,
                **extra,
            }
        )
        durations[node_id] = DURATIONS[(kind, vertex)][phase - 1]
        return node_id

    last_gen: int | None = None
    for step in range(k_eval):
        last_inf: int | None = None
        for phase in (1, 2, 3):
            gen = add("op", GEN, step, phase, [] if last_gen is None else [last_gen])
            comm = add("comm", INF, step, phase, [gen], source=GEN, bytes=4096.0 * phase)
            inf = add("op", INF, step, phase, [comm] + ([] if last_inf is None else [last_inf]))
            last_gen, last_inf = gen, inf
    _schedule(nodes, durations)
    makespan = max(n["finish"] for n in nodes)
    busy = sum((n["finish"] - n["start"]) * len(n["devices"]) for n in nodes)
    return {
        "format": "rpeg.result/1",
        "workload": {
            "algorithm": "grpo",
            "B": B,
            "R": R,
            "Lp": Lp,
            "Lr": Lr,
            "quantiles": [[0.5, 6], [0.85, 12], [1.0, 24]],
        },
        "models": {
            "actor": {"layers": 4, "hidden": 64, "params": 1_000_000, "trainable": True},
            "reference": {"layers": 4, "hidden": 64, "params": 1_000_000, "trainable": False},
        },
        "cluster": {
            "racks": 1,
            "nodes_per_rack": 1,
            "gpus_per_node": 4,
            "gpu_memory_bytes": 80e9,
            "memory_headroom": 0.1,
            "hardware": {"name": "test", "hbm_bandwidth": 3.35e12},
        },
        "structure": {"algorithm": "grpo", "ac_sharing": False, "staleness": {"actor": 1}},
        "vertices": [
            {"name": GEN, "role": "generation", "model": "actor"},
            {"name": INF, "role": "inference", "model": "reference"},
        ],
        "k_eval": k_eval,
        "plan": [
            {
                "vertex": GEN,
                "origin": [0, 0, 0],
                "extent": [1, 1, 2],
                "dp": 2,
                "pp": 1,
                "tp": 1,
                "mb": 1,
            },
            {
                "vertex": INF,
                "origin": [0, 0, 2],
                "extent": [1, 1, 2],
                "dp": 1,
                "pp": 2,
                "tp": 1,
                "mb": 2,
            },
        ],
        "nodes": nodes,
        "makespan": makespan,
        "throughput": k_eval * B * R * (Lp + Lr) / makespan,
        "utilization": busy / (4 * makespan),
        "peak_memory": [30e9, 30e9, 41e9, 41e9],
        "memory_feasible": True,
        "method": "greedy",
        "status": "feasible",
        "objective_bound": None,
        "runtime_s": 0.01,
        "evaluations": 1,
    }


# Ē of the quantiles [[0.5, 6], [0.85, 12], [1.0, 24]]: 0.5·(0+6)/2 + 0.35·(6+12)/2 + 0.15·(12+24)/2
MEAN_RESPONSE = 7.35
REAL_TOKENS = 2 * 16 * 2 * (8 + MEAN_RESPONSE)  # k_eval·B·R·(Lp + Ē) = 982.4
PADDED_TOKENS = 2 * 16 * 2 * (8 + 24)  # k_eval·B·R·(Lp + Lr) = 2048


def make_result_v2() -> dict[str, Any]:
    """:func:`make_result` as a valid ``rpeg.result/2`` object: the §14 workload fields, the
    engine fields in every plan entry (``ref_inf`` on ZeRO-3 with a chunked loss, padded) and
    the throughput over real tokens."""
    result = make_result()
    result["format"] = "rpeg.result/2"
    result["workload"].update(
        reward="model", reward_cost_s=0.0, kl_coef=0.01, old_logprob="rollout", mini_batches=1
    )
    entry(result, GEN).update(recompute=None, zero=2, mem_fraction=0.9, logits_chunk=0, packing=True)
    entry(result, INF).update(recompute=None, zero=3, mem_fraction=0.0, logits_chunk=4096, packing=False)
    result["throughput"] = REAL_TOKENS / result["makespan"]
    return result


@pytest.fixture
def result() -> dict[str, Any]:
    return make_result()


@pytest.fixture
def result_v2() -> dict[str, Any]:
    return make_result_v2()


def node(result: dict[str, Any], kind: str, vertex: str, step: int, phase: int) -> dict[str, Any]:
    """The unique node with these attributes."""
    (found,) = [
        n
        for n in result["nodes"]
        if (n["kind"], n["vertex"], n["step"], n["phase"]) == (kind, vertex, step, phase)
    ]
    return found


def entry(result: dict[str, Any], vertex: str) -> dict[str, Any]:
    (found,) = [e for e in result["plan"] if e["vertex"] == vertex]
    return found


def assert_reports(result: dict[str, Any], tag: str, *keywords: str) -> list[str]:
    """Assert some violation carries ``[tag]`` and every keyword; return the violations."""
    errors = cr.check(result)
    hits = [e for e in errors if e.startswith(f"[{tag}]") and all(k in e for k in keywords)]
    assert hits, f"no [{tag}] violation with {keywords} in {errors}"
    return errors


# ---------------------------------------------------------------------------------------------
# The valid result
# ---------------------------------------------------------------------------------------------


def test_valid_result_passes(result: dict[str, Any]) -> None:
    assert cr.check(result) == []


def test_valid_v2_result_passes(result_v2: dict[str, Any]) -> None:
    assert cr.check(result_v2) == []
    for fn in cr.CHECKS:
        assert fn(result_v2) == [], fn.__name__


def test_valid_result_passes_after_json_round_trip(result: dict[str, Any]) -> None:
    assert cr.check(json.loads(json.dumps(result))) == []


def test_every_check_is_clean_on_valid_result(result: dict[str, Any]) -> None:
    for fn in cr.CHECKS:
        assert fn(result) == [], fn.__name__


def test_checker_uses_standard_library_only() -> None:
    tree = ast.parse(_PATH.read_text(encoding="utf-8"))
    imported = set()
    for stmt in ast.walk(tree):
        if isinstance(stmt, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in stmt.names}
        elif isinstance(stmt, ast.ImportFrom):
            assert stmt.level == 0, "relative import"
            imported.add((stmt.module or "").split(".")[0])
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_flat_devices_follow_spec_numbering() -> None:
    # flat id = ((r·Nn) + n)·Ng + g on a 2×2×4 cluster
    assert cr.flat_devices([1, 0, 0], [1, 2, 4], (2, 2, 4)) == set(range(8, 16))
    assert cr.flat_devices([0, 1, 2], [1, 1, 2], (2, 2, 4)) == {6, 7}


# ---------------------------------------------------------------------------------------------
# 1. Format
# ---------------------------------------------------------------------------------------------


def test_wrong_format_string(result: dict[str, Any]) -> None:
    result["format"] = "rpeg.result/3"
    assert_reports(
        result, "format", "'rpeg.result/3'", "expected one of", "'rpeg.result/1'", "'rpeg.result/2'"
    )


@pytest.mark.parametrize("key", ["nodes", "makespan", "peak_memory", "plan", "objective_bound"])
def test_missing_top_level_key(result: dict[str, Any], key: str) -> None:
    del result[key]
    assert_reports(result, "format", "missing", key)


def test_integer_fields_must_be_integers(result: dict[str, Any]) -> None:
    result["workload"]["B"] = 16.0
    entry(result, INF)["pp"] = True
    errors = assert_reports(result, "format", "workload.B")
    assert any("plan[1].pp" in e for e in errors)


def test_bad_node_fields(result: dict[str, Any]) -> None:
    bad = node(result, "comm", INF, 0, 1)
    del bad["bytes"]
    bad["kind"] = "copy"
    result["nodes"][0]["start"] = float("nan")
    errors = assert_reports(result, "format", "kind")
    assert any("start" in e and "finite" in e for e in errors)


def test_comm_without_bytes(result: dict[str, Any]) -> None:
    del node(result, "comm", INF, 1, 2)["bytes"]
    assert_reports(result, "format", "missing key 'bytes'")


def test_duplicate_node_id(result: dict[str, Any]) -> None:
    result["nodes"][5]["id"] = result["nodes"][4]["id"]
    assert_reports(result, "format", "already used")


def test_node_without_devices(result: dict[str, Any]) -> None:
    node(result, "comm", INF, 0, 2)["devices"] = []
    assert_reports(result, "format", "reserves no device")


def test_bad_quantiles(result: dict[str, Any]) -> None:
    result["workload"]["quantiles"] = [[0.85, 6], [0.5, 12], [0.9, 20]]
    errors = assert_reports(result, "format", "fractions")
    assert any("last fraction" in e for e in errors)
    assert any("last length" in e for e in errors)


def test_vertex_model_must_exist(result: dict[str, Any]) -> None:
    result["vertices"][1]["model"] = "critic"
    assert_reports(result, "format", "critic", "models")


def test_not_an_object() -> None:
    assert cr.check([1, 2, 3]) == ["[format] the result is a list, not a JSON object"]


def test_garbage_never_crashes() -> None:
    garbage: dict[str, Any] = {
        "format": "rpeg.result/1",
        "workload": {"B": "x", "quantiles": "none"},
        "models": [],
        "cluster": {"racks": 0},
        "vertices": [3, {"name": 1}],
        "plan": [{"vertex": "v", "origin": [0], "extent": "big"}, None],
        "nodes": [None, {"id": "a", "preds": [99], "devices": "all"}, {"preds": None}],
        "peak_memory": "lots",
    }
    errors = cr.check(garbage)
    assert errors
    assert not any("could not run" in e for e in errors), errors


def planless(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` turned into a "no feasible plan" file, as a method that found nothing writes."""
    result.update(
        plan=[],
        nodes=[],
        makespan=None,
        throughput=0.0,
        utilization=0.0,
        peak_memory=[],
        memory_feasible=False,
        status="infeasible",
    )
    return result


def test_planless_infeasible_result_passes(result: dict[str, Any]) -> None:
    assert cr.check(planless(result)) == []


def test_planless_result_must_say_infeasible(result: dict[str, Any]) -> None:
    planless(result).update(status="feasible", throughput=10.0)
    errors = assert_reports(result, "format", "status 'infeasible'")
    assert any("throughput = 0" in e for e in errors)


def test_planless_result_may_say_time_limit(result: dict[str, Any]) -> None:
    planless(result).update(status="time_limit")
    assert not [e for e in cr.check(result) if "[format]" in e]


@pytest.mark.parametrize("status", ["unknown", "error"])
def test_planless_result_may_say_unknown_or_error(result: dict[str, Any], status: str) -> None:
    # an exact engine that could not tell, or failed, leaves no plan and says so
    planless(result).update(status=status)
    assert cr.check(result) == []


def test_status_outside_the_vocabulary(result: dict[str, Any]) -> None:
    result["status"] = "great"
    assert_reports(result, "format", "status = 'great' is not one of")
    planless(result).update(status="great")
    assert_reports(result, "format", "must have status 'infeasible'", "'great'")


@pytest.mark.parametrize("status", ["unknown", "error", "infeasible"])
def test_a_fitting_plan_must_not_say_it_has_none(result: dict[str, Any], status: str) -> None:
    result["status"] = status
    assert_reports(result, "format", "a result with a plan must have status", repr(status))


def test_a_plan_that_does_not_fit_may_say_infeasible(result: dict[str, Any]) -> None:
    result["peak_memory"][3] = 72.1e9  # M_eff = 0.9 · 80e9 = 72e9
    result.update(memory_feasible=False, status="infeasible")
    assert cr.check_format(result) == []
    result["status"] = "error"
    assert_reports(result, "format", "a result with a plan must have status", "'error'")


def test_null_makespan_needs_an_empty_plan(result: dict[str, Any]) -> None:
    result["makespan"] = None
    assert_reports(result, "format", "makespan = None")


# ---------------------------------------------------------------------------------------------
# 2. Precedence
# ---------------------------------------------------------------------------------------------


def test_start_before_pred_finishes(result: dict[str, Any]) -> None:
    inf = node(result, "op", INF, 0, 1)
    (comm_id,) = [p for p in inf["preds"]]
    comm = result["nodes"][comm_id]
    inf["start"] = comm["finish"] - 0.05
    assert_reports(result, "precedence", f"node {inf['id']}", "before pred", str(comm_id))


def test_precedence_tolerates_rounding(result: dict[str, Any]) -> None:
    inf = node(result, "op", INF, 0, 1)
    inf["start"] -= 1e-13  # below the 1e-9 relative + 1e-12 absolute tolerance
    assert cr.check_precedence(result) == []


def test_unknown_pred(result: dict[str, Any]) -> None:
    result["nodes"][3]["preds"].append(999)
    assert_reports(result, "precedence", "unknown pred id 999")


def test_pred_cycle(result: dict[str, Any]) -> None:
    first = node(result, "op", GEN, 0, 1)
    last = node(result, "op", GEN, 0, 3)
    first["preds"] = [last["id"]]
    errors = assert_reports(result, "precedence", "cycle")
    (msg,) = [e for e in errors if "cycle" in e]
    # the cycle gen p1 → gen p2 → gen p3 → gen p1 is spelled out
    ids = [node(result, "op", GEN, 0, q)["id"] for q in (1, 2, 3)]
    for node_id in ids:
        assert str(node_id) in msg


def test_self_loop_is_a_cycle(result: dict[str, Any]) -> None:
    result["nodes"][4]["preds"].append(4)
    assert_reports(result, "precedence", "cycle", "4 -> 4")


def test_negative_start_and_reversed_interval(result: dict[str, Any]) -> None:
    result["nodes"][0]["start"] = -1.0
    n = result["nodes"][1]
    n["finish"] = n["start"] - 0.01
    errors = assert_reports(result, "precedence", "< 0")
    assert any("before its start" in e for e in errors)


def test_pred_from_a_later_step(result: dict[str, Any]) -> None:
    late = node(result, "op", GEN, 1, 3)
    early = node(result, "op", INF, 0, 3)
    early["preds"].append(late["id"])
    assert_reports(result, "precedence", "later step")


# ---------------------------------------------------------------------------------------------
# 3. Device exclusivity
# ---------------------------------------------------------------------------------------------


def test_overlap_on_a_device(result: dict[str, Any]) -> None:
    # ref_inf step 0 phase 3 and comm step 1 phase 1 share GPUs 2–3 but have no precedence
    # between them; stretching the first into the second is an overlap and nothing else.
    first = node(result, "op", INF, 0, 3)
    second = node(result, "comm", INF, 1, 1)
    assert first["finish"] < second["start"]
    first["finish"] = second["start"] + 0.5 * (second["finish"] - second["start"])
    assert cr.check_precedence(result) == []
    errors = assert_reports(result, "exclusivity", "device 2", "overlaps")
    assert any("device 3" in e for e in errors)
    assert all(e.startswith("[exclusivity]") for e in errors)


def test_touching_and_zero_length_intervals_do_not_conflict(result: dict[str, Any]) -> None:
    gen = node(result, "op", GEN, 0, 2)
    # a zero-length node in the middle of a busy interval, on the same devices
    result["nodes"].append(
        {
            **gen,
            "id": 100,
            "kind": "reshard",
            "vertex": GEN,
            "start": gen["start"] + 0.1,
            "finish": gen["start"] + 0.1,
            "preds": [],
            "bytes": 0.0,
            "phase": 2,
        }
    )
    assert cr.check_device_exclusivity(result) == []


def test_device_out_of_range(result: dict[str, Any]) -> None:
    result["nodes"][0]["devices"] = [0, 1, 7]
    assert_reports(result, "exclusivity", "outside 0..3")


# ---------------------------------------------------------------------------------------------
# 4. Makespan, 5. Throughput
# ---------------------------------------------------------------------------------------------


def test_wrong_makespan(result: dict[str, Any]) -> None:
    result["makespan"] *= 1.01
    result["throughput"] /= 1.01  # keep the throughput consistent with the reported makespan
    errors = assert_reports(result, "makespan", "max node finish")
    assert not any(e.startswith("[throughput]") for e in errors)


def test_makespan_tolerance(result: dict[str, Any]) -> None:
    result["makespan"] *= 1 + 1e-12
    assert cr.check_makespan(result) == []


def test_wrong_throughput(result: dict[str, Any]) -> None:
    result["throughput"] *= 1.001
    # a /1 file counts padded tokens: Ē is Lr there
    assert_reports(result, "throughput", "k_eval·B·R·(Lp+Ē)/makespan", f"= {PADDED_TOKENS}/")


def test_v2_throughput_counts_real_tokens(result_v2: dict[str, Any]) -> None:
    assert result_v2["throughput"] == REAL_TOKENS / result_v2["makespan"]
    assert cr.check_throughput(result_v2) == []
    result_v2["throughput"] *= 1 + 1e-8  # within the tolerance
    assert cr.check_throughput(result_v2) == []
    # the padded count is wrong in a /2 file
    result_v2["throughput"] = PADDED_TOKENS / result_v2["makespan"]
    assert_reports(result_v2, "throughput", "k_eval·B·R·(Lp+Ē)/makespan", "982.4")
    # and the real count is wrong in a /1 file
    result_v2["throughput"] = REAL_TOKENS / result_v2["makespan"]
    result_v2["format"] = "rpeg.result/1"
    assert_reports(result_v2, "throughput", f"= {PADDED_TOKENS}/")


def test_v2_throughput_follows_the_quantiles(result_v2: dict[str, Any]) -> None:
    # longer responses: Ē = 0.5·(0+12)/2 + 0.35·(12+18)/2 + 0.15·(18+24)/2 = 11.4
    result_v2["workload"]["quantiles"] = [[0.5, 12], [0.85, 18], [1.0, 24]]
    assert_reports(result_v2, "throughput", "k_eval·B·R·(Lp+Ē)/makespan")
    result_v2["throughput"] = 2 * 16 * 2 * (8 + 11.4) / result_v2["makespan"]
    assert cr.check(result_v2) == []


def test_throughput_tolerance(result: dict[str, Any]) -> None:
    result["throughput"] *= 1 + 1e-8
    assert cr.check_throughput(result) == []


def test_penalised_throughput_accepted_only_when_memory_infeasible(
    result: dict[str, Any],
) -> None:
    m_eff = 0.9 * 80e9
    result["peak_memory"][2] = 1.05 * m_eff
    result["memory_feasible"] = False
    raw = result["throughput"]
    result["throughput"] = raw * math.exp(-40 * 0.05)
    assert cr.check(result) == []
    result["memory_feasible"] = True
    errors = assert_reports(result, "throughput", "makespan")
    assert any(e.startswith("[memory]") for e in errors)


# ---------------------------------------------------------------------------------------------
# 6. Plan legality
# ---------------------------------------------------------------------------------------------


def test_tp_not_dividing_gpus_per_node(result: dict[str, Any]) -> None:
    e = entry(result, GEN)
    e.update(dp=1, tp=3, extent=[1, 1, 3])
    assert_reports(result, "plan", "P1", "tp=3")


def test_odd_pp(result: dict[str, Any]) -> None:
    result["models"]["reference"]["layers"] = 6  # 3 | 6, so only the parity rule fails
    entry(result, INF).update(pp=3, mb=3, extent=[1, 1, 4], origin=[0, 0, 0])
    errors = assert_reports(result, "plan", "P2", "odd")
    assert not any("does not divide layers" in e for e in errors)


def test_pp_not_dividing_layers(result: dict[str, Any]) -> None:
    result["models"]["reference"]["layers"] = 6
    entry(result, INF).update(pp=4, mb=4, dp=1, extent=[1, 1, 4], origin=[0, 0, 0])
    assert_reports(result, "plan", "P2", "does not divide layers=6")


def test_dp_not_dividing_batch(result: dict[str, Any]) -> None:
    result["workload"]["R"] = 1
    result["workload"]["B"] = 15
    result["throughput"] = 2 * 15 * 1 * 32 / result["makespan"]
    errors = assert_reports(result, "plan", "P3", "dp=2")
    assert not any(e.startswith("[throughput]") for e in errors)


def test_mb_without_pipeline(result: dict[str, Any]) -> None:
    entry(result, GEN)["mb"] = 2
    assert_reports(result, "plan", "P4")


def test_mb_smaller_than_pp(result: dict[str, Any]) -> None:
    entry(result, INF)["mb"] = 1
    assert_reports(result, "plan", "P5", "mb=1 < pp=2")


def test_microbatches_too_small(result: dict[str, Any]) -> None:
    entry(result, INF)["mb"] = 8  # B_local = 32, 32/8 = 4 < 8
    assert_reports(result, "plan", "P5", "< 8")


def test_mb_not_dividing_local_batch(result: dict[str, Any]) -> None:
    entry(result, INF)["mb"] = 3
    assert_reports(result, "plan", "P5", "does not divide B_local=32")


def test_vertex_sequences_replace_workload_batch(result: dict[str, Any]) -> None:
    # a vertex that processes more sequences than B·R (a ReMax reward inference scores the
    # sampled and the greedy responses): P5 is judged on its own batch
    entry(result, INF)["mb"] = 8  # 32/8 = 4 < 8 on B·R, 64/8 = 8 on the vertex's sequences
    assert_reports(result, "plan", "P5", "< 8")
    result["vertices"][1]["sequences"] = 64
    assert cr.check(result) == []
    result["vertices"][1]["sequences"] = 63
    errors = assert_reports(result, "plan", "P5", "does not divide B_local=63")
    assert not any("B·R" in e for e in errors if e.startswith("[plan]"))


# SPEC §14.2 in a /2 file: training and inference accumulate gradients (1 ≤ mb ≤ B_local,
# pp > 1 ⇒ mb ≥ pp); a generation keeps SPEC §4's P4–P5


@pytest.mark.parametrize("mb", [2, 3, 8, 32])
def test_v2_inference_microbatches_need_only_mb_at_least_pp(result_v2: dict[str, Any], mb: int) -> None:
    entry(result_v2, INF)["mb"] = mb  # B_local = 32; 3 ∤ 32 and 32/8 < 8 break §4's P5
    assert cr.check(result_v2) == []
    if mb in (3, 8):
        result_v2["format"] = "rpeg.result/1"
        result_v2["throughput"] = PADDED_TOKENS / result_v2["makespan"]
        assert_reports(result_v2, "plan", "P5")


def test_v2_microbatches_beyond_the_local_batch(result_v2: dict[str, Any]) -> None:
    entry(result_v2, INF)["mb"] = 33
    assert_reports(result_v2, "plan", INF, "P4 mb=33 exceeds B_local=32")
    result_v2["vertices"][1]["sequences"] = 66  # the vertex's own batch: B_local = 66/1
    assert cr.check(result_v2) == []


def test_v2_pipelined_inference_needs_mb_at_least_pp(result_v2: dict[str, Any]) -> None:
    entry(result_v2, INF)["mb"] = 1
    assert_reports(result_v2, "plan", INF, "P5 mb=1 < pp=2")


def test_v2_training_accumulates_without_a_pipeline(result_v2: dict[str, Any]) -> None:
    result_v2["vertices"][1]["role"] = "training"
    entry(result_v2, INF).update(extent=[1, 1, 2], dp=2, pp=1, tp=1, mb=4, zero=1)  # B_local = 16
    assert cr.check(result_v2) == []
    entry(result_v2, INF)["mb"] = 17
    assert_reports(result_v2, "plan", INF, "P4 mb=17 exceeds B_local=16")
    entry(result_v2, INF)["mb"] = 4
    result_v2["format"] = "rpeg.result/1"  # SPEC §4's P4 for every role
    result_v2["throughput"] = PADDED_TOKENS / result_v2["makespan"]
    assert_reports(result_v2, "plan", INF, "P4 pp=1 requires mb=1")


def test_v2_generation_keeps_one_microbatch_without_a_pipeline(result_v2: dict[str, Any]) -> None:
    entry(result_v2, GEN)["mb"] = 2
    assert_reports(result_v2, "plan", GEN, "P4 pp=1 requires mb=1")


# Z1–Z2 (SPEC §14): the ZeRO stage a role may use; a memory fraction only for a generation, loss
# chunks and padding only for the others
@pytest.mark.parametrize(
    ("vertex", "field", "value", "words"),
    [
        (GEN, "zero", 3, "Z1 zero=3 is not a ZeRO stage a generation vertex may use"),
        (INF, "zero", 1, "Z1 zero=1 is not a ZeRO stage a inference vertex may use"),
        (INF, "zero", "3", "Z1 zero='3'"),
        (INF, "zero", True, "Z1 zero=True"),
        (INF, "mem_fraction", 0.5, "Z2 mem_fraction=0.5 must be in [0, 1] and 0 unless a generation"),
        (GEN, "mem_fraction", 1.5, "Z2 mem_fraction=1.5"),
        (GEN, "mem_fraction", "0.9", "Z2 mem_fraction='0.9'"),
        (
            GEN,
            "logits_chunk",
            4096,
            "Z2 logits_chunk=4096 must be a non-negative integer, 0 for a generation",
        ),
        (INF, "logits_chunk", -1, "Z2 logits_chunk=-1"),
        (INF, "logits_chunk", 4096.0, "Z2 logits_chunk=4096.0"),
        (GEN, "packing", False, "Z2 packing=False must be true or false, true for a generation"),
        (INF, "packing", "no", "Z2 packing='no'"),
    ],
)
def test_v2_engine_fields_break_z1_z2(
    result_v2: dict[str, Any], vertex: str, field: str, value: Any, words: str
) -> None:
    entry(result_v2, vertex)[field] = value
    errors = assert_reports(result_v2, "plan", f"[plan] {vertex}: {words}")
    assert len([e for e in errors if e.startswith("[plan]")]) == 1, errors


def test_v2_engine_fields_a_trainer_may_choose(result_v2: dict[str, Any]) -> None:
    result_v2["vertices"][1]["role"] = "training"
    for zero in (1, 2, 3):
        entry(result_v2, INF).update(zero=zero, logits_chunk=0, packing=True)
        assert cr.check(result_v2) == []
    entry(result_v2, INF)["mem_fraction"] = 0.5
    assert_reports(result_v2, "plan", INF, "Z2 mem_fraction=0.5")


def test_v2_engine_fields_may_be_absent_or_null(result_v2: dict[str, Any]) -> None:
    for field in ("zero", "mem_fraction", "logits_chunk", "packing"):
        entry(result_v2, INF)[field] = None
        del entry(result_v2, GEN)[field]
    assert cr.check(result_v2) == []


def test_bad_vertex_sequences(result: dict[str, Any]) -> None:
    result["vertices"][0]["sequences"] = 0
    assert_reports(result, "format", "sequences = 0")


def test_misaligned_origin(result: dict[str, Any]) -> None:
    e = entry(result, INF)
    e["origin"] = [0, 0, 1]
    for n in result["nodes"]:
        if n["vertex"] == INF:
            n["devices"] = [1, 2]
    errors = assert_reports(result, "plan", "P7", "not aligned", "gpu axis")
    assert not any(e.startswith("[bindings]") for e in errors)


def test_allocation_leaves_cluster(result: dict[str, Any]) -> None:
    entry(result, INF)["origin"] = [0, 1, 2]
    assert_reports(result, "plan", "P7", "leaves the cluster")


def test_extent_size_differs_from_degrees(result: dict[str, Any]) -> None:
    entry(result, GEN)["dp"] = 1
    assert_reports(result, "plan", "P6/P8", "2 devices", "dp·pp·tp = 1")


def test_illegal_shape() -> None:
    dims = (1, 4, 4)
    base = {"vertex": "v", "origin": [0, 0, 0], "dp": 6, "pp": 1, "tp": 1, "mb": 1}
    errors = cr._check_entry({**base, "extent": [1, 3, 2]}, 2, 48, dims)
    assert any("P6 extent [1, 3, 2]" in e for e in errors), errors


def test_replica_straddling_nodes() -> None:
    # 1×2×4 cluster, pp·tp = 6 GPUs: neither divides a node of 4 nor spans whole nodes
    dims = (1, 2, 4)
    e = {"vertex": "v", "origin": [0, 0, 0], "extent": [1, 2, 4], "dp": 1, "pp": 6, "tp": 1}
    errors = cr._check_entry({**e, "mb": 6}, 6, 96, dims)
    assert any("replica of pp·tp=6" in m for m in errors), errors
    # s = min(6, 4) = 4 does not divide 6
    assert any("P8" in m and "does not divide pp=6" in m for m in errors), errors


@pytest.mark.parametrize(
    ("dims", "origin", "extent", "degrees"),
    [
        # the layout of the format example: 2 nodes of 4, dp=4 replicas of pp=2 inside nodes
        ((1, 2, 4), [0, 0, 0], [1, 2, 4], (4, 2, 1, 8)),
        # one node of a 2×2×4 cluster, TP=4 inside the node, pp over the 2 nodes of a rack
        ((2, 2, 4), [0, 1, 0], [1, 1, 4], (1, 1, 4, 1)),
        ((2, 2, 4), [1, 0, 0], [1, 2, 4], (1, 2, 4, 8)),
        # whole racks; a replica spans two whole nodes
        ((2, 2, 4), [0, 0, 0], [2, 2, 4], (2, 8, 1, 8)),
        # a single GPU at an aligned position
        ((2, 2, 4), [1, 1, 3], [1, 1, 1], (1, 1, 1, 1)),
    ],
)
def test_legal_layouts(
    dims: tuple[int, int, int],
    origin: list[int],
    extent: list[int],
    degrees: tuple[int, int, int, int],
) -> None:
    dp, pp, tp, mb = degrees
    e = {"vertex": "v", "origin": origin, "extent": extent, "dp": dp, "pp": pp, "tp": tp, "mb": mb}
    assert cr._check_entry(e, 32, 512, dims) == []


def _tensor_parallel(result: dict[str, Any], vertex: str) -> None:
    """Give ``vertex`` its two GPUs as one tp=2 replica (P1–P8 stay legal)."""
    entry(result, vertex).update(dp=1, pp=1, tp=2, mb=1)


def test_heads_not_dividing_tp_on_vllm(result: dict[str, Any]) -> None:
    result["models"]["actor"]["spec"] = {"heads": 3, "kv_heads": 3}
    _tensor_parallel(result, GEN)
    errors = assert_reports(result, "plan", "H1 (vLLM)", "tp=2 does not divide heads=3", GEN)
    assert [e for e in errors if e.startswith("[plan]")] == [e for e in errors if "H1" in e]


def test_heads_not_dividing_tp_on_megatron(result: dict[str, Any]) -> None:
    result["models"]["reference"].update(heads=5, kv_heads=5)  # top-level keys are read too
    _tensor_parallel(result, INF)
    assert_reports(result, "plan", "H1 (Megatron-core)", "heads=5", INF)


def test_query_groups_must_divide_on_megatron(result: dict[str, Any]) -> None:
    # multi-query attention: Megatron-core shards num_query_groups = kv_heads = 1 over tp=2
    result["models"]["reference"]["spec"] = {"heads": 4, "kv_heads": 1}
    _tensor_parallel(result, INF)
    assert_reports(result, "plan", "H2 (Megatron-core)", "kv_heads=1", "query groups")


def test_vllm_replicates_kv_heads_when_tp_is_a_multiple(result: dict[str, Any]) -> None:
    result["models"]["actor"]["spec"] = {"heads": 4, "kv_heads": 1}
    _tensor_parallel(result, GEN)
    assert cr.check(result) == []


def test_vllm_refuses_tp_neither_dividing_nor_multiple_of_kv_heads(result: dict[str, Any]) -> None:
    result["models"]["actor"]["spec"] = {"heads": 12, "kv_heads": 3}
    _tensor_parallel(result, GEN)
    assert_reports(result, "plan", "H2 (vLLM)", "tp=2 neither divides kv_heads=3")


def test_head_rules_skipped_without_heads(result: dict[str, Any]) -> None:
    # the package always writes models[*].spec; a file without heads cannot be judged on them
    result["models"]["actor"]["spec"] = {"heads": "many"}
    _tensor_parallel(result, GEN)
    assert cr.check_plan_legality(result) == []


@pytest.mark.parametrize(
    ("heads", "kv_heads", "role", "tp", "rule"),
    [
        (16, 16, "generation", 3, "H1 (vLLM)"),
        (12, 12, "training", 8, "H1 (Megatron-core)"),
        (32, 8, "training", 16, "H2 (Megatron-core)"),
        (32, 8, "generation", 16, None),  # vLLM: 2 replicas of each KV head
        (12, 4, "generation", 6, "H2 (vLLM)"),
        (12, 4, "inference", 6, "H2 (Megatron-core)"),
        (64, 8, "inference", 8, None),
    ],
)
def test_head_rules_table(heads: int, kv_heads: int, role: str, tp: int, rule: str | None) -> None:
    e = {"vertex": "v", "dp": 1, "pp": 1, "tp": tp, "mb": 1}
    errors = cr._check_heads(e, heads, kv_heads, role)
    if rule is None:
        assert errors == []
    else:
        assert len(errors) == 1 and rule in errors[0], errors


# ---------------------------------------------------------------------------------------------
# 7. Bindings
# ---------------------------------------------------------------------------------------------


def test_op_node_on_wrong_devices(result: dict[str, Any]) -> None:
    op = node(result, "op", GEN, 1, 2)
    op["devices"] = [0, 2]
    assert_reports(result, "bindings", f"node {op['id']}", "vertex's allocation is [0, 1]")


def test_comm_node_reserves_destination(result: dict[str, Any]) -> None:
    comm = node(result, "comm", INF, 0, 1)
    comm["devices"] = [0, 1]  # the source's GPUs, not the destination's
    assert_reports(result, "bindings", "destination's allocation is [2, 3]")


def test_comm_without_pred_from_source(result: dict[str, Any]) -> None:
    comm = node(result, "comm", INF, 1, 2)
    comm["preds"] = []
    assert_reports(result, "bindings", "no pred of that vertex")


def test_vertex_missing_in_a_step(result: dict[str, Any]) -> None:
    result["nodes"] = [n for n in result["nodes"] if not (n["vertex"] == INF and n["step"] == 1)]
    result["makespan"] = max(n["finish"] for n in result["nodes"])
    result["throughput"] = 2 * 16 * 2 * 32 / result["makespan"]
    errors = assert_reports(result, "bindings", INF, "no op node in step(s) [1]")
    assert len(errors) == 1, errors


def test_step_and_phase_out_of_range(result: dict[str, Any]) -> None:
    result["nodes"][0]["step"] = 2
    result["nodes"][1]["phase"] = 4
    errors = assert_reports(result, "bindings", "step 2 outside 0..1")
    assert any("phase 4 outside 0..3" in e for e in errors)


def test_unsplit_and_split_phases_mixed(result: dict[str, Any]) -> None:
    node(result, "op", GEN, 0, 2)["phase"] = 0
    assert_reports(result, "bindings", "mixes unsplit phase 0")


def test_vertex_without_plan_entry(result: dict[str, Any]) -> None:
    result["plan"] = [e for e in result["plan"] if e["vertex"] != INF]
    assert_reports(result, "bindings", "has no plan entry")


def test_unknown_vertex_in_plan_and_nodes(result: dict[str, Any]) -> None:
    result["plan"][0]["vertex"] = "critic_inf"
    result["nodes"][0]["vertex"] = "critic_inf"
    errors = assert_reports(result, "bindings", "plan entry for unknown vertex 'critic_inf'")
    assert any("names unknown vertex" in e for e in errors)


# ---------------------------------------------------------------------------------------------
# 8. Memory
# ---------------------------------------------------------------------------------------------


def test_feasible_flag_with_peak_above_limit(result: dict[str, Any]) -> None:
    result["peak_memory"][3] = 72.1e9  # M_eff = 0.9 · 80e9 = 72e9
    assert_reports(result, "memory", "memory_feasible is true", "device 3")


def test_peak_exactly_at_limit_is_feasible(result: dict[str, Any]) -> None:
    result["peak_memory"][3] = 0.9 * 80e9
    assert cr.check_memory(result) == []


def test_infeasible_flag_with_peaks_that_fit(result: dict[str, Any]) -> None:
    result["memory_feasible"] = False
    assert_reports(result, "memory", "memory_feasible is false")


def test_peak_memory_length(result: dict[str, Any]) -> None:
    result["peak_memory"] = result["peak_memory"][:3]
    assert_reports(result, "memory", "3 entries", "4 devices")


# ---------------------------------------------------------------------------------------------
# Property tests: the sweep agrees with a brute-force overlap test on random list schedules
# ---------------------------------------------------------------------------------------------

N_GPUS = 4


@st.composite
def random_dags(draw: st.DrawFn) -> tuple[list[dict[str, Any]], dict[int, float]]:
    n = draw(st.integers(1, 12))
    nodes, durations = [], {}
    for i in range(n):
        devices = draw(st.sets(st.integers(0, N_GPUS - 1), min_size=1, max_size=N_GPUS))
        preds = draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else set()
        nodes.append({"id": i, "kind": "op", "devices": sorted(devices), "preds": sorted(preds)})
        durations[i] = draw(st.floats(0.0, 5.0, allow_nan=False))
    return nodes, durations


def _as_result(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "cluster": {"racks": 1, "nodes_per_rack": 1, "gpus_per_node": N_GPUS},
        "nodes": nodes,
    }


def _brute_force_overlap(nodes: list[dict[str, Any]]) -> bool:
    for a, b in itertools.combinations(nodes, 2):
        if not set(a["devices"]) & set(b["devices"]):
            continue
        if a["finish"] > a["start"] and b["finish"] > b["start"]:
            lo, hi = max(a["start"], b["start"]), min(a["finish"], b["finish"])
            if hi - lo > cr._tol(hi, lo):
                return True
    return False


@settings(max_examples=150, deadline=None)
@given(random_dags())
def test_list_schedules_always_pass(dag: tuple[list[dict[str, Any]], dict[int, float]]) -> None:
    nodes, durations = dag
    _schedule(nodes, durations)
    result = _as_result(nodes)
    assert cr.check_precedence(result) == []
    assert cr.check_device_exclusivity(result) == []


@settings(max_examples=150, deadline=None)
@given(random_dags(), st.data())
def test_sweep_matches_brute_force(
    dag: tuple[list[dict[str, Any]], dict[int, float]], data: st.DataObject
) -> None:
    nodes, durations = dag
    _schedule(nodes, durations)
    # move one node to a random start; it may or may not create an overlap
    victim = data.draw(st.sampled_from(nodes))
    length = victim["finish"] - victim["start"]
    victim["start"] = data.draw(st.floats(0.0, 30.0, allow_nan=False))
    victim["finish"] = victim["start"] + length
    errors = cr.check_device_exclusivity(_as_result(nodes))
    assert bool(errors) == _brute_force_overlap(nodes)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key/index path inside a JSON value."""
    if isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, list):
        items = list(enumerate(obj))
    else:
        return []
    out = []
    for key, value in items:
        out.append((*prefix, key))
        out.extend(_paths(value, (*prefix, key)))
    return out


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 40) | st.floats() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner),
    max_leaves=5,
)


@settings(max_examples=300, deadline=None)
@given(st.data(), JSON_VALUES)
def test_checker_never_crashes_on_corrupted_fields(data: st.DataObject, value: Any) -> None:
    result = data.draw(st.sampled_from([make_result, make_result_v2]))()
    path = data.draw(st.sampled_from(_paths(result)))
    target = result
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    errors = cr.check(result)
    assert not any("could not run" in e for e in errors), (path, errors)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def test_cli_ok_and_violations(
    result: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(result))
    bad_result = copy.deepcopy(result)
    bad_result["makespan"] *= 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(bad_result))
    assert cr.main([str(good)]) == 0
    assert capsys.readouterr().out == f"OK {good}\n"
    assert cr.main([str(good), str(bad)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"OK {good}"
    assert all(line.startswith(f"{bad}: [") for line in out[1:])
    assert any("[makespan]" in line for line in out[1:])


def test_cli_limits_output(
    result: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for n in result["nodes"]:
        n["start"] = 0.0  # many precedence and overlap violations
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    assert cr.main(["--max-violations", "2", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3
    assert "more violation(s)" in out[-1]


def test_cli_unreadable_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    assert cr.main([str(path), str(tmp_path / "missing.json")]) == 1
    out = capsys.readouterr().out
    assert out.count("[file] cannot read") == 2


def test_script_runs_without_site_packages(result: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    # -I -S: isolated, no site-packages, so only the standard library can be imported
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(_PATH), str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == f"OK {path}\n"


def test_recompute_is_a_training_entrys_mode(result: dict[str, Any]) -> None:
    entry(result, INF)["recompute"] = None  # null: what the package writes for non-training
    assert cr.check(result) == []
    entry(result, INF)["recompute"] = "none"
    assert_reports(result, "plan", "recompute='none' on a inference vertex")
    result["vertices"][1]["role"] = "training"  # now the mode is the entry's to choose
    assert cr.check(result) == []
    entry(result, INF)["recompute"] = "partial"
    assert_reports(result, "plan", "recompute='partial' is not one of none, selective, full")
    del entry(result, INF)["recompute"]  # files from before the key: full
    assert cr.check(result) == []

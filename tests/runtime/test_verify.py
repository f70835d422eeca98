"""Tests for ``runtime/trace/records.py`` and ``runtime/trace/verify.py``: the expected graph a run follows, the
``rpeg.trace/1`` round trip, and the verifier's seven checks (SPEC §11).

A valid trace is built by simulating a run in Python: one record per node of
``expected_graph(result, steps)``, timed by a list schedule that respects precedence and device
exclusivity, on the node's devices, with one persistent worker group per vertex and the versions
the unrolled graph implies. Each test then corrupts one thing and asserts the verifier names it.
"""

from __future__ import annotations

import argparse
import copy
import json

import pytest

from rpeg import solve
from rpeg.ir import Choice, Plan, Structure
from rpeg.ir.cluster import mask_devices
from rpeg.ir.lower import COMM, OP, RESHARD
from rpeg.runtime.trace.records import (
    FORMAT,
    Trace,
    TraceRecord,
    expected_graph,
    expected_versions,
    plan_hash,
)
from rpeg.runtime.trace.verify import TraceError, register_cli, verify, verify_or_raise
from rpeg.scoring.candidates import make_strategy
from rpeg.scoring.evaluator import Evaluator
from rpeg.solvers.result import Result, Status

STEPS = 4  # more than the results' k_eval = 3: the expected graph is re-lowered, not read back
KINDS = ("op", "comm", "reshard")

# A hand plan on 1x2x4 whose generation feeds disjoint inferences (phase splitting, phase-wise
# COMMs), whose actor generation and training share devices with other layouts (RESHARDs) and
# whose critic publication crosses allocations (a weight COMM): vertex → (origin, extent, dp, pp, tp, mb).
HAND = {
    "actor_gen": ((0, 0, 0), (1, 1, 4), 2, 1, 2, 1),
    "ref_inf": ((0, 1, 0), (1, 1, 2), 2, 1, 1, 1),
    "reward_inf": ((0, 1, 2), (1, 1, 1), 1, 1, 1, 1),
    "critic_inf": ((0, 1, 3), (1, 1, 1), 1, 1, 1, 1),
    "actor_train": ((0, 0, 0), (1, 1, 4), 4, 1, 1, 1),
    "critic_train": ((0, 1, 0), (1, 1, 4), 4, 1, 1, 1),
}


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def sync_result(tiny_ppo, cluster_1x2x4) -> Result:
    """Greedy plan, synchronous structure (τ = 0): every vertex on all 8 GPUs, RESHARDs."""
    return solve(tiny_ppo, cluster_1x2x4, "greedy", k_eval=3)


@pytest.fixture(scope="module")
def stale_result(tiny_ppo, cluster_1x2x4) -> Result:
    """The :data:`HAND` plan under ``τ(actor) = 1, τ(critic) = 0``."""
    structure = Structure("ppo", False, (("actor", 1), ("critic", 0)))
    ev = Evaluator(tiny_ppo, cluster_1x2x4, structure, k_eval=3)
    choices = []
    for v in ev.graph.vertices:
        origin, extent, dp, pp, tp, mb = HAND[v.name]
        strategy = make_strategy(cluster_1x2x4, extent, dp, pp, tp, mb)
        choices.append(Choice(strategy, cluster_1x2x4.allocation(origin, extent)))
    plan = Plan(tuple(choices))
    return Result(
        tiny_ppo,
        cluster_1x2x4,
        structure,
        ev.graph,
        plan,
        ev.evaluate(plan, keep=True),
        Status.FEASIBLE,
        "hand",
        k_eval=3,
    )


@pytest.fixture(params=["sync", "stale"])
def result(request, sync_result, stale_result) -> Result:
    return {"sync": sync_result, "stale": stale_result}[request.param]


def simulate(result: Result, steps: int = STEPS) -> Trace:
    """A valid trace of ``result``'s plan: list-scheduled records of every node of ``Ĝ``."""
    g = expected_graph(result, steps)
    names = [v.name for v in result.graph.vertices]
    assert result.plan is not None
    layouts = [
        {"dp": c.strategy.dp, "pp": c.strategy.pp, "tp": c.strategy.tp, "mb": c.strategy.mb}
        for c in result.plan.choices
    ]
    workers = [[f"g{v}/r{r}" for r in range(c.allocation.size)] for v, c in enumerate(result.plan.choices)]
    free: dict[int, float] = {}
    ends: list[float] = []
    records = []
    for i in range(len(g)):
        devices = mask_devices(g.mask[i])
        start = max([0.0] + [ends[p] for p in g.preds[i]] + [free.get(d, 0.0) for d in devices])
        end = start + g.duration[i] + 1e-3
        for d in devices:
            free[d] = end
        ends.append(end)
        v = g.vertex[i]
        consumed, produced = expected_versions(result.graph, g, i)
        records.append(
            TraceRecord(
                node=i,
                kind=KINDS[g.kind[i]],
                vertex=names[v],
                source=names[g.source[i]] if g.source[i] >= 0 else None,
                step=g.step[i],
                phase=g.phase[i],
                workers=list(workers[v]),
                devices=devices,
                layout=dict(layouts[v]),
                start=start,
                end=end,
                versions_consumed=consumed,
                version_produced=produced,
                bytes=round(g.nbytes[i]),
                worker_time=g.duration[i],
            )
        )
    groups = {
        f"g{v}": {
            "models": [result.graph.vertices[v].model],
            "vertices": [names[v]],
            "devices": mask_devices(c.allocation.mask),
            "layout": layouts[v],
            "workers": workers[v],
        }
        for v, c in enumerate(result.plan.choices)
    }
    return Trace(
        plan_hash=plan_hash(result),
        steps=steps,
        staleness=dict(result.structure.tau),
        records=records,
        step_metrics=[{"step": k, "reward": 0.1 * k, "step_time_s": 1.0} for k in range(steps)],
        groups=groups,
        meta={"seed": 0, "backend": "simulated", "scaled": False},
    )


@pytest.fixture
def trace(result) -> Trace:
    return simulate(result)


def find(
    trace: Trace, kind: str, vertex: str, step: int, phase: int | None = None, source: str | None = None
):
    """The record of ``kind vertex step (phase)``, optionally from ``source``."""
    for r in trace.records:
        same = (r.kind, r.vertex, r.step) == (kind, vertex, step)
        if same and phase in (None, r.phase) and source in (None, r.source):
            return r
    raise LookupError(f"no {kind} {vertex} step {step} phase {phase} source {source}")


def problems_naming(trace: Trace, result: Result, node: int, *words: str) -> list[str]:
    """Problems that name ``node`` and contain every one of ``words``; asserts there is one."""
    problems = verify(trace, result)
    hits = [p for p in problems if f"node {node} (" in p and all(w in p for w in words)]
    assert hits, f"no problem naming node {node} with {words}; got {problems}"
    return hits


# ---------------------------------------------------------------------------- the plan side
def test_expected_graph_matches_the_evaluators_lowering(result):
    """Over k_eval steps the expected graph is the result's kept graph, node for node."""
    kept = result.evaluation.graph
    g = expected_graph(result, result.k_eval)
    assert (g.kind, g.vertex, g.source, g.step, g.phase, g.mask, g.preds) == (
        kept.kind,
        kept.vertex,
        kept.source,
        kept.step,
        kept.phase,
        kept.mask,
        kept.preds,
    )
    assert g.duration == pytest.approx(kept.duration)
    longer = expected_graph(result, STEPS)
    assert max(longer.step) == STEPS - 1
    assert longer.kind[: len(g)] == g.kind  # prefix: ids are stable as steps are added


def test_stale_plan_exercises_phases_comms_and_reshards(stale_result):
    g = expected_graph(stale_result, STEPS)
    assert {OP, COMM, RESHARD} <= set(g.kind)
    assert max(g.phase) == len(stale_result.workload.quantiles)


def test_expected_graph_without_a_plan_raises(ppo_70b, a100_1x1x8):
    infeasible = solve(ppo_70b, a100_1x1x8, "greedy")
    with pytest.raises(ValueError, match="no plan"):
        expected_graph(infeasible, 2)


def test_plan_hash_is_stable_and_tracks_the_plan(sync_result, stale_result):
    h = plan_hash(sync_result)
    assert len(h) == 64 and int(h, 16) >= 0
    assert plan_hash(Result.from_json(sync_result.to_json())) == h
    assert plan_hash(stale_result) != h
    other = copy.copy(sync_result)
    c = sync_result.plan.choices[0]
    s = c.strategy
    swapped = Choice(make_strategy(sync_result.cluster, s.extent, s.dp * s.tp, s.pp, 1, s.mb), c.allocation)
    other.plan = sync_result.plan.replace(0, swapped)
    assert plan_hash(other) != h


def test_versions_follow_the_unrolled_graph(stale_result):
    """Known answers for τ(actor) = 1, τ(critic) = 0 over 4 steps."""
    g = expected_graph(stale_result, STEPS)
    names = [v.name for v in stale_result.graph.vertices]

    def versions(kind, vertex, step, source=None, phase=None):
        for i in range(len(g)):
            src = names[g.source[i]] if g.source[i] >= 0 else None
            if (g.kind[i], names[g.vertex[i]], g.step[i]) == (kind, vertex, step) and (
                source in (None, src) and phase in (None, g.phase[i])
            ):
                return expected_versions(stale_result.graph, g, i)
        raise LookupError((kind, vertex, step, source))

    # the actor's generation reads the initial weights for k ≤ τ, then version k − 1
    assert [versions(OP, "actor_gen", k, phase=1)[0] for k in range(4)] == [
        {"actor": v} for v in (0, 0, 1, 2)
    ]
    assert [versions(OP, "actor_train", k) for k in range(4)] == [
        ({"actor": k}, {"actor": k + 1}) for k in range(4)
    ]
    # the publication RESHARD into actor_gen at step k carries what training at k − 2 produced
    assert versions(RESHARD, "actor_gen", 2, "actor_train") == ({"actor": 1}, {})
    assert versions(RESHARD, "actor_gen", 3, "actor_train") == ({"actor": 2}, {})
    # the pair RESHARD gen → train carries the training's version; critic publications are fresh
    assert versions(RESHARD, "actor_train", 3, "actor_gen") == ({"actor": 3}, {})
    assert versions(COMM, "critic_inf", 2, "critic_train") == ({"critic": 2}, {})
    assert versions(OP, "critic_inf", 2, phase=1) == ({"critic": 2}, {})
    assert versions(OP, "ref_inf", 3, phase=2) == ({"reference": 0}, {})
    assert versions(COMM, "ref_inf", 3, "actor_gen", phase=1) == ({}, {})


# ---------------------------------------------------------------------------- the file
def test_valid_trace_verifies_and_round_trips(result, trace, tmp_path):
    assert verify(trace, result) == []
    verify_or_raise(trace, result)
    text = trace.to_json(tmp_path / "trace.json")
    doc = json.loads(text)
    assert doc["format"] == FORMAT == Trace.format
    back = Trace.from_json(tmp_path / "trace.json")
    assert back == trace
    assert Trace.from_json(text) == trace
    assert back.to_json() == text
    assert verify(back, Result.from_json(result.to_json())) == []


def test_bad_documents_name_the_field(sync_result):
    doc = simulate(sync_result, 1).to_dict()
    for key, match in (("plan_hash", "missing field 'plan_hash'"), ("records", "missing field 'records'")):
        bad = copy.deepcopy(doc)
        del bad[key]
        with pytest.raises(ValueError, match=match):
            Trace.from_dict(bad)
    bad = copy.deepcopy(doc)
    del bad["records"][3]["end"]
    with pytest.raises(ValueError, match=r"trace: missing field 'records\[3\]\.end'"):
        Trace.from_dict(bad)
    bad = copy.deepcopy(doc)
    bad["records"][0]["step"] = "zero"
    with pytest.raises(ValueError, match=r"field 'records\[0\]\.step': Input should be a valid integer"):
        Trace.from_dict(bad)
    bad = copy.deepcopy(doc)
    bad["records"][0]["kind"] = "compute"
    with pytest.raises(
        ValueError, match=r"field 'records\[0\]\.kind': Input should be 'op', 'comm' or 'reshard'"
    ):
        Trace.from_dict(bad)
    with pytest.raises(ValueError, match=r"format 'rpeg\.result/1' is not 'rpeg\.trace/1'"):
        Trace.from_dict({**doc, "format": "rpeg.result/1"})
    with pytest.raises(ValueError, match="not valid JSON"):
        Trace.from_json("{nope")


# ---------------------------------------------------------------------------- corruptions
def test_wrong_hash_and_staleness(result, trace):
    trace.plan_hash = "0" * 64
    trace.staleness = {m: t + 1 for m, t in trace.staleness.items()}
    problems = verify(trace, result)
    assert any("plan hash" in p and "0" * 64 in p for p in problems)
    assert any("staleness" in p and "structure staleness" in p for p in problems)
    with pytest.raises(TraceError) as info:
        verify_or_raise(trace, result)
    assert info.value.problems == problems


def test_missing_extra_and_duplicate_records(result, trace):
    gone = trace.records.pop(5)
    n = len(trace.records) + 1
    ghost = copy.deepcopy(trace.records[0])
    ghost.node = n
    twin = copy.deepcopy(trace.records[7])
    trace.records += [ghost, twin]
    problems = verify(trace, result)
    assert any(p.startswith(f"missing record for node {gone.node} (") and gone.vertex in p for p in problems)
    assert any(p.startswith(f"extra record node {n} (") and "no such node" in p for p in problems)
    assert any(p.startswith(f"duplicate records: node {twin.node} (") and "2 times" in p for p in problems)


def test_record_that_is_another_node(result, trace):
    r = find(trace, "op", "critic_train", 1)
    r.vertex = "actor_train"
    problems_naming(trace, result, r.node, "extra record", "critic_train")
    assert any(p.startswith(f"missing record for node {r.node} (") for p in verify(trace, result))


def test_wrong_devices(result, trace):
    r = find(trace, "op", "actor_gen", 2, phase=None)
    r.devices = r.devices[:-1]
    problems_naming(trace, result, r.node, "devices", str(r.devices))


def test_wrong_worker_count(result, trace):
    r = find(trace, "op", "ref_inf", 1)
    r.workers = r.workers[:-1] + r.workers[:1]  # right length, one rank twice
    problems_naming(trace, result, r.node, "worker(s)", "distinct")


def test_workers_must_persist_across_steps(result, trace):
    r = find(trace, "op", "actor_train", 2)
    r.workers = [w.replace("/r", "/x") for w in r.workers]
    first = find(trace, "op", "actor_train", 0)
    problems_naming(trace, result, r.node, "persistent", f"node {first.node} (")


def test_wrong_layout(result, trace):
    r = find(trace, "op", "critic_train", 3)
    r.layout["tp"] *= 2
    problems_naming(trace, result, r.node, "layout", "critic_train")
    c = next(r for r in trace.records if r.kind != "op")
    del c.layout["mb"]
    problems_naming(trace, result, c.node, "destination layout", "missing")


def test_start_before_a_predecessor_ends(result, trace):
    g = expected_graph(result, STEPS)
    r = find(trace, "op", "actor_train", 2)
    by_node = {x.node: x for x in trace.records}
    last = max(g.preds[r.node], key=lambda p: by_node[p].end)
    r.start = by_node[last].end - 1e-3
    problems_naming(trace, result, r.node, "before its predecessor", f"node {last} (")


def test_version_too_stale_and_too_fresh(stale_result):
    trace = simulate(stale_result)
    stale = find(trace, "op", "actor_gen", 3, phase=2)
    stale.versions_consumed["actor"] = 1  # expected 2 = 3 − τ
    fresh = find(trace, "op", "actor_gen", 2, phase=1)
    fresh.versions_consumed["actor"] = 2  # expected 1
    early = find(trace, "op", "actor_gen", 1, phase=3)
    early.versions_consumed["actor"] = 5
    problems_naming(trace, stale_result, stale.node, "versions_consumed['actor'] = 1, expected 2")
    problems_naming(trace, stale_result, stale.node, "staleness 2 exceeds τ(actor) = 1")
    problems_naming(trace, stale_result, fresh.node, "versions_consumed['actor'] = 2, expected 1")
    problems_naming(trace, stale_result, early.node, "no such version yet")


def test_versions_on_transfers_and_training(stale_result):
    trace = simulate(stale_result)
    pub = find(trace, "reshard", "actor_gen", 3, source="actor_train")
    pub.versions_consumed = {"actor": 3}
    data = find(trace, "comm", "reward_inf", 1, phase=1)
    data.versions_consumed = {"actor": 1}
    train = find(trace, "op", "critic_train", 2)
    train.version_produced = {"critic": 2}
    frozen = find(trace, "op", "reward_inf", 0, phase=1)
    frozen.versions_consumed = {}
    problems_naming(trace, stale_result, pub.node, "expected 2")
    problems_naming(trace, stale_result, data.node, "does not read")
    problems_naming(trace, stale_result, train.node, "version_produced", "expected {'critic': 3}")
    problems_naming(trace, stale_result, frozen.node, "no entry for 'reward'")


def test_overlap_on_a_shared_device(stale_result):
    trace = simulate(stale_result)
    a = find(trace, "op", "actor_train", 1)
    b = find(trace, "op", "actor_gen", 2, phase=3)
    b.start, b.end = a.start + 1e-4, a.end + 1e-4
    hits = problems_naming(trace, stale_result, a.node, "overlap on device(s) [0, 1, 2, 3]")
    assert any(f"node {b.node} (" in h for h in hits)


def test_touching_intervals_are_not_an_overlap(sync_result):
    trace = simulate(sync_result, 2)
    ops = sorted((r for r in trace.records if 0 in r.devices), key=lambda r: r.start)
    ops[1].start = ops[0].end  # already adjacent or later; make them touch exactly
    assert not [p for p in verify(trace, sync_result) if "overlap" in p]


def test_negative_duration_and_bytes(result, trace):
    r = find(trace, "op", "reward_inf", 1)
    r.end = r.start - 0.5
    problems_naming(trace, result, r.node, "negative duration")
    c = next(x for x in trace.records if x.kind != "op")
    c.bytes += 7
    problems_naming(trace, result, c.node, "bytes", "the lowered node moves")
    op = find(trace, "op", "ref_inf", 0)
    op.bytes = 3
    problems_naming(trace, result, op.node, "moves no bytes")


def test_bytes_read_in_place_are_part_of_the_bytes_moved(result, trace):
    c = next(x for x in trace.records if x.kind != "op")
    c.in_place_bytes = c.bytes  # all of it read in place: fine
    assert verify(trace, result) == []
    c.in_place_bytes = c.bytes + 1
    problems_naming(trace, result, c.node, "in_place_bytes", "not within 0..bytes")


def test_scaled_runs_need_only_positive_bytes(result, trace):
    trace.meta["scaled"] = True
    transfers = [r for r in trace.records if r.kind != "op"]
    for r in transfers:
        r.bytes = 1
    assert verify(trace, result) == []
    transfers[0].bytes = 0
    problems_naming(trace, result, transfers[0].node, "must move some bytes")


# ---------------------------------------------------------------------------- CLI
def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rpeg")
    sub = parser.add_subparsers(dest="command", required=True)
    register_cli(sub)
    args = parser.parse_args(argv)
    return args.fn(args)


def test_cli_verify(stale_result, tmp_path, capsys):
    trace = simulate(stale_result, 2)
    rpath, tpath = tmp_path / "result.json", tmp_path / "trace.json"
    stale_result.to_json(rpath)
    trace.to_json(tpath)
    assert run_cli(["verify", str(tpath), str(rpath)]) == 0
    valid, fid = capsys.readouterr().out.strip().splitlines()
    assert valid == f"trace valid: {len(trace.records)} records, 2 steps"
    assert fid.startswith("fidelity: not available")  # a simulated trace stores no predictions
    for r in trace.records:
        r.start, r.end = 0.0, 1.0  # everything at once: many overlaps and dependency violations
    trace.to_json(tpath)
    assert run_cli(["verify", str(tpath), str(rpath)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("trace INVALID:")
    assert len(out) == 1 + 20 + 1 + 1 and out[-2].lstrip().startswith("… and")
    assert out[-1].startswith("fidelity:")
    with pytest.raises(ValueError, match="does not exist"):
        run_cli(["verify", str(tmp_path / "none.json"), str(rpath)])

"""The Nereus planner (``method="dp"``): frontiers, the DP's optimality within its plan space
(against CP-SAT and brute-force enumeration), results the independent checker accepts,
determinism and infeasibility messages (SPEC §10 "Planner (dp)")."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import pytest

from rpeg import Cluster, Workload, hardware_preset, model_preset, solve
from rpeg.cli import main
from rpeg.formulations.dp_exact import solve_dp_cpsat
from rpeg.heuristics.baselines import Infeasible
from rpeg.heuristics.dp_planner import (
    LAT_UNIT,
    MEM_UNIT,
    DPInstance,
    _memory_terms,
    build_dp_instance,
    dominates,
    model_stages,
    partitions,
    place,
    size_chain,
    solve_dp,
)
from rpeg.ir import Structure
from rpeg.ir.plan import check_strategy_of
from rpeg.scoring import Evaluator
from rpeg.scoring.candidates import enumerate_strategies, interleavings
from rpeg.solvers import Status
from tests.conftest import example_problem, ppo_70b_workload, tiny_ppo_workload

TINY = model_preset("7b").scaled(layers=4, hidden=1024, heads=8, vocab=8000)


def tiny(algorithm: str, memory: float, shape: str) -> tuple[Workload, Cluster]:
    """Small models on a GH200-like cluster with ``memory`` bytes per GPU."""
    hw = dataclasses.replace(hardware_preset("gh200"), name="tiny", gpu_memory_bytes=memory)
    models = {"actor": TINY, "reward": TINY} | ({"critic": TINY} if algorithm == "ppo" else {})
    if algorithm == "dpo":
        models = {"actor": TINY}
    return Workload(algorithm, models, 16, 2, 64, 64), Cluster.from_shape(shape, hw)


def instance(workload: Workload, cluster: Cluster, structure: Structure | None = None) -> DPInstance:
    return build_dp_instance(Evaluator(workload, cluster, structure, k_eval=1).costs)


def shrink(inst: DPInstance, k: int) -> DPInstance:
    """The same instance with at most ``k`` points per frontier, spread over the GPU counts, the
    leanest point (least footprint: a trainer's frontier holds every recomputation mode, and on
    the tight instances only the leanest ones fit together) always among them."""
    fronts = []
    for f in inst.frontiers:
        step = max(1, math.ceil(len(f.points) / k))
        lean = min(f.points, key=lambda q: q.footprint)
        spread = [q for q in f.points[::step] if q is not lean][: k - 1]
        fronts.append(dataclasses.replace(f, points=sorted([lean, *spread], key=f.points.index)))
    return dataclasses.replace(inst, frontiers=fronts)


def brute_force(inst: DPInstance) -> int | None:
    """Least ``L_step`` over every pick and every grouping of every stage into lanes."""
    groupings = list(itertools.product(*(partitions(members) for members in inst.stages)))
    best = None
    for picks in itertools.product(*(range(len(f.points)) for f in inst.frontiers)):
        for lanes in groupings:
            lat, ok = inst.objective(picks, lanes)
            if ok and (best is None or lat < best):
                best = lat
    return best


def _problems():
    out = {
        "ppo-tiny-tight": tiny("ppo", 0.7e9, "1x1x4"),
        "grpo-tiny-tight": tiny("grpo", 0.5e9, "1x2x2"),
        "dpo-tiny": tiny("dpo", 2e9, "1x1x4"),
        "ppo-7b-1x2x4": (tiny_ppo_workload(), Cluster.from_shape("1x2x4", hardware_preset("gh200"))),
    }
    for name in ("grpo-8b-16gpu", "remax-7b-16gpu"):
        w, c, _ = example_problem(name)
        out[name] = (w, c)
    return out


PROBLEMS = _problems()


# ---------------------------------------------------------------------------- optimality
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_dp_equals_cpsat_equals_brute_force(name):
    w, c = PROBLEMS[name]
    inst = shrink(instance(w, c), 4)
    sel = solve_dp(inst)
    lat, ok = inst.objective(sel.picks, sel.lanes)
    assert ok and lat == sel.step_latency
    exact = solve_dp_cpsat(inst, time_limit=30)
    assert exact.status == "optimal"
    assert exact.objective == sel.step_latency
    assert brute_force(inst) == sel.step_latency


def test_full_frontiers_dp_equals_cpsat_with_structures():
    w, c = tiny("ppo", 1.0e9, "1x1x4")
    for y in (
        Structure("ppo", False, (("actor", 1), ("critic", 0))),
        Structure("ppo", True, (("actor_critic", 0),)),
    ):
        inst = instance(w, c, y)
        sel = solve_dp(inst)
        exact = solve_dp_cpsat(inst, time_limit=30)
        assert exact.status == "optimal" and exact.objective == sel.step_latency


def test_the_memory_bound_binds_on_the_tight_instances():
    # the DP's memory labels matter: with M_eff lifted the optimum is faster
    for name in ("ppo-tiny-tight", "grpo-tiny-tight"):
        w, c = PROBLEMS[name]
        inst = instance(w, c)
        loose = dataclasses.replace(inst, m_eff=10**15)
        assert solve_dp(loose).step_latency < solve_dp(inst).step_latency, name


def test_lanes_serialise_model_stages_on_one_allocation():
    # one lane per stage on the whole cluster (the greedy baseline's shape) is a legal grouping
    w, c = PROBLEMS["ppo-7b-1x2x4"]
    inst = instance(w, c)
    inf = inst.stages[1]
    n = c.num_devices
    picks = [
        min(range(len(f.points)), key=lambda j: (f.points[j].gpus != n, f.points[j].latency))
        for f in inst.frontiers
    ]
    lanes = [(tuple(s),) for s in inst.stages]
    lat, ok = inst.objective(picks, lanes)
    assert ok
    assert inst.stage_latencies(picks, lanes)[1] == sum(
        inst.frontiers[m].points[picks[m]].latency for m in inf
    )
    assert solve_dp(inst).step_latency <= lat


# ---------------------------------------------------------------------------- frontiers
@pytest.mark.parametrize("name", ["ppo-tiny-tight", "ppo-7b-1x2x4", "remax-7b-16gpu"])
def test_frontier_is_legal_feasible_and_pareto(name):
    w, c = PROBLEMS[name]
    ev = Evaluator(w, c, k_eval=1)
    inst = build_dp_instance(ev.costs)
    g = ev.graph
    for f in inst.frontiers:
        assert f.points, f.stage.label
        keys = [q.key for q in f.points]
        assert len(set(keys)) == len(keys)
        for q in f.points:
            assert q.footprint <= inst.m_eff
            assert q.gpus == q.strategy.size <= inst.budget
            assert not any(dominates(o, q.key) for o in keys if o != q.key)
            for v in f.stage.vertices:
                vert = g.vertices[v]
                s = q.strategy
                spec = g.models[vert.model].spec
                assert check_strategy_of(c, spec, vert.role, vert.sequences, s) is None
        # every legal, memory-feasible strategy an engine can start is dominated by a kept point
        v0 = f.stage.vertices[0]
        spec = g.models[g.vertices[v0].model].spec
        listed = enumerate_strategies(
            c, spec, g.vertices[v0].sequences, g.vertices[v0].role, interleave=False
        )
        if len(f.stage.vertices) == 1:  # host-offload variants count as legal, as listed
            plain = sum(s.size in size_chain(c) for s in listed)
            twins = sum(q.strategy.vp > 1 for q in f.points)  # the interleaved twins scored besides
            assert plain + twins <= f.legal <= 2 * plain
        for q in f.points:  # an interleaved point is its plain twin's fastest interleaving that fits
            if q.strategy.vp > 1:
                s = q.strategy.variant(vp=1)
                assert s in listed
                lats = []
                for vp in interleavings(c, spec, g.vertices[v0].role, s.pp, s.mb)[1:]:
                    terms = [_memory_terms(ev.costs, v, s.variant(vp=vp)) for v in f.stage.vertices]
                    per = math.ceil(max(p for p, _ in terms) / MEM_UNIT)
                    tra = math.ceil(max(t for _, t in terms) / MEM_UNIT)
                    if per + tra <= inst.m_eff:
                        lat = sum(ev.costs.op_time(v, s.variant(vp=vp)) for v in f.stage.vertices)
                        lats.append((round(lat / LAT_UNIT), vp))
                assert min(lats)[1] == q.strategy.vp, (f.stage.label, q.strategy)
        for s in listed:
            if not all(ev.costs.runnable(v, s) for v in f.stage.vertices):
                continue  # a rollout engine whose cache holds no full-length sequence
            terms = [_memory_terms(ev.costs, v, s) for v in f.stage.vertices]
            per = math.ceil(max(p for p, _ in terms) / MEM_UNIT)
            tra = math.ceil(max(t for _, t in terms) / MEM_UNIT)
            if per + tra > inst.m_eff or s.size not in size_chain(c):
                continue
            lat = round(sum(ev.costs.op_time(v, s) for v in f.stage.vertices) / LAT_UNIT)
            assert any(dominates(k, (lat, s.size, per, tra)) for k in keys), (f.stage.label, s)


def test_model_stages_group_vertices_by_model_and_role():
    w, c, _ = example_problem("remax-7b-16gpu")
    ev = Evaluator(w, c, k_eval=1)
    labels = {ms.label: ms.names for ms in model_stages(ev.graph)}
    assert labels["(actor, Gen)"] == ("actor_gen", "actor_greedy_gen")
    assert list(labels) == ["(actor, Gen)", "(reference, Inf)", "(reward, Inf)", "(actor, Train)"]


def test_partitions_and_size_chain():
    assert [len(partitions(list(range(k)))) for k in range(1, 5)] == [1, 2, 5, 15]
    gh = hardware_preset("gh200")
    assert size_chain(Cluster.from_shape("2x4x4", gh)) == (1, 2, 4, 8, 16, 32)
    chain = size_chain(Cluster.from_shape("1x6x4", gh))
    assert chain[-1] == 24 and all(b % a == 0 for a, b in zip(chain, chain[1:]))


# ---------------------------------------------------------------------------- results
@pytest.mark.parametrize("name", ["ppo-tiny-tight", "ppo-7b-1x2x4", "grpo-8b-16gpu"])
def test_result_is_feasible_and_passes_the_checker(name, checker):
    w, c = PROBLEMS[name]
    r = solve(w, c, method="dp", k_eval=2)
    assert r.status is Status.FEASIBLE and r.feasible
    assert checker.check(r.to_dict()) == []
    info = r.extra["dp"]
    assert info["step_latency_s"] == pytest.approx(sum(info["stage_latency_s"].values()))


def test_dp_engine_cpsat_gives_the_same_predicted_latency(checker):
    w, c = PROBLEMS["grpo-tiny-tight"]
    a = solve(w, c, method="dp", k_eval=1)
    b = solve(w, c, method="dp", k_eval=1, engine="cpsat", time_limit=30)
    assert a.extra["dp"]["step_latency_s"] == b.extra["dp"]["step_latency_s"]
    assert checker.check(b.to_dict()) == []


def test_structure_all_picks_the_least_predicted_latency():
    w, c = PROBLEMS["ppo-7b-1x2x4"]
    r = solve(w, c, method="dp", structure="all", k_eval=1)
    lats = []
    for y in (Structure.synchronous(w), r.structure):
        lats.append(solve(w, c, method="dp", structure=y, k_eval=1).extra["dp"]["step_latency_s"])
    assert r.extra["dp"]["step_latency_s"] == lats[1] <= lats[0]


def test_deterministic():
    w, c = PROBLEMS["ppo-tiny-tight"]
    a = solve(w, c, method="dp", k_eval=1)
    b = solve(w, c, method="dp", k_eval=1, seed=7)
    assert a.plan.key() == b.plan.key()
    da, db = dict(a.extra["dp"]), dict(b.extra["dp"])
    for d in (da, db):
        for k in ("build_s", "select_s"):
            d.pop(k)
    assert da == db


def test_placed_plan_respects_lanes_and_stages():
    w, c = PROBLEMS["ppo-7b-1x2x4"]
    inst = instance(w, c)
    sel = solve_dp(inst)
    plan = place(inst, sel, sum(len(f.stage.vertices) for f in inst.frontiers))
    for grouping in sel.lanes:
        masks = [plan.choices[inst.frontiers[lane[0]].stage.vertices[0]].mask for lane in grouping]
        assert all(a & b == 0 for a, b in itertools.combinations(masks, 2))  # lanes are disjoint
        for lane in grouping:  # members of a lane share one allocation
            assert len({plan.choices[v].mask for m in lane for v in inst.frontiers[m].stage.vertices}) == 1


# ---------------------------------------------------------------------------- infeasible
def test_infeasible_names_the_model_stage_and_memory(a100_1x1x8):
    r = solve(ppo_70b_workload(), a100_1x1x8, method="dp")
    assert r.status is Status.INFEASIBLE and r.plan is None
    assert "(actor, Train)" in r.message and "GiB" in r.message and "M_eff" in r.message


def test_plan_level_memory_bound_infeasible_message():
    w, c = PROBLEMS["ppo-tiny-tight"]
    inst = instance(w, dataclasses.replace(c, host_offload=False))
    # every model-stage fits alone, but not with the other stages' persistent state (which host
    # offload, SPEC §14.4, would take off the devices: not on these engines)
    lean = max(min(q.footprint for q in f.points) for f in inst.frontiers)
    tight = dataclasses.replace(inst, m_eff=lean)
    with pytest.raises(Infeasible, match=r"no memory-feasible plan: .* GiB over M_eff.*model-stage \(.+\)"):
        solve_dp(tight)
    assert solve_dp_cpsat(tight, time_limit=10).status == "infeasible"


def test_bad_options_name_the_field():
    w, c = PROBLEMS["dpo-tiny"]
    with pytest.raises(ValueError, match="engine"):
        solve(w, c, method="dp", engine="scip")
    with pytest.raises(ValueError, match="structure"):
        solve(w, c, method="dp", structure="sync")
    with pytest.raises(ValueError, match="budget"):
        solve(w, c, method="dp", budget=0)
    with pytest.raises(ValueError, match="no option"):
        solve(w, c, method="dp", polish=True)
    inst = instance(w, c)
    with pytest.raises(ValueError, match="picks"):
        inst.objective([0])


def test_cli_solves_with_dp(tmp_path, capsys, checker):
    out = tmp_path / "r.json"
    assert main(["solve", "dpo-13b-8gpu", "--method", "dp", "--json", str(out), "--k-eval", "1"]) == 0
    doc = json.loads(out.read_text())
    assert doc["method"] == "dp" and checker.check(doc) == []

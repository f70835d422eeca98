"""Host offload and time-shared colocation (SPEC §14.4): the strategy field, its legality rule
Z4, its time and memory terms, and that every method can choose it."""

from __future__ import annotations

import json

import pytest

from rpeg import Cluster, hardware_preset, solve
from rpeg.ir.errors import InputError
from rpeg.ir.hardware import DEFAULT_HOST_BANDWIDTH, Hardware
from rpeg.ir.plan import Choice, Plan, check_strategy_of
from rpeg.ir.types import Role
from rpeg.scoring import fast
from rpeg.scoring.candidates import build_directories, enumerate_strategies
from rpeg.scoring.evaluator import Evaluator
from rpeg.solvers.result import Result
from tests.conftest import tiny_ppo_workload

A100 = hardware_preset("a100-40gb")


@pytest.fixture(scope="module")
def tight():
    """PPO of four Llama-2 7B models on four A100-40GB: without offload every trainer's Adam
    state persists beside the others', and greedy and dp find no plan (measured)."""
    return tiny_ppo_workload(), Cluster.from_shape("1x1x4", A100)


@pytest.fixture(scope="module")
def ev(tight):
    return Evaluator(*tight, k_eval=2)


@pytest.fixture(scope="module")
def dirs(ev):
    return build_directories(ev.costs)


def test_offload_moves_the_persistent_state_into_the_vertexs_own_run(ev, dirs):
    hw = ev.cluster.hardware
    checked = set()
    for d in dirs:
        v = ev.graph.vertices[d.vertex]
        for s in d.strategies:
            if not s.offload:
                continue
            kept = ev.costs.memory(d.vertex, s.variant(offload=False))
            moved = ev.costs.offloaded_bytes(d.vertex, s)
            # a trainer's FP32 master weights and Adam moments, 12·N_s/Pd; a forward pass's copy
            assert moved == (kept.train_state if v.role is Role.TRAINING else kept.weights) > 0
            m = ev.costs.memory(d.vertex, s)
            assert (m.train_state, m.transient) == (0.0, pytest.approx(kept.transient + moved))
            # loaded before the run and offloaded after it, each over BW_host
            t0 = ev.costs.op_time(d.vertex, s.variant(offload=False))
            assert ev.costs.op_time(d.vertex, s) == pytest.approx(t0 + 2 * moved / hw.host_bandwidth)
            for split in (True, False):
                base = ev.costs.phases(d.vertex, s.variant(offload=False), split)
                got = ev.costs.phases(d.vertex, s, split)
                load = moved / hw.host_bandwidth
                want = list(base)
                want[0] += load
                want[-1] += load
                assert got == pytest.approx(tuple(want))
            checked.add(v.role)
    assert checked == {Role.GENERATION, Role.INFERENCE, Role.TRAINING}


def _on_every_gpu(dirs, ev, offload):
    """Each vertex on all four GPUs with its fastest listed strategy of ``offload``."""
    choices = []
    for d in dirs:
        s = next(s for s in d.strategies if s.size == 4 and s.offload == offload)
        choices.append(Choice(s, ev.cluster.allocation((0, 0, 0), s.extent)))
    return Plan(tuple(choices))


@pytest.mark.parametrize("backend", ["python", "compiled"])
def test_a_device_whose_vertices_all_offload_peaks_at_its_largest_phase(tight, dirs, ev, backend):
    # SPEC §14.4: peak(d) is then the maximum over the phases of each one's resident set, not
    # Σ persistent + max transient
    if backend == "compiled":
        assert fast.warm_up(wait=True)  # else the first evaluations take the reference path
    plan = _on_every_gpu(dirs, ev, offload=True)
    mems = [ev.costs.memory(v, c.strategy) for v, c in enumerate(plan.choices)]
    largest = max(m.isolated for m in mems)
    scored = Evaluator(*tight, k_eval=2, backend=backend).evaluate(plan)
    assert scored.memory.max_peak == pytest.approx(largest, rel=1e-12)
    resident = _on_every_gpu(dirs, ev, offload=False)
    assert Evaluator(*tight, k_eval=2, backend=backend).evaluate(resident).memory.max_peak > largest


def test_z4_offload_only_where_the_engines_offload(tight):
    wl, _ = tight
    cpu_like = Cluster.from_shape("1x1x4", A100, host_offload=False)
    ev = Evaluator(wl, cpu_like, k_eval=2)
    for v in ev.graph.vertices:
        spec = ev.graph.models[v.model].spec
        listed = enumerate_strategies(cpu_like, spec, v.sequences, v.role)
        assert listed and not any(s.offload for s in listed)
        why = check_strategy_of(cpu_like, spec, v.role, v.sequences, listed[0].variant(offload=True))
        assert why is not None and why.startswith("Z4: offload=true but the cluster's engines do not offload")
    with pytest.raises(ValueError, match="host_offload must be True or False"):
        Cluster.from_shape("1x1x4", A100, host_offload="no")


def test_greedy_and_dp_find_a_plan_only_with_offload(tight):
    wl, cluster = tight
    for method in ("greedy", "dp"):
        without = solve(wl, Cluster.from_shape("1x1x4", A100, host_offload=False), method)
        assert without.status.value == "infeasible", method
        with_ = solve(wl, cluster, method)
        assert with_.status.value == "feasible" and with_.feasible, method
        assert any(c.strategy.offload for c in with_.plan.choices), method


def test_sa_and_the_exact_models_search_offload(tight):
    wl, cluster = tight
    r = solve(wl, cluster, "sa", max_evaluations=1500, seed=0)
    assert r.feasible
    from rpeg.formulations.plan_model import build_plan_instance, candidate_sets

    ev = Evaluator(wl, cluster, k_eval=2)
    cands = candidate_sets(ev, build_directories(ev.costs), 1)
    # the exact models' candidate sets keep each listed layout in every variant, offload too
    assert all(any(c.strategy.offload for c in row) for row in cands)
    inst = build_plan_instance(ev, cands)
    assert any(m.train_state == 0.0 and m.trains for row in inst.memory for m in row)


def test_the_result_file_keeps_offload_and_the_engines_limit(tight, tmp_path):
    wl, cluster = tight
    r = solve(wl, cluster, "greedy")
    doc = r.to_dict()
    flags = [e["offload"] for e in doc["plan"]]
    assert any(flags)
    back = Result.from_dict(json.loads(json.dumps(doc)))
    assert [c.strategy for c in back.plan.choices] == [c.strategy for c in r.plan.choices]
    assert back.makespan == pytest.approx(r.makespan)
    # a /2 file written before the field reads as no offload
    for e in doc["plan"]:
        e.pop("offload")
    assert not any(c.strategy.offload for c in Result.from_dict(doc).plan.choices)
    # a plan that offloads on engines that cannot is refused on reading, naming rule Z4
    doc = r.to_dict()
    doc["cluster"]["host_offload"] = False
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="Z4"):
        Result.from_json(path)


def test_host_bandwidth_is_read_with_its_default_and_checked():
    d = hardware_preset("h100").to_dict()
    assert d["host_bandwidth"] == pytest.approx(50.4e9)
    del d["host_bandwidth"]
    assert Hardware.from_dict(d).host_bandwidth == DEFAULT_HOST_BANDWIDTH
    d["host_bandwidth"] = -1
    with pytest.raises(InputError, match="host_bandwidth"):
        Hardware.from_dict(d, source="hw.json")


def test_the_exact_models_leave_offload_out_where_no_plan_needs_it():
    # 16 GH200 and the 2 fastest layouts per invocation: every vertex resident on one device
    # fits, so an offloading candidate only adds transfers (formulations.plan_model)
    from rpeg.formulations.plan_model import _offload_can_matter, candidate_sets

    roomy = Evaluator(
        tiny_ppo_workload(batch=256), Cluster.from_shape("1x4x4", hardware_preset("gh200")), k_eval=2
    )
    dirs = build_directories(roomy.costs)
    assert any(s.offload for d in dirs for s in d.strategies)  # listed, then left out
    cands = candidate_sets(roomy, dirs, 2)
    assert cands and not any(c.strategy.offload for row in cands for c in row)
    assert not _offload_can_matter(roomy, cands)
    # a warm start that offloads keeps its choice
    first = [next(i for i, s in enumerate(d.strategies) if s.offload) for d in dirs]
    warm = Plan(tuple(d.choices(roomy.cluster, i)[0] for d, i in zip(dirs, first)))
    kept = candidate_sets(roomy, dirs, 2, include=warm)
    assert all(warm.choices[v] in row for v, row in enumerate(kept))


def test_directories_list_what_filtering_every_offload_variant_would(tight, ev, dirs):
    """``build_directories`` adds the offloading twin of each resident variant it keeps instead
    of enumerating, filtering and comparing the offload variants too (``docs/cost-model.md`` §4,
    "Pruning"): on the tight instance, the same strategies in the same order with the same times
    as the full enumeration, and the same counts of dropped and dominated variants (of plain
    1F1B: the interleaved twins, ``vp > 1``, are added after the filter, test_virtual_pipeline.py)."""
    from rpeg.scoring.candidates import _undominated_modes

    m_eff = ev.cluster.hardware.m_eff
    assert any(s.offload for d in dirs for s in d.strategies)
    for d in dirs:
        v = ev.graph.vertices[d.vertex]
        listed = enumerate_strategies(
            ev.cluster, ev.graph.models[v.model].spec, v.sequences, v.role, interleave=False
        )
        assert any(s.offload for s in listed)
        fits = [
            (ev.costs.op_time(d.vertex, s), j, s)
            for j, s in enumerate(listed)
            if ev.costs.memory(d.vertex, s).isolated <= m_eff and ev.costs.runnable(d.vertex, s)
        ]
        kept, dominated = _undominated_modes(ev.costs, d.vertex, fits)
        kept.sort(key=lambda x: (x[0], x[1]))
        plain = [(t, s) for t, s in zip(d.times, d.strategies) if s.vp == 1]
        assert [s for _, s in plain] == [s for _, _, s in kept]
        assert [t for t, _ in plain] == [t for t, _, _ in kept]
        assert d.dropped == len(listed) - len(fits)
        assert d.dominated >= dominated  # and the dominated twins

"""Tests for ``scoring/candidates.py``: candidate directories ``Xcand(v)`` (SPEC §4)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpeg import Cluster, example_names, hardware_preset
from rpeg.ir import check_strategy
from rpeg.ir.cluster import TIER_CLUSTER, TIER_NODE, TIER_RACK
from rpeg.scoring.candidates import build_directories, enumerate_strategies, make_strategy
from rpeg.scoring.evaluator import Evaluator


def _dirs_cases(problem_of, make_ppo, gh200):
    cases = [(make_ppo(), Cluster.from_shape(shape, gh200)) for shape in ("1x2x4", "2x1x4", "1x1x4")]
    cases += [problem_of(name)[:2] for name in example_names()]
    return cases


@pytest.fixture(scope="module")
def directories(problem_of, make_ppo, gh200):
    out = []
    for workload, cluster in _dirs_cases(problem_of, make_ppo, gh200):
        ev = Evaluator(workload, cluster)
        out.append((ev, build_directories(ev.costs)))
    return out


def test_every_strategy_in_every_directory_is_legal(directories):
    seen = 0
    for ev, dirs in directories:
        assert [d.vertex for d in dirs] == list(range(len(ev.graph.vertices)))
        for d in dirs:
            v = ev.graph.vertices[d.vertex]
            spec = ev.graph.models[v.model].spec
            for s in d.strategies:
                why = check_strategy(ev.cluster, spec, v.role, v.sequences, s.extent, s.dp, s.pp, s.tp, s.mb)
                assert why is None, (v.name, s, why)
                assert s.size == s.extent[0] * s.extent[1] * s.extent[2]
                seen += 1
    assert seen > 100


def test_directories_are_sorted_by_time_and_times_are_op_times(directories):
    for ev, dirs in directories:
        for d in dirs:
            assert len(d.times) == len(d.strategies) > 0
            assert d.times == sorted(d.times)
            for s, t in zip(d.strategies, d.times):
                assert t == ev.costs.op_time(d.vertex, s)


def test_directories_keep_only_isolated_memory_feasible_strategies(directories):
    for ev, dirs in directories:
        m_eff = ev.cluster.hardware.m_eff
        for d in dirs:
            v = ev.graph.vertices[d.vertex]
            legal = enumerate_strategies(ev.cluster, ev.graph.models[v.model].spec, v.sequences, v.role)
            iso = {s: ev.costs.memory(d.vertex, s).isolated for s in legal}
            assert set(d.strategies) == {s for s in legal if iso[s] <= m_eff}
            assert d.dropped == len(legal) - len(d.strategies)
            assert d.smallest_isolated == min(iso.values())


def test_a_small_gpu_drops_strategies_and_reports_the_smallest_footprint(make_ppo, gh200):
    hw = dataclasses.replace(gh200, gpu_memory_bytes=40e9)
    ev = Evaluator(make_ppo(), Cluster.from_shape("1x2x4", hw))
    dirs = build_directories(ev.costs)
    train = dirs[4]  # actor_train
    assert ev.graph.vertices[4].name == "actor_train"
    assert train.dropped > 0
    assert all(ev.costs.memory(4, s).isolated <= hw.m_eff for s in train.strategies)


def test_choices_are_every_aligned_origin(directories):
    for ev, dirs in directories[:3]:
        cluster = ev.cluster
        for d in dirs:
            for i in range(len(d)):
                choices = d.choices(cluster, i)
                s = d.strategies[i]
                assert len(choices) == cluster.num_devices // s.size
                union = 0
                for c in choices:
                    assert c.strategy == s
                    # P7: building the allocation from its origin validates the alignment
                    assert cluster.allocation(c.allocation.origin, s.extent) == c.allocation
                    assert union & c.mask == 0
                    union |= c.mask
                assert union == cluster.all_mask


# ---------------------------------------------------------------------------- known answers
def test_enumerate_strategies_on_one_node_by_hand(cluster_1x1x4):
    # 1x1x4, L = 4, B·R = 32. Sizes 1, 2, 4 (must divide Ng = 4), tp ∈ {1, 2, 4}, pp ∈ {1, 2, 4}.
    # pp > 1 needs mb | 32/dp, mb ≥ pp, (32/dp)/mb ≥ 8:
    #   dp=1: B_local 32 → pp=2: mb ∈ {2, 4}; pp=4: mb = 4.   dp=2: B_local 16 → pp=2: mb = 2.
    expected = {
        (1, 1, 1, 1),
        # 2 GPUs
        (2, 1, 1, 1),
        (1, 2, 1, 2),
        (1, 2, 1, 4),
        (1, 1, 2, 1),
        # 4 GPUs
        (4, 1, 1, 1),
        (2, 2, 1, 2),
        (1, 4, 1, 4),
        (2, 1, 2, 1),
        (1, 2, 2, 2),
        (1, 2, 2, 4),
        (1, 1, 4, 1),
    }
    got = enumerate_strategies(cluster_1x1x4, 4, 32)
    assert len(got) == len(expected)
    assert {(s.dp, s.pp, s.tp, s.mb) for s in got} == expected
    for s in got:
        assert s.extent == (1, 1, s.size)
        assert (s.pp_tier, s.dp_tier) == (TIER_NODE, TIER_NODE)


def test_odd_layer_count_allows_no_pipeline(cluster_1x1x4):
    got = enumerate_strategies(cluster_1x1x4, 5, 32)
    assert {s.pp for s in got} == {1}
    assert {(s.dp, s.tp) for s in got} == {(1, 1), (2, 1), (1, 2), (4, 1), (2, 2), (1, 4)}


def test_tiers_of_strategies_spanning_racks_and_nodes(cluster_2x1x4, cluster_1x2x4):
    # two racks of one node: an 8-GPU allocation spans racks
    by_degrees = {(s.dp, s.pp, s.tp, s.mb): s for s in enumerate_strategies(cluster_2x1x4, 4, 32)}
    assert by_degrees[(2, 1, 4, 1)].dp_tier == TIER_CLUSTER  # DP group across racks
    assert by_degrees[(2, 1, 4, 1)].pp_tier == TIER_NODE  # a replica is one node
    assert by_degrees[(1, 2, 4, 2)].pp_tier == TIER_CLUSTER  # pipeline across racks
    assert by_degrees[(1, 2, 4, 2)].dp_tier == TIER_NODE  # no DP group
    assert by_degrees[(8, 1, 1, 1)].dp_tier == TIER_CLUSTER
    # two nodes of one rack: the same shapes span nodes only
    by_degrees = {(s.dp, s.pp, s.tp, s.mb): s for s in enumerate_strategies(cluster_1x2x4, 4, 32)}
    assert by_degrees[(2, 1, 4, 1)].dp_tier == TIER_RACK
    assert by_degrees[(1, 2, 4, 2)].pp_tier == TIER_RACK
    assert by_degrees[(2, 2, 2, 2)].pp_tier == TIER_NODE  # a replica of 4 GPUs fits one node
    assert by_degrees[(2, 2, 2, 2)].dp_tier == TIER_RACK
    assert make_strategy(cluster_1x2x4, (1, 1, 4), 2, 1, 2, 1).dp_tier == TIER_NODE


# ---------------------------------------------------------------------------- completeness
@settings(max_examples=40, deadline=None)
@given(
    racks=st.sampled_from([1, 2]),
    nodes=st.sampled_from([1, 2, 4]),
    gpus=st.sampled_from([1, 2, 4, 8]),
    layers=st.sampled_from([1, 2, 3, 4, 6, 8, 12]),
    sequences=st.integers(1, 64),
)
def test_enumeration_is_exactly_the_legal_set(checker, racks, nodes, gpus, layers, sequences):
    # brute force over every degree triple and microbatch count, judged by the independent
    # checker's P1–P8 (tests/tools/check_result.py), not by the package's check_strategy
    cluster = Cluster(racks, nodes, gpus, hardware_preset("gh200"))
    dims = cluster.shape
    legal = set()
    for size in cluster.legal_sizes:
        extent = list(cluster.shape_for_size(size))
        for dp, pp in itertools.product(range(1, size + 1), repeat=2):
            if size % (dp * pp):
                continue
            tp = size // (dp * pp)
            for mb in range(1, sequences + 1):
                entry = {"vertex": "v", "origin": [0, 0, 0], "extent": extent}
                entry.update(dp=dp, pp=pp, tp=tp, mb=mb)
                if not checker._check_entry(entry, layers, sequences, dims):
                    legal.add((tuple(extent), dp, pp, tp, mb))
    got = enumerate_strategies(cluster, layers, sequences)
    keys = [(s.extent, s.dp, s.pp, s.tp, s.mb) for s in got]
    assert len(keys) == len(set(keys))
    assert set(keys) == legal


# ---------------------------------------------------------------------------- recomputation modes
def test_training_layouts_come_in_every_recompute_mode(directories):
    from rpeg.ir import Recompute, Role

    for ev, dirs in directories:
        for d in dirs:
            v = ev.graph.vertices[d.vertex]
            modes = {s.recompute for s in d.strategies}
            if v.role is not Role.TRAINING:
                assert modes == {Recompute.FULL}, v.name  # the neutral value, nothing to search
                continue
            legal = enumerate_strategies(ev.cluster, ev.graph.models[v.model].spec, v.sequences, v.role)
            layouts = {(s.extent, s.dp, s.pp, s.tp, s.mb) for s in legal}
            assert len(legal) == 3 * len(layouts)
            # what the directory left out was either over M_eff or dominated by a mode of its layout
            assert len(d) + d.dropped + d.dominated == len(legal)


def test_a_mode_no_faster_and_no_leaner_than_another_is_dominated(gh200):
    # One layer, no pipelining: `none` keeps one layer of one microbatch, exactly what
    # `selective` holds as its recompute buffer, so `selective` needs the same memory and is slower.
    from rpeg import Workload
    from rpeg.ir import Recompute, Role
    from rpeg.ir.models import model_preset

    one = model_preset("7b").scaled(layers=1, hidden=256, heads=4, vocab=512)
    w = Workload("dpo", {"actor": one}, 16, 2, 32, 32)
    ev = Evaluator(w, Cluster.from_shape("1x1x4", gh200))
    (train,) = [d for d in build_directories(ev.costs) if ev.graph.vertices[d.vertex].role is Role.TRAINING]
    assert {s.recompute for s in train.strategies} == {Recompute.NONE, Recompute.FULL}
    assert train.dominated == sum(s.recompute is Recompute.NONE for s in train.strategies) > 0
    for s in train.strategies:
        if s.recompute is Recompute.NONE:
            sel = s.with_recompute("selective")
            assert ev.costs.memory(train.vertex, sel).isolated == ev.costs.memory(train.vertex, s).isolated
            assert ev.costs.op_time(train.vertex, sel) > ev.costs.op_time(train.vertex, s)


def test_fastest_layouts_keep_every_mode_of_a_layout(directories):
    for _, dirs in directories:
        for d in dirs:
            idx = d.fastest_layouts(2)
            keys = {
                (
                    d.strategies[i].extent,
                    d.strategies[i].dp,
                    d.strategies[i].pp,
                    d.strategies[i].tp,
                    d.strategies[i].mb,
                )
                for i in idx
            }
            assert len(keys) == min(2, len({(s.extent, s.dp, s.pp, s.tp, s.mb) for s in d.strategies}))
            assert idx == sorted(idx) and 0 in idx
            for i, s in enumerate(d.strategies):
                assert (i in idx) == ((s.extent, s.dp, s.pp, s.tp, s.mb) in keys)
            assert d.fastest_layouts(None) == list(range(len(d)))

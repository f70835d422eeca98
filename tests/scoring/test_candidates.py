"""Tests for ``scoring/candidates.py``: candidate directories ``Xcand(v)`` (SPEC §4, with §14's
microbatch rules and engine variants: ``docs/cost-model.md`` §4 "Pruning" and §8)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpeg import Cluster, example_names, hardware_preset
from rpeg.ir import Recompute, Role
from rpeg.ir.cluster import NO_SPLITS, TIER_CLUSTER, TIER_NODE, TIER_RACK
from rpeg.ir.plan import check_strategy_of
from rpeg.scoring.candidates import (
    build_directories,
    engine_variants,
    enumerate_strategies,
    fastest_interleaving,
    make_strategy,
    microbatch_counts,
)
from rpeg.scoring.evaluator import Evaluator

#: The memory fractions a generation's directory lists on hardware whose default is 0.9
#: (``docs/cost-model.md`` §8): 0.05, 0.1, 0.2, ..., 0.9.
FRACTIONS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def _variants(role, dp=2, offload=True):
    """The engine choices listed per layout (``docs/decisions.md``, "Directories list, then
    prune"), as ``(zero, logits_chunk, recompute, mem_fraction, offload)``; ZeRO stage 3 only
    with more than one data-parallel rank (one rank shards nothing); each with and without host
    offload when the cluster's engines offload (role ``None``: neither)."""
    stages = (2, 3) if dp > 1 else (2,)
    hosts = (False, True) if offload and role is not None else (False,)
    if role is Role.TRAINING:
        base = {(z, c, m, 0.0) for z in stages for c in (0, 4096) for m in (Recompute.NONE, Recompute.FULL)}
    elif role is Role.INFERENCE:
        base = {(z, c, Recompute.FULL, 0.0) for z in stages for c in (0, 4096)}
    elif role is Role.GENERATION:
        base = {(2, 0, Recompute.FULL, u) for u in FRACTIONS}
    else:
        base = {(2, 0, Recompute.FULL, 0.0)}
    return {(*b, h) for b in base for h in hosts}


def _variant(s):
    return (s.zero, s.logits_chunk, s.recompute, s.mem_fraction, s.offload)


def _without_splits(cluster):
    """``cluster`` with SPEC §15's parallelisms off: the plan space of SPEC §4 and §14."""
    return dataclasses.replace(cluster, **NO_SPLITS)


def _listed_mb(role, pp, b_local, mb):
    """Whether a directory lists ``mb`` (SPEC §14.2): a generation every legal one (SPEC §4's
    P4–P5 leave only what it lists); training and inference the powers of two and, with
    pipelining, SPEC §6's divisors (``mb | B_local``, ``B_local/mb ≥ 8``)."""
    if role is Role.GENERATION:
        return True
    power = mb & (mb - 1) == 0
    spec6 = pp > 1 and b_local % mb == 0 and b_local // mb >= 8
    return power or spec6


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
                why = check_strategy_of(ev.cluster, spec, v.role, v.sequences, s)
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


def _group(s):
    """What dominance compares within: the degrees (the interleaving too), the ZeRO stage and
    host offload (same persistent state)."""
    return (s.extent, s.dp, s.pp, s.tp, s.vp, s.zero, s.offload)


def _fastest_twin(ev, vertex, s):
    """The fastest interleaved twin of ``s`` that fits alone and starts, by brute force over
    every legal ``vp > 1`` (the directory scans them in order and stops early)."""
    from rpeg.scoring.candidates import interleavings

    v = ev.graph.vertices[vertex]
    spec = ev.graph.models[v.model].spec
    twins = [s.variant(vp=vp) for vp in interleavings(ev.cluster, spec, v.role, s.pp, s.mb)[1:]]
    fits = [
        (ev.costs.op_time(vertex, t), k, t)
        for k, t in enumerate(twins)
        if ev.costs.memory(vertex, t).isolated <= ev.cluster.hardware.m_eff and ev.costs.runnable(vertex, t)
    ]
    return min(fits)[2] if fits else None


def _undominated(feasible, time, transient):
    """The strategies of ``feasible`` (``(listing index, strategy)`` pairs) that no other one of
    their group beats: no slower and no more transient memory, one of them strictly, or equal
    in both and listed first (``docs/cost-model.md`` §4, "Pruning")."""
    groups: dict[tuple, list] = {}
    for j, s in feasible:
        groups.setdefault(_group(s), []).append((j, s))
    out = set()
    for j, s in feasible:
        t, m = time[s], transient[s]
        if not any(
            j2 != j and time[s2] <= t and transient[s2] <= m and (time[s2] < t or transient[s2] < m or j2 < j)
            for j2, s2 in groups[_group(s)]
        ):
            out.add(s)
    return out


def test_directories_keep_only_isolated_memory_feasible_undominated_strategies(directories):
    # A directory keeps every legal resident strategy within M_eff in isolation unless another
    # variant with the same (extent, Pd, Pp, Pt, z) is no slower and holds no more transient
    # memory (one of them strictly; of two equal ones the first listed stays), and with host
    # offload allowed the offloading twin of each one it keeps: its time and transient are the
    # twin's shifted by constants of the group (the transfers and the moved state, checked in
    # test_offload.py), so the twins' dominance is the residents'.
    dominated_somewhere = 0
    for ev, dirs in directories:
        m_eff = ev.cluster.hardware.m_eff
        n = 2 if ev.cluster.host_offload else 1
        for d in dirs:
            v = ev.graph.vertices[d.vertex]
            spec = ev.graph.models[v.model].spec
            legal = enumerate_strategies(
                ev.cluster, spec, v.sequences, v.role, offload=False, interleave=False
            )
            mem = {s: ev.costs.memory(d.vertex, s) for s in legal}
            feasible = [
                (j, s)
                for j, s in enumerate(legal)
                if mem[s].isolated <= m_eff and ev.costs.runnable(d.vertex, s)  # an engine that starts
            ]
            time = {s: ev.costs.op_time(d.vertex, s) for _, s in feasible}
            transient = {s: mem[s].transient for _, s in feasible}
            undominated = _undominated(feasible, time, transient)
            # each kept plain-1F1B strategy's fastest interleaved twin, filtered among themselves
            position = {s: j for j, s in enumerate(legal)}
            found = [
                tw
                for s in sorted(undominated, key=position.__getitem__)
                if (tw := _fastest_twin(ev, d.vertex, s))
            ]
            time |= {tw: ev.costs.op_time(d.vertex, tw) for tw in found}
            transient |= {tw: ev.costs.memory(d.vertex, tw).transient for tw in found}
            kept_twins = _undominated(list(enumerate(found)), time, transient)
            assert {s for s in d.strategies if not s.offload} == undominated | kept_twins, v.name
            resident = undominated | kept_twins
            twins = {s.variant(offload=True) for s in resident} if n == 2 else set()
            assert {s for s in d.strategies if s.offload} == twins, v.name
            assert d.dropped == n * (len(legal) - len(feasible))
            assert d.dominated == n * (len(feasible) - len(undominated) + len(found) - len(kept_twins))
            assert d.smallest_isolated == min(m.isolated for m in mem.values())
            dominated_somewhere += d.dominated
            # nothing is lost: what was left out has a kept rival at least as fast and as lean,
            # holding the same persistent state
            kept: dict[tuple, list] = {}
            for s in undominated:
                kept.setdefault(_group(s), []).append(s)
            for _, s in feasible:
                if s in undominated:
                    continue
                rivals = kept[_group(s)]
                assert any(time[s2] <= time[s] and transient[s2] <= transient[s] for s2 in rivals)
                for s2 in rivals:
                    assert (mem[s2].weights, mem[s2].train_state) == (mem[s].weights, mem[s].train_state)
    assert dominated_somewhere > 0


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
def test_microbatch_counts_by_hand():
    # a generation keeps SPEC §4's P4–P5: mb = 1 without pipelining, else mb | B_local,
    # mb ≥ Pp and B_local/mb ≥ 8
    assert microbatch_counts(Role.GENERATION, 1, 32) == [1]
    assert microbatch_counts(Role.GENERATION, 2, 32) == [2, 4]
    assert microbatch_counts(Role.GENERATION, 4, 32) == [4]
    assert microbatch_counts(Role.GENERATION, 2, 8) == []
    # training and inference: powers of two ≤ B_local (and ≥ Pp), with pipelining also
    # SPEC §6's divisors: 48 → 3 and 6 join 2, 4, 8, 16, 32
    for role in (Role.TRAINING, Role.INFERENCE, None):
        assert microbatch_counts(role, 1, 12) == [1, 2, 4, 8]
        assert microbatch_counts(role, 1, 48) == [1, 2, 4, 8, 16, 32]
        assert microbatch_counts(role, 2, 48) == [2, 3, 4, 6, 8, 16, 32]
        assert microbatch_counts(role, 4, 32) == [4, 8, 16, 32]
        assert microbatch_counts(role, 4, 2) == []  # fewer sequences than stages


def test_engine_variants_by_hand(cluster_1x1x4):
    base = make_strategy(cluster_1x1x4, (1, 1, 2), 2, 1, 1, 1)
    got = engine_variants(base, Role.TRAINING, 0.9)
    assert len(got) == 8 and {_variant(s) for s in got} == _variants(Role.TRAINING, offload=False)
    got = engine_variants(base, Role.INFERENCE, 0.9)
    assert len(got) == 4 and {_variant(s) for s in got} == _variants(Role.INFERENCE, offload=False)
    # engines that offload to the host (SPEC §14.4): each variant also with offload, after them
    got = engine_variants(base, Role.TRAINING, 0.9, offload=True)
    assert len(got) == 16 and {_variant(s) for s in got} == _variants(Role.TRAINING)
    assert [s.offload for s in got] == [False] * 8 + [True] * 8
    assert engine_variants(base, None, 0.9, offload=True) == [base]
    got = engine_variants(base, Role.GENERATION, 0.9)
    assert [s.mem_fraction for s in got] == list(FRACTIONS)
    # the hardware's fraction caps the list and is always in it
    got = engine_variants(base, Role.GENERATION, 0.35)
    assert [s.mem_fraction for s in got] == [0.05, 0.1, 0.2, 0.3, 0.35]
    assert engine_variants(base, None, 0.9) == [base]
    for s in engine_variants(base, Role.TRAINING, 0.9):
        assert (s.extent, s.dp, s.pp, s.tp, s.mb, s.pp_tier, s.dp_tier) == (
            base.extent,
            base.dp,
            base.pp,
            base.tp,
            base.mb,
            base.pp_tier,
            base.dp_tier,
        )


def test_enumerate_strategies_on_one_node_by_hand(cluster_1x1x4):
    # 1x1x4, L = 4, B·R = 32. Sizes 1, 2, 4 (must divide Ng = 4), tp ∈ {1, 2, 4}, pp ∈ {1, 2, 4}.
    # A generation (SPEC §4): pp > 1 needs mb | 32/dp, mb ≥ pp, (32/dp)/mb ≥ 8:
    #   dp=1: B_local 32 → pp=2: mb ∈ {2, 4}; pp=4: mb = 4.   dp=2: B_local 16 → pp=2: mb = 2.
    generation = {
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
    # Training (SPEC §14.2): mb ≤ B_local = 32/dp and mb ≥ pp, listed as powers of two (the
    # divisors of SPEC §6 add nothing here: 2 and 4 are powers of two).
    powers = {1, 2, 4, 8, 16, 32}
    layouts = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2)]  # 1 and 2 GPUs
    layouts += [(4, 1, 1), (2, 2, 1), (1, 4, 1), (2, 1, 2), (1, 2, 2), (1, 1, 4)]  # 4 GPUs
    training = {(dp, pp, tp, mb) for dp, pp, tp in layouts for mb in powers if pp <= mb <= 32 // dp}
    assert len(training) == 6 + (5 + 5 + 6) + (4 + 4 + 4 + 5 + 5 + 6) == 50
    assert (2, 2, 1, 2) in training and (2, 2, 1, 1) not in training and (4, 1, 1, 16) not in training
    cluster_1x1x4 = _without_splits(cluster_1x1x4)  # SPEC §15's splits: tested below
    for role, expected in ((Role.GENERATION, generation), (Role.TRAINING, training)):
        got = enumerate_strategies(cluster_1x1x4, 4, 32, role)
        # every layout once per engine variant (ZeRO-3 only with dp > 1), and nothing else
        assert len(got) == sum(len(_variants(role, key[0])) for key in expected)
        assert {(s.dp, s.pp, s.tp, s.mb, _variant(s)) for s in got} == {
            (*key, var) for key in expected for var in _variants(role, key[0])
        }
        for s in got:
            assert s.extent == (1, 1, s.size)
            assert (s.pp_tier, s.dp_tier) == (TIER_NODE, TIER_NODE)
    # B·R = 48, dp = 1, pp = 2: SPEC §6's divisors 3 and 6 are listed for training too
    got = {
        s.mb
        for s in enumerate_strategies(cluster_1x1x4, 4, 48, Role.TRAINING)
        if (s.dp, s.pp, s.tp) == (1, 2, 1)
    }
    assert got == {2, 3, 4, 6, 8, 16, 32}
    got = {
        s.mb
        for s in enumerate_strategies(cluster_1x1x4, 4, 48, Role.TRAINING)
        if (s.dp, s.pp, s.tp) == (1, 1, 1)
    }
    assert got == {1, 2, 4, 8, 16, 32}


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
_CHECKER_ROLE = {
    Role.GENERATION: "generation",
    Role.INFERENCE: "inference",
    Role.TRAINING: "training",
    None: "inference",
}


@pytest.mark.parametrize("role", [Role.GENERATION, Role.INFERENCE, Role.TRAINING, None])
@settings(max_examples=40, deadline=None)
@given(
    racks=st.sampled_from([1, 2]),
    nodes=st.sampled_from([1, 2, 4]),
    gpus=st.sampled_from([1, 2, 4, 8]),
    layers=st.sampled_from([1, 2, 3, 4, 6, 8, 12]),
    sequences=st.integers(1, 64),
)
def test_enumeration_is_exactly_the_legal_set(checker, role, racks, nodes, gpus, layers, sequences):
    # brute force over every degree triple and microbatch count, judged by the independent
    # checker's P1–P8 with the role's P4–P5 and its Z1–Z2 (tests/tools/check_result.py), not by
    # the package's check_strategy; training and inference list the microbatch counts of
    # SPEC §14.2 (powers of two, and SPEC §6's divisors with pipelining), every layout once per
    # engine variant (role None: the training rules, no variants)
    cluster = _without_splits(Cluster(racks, nodes, gpus, hardware_preset("gh200")))
    dims = cluster.shape
    name = _CHECKER_ROLE[role]
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
                errors = checker._check_entry(entry, layers, sequences, dims, role=name)
                errors += checker._check_heads(entry, gpus, gpus, name)
                if not errors and _listed_mb(role, pp, sequences // dp, mb):
                    legal.add((tuple(extent), dp, pp, tp, mb))
    got = enumerate_strategies(cluster, layers, sequences, role)
    keys = [(s.extent, s.dp, s.pp, s.tp, s.mb, _variant(s)) for s in got]
    assert len(keys) == len(set(keys))
    assert {k[:5] for k in keys} == legal
    assert len(keys) == sum(len(_variants(role, dp)) for _, dp, *_ in legal)
    for k in keys:
        assert k[5] in _variants(role, k[1])
    for s in got:
        entry = {"vertex": "v", "zero": s.zero, "mem_fraction": s.mem_fraction}
        entry.update(logits_chunk=s.logits_chunk, packing=s.packing, offload=s.offload)
        assert checker._check_engine_fields(entry, name if role is not None else "training") == []


# ---------------------------------------------------------------------------- engine variants
def test_layouts_come_in_every_engine_variant(directories):
    for ev, dirs in directories:
        for d in dirs:
            v = ev.graph.vertices[d.vertex]
            modes = {s.recompute for s in d.strategies}
            if v.role is Role.TRAINING:
                # selective keeps what none keeps (fused attention) and is never listed
                assert modes <= {Recompute.NONE, Recompute.FULL}, v.name
            else:
                assert modes == {Recompute.FULL}, v.name  # the neutral value, nothing to search
            if v.role is Role.GENERATION:
                assert {(s.zero, s.logits_chunk, s.packing) for s in d.strategies} == {(2, 0, True)}
            else:
                assert {s.mem_fraction for s in d.strategies} == {0.0}
            spec = ev.graph.models[v.model].spec
            legal = enumerate_strategies(ev.cluster, spec, v.sequences, v.role)
            by_layout: dict[tuple, set] = {}
            for s in legal:
                key = (s.extent, s.dp * s.cp, s.pp, s.tp, s.cp, s.cp_kind, s.ep, s.sp, s.mb, s.vp)
                by_layout.setdefault(key, set()).add(_variant(s))
            assert all(vs == _variants(v.role, key[1]) for key, vs in by_layout.items()), v.name
            assert len(legal) == sum(len(_variants(v.role, key[1])) for key in by_layout)
            # what the directory left out was either over M_eff or dominated by a variant; of the
            # interleavings only each kept plain strategy's fastest twin was considered
            plain = enumerate_strategies(ev.cluster, spec, v.sequences, v.role, interleave=False)
            found = sum(
                fastest_interleaving(ev.costs, d.vertex, s) is not None
                for s in d.strategies
                if s.vp == 1 and not s.offload
            )
            n = 2 if ev.cluster.host_offload else 1
            assert len(d) + d.dropped + d.dominated == len(plain) + n * found


def test_a_variant_no_faster_and_no_leaner_than_another_is_dominated(gh200):
    # One layer: with fused attention `selective` keeps what `none` keeps and recomputes the
    # attention core besides, so it would always be dominated (and is not listed); `full`
    # keeps less and takes longer. A forward's chunked loss takes no time: with no microbatch
    # above 4096 tokens it holds as much as the whole loss, so the whole loss (listed first) stays.
    from rpeg import Workload
    from rpeg.ir.models import model_preset

    one = model_preset("7b").scaled(layers=1, hidden=256, heads=4, vocab=512)
    w = Workload("dpo", {"actor": one}, 16, 2, 32, 32)
    ev = Evaluator(w, Cluster.from_shape("1x1x4", gh200))
    dirs = build_directories(ev.costs)
    (train,) = [d for d in dirs if ev.graph.vertices[d.vertex].role is Role.TRAINING]
    assert {s.recompute for s in train.strategies} == {Recompute.NONE, Recompute.FULL}
    assert train.dominated > 0
    for s in train.strategies:
        if s.recompute is not Recompute.NONE:
            continue
        m, t = ev.costs.memory(train.vertex, s), ev.costs.op_time(train.vertex, s)
        sel = s.with_recompute("selective")
        assert ev.costs.memory(train.vertex, sel) == m
        assert ev.costs.op_time(train.vertex, sel) >= t * (1 - 1e-12)  # (rounding)
        full = s.with_recompute("full")
        assert ev.costs.memory(train.vertex, full).transient < m.transient
        assert ev.costs.op_time(train.vertex, full) >= t * (1 - 1e-12)
        # (on z = 3 an exposed ZeRO-3 gather may hide the extra GEMMs; with context parallelism
        # the recomputed attention core may hide as much of an exposed ring)
        if s.zero == 2 and s.cp == 1:
            assert ev.costs.op_time(train.vertex, sel) > t
            assert ev.costs.op_time(train.vertex, full) > ev.costs.op_time(train.vertex, sel)
    inference = [d for d in dirs if ev.graph.vertices[d.vertex].role is Role.INFERENCE]
    assert inference
    for d in inference:
        assert {s.logits_chunk for s in d.strategies} == {0}
        assert d.dominated >= len(d)  # at least each kept strategy's chunked twin
        for s in d.strategies:
            chunked = s.variant(logits_chunk=4096)
            assert ev.costs.op_time(d.vertex, chunked) == ev.costs.op_time(d.vertex, s)
            assert ev.costs.memory(d.vertex, chunked) == ev.costs.memory(d.vertex, s)


def test_fastest_layouts_keep_every_variant_of_a_layout(directories):
    # a layout is (extent, Pd, Pp, Pt, Pc, kind, Pe, sp, mb, z, Pv, etp); its variants differ in
    # recomputation, loss chunking or memory fraction only
    def layout(s):
        return (s.extent, s.dp, s.pp, s.tp, s.cp, s.cp_kind, s.ep, s.sp, s.mb, s.zero, s.vp, s.etp)

    for _, dirs in directories:
        for d in dirs:
            idx = d.fastest_layouts(2)
            keys = {layout(d.strategies[i]) for i in idx}
            assert len(keys) == min(2, len({layout(s) for s in d.strategies}))
            assert idx == sorted(idx) and 0 in idx
            for i, s in enumerate(d.strategies):
                assert s.layout_key() == layout(s)
                assert (i in idx) == (layout(s) in keys)
            assert d.fastest_layouts(None) == list(range(len(d)))

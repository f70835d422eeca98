"""Megatron-core's flex dispatcher (DeepEP, HybridEP) as ``Strategy.flex_dispatch`` (issue 31;
``docs/cost-model.md`` §10): each token once per rank holding one of its experts, across a network
hop once per node; rule E6, the cluster switch, directories, files and the runtime's refusal."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from rpeg import hardware_preset
from rpeg.costmodel.collectives import flex_dispatch_time, hierarchical_alltoall_time, untouched_share
from rpeg.costmodel.layout import Layout
from rpeg.costmodel.time import op_time
from rpeg.ir import Role
from rpeg.ir.cluster import NO_SPLITS
from rpeg.ir.hardware import Link
from rpeg.ir.plan import check_strategy
from rpeg.scoring.candidates import enumerate_strategies, make_strategy
from tests.costmodel.moe_plans import H100, MOE, NODE, TWO_NODES, bundled_cluster, small_moe_plan

T, INF, G = Role.TRAINING, Role.INFERENCE, Role.GENERATION
# every sequence 4,096 tokens long (the mean and the mean square given, no length distribution)
ARGS = {"sequences": 256, "prompt_len": 2048, "response_len": 2048, "tokens": 4096.0, "tokens_sq": 4096.0**2}


# ---------------------------------------------------------------------------- the formula
def test_untouched_share_is_the_hypergeometric_miss():
    assert untouched_share(8, 2, 2) == pytest.approx(math.comb(6, 2) / math.comb(8, 2))
    assert untouched_share(128, 16, 8) == pytest.approx(math.comb(112, 8) / math.comb(128, 8))
    assert untouched_share(8, 0, 3) == 1.0 and untouched_share(8, 8, 1) == 0.0
    with pytest.raises(ValueError, match="need 0 <= m <= E"):
        untouched_share(8, 9, 2)


def test_one_node_sends_each_token_once_per_rank_by_hand():
    """EP 8 of Qwen3-30B-A3B in one node: 16 experts per rank, a token reaches a given other
    rank with q_r = 1 − C(112, 8)/C(128, 8) ≈ 0.66, where the AlltoAll sends k/p = 1 copy."""
    link = H100.collective[0]
    q_r = 1.0 - math.comb(112, 8) / math.comb(128, 8)
    assert 0.6 < q_r < 0.7
    rows = 4096 * 2048 * 2.0
    t = flex_dispatch_time(8, 8, rows, q_r, 1.0, link, link)
    assert t == pytest.approx(7 * link.alpha + rows * 7 * q_r * link.beta)
    assert t < hierarchical_alltoall_time(8, 8, rows * 8 * 7 / 8, link, link)


def test_across_a_network_hop_each_token_crosses_once_per_node_by_hand():
    """EP 16 over two DGX H100: N = 2 nodes of g = 8 ranks; off the node a token goes once if
    the other node holds one of its experts (q_n = 1 − C(64, 8)/C(128, 8)), and that node's
    rank of the same index forwards it over NVLink to the ranks that need it."""
    near, far = H100.collective[0], H100.collective[1]
    assert far.beta >= 2 * near.beta  # a network hop
    q_r = 1.0 - math.comb(120, 8) / math.comb(128, 8)
    q_n = 1.0 - math.comb(64, 8) / math.comb(128, 8)
    rows = 4096 * 2048 * 2.0
    expected = max(7 * near.alpha + rows * 2 * 7 * q_r * near.beta, 1 * far.alpha + rows * 1 * q_n * far.beta)
    assert flex_dispatch_time(16, 8, rows, q_r, q_n, near, far) == pytest.approx(expected)
    standard = hierarchical_alltoall_time(16, 8, rows * 8 * 15 / 16, near, far)
    assert flex_dispatch_time(16, 8, rows, q_r, q_n, near, far) < standard / 3  # 4 copies off-node → ~1


def test_inside_an_nvlink_domain_of_trays_it_sends_directly():
    """GB200 NVL72: the trays' link is the GPUs' NVLink, no network hop; HybridEP sends straight to
    every rank (q_r per rank, split between the tray's and the rack's link like the AlltoAll)."""
    hw = hardware_preset("gb200-nvl72")
    near, far = hw.collective[0], hw.collective[1]
    assert far.beta < 2 * near.beta
    q_r, rows = 0.25, 1e6
    expected = max(3 * near.alpha + rows * 3 * q_r * near.beta, 28 * far.alpha + rows * 28 * q_r * far.beta)
    assert flex_dispatch_time(32, 4, rows, q_r, 0.9, near, far) == pytest.approx(expected)


@pytest.mark.parametrize("name", ["h100", "h200", "b200", "b300", "gb200-nvl72", "gb300-nvl72", "a100-80gb"])
def test_never_slower_than_the_alltoall_on_any_preset(name):
    """The directories list only the flex variant where the engines have it: on every preset,
    tier and EP shape it costs at most the AlltoAll of the same tokens."""
    hw = hardware_preset(name)
    for (experts, k), (p, g), tier in itertools.product(
        [(128, 8), (256, 8), (64, 6), (32, 4), (8, 2)],
        [(8, 8), (4, 4), (16, 8), (32, 8), (64, 8), (16, 4)],
        (1, 2),
    ):
        if experts % p:
            continue
        rows = 3e5
        q_r = 1.0 - untouched_share(experts, experts // p, k)
        q_n = 1.0 - untouched_share(experts, experts // p * g, k)
        near, far = hw.collective[0], hw.collective[tier]
        flex = flex_dispatch_time(p, g, rows, q_r, q_n, near, far)
        assert flex <= hierarchical_alltoall_time(p, g, rows * k * (p - 1) / p, near, far) * (1 + 1e-12)


def test_a_link_almost_as_fast_as_the_node_sends_directly():
    near, close = Link(1e-6, 1e-11), Link(1e-6, 1.5e-11)
    direct = max(3 * 1e-6 + 10 * 3 * 0.5 * 1e-11, 4 * 1e-6 + 10 * 4 * 0.5 * 1.5e-11)
    assert flex_dispatch_time(8, 4, 10.0, 0.5, 0.9, near, close) == pytest.approx(direct)


# ---------------------------------------------------------------------------- the node
def test_a_training_nodes_dispatch_gets_cheaper_and_nothing_else_changes():
    s = make_strategy(TWO_NODES, (1, 2, 8), 16, 1, 1, 16, ep=16).variant(recompute="none")
    plain = op_time(MOE, T, Layout(s), H100, **ARGS)
    flex = op_time(MOE, T, Layout(s.variant(flex_dispatch=True)), H100, **ARGS)
    assert 0 < flex.ep_comm < plain.ep_comm / 2
    for f in ("gemm", "bubble", "tp_comm", "pp_comm", "dp_comm", "nongemm", "opt"):
        assert getattr(flex, f) == getattr(plain, f), f
    # per layer and microbatch (16 of one 4,096-token sequence on each rank): a dispatch and a
    # combine forward, the same backward
    q_r = 1.0 - untouched_share(128, 8, 8)
    q_n = 1.0 - untouched_share(128, 64, 8)
    one = flex_dispatch_time(16, 8, 4096 * MOE.hidden * 2, q_r, q_n, H100.collective[0], H100.collective[1])
    assert flex.ep_comm == pytest.approx(4 * 16 * MOE.moe_layers * one, rel=1e-9)
    # the overlap hides the cheaper AlltoAlls
    both = op_time(MOE, T, Layout(s.variant(flex_dispatch=True, ep_overlap=True)), H100, **ARGS)
    assert both.ep_comm <= flex.ep_comm


# ---------------------------------------------------------------------------- rule, directory, files
def _check(role, dp, ep, cluster=TWO_NODES, flex=True):
    extent = cluster.shape_for_size(dp)
    return check_strategy(cluster, MOE, role, 256, extent, dp, 1, 1, 1, ep=ep, flex_dispatch=flex)


def test_rule_e6():
    assert _check(T, 16, 16) is None and _check(INF, 16, 16) is None
    assert _check(G, 16, 16).startswith("E6: flex_dispatch dispatches a Megatron-core pass's experts")
    assert _check(T, 16, 1).startswith("E6")
    off = dataclasses.replace(TWO_NODES, flex_dispatch=False)
    assert "flex_dispatch=false" in _check(T, 16, 16, cluster=off)
    assert _check(T, 16, 16, flex=1).startswith("E6: flex_dispatch=1 must be true or false")
    s = make_strategy(TWO_NODES, (1, 2, 8), 16, 1, 1, 16, ep=16, flex_dispatch=True)
    assert "ep=16 flex" in s.label()
    with pytest.raises(ValueError, match=r"Strategy\.flex_dispatch must be True or False"):
        s.variant(flex_dispatch="yes")


def test_directories_list_the_flex_variant_only_and_the_switch_turns_it_off():
    for role in (T, INF):
        legal = enumerate_strategies(NODE, MOE, 64, role)
        assert any(s.ep > 1 for s in legal)
        assert all(s.flex_dispatch == (s.ep > 1) for s in legal)
    assert not any(s.flex_dispatch for s in enumerate_strategies(NODE, MOE, 64, G))
    off = dataclasses.replace(NODE, flex_dispatch=False)
    assert not any(s.flex_dispatch for s in enumerate_strategies(off, MOE, 64, T))
    assert NO_SPLITS["flex_dispatch"] is False
    assert off.to_dict()["flex_dispatch"] is False and "flex_dispatch" not in NODE.to_dict()


def test_a_flex_plan_round_trips_and_the_summary_names_it(checker):
    from rpeg import Result

    result = small_moe_plan({"flex_dispatch": True})
    doc = result.to_dict()
    assert checker.check(doc) == []  # the independent checker knows rule E6
    entry = next(e for e in doc["plan"] if e["vertex"] == "actor_train")
    assert entry["flex_dispatch"] is True
    back = Result.from_dict(doc)
    assert back.plan == result.plan and back.evaluation.makespan == result.evaluation.makespan
    assert "ep=8 flex" in result.summary()
    assert result.evaluation.makespan < small_moe_plan({}).evaluation.makespan
    del entry["flex_dispatch"]  # an older file reads the AlltoAll
    assert not Result.from_dict(doc).plan.choices[1].strategy.flex_dispatch
    gen = next(e for e in doc["plan"] if e["vertex"] == "actor_gen")
    gen["flex_dispatch"] = True
    assert any("actor_gen" in e and "E6 flex_dispatch" in e for e in checker.check(doc))
    with pytest.raises(Exception, match=r"actor_gen.*E6"):
        Result.from_dict(doc)


def test_the_runtime_refuses_it_naming_the_switch():
    pytest.importorskip("torch")
    from rpeg.runtime.driver.runner import check_engine_choices

    bundled = bundled_cluster()
    check_engine_choices(small_moe_plan({}, bundled))
    with pytest.raises(ValueError, match=r"'actor_train': the flex dispatcher.*--no-flex-dispatch"):
        check_engine_choices(small_moe_plan({"flex_dispatch": True}, bundled))

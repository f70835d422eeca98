"""Expert tensor parallelism ``etp`` (SPEC §15.2's ``Pet``; docs/cost-model.md §10): the
experts split over the ``Pt`` ranks like the FFN (the default) or whole on one rank with the
expert-parallel ranks folded into ``Pt·Pd·Pc`` (``etp = 1``, Megatron-core's MoE parallel
folding) — the rules, every term it changes by hand, the directory and the result file."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from rpeg import Structure, Workload, model_preset
from rpeg.costmodel.collectives import allgather_time, reduce_scatter_time
from rpeg.costmodel.layout import Layout
from rpeg.costmodel.memory import weight_shard_params, zero_shard_params
from rpeg.costmodel.time import op_time
from rpeg.ir import Role
from rpeg.ir.hardware import Link
from rpeg.ir.plan import Strategy, check_strategy, check_strategy_of
from rpeg.scoring.candidates import enumerate_strategies, expert_layouts, make_strategy
from tests.costmodel.moe_plans import H100, MOE, NODE, TWO_NODES

DENSE = model_preset("qwen2.5-7b")
T, I, G = Role.TRAINING, Role.INFERENCE, Role.GENERATION  # noqa: E741
ARGS = {"sequences": 64, "prompt_len": 512, "response_len": 512}


def _check(model, role, dp, tp, *, ep=1, etp=None, cp=1, sp=None, cluster=NODE, sequences=64, mb=4):
    extent = cluster.shape_for_size(dp * tp * cp)
    sp = tp > 1 and role is not G if sp is None else sp
    return check_strategy(
        cluster, model, role, sequences, extent, dp, 1, tp, mb, ep=ep, etp=etp, cp=cp, sp=sp
    )


# ---------------------------------------------------------------------------- the strategy field
def test_etp_is_the_default_or_one_and_tp_is_stored_as_the_default():
    s = make_strategy(NODE, (1, 1, 8), 4, 1, 2, 4, ep=8, sp=True, etp=1)
    assert (s.etp, s.expert_tp, s.tp) == (1, 1, 2)
    assert make_strategy(NODE, (1, 1, 8), 4, 1, 2, 4, ep=4, sp=True, etp=2).etp is None  # = tp
    assert make_strategy(NODE, (1, 1, 8), 4, 1, 2, 4, ep=4, sp=True).expert_tp == 2
    with pytest.raises(ValueError, match=r"Strategy.etp must be 1 or tp=4"):
        Strategy((1, 1, 8), dp=2, pp=1, tp=4, mb=4, etp=2)
    with pytest.raises(ValueError, match=r"Strategy.etp must be a positive integer or None, got 0"):
        Strategy((1, 1, 8), dp=2, pp=1, tp=4, mb=4, etp=0)
    # part of the layout, the label, the hash and a pickled copy
    split = dataclasses.replace(s, etp=None)  # the same degrees, the experts split over Pt
    assert not s.same_layout(split) and s.layout_key() != split.layout_key() and s != split
    default = make_strategy(NODE, (1, 1, 8), 4, 1, 2, 4, ep=4, sp=True)
    assert "ep=8 etp=1 sp" in s.label() and "etp" not in default.label()
    assert pickle.loads(pickle.dumps(s)) == s and hash(pickle.loads(pickle.dumps(s))) == hash(s)


def test_rules_e2_and_e4_fold_the_expert_group_into_the_tensor_parallel_ranks():
    # EP 8 over dp 4: only with the experts whole, folded into tp·dp = 8 ranks
    assert _check(MOE, T, 4, 2, ep=8).startswith("E2: ep=8 does not divide dp·cp=4")
    assert _check(MOE, T, 4, 2, ep=8, etp=1) is None
    assert _check(MOE, I, 4, 2, ep=8, etp=1) is None
    assert _check(MOE, T, 2, 2, ep=8, etp=1).startswith("E2: ep=8 with etp=1 does not divide tp·dp·cp=4")
    assert _check(MOE, T, 4, 2, ep=8, etp=1, sp=False).startswith("E4")  # folding needs SP (as EP with TP)
    assert _check(MOE, T, 4, 2, etp=1) is None  # legal at ep 1: every TP rank holds every expert
    assert _check(MOE, T, 4, 2, etp=1, sp=False).startswith("E4: etp=1 with tp=2 needs sequence parallelism")
    assert _check(MOE, T, 2, 4, ep=8, etp=2).startswith("E4: etp=2 must be 1 or tp=4")
    assert _check(MOE, G, 4, 2, ep=4, etp=1).startswith("E4: etp=1 on a generation")
    assert _check(DENSE, T, 4, 2, etp=1).startswith("E4: etp=1 but qwen2.5-7b has no routed experts")
    off = dataclasses.replace(NODE, expert_parallel=False)
    assert "expert_parallel=false" in _check(MOE, T, 4, 2, etp=1, cluster=off)
    assert _check(MOE, T, 4, 2, etp=True).startswith("etp=True must be a positive integer")
    s = make_strategy(NODE, (1, 1, 8), 4, 1, 2, 4, ep=8, sp=True, etp=1)
    assert check_strategy_of(NODE, MOE, T, 64, s) is None
    assert check_strategy_of(NODE, MOE, T, 64, dataclasses.replace(s, etp=None)).startswith("E2")


def test_the_folded_expert_group_takes_the_tensor_parallel_ranks_first():
    """Devices t + Pt·(c + Pc·(p + Pp·d)): by default the EP group is every Pt-th device (one
    rank of each TP group); folded, it is consecutive devices."""
    default = make_strategy(TWO_NODES, (1, 2, 8), 4, 1, 4, 4, ep=4, sp=True)
    folded = make_strategy(TWO_NODES, (1, 2, 8), 4, 1, 4, 4, ep=4, sp=True, etp=1)
    assert default.expert_group_devices() == [0, 4, 8, 12] and default.ep_tier == 1
    assert folded.expert_group_devices() == [0, 1, 2, 3] and folded.ep_tier == 0
    assert Layout(default).ep_ranks_per_node == 2 and Layout(folded).ep_ranks_per_node == 4
    wide = make_strategy(TWO_NODES, (1, 2, 8), 4, 1, 4, 4, ep=16, sp=True, etp=1)
    assert wide.expert_group_devices() == list(range(16)) and wide.ep_tier == 1
    assert Layout(wide).ep_ranks_per_node == 8


# ---------------------------------------------------------------------------- memory
def test_whole_experts_are_not_split_over_the_tensor_parallel_ranks():
    m = MOE
    experts = m.layers * m.expert_weights
    default = weight_shard_params(m, 1, 2, ep=4)
    assert weight_shard_params(m, 1, 2, ep=4, etp=1) == pytest.approx(default + experts / 8)
    assert weight_shard_params(m, 1, 2, ep=8, etp=1) == pytest.approx(default)  # Pet·Pe = Pt·Pe'
    assert weight_shard_params(m, 1, 2, ep=4, etp=2) == default
    # ZeRO: an expert's state over the Pt·Pd·Pc/(Pet·Pe) ranks holding it (here 2·4/8 = 1)
    lay = Layout(make_strategy(NODE, (1, 1, 8), 4, 1, 2, 4, ep=8, sp=True, etp=1))
    shard = weight_shard_params(m, 1, 2, ep=8, etp=1)
    assert zero_shard_params(m, lay) == pytest.approx((shard - experts / 8) / 4 + experts / 8)
    # at ep 4 folded, two ranks hold each expert
    lay4 = Layout(make_strategy(NODE, (1, 1, 8), 4, 1, 2, 4, ep=4, sp=True, etp=1))
    shard4 = weight_shard_params(m, 1, 2, ep=4, etp=1)
    assert zero_shard_params(m, lay4) == pytest.approx((shard4 - experts / 4) / 4 + experts / 4 / 2)


# ---------------------------------------------------------------------------- time
def _hw():
    link = Link(1e-5, 1e-10)
    return dataclasses.replace(H100, collective=(link,) * 3, p2p=(link,) * 3)


def test_a_moe_blocks_ffn_has_no_tensor_parallel_collective_when_folded():
    hw = _hw()
    m = MOE
    default = make_strategy(NODE, (1, 1, 8), 4, 1, 2, 4, ep=4, sp=True).variant(recompute="none")
    folded = make_strategy(NODE, (1, 1, 8), 4, 1, 2, 4, ep=8, sp=True, etp=1).variant(recompute="none")
    a = op_time(m, T, Layout(default), hw, **ARGS)
    b = op_time(m, T, Layout(folded), hw, **ARGS)
    tokens = 64 / (4 * 4) * 1024  # per device and microbatch
    nbytes = tokens * m.hidden * m.dtype_bytes
    one = reduce_scatter_time(2, nbytes, hw.collective[0]) + allgather_time(2, nbytes, hw.collective[0])
    # 4 per layer and microbatch (forward, backward) by default; every block is a MoE block
    assert a.tp_comm == pytest.approx(4 * m.layers * 4 * one)
    assert b.tp_comm == pytest.approx(a.tp_comm / 2)
    # the AlltoAll: each rank dispatches its T/Pt tokens either way, over 8 ranks folded
    assert b.ep_comm > a.ep_comm > 0
    # the same FLOPs; the wider expert GEMMs (768 against 384) run faster
    assert b.gemm < a.gemm
    inference = op_time(m, I, Layout(folded), hw, **ARGS)
    assert inference.tp_comm == pytest.approx(op_time(m, I, Layout(default), hw, **ARGS).tp_comm / 2)


def test_folding_reads_whole_experts_and_dispatches_each_ranks_own_rows():
    """A decode-like pass of few tokens is bound by the weights it reads: folded, a rank reads its
    touched experts whole (not 1/Pt of them) for the rows it dispatches itself (n/Pt)."""
    from rpeg.costmodel.time import _Roofline

    hw = H100
    m = MOE
    lay = Layout(make_strategy(NODE, (1, 1, 8), 4, 1, 2, 1, ep=8, sp=True, etp=1))
    roof = _Roofline(m, lay, hw, 4.0)
    rows, tokens = 4.0, 1.0
    sent = rows / 2
    touched = m.experts_touched(sent, 8)
    routed = m.moe_layers * touched * m.expert_params / m.layers
    rest = m.layer_weights_read(sent, 8) - routed
    omega_w = m.layers * (rest / 2 + routed) * m.dtype_bytes
    omega_a = 2 * m.dtype_bytes * rows * m.hidden * m.layers
    work = 1e9  # little work for the bytes: the memory side of the roofline binds
    assert roof.flops(work, tokens, 0.0, 0.5) == pytest.approx(
        work / (omega_w + omega_a) * hw.mem_bandwidth, rel=1e-12
    )
    # by default the same pass reads 1/Pt of the experts the group's n rows touch
    base = _Roofline(m, Layout(make_strategy(NODE, (1, 1, 8), 4, 1, 2, 1, ep=4, sp=True)), hw, 4.0)
    omega_default = m.layers * m.layer_weights_read(rows, 4) * m.dtype_bytes / 2
    assert base.flops(work, tokens, 0.0, 0.5) == pytest.approx(
        work / (omega_default + omega_a) * hw.mem_bandwidth, rel=1e-12
    )


def test_the_default_is_priced_as_before():
    """etp = tp is the default layout: the same strategy, the same seconds."""
    s = make_strategy(NODE, (1, 1, 8), 4, 1, 2, 4, ep=4, sp=True).variant(recompute="none")
    same = dataclasses.replace(s, etp=2)
    assert same == s and op_time(MOE, T, Layout(same), H100, **ARGS) == op_time(
        MOE, T, Layout(s), H100, **ARGS
    )


# ---------------------------------------------------------------------------- directory, result file
def test_directories_list_folded_layouts_for_moe_trainers_with_tensor_parallelism():
    assert expert_layouts(NODE, MOE, T, 4, 1, 2) == [(1, None), (2, None), (4, None), (2, 1), (4, 1), (8, 1)]
    assert expert_layouts(NODE, MOE, T, 4, 1, 1) == [(1, None), (2, None), (4, None)]
    assert expert_layouts(NODE, MOE, G, 4, 1, 2) == [(1, None), (4, None)]
    assert expert_layouts(NODE, DENSE, T, 4, 1, 2) == [(1, None)]
    no_sp = dataclasses.replace(NODE, sequence_parallel=False)
    assert expert_layouts(no_sp, MOE, T, 4, 1, 2) == [(1, None), (2, None), (4, None)]
    legal = enumerate_strategies(NODE, MOE, 64, T)
    folded = [s for s in legal if s.etp == 1]
    assert folded and all(s.tp > 1 and s.ep > 1 and s.sp for s in folded)
    assert all((s.tp * s.dp * s.cp) % s.ep == 0 for s in folded)
    assert any((s.dp * s.cp) % s.ep for s in folded)  # layouts the default cannot reach
    assert not any(s.etp is not None for s in enumerate_strategies(NODE, MOE, 64, G))


def test_a_folded_plan_round_trips_and_the_summary_names_it():
    from rpeg import Result
    from rpeg.solvers.result import result_for_plan

    small = dataclasses.replace(MOE.scaled(layers=8, hidden=512, heads=8, vocab=4096), kv_heads=4)
    w = Workload("grpo", {"actor": small}, 16, 4, 512, 3584, reward="rule", kl_coef=0.0)
    every = ((0, 0, 0), (1, 1, 8))
    table = {
        "actor_gen": (*every, 8, 1, 1, 1, None, {}),
        "actor_train": (*every, 4, 1, 2, 16, "none", {"ep": 8, "sp": True, "etp": 1}),
    }
    result = result_for_plan(w, NODE, Structure("grpo", False, (("actor", 0),)), table)
    train = result.plan.choices[1].strategy
    assert (train.ep, train.etp, train.tp, train.dp) == (8, 1, 2, 4)
    doc = result.to_dict()
    entry = next(e for e in doc["plan"] if e["vertex"] == "actor_train")
    assert (entry["ep"], entry["etp"]) == (8, 1)
    assert next(e for e in doc["plan"] if e["vertex"] == "actor_gen")["etp"] is None
    back = Result.from_dict(doc)
    assert back.plan == result.plan and back.evaluation.makespan == result.evaluation.makespan
    assert "(4,1,2) sp ep=8 etp=1" in result.summary()
    # an older file without the field reads the default; an illegal value is refused, named
    del entry["etp"]
    entry["ep"] = 4
    assert Result.from_dict(doc).plan.choices[1].strategy.etp is None
    entry["etp"] = 2  # = tp: the default, and EP 4 divides dp 4
    assert Result.from_dict(doc).plan.choices[1].strategy.etp is None
    entry["ep"], entry["etp"] = 8, 3
    with pytest.raises(Exception, match=r"actor_train.*E4: etp=3 must be 1 or tp=2"):
        Result.from_dict(doc)

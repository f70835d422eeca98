"""The expert-parallel AlltoAlls overlapped with another microbatch's compute
(``Strategy.ep_overlap``, Megatron-core's ``overlap_moe_expert_parallel_comm``;
docs/cost-model.md §10): the exposed time by hand, rule E5, the directory, the cluster switch,
the result file and the runtime's refusal."""

from __future__ import annotations

import dataclasses

import pytest

from rpeg import Cluster
from rpeg.costmodel.layout import Layout
from rpeg.costmodel.time import op_time, overlapped_alltoall_time
from rpeg.ir import Recompute, Role
from rpeg.ir.cluster import NO_SPLITS
from rpeg.ir.plan import check_strategy, check_strategy_of
from rpeg.scoring.candidates import enumerate_strategies, make_strategy
from tests.costmodel.moe_plans import H100, MOE, NODE, TWO_NODES, bundled_cluster, small_moe_plan

T, I, G = Role.TRAINING, Role.INFERENCE, Role.GENERATION  # noqa: E741
ARGS = {"sequences": 256, "prompt_len": 2048, "response_len": 2048}


# ---------------------------------------------------------------------------- the exposed time
def test_the_exposed_alltoall_time_by_hand():
    # comm-bound: the forward's half hides behind 2C/3, the backward's behind C/3; one chunk exposed
    assert overlapped_alltoall_time(12.0, 6.0, 4) == pytest.approx(3.0 + 0.75 * ((6 - 4) + (6 - 2)))
    # compute-bound: only the first forward's and the last backward's share stays
    assert overlapped_alltoall_time(12.0, 60.0, 4) == pytest.approx(3.0)
    assert overlapped_alltoall_time(12.0, 0.0, 4) == pytest.approx(12.0)  # nothing to hide behind
    assert overlapped_alltoall_time(12.0, 6.0, 1) == pytest.approx(12.0)  # one microbatch: no partner
    assert overlapped_alltoall_time(0.0, 6.0, 4) == 0.0
    for a2a, c, n in ((5.0, 1.0, 2), (1.0, 5.0, 64), (7.0, 7.0, 16)):
        assert 0.0 < overlapped_alltoall_time(a2a, c, n) <= a2a


def test_a_training_nodes_alltoalls_hide_behind_its_compute_and_nothing_else_changes():
    line = make_strategy(TWO_NODES, (1, 2, 8), 16, 1, 1, 16, ep=16).variant(recompute="none")
    over = line.variant(ep_overlap=True)
    a = op_time(MOE, T, Layout(line), H100, **ARGS)
    b = op_time(MOE, T, Layout(over), H100, **ARGS)
    assert a.ep_comm > 0
    assert b.ep_comm == pytest.approx(overlapped_alltoall_time(a.ep_comm, a.gemm + a.nongemm, 16))
    assert b.ep_comm < a.ep_comm
    for term in ("gemm", "bubble", "tp_comm", "pp_comm", "dp_comm", "nongemm", "opt", "overhead"):
        assert getattr(b, term) == getattr(a, term), term
    # an interleaved pipeline's chunks are the units: mb·vp
    piped = make_strategy(TWO_NODES, (1, 2, 8), 8, 2, 1, 16, ep=8, vp=2).variant(recompute="none")
    c = op_time(MOE, T, Layout(piped), H100, **ARGS)
    d = op_time(MOE, T, Layout(piped.variant(ep_overlap=True)), H100, **ARGS)
    assert d.ep_comm == pytest.approx(overlapped_alltoall_time(c.ep_comm, c.gemm + c.nongemm, 32))


# ---------------------------------------------------------------------------- rule E5
def _check(role, dp, pp, *, ep, vp=1, recompute=None, cluster=TWO_NODES, ep_overlap=True, mb=16):
    extent = cluster.shape_for_size(dp * pp)
    return check_strategy(
        cluster, MOE, role, 256, extent, dp, pp, 1, mb, ep=ep, vp=vp,
        ep_overlap=ep_overlap, recompute=recompute,
    )  # fmt: skip


def test_rule_e5_follows_megatron_cores_checks():
    assert _check(T, 16, 1, ep=16, recompute="none") is None
    assert _check(T, 16, 1, ep=16, recompute="selective") is None
    assert _check(T, 16, 1, ep=16) is None  # the mode unknown: the layout alone
    assert _check(T, 16, 1, ep=16, recompute="full").startswith("E5: ep_overlap with full recomputation")
    assert _check(T, 8, 2, ep=8).startswith("E5: ep_overlap with pp=2 needs the interleaved pipeline")
    assert _check(T, 8, 2, ep=8, vp=2) is None
    assert _check(I, 16, 1, ep=16).startswith("E5: ep_overlap overlaps a training invocation's")
    assert _check(T, 16, 1, ep=1).startswith("E5")
    off = dataclasses.replace(TWO_NODES, expert_overlap=False)
    assert "expert_overlap=false" in _check(T, 16, 1, ep=16, cluster=off)
    assert _check(T, 16, 1, ep=16, ep_overlap=1).startswith("E5: ep_overlap=1 must be true or false")
    s = make_strategy(TWO_NODES, (1, 2, 8), 16, 1, 1, 16, ep=16, ep_overlap=True).variant(recompute="none")
    assert check_strategy_of(TWO_NODES, MOE, T, 256, s) is None
    assert check_strategy_of(TWO_NODES, MOE, T, 256, s.variant(recompute="full")).startswith("E5")
    # moving to full recomputation runs the AlltoAlls in line (the adaptive controller's leaner step)
    assert not s.with_recompute(Recompute.FULL).ep_overlap and s.with_recompute("selective").ep_overlap
    assert "ep=16 a2a-overlap" in s.label()
    with pytest.raises(ValueError, match=r"Strategy\.ep_overlap must be True or False"):
        s.variant(ep_overlap="yes")


# ---------------------------------------------------------------------------- directory, switch, files
def test_directories_overlap_wherever_megatron_can_and_the_switch_turns_it_off():
    legal = enumerate_strategies(NODE, MOE, 64, T)
    for s in legal:
        can = s.ep > 1 and s.recompute is not Recompute.FULL and (s.pp == 1 or s.vp > 1)
        assert s.ep_overlap == can, s.label()  # the in-line twin is never listed beside it
    assert any(s.ep_overlap for s in legal) and any(s.ep_overlap and s.pp > 1 for s in legal)
    assert not any(s.ep_overlap for s in enumerate_strategies(NODE, MOE, 64, I))
    off = dataclasses.replace(NODE, expert_overlap=False)
    assert not any(s.ep_overlap for s in enumerate_strategies(off, MOE, 64, T))
    assert NO_SPLITS["expert_overlap"] is False
    assert Cluster.from_shape("1x2x8", H100, **NO_SPLITS).expert_overlap is False
    assert off.to_dict()["expert_overlap"] is False and "expert_overlap" not in TWO_NODES.to_dict()


def test_an_overlapped_plan_round_trips_and_the_summary_names_it():
    from rpeg import Result

    result = small_moe_plan({"ep_overlap": True})
    assert result.plan.choices[1].strategy.ep_overlap
    doc = result.to_dict()
    entry = next(e for e in doc["plan"] if e["vertex"] == "actor_train")
    assert entry["ep_overlap"] is True
    back = Result.from_dict(doc)
    assert back.plan == result.plan and back.evaluation.makespan == result.evaluation.makespan
    assert "ep=8 a2a-overlap" in result.summary()
    assert result.evaluation.makespan < small_moe_plan({}).evaluation.makespan
    del entry["ep_overlap"]  # an older file reads in line
    assert not Result.from_dict(doc).plan.choices[1].strategy.ep_overlap
    entry["ep_overlap"], entry["recompute"] = True, "full"
    with pytest.raises(Exception, match=r"actor_train.*E5: ep_overlap with full recomputation"):
        Result.from_dict(doc)


def test_the_runtime_refuses_it_naming_the_switch():
    pytest.importorskip("torch")
    from rpeg.runtime.driver.runner import check_engine_choices

    bundled = bundled_cluster()
    check_engine_choices(small_moe_plan({}, bundled))
    with pytest.raises(ValueError, match=r"'actor_train': expert-parallel AlltoAlls.*--no-expert-overlap"):
        check_engine_choices(small_moe_plan({"ep_overlap": True}, bundled))

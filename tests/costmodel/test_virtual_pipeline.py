"""Megatron-core's interleaved pipeline (``Strategy.vp``, docs/cost-model.md §12): rules V1–V3,
the fill and drain, the pipeline's messages and the activations alive by hand, the directory's
choice of the fastest twin, a plan with it through the result file and the summary, the
independent checker and the runtime's refusal."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rpeg import Cluster, Structure, Workload, hardware_preset, model_preset
from rpeg.costmodel.layout import Layout
from rpeg.costmodel.memory import pipeline_alive, training_activation_bytes
from rpeg.costmodel.time import op_time
from rpeg.ir import Role
from rpeg.ir.plan import Strategy, check_strategy
from rpeg.scoring.candidates import (
    build_directories,
    enumerate_strategies,
    fastest_interleaving,
    interleavings,
    make_strategy,
)
from rpeg.scoring.evaluator import Evaluator
from rpeg.solvers.result import result_for_plan

DENSE = model_preset("qwen2.5-7b")  # 28 layers
H100 = hardware_preset("h100")
NODE = Cluster.from_shape("1x1x8", H100)
PLAIN = Cluster.from_shape("1x1x8", H100, virtual_pipeline_parallel=False)


def _check(role, dp, pp, tp, mb, vp, *, cluster=NODE, model=DENSE, sequences=64):
    extent = cluster.shape_for_size(dp * pp * tp)
    return check_strategy(cluster, model, role, sequences, extent, dp, pp, tp, mb, vp=vp)


# ---------------------------------------------------------------------------- legality
def test_rules_v1_to_v3():
    T, I, G = Role.TRAINING, Role.INFERENCE, Role.GENERATION  # noqa: E741
    assert _check(T, 1, 2, 1, 8, 7) is None  # 14 layers a stage, 7 chunks of 2
    assert _check(I, 1, 2, 1, 8, 2) is None
    assert _check(T, 1, 2, 1, 8, 1) is None
    assert _check(G, 1, 2, 1, 2, 2).startswith("V1")  # generation does not interleave
    assert _check(T, 2, 1, 1, 8, 2).startswith("V1")  # nothing to interleave without stages
    assert _check(T, 1, 2, 1, 8, 2, cluster=PLAIN).startswith("V1")  # the engines' switch
    assert _check(T, 1, 2, 1, 8, 4).startswith("V2")  # 14 layers are not 4 chunks
    assert _check(T, 1, 2, 1, 9, 2).startswith("V3")  # Megatron's groups of pp microbatches
    with pytest.raises(ValueError, match=r"Strategy\.vp must be a positive integer"):
        Strategy((1, 1, 2), 1, 2, 1, 8, vp=0)


def test_vp_is_part_of_the_layout_and_the_label():
    s = make_strategy(NODE, (1, 1, 2), 1, 2, 1, 8)
    t = s.variant(vp=7)
    assert not s.same_layout(t) and s.layout_key() != t.layout_key()
    assert t.label() == "(1,2,1) mb=8 vp=7" and s.label() == "(1,2,1) mb=8"


# ---------------------------------------------------------------------------- time and memory
def _time(s: Strategy, sequences: int = 64):
    return op_time(
        DENSE, Role.TRAINING, Layout(s, 8), H100, sequences=sequences, prompt_len=512, response_len=1536
    )


@pytest.mark.parametrize("pp, mb, vp", [(2, 8, 7), (4, 16, 7), (4, 4, 7), (2, 32, 2)])
def test_fill_drain_and_messages_by_hand(pp, mb, vp):
    plain = make_strategy(NODE, NODE.shape_for_size(pp), 1, pp, 1, mb, "none")
    one, inter = _time(plain), _time(plain.variant(vp=vp))
    assert inter.gemm == one.gemm and inter.tp_comm == one.tp_comm and inter.nongemm == one.nongemm
    # Narayanan et al. (SC'21) §2.2.2: the bubble fraction (p − 1)/(v·m)
    assert inter.bubble == pytest.approx(one.gemm * (pp - 1) / (vp * mb), rel=1e-12)
    assert one.bubble == pytest.approx(one.gemm * (pp - 1) / mb, rel=1e-12)
    # each microbatch leaves a stage once per chunk: vp·mb + 2Pp − 3 transfers instead of mb + 2Pp − 3
    assert inter.pp_comm / one.pp_comm == pytest.approx((vp * mb + 2 * pp - 3) / (mb + 2 * pp - 3), rel=1e-12)


@pytest.mark.parametrize(
    "mb, pp, vp, alive",
    [
        (8, 4, 1, 4),
        (2, 4, 1, 2),
        (8, 4, 2, 5.5),
        (4, 4, 2, 4),
        (16, 4, 5, (6 * 4 - 1) / 5),
        (2, 2, 3, 2),
        (9, 8, 2, 9),  # all 18 chunk forwards fit the 23-chunk warm-up
    ],
)
def test_activations_alive_follow_megatrons_warm_up(mb, pp, vp, alive):
    # rank 0 warms up with 2(Pp − 1) + (Pv − 1)·Pp chunk forwards, all Pv·mb when mb = Pp
    assert pipeline_alive(mb, pp, vp) == pytest.approx(alive)
    assert pipeline_alive(mb, pp, vp) == pytest.approx(min(mb, pp + (pp - 1) / vp) if vp > 1 else min(mb, pp))
    if vp > 1 and mb >= pp + (pp - 1) / vp:  # Korthikanti et al. (2022): Pp·(1 + (Pp − 1)/(Pp·Pv))
        assert alive == pytest.approx(pp * (1 + (pp - 1) / (pp * vp)))


def test_training_activations_scale_with_the_stages_alive():
    plain = make_strategy(NODE, (1, 1, 4), 1, 4, 1, 16, "none")
    inter = plain.variant(vp=7)
    kw = {"sequences": 64, "tokens": 2048.0}
    ratio = training_activation_bytes(DENSE, Layout(inter, 8), **kw) / training_activation_bytes(
        DENSE, Layout(plain, 8), **kw
    )
    assert ratio == pytest.approx(pipeline_alive(16, 4, 7) / pipeline_alive(16, 4, 1), rel=1e-12)


# ---------------------------------------------------------------------------- the plan space
def test_enumeration_lists_every_legal_interleaving_and_none_when_switched_off():
    assert interleavings(NODE, DENSE, Role.TRAINING, 2, 8) == [1, 2, 7, 14]
    assert interleavings(NODE, DENSE, Role.TRAINING, 2, 9) == [1]  # V3
    assert interleavings(NODE, DENSE, Role.GENERATION, 2, 8) == [1]
    assert interleavings(PLAIN, DENSE, Role.TRAINING, 2, 8) == [1]
    legal = enumerate_strategies(NODE, DENSE, 64, Role.TRAINING)
    assert {s.vp for s in legal} == {1, 2, 7, 14}
    assert all(check_strategy_ok(s) for s in legal if s.vp > 1)
    assert {s.vp for s in enumerate_strategies(PLAIN, DENSE, 64, Role.TRAINING)} == {1}
    assert {s.vp for s in enumerate_strategies(NODE, DENSE, 64, Role.TRAINING, interleave=False)} == {1}


def check_strategy_ok(s: Strategy) -> bool:
    from rpeg.ir.plan import check_strategy_of

    return check_strategy_of(NODE, DENSE, Role.TRAINING, 64, s) is None and s.pp > 1 and s.mb % s.pp == 0


def test_the_directory_lists_the_fastest_interleaved_twin():
    job = Workload("grpo", {"actor": DENSE}, 8, 8, 512, 1536, reward="rule")
    ev = Evaluator(job, NODE)
    vi = next(i for i, v in enumerate(ev.graph.vertices) if v.role is Role.TRAINING)
    train = build_directories(ev.costs)[vi]
    twins = [s for s in train.strategies if s.vp > 1]
    assert twins, "a pipelined layout with pp | mb lists an interleaved twin"
    m_eff = NODE.hardware.m_eff
    for s in twins:
        plain = s.variant(vp=1)
        assert plain in train.strategies  # only twins of listed plain strategies
        fits = [
            (ev.costs.op_time(vi, plain.variant(vp=vp)), vp)
            for vp in interleavings(NODE, DENSE, Role.TRAINING, s.pp, s.mb)[1:]
            if ev.costs.memory(vi, plain.variant(vp=vp)).isolated <= m_eff
        ]
        assert min(fits)[1] == s.vp  # the brute-force fastest that fits
        assert fastest_interleaving(ev.costs, vi, plain)[1] == s
    plain_dirs = build_directories(Evaluator(job, PLAIN).costs)
    assert all(s.vp == 1 for d in plain_dirs for s in d.strategies)


def test_search_finds_interleaved_plans_and_they_verify():
    from rpeg import solve

    job = Workload("grpo", {"actor": DENSE}, 8, 8, 512, 1536, reward="rule")
    result = solve(job, NODE, method="sa", max_evaluations=400, seed=0)
    assert result.plan is not None
    assert all(s.strategy.vp == 1 or s.strategy.pp > 1 for s in result.plan.choices)


# ---------------------------------------------------------------------------- a plan with it
def _interleaved_plan(cluster: Cluster = NODE):
    small = dataclasses.replace(DENSE.scaled(layers=8, hidden=512, heads=8, vocab=4096), kv_heads=4)
    w = Workload("grpo", {"actor": small}, 16, 4, 256, 256, reward="rule", kl_coef=0.0)
    every = ((0, 0, 0), (1, 1, 8))
    table = {
        "actor_gen": (*every, 8, 1, 1, 1),
        "actor_train": (*every, 2, 4, 1, 8, "none", {"vp": 2}),
    }
    return result_for_plan(w, cluster, Structure("grpo", False, (("actor", 0),)), table)


def test_an_interleaved_plan_round_trips_and_the_summary_names_it():
    from rpeg import Result

    result = _interleaved_plan()
    assert result.plan.choices[1].strategy.vp == 2
    doc = result.to_dict()
    entry = next(e for e in doc["plan"] if e["vertex"] == "actor_train")
    assert entry["vp"] == 2
    assert Result.from_dict(json.loads(json.dumps(doc))).plan == result.plan
    assert "(2,4,1) vp=2" in result.summary()
    # a file written before the field reads plain 1F1B
    old = json.loads(json.dumps(doc))
    for e in old["plan"]:
        e.pop("vp")
    assert Result.from_dict(old).plan.choices[1].strategy.vp == 1
    # an illegal one is refused, naming the vertex and the rule
    for e in old["plan"]:
        if e["vertex"] == "actor_train":
            e["vp"] = 3
    with pytest.raises(Exception, match=r"actor_train.*V2"):
        Result.from_dict(old)
    # the engines' switch travels in the cluster block
    off = json.loads(json.dumps(doc))
    off["cluster"]["virtual_pipeline_parallel"] = False
    with pytest.raises(Exception, match=r"actor_train.*V1"):
        Result.from_dict(off)


def test_the_independent_checker_applies_v1_to_v3():
    from tests.tools.check_result import check_plan_legality

    doc = _interleaved_plan().to_dict()
    assert check_plan_legality(doc) == []
    for vp, mb, rule in ((3, 8, "V2"), (2, 6, "V3")):
        bad = json.loads(json.dumps(doc))
        for e in bad["plan"]:
            if e["vertex"] == "actor_train":
                e["vp"], e["mb"] = vp, mb
        assert any(rule in why for why in check_plan_legality(bad)), rule
    gen = json.loads(json.dumps(doc))
    gen["plan"][0]["vp"] = 2
    assert any("V1" in why for why in check_plan_legality(gen))


def test_the_runtime_refuses_it_naming_the_switch():
    pytest.importorskip("torch")
    from rpeg.runtime.driver.runner import check_engine_choices

    with pytest.raises(
        ValueError,
        match=r"'actor_train': an interleaved pipeline \(vp=2, pp=4\).*--no-virtual-pipeline-parallel",
    ):
        check_engine_choices(_interleaved_plan())

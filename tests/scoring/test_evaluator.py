"""Tests for ``scoring/evaluator.py``: the score, utilisation, memory model and penalty of
SPEC §6–§7, recomputed by hand from the kept graph and schedule and from ``Costs.memory``."""

from __future__ import annotations

import dataclasses
import math
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpeg import Cluster, Workload, hardware_preset, model_preset
from rpeg.heuristics.baselines import concurrent_plan, greedy_plan
from rpeg.ir import Choice, Plan, Structure, structures
from rpeg.scoring.candidates import build_directories
from rpeg.scoring.check import check_schedule
from rpeg.scoring.evaluator import BETA_OOM, Evaluator
from rpeg.scoring.scheduler import list_schedule

K, B, R, LP, LR = 8, 64, 1, 128, 256
# the mean response of SPEC §2's default quantiles (0.5, 64), (0.85, 128), (1.0, 256), each
# share uniform on its interval (SPEC §14.1): Ē = 0.5·32 + 0.35·96 + 0.15·192 = 78.4 tokens
MEAN_RESPONSE = 0.5 * (0 + 64) / 2 + 0.35 * (64 + 128) / 2 + 0.15 * (128 + 256) / 2
WORK = K * B * R * (LP + MEAN_RESPONSE)  # real tokens over the unrolled horizon


@pytest.fixture(scope="module")
def ev(tiny_ppo, cluster_1x2x4):
    return Evaluator(tiny_ppo, cluster_1x2x4)


@pytest.fixture(scope="module")
def dirs(ev):
    return build_directories(ev.costs)


@pytest.fixture(scope="module")
def plans(ev, dirs):
    return {"greedy": greedy_plan(ev, dirs), "concurrent": concurrent_plan(ev, dirs)}


def place(ev, dirs, vertex, size, origin):
    """The fastest strategy of ``size`` devices for ``vertex``, at ``origin``."""
    s = dirs[vertex].strategies[dirs[vertex].of_size(size)[0]]
    return Choice(s, ev.cluster.allocation(origin, s.extent))


# ---------------------------------------------------------------------------- score
@pytest.mark.parametrize("method", ["greedy", "concurrent"])
def test_throughput_is_tokens_over_makespan(ev, plans, method):
    e = ev.evaluate(plans[method], keep=True)
    assert e.graph is not None and e.schedule is not None
    assert check_schedule(e.graph, e.schedule) == []
    assert e.makespan == max(e.schedule.finish)
    assert e.makespan == list_schedule(e.graph).makespan
    assert e.throughput == pytest.approx(WORK / e.makespan, rel=1e-12)
    assert pytest.approx(8 * 64 * 206.4) == WORK  # real tokens, not the padded 8·64·384
    assert e.feasible
    assert e.score == e.throughput


@pytest.mark.parametrize("method", ["greedy", "concurrent"])
def test_utilization_is_busy_device_seconds_over_capacity(ev, plans, method):
    e = ev.evaluate(plans[method], keep=True)
    g = e.graph
    busy = sum(g.duration[i] * bin(g.mask[i]).count("1") for i in range(len(g)))
    assert e.utilization == pytest.approx(busy / (8 * e.makespan), rel=1e-12)
    assert 0.0 < e.utilization <= 1.0 + 1e-12


def test_greedy_plan_keeps_every_device_busy(ev, plans):
    # all vertices share all devices and run one after another: no idle device-second
    e = ev.evaluate(plans["greedy"], keep=True)
    assert e.utilization == pytest.approx(1.0, rel=1e-12)
    assert e.makespan == pytest.approx(sum(e.graph.duration), rel=1e-12)


def test_without_keep_graph_and_schedule_are_dropped(ev, plans):
    e = ev.evaluate(plans["concurrent"])
    assert e.graph is None and e.schedule is None
    assert e.throughput == ev.evaluate(plans["concurrent"], keep=True).throughput


# ---------------------------------------------------------------------------- penalty
def _tight_evaluator(tiny_ppo, cluster, plan, ratio, **kw):
    """An evaluator whose GPUs make ``plan`` peak at ``ratio``·M_eff.

    A rollout engine's KV cache is a fraction of ``M_GPU`` (SPEC §14.5), so where a generation
    holds the peak the peak shrinks with the GPU: ``M`` is the fixed point of
    ``M = peak(M)/(ratio·(1 − h))``, a contraction (the KV fraction is below ``ratio·(1 − h)``)."""
    hw = cluster.hardware
    memory = hw.gpu_memory_bytes
    for _ in range(200):
        trial = dataclasses.replace(hw, gpu_memory_bytes=memory)
        peak = Evaluator(tiny_ppo, Cluster(*cluster.shape, trial)).memory(plan).max_peak
        memory, previous = peak / (ratio * (1 - hw.memory_headroom)), memory
        if abs(memory - previous) <= 1e-14 * memory:
            break
    hw = dataclasses.replace(hw, gpu_memory_bytes=memory)
    return Evaluator(tiny_ppo, Cluster(*cluster.shape, hw), **kw)


@pytest.mark.parametrize("ratio", [1.05, 1.3])
def test_memory_penalty_is_exponential_in_the_excess(tiny_ppo, cluster_1x2x4, plans, ratio):
    plan = plans["concurrent"]
    roomy = Evaluator(tiny_ppo, cluster_1x2x4)
    ev = _tight_evaluator(tiny_ppo, cluster_1x2x4, plan, ratio)
    e = ev.evaluate(plan)
    assert not e.feasible
    assert e.memory.ratio == pytest.approx(ratio, rel=1e-12)
    assert e.memory.max_peak / (0.9 * ev.cluster.hardware.gpu_memory_bytes) == pytest.approx(ratio)
    # the penalty changes the score only: the throughput is the hard-rejecting evaluator's on
    # the same GPUs (which scores the plan 0)
    hard = _tight_evaluator(tiny_ppo, cluster_1x2x4, plan, ratio, penalty=False).evaluate(plan)
    assert hard.score == 0.0
    assert e.throughput == hard.throughput == pytest.approx(WORK / e.makespan, rel=1e-12)
    assert e.score == pytest.approx(e.throughput * math.exp(-40.0 * (ratio - 1.0)), rel=1e-9)
    assert BETA_OOM == 40.0
    # a smaller GPU changes no time but a rollout engine's: its KV cache is a fraction of
    # M_GPU (SPEC §14.5), so only the generation may slow down
    for v, c in enumerate(plan.choices):
        t, t_roomy = ev.costs.op_time(v, c.strategy), roomy.costs.op_time(v, c.strategy)
        if ev.graph.vertices[v].role.value == "generation":
            assert t >= t_roomy
        else:
            assert t == t_roomy


def test_hard_rejection_scores_infeasible_plans_zero(tiny_ppo, cluster_1x2x4, plans):
    plan = plans["concurrent"]
    ev = _tight_evaluator(tiny_ppo, cluster_1x2x4, plan, 1.01, penalty=False)
    e = ev.evaluate(plan)
    assert not e.feasible
    assert e.score == 0.0
    assert e.throughput > 0.0


def test_a_plan_exactly_at_m_eff_is_feasible_and_unpenalised(tiny_ppo, cluster_1x2x4, plans):
    plan = plans["concurrent"]
    ev = _tight_evaluator(tiny_ppo, cluster_1x2x4, plan, 1.0)
    e = ev.evaluate(plan)
    assert e.feasible
    assert e.score == e.throughput


# ---------------------------------------------------------------------------- util objective
def test_throughput_util_objective(tiny_ppo, cluster_1x2x4, plans):
    # δ = 0.05: the two fixture plans are 9 % apart on the presets (the GPU presets' engine step
    # narrowed the gap from 10 %+); the premise below checks they are more than δ apart
    ev = Evaluator(tiny_ppo, cluster_1x2x4, objective="throughput-util", delta=0.05)
    plain = Evaluator(tiny_ppo, cluster_1x2x4)
    slow, fast = plans["greedy"], plans["concurrent"]
    es, ef = plain.evaluate(slow), plain.evaluate(fast)
    assert es.throughput < 0.95 * ef.throughput  # premise: the plans differ by more than δ

    # the first plan is the best raw score so far: score·Util
    e1 = ev.evaluate(slow)
    assert e1.score == pytest.approx(es.throughput * es.utilization, rel=1e-12)
    e2 = ev.evaluate(fast)
    assert e2.score == pytest.approx(ef.throughput * ef.utilization, rel=1e-12)
    assert ev.best_raw == pytest.approx(ef.throughput, rel=1e-12)
    # now the slow plan is more than δ behind the best raw score: ·1e-12
    e3 = ev.evaluate(slow)
    assert e3.score == pytest.approx(es.throughput * 1e-12, rel=1e-9)
    assert e3.throughput == es.throughput

    # with a wide δ the slow plan stays within reach of the best and keeps score·Util
    wide = Evaluator(tiny_ppo, cluster_1x2x4, objective="throughput-util", delta=0.9)
    wide.evaluate(fast)
    assert wide.evaluate(slow).score == pytest.approx(es.throughput * es.utilization, rel=1e-12)


def test_throughput_util_applies_on_top_of_the_memory_penalty(tiny_ppo, cluster_1x2x4, plans):
    plan = plans["concurrent"]
    ev = _tight_evaluator(tiny_ppo, cluster_1x2x4, plan, 1.1, objective="throughput-util")
    e = ev.evaluate(plan)
    expected = e.throughput * math.exp(-40.0 * 0.1) * e.utilization
    assert e.score == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    ("kw", "field"), [({"objective": "makespan"}, "objective"), ({"delta": 0.0}, "delta")]
)
def test_bad_settings_are_rejected(tiny_ppo, cluster_1x2x4, kw, field):
    with pytest.raises(ValueError, match=field):
        Evaluator(tiny_ppo, cluster_1x2x4, **kw)


# ---------------------------------------------------------------------------- memory model
def test_co_resident_peak_is_persistent_sum_plus_largest_transient(ev, dirs):
    # Synchronous PPO (τ = 0) on 1x2x4. actor_gen spans all 8 GPUs; on node 0 it meets ref_inf
    # and actor_train; on GPUs 4-5 reward_inf, critic_inf and critic_train; on GPUs 6-7
    # reward_inf and critic_train. Atoms: {0-3}, {4,5}, {6,7}.
    gen, ref, rew, cinf, atr, ctr = range(6)
    plan = Plan(
        (
            place(ev, dirs, gen, 8, (0, 0, 0)),
            place(ev, dirs, ref, 4, (0, 0, 0)),
            place(ev, dirs, rew, 4, (0, 1, 0)),
            place(ev, dirs, cinf, 2, (0, 1, 0)),
            place(ev, dirs, atr, 4, (0, 0, 0)),
            place(ev, dirs, ctr, 4, (0, 1, 0)),
        )
    )
    m = [ev.costs.memory(v, c.strategy) for v, c in enumerate(plan.choices)]
    # serving vertices of a τ = 0 trainable model materialise their weights transiently;
    # frozen models keep a persistent BF16 copy; trainers keep optimizer state
    node0 = (
        m[atr].train_state
        + m[ref].weights
        + max(m[gen].transient + m[gen].weights, m[ref].transient, m[atr].transient)
    )
    gpus45 = (
        m[ctr].train_state
        + m[rew].weights
        + max(
            m[gen].transient + m[gen].weights,
            m[rew].transient,
            m[cinf].transient + m[cinf].weights,
            m[ctr].transient,
        )
    )
    gpus67 = (
        m[ctr].train_state
        + m[rew].weights
        + max(m[gen].transient + m[gen].weights, m[rew].transient, m[ctr].transient)
    )
    rep = ev.memory(plan, detail=True)
    assert rep.atoms == [0b1111, 0b110000, 0b11000000]
    assert rep.peak == pytest.approx([node0, gpus45, gpus67], rel=1e-12)
    assert rep.per_device(8) == pytest.approx([node0] * 4 + [gpus45] * 2 + [gpus67] * 2, rel=1e-12)
    assert rep.max_peak == max(node0, gpus45, gpus67)
    assert rep.m_eff == pytest.approx(0.9 * 96e9)
    assert rep.detail[0].persistent == {
        ("actor", "train"): m[atr].train_state,
        ("reference", "copy"): m[ref].weights,
    }
    assert set(rep.detail[1].transient) == {"actor_gen", "reward_inf", "critic_inf", "critic_train"}


def test_stale_serving_copy_is_persistent_away_from_the_trainer(tiny_ppo, cluster_1x2x4):
    # τ(actor) = 1: on GPUs without actor_train the generation keeps a persistent shadow copy;
    # on the trainer's GPUs its weights are transient. Two vertices overlap on GPUs 0-3.
    structure = Structure("ppo", False, (("actor", 1), ("critic", 0)))
    ev = Evaluator(tiny_ppo, cluster_1x2x4, structure)
    dirs = build_directories(ev.costs)
    gen, ref, rew, cinf, atr, ctr = range(6)
    plan = Plan(
        (
            place(ev, dirs, gen, 8, (0, 0, 0)),
            place(ev, dirs, ref, 4, (0, 1, 0)),
            place(ev, dirs, rew, 4, (0, 1, 0)),
            place(ev, dirs, cinf, 4, (0, 1, 0)),
            place(ev, dirs, atr, 4, (0, 0, 0)),
            place(ev, dirs, ctr, 4, (0, 1, 0)),
        )
    )
    m = [ev.costs.memory(v, c.strategy) for v, c in enumerate(plan.choices)]
    node0 = m[atr].train_state + max(m[gen].transient + m[gen].weights, m[atr].transient)
    node1 = (
        m[gen].weights  # shadow copy of the actor
        + m[ref].weights
        + m[rew].weights
        + m[ctr].train_state
        + max(
            m[gen].transient,
            m[ref].transient,
            m[rew].transient,
            m[cinf].transient + m[cinf].weights,  # critic τ = 0, trained here
            m[ctr].transient,
        )
    )
    rep = ev.memory(plan, detail=True)
    assert rep.atoms == [0b1111, 0b11110000]
    assert rep.peak == pytest.approx([node0, node1], rel=1e-12)
    assert ("actor", "copy") in rep.detail[1].persistent
    assert ("actor", "copy") not in rep.detail[0].persistent


def test_isolated_memory_is_state_plus_transient(ev, dirs):
    for d in dirs:
        for s in d.strategies[:5]:
            m = ev.costs.memory(d.vertex, s)
            if m.train_state:
                assert m.isolated == m.train_state + m.transient
            else:
                assert m.isolated == m.weights + m.transient


STAGES = [("training", 2), ("training", 3), ("inference", 2), ("inference", 3), ("generation", 2)]


def test_vertex_memory_follows_the_engine_choices(ev, dirs):
    # SPEC §14.3, §14.5: what Costs.memory charges per vertex under each listed variant, from
    # the worst-stage shard N_s (weight_shard_params, checked by hand in test_memory.py)
    from rpeg.costmodel import weight_shard_params
    from rpeg.costmodel.memory import kv_budget_tokens

    hw = ev.cluster.hardware
    seen = set()
    for d in dirs:
        v = ev.graph.vertices[d.vertex]
        spec, head = ev.graph.models[v.model].spec, ev.graph.models[v.model].head
        for s in d.strategies:
            m = ev.costs.memory(d.vertex, s)
            n_s = weight_shard_params(spec, s.pp, s.tp, head)
            seen.add((v.role.value, s.zero, s.offload))
            if s.offload:  # SPEC §14.4: what would persist is resident only while the vertex runs
                kept = ev.costs.memory(d.vertex, s.variant(offload=False))
                moved = kept.train_state if v.role.value == "training" else kept.weights
                assert m.train_state == 0.0 and moved > 0
                assert m.weights == (kept.weights if v.role.value == "training" else 0.0)
                assert m.transient == pytest.approx(kept.transient + moved, rel=1e-12)
                assert m.isolated == pytest.approx(kept.isolated, rel=1e-12)  # alone: no saving
                continue
            if v.role.value == "training":  # Adam state over Pd·Pc whatever the stage; a BF16 copy
                assert m.train_state == pytest.approx(12 * n_s / (s.dp * s.cp), rel=1e-12)
                assert m.weights == pytest.approx(2 * n_s, rel=1e-12)
            elif v.role.value == "inference":  # a replica (z = 2) or a shard (z = 3) per rank
                assert m.train_state == 0.0
                assert m.weights == pytest.approx(2 * n_s / (s.dp * s.cp if s.zero == 3 else 1), rel=1e-12)
            else:  # the rollout engine holds u·M_GPU, weights included, when a sequence fits
                assert m.weights == pytest.approx(2 * n_s, rel=1e-12)
                u = s.mem_fraction or hw.kv_memory_fraction
                held = m.weights + m.transient
                assert held >= u * hw.gpu_memory_bytes * (1 - 1e-12)
                if kv_budget_tokens(spec, ev.costs.layout(s), hw, head) >= LP + LR:
                    assert held == pytest.approx(u * hw.gpu_memory_bytes, rel=1e-12)
    assert {(role, z, False) for role, z in STAGES} <= seen
    assert {(role, z, True) for role, z in STAGES} <= seen


def test_rule_reward_host_time_is_charged_to_the_generation(cluster_1x2x4):
    # c_r = 0.01 s per sequence on B·R = 64 sequences: the generation's node lasts 0.64 s longer
    seven = model_preset("7b")
    kw = {"models": {"actor": seven, "critic": seven}, "reward": "rule"}
    free = Evaluator(
        Workload("ppo", batch=B, rollouts=R, prompt_len=LP, response_len=LR, **kw), cluster_1x2x4
    )
    slow = Evaluator(
        Workload("ppo", batch=B, rollouts=R, prompt_len=LP, response_len=LR, reward_cost_s=0.01, **kw),
        cluster_1x2x4,
    )
    names = [v.name for v in free.graph.vertices]
    assert "reward_inf" not in names and names == [v.name for v in slow.graph.vertices]
    dirs = build_directories(free.costs)
    for d in dirs:
        role = free.graph.vertices[d.vertex].role.value
        for s in d.strategies[:5]:
            t0, t1 = free.costs.op_time(d.vertex, s), slow.costs.op_time(d.vertex, s)
            if role == "generation":
                assert t1 == pytest.approx(t0 + 0.01 * 64, rel=1e-12)
            else:
                assert t1 == t0


# ---------------------------------------------------------------------------- property test
# module-level (hypothesis draws need it outside fixtures): the same tiny PPO as conftest's
SEVEN = model_preset("7b")
PPO = Workload("ppo", {"actor": SEVEN, "critic": SEVEN, "reward": SEVEN}, B, R, LP, LR)
STRUCTURES = structures(PPO)


@cache
def _setup(structure: Structure):
    cluster = Cluster.from_shape("1x2x4", hardware_preset("gh200"))
    ev = Evaluator(PPO, cluster, structure)
    return ev, build_directories(ev.costs)


@st.composite
def random_plans(draw):
    structure = draw(st.sampled_from(STRUCTURES))
    ev, dirs = _setup(structure)
    choices = []
    for d in dirs:
        options = d.choices(ev.cluster, draw(st.integers(0, len(d) - 1)))
        choices.append(draw(st.sampled_from(options)))
    return ev, Plan(tuple(choices))


def test_structures_cover_sharing_and_staleness():
    assert len(STRUCTURES) == 6
    assert {s.ac_sharing for s in STRUCTURES} == {False, True}


@settings(max_examples=40, deadline=None)
@given(random_plans())
def test_random_plans_lower_to_valid_schedules(case):
    ev, plan = case
    e = ev.evaluate(plan, keep=True)
    assert check_schedule(e.graph, e.schedule) == []
    assert e.makespan == max(e.schedule.finish)
    assert e.throughput == pytest.approx(WORK / e.makespan, rel=1e-12)
    g = e.graph
    busy = sum(g.duration[i] * bin(g.mask[i]).count("1") for i in range(len(g)))
    assert e.utilization == pytest.approx(busy / (8 * e.makespan), rel=1e-9)
    if e.feasible:
        assert e.score == e.throughput
    else:
        assert e.score == pytest.approx(e.throughput * math.exp(-40.0 * (e.memory.ratio - 1.0)), rel=1e-9)
    # every OP node reserves its vertex's allocation and each vertex runs in every step
    for i in range(len(g)):
        if g.kind[i] == 0:
            assert g.mask[i] == plan.choices[g.vertex[i]].allocation.mask
    steps = {(g.vertex[i], g.step[i]) for i in range(len(g)) if g.kind[i] == 0}
    assert steps == {(v, k) for v in range(len(plan)) for k in range(ev.k_eval)}


def test_delta_range_is_the_front_doors(tiny_ppo, cluster_1x2x4):
    """δ ∈ (0, 1], as ``solve`` and ``--delta`` say: δ = 1 is accepted (it weights every plan by
    its utilisation), δ = 0 and δ > 1 are refused naming the range."""
    Evaluator(tiny_ppo, cluster_1x2x4, objective="throughput-util", delta=1.0)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"delta must be in \(0, 1\]"):
            Evaluator(tiny_ppo, cluster_1x2x4, objective="throughput-util", delta=bad)

"""``runtime/binding.py``: worker groups, the rank layout, consumed versions and the scaled run
shape of a plan (no Ray, no torch.distributed)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rpeg.ir.types import Role
from rpeg.runtime.binding import (
    bind,
    check_specs,
    consumed_version,
    rank_coords,
    recompute_note,
    run_shape,
    run_specs,
)
from rpeg.runtime.trace.records import expected_graph
from tests.runtime.plans import COLOCATED, ONE_DEVICE, SMALL, hand, workload

PPO_SYNC = (("actor", 0), ("critic", 0))


@pytest.fixture(scope="module")
def small():
    return hand(workload("ppo"), "1x1x2", SMALL, PPO_SYNC)


def binding_of(result, steps: int = 1, **kwargs):
    return bind(result, expected_graph(result, steps), steps, **kwargs)


def test_rank_coords_follow_the_cost_model_layout():
    # rank = d·(Pp·Pt) + p·Pt + t
    pp, tp = 2, 3
    for d in range(2):
        for p in range(pp):
            for t in range(tp):
                assert rank_coords(d * pp * tp + p * tp + t, pp, tp) == (d, p, t)


def test_consumed_version_reads_tau_steps_back_and_past_versions_after_an_offset():
    assert consumed_version(Role.TRAINING, 5, tau=2) == 5  # training reads k, produces k + 1
    assert consumed_version(Role.GENERATION, 5, tau=0) == 5
    assert consumed_version(Role.GENERATION, 5, tau=2) == 3
    assert consumed_version(Role.GENERATION, 1, tau=2) == 0  # a fresh run reads its initial weights
    assert consumed_version(Role.GENERATION, 1, tau=2, offset=4) == -1  # a continued job: older ones


def test_groups_share_only_same_allocation_and_strategy(small):
    b = binding_of(small)
    by_vertex = {v: g for g in b.groups for v in g.vertices}
    # critic inference and training: same devices and layout → one group (no COMM between them)
    assert by_vertex["critic_inf"] is by_vertex["critic_train"]
    # generation (TP 2) and training (DP 2) of the actor: same devices, other layout → two groups
    assert by_vertex["actor_gen"] is not by_vertex["actor_train"]
    assert by_vertex["actor_gen"].tp == 2 and by_vertex["actor_train"].dp == 2
    assert [g.gid for g in b.groups] == list(range(len(b.groups)))
    for v, gid in enumerate(b.group_of):
        assert b.graph.vertices[v].name in b.groups[gid].vertices
    trains = {g.model for g in b.groups if g.trains}
    assert trains == {"actor", "critic"}
    g = by_vertex["actor_gen"]
    assert g.workers() == [f"g{g.gid}/r0", f"g{g.gid}/r1"] and g.size == 2
    assert g.layout() == {"dp": 1, "pp": 1, "tp": 2, "mb": 1}


def test_the_reference_shares_the_actors_weight_seed(small):
    b = binding_of(small, seed=3)
    seeds = {g.model: g.seed for g in b.groups}
    ref = next(g for g in b.groups if "ref_inf" in g.vertices)
    actor = next(g for g in b.groups if "actor_train" in g.vertices)
    assert ref.seed == actor.seed
    assert len(set(seeds.values())) >= 2  # other models draw other weights
    assert binding_of(small, seed=4).groups[0].seed != b.groups[0].seed


def test_run_shape_scales_phases_and_defaults_the_batch(small):
    shape = run_shape(small, batch=None, prompt_len=8, response_len=8, vocab=16, max_rollouts=4)
    assert shape.batch >= 8 and shape.rollouts == 1
    assert shape.phase_lengths[-1] == 8 and shape.phase_fractions[-1] == 1.0
    assert list(shape.phase_lengths) == sorted(set(shape.phase_lengths))  # increasing
    lengths = shape.response_lengths()
    assert len(lengths) == shape.sequences and set(lengths) <= set(shape.phase_lengths)
    assert lengths == sorted(lengths)  # the first f_1 fraction finishes first


def test_run_shape_refuses_too_few_sequences_and_short_responses(small):
    with pytest.raises(ValueError, match=r"fewer than the plan's largest Pd·mb = 2"):
        run_shape(small, batch=1, prompt_len=8, response_len=8, vocab=16, max_rollouts=4)
    with pytest.raises(ValueError, match="prompt_len must be a positive integer"):
        run_shape(small, batch=None, prompt_len=0, response_len=8, vocab=16, max_rollouts=4)
    grpo = hand(workload("grpo"), "1x1x1", ONE_DEVICE, (("actor", 0),))
    with pytest.raises(ValueError, match="GRPO needs at least 2 rollouts"):
        run_shape(grpo, batch=None, prompt_len=8, response_len=8, vocab=16, max_rollouts=1)


def test_run_specs_fit_every_plan_of_the_run_and_check_specs_names_the_vertex(small):
    other = hand(workload("ppo"), "1x1x4", COLOCATED, PPO_SYNC)
    specs = run_specs([small, other])
    for r in (small, other):
        check_specs(r, specs)  # one model shape the whole run can lay out
    specs = run_specs([small])
    odd = {**specs, "actor": replace(specs["actor"], ffn_hidden=specs["actor"].ffn_hidden + 1)}
    with pytest.raises(
        ValueError, match=r"vertex 'actor_gen': tp=2 cannot split the run's scaled actor \(ffn_hidden"
    ):
        check_specs(small, odd)
    with pytest.raises(ValueError, match="no scaled spec for model 'critic'"):
        check_specs(small, {k: v for k, v in specs.items() if k != "critic"})


def test_groups_carry_the_trainers_recompute_mode_and_share_across_modes():
    # actor training "selective" (runs as "none", noted), critic training "none" beside its
    # inference: one group still (the mode moves no weights), the others "none"
    table = dict(SMALL)
    table["actor_train"] = (*SMALL["actor_train"], "selective")
    table["critic_train"] = (*SMALL["critic_train"], "none")
    b = binding_of(hand(workload("ppo"), "1x1x2", table, PPO_SYNC))
    by_vertex = {v: g for g in b.groups for v in g.vertices}
    assert by_vertex["critic_inf"] is by_vertex["critic_train"]
    actor, critic = by_vertex["actor_train"], by_vertex["critic_train"]
    assert (actor.recompute, actor.recompute_run) == ("selective", "none")
    assert (critic.recompute, critic.recompute_run) == ("none", "none")
    assert recompute_note("selective").startswith("recompute 'selective' planned, run as 'none'")
    assert recompute_note("full") == recompute_note("none") == ""
    assert all(g.recompute == "none" for g in b.groups if not g.trains)
    default = binding_of(hand(workload("ppo"), "1x1x2", SMALL, PPO_SYNC))  # hand plans: full
    assert {g.recompute_run for g in default.groups if g.trains} == {"full"}

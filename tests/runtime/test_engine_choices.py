"""``runner.check_engine_choices``: what the bundled engines do not run yet is refused before any
worker starts, naming the vertex or the workload field (docs/runtime.md, "Real job shapes"); the
workload's SPEC §14 choices pass, and ``run``'s RL hyper-parameters agree with the workload's
KL coefficient."""

from __future__ import annotations

import pytest

from rpeg.costmodel import hardware_preset
from rpeg.ir import Cluster, Structure, Workload
from rpeg.ir.cluster import NO_SPLITS
from rpeg.runtime.driver.runner import check_engine_choices
from rpeg.solvers import solve
from rpeg.solvers.result import result_for_plan
from tests.runtime.plans import TOY

CLUSTER = Cluster.from_shape("1x1x2", hardware_preset("gh200"), max_zero_stage=2, **NO_SPLITS)
WHOLE = ((0, 0, 0), (1, 1, 2))


def _grpo(**fields) -> Workload:
    models = {"actor": TOY} | ({} if fields.get("reward") == "rule" else {"reward": TOY})
    return Workload("grpo", models, 8, 4, 64, 64, **fields)


def test_a_plan_within_the_engines_limits_passes():
    check_engine_choices(solve(_grpo(), CLUSTER, "greedy"))


@pytest.mark.parametrize(
    "fields",
    [
        {"reward": "rule", "reward_cost_s": 0.5},
        {"kl_coef": 0.0},
        {"old_logprob": "trainer"},
        {"mini_batches": 4},
        {"reward": "rule", "kl_coef": 0.0, "old_logprob": "trainer", "mini_batches": 2},
    ],
)
def test_the_workload_choices_of_spec_14_run(fields):
    """A rule reward, no reference, the trainer's old log-probs and several updates per step run
    (tests/runtime/test_job_choices.py runs them)."""
    check_engine_choices(solve(_grpo(**fields), CLUSTER, "greedy"))


def test_pipelined_training_needs_pp_microbatches_in_every_update():
    """1F1B runs one schedule of ⌈mb/U⌉ microbatches per update: fewer than pp is refused."""
    w = _grpo(reward="rule", kl_coef=0.0, mini_batches=2)
    cluster = Cluster.from_shape("1x1x2", hardware_preset("gh200"), max_zero_stage=2, **NO_SPLITS)

    def plan(mb: int):
        table = {"actor_gen": (*WHOLE, 2, 1, 1, 1), "actor_train": (*WHOLE, 1, 2, 1, mb)}
        return result_for_plan(w, cluster, Structure.synchronous(w), table)

    with pytest.raises(
        ValueError,
        match=r"vertex 'actor_train': pp=2 .* mb=2 .* U=2 .* ⌈mb/U⌉ = 1 per update, fewer than pp=2",
    ):
        check_engine_choices(plan(2))
    check_engine_choices(plan(4))


def test_a_kl_term_without_a_reference_is_refused_before_any_worker_starts():
    from rpeg.runtime.config import RLConfig
    from rpeg.runtime.driver.runner import rl_config, run

    no_ref = solve(_grpo(kl_coef=0.0), CLUSTER, "greedy")
    assert rl_config(no_ref, None).kl_coef == 0.0  # the workload's β by default
    assert rl_config(solve(_grpo(kl_coef=0.05), CLUSTER, "greedy"), None).kl_coef == 0.05
    assert rl_config(no_ref, RLConfig(kl_coef=0.0, lr=0.5)).lr == 0.5
    with pytest.raises(ValueError, match=r"rl\.kl_coef = 0\.01 but the workload has kl_coef = 0"):
        run(no_ref, steps=1, rl=RLConfig(kl_coef=0.01))


def _hand(train_engine: dict, ref_engine: dict | None = None):
    w = _grpo()
    table = {
        "actor_gen": (*WHOLE, 2, 1, 1, 1),
        "ref_inf": (*WHOLE, 2, 1, 1, 1, None, ref_engine or {}),
        "reward_inf": (*WHOLE, 2, 1, 1, 1),
        "actor_train": (*WHOLE, 2, 1, 1, 1, "full", train_engine),
    }
    return result_for_plan(
        w, Cluster.from_shape("1x1x2", hardware_preset("gh200")), Structure.synchronous(w), table
    )


def test_zero_3_runs_and_is_refused_only_where_state_moves_naming_the_vertex():
    check_engine_choices(_hand({"zero": 3}))  # a stage-3 trainer runs
    check_engine_choices(_hand({}, {"zero": 3}))  # and a stage-3 frozen copy
    with pytest.raises(
        ValueError,
        match=r"vertex 'actor_train': ZeRO stage 3 .* does not move between plans .* max_zero_stage=2",
    ):
        check_engine_choices(_hand({"zero": 3}), moves_state=True)
    with pytest.raises(ValueError, match=r"vertex 'ref_inf': ZeRO stage 3 .* does not move between plans"):
        check_engine_choices(_hand({}, {"zero": 3}), moves_state=True)
    with pytest.raises(ValueError, match=r"vertex 'actor_train': ZeRO stage 1 .* stages 2 and 3"):
        check_engine_choices(_hand({"zero": 1}))
    check_engine_choices(_hand({"logits_chunk": 4096}))  # a chunked training loss runs
    check_engine_choices(_hand({}, {"logits_chunk": 4096}))  # and a forward's chunked log-probs


def test_a_run_shape_gives_every_update_equal_pipelined_microbatches():
    """``bind`` refuses a batch whose mini-batches would give a PP-2 trainer's DP rank shares of
    different sizes (1F1B keeps its buffers from the first microbatch), or too few sequences for
    every DP rank and microbatch of every update."""
    from rpeg.runtime.binding import bind
    from rpeg.runtime.trace.records import expected_graph

    cluster = Cluster.from_shape("1x1x2", hardware_preset("gh200"), max_zero_stage=2, **NO_SPLITS)
    w = _grpo(reward="rule", kl_coef=0.0, mini_batches=3)
    table = {"actor_gen": (*WHOLE, 2, 1, 1, 1), "actor_train": (*WHOLE, 1, 2, 1, 6)}
    result = result_for_plan(w, cluster, Structure.synchronous(w), table)
    with pytest.raises(
        ValueError,
        match=r"'actor_train': pp=2 .* 16 sequences in U=3 mini-batches over dp=1 give DP rank 0 5 or 6 "
        r"per update, not one multiple of ⌈mb/U⌉ = 2",
    ):
        bind(result, expected_graph(result, 1), 1, batch=4)
    assert bind(result, expected_graph(result, 1), 1, batch=3).shape.sequences == 12  # 4, 4, 4
    w = _grpo(reward="rule", kl_coef=0.0, mini_batches=4)
    table = {"actor_gen": (*WHOLE, 2, 1, 1, 1), "actor_train": (*WHOLE, 2, 1, 1, 1)}
    result = result_for_plan(w, cluster, Structure.synchronous(w), table)
    with pytest.raises(ValueError, match=r"4 sequences is fewer than the plan's largest U·Pd·⌈mb/U⌉ = 8"):
        bind(result, expected_graph(result, 1), 1, batch=1)
    assert bind(result, expected_graph(result, 1), 1).shape.sequences == 32  # the default batch


@pytest.mark.parametrize("vertex", ["actor_gen", "ref_inf", "actor_train"])
def test_host_offload_is_refused_naming_the_vertex_and_the_switch(vertex):
    """SPEC §14.4: a CPU worker's device memory is host memory and the vLLM CPU build has no
    sleep mode, so any vertex that offloads is refused; ``host_offload=False`` plans without."""
    w = _grpo(reward="rule")
    cluster = Cluster.from_shape("1x1x2", hardware_preset("gh200"), max_zero_stage=2, **NO_SPLITS)
    table = {
        "actor_gen": (*WHOLE, 2, 1, 1, 1, None, {}),
        "ref_inf": (*WHOLE, 2, 1, 1, 1, None, {}),
        "actor_train": (*WHOLE, 2, 1, 1, 1, "full", {}),
    }
    table[vertex] = (*table[vertex][:7], {"offload": True})
    plan = result_for_plan(w, cluster, Structure.synchronous(w), table)
    why = "no sleep mode" if vertex == "actor_gen" else "device memory is host memory"
    with pytest.raises(ValueError, match=rf"vertex '{vertex}': host offload .* {why}.*host_offload=False"):
        check_engine_choices(plan)
    planned = solve(
        w,
        Cluster.from_shape(
            "1x1x2", hardware_preset("gh200"), max_zero_stage=2, host_offload=False, **NO_SPLITS
        ),
        "sa",
        max_evaluations=200,
        seed=0,
    )
    assert not any(c.strategy.offload for c in planned.plan.choices)
    check_engine_choices(planned)

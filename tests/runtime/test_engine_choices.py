"""``runner.check_engine_choices``: what the bundled engines do not run yet is refused before any
worker starts, naming the vertex or the workload field (docs/runtime.md, "Real job shapes")."""

from __future__ import annotations

import pytest

from rpeg.costmodel import hardware_preset
from rpeg.ir import Cluster, Structure, Workload
from rpeg.runtime.runner import check_engine_choices
from rpeg.solvers import solve
from rpeg.solvers.result import result_for_plan
from tests.runtime.plans import TOY

CLUSTER = Cluster.from_shape("1x1x2", hardware_preset("gh200"), max_zero_stage=2)
WHOLE = ((0, 0, 0), (1, 1, 2))


def _grpo(**fields) -> Workload:
    models = {"actor": TOY} | ({} if fields.get("reward") == "rule" else {"reward": TOY})
    return Workload("grpo", models, 8, 4, 64, 64, **fields)


def test_a_plan_within_the_engines_limits_passes():
    check_engine_choices(solve(_grpo(), CLUSTER, "greedy"))


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"reward": "rule"}, r"workload\.reward = 'rule' is planned but not yet run"),
        ({"kl_coef": 0.0}, r"workload\.kl_coef = 0 \(no reference model\)"),
        ({"old_logprob": "trainer"}, r"workload\.old_logprob = 'trainer'"),
        ({"mini_batches": 4}, r"workload\.mini_batches = 4"),
    ],
)
def test_workload_features_the_rl_loop_lacks_are_refused(fields, match):
    with pytest.raises(ValueError, match=match):
        check_engine_choices(solve(_grpo(**fields), CLUSTER, "greedy"))


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


def test_zero_3_and_a_chunked_training_loss_are_refused_naming_the_vertex():
    with pytest.raises(ValueError, match=r"vertex 'actor_train': ZeRO stage 3 .* max_zero_stage=2"):
        check_engine_choices(_hand({"zero": 3}))
    with pytest.raises(ValueError, match=r"vertex 'ref_inf': ZeRO stage 3"):
        check_engine_choices(_hand({}, {"zero": 3}))
    with pytest.raises(ValueError, match=r"vertex 'actor_train': a chunked training loss"):
        check_engine_choices(_hand({"logits_chunk": 4096}))
    check_engine_choices(_hand({}, {"logits_chunk": 4096}))  # a forward's chunked log-probs run

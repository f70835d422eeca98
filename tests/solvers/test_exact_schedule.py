"""An exact plan's proven schedule is the one the result reports: the plan is list-scheduled in
the order of the engine's own start times, and both figures are kept (issue 15: the EST-first
list schedule lost 7% of the proven throughput on its instance; under SPEC §14's cost model it
loses nothing there, and 11% on the instance below)."""

from __future__ import annotations

import pytest

pytest.importorskip("ortools")

from rpeg import Cluster, Workload, hardware_preset, model_preset, solve
from rpeg.ir.errors import InputError
from rpeg.solvers.result import Result


@pytest.fixture(scope="module")
def proven() -> Result:
    w = Workload(
        "ppo",
        {
            "actor": model_preset("llama2-13b"),
            "critic": model_preset("llama2-7b"),
            "reward": model_preset("llama2-13b"),
        },
        128,
        1,
        512,
        256,
    )
    c = Cluster.from_shape("1x2x4", hardware_preset("gh200"))
    # issue 15's instance (13B actor, 7B critic and reward, B=256, Lp=128 on 1x2x8 A100-40GB,
    # candidates=3) no longer shows it: its optimum's EST-first list schedule is the model's
    # order. Here the list schedule of the optimum is 11% longer than the model's order (the
    # same for seeds 0-2)
    return solve(w, c, "cpsat", candidates=2, k_eval=2, time_limit=60, seed=0)


def test_the_result_follows_the_models_schedule(proven):
    x = proven.extra
    assert proven.status.value == "optimal" and x["schedule"] == "model"
    # following the model's order finishes no later than the model (its ticks round up) and
    # clearly earlier than the EST-first list schedule
    assert proven.makespan == x["followed_makespan"] <= x["model_makespan"] + 1e-9
    assert x["list_makespan"] > 1.03 * proven.makespan
    assert proven.throughput >= x["model_throughput"] * (1 - 1e-9)


def test_the_followed_schedule_survives_the_result_file(proven):
    again = Result.from_json(proven.to_json())
    assert again.makespan == proven.makespan
    assert again.evaluation.schedule.start == proven.evaluation.schedule.start
    doc = proven.to_dict()
    doc["extra"]["model_starts"] = doc["extra"]["model_starts"][:-1]  # a node without a start
    import json

    with pytest.raises(InputError, match=r"extra.model_starts.*has no start for node"):
        Result.from_json(json.dumps(doc))
    doc["extra"]["model_starts"] = "soon"
    with pytest.raises(InputError, match=r"extra.model_starts' must be a list"):
        Result.from_json(json.dumps(doc))


def test_the_summary_names_the_schedule_and_both_makespans(proven):
    line = next(s for s in proven.summary().splitlines() if s.startswith("schedule"))
    x = proven.extra
    assert "the model's order" in line
    assert (
        f"model {x['model_makespan']:.3f} s" in line and f"EST-first list {x['list_makespan']:.3f} s" in line
    )

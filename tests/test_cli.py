"""Tests for ``cli.py``: ``rpeg examples | solve | evaluate`` run in-process.

Exit statuses: 0 success, 2 bad input (one line naming the problem), 3 no memory-feasible plan.
Result files are judged by the independent checker ``tests/tools/check_result.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rpeg import example_names
from rpeg.cli import EXIT_BAD_INPUT, EXIT_INFEASIBLE, main

TOML_70B = """\
name = "ppo-70b-8gpu"
description = "PPO, Llama-2 70B actor, 7B critic/reward, 8 A100-40GB"
algorithm = "ppo"

[batch]
prompts = 64
rollouts = 1
prompt_len = 128
response_len = 256

[models]
actor = "llama2-70b"
critic = "llama2-7b"
reward = "llama2-7b"

[cluster]
shape = "1x1x8"
hardware = "a100-40gb"
"""


def run(capsys, *argv):
    """``main(argv)`` → (exit status, stdout, stderr)."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_examples_lists_every_bundled_example(capsys):
    status, out, _ = run(capsys, "examples")
    assert status == 0
    lines = out.splitlines()
    assert len(lines) == len(example_names())
    assert sorted(line.split()[0] for line in lines) == sorted(example_names())
    for line in lines:
        name, _, description = line.partition("\t")
        assert description.strip(), f"{name} has no description"


@pytest.mark.parametrize("method", ["greedy", "concurrent"])
@pytest.mark.parametrize("name", example_names())
def test_solve_writes_a_checked_result_that_evaluate_reproduces(capsys, tmp_path, checker, name, method):
    out_path = tmp_path / f"{name}-{method}.json"
    status, out, _ = run(capsys, "solve", name, "--method", method, "--json", str(out_path))
    assert status == 0
    assert "tokens/s" in out and f"wrote {out_path}" in out
    doc = json.loads(out_path.read_text())
    assert checker.check(doc) == []
    assert doc["method"] == method and doc["status"] == "feasible"
    assert doc["memory_feasible"] is True

    again = tmp_path / "evaluated.json"
    status, out, _ = run(capsys, "evaluate", name, "--plan", str(out_path), "--json", str(again))
    assert status == 0
    redo = json.loads(again.read_text())
    assert redo["throughput"] == pytest.approx(doc["throughput"], rel=1e-12)
    assert redo["makespan"] == pytest.approx(doc["makespan"], rel=1e-12)
    assert redo["plan"] == doc["plan"]
    assert redo["structure"] == doc["structure"]
    assert checker.check(redo) == []
    assert f"{doc['throughput']:,.0f} tokens/s" in out


def test_solve_options_reach_the_result(capsys, tmp_path):
    path = tmp_path / "r.json"
    status, _, _ = run(
        capsys, "solve", "ppo-7b-16gpu", "--cluster", "1x2x4", "--hardware", "gh200",
        "--k-eval", "3", "--json", str(path),
    )  # fmt: skip
    assert status == 0
    doc = json.loads(path.read_text())
    assert doc["k_eval"] == 3
    assert (doc["cluster"]["racks"], doc["cluster"]["nodes_per_rack"]) == (1, 2)
    assert doc["cluster"]["gpus_per_node"] == 4
    # real tokens (SPEC §14.1): SPEC §2's default quantiles for Lr = 384 give a mean response
    # Ē = 0.5·(0+96)/2 + 0.35·(96+192)/2 + 0.15·(192+384)/2 = 117.6 tokens, not the padded 384
    assert doc["workload"]["quantiles"] == [[0.5, 96], [0.85, 192], [1.0, 384]]
    assert doc["throughput"] == pytest.approx(3 * 512 * (128 + 117.6) / doc["makespan"], rel=1e-12)


def test_no_host_offload_plans_for_engines_that_cannot_offload(capsys, tmp_path):
    # PPO of four 7B models on four A100-40GB: greedy needs host offload (SPEC §14.4) to fit;
    # told the engines cannot (the bundled CPU engines), it finds nothing and says why
    toml = tmp_path / "ppo-7b-4gpu.toml"
    toml.write_text(TOML_70B.replace('"llama2-70b"', '"llama2-7b"').replace("1x1x8", "1x1x4"))
    path = tmp_path / "r.json"
    status, _, _ = run(capsys, "solve", str(toml), "--method", "greedy", "--json", str(path))
    assert status == 0
    doc = json.loads(path.read_text())
    assert any(e["offload"] for e in doc["plan"]) and "host_offload" not in doc["cluster"]
    status, _, err = run(
        capsys, "solve", str(toml), "--method", "greedy", "--no-host-offload", "--json", str(path)
    )
    assert status == EXIT_INFEASIBLE, err
    doc = json.loads(path.read_text())
    assert doc["cluster"]["host_offload"] is False


def test_the_parallelism_switches_plan_without_the_splits(capsys, tmp_path, checker):
    """``--no-sequence-parallel --no-context-parallel --no-expert-parallel
    --no-virtual-pipeline-parallel --no-expert-overlap --no-flex-dispatch`` (SPEC §15, the interleaved pipeline; the bundled torch
    engine) reach the result file's cluster and leave no split in the plan; the default plan of
    the same job uses one."""
    flags = (
        "--no-sequence-parallel",
        "--no-context-parallel",
        "--no-expert-parallel",
        "--no-virtual-pipeline-parallel",
        "--no-expert-overlap",
        "--no-flex-dispatch",
    )
    docs = {}
    for off in (False, True):
        path = tmp_path / f"off-{off}.json"
        status, _, err = run(
            capsys,
            "solve",
            "grpo-8b-16gpu",
            "--method",
            "greedy",
            *(flags if off else ()),
            "--json",
            str(path),
        )
        assert status == 0, err
        docs[off] = json.loads(path.read_text())
        assert checker.check(docs[off]) == []
    cluster = docs[True]["cluster"]
    switches = (
        "sequence_parallel",
        "context_parallel",
        "expert_parallel",
        "virtual_pipeline_parallel",
        "expert_overlap",
        "flex_dispatch",
    )
    assert [cluster[k] for k in switches] == [False] * 6
    assert all(e["cp"] == 1 and e["ep"] == 1 and not e["sp"] and e["vp"] == 1 for e in docs[True]["plan"])
    assert not any(e["ep_overlap"] or e["flex_dispatch"] or e["etp"] is not None for e in docs[True]["plan"])
    assert "sequence_parallel" not in docs[False]["cluster"]  # the default is written by omission
    assert any(e["sp"] or e["cp"] > 1 or e["vp"] > 1 for e in docs[False]["plan"])  # greedy's trainer splits


def test_evaluate_with_other_hardware_rescores_the_same_plan(capsys, tmp_path, checker):
    # --cluster/--hardware replace the result file's cluster: same plan, other figures
    path = tmp_path / "r.json"
    assert run(capsys, "solve", "ppo-7b-16gpu", "--json", str(path))[0] == 0
    again = tmp_path / "again.json"
    status, _, _ = run(
        capsys, "evaluate", "ppo-7b-16gpu", "--plan", str(path), "--cluster", "1x4x4",
        "--hardware", "h200", "--json", str(again),
    )  # fmt: skip
    assert status == 0
    doc, redo = json.loads(path.read_text()), json.loads(again.read_text())
    assert redo["plan"] == doc["plan"]
    assert redo["cluster"]["hardware"]["name"] == "h200"
    assert redo["cluster"]["gpu_memory_bytes"] != doc["cluster"]["gpu_memory_bytes"]
    assert redo["throughput"] != pytest.approx(doc["throughput"], rel=1e-6)
    assert checker.check(redo) == []


def test_rollout_scheduling_prices_the_synchronous_loop_and_says_so(capsys, tmp_path):
    """``--rollout-scheduling sync`` plans for an engine without asynchronous scheduling: a
    slower generation, said in the summary and kept in the result file; ``evaluate`` re-scores
    a plan made for the presets' asynchronous engine only when asked to."""
    path, slow = tmp_path / "async.json", tmp_path / "sync.json"
    status, out, _ = run(capsys, "solve", "grpo-8b-16gpu", "--method", "greedy", "--json", str(path))
    assert status == 0 and "rollout engine: asynchronous scheduling" in out
    status, out, _ = run(
        capsys, "solve", "grpo-8b-16gpu", "--method", "greedy", "--rollout-scheduling", "sync",
        "--json", str(slow),
    )  # fmt: skip
    assert status == 0 and "rollout engine: synchronous loop" in out
    fast_doc, slow_doc = json.loads(path.read_text()), json.loads(slow.read_text())
    assert slow_doc["cluster"]["hardware"]["rollout_step"].get("async_scheduling", False) is False
    assert fast_doc["cluster"]["hardware"]["rollout_step"]["async_scheduling"] is True
    assert slow_doc["throughput"] < fast_doc["throughput"]
    # a plan made for the other engine loop than the workload's preset: refused unless asked;
    # the asynchronous plan re-scored on the synchronous loop when asked
    status, _, err = run(capsys, "evaluate", "grpo-8b-16gpu", "--plan", str(slow))
    assert status == 2 and "rollout_step.async_scheduling" in err and "--rollout-scheduling" in err
    status, out, _ = run(
        capsys, "evaluate", "grpo-8b-16gpu", "--plan", str(path), "--rollout-scheduling", "sync"
    )
    assert status == 0 and "rollout engine: synchronous loop" in out and "re-scored on h100" in out


def test_rollout_scheduling_on_hardware_without_an_engine_step_is_an_error(capsys):
    status, _, err = run(
        capsys,
        "solve",
        "grpo-8b-16gpu",
        "--method",
        "greedy",
        "--hardware",
        "cpu",
        "--rollout-scheduling",
        "async",
    )
    assert status == 2
    assert "--rollout-scheduling async: hardware 'cpu' has no rollout engine step" in err
    assert "Traceback" not in err


def test_infeasible_workload_exits_3_and_says_why(capsys, tmp_path):
    toml = tmp_path / "ppo-70b.toml"
    toml.write_text(TOML_70B)
    for method in ("greedy", "concurrent"):
        status, out, _ = run(capsys, "solve", str(toml), "--method", method)
        assert status == EXIT_INFEASIBLE == 3
        assert "NO FEASIBLE PLAN" in out
        assert "'actor_train'" in out
        assert "GiB over M_eff" in out


def test_infeasible_result_file_is_still_written(capsys, tmp_path):
    toml = tmp_path / "ppo-70b.toml"
    toml.write_text(TOML_70B)
    path = tmp_path / "r.json"
    status, _, _ = run(capsys, "solve", str(toml), "--json", str(path))
    assert status == 3
    doc = json.loads(path.read_text())
    assert doc["status"] == "infeasible"
    assert "actor_train" in doc["message"]


# ---------------------------------------------------------------------------- bad input
def _bad(capsys, *argv):
    status, _, err = run(capsys, *argv)
    assert status == EXIT_BAD_INPUT == 2
    assert err.startswith("rpeg: error: ")
    assert len(err.strip().splitlines()) == 1
    return err


def test_unknown_example(capsys):
    err = _bad(capsys, "solve", "no-such-example")
    assert "unknown example 'no-such-example'" in err
    assert "ppo-7b-16gpu" in err  # lists the known ones


def test_bad_cluster_shape(capsys):
    err = _bad(capsys, "solve", "ppo-7b-16gpu", "--cluster", "3x3")
    assert "'3x3'" in err and "RACKSxNODESxGPUS" in err


def test_unknown_hardware(capsys):
    err = _bad(capsys, "solve", "ppo-7b-16gpu", "--hardware", "tpu")
    assert "unknown hardware preset 'tpu'" in err
    assert "gh200" in err


def test_unknown_method(capsys):
    err = _bad(capsys, "solve", "ppo-7b-16gpu", "--method", "annealing")
    assert "unknown method 'annealing'" in err
    assert "concurrent" in err and "greedy" in err


def test_toml_missing_batch_prompts(capsys, tmp_path):
    toml = tmp_path / "w.toml"
    toml.write_text(TOML_70B.replace("prompts = 64\n", ""))
    err = _bad(capsys, "solve", str(toml))
    assert "batch.prompts" in err
    assert str(toml) in err


def test_toml_with_bad_value(capsys, tmp_path):
    toml = tmp_path / "w.toml"
    toml.write_text(TOML_70B.replace("prompt_len = 128", "prompt_len = -5"))
    err = _bad(capsys, "solve", str(toml))
    assert "prompt_len" in err and "-5" in err


def test_missing_workload_file(capsys, tmp_path):
    err = _bad(capsys, "solve", str(tmp_path / "absent.toml"))
    assert "absent.toml" in err and "does not exist" in err


def test_missing_plan_file(capsys, tmp_path):
    err = _bad(capsys, "evaluate", "ppo-7b-16gpu", "--plan", str(tmp_path / "none.json"))
    assert "none.json" in err


def test_plan_file_that_is_not_json(capsys, tmp_path):
    path = tmp_path / "p.json"
    path.write_text("{not json")
    err = _bad(capsys, "evaluate", "ppo-7b-16gpu", "--plan", str(path))
    assert "not valid JSON" in err


def test_plan_file_without_plan(capsys, tmp_path):
    path = tmp_path / "p.json"
    path.write_text("{}")
    err = _bad(capsys, "evaluate", "ppo-7b-16gpu", "--plan", str(path))
    assert "'plan'" in err


def test_plan_with_an_illegal_entry(capsys, tmp_path):
    path = tmp_path / "r.json"
    assert run(capsys, "solve", "ppo-7b-16gpu", "--json", str(path))[0] == 0
    doc = json.loads(path.read_text())
    doc["plan"][0]["pp"] = 3
    path.write_text(json.dumps(doc))
    err = _bad(capsys, "evaluate", "ppo-7b-16gpu", "--plan", str(path))
    assert f"'{doc['plan'][0]['vertex']}'" in err and "P2" in err


def test_plan_with_a_null_origin_is_bad_input(capsys, tmp_path):
    path = tmp_path / "r.json"
    assert run(capsys, "solve", "ppo-7b-16gpu", "--json", str(path))[0] == 0
    doc = json.loads(path.read_text())
    doc["plan"][0]["origin"] = None
    path.write_text(json.dumps(doc))
    err = _bad(capsys, "evaluate", "ppo-7b-16gpu", "--plan", str(path))
    assert "origin" in err


def test_plan_entry_that_is_not_an_object_is_bad_input(capsys, tmp_path):
    path = tmp_path / "r.json"
    assert run(capsys, "solve", "ppo-7b-16gpu", "--json", str(path))[0] == 0
    doc = json.loads(path.read_text())
    doc["plan"][0] = "actor_gen"
    path.write_text(json.dumps(doc))
    _bad(capsys, "evaluate", "ppo-7b-16gpu", "--plan", str(path))


@pytest.fixture(scope="module")
def greedy_plan(tmp_path_factory) -> dict:
    """A ``ppo-7b-16gpu`` greedy result document (k_eval 2)."""
    path = tmp_path_factory.mktemp("greedy") / "r.json"
    assert main(["solve", "ppo-7b-16gpu", "--method", "greedy", "--k-eval", "2", "--json", str(path)]) == 0
    return json.loads(path.read_text())


BLOCKS = [
    ("workload null", {"workload": None}, r"field 'workload': Input should be a table \(object\) \(got None\)"),
    ("workload name", {"workload": "ppo-7b-16gpu"}, r"field 'workload': .*table \(object\) \(got 'ppo-7b-16gpu'\)"),
    ("cluster shape", {"cluster": "1x1x4"}, r"field 'cluster': .*table \(object\) \(got '1x1x4'\)"),
    ("cluster null", {"cluster": None}, r"field 'cluster': .*\(got None\)"),
    ("structure null", {"structure": None}, r"field 'structure': .*\(got None\)"),
    ("cluster racks text", {"cluster": {"racks": "1"}}, r"field 'cluster\.racks'"),
    ("workload B list", {"workload": {"B": [512]}}, r"field 'workload\.B'"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "pattern"), [c[1:] for c in BLOCKS], ids=[c[0] for c in BLOCKS])
@pytest.mark.parametrize("whole", [True, False], ids=["result file", "plan and the block only"])
def test_evaluate_checks_a_plan_files_blocks_before_comparing_them(
    capsys, tmp_path, greedy_plan, change, pattern, whole
):
    # issue 33: these ended in a TypeError/AttributeError from the mismatch check
    doc = json.loads(json.dumps(greedy_plan)) if whole else {"plan": greedy_plan["plan"]}
    for key, value in change.items():
        if isinstance(value, dict):
            doc[key] = {**(doc.get(key) or greedy_plan[key]), **value}
        else:
            doc[key] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    err = _bad(capsys, "evaluate", "ppo-7b-16gpu", "--plan", str(path))
    assert f"--plan {path}: " in err
    assert re.search(pattern, err), err


def test_evaluate_names_the_hardware_figure_that_differs(capsys, tmp_path, greedy_plan):
    # issue 33: one figure edited read "made for hardware 'gh200', not 'gh200'"
    doc = json.loads(json.dumps(greedy_plan))
    hw = doc["cluster"]["hardware"]
    was = hw["peak_flops"]
    hw["peak_flops"] = was / 2
    hw["p2p"][1]["beta"] *= 2
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    err = _bad(capsys, "evaluate", "ppo-7b-16gpu", "--plan", str(path))
    assert "other hardware than the workload's 'gh200'" in err
    assert f"peak_flops is {was / 2} in the plan file but {was} here" in err
    assert "p2p[1].beta is" in err and "pass --hardware" in err


PSPLIB = Path(__file__).resolve().parent / "data" / "psplib"


@pytest.mark.parametrize(
    ("method", "instance", "optimum"),
    [
        ("cpsat", "j30.sm/j301_1.sm", 43),
        ("milp", "j20.mm/j2010_1.mm", 18),
        ("list", "j30.sm/j301_1.sm", None),
    ],
)
def test_project_command(capsys, method, instance, optimum):
    status, out, _ = run(capsys, "project", str(PSPLIB / instance), "--method", method, "--time-limit", "30")
    assert status == 0
    assert "schedule   valid" in out
    if optimum is not None:
        assert "status optimal" in out and f"makespan   {float(optimum)}" in out


def test_project_command_bad_input(capsys, tmp_path):
    err = _bad(capsys, "project", str(tmp_path / "missing.sm"))
    assert "does not exist" in err
    bad = tmp_path / "x.txt"
    bad.write_text("hello")
    assert "PSPLIB" in _bad(capsys, "project", str(bad))


def test_run_transition_argument_is_checked(capsys, tmp_path):
    """``rpeg run --transition`` wants STEP:RESULT.json with an existing file (checked before Ray)."""
    status, out, _ = run(
        capsys, "solve", "ppo-1b-4gpu", "--method", "greedy", "--json", str(tmp_path / "a.json")
    )
    assert status == 0, out
    a = str(tmp_path / "a.json")
    status, _, err = run(capsys, "run", a, "--transition", "two:" + a)
    assert status == EXIT_BAD_INPUT and "must look like STEP:RESULT.json" in err
    status, _, err = run(capsys, "run", a, "--transition", "2:" + str(tmp_path / "missing.json"))
    assert status == EXIT_BAD_INPUT and "missing.json" in err and "does not exist" in err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize(("flag", "name"), [("--json", "out.json"), ("--gantt", "out.png")])
def test_an_output_that_fails_on_write_names_the_flag_and_the_path(capsys, tmp_path, flag, name):
    """issue 33: ``--json`` into a file that fails on write (a full disk: ``/dev/full``, which
    opens fine) said only "[Errno 28] No space left on device"."""
    path = tmp_path / name
    path.symlink_to("/dev/full")
    status, out, err = run(capsys, "solve", "ppo-1b-4gpu", "--method", "greedy", flag, str(path))
    assert status == EXIT_BAD_INPUT
    assert err == f"rpeg: error: {flag} {str(path)!r} could not be written (No space left on device)\n"
    assert "throughput" in out  # the summary came first


def test_delta_is_passed_with_its_objective_only(capsys, monkeypatch):
    import rpeg.cli

    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return solve(*args, **kwargs)

    solve = rpeg.cli.solve
    monkeypatch.setattr(rpeg.cli, "solve", spy)
    argv = ("solve", "ppo-1b-4gpu", "--method", "greedy", "--objective", "throughput-util", "--delta", "0.5")
    assert run(capsys, *argv)[0] == 0
    assert run(capsys, "solve", "ppo-1b-4gpu", "--method", "greedy")[0] == 0
    assert seen[0]["delta"] == 0.5 and "delta" not in seen[1]  # solve's own default


def test_a_reader_that_leaves_is_not_an_error(capsys, monkeypatch):
    """issue 33: ``rpeg examples | head -1`` ended with exit 2 and "[Errno 32] Broken pipe". A
    closed pipe ends the command quietly with 141, as POSIX tools (128 + SIGPIPE)."""
    import os

    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first line
    with os.fdopen(write, "w") as closed:
        monkeypatch.setattr("sys.stdout", closed)
        assert main(["examples"]) == 141
        assert os.fstat(closed.fileno()).st_ino == os.stat(os.devnull).st_ino  # what is left goes nowhere
    monkeypatch.undo()
    assert capsys.readouterr().err == ""


def test_a_reader_that_leaves_ends_the_process_quietly(tmp_path):
    """The same through a real process: no message, no "Exception ignored" at exit."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "import sys; from rpeg.cli import main; sys.exit(main(['examples']))"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (141, "")

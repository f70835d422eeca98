"""Strict reading of the runtime's user inputs: trace files, checkpoint directories, the Python
API's arguments and the CLI's paths — each refused with one message naming the file, field or
argument, before any work starts. No Ray here: every check happens before workers exist.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import rpeg
import rpeg.cli
from rpeg import Cluster, solve
from rpeg.costmodel import hardware_preset
from rpeg.ir.cluster import NO_SPLITS
from rpeg.ir.errors import InputError
from rpeg.runtime.driver.liveness import RunError
from rpeg.runtime.trace.checkpoint import check_checkpoint, file_digest, write_manifest
from rpeg.runtime.trace.records import Trace, TraceRecord, plan_hash
from rpeg.runtime.trace.verify import verify
from tests.runtime.plans import workload


@pytest.fixture(scope="module")
def result():
    return solve(
        workload("ppo"),
        Cluster.from_shape("1x1x2", hardware_preset("gh200"), max_zero_stage=2, **NO_SPLITS),
        "greedy",
    )


def tiny_trace(result, **record) -> Trace:
    rec = {
        "node": 0,
        "kind": "op",
        "vertex": "actor_gen",
        "source": None,
        "step": 0,
        "phase": 0,
        "workers": ["g0/r0"],
        "devices": [0],
        "layout": {"dp": 1, "pp": 1, "tp": 1, "mb": 1},
        "start": 0.0,
        "end": 1.0,
        "versions_consumed": {"actor": 0},
        "version_produced": {},
        "bytes": 0,
        "worker_time": 0.5,
    }
    rec.update(record)
    return Trace(plan_hash(result), 1, dict(result.structure.tau), [TraceRecord(**rec)])


def write_doc(path: Path, doc: dict, raw: str | None = None) -> Path:
    path.write_text(raw if raw is not None else json.dumps(doc))
    return path


# ---------------------------------------------------------------------------- traces
def test_trace_of_another_format_is_refused_naming_it(result, tmp_path):
    doc = tiny_trace(result).to_dict()
    path = write_doc(tmp_path / "t.json", {**doc, "format": "rpeg.trace/2"})
    with pytest.raises(InputError, match=r"t\.json: format 'rpeg\.trace/2' is not 'rpeg\.trace/1'"):
        Trace.from_json(path)
    result.to_json(tmp_path / "r.json")  # the arguments swapped on the command line
    with pytest.raises(InputError, match=r"format 'rpeg.result/2'.*a result file"):
        Trace.from_json(tmp_path / "r.json")


@pytest.mark.parametrize(
    "literal, field",
    [("NaN", "start"), ("Infinity", "end"), ("-Infinity", "worker_time"), ("1e999", "end")],
)
def test_non_finite_times_are_refused(result, tmp_path, literal, field, capsys):
    value = {"start": "0.0", "end": "1.0", "worker_time": "0.5"}[field]
    text = tiny_trace(result).to_json().replace(f'"{field}": {value}', f'"{field}": {literal}')
    path = write_doc(tmp_path / "t.json", {}, text)
    assert literal in path.read_text()
    with pytest.raises(InputError, match=r"t\.json"):
        Trace.from_json(path)
    # rpeg verify: one line, exit 2 (it passed such a trace before)
    result.to_json(tmp_path / "r.json")
    assert rpeg.cli.main(["verify", str(path), str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rpeg: error: ") and "t.json" in err[0]


def test_negative_times_and_counts_are_refused_with_the_field_path(result, tmp_path):
    for field, value in (("start", -1.0), ("end", -0.5), ("worker_time", -2.0), ("bytes", -1), ("node", -3)):
        doc = tiny_trace(result).to_dict()
        doc["records"][0][field] = value
        with pytest.raises(InputError, match=rf"field 'records\[0\]\.{field}': Input should be greater"):
            Trace.from_dict(doc, "t.json")
    doc = tiny_trace(result).to_dict()
    doc["steps"] = 0
    with pytest.raises(InputError, match=r"field 'steps'"):
        Trace.from_dict(doc)
    doc = tiny_trace(result).to_dict()
    doc["meta"] = {"wall_s": float("nan")}  # a Python document with NaN in a free-form block
    with pytest.raises(InputError, match=r"meta\.wall_s holds nan"):
        Trace.from_dict(doc)


def test_missing_unknown_and_mistyped_fields_are_named(result):
    doc = tiny_trace(result).to_dict()
    del doc["records"][0]["worker_time"]
    with pytest.raises(InputError, match=r"missing field 'records\[0\]\.worker_time'"):
        Trace.from_dict(doc)
    doc = tiny_trace(result).to_dict()
    doc["records"][0]["workrs"] = []
    with pytest.raises(InputError, match=r"unknown key 'workrs' in \[records\[0\]\], did you mean 'workers'"):
        Trace.from_dict(doc)
    doc = tiny_trace(result).to_dict()
    doc["records"][0]["devices"] = ["0"]
    with pytest.raises(
        InputError, match=r"field 'records\[0\]\.devices\[0\]': Input should be a valid integer"
    ):
        Trace.from_dict(doc)
    doc = tiny_trace(result).to_dict()
    for status in ("failed", "interrupted"):  # without a failure object
        doc["status"] = status
        with pytest.raises(InputError, match="exactly when its status is 'failed' or 'interrupted'"):
            Trace.from_dict(doc)
    doc["status"] = "stopped"
    with pytest.raises(InputError, match="status"):
        Trace.from_dict(doc)
    with pytest.raises(InputError, match="a trace is a JSON object"):
        Trace.from_dict([])


def test_writing_refuses_non_finite_numbers_and_round_trips_a_failed_trace(result):
    t = tiny_trace(result, start=float("nan"))
    with pytest.raises(ValueError, match="not JSON compliant"):
        t.to_json()
    assert any("not a finite number" in p for p in verify(t, result))  # a Python object: verify says so
    failed = tiny_trace(result)
    failed.status, failed.failure = "failed", {"message": "node 3 failed", "node": 3, "step": 0}
    back = Trace.from_json(failed.to_json())
    assert back.status == "failed" and back.failure["node"] == 3 and back.failure["lost"] is False
    assert verify(back, result)[0].startswith("incomplete trace: the run failed (node 3 failed)")
    assert not any("missing record" in p for p in verify(back, result))


# ---------------------------------------------------------------------------- checkpoints
def trainers_of(result) -> dict[int, int]:
    from rpeg.runtime.binding import bind
    from rpeg.runtime.trace.records import expected_graph

    b = bind(result, expected_graph(result, 1), 1)
    return {g.gid: g.size for g in b.groups if g.trains}


@pytest.fixture
def checkpoint(result, tmp_path):
    """A checkpoint directory as a run writes it (files with arbitrary bytes)."""
    trainers = trainers_of(result)
    root = tmp_path / "ckpt"
    files = {}
    for gid, size in trainers.items():
        for r in range(size):
            f = root / "step00001" / f"g{gid}-r{r}.pt"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(bytes(range(256)) * (gid + r + 1))
            files[f.name] = file_digest(f)
    write_manifest(root, plan_hash(result), list(trainers), {1: files})
    return root, trainers


def test_a_sound_checkpoint_passes(result, checkpoint):
    root, trainers = checkpoint
    resume = check_checkpoint(root, plan_hash(result), trainers)
    assert resume.global_step == 1 and resume.verified and resume.step_dir == root / "step00001"


def test_corrupt_manifests_are_refused_naming_the_file_and_field(result, checkpoint):
    root, trainers = checkpoint
    manifest = root / "manifest.json"
    good = json.loads(manifest.read_text())
    manifest.write_text(manifest.read_text()[:40])
    with pytest.raises(InputError, match=r"manifest\.json'?: not valid JSON"):
        check_checkpoint(root, plan_hash(result), trainers)
    for change, match in (
        (lambda d: d["steps"][0]["files"].popitem() and None, "lists no file"),
        (lambda d: d["steps"][0].update(dir=".."), r"field 'steps\[0\]\.dir'"),
        (lambda d: d["steps"][0]["files"][next(iter(d["steps"][0]["files"]))].update(sha256="xyz"), "sha256"),
        (lambda d: d.update(complete_steps=[0, 1]), "differ from the steps listed"),
        (lambda d: d.update(format="rpeg.checkpoint/9"), "format 'rpeg.checkpoint/9'"),
        (lambda d: d.update(plan_hash="0" * 64), "written for another plan"),
        (lambda d: d.update(extra=1), "unknown key 'extra'"),
    ):
        doc = json.loads(json.dumps(good))
        change(doc)
        manifest.write_text(json.dumps(doc))
        with pytest.raises(InputError, match=match):
            check_checkpoint(root, plan_hash(result), trainers)


def test_truncated_missing_or_altered_files_are_refused(result, checkpoint):
    root, trainers = checkpoint
    files = sorted((root / "step00001").glob("*.pt"))
    data = files[0].read_bytes()
    files[0].write_bytes(data[:10])
    with pytest.raises(InputError, match=r"has 10 bytes, the manifest says"):
        check_checkpoint(root, plan_hash(result), trainers)
    files[0].write_bytes(bytes([data[0] ^ 1]) + data[1:])  # same size, one bit flipped
    with pytest.raises(InputError, match=r"is corrupt: SHA-256"):
        check_checkpoint(root, plan_hash(result), trainers)
    files[0].unlink()
    with pytest.raises(InputError, match=rf"{files[0].name}' is missing"):
        check_checkpoint(root, plan_hash(result), trainers)


def test_legacy_manifest_is_accepted_with_a_schema_and_presence_check(result, checkpoint):
    root, trainers = checkpoint
    (root / "manifest.json").write_text(
        json.dumps({"plan_hash": plan_hash(result), "complete_steps": [1], "trainers": sorted(trainers)})
    )
    (root / "step00001" / "meta.json").write_text(json.dumps({"global_step": 1}))
    resume = check_checkpoint(root, plan_hash(result), trainers)
    assert resume.global_step == 1 and not resume.verified
    (root / "manifest.json").write_text(json.dumps({"plan_hash": plan_hash(result), "complete_steps": "1"}))
    with pytest.raises(InputError, match="complete_steps"):
        check_checkpoint(root, plan_hash(result), trainers)


@pytest.fixture
def no_workers(monkeypatch):
    """Fail the test if a run gets as far as starting Ray or its workers (another module's
    session may have Ray running already, so "Ray is not initialised" would prove nothing)."""
    from rpeg.runtime.driver import controller, runner

    def started(*_, **__):
        pytest.fail("the run started Ray or its workers before refusing the input")

    monkeypatch.setattr(runner, "_start_ray", started)
    monkeypatch.setattr(controller.Controller, "start", started)


def test_run_refuses_a_missing_or_corrupt_checkpoint_before_any_worker(
    result, checkpoint, tmp_path, no_workers
):
    root, _ = checkpoint
    t0 = time.perf_counter()
    with pytest.raises(InputError, match=r"resume_from '.*nowhere' does not exist"):
        rpeg.run(result, steps=1, resume_from=tmp_path / "nowhere")
    f = sorted((root / "step00001").glob("*.pt"))[0]
    f.write_bytes(f.read_bytes()[:-1])
    with pytest.raises(InputError, match="manifest says"):
        rpeg.run(result, steps=1, resume_from=root)
    assert time.perf_counter() - t0 < 30  # refused up front, not after starting workers


# ---------------------------------------------------------------------------- the Python API
def test_run_arguments_are_checked_by_name(result):
    with pytest.raises(TypeError, match=r"^result must be a Result .*got NoneType"):
        rpeg.run(None)
    with pytest.raises(TypeError, match=r"result must be a Result.*got str 'plan.json'"):
        rpeg.run("plan.json")
    for kwargs, error, match in (
        ({"steps": 0}, ValueError, "steps must be a positive integer, got 0"),
        ({"steps": "2"}, TypeError, "steps must be a positive integer, got str"),
        ({"steps": True}, TypeError, "steps must be a positive integer"),
        ({"steps": 1, "batch": 0}, ValueError, "batch must be a positive integer"),
        ({"steps": 1, "prompt_len": 2.5}, TypeError, "prompt_len must be"),
        ({"steps": 1, "seed": "0"}, TypeError, "seed must be int"),
        ({"steps": 1, "trace_path": 3}, TypeError, "trace_path must be a path"),
        ({"steps": 1, "progress": 3}, TypeError, "progress must be a callable"),
        ({"steps": 1, "return_weights": 1}, TypeError, "return_weights must be bool"),
        ({"steps": 1, "transitions": "2:x.json"}, TypeError, "transitions must be a sequence"),
        ({"steps": 1, "on_worker_lost": "retry"}, ValueError, "on_worker_lost must be"),
        (
            {"steps": 1, "weight_handover": "nccl"},
            ValueError,
            "weight_handover must be one of 'auto', 'in_place', 'store', got 'nccl'",
        ),
        ({"steps": 1, "weight_handover": True}, TypeError, "weight_handover must be str"),
        ({"steps": 1, "stall_timeout_s": 0}, ValueError, "stall_timeout_s must be a positive"),
        ({"steps": 1, "stall_timeout_s": float("inf")}, ValueError, "stall_timeout_s must be a positive"),
    ):
        with pytest.raises(error, match=match):
            rpeg.run(result, **kwargs)


def test_verify_arguments_are_checked_by_name(result, tmp_path):
    trace = tiny_trace(result)
    with pytest.raises(
        TypeError, match=r"trace must be a Trace .*got Result \(the order is verify\(trace, result\)\)"
    ):
        rpeg.verify(result, trace)
    with pytest.raises(TypeError, match=r"result must be a Result .*got NoneType"):
        rpeg.verify(trace, None)
    with pytest.raises(TypeError, match=r"trace must be a Trace .*got int"):
        rpeg.verify(3, result)
    with pytest.raises(InputError, match=r"trace file '.*none\.json' does not exist"):
        rpeg.verify(tmp_path / "none.json", result)
    trace.to_json(tmp_path / "t.json")
    result.to_json(tmp_path / "r.json")
    assert rpeg.verify(str(tmp_path / "t.json"), tmp_path / "r.json") == verify(trace, result)


def test_output_paths_are_checked_before_any_work(result, tmp_path, no_workers):
    with pytest.raises(InputError, match=r"trace_path '.*' is a directory"):
        rpeg.run(result, steps=1, trace_path=tmp_path)
    with pytest.raises(InputError, match=r"folder '.*missing' does not exist"):
        rpeg.run(result, steps=1, trace_path=tmp_path / "missing" / "t.json")
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match=r"checkpoint_dir '.*file' is a file"):
        rpeg.run(result, steps=1, checkpoint_dir=tmp_path / "file")
    with pytest.raises(InputError, match=r"is a file, not a directory"):
        rpeg.run(result, steps=1, checkpoint_dir=tmp_path / "file" / "sub")


# ---------------------------------------------------------------------------- the CLI
def cli(capsys, *argv: str) -> tuple[int, list[str]]:
    code = rpeg.cli.main(list(argv))
    return code, capsys.readouterr().err.strip().splitlines()


def test_cli_run_refuses_bad_paths_before_any_work(result, tmp_path, capsys, no_workers):
    rpath = tmp_path / "r.json"
    result.to_json(rpath)
    t0 = time.perf_counter()
    for argv, match in (
        (["run", str(tmp_path / "none.json")], "result file '.*none.json' does not exist"),
        (["run", str(rpath), "--trace", str(tmp_path)], "--trace '.*' is a directory"),
        (["run", str(rpath), "--trace", str(tmp_path / "no" / "t.json")], "does not exist"),
        (["run", str(rpath), "--checkpoint-dir", str(rpath)], "--checkpoint-dir '.*' is a file"),
        (
            ["run", str(rpath), "--resume-from", str(tmp_path / "nowhere")],
            "--resume-from '.*' does not exist",
        ),
        (["run", str(rpath), "--steps", "0"], "--steps must be a positive integer"),
        (["run", str(rpath), "--stall-timeout", "-1"], "--stall-timeout must be a positive"),
        (["run", str(rpath), "--transition", "2:" + str(tmp_path / "x.json")], "x.json' does not exist"),
    ):
        code, err = cli(capsys, *argv)
        assert code == 2 and len(err) == 1 and err[0].startswith("rpeg: error: "), (argv, err)
        import re

        assert re.search(match, err[0]), (match, err)
    assert time.perf_counter() - t0 < 60


@pytest.fixture
def no_run(monkeypatch):
    """Fail the test if ``rpeg run`` gets as far as calling :func:`rpeg.run` (the runner loads
    torch and Ray) or ``ray.init``."""
    import ray

    from rpeg.runtime.driver import runner

    def started(*_, **__):
        pytest.fail("rpeg run went on to rpeg.run / ray.init before refusing its arguments")

    monkeypatch.setattr(runner, "run", started)
    monkeypatch.setattr(ray, "init", started)


def test_cli_run_refuses_transition_arguments_before_any_work(result, tmp_path, capsys, no_run):
    """issue 33: ``--transition-method foo`` and ``--transition 0:x.json`` were refused only
    after the run had started (minutes of Ray start-up), ``--transition-method`` without a
    transition not at all."""
    import re

    r = str(tmp_path / "r.json")
    result.to_json(r)
    t0 = time.perf_counter()
    for argv, match in (
        (["--transition-method", "foo", "--transition", f"1:{r}"],
         r"--transition-method: unknown transition method 'foo'; known: greedy, cpsat, milp$"),
        (["--transition-method", "foo"], r"unknown transition method 'foo'"),
        (["--transition-method", "cpsat"],
         r"--transition-method only applies with --transition or --on-worker-lost replan"),
        (["--transition", f"0:{r}"],
         rf"--transition '0:{re.escape(r)}': step 0 must be in 1\.\.3 \(a move comes after at least one step "
         r"and before the last of --steps 4\)$"),
        (["--transition", f"4:{r}"], r"step 4 must be in 1\.\.3"),
        (["--steps", "3", "--transition", f"2:{r}", "--transition", f"2:{r}"],
         r"step 2 has no step left to come after \(a move comes after the --transition at step 2"),
        (["--transition", f"1:{r}", "--checkpoint-dir", str(tmp_path / "ck")],
         r"--transition cannot be combined with --checkpoint-dir \(checkpoints are per plan\)$"),
        (["--transition", f"1:{r}", "--resume-from", str(tmp_path)], r"--transition cannot be combined with --resume-from"),
    ):  # fmt: skip
        code, err = cli(capsys, "run", r, *argv)
        assert code == 2 and len(err) == 1 and err[0].startswith("rpeg: error: "), (argv, err)
        assert re.search(match, err[0]), (match, err)
    assert time.perf_counter() - t0 < 30


def test_run_refuses_transition_arguments_before_any_work(result, no_workers, monkeypatch):
    """The Python API checks the method names and the transitions first, before it imports Ray
    or prepares anything."""
    from rpeg.runtime.driver import runner

    monkeypatch.setattr(runner, "_prepare", lambda *_, **__: pytest.fail("run() went on to prepare the run"))
    cluster = Cluster.from_shape("1x1x2", hardware_preset("gh200"), max_zero_stage=2, **NO_SPLITS)
    other = solve(workload("grpo"), cluster, "greedy")
    for kwargs, match in (
        ({"transition_method": "foo"}, r"transition_method must be one of 'greedy', 'cpsat', 'milp', got 'foo'"),
        ({"replan_method": "foo"}, r"replan_method must be one of .*'greedy'.*, got 'foo'"),
        ({"transitions": [(0, result)]}, r"transitions\[0\]: step 0 must be an integer in 1\.\.1"),
        ({"transitions": [(1, other)]}, r"transition target: workload algorithm 'grpo' differs from the running job's 'ppo'"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            rpeg.run(result, steps=2, **kwargs)


def test_cli_verify_names_missing_and_invalid_files(result, tmp_path, capsys):
    rpath = tmp_path / "r.json"
    result.to_json(rpath)
    code, err = cli(capsys, "verify", str(tmp_path / "t.json"), str(rpath))
    assert code == 2 and err == [f"rpeg: error: trace file {str(tmp_path / 't.json')!r} does not exist"]
    tiny_trace(result).to_json(tmp_path / "t.json")
    code, err = cli(capsys, "verify", str(tmp_path / "t.json"), str(tmp_path / "none.json"))
    assert code == 2 and "result file" in err[0] and "none.json' does not exist" in err[0]
    (tmp_path / "bad.json").write_text("{")
    code, err = cli(capsys, "verify", str(tmp_path / "t.json"), str(tmp_path / "bad.json"))
    assert code == 2 and len(err) == 1 and "bad.json" in err[0]
    code, err = cli(capsys, "verify", str(tmp_path), str(rpath))
    assert code == 2 and err == [f"rpeg: error: trace file {str(tmp_path)!r} is a directory, not a file"]


def test_cli_verify_reports_a_failed_run_as_incomplete(result, tmp_path, capsys):
    rpath = tmp_path / "r.json"
    result.to_json(rpath)
    t = tiny_trace(result)
    t.status, t.failure = "failed", {"message": "node 2 (op actor_train step 0) failed", "node": 2}
    t.to_json(tmp_path / "t.json")
    assert rpeg.cli.main(["verify", str(tmp_path / "t.json"), str(rpath)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("trace INCOMPLETE: incomplete trace: the run failed (node 2")


def test_cli_run_failure_is_one_line_and_names_the_trace(result, tmp_path, capsys, monkeypatch):
    """A RunError from the run (here raised by a stand-in) ends with exit 4 and no traceback."""
    import rpeg.runtime.driver.runner as runner

    rpath = tmp_path / "r.json"
    result.to_json(rpath)

    def failing_run(*args, **kwargs):
        exc = RunError(
            "node 7 (op actor_train step 1) failed on worker g1/r1 (device 1): worker process lost",
            node=7,
            step=1,
            worker="g1/r1",
            device=1,
            lost=True,
        )
        exc.trace, exc.trace_path = tiny_trace(result), kwargs["trace_path"]
        raise exc

    monkeypatch.setattr(runner, "run", failing_run)
    code, err = cli(capsys, "run", str(rpath), "--trace", str(tmp_path / "t.json"))
    assert code == 4
    # first where the engines' output goes (beside the trace), then rpeg's two lines
    assert err[0] == f"engines' output (Ray, vLLM, torch): {tmp_path / 't.engines.log'}"
    err = err[1:]
    assert err[0] == (
        "rpeg: error: run failed: node 7 (op actor_train step 1) failed on worker g1/r1 (device 1): "
        "worker process lost"
    )
    assert err[1].endswith(str(tmp_path / "t.json")) and len(err) == 2


def test_a_moe_plan_with_shared_experts_is_refused_before_any_worker_starts():
    """The runtime builds MoE models as Qwen3-MoE, which has no shared experts: such a plan is
    refused, naming the model, before Ray starts (running it without them would misread it)."""
    from rpeg.ir import ModelSpec, Workload
    from tests.runtime.plans import ONE_DEVICE, hand

    moe = ModelSpec(
        "toy-moe",
        4,
        256,
        512,
        1000,
        4,
        4,
        experts=4,
        experts_active=2,
        expert_ffn=128,
        shared_experts=1,
        shared_ffn=128,
    )
    result = hand(
        Workload("grpo", {"actor": moe, "reward": moe}, 8, 4, 64, 64), "1x1x1", ONE_DEVICE, (("actor", 0),)
    )
    with pytest.raises(ValueError, match=r"model 'actor' \(toy-moe\) has 1 shared expert\(s\)"):
        rpeg.run(result, 1)


def test_a_plan_with_mxfp4_experts_is_refused_before_any_worker_starts():
    """The engines serve the BF16 weights they train: a plan priced with MXFP4 experts is
    refused, naming the model and the setting, not run as BF16 under another plan's figures."""
    from dataclasses import replace

    from rpeg.ir import ModelSpec, Workload
    from tests.runtime.plans import ONE_DEVICE, hand

    moe = ModelSpec("toy-moe", 4, 256, 512, 1000, 4, 4, experts=4, experts_active=2, expert_ffn=128)
    mx = replace(moe, precision="mxfp4")
    result = hand(
        Workload("grpo", {"actor": mx, "reward": moe}, 8, 4, 64, 64), "1x1x1", ONE_DEVICE, (("actor", 0),)
    )
    with pytest.raises(
        ValueError, match=r"model 'actor' \(toy-moe\) has precision 'mxfp4'.*precision 'bf16'"
    ):
        rpeg.run(result, 1)

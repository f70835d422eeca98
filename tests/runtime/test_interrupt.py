"""Stopping a run by signal: SIGINT (Ctrl-C) and SIGTERM (``timeout``, Slurm, Kubernetes) stop
the workers, write the trace up to that point (status ``interrupted``) and end ``rpeg run`` with
one line and the shell's status for that signal (130, 143)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("ray")

from rpeg import solve
from rpeg.costmodel import hardware_preset
from rpeg.ir import Cluster, Workload
from rpeg.runtime.driver.liveness import RunInterrupted
from rpeg.runtime.trace.records import Trace
from rpeg.runtime.trace.verify import verify
from tests.runtime.plans import TOY


def _one_device_grpo():
    """GRPO with a rule reward and no reference on one device: one worker process."""
    wl = Workload("grpo", {"actor": TOY}, 8, 4, 64, 64, reward="rule", kl_coef=0.0)
    return solve(wl, Cluster.from_shape("1x1x1", hardware_preset("gh200")), "greedy")


def _check_interrupted_trace(path: Path, result, signal_name: str) -> Trace:
    trace = Trace.from_json(path)
    assert trace.status == "interrupted" and trace.failure["message"] == f"interrupted by {signal_name}"
    step = trace.failure["step"]
    assert step >= 1 and {r.step for r in trace.records} >= set(range(step))
    problems = verify(trace, result)
    # the records before the interruption follow the plan; nothing after it is reported missing
    assert problems == [
        f"incomplete trace: the run was interrupted (interrupted by {signal_name}); "
        f"{len(trace.records)} record(s) before the interruption"
    ]
    return trace


def _sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # run's own handler turns it into RunInterrupted


def _ctrl_c() -> None:
    # what Python's SIGINT handler does in the main thread; the signal itself is not sent, since
    # a library loaded by an earlier test may have replaced that handler in this process
    raise KeyboardInterrupt


@pytest.mark.parametrize(("stop", "name", "status"), [(_sigterm, "SIGTERM", 143), (_ctrl_c, "SIGINT", 130)])
def test_a_signal_mid_run_stops_it_with_the_trace_so_far(ray_session, tmp_path, stop, name, status):
    """In process, on the session's instance: a signal at step 1's first record ends ``run`` with
    :class:`RunInterrupted` (a ``KeyboardInterrupt``) carrying the trace up to there; the SIGTERM
    handler the run installed is gone afterwards."""
    from rpeg.runtime.driver.runner import run

    result = _one_device_grpo()
    before = signal.getsignal(signal.SIGTERM)
    sent = []

    def progress(event: str, payload: dict) -> None:
        if event == "node" and payload["record"].step == 1 and not sent:
            sent.append(True)
            stop()

    with pytest.raises(RunInterrupted) as info:
        run(result, steps=3, trace_path=tmp_path / "t.json", progress=progress)
    exc = info.value
    assert isinstance(exc, KeyboardInterrupt) and exc.signal_name == name and exc.exit_status == status
    assert exc.step == 1 and exc.trace_path == str(tmp_path / "t.json")
    _check_interrupted_trace(tmp_path / "t.json", result, name)
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_ends_rpeg_run_with_143_a_message_and_the_trace(tmp_path):
    """``rpeg run`` in its own process, with its own Ray instance (whose driver installs a
    SIGTERM handler of its own): SIGTERM once the workers are up and the first node has run."""
    result = _one_device_grpo()
    plan, trace = tmp_path / "plan.json", tmp_path / "trace.json"
    result.to_json(plan)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rpeg.cli", "run", str(plan), "--steps", "20", "--trace", str(trace)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = []  # stderr before the signal
    try:
        for line in proc.stderr:  # the run reports its set-up on stderr
            seen.append(line)
            if line.startswith("workers up:"):
                break
        else:
            pytest.fail(f"rpeg run ended before its workers were up (exit {proc.wait()})")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    lines = [x for x in err.splitlines() if x.startswith("rpeg:")]
    assert lines[0].startswith("rpeg: run interrupted by SIGTERM in step ")
    assert lines[1].startswith("rpeg: trace up to the interruption (") and lines[1].endswith(str(trace))
    assert "Traceback" not in err and out == ""
    # the terminal shows rpeg's own lines only: what Ray and the engines print is in the log
    log = trace.with_suffix(".engines.log")
    assert log.is_file()
    own = (
        "engines' output (Ray, vLLM, torch): ",
        "Ray session logs (the workers' output): ",
        "workers up:",
        "rpeg: ",
    )
    shown = "".join(seen) + err
    assert shown.startswith(f"engines' output (Ray, vLLM, torch): {log}\n"), shown
    assert all(x.startswith(own) for x in shown.splitlines() if x.strip()), shown
    assert Trace.from_json(trace).status == "interrupted"

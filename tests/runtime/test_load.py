"""The runtime under load: representative runs while ~6 busy-looping processes compete for the
two CPUs (``cpu_burner``), and a worker process killed mid-run.

No fixed port and no deadline: every store binds a port the OS picks, every wait is a progress
check (``runtime/driver/liveness.py``), so a loaded machine only makes the runs slower. (Before, the
workers also ran at Ray's default niceness 15 and starved behind the load: a 2-step run did not
finish in 10 minutes; ``start_local_ray`` runs them at niceness 0.)

Measured on the 2-core development machine (other users' jobs running too): about 90 s for
the module, almost all of it worker start-up under the load.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from rpeg.ir.errors import InputError  # noqa: E402
from rpeg.runtime.driver.controller import RunError  # noqa: E402
from rpeg.runtime.driver.runner import run  # noqa: E402
from rpeg.runtime.trace.records import Trace  # noqa: E402
from rpeg.runtime.trace.verify import verify  # noqa: E402
from tests.runtime.burner import BURNERS  # noqa: E402
from tests.runtime.plans import ONE_DEVICE, SMALL, hand, workload  # noqa: E402

SYNC = (("actor", 0), ("critic", 0))


@pytest.fixture(scope="module", autouse=True)
def ray_instance(ray_session):
    """The session's local Ray instance (tests/runtime/conftest.py): started before the burner, starting Ray is not what is under test."""


def test_ppo_dp_tp_run_under_load_completes_verifies_and_checkpoints(cpu_burner, tmp_path):
    """TP-2 generation and DP-2 (ZeRO) training of the actor on the same devices, 2 steps with
    checkpoints (checksummed); a truncated checkpoint file is then refused before any worker
    starts. (Resuming itself is tested without load in test_run.py: under this load one more
    run costs ~40 s, most of it worker start-up.)"""
    result = hand(workload("ppo"), "1x1x2", SMALL, SYNC)
    ckpt = tmp_path / "ckpt"
    report = run(result, steps=2, trace_path=tmp_path / "trace.json", checkpoint_dir=ckpt)
    assert report.problems == []
    assert verify(tmp_path / "trace.json", result) == []  # the file, read through the strict schema
    assert {r.kind for r in report.trace.records} == {"op", "comm", "reshard"}
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["format"] == "rpeg.checkpoint/1" and manifest["complete_steps"] == [0, 1]
    files = manifest["steps"][1]["files"]
    assert len(files) == 3 and all(len(f["sha256"]) == 64 and f["bytes"] > 0 for f in files.values())
    assert cpu_burner.alive() == BURNERS  # the load was there all along
    victim = sorted((ckpt / "step00001").glob("*.pt"))[0]
    victim.write_bytes(victim.read_bytes()[:100])
    with pytest.raises(InputError, match=r"g\d+-r\d+\.pt' has 100 bytes, the manifest says"):
        run(result, steps=1, resume_from=ckpt)


def test_killed_worker_process_names_node_step_worker_device_and_keeps_the_trace(cpu_burner, tmp_path):
    """SIGKILL the actor's worker after step 0's training: the run stops with a RunError naming
    the node, step 1, the worker and its device; the trace file holds every record before the
    failure, status "failed", and verifies as incomplete with no other problem."""
    result = hand(workload("grpo"), "1x1x1", ONE_DEVICE, (("actor", 0),))
    workers: dict[str, dict] = {}
    killed: list[str] = []

    def progress(event: str, payload: dict) -> None:
        if event == "setup":
            workers.update(payload["workers"])
        elif event == "node" and not killed:
            rec = payload["record"]
            if rec.kind == "op" and rec.vertex == "actor_train" and rec.step == 0:
                os.kill(workers[rec.workers[0]]["pid"], signal.SIGKILL)
                killed.append(rec.workers[0])

    path = tmp_path / "trace.json"
    with pytest.raises(RunError) as info:
        run(result, steps=2, trace_path=path, progress=progress)
    exc = info.value
    (victim,) = killed
    device = workers[victim]["device"]
    assert exc.lost and exc.worker == victim and exc.device == device and exc.step == 1
    assert str(exc).startswith(f"node {exc.node} (") and "step 1" in str(exc)
    assert f"failed on worker {victim} (device {device}): worker process lost" in str(exc)
    assert exc.trace_path == str(path)
    trace = Trace.from_json(path)
    assert trace.status == "failed" and trace.failure["worker"] == victim
    assert trace.failure["node"] == exc.node and trace.failure["device"] == device
    assert any(r.vertex == "actor_train" and r.step == 0 for r in trace.records)
    assert all(r.node != exc.node for r in trace.records)
    problems = verify(path, result)
    assert len(problems) == 1 and problems[0].startswith("incomplete trace: the run failed"), problems
    assert cpu_burner.alive() == BURNERS


def test_waits_follow_progress_not_deadlines(cpu_burner):
    """A computing worker is waited for past the stall window; an idle one that never answers
    ends the wait after it; a dead one is reported at once, named with its device."""
    from rpeg.runtime.driver.liveness import Owner, Watchdog

    class _Probe:
        """A plain actor (no torch; defined here so Ray ships it by value)."""

        def pid(self) -> tuple[int, str]:
            import os
            import socket

            return os.getpid(), socket.gethostname()

        def spin(self, seconds: float) -> float:
            import time

            end = time.monotonic() + seconds
            while time.monotonic() < end:
                pass
            return seconds

        def sleep(self, seconds: float) -> float:
            import time

            time.sleep(seconds)
            return seconds

    probe = ray.remote(num_cpus=0, max_restarts=0)(_Probe)
    watch = Watchdog(stall_s=1.5, poll_s=0.25)
    owners = []
    for i in range(2):
        a = probe.remote()
        o = Owner(f"t/r{i}", i, a)
        watch.register(o, *ray.get(a.pid.remote()))
        owners.append(o)
    busy = owners[0].actor.spin.remote(4.0)  # longer than the stall window, but computing
    assert watch.get_all([busy], lambda r: owners[0], "spinning") == [4.0]
    idle = owners[1].actor.sleep.remote(600.0)
    with pytest.raises(RunError, match=r"sleeping: no progress for 1.5 s \(worker t/r1 \(device 1\) alive"):
        watch.get_all([idle], lambda r: owners[1], "sleeping")
    os.kill(owners[1].pid, signal.SIGKILL)  # the sleeper dies while its call is still pending
    with pytest.raises(
        RunError, match=r"waiting failed on worker t/r1 \(device 1\): worker process lost"
    ) as info:
        watch.get_all([idle], lambda r: owners[1], "waiting")
    assert info.value.lost and info.value.worker == "t/r1" and info.value.device == 1
    ray.kill(owners[0].actor)

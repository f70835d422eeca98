"""``runtime/driver/liveness.py``: the run's failure type and the watchdog's process checks — a dead
local process is named at once, a computing one counts as progress (no Ray instance: the
checks use ``psutil`` on processes of this host)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from rpeg.runtime.driver.liveness import BUSY_FRACTION, Owner, RunError, Watchdog, cause


def test_run_error_is_one_line_and_carries_what_failed():
    exc = RunError("node 3 failed\n  on worker g0/r1", node=3, step=1, worker="g0/r1", device=2, lost=True)
    assert str(exc) == "node 3 failed on worker g0/r1"
    assert (exc.node, exc.step, exc.worker, exc.device, exc.lost) == (3, 1, "g0/r1", 2, True)
    assert exc.trace is None and exc.trace_path is None and exc.vertex is None


def test_owner_label_names_worker_and_device():
    assert Owner("g1/r0", 2, actor=None).label() == "worker g1/r0 (device 2)"


def test_cause_is_the_last_error_line_of_a_worker_traceback():
    pytest.importorskip("ray")
    exc = RuntimeError("Traceback (most recent call last):\n  File x\nValueError: bad layout\n")
    assert cause(exc) == "ValueError: bad layout"
    assert cause(RuntimeError("\n  just this  \n")) == "just this"
    assert cause(RuntimeError("")) == "RuntimeError"


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_local_process_that_exits_is_dead_and_named():
    pytest.importorskip("psutil")
    watch = Watchdog(stall_s=5.0)
    proc = _child("import time; time.sleep(60)")
    try:
        owner = Owner("g0/r0", 0, actor=None)
        watch.register(owner, proc.pid, watch.host)
        assert watch.dead(owner) is None
    finally:
        proc.kill()
        proc.wait()
    assert watch.dead(owner) == f"its process {proc.pid} is gone"


def test_a_computing_process_is_busy_and_a_sleeping_one_is_not():
    pytest.importorskip("psutil")
    watch = Watchdog(stall_s=5.0)
    spinning = _child("while True: pass")
    sleeping = _child("import time; time.sleep(60)")
    try:
        hot, cold = Owner("g0/r0", 0, actor=None), Owner("g0/r1", 1, actor=None)
        watch.register(hot, spinning.pid, watch.host)
        watch.register(cold, sleeping.pid, watch.host)
        time.sleep(1.0)  # start-up CPU of the sleeper ends well before this
        watch.busy([cold], 1.0)  # reading after its start-up
        t0 = time.monotonic()
        time.sleep(0.5)
        elapsed = time.monotonic() - t0
        assert not watch.busy([cold], elapsed)  # far below BUSY_FRACTION of the wall time
        assert watch.busy([hot], 2.0)  # used ≥ BUSY_FRACTION·2 s of CPU since registration
        assert BUSY_FRACTION < 0.1
    finally:
        for p in (spinning, sleeping):
            p.kill()
            p.wait()


def test_a_process_on_another_host_is_not_checked_locally():
    watch = Watchdog()
    owner = Owner("g0/r0", 0, actor=None)
    watch.register(owner, 1, "some-other-host")
    assert owner._proc is None and not watch.busy([owner], 1.0)

"""``ir/warmup.py``: kernels loaded once per process in a background thread."""

from __future__ import annotations

import sys
import threading
import warnings

import pytest

from rpeg.ir.warmup import WarmUp


def test_runs_once_and_reports_ready():
    calls = []
    started = threading.Event()
    release = threading.Event()

    def run():
        calls.append(threading.current_thread().name)
        started.set()
        release.wait()
        return True

    w = WarmUp("test-warm-up", run, "the test kernels", "the reference")
    assert not w.ready()
    assert w.start() is False  # not waiting: returns at once
    started.wait()
    assert not w.ready()  # still loading
    release.set()
    assert w.start(wait=True) is True
    assert w.start() is True
    assert calls == ["test-warm-up"]  # one thread, once, whatever the number of starts


def test_a_failure_warns_once_and_leaves_the_reference():
    def run():
        raise RuntimeError("no cache locator")

    w = WarmUp("test-warm-up-fail", run, "the test kernels", "the reference stays")
    with pytest.warns(
        RuntimeWarning,
        match=r"the test kernels is unavailable \(RuntimeError: no cache locator\); the reference stays",
    ):
        assert w.start(wait=True) is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert w.start(wait=True) is False  # no second thread, no second warning
    assert not w.ready()


def test_a_run_that_declines_stays_unready_without_a_warning():
    w = WarmUp("test-warm-up-decline", lambda: False, "the test kernels", "the reference")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert w.start(wait=True) is False
    assert not w.ready()


def test_llvmlites_wrapper_refuses_dunders_so_vllms_module_scan_works():
    """vLLM's CPU workers read ``vars(obj)`` of every module global when they start; llvmlite's
    C-library wrapper (loaded with numba, for rpeg's compiled cores) used to answer ``__dict__``
    with a C-function wrapper and break that scan."""
    from llvmlite.binding import ffi

    import rpeg.scoring.fast  # noqa: F401 - loads numba, hence llvmlite, and applies the fix

    assert not hasattr(ffi.lib, "__dict__")
    assert callable(ffi.lib.LLVMPY_GetProcessTriple)  # the C functions are still there
    # vLLM's own scan, with vLLM loaded: tests/runtime/engines/test_vllm_scan.py


#: A short process: starts the probe's warm-up, waits until its ``run`` has begun, prints its pid
#: and exits; at exit it prints the pid of the detached process it handed the warm-up to.
_SHORT_PROCESS = """
import os, time
from pathlib import Path
from warmup_probe import WARM_UP
d = Path(os.environ["RPEG_PROBE_DIR"])
hand_off = WARM_UP.hand_off
def recorded():
    p = hand_off()
    print("finisher", p.pid if p else None, flush=True)
WARM_UP.hand_off = recorded  # start() registers the instance's hand_off at exit
WARM_UP.start()
while not (d / f"started-{os.getpid()}").exists():
    time.sleep(0.01)
print("pid", os.getpid(), flush=True)
"""


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie counts: its parent has left)."""
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_process_exits_without_waiting_and_a_detached_one_finishes_the_warm_up(tmp_path, monkeypatch):
    """Issue 33: a short process on a cold cache waited over a minute at exit for the compile
    thread. Now it exits while its warm-up still runs (the probe's ``run`` cannot finish before
    the test writes ``go``), and a detached process runs the warm-up to its end; a second
    process exiting meanwhile starts no second one (the lock)."""
    import os
    import subprocess
    import time
    from pathlib import Path

    from rpeg.ir.warmup import lock_path

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))  # this test's own lock
    monkeypatch.setenv("RPEG_PROBE_DIR", str(tmp_path))
    probes = str(Path(__file__).parent / "probes")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [probes, os.environ.get("PYTHONPATH")])))

    def short_process() -> tuple[int, int]:
        # Waiting for its warm-up at exit, this process would wait for ``go``, written only later.
        out = subprocess.run(
            [sys.executable, "-c", _SHORT_PROCESS], capture_output=True, text=True, timeout=600
        )
        assert out.returncode == 0, out.stderr[-2000:]
        got = dict(line.split() for line in out.stdout.splitlines())
        return int(got["pid"]), int(got["finisher"])

    def wait(condition) -> None:
        for _ in range(6000):  # no deadline a loaded machine would miss: the failure is a hang
            if condition():
                return
            time.sleep(0.1)

    first, finisher = short_process()
    wait(lambda: (tmp_path / f"started-{finisher}").exists())
    assert (tmp_path / f"started-{finisher}").exists()  # the detached process runs the warm-up
    second, idle = short_process()
    wait(lambda: _gone(idle))
    assert _gone(idle)  # found the lock taken and left
    assert {p.name for p in tmp_path.glob("started-*")} == {f"started-{p}" for p in (first, second, finisher)}
    assert not list(tmp_path.glob("done-*"))  # both short processes exited with their runs unfinished
    (tmp_path / "go").touch()
    wait(lambda: (tmp_path / f"done-{finisher}").exists())
    assert [p.name for p in tmp_path.glob("done-*")] == [f"done-{finisher}"]
    Path(lock_path("warmup_probe:wait_for_go")).unlink(missing_ok=True)

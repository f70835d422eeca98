"""``ir/warmup.py``: kernels loaded once per process in a background thread."""

from __future__ import annotations

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

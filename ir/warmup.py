"""Loading compiled kernels without waiting for them.

numba compiles a kernel the first time it is called (seconds) and then caches the machine code
on disk (later processes load it in a fraction of a second). A planner on a time limit, or one
called during a running job, must not wait for that. A :class:`WarmUp` runs the kernels once on
a tiny input in a background thread, started once per process; until it has finished the caller
takes its pure-Python reference path, which gives the same results. The thread is not a daemon:
a process that finishes first waits for it at exit, so the cache gets written.

Used by the evaluator (:mod:`rpeg.scoring.fast`), the transition-DAG builder
(:mod:`rpeg.ir.emu.flat`) and the transition scheduler (:mod:`rpeg.heuristics.transition`).
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable

__all__ = ["WarmUp", "quiet_llvmlite_wrapper"]


class WarmUp:
    """One set of kernels, loaded or compiled once per process in a background thread.

    Parameters
    ----------
    name
        The thread's name.
    run
        Calls the kernels on a tiny input with the argument types real calls use (so the
        compiled specialisations are the ones real calls need). Returns ``False`` when the
        kernels cannot be used and it has already said why; an exception means the same, and
        is reported once as a :class:`RuntimeWarning`.
    what, fallback
        For that warning: what is unavailable, and what is used instead.
    """

    def __init__(self, name: str, run: Callable[[], bool], what: str, fallback: str) -> None:
        self.name = name
        self.run = run
        self.what = what
        self.fallback = fallback
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def ready(self) -> bool:
        """Whether the kernels are loaded in this process."""
        return self._ready.is_set()

    def start(self, wait: bool = False) -> bool:
        """Start the thread unless it has been started; with ``wait``, block until it ends.

        Returns
        -------
        bool
            :meth:`ready`. ``False`` after waiting means the kernels cannot be used (a warning
            said why) and the caller keeps its reference path.
        """
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._load, name=self.name)
                self._thread.start()
        if wait:
            self._thread.join()
        return self._ready.is_set()

    def _load(self) -> None:
        try:
            ok = self.run()
        except Exception as exc:  # the reference stays; say why once
            warnings.warn(
                f"rpeg: {self.what} is unavailable ({type(exc).__name__}: {exc}); {self.fallback}",
                RuntimeWarning,
                stacklevel=1,
            )
            return
        if ok:
            self._ready.set()


def quiet_llvmlite_wrapper() -> None:
    """Make llvmlite's C-library wrapper refuse dunder attributes (once per process).

    ``llvmlite.binding.ffi.lib`` answers *any* attribute with a wrapper of the C function of
    that name, ``__dict__`` included. vLLM's CPU platform, when a worker starts, scans every
    loaded module's globals and reads ``vars(obj)`` of each object (its Triton kernel
    overrides), so with llvmlite loaded (numba: rpeg's compiled cores) it fails with
    ``'_lib_fn_wrapper' object has no attribute 'get'``. No C function of llvmlite's is a
    dunder, so refusing those names changes nothing else. Called by every module that imports
    numba and before a vLLM engine starts (``docs/decisions.md``); a no-op without llvmlite.
    """
    ffi = sys.modules.get("llvmlite.binding.ffi")
    wrapper = getattr(ffi, "_lib_wrapper", None)
    if wrapper is None or getattr(wrapper, "_rpeg_quiet", False):
        return
    lookup = wrapper.__getattr__

    def __getattr__(self, name: str):  # noqa: N807 - replaces the class's own
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return lookup(self, name)

    wrapper.__getattr__ = __getattr__
    wrapper._rpeg_quiet = True

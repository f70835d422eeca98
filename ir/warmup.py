"""Loading compiled kernels without waiting for them.

numba compiles a kernel the first time it is called (seconds) and then caches the machine code
on disk (later processes load it in a fraction of a second). A planner on a time limit, or one
called during a running job, must not wait for that. A :class:`WarmUp` runs the kernels once on
a tiny input in a background thread, started once per process; until it has finished the caller
takes its pure-Python reference path, which gives the same results.

The thread is a daemon: a process never waits for it at exit (on a cold cache the transition
scheduler's kernels alone take about a minute of CPU, and a short ``plan_transition`` script used
to wait that long at exit). So that the compile is not lost, a process whose thread is still
running at exit hands it to a detached process (:meth:`WarmUp.hand_off`) that runs the same
warm-up and writes the cache; a lock file keeps one such process per warm-up and cache at a time,
so a burst of short processes compiles once, not once each.

Used by the evaluator (:mod:`rpeg.scoring.fast`), the transition-DAG builder
(:mod:`rpeg.ir.emu.flat`) and the transition scheduler (:mod:`rpeg.heuristics.transition`).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable

__all__ = ["WarmUp", "lock_path", "quiet_llvmlite_wrapper"]


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
        A module-level function, so that :meth:`hand_off` can run it in another process
        (a nested function or lambda is run only here).
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
        qualname = getattr(run, "__qualname__", "<none>")
        module = getattr(run, "__module__", None)
        #: ``module:function`` of ``run`` when another process can import it, else ``None``.
        self.target = f"{module}:{qualname}" if module and "<" not in qualname else None

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
                self._thread = threading.Thread(target=self._load, name=self.name, daemon=True)
                self._thread.start()
                atexit.register(self.hand_off)
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

    def hand_off(self) -> subprocess.Popen | None:
        """At exit (registered by :meth:`start`): if the thread is still running, start a
        detached process that runs ``run`` to its end, so that the compile this process leaves
        behind still fills the cache; the process exits at once when another one holds this
        warm-up's lock (:func:`lock_path`).

        Returns
        -------
        subprocess.Popen or None
            The detached process, or ``None`` when the thread has finished (or never started)
            or ``run`` cannot be imported by another process.
        """
        if self._thread is None or not self._thread.is_alive() or self.target is None:
            return None
        try:
            return subprocess.Popen(
                [sys.executable, "-c", _FINISH, self.target, lock_path(self.target)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # outlives this process and its signals
                close_fds=True,
            )
        except OSError:  # no process to spare: the next process compiles again
            return None


def lock_path(target: str) -> str:
    """The lock file of the detached warm-ups of ``target``: one per warm-up, interpreter and
    numba cache directory (``NUMBA_CACHE_DIR``), in the system's temporary directory.

    Parameters
    ----------
    target
        ``module:function`` of the warm-up (:attr:`WarmUp.target`).
    """
    key = "\0".join([target, sys.executable, os.environ.get("NUMBA_CACHE_DIR", "")])
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"rpeg-warmup-{digest}.lock")


#: The detached warm-up (:meth:`WarmUp.hand_off`): take the lock or leave at once, before any
#: heavy import; then import ``module`` and call ``function``. argv: target, lock path.
_FINISH = """
import sys
target, lock = sys.argv[1], sys.argv[2]
try:
    import fcntl
except ImportError:
    fcntl = None
f = open(lock, "a")
if fcntl is not None:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        sys.exit(0)
import importlib
module, _, name = target.partition(":")
fn = importlib.import_module(module)
for part in name.split("."):
    fn = getattr(fn, part)
fn()
"""


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

"""Evaluating proposals on local worker processes (``workers=N``).

Each worker process builds its own evaluators once (one per structural candidate) and then
evaluates the plans it is sent; it keeps no search state, so results do not depend on how
proposals are spread over the workers, nor on whether a batch was evaluated in this process.

**Start-up counts against the time limit.** Spawned workers import Python, NumPy and rpeg and
build their evaluators before they take any work: a second or two on an idle machine, ten on a
loaded one. :class:`ProcessEvaluator` therefore starts them in the background and evaluates in
this process until every worker has answered, so a search never waits for its pool; one that
ends first (its time limit passed) stops the workers still starting, and
:attr:`ProcessEvaluator.ready_after` says whether and when they were up.

**A script without a main guard.** ``spawn`` re-imports the main script in each worker; a
script that calls ``solve(..., workers=2)`` at its top level, outside
``if __name__ == "__main__":``, would call it again in every worker, each of which would try
to start workers of its own (a cascade of tracebacks, then ``BrokenProcessPool``).
:func:`unguarded_main_call` tells this before any worker starts, so the caller can refuse with
one clear message; as a second line, a solve() called while one of these workers is still
re-importing the script (:func:`in_worker_bootstrap`) ends that worker quietly with
:data:`EXIT_UNGUARDED`, which :class:`ProcessEvaluator` turns into the same message.
"""

from __future__ import annotations

import ast
import multiprocessing as mp
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.context import SpawnContext, SpawnProcess
from pathlib import Path
from typing import Any

from ...ir.cluster import Cluster
from ...ir.plan import Plan
from ...ir.templates import Structure
from ...ir.workload import Workload
from ...scoring.evaluator import Evaluator
from .anneal import Raw, evaluate_raw

__all__ = [
    "EXIT_UNGUARDED",
    "WORKER_NAME",
    "ProcessEvaluator",
    "UnguardedMainError",
    "in_worker_bootstrap",
    "unguarded_main_call",
]

#: Name prefix of the worker processes (set before a spawned worker re-imports the main script).
WORKER_NAME = "rpeg-search-worker"
#: Exit status of a worker that found itself re-running the caller's unguarded script.
EXIT_UNGUARDED = 86


class UnguardedMainError(RuntimeError):
    """Worker processes cannot start: the main script calls ``solve(..., workers=N)`` at its
    top level, outside ``if __name__ == "__main__":`` (the message says what to do)."""

    def __init__(self, workers: int, script: str | None) -> None:
        where = f"script {script!r}" if script else "the main script"
        super().__init__(
            f"workers={workers} needs worker processes, which are started with 'spawn': each imports "
            f"{where} again, and that calls solve() again at its top level. Put the code that calls "
            f'solve() under `if __name__ == "__main__":` (or use workers=1).'
        )


def _main_script() -> tuple[dict[str, Any], str] | None:
    """The main module's namespace and source file when ``spawn`` re-imports it in a child
    (``None`` for an interactive session, ``python -c`` or a frozen program)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path or getattr(sys, "frozen", False):
        return None
    return vars(main), str(path)


def unguarded_main_call() -> str | None:
    """The main script's path when the current call comes from its top-level code outside any
    ``if`` that tests ``__name__`` (``spawn`` would run that code again in every worker), else
    ``None`` (also when the script cannot be read or parsed: then nothing is known)."""
    found = _main_script()
    if found is None:
        return None
    namespace, path = found
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is namespace and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:  # not called from the script's top level (a function it calls later, a thread)
        return None
    line = frame.f_lineno
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.If)
            and node.lineno <= line <= (node.end_lineno or node.lineno)
            and any(isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(node.test))
        ):
            return None
    return path


def in_worker_bootstrap() -> bool:
    """Whether this process is one of :class:`ProcessEvaluator`'s workers still importing the
    main script (the only moment a worker runs the caller's code)."""
    process = mp.current_process()
    return bool(getattr(process, "_inheriting", False)) and process.name.startswith(WORKER_NAME)


class _WorkerProcess(SpawnProcess):
    """A spawned worker named :data:`WORKER_NAME`-N (the name reaches the child before it
    re-imports the main script)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.name = WORKER_NAME + self.name.removeprefix(type(self).__name__)


class _WorkerContext(SpawnContext):
    """The ``spawn`` context, with named workers it keeps (for their exit codes and to stop
    them)."""

    def __init__(self) -> None:
        super().__init__()
        self.processes: list[_WorkerProcess] = []

    def Process(self, *args: Any, **kwargs: Any) -> _WorkerProcess:  # noqa: N802 - multiprocessing's name
        process = _WorkerProcess(*args, **kwargs)
        self.processes.append(process)
        return process


def _ready() -> None:
    """The first task of each worker: answered once its evaluators are built."""


_EVALUATORS: list[Evaluator] = []


def _init(
    workload: Workload, cluster: Cluster, structures: Sequence[Structure], k_eval: int, split_phases: bool
) -> None:
    global _EVALUATORS
    _EVALUATORS = [
        Evaluator(workload, cluster, y, k_eval=k_eval, split_phases=split_phases) for y in structures
    ]


def _evaluate(item: tuple[int, Plan]) -> Raw:
    si, plan = item
    return evaluate_raw(_EVALUATORS[si], plan)


class ProcessEvaluator:
    """``evaluate_many`` for :class:`~rpeg.heuristics.search.anneal.Anneal` on ``workers``
    processes (started with ``spawn``, so it is safe under threads and on every platform).

    The workers start in the background; until all of them are up, batches are evaluated in
    this process by ``local`` (module docstring). Use as a context manager, or call
    :meth:`close`.

    Parameters
    ----------
    workload, cluster, structures, k_eval, split_phases
        What each worker builds its evaluators from (structure ``i`` of a batch item is
        ``structures[i]``).
    workers
        Worker processes.
    local
        Evaluates a batch in this process while the workers start (default: evaluators built
        here on first use).

    Raises
    ------
    ValueError
        If ``workers`` is not a positive integer.
    UnguardedMainError
        From a call, when a worker found itself re-running the caller's unguarded script.
    RuntimeError
        From a call, when a worker died otherwise (its exit code is named).
    """

    def __init__(
        self,
        workload: Workload,
        cluster: Cluster,
        structures: Sequence[Structure],
        *,
        k_eval: int,
        split_phases: bool,
        workers: int,
        local: Callable[[list[tuple[int, Plan]]], list[Raw]] | None = None,
    ) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a positive integer, got {workers!r}")
        self.workers = workers
        self.started = time.monotonic()
        #: seconds from the start until every worker answered (``None``: not yet, or never)
        self.ready_after: float | None = None
        self._args = (workload, cluster, tuple(structures), k_eval, split_phases)
        self._local = local
        self._here: list[Evaluator] = []  # the default ``local``'s evaluators, built on first use
        self._closed = False
        self._context = _WorkerContext()
        self.pool = ProcessPoolExecutor(
            max_workers=workers, mp_context=self._context, initializer=_init, initargs=self._args
        )
        self._pending: list[Future] = []
        try:
            # one task per worker: each submission starts a worker, and its answer means "built"
            self._pending = [self.pool.submit(_ready) for _ in range(workers)]
        except (BrokenProcessPool, OSError) as exc:  # a worker died while it was being started
            self._fail(exc)

    def _is_ready(self) -> bool:
        """Whether every worker has answered (raises if one of them died)."""
        if self.ready_after is not None:
            return True
        if not all(f.done() for f in self._pending):
            return False
        for f in self._pending:
            if f.exception() is not None:
                self._fail(f.exception())
        self.ready_after = time.monotonic() - self.started
        return True

    def _fail(self, exc: BaseException) -> None:
        """Raise the error a dead worker means (after stopping the others; :meth:`close` then
        has nothing left to do)."""
        self._closed = True
        self._stop()
        codes = [p.exitcode for p in self._context.processes]
        if EXIT_UNGUARDED in codes:
            main = _main_script()
            raise UnguardedMainError(self.workers, main[1] if main else None) from None
        raise RuntimeError(
            f"a worker process of workers={self.workers} died (exit codes {codes}); use workers=1 to "
            "search in this process only"
        ) from exc

    def __call__(self, items: list[tuple[int, Plan]]) -> list[Raw]:
        if not self._is_ready():
            return self._evaluate_here(items)
        chunk = max(1, -(-len(items) // self.workers))
        try:
            return list(self.pool.map(_evaluate, items, chunksize=chunk))
        except BrokenProcessPool as exc:
            self._fail(exc)
            raise  # pragma: no cover - _fail raises

    def _evaluate_here(self, items: list[tuple[int, Plan]]) -> list[Raw]:
        if self._local is not None:
            return self._local(items)
        if not self._here:
            workload, cluster, structures, k_eval, split_phases = self._args
            self._here = [
                Evaluator(workload, cluster, y, k_eval=k_eval, split_phases=split_phases) for y in structures
            ]
        return [evaluate_raw(self._here[si], plan) for si, plan in items]

    def _stop(self) -> None:
        """Stop the workers at once (those still starting hold nothing of value)."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        for p in self._context.processes:
            if p.is_alive():
                p.terminate()
        for p in self._context.processes:
            p.join(1.0)

    def close(self) -> None:
        """Stop the worker processes: a clean shutdown when they are up, else at once.

        Raises
        ------
        UnguardedMainError
            When a worker found itself re-running the caller's unguarded script (the search
            may have ended in this process first; the script still needs the guard).
        """
        if self._closed:
            return
        self._closed = True
        try:
            ready = self._is_ready()
        except UnguardedMainError:
            raise
        except RuntimeError:  # a worker died otherwise: the search did without the pool
            ready = False
        if ready:
            self.pool.shutdown(wait=True, cancel_futures=True)
        else:
            self._stop()

    def __enter__(self) -> ProcessEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Waiting for workers by progress, not by deadline (the runtime's only way of waiting on Ray).

A fixed deadline (``ray.get(ref, timeout=N)``) fails a healthy run on a slow or loaded machine
and still waits ``N`` seconds for a dead one. The runtime waits instead with :class:`Watchdog`:

* every wait is a loop of ``ray.wait(..., timeout=poll_s)``; a result that arrives ends it at once;
* a worker whose result is pending is **dead** when Ray reports its actor dead (the result then
  holds a ``RayActorError``; the GCS actor table says ``DEAD``) or its process is gone (checked
  with ``psutil`` for workers on this host) — reported at once, naming the worker and its device;
* it is **progressing** when some awaited result arrives or, for a worker on this host, its
  process used CPU in the last poll (at least :data:`BUSY_FRACTION` of the poll's wall time; an
  idle Ray worker uses about 0.25 %); a worker on another host counts as progressing only
  through arriving results;
* the wait gives up only after ``stall_s`` seconds without any progress (default
  :data:`DEFAULT_STALL_S`, ``run(..., stall_timeout_s=...)``, CLI ``--stall-timeout``): the
  workers are then alive but stuck (a deadlock), and the :class:`RunError` says so.

:class:`RunError` (re-exported by :mod:`rpeg.runtime.driver.controller`) is the runtime's one failure
type: a worker raised, died or stalled. Its message names the node, the step, the worker and
the device when they are known, and it carries them as attributes.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..config import DEFAULT_STALL_S

__all__ = [
    "BUSY_FRACTION",
    "DEFAULT_STALL_S",
    "POLL_S",
    "Owner",
    "RunError",
    "RunInterrupted",
    "Watchdog",
    "cause",
    "interrupt_on_sigterm",
]

#: Seconds between liveness checks while nothing arrives.
POLL_S = 1.0
#: Share of a poll's wall time a local worker process must spend on CPU to count as progressing.
BUSY_FRACTION = 0.02


class RunError(RuntimeError):
    """A worker raised, died or stalled; the run stopped.

    Parameters
    ----------
    message
        One line naming what failed: node, step, worker and device when known.
    node, step, vertex, worker, device
        What failed, when known (``device`` is the plan's device id).
    lost
        ``True`` when the worker's process is gone (a lost device) rather than raised.

    Attributes
    ----------
    trace, trace_path
        Set by :func:`rpeg.run` when the run stops: the trace up to the failure (status
        ``"failed"``) and the file it was written to (``None`` without ``trace_path``).
    """

    def __init__(
        self,
        message: str,
        *,
        node: int | None = None,
        step: int | None = None,
        vertex: str | None = None,
        worker: str | None = None,
        device: int | None = None,
        lost: bool = False,
    ) -> None:
        super().__init__(" ".join(str(message).split()))  # always one line
        self.node, self.step, self.vertex = node, step, vertex
        self.worker, self.device, self.lost = worker, device, lost
        self.trace: Any = None
        self.trace_path: str | None = None


class RunInterrupted(KeyboardInterrupt):
    """The run was stopped by a signal (SIGINT: Ctrl-C; SIGTERM: ``timeout``, Slurm, Kubernetes):
    its workers were stopped and the trace up to that point written (status ``"interrupted"``).

    A :class:`KeyboardInterrupt`, so that code which stops on Ctrl-C stops on it too.

    Parameters
    ----------
    signum
        The signal's number (``signal.SIGINT`` or ``signal.SIGTERM``).

    Attributes
    ----------
    signal_name
        ``"SIGINT"`` or ``"SIGTERM"``.
    exit_status
        ``128 + signum``, the status a shell reports for a process that signal ended: 130 for
        SIGINT, 143 for SIGTERM.
    step
        The first step not completed when the signal came (``None`` before any segment started).
    trace, trace_path
        The trace up to the interruption and the file it was written to (``None`` without
        ``trace_path``), set by :func:`rpeg.run`.
    """

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        self.signal_name = signal.Signals(self.signum).name
        self.exit_status = 128 + self.signum
        self.step: int | None = None
        self.trace: Any = None
        self.trace_path: str | None = None
        super().__init__(f"interrupted by {self.signal_name}")


@contextlib.contextmanager
def interrupt_on_sigterm() -> Iterator[Callable[[], None]]:
    """Inside the block, SIGTERM raises :class:`RunInterrupted` in the main thread, as SIGINT
    raises ``KeyboardInterrupt``; the handler found on entry is restored on exit. Outside the main
    thread (where Python cannot install handlers) the block changes nothing.

    Yields a function that installs the handler again: call it after ``ray.init``, which
    installs a SIGTERM handler of its own in the driver (one that exits at once, leaving no
    trace).
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return

    def stop(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the stop is under way
        raise RunInterrupted(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield lambda: signal.signal(signal.SIGTERM, stop)
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class Owner:
    """The worker a pending result belongs to.

    Attributes
    ----------
    worker
        Worker id ``"g{group}/r{rank}"``.
    device
        The plan's device id the worker runs on.
    actor
        Its Ray actor handle.
    gid, rank
        Its group and rank (``-1`` when it belongs to none).
    pid, host
        Its process and host, once it answered (see :meth:`Watchdog.register`).
    turns
        Concurrent calls made to it so far (:func:`~rpeg.runtime.driver.group.call_worker`
        numbers them; its process serves them in that order).
    """

    worker: str
    device: int
    actor: Any
    gid: int = -1
    rank: int = -1
    pid: int | None = None
    host: str | None = None
    turns: int = 0
    _proc: Any = field(default=None, repr=False)
    _cpu: float | None = field(default=None, repr=False)

    def label(self) -> str:
        """``"worker g1/r0 (device 2)"``."""
        return f"worker {self.worker} (device {self.device})"


def cause(exc: BaseException) -> str:
    """One line saying why a Ray call failed: a lost process, or the worker's own exception."""
    import ray

    if isinstance(exc, ray.exceptions.RayActorError):
        return "worker process lost (Ray reports its actor dead)"
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error" in line:
            return line
    return lines[-1] if lines else type(exc).__name__


class Watchdog:
    """Progress-checked waiting on Ray results (module docstring).

    Parameters
    ----------
    stall_s
        Seconds without progress after which a wait gives up.
    poll_s
        Seconds between liveness checks while nothing arrives.
    """

    def __init__(self, stall_s: float = DEFAULT_STALL_S, poll_s: float = POLL_S) -> None:
        self.stall_s = float(stall_s)
        self.poll_s = float(poll_s)
        self.host = socket.gethostname()

    # ------------------------------------------------------------------ liveness
    def register(self, owner: Owner, pid: int | None, host: str | None) -> None:
        """Remember ``owner``'s process (from its first answer) for the CPU and process checks."""
        owner.pid, owner.host = pid, host
        if pid is not None and host == self.host:
            with contextlib.suppress(Exception):
                import psutil

                owner._proc = psutil.Process(pid)
                owner._cpu = _cpu_seconds(owner._proc)

    def dead(self, owner: Owner) -> str | None:
        """Why ``owner`` is dead, or ``None`` if it is (as far as can be seen) alive."""
        proc = owner._proc
        if proc is not None:
            try:
                import psutil

                if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                    return f"its process {owner.pid} is gone"
            except Exception:  # NoSuchProcess, AccessDenied
                return f"its process {owner.pid} is gone"
            return None  # a live local process: no need to ask the GCS
        try:
            from ray._private import state

            info = state.actors(actor_id=owner.actor._actor_id.hex())
            if isinstance(info, dict) and info.get("State") == "DEAD":
                return "Ray reports its actor dead"
        except Exception:  # the GCS table is best effort; the process check and Ray's errors remain
            pass
        return None

    def busy(self, owners: Iterable[Owner], elapsed: float) -> bool:
        """Whether some local ``owner`` process used CPU in the last ``elapsed`` seconds (and
        update the readings)."""
        active = False
        for o in owners:
            if o._proc is None:
                continue
            try:
                now = _cpu_seconds(o._proc)
            except Exception:
                continue
            if o._cpu is not None and now - o._cpu >= BUSY_FRACTION * max(elapsed, 1e-3):
                active = True
            o._cpu = now
        return active

    # ------------------------------------------------------------------ waiting
    def wait_any(
        self, refs: list[Any], owner_of: Callable[[Any], Owner], what: Callable[[], str]
    ) -> tuple[list[Any], list[Any]]:
        """Wait until some of ``refs`` is ready or belongs to a dead worker.

        Returns
        -------
        tuple[list, list]
            ``(ready, dead)``: refs whose result arrived, and refs whose worker is dead though
            Ray has not failed them yet.

        Raises
        ------
        RunError
            After ``stall_s`` seconds in which nothing arrived and no worker progressed;
            ``what()`` says what was awaited.
        """
        import ray

        quiet = time.monotonic()
        last = quiet
        while True:
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=self.poll_s)
            if ready:
                return ready, []
            owners = {id(o): o for o in (owner_of(r) for r in refs)}
            gone = {k for k, o in owners.items() if self.dead(o) is not None}
            if gone:
                return [], [r for r in refs if id(owner_of(r)) in gone]
            now = time.monotonic()
            if self.busy(owners.values(), now - last):
                quiet = now
            last = now
            if now - quiet > self.stall_s:
                names = ", ".join(sorted({o.label() for o in owners.values()}))
                raise RunError(
                    f"{what()}: no progress for {self.stall_s:g} s ({names} alive but idle, waiting on "
                    "each other?); raise the stall window with stall_timeout_s / --stall-timeout if the "
                    "machine is this slow"
                )

    def get_all(self, refs: list[Any], owner_of: Callable[[Any], Owner], what: str) -> list[Any]:
        """The results of ``refs`` (in order), waiting by progress.

        Raises
        ------
        RunError
            Naming ``what`` and the worker (and its device) that raised, died or stalled. When a
            worker raises because a peer died (a collective or send to a lost process), the dead
            peer is named instead.
        """
        import ray

        refs = list(refs)
        pending = list(refs)
        out: dict[int, Any] = {}
        index = {r: i for i, r in enumerate(refs)}
        while pending:
            ready, dead = self.wait_any(pending, owner_of, lambda: what)
            for r in dead:
                o = owner_of(r)
                raise RunError(
                    f"{what} failed on {o.label()}: worker process lost ({self.dead(o)})",
                    worker=o.worker,
                    device=o.device,
                    lost=True,
                )
            for r in ready:
                pending.remove(r)
                try:
                    out[index[r]] = ray.get(r)
                except Exception as exc:
                    o = owner_of(r)
                    lost = isinstance(exc, ray.exceptions.RayActorError)
                    if not lost:  # a peer that died makes its partners raise: name the dead one
                        gone = next((owner_of(p) for p in pending if self.dead(owner_of(p))), None)
                        if gone is not None:
                            raise RunError(
                                f"{what} failed on {gone.label()}: worker process lost ({self.dead(gone)})",
                                worker=gone.worker,
                                device=gone.device,
                                lost=True,
                            ) from exc
                    raise RunError(
                        f"{what} failed on {o.label()}: {cause(exc)}",
                        worker=o.worker,
                        device=o.device,
                        lost=lost,
                    ) from exc
        return [out[i] for i in range(len(refs))]

    def settle(self, refs: list[Any], owner_of: Callable[[Any], Owner]) -> tuple[list[Owner], list[Owner]]:
        """Wait until every one of ``refs`` has a result (value or error) or a dead worker,
        without raising.

        Returns
        -------
        tuple[list[Owner], list[Owner]]
            ``(dead, stuck)``: workers found dead (their result is a ``RayActorError`` or their
            process is gone), and workers still alive whose results did not come within the stall
            window.
        """
        import ray

        pending = list(refs)
        dead: dict[int, Owner] = {}
        while pending:
            try:
                ready, gone = self.wait_any(pending, owner_of, lambda: "settling")
            except RunError:
                stuck = {id(owner_of(r)): owner_of(r) for r in pending}
                return list(dead.values()), [o for k, o in stuck.items() if k not in dead]
            for r in gone:
                dead[id(owner_of(r))] = owner_of(r)
                pending.remove(r)
            for r in ready:
                pending.remove(r)
                try:
                    ray.get(r)
                except ray.exceptions.RayActorError:
                    dead[id(owner_of(r))] = owner_of(r)
                except Exception:  # raised: settled, the worker is alive
                    pass
        return list(dead.values()), []

    def wait_ready(self, refs: list[Any], what: str) -> None:
        """Wait for ``refs`` that belong to no worker (placement groups): give up only after
        ``stall_s`` seconds in which none became ready."""
        import ray

        pending = list(refs)
        quiet = time.monotonic()
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=self.poll_s)
            now = time.monotonic()
            if ready:
                ray.get(ready)
                quiet = now
            elif now - quiet > self.stall_s:
                raise RunError(f"{what}: not ready after {self.stall_s:g} s without progress")


def _cpu_seconds(proc: Any) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)

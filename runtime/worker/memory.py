"""What a worker process holds in memory: its private resident set, glibc's live heap, and the
allocator setting that makes the first the memory its tensors hold (SPEC §11, docs/runtime.md
"Memory per worker").

The trace records, per OP node, the worker's peak private resident set (:class:`PrivatePeak`)
less the footprint it had before its model was built; :mod:`~rpeg.runtime.trace.fidelity`
compares those peaks with the cost model's. Several workers share a process (one per device,
every role placed on it): :class:`WorkerMemory` gives each its own figure, what the process would
hold for it alone. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from typing import Any

__all__ = [
    "EXACT_HEAP_THRESHOLD",
    "PrivatePeak",
    "WorkerMemory",
    "heap_live_bytes",
    "map_large_blocks",
    "peak_resident_bytes",
    "private_bytes",
    "release_freed_memory",
    "resident_bytes",
]


def resident_bytes() -> int:
    """This process's resident set now, bytes (``/proc/self/statm``; 0 where there is none)."""
    import os

    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def private_bytes() -> int:
    """This process's private resident memory now, bytes: ``/proc/self/statm``'s resident pages
    less its shared ones (file-backed pages — libraries paged in — and shared memory such as the
    Ray object store's mapped objects, which the node's object store owns); 0 where there is no
    ``/proc``."""
    import os

    try:
        with open("/proc/self/statm") as f:
            fields = f.read().split()
        return max(0, int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _libc() -> Any:
    """The C library when it is glibc (it has ``malloc_trim`` and ``mallopt``), else ``None``."""
    import ctypes
    import ctypes.util

    global _LIBC
    if _LIBC is None:
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name) if name else None
        except OSError:
            lib = None
        glibc = lib is not None and hasattr(lib, "malloc_trim") and hasattr(lib, "mallopt")
        _LIBC = lib if glibc else False
    return _LIBC or None


_LIBC: Any = None


class _Mallinfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (glibc ≥ 2.33): ten ``size_t`` counters."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_live_bytes() -> int:
    """Bytes of this process's C heap in use now: glibc's ``mallinfo2()``, ``uordblks + hblkhd``
    (chunks allocated in every arena, plus blocks served by ``mmap``); 0 where the C library has
    no ``mallinfo2`` (not glibc, or glibc older than 2.33).

    The CPU analogue of ``torch.cuda.memory_allocated()``: the tensors alive (torch's CPU
    allocator is ``malloc``) and the interpreter's objects, without what glibc keeps of freed
    chunks. :func:`private_bytes` counts those too — the analogue of the CUDA caching allocator's
    reserved memory — and after a large transient is freed it can stay far above this figure
    (glibc returns the top of a heap only, and raises its mmap threshold after each large free).
    """
    lib = _libc()
    fn = getattr(lib, "mallinfo2", None) if lib is not None else None
    if fn is None:
        return 0
    fn.restype = _Mallinfo2
    info = fn()
    return int(info.uordblks + info.hblkhd)


def release_freed_memory() -> bool:
    """Hand the C heap's free pages back to the kernel (glibc's ``malloc_trim(0)``); ``False``
    where there is no glibc.

    A freed tensor below glibc's mmap threshold stays in the heap, resident, and the threshold
    rises to the size of each large block freed (up to 32 MiB): after a worker gathers and drops a
    model-sized state (the engine start, a weight push) its resident set keeps that model's size,
    and the next transient (a received publication) lands on top (measured on a generation TP-2
    worker: 84 MiB kept after the engine start's gather, then 90 MiB received). The runtime calls
    this where a model-sized transient has just been freed; compute-time allocations are left
    alone. A CPU worker, which pins the threshold at 128 KiB (:func:`map_large_blocks`), has
    little left to trim; a GPU worker keeps glibc's adaptive threshold for its host memory.
    """
    lib = _libc()
    if lib is None:
        return False
    lib.malloc_trim(0)
    return True


#: glibc's ``mallopt`` parameter number of the mmap threshold (``M_MMAP_THRESHOLD``).
_M_MMAP_THRESHOLD = -3

#: The mmap threshold a CPU worker pins (:func:`map_large_blocks`): glibc's own starting value
#: (``DEFAULT_MMAP_THRESHOLD_MIN``, 128 KiB), which glibc otherwise raises after each large free,
#: up to 32 MiB.
EXACT_HEAP_THRESHOLD = 128 << 10


def map_large_blocks(threshold: int = EXACT_HEAP_THRESHOLD) -> bool:
    """Serve this process's allocations of ``threshold`` bytes and more by ``mmap`` from now on,
    so that freeing one returns its pages at once (glibc's ``mallopt(M_MMAP_THRESHOLD)``, which
    also stops glibc raising the threshold after large frees); ``False`` where there is no glibc.

    Every CPU worker pins the threshold at :data:`EXACT_HEAP_THRESHOLD`, so that its private
    memory is the memory its tensors hold, the quantity the cost model predicts. Under glibc's
    adaptive threshold a freed tensor below 32 MiB stays in the heap, resident, and the next
    layer's differently sized tensors do not fit the holes: measured on the fidelity benchmark's
    FSDP2 plan (2026-12-05, four runs of 3 steps), the ZeRO-3 workers' private peaks were
    1.9–3.8× their live tensors (206–321 MiB against 85 for a frozen copy, 599–763 against
    316–322 for a trainer) and 0.97–1.02× with the threshold pinned. The price is a page fault
    per fresh mapping: the same plan's step took 20.8 s against 15.5–18.5 s (a ZeRO-3 layer's
    gather is allocated and freed at every layer of every pass), the colocated plan's 11.4 s
    against 11.2–11.4 s (docs/runtime.md, "Memory per worker").

    Raises
    ------
    ValueError
        If ``threshold`` is not a positive integer.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise ValueError(f"map_large_blocks: threshold must be a positive integer, got {threshold!r}")
    lib = _libc()
    return lib is not None and bool(lib.mallopt(_M_MMAP_THRESHOLD, threshold))


class PrivatePeak:
    """The peaks of :func:`private_bytes` and :func:`heap_live_bytes` while it samples: a daemon
    thread samples both every ``interval_s`` seconds (the kernel keeps a peak of the whole
    resident set only, ``VmHWM``, which counts shared pages too, and glibc keeps no peak at all).
    :meth:`peak` and :meth:`live_peak` also sample once more.

    Sampling costs CPU: about 5.5% of a core at 5 ms on this machine, which a run with a dozen
    worker processes on two cores cannot spare while most of them wait. So the thread samples
    only between :meth:`resume` and :meth:`pause`: a process samples while one of its workers
    serves a call (:class:`WorkerMemory`), the only time its memory changes, and sleeps between
    calls.

    Parameters
    ----------
    interval_s
        Seconds between samples (default 5 ms: a 50 MB allocation on this runtime lives longer).
    active
        Whether the thread samples from the start (default ``True``).

    Raises
    ------
    ValueError
        If ``interval_s`` is not positive.
    """

    def __init__(self, interval_s: float = 0.005, active: bool = True) -> None:
        import threading

        if not interval_s > 0:
            raise ValueError(f"PrivatePeak: interval_s must be positive, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self._peak = private_bytes()
        self._live = heap_live_bytes()
        self.samples = 0  # how many samples the thread, resume() and pause() have taken
        self.unsettled: WorkerMemory | None = None  # the last counted call, ended, not settled
        self._stop = threading.Event()
        self._active = threading.Event()
        if active:
            self._active.set()
        self._thread = threading.Thread(target=self._run, name="rpeg-private-peak", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._active.is_set():
                self._active.wait()  # set again by resume() or stop()
                continue
            if self._stop.wait(self.interval_s):
                break
            if self._active.is_set():  # not paused meanwhile
                self._sample()

    def _sample(self) -> None:
        self.samples += 1
        self._peak = max(self._peak, private_bytes())
        self._live = max(self._live, heap_live_bytes())

    @property
    def active(self) -> bool:
        """Whether the thread samples now."""
        return self._active.is_set() and not self._stop.is_set()

    def resume(self) -> None:
        """Sample again (one sample now, then every ``interval_s``)."""
        self._sample()
        self._active.set()

    def pause(self) -> None:
        """Stop sampling until :meth:`resume`, after one last sample (the peaks are kept)."""
        self._active.clear()
        self._sample()

    def restart(self) -> tuple[int, int]:
        """Forget the peaks: start them again from the private resident set and live heap now,
        which are returned ``(private, live)``."""
        self._peak, self._live = private_bytes(), heap_live_bytes()
        return self._peak, self._live

    def peak(self) -> int:
        """The largest private resident set sampled so far, bytes (this call samples too)."""
        self._peak = max(self._peak, private_bytes())
        return self._peak

    def live_peak(self) -> int:
        """The largest live C heap (:func:`heap_live_bytes`) sampled so far, bytes (this call
        samples too)."""
        self._live = max(self._live, heap_live_bytes())
        return self._live

    def stop(self) -> None:
        """End the sampling thread (idempotent)."""
        self._stop.set()
        self._active.set()  # wake a paused thread so that it sees the stop
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)


class WorkerMemory:
    """One worker's share of its process's private memory, where several workers share the
    process (one process per device holds every role placed on it).

    The worker *holds* ``H`` bytes between its calls: what its construction left (the private
    resident set after it less the footprint before its model, ``rss_base``) plus, for each of its
    calls since, the private set once the call is over less the one before it. While a call runs,
    the worker's figure is ``H + (peak of the call − private set before the call)``, and
    :meth:`peak` the largest such figure so far: what a process of its own would report as its
    peak less its footprint before the model, as long as the other workers' memory does not
    change during the call — true of OP nodes and transfers, which one process serves one at a
    time. The same arithmetic over glibc's live heap gives :meth:`live_peak`.

    *Once the call is over* is when the process's next counted call begins (any worker's): a
    call's return value — a weight publication, a node's containers — is alive when the method
    returns and freed only after Ray has put it in the object store; measured at the return, it
    would stay in ``H`` for good (seen: a trainer's figure grew by its publication's size every
    step). :meth:`end` leaves the call open in the sampler and the next :meth:`begin` settles it.

    A transition's calls run concurrently (several workers of a process exchange cells at once)
    and are not counted (:meth:`counting` is not entered): the cells they build are handed to the
    new plan's workers and dropped.

    Parameters
    ----------
    sampler
        The process's :class:`PrivatePeak` (paused between calls), shared by its workers.
    """

    def __init__(self, sampler: PrivatePeak) -> None:
        self.sampler = sampler
        self.held = 0
        self.held_live = 0
        self._peak = 0
        self._live = 0
        self._before: tuple[int, int] | None = None  # the call in progress
        self._closing: tuple[int, int] | None = None  # the call ended, not settled

    def begin(self) -> None:
        """Start counting a call (or the worker's construction): settle the process's last
        ended call (:meth:`settle`), restart the sampler's peaks."""
        if self.sampler.unsettled is not None:
            self.sampler.unsettled.settle()
        self._before = self.sampler.restart()
        self.sampler.resume()

    def end(self) -> None:
        """End the call: fold its peak into :meth:`peak`, pause the sampler; what the call left
        is added to ``H`` when the process's next counted call begins (:meth:`settle`)."""
        if self._before is None:
            return
        self.peak()
        self.live_peak()
        self._closing, self._before = self._before, None
        self.sampler.unsettled = self
        self.sampler.pause()

    def settle(self) -> None:
        """Add what the ended call left to ``H``: the private set (and live heap) now less before
        the call. Idempotent."""
        if self._closing is not None:
            before, before_live = self._closing
            self.held += private_bytes() - before
            self.held_live += heap_live_bytes() - before_live
            self._closing = None
        if self.sampler.unsettled is self:
            self.sampler.unsettled = None

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """Count the ``with`` block as one of the worker's calls (:meth:`begin`, :meth:`end`)."""
        self.begin()
        try:
            yield
        finally:
            self.end()

    def peak(self) -> int:
        """The worker's largest figure so far, bytes: ``max`` over its calls of ``H + peak of the
        call − private set before it`` (the call in progress included)."""
        if self._before is not None:
            self._peak = max(self._peak, self.held + self.sampler.peak() - self._before[0])
        return self._peak

    def live_peak(self) -> int:
        """:meth:`peak` over glibc's live heap (:func:`heap_live_bytes`), bytes."""
        if self._before is not None:
            self._live = max(self._live, self.held_live + self.sampler.live_peak() - self._before[1])
        return self._live


def peak_resident_bytes() -> int:
    """This process's peak resident set so far, bytes: ``getrusage``'s ``ru_maxrss`` (KiB on
    Linux), or the resident set now where the kernel has not updated the peak yet."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max(int(peak) if sys.platform == "darwin" else int(peak) * 1024, resident_bytes())

"""Wall-clock deadlines shared by every method: one instant, computed once, passed down.

A method turns its ``time_limit`` into a :class:`Deadline` when it starts (``time.monotonic``);
everything it calls — warm start, model building, the transfer to the solver, the solve — asks
the same deadline how much time is left, so model building counts against the limit and a
solver is given only what remains. Model builders call :meth:`Deadline.check` between (and,
for large blocks, inside) constraint blocks; past the deadline it raises :class:`BuildTimeout`,
which the engine's front door catches to return its fallback (the warm-start plan, or the list
schedule of a project) with status ``time_limit`` and a message saying the model was too large
to build in time.

While a model is built, :func:`heap_frozen` keeps the caller's objects out of Python's garbage
collector: a model adds hundreds of thousands of long-lived objects, which set off full
collections, and a full collection scans every tracked object of the process and cannot be
interrupted. With five million objects of the caller's alive, one such collection in the middle
of a ``milp`` build took 0.7 s; with them frozen, a collection scans only the model.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Iterator

__all__ = ["BuildTimeout", "Deadline", "heap_frozen"]


@contextlib.contextmanager
def heap_frozen() -> Iterator[None]:
    """Keep the objects that exist on entry out of the garbage collector's scans for the block
    (``gc.freeze``) and hand them back on exit (``gc.unfreeze``): the collections the block sets
    off scan the model being built, not the caller's heap.

    When the process already froze objects (its own ``gc.freeze``, or an enclosing block), the
    block leaves the collector as it is: ``gc.unfreeze`` would hand those back too."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class BuildTimeout(Exception):
    """Model building (or its transfer to a solver) passed the deadline.

    Internal to the engines: their front doors catch it and return a fallback. ``str()`` gives
    the message for the user, ``"model too large to build in N s"``.

    Parameters
    ----------
    seconds
        The time that was available for building.
    stage
        What was being built when the deadline passed (for the message).
    """

    def __init__(self, seconds: float, stage: str = "") -> None:
        self.seconds = seconds
        self.stage = stage
        where = f" (stopped while {stage})" if stage else ""
        super().__init__(f"model too large to build in {seconds:.3g} s{where}")


class Deadline:
    """An instant on the ``time.monotonic`` clock (or none: unlimited).

    Parameters
    ----------
    seconds
        Seconds from ``start`` (``None``: no deadline).
    start
        A ``time.monotonic()`` reading (default: now).

    Raises
    ------
    ValueError
        If ``seconds`` is negative or not a number.
    """

    __slots__ = ("at", "seconds", "start")

    def __init__(self, seconds: float | None = None, *, start: float | None = None) -> None:
        if seconds is not None and not (isinstance(seconds, (int, float)) and seconds >= 0):
            raise ValueError(f"a deadline needs non-negative seconds or None, got {seconds!r}")
        self.start = time.monotonic() if start is None else float(start)
        self.seconds = None if seconds is None else float(seconds)
        self.at = math.inf if seconds is None else self.start + float(seconds)

    @classmethod
    def of(cls, time_limit: float | Deadline | None) -> Deadline:
        """``time_limit`` as a deadline starting now (a :class:`Deadline` is returned as is)."""
        return time_limit if isinstance(time_limit, Deadline) else cls(time_limit)

    @property
    def unlimited(self) -> bool:
        """Whether there is no deadline."""
        return self.seconds is None

    def elapsed(self) -> float:
        """Seconds since ``start``."""
        return time.monotonic() - self.start

    def remaining(self) -> float:
        """Seconds left (``inf`` without a deadline, never negative)."""
        return max(0.0, self.at - time.monotonic())

    def expired(self) -> bool:
        """Whether the deadline has passed."""
        return time.monotonic() >= self.at

    def limit(self, floor: float = 0.0) -> float | None:
        """The time left as an engine time-limit parameter: ``None`` without a deadline, else
        ``max(floor, remaining())``."""
        return None if self.unlimited else max(floor, self.remaining())

    def within(self, seconds: float | None) -> Deadline:
        """A deadline ``seconds`` from now, but never after this one (``None``: this one's
        instant)."""
        now = time.monotonic()
        at = self.at if seconds is None else min(self.at, now + max(0.0, seconds))
        sub = Deadline(start=now)
        sub.seconds = None if math.isinf(at) else at - now
        sub.at = at
        return sub

    def check(self, stage: str = "") -> None:
        """Raise :class:`BuildTimeout` if the deadline has passed.

        Parameters
        ----------
        stage
            What is being built, for the message.

        Raises
        ------
        BuildTimeout
            Past the deadline.
        """
        if time.monotonic() >= self.at:
            raise BuildTimeout(self.seconds if self.seconds is not None else self.elapsed(), stage)

    def ticker(self, stage: str, every: int = 256) -> Ticker:
        """A cheap counter that calls :meth:`check` once every ``every`` calls (for loops that add
        one constraint at a time)."""
        return Ticker(self, stage, every)

    def __repr__(self) -> str:
        if self.unlimited:
            return "Deadline(None)"
        return f"Deadline({self.seconds:g} s, {self.remaining():.3f} s left)"


class Ticker:
    """Counts calls and checks its deadline every ``every`` of them (see :meth:`Deadline.ticker`)."""

    __slots__ = ("deadline", "every", "n", "stage")

    def __init__(self, deadline: Deadline, stage: str, every: int = 256) -> None:
        self.deadline = deadline
        self.stage = stage
        self.every = max(1, int(every))
        self.n = 0

    def __call__(self) -> None:
        """Count one call; every ``every`` calls, :meth:`Deadline.check`."""
        self.n += 1
        if self.n % self.every == 0:
            self.deadline.check(self.stage)

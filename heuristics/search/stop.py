"""Stopping criteria of the search budget: wall-clock seconds or uncached evaluations."""

from __future__ import annotations

import time

__all__ = ["Budget"]


class Budget:
    """A search budget in seconds and/or uncached evaluations, whichever runs out first.

    Parameters
    ----------
    seconds
        Wall-clock limit (``None``: unlimited).
    evaluations
        Limit on uncached plan evaluations (``None``: unlimited).
    start
        A ``time.monotonic()`` reading the seconds count from (default: now). The ``sa`` method
        passes its own start, so that building the search spaces counts against the limit.

    Raises
    ------
    ValueError
        If both are ``None`` or either is not positive.
    """

    def __init__(
        self, seconds: float | None = None, evaluations: int | None = None, *, start: float | None = None
    ) -> None:
        if seconds is None and evaluations is None:
            raise ValueError("a search budget needs time_limit or max_evaluations")
        if seconds is not None and not seconds > 0:
            raise ValueError(f"time_limit must be positive seconds, got {seconds!r}")
        if evaluations is not None and (not isinstance(evaluations, int) or evaluations < 1):
            raise ValueError(f"max_evaluations must be a positive integer, got {evaluations!r}")
        self.seconds = seconds
        self.evaluations = evaluations
        self.start = time.monotonic() if start is None else float(start)
        self.used = 0

    def elapsed(self) -> float:
        """Seconds since the budget started."""
        return time.monotonic() - self.start

    def spend(self, n: int) -> None:
        """Count ``n`` uncached evaluations."""
        self.used += n

    def exhausted(self) -> bool:
        """Whether either limit is reached."""
        if self.evaluations is not None and self.used >= self.evaluations:
            return True
        return self.seconds is not None and self.elapsed() >= self.seconds

    def remaining(self) -> tuple[float | None, int | None]:
        """``(seconds, evaluations)`` left (``None`` for an unlimited dimension)."""
        secs = None if self.seconds is None else self.seconds - self.elapsed()
        evs = None if self.evaluations is None else self.evaluations - self.used
        return secs, evs

    def sub(self, fraction: float, reserve: float = 0.0) -> Budget | None:
        """A sub-budget of ``fraction`` of what remains after holding back ``reserve`` of the
        original budget; ``None`` when nothing is left."""
        secs, evs = self.remaining()
        if secs is not None:
            secs = (secs - reserve * self.seconds) * fraction
            if secs <= 0:
                return None
        if evs is not None:
            evs = int((evs - reserve * self.evaluations) * fraction)
            if evs < 1:
                return None
        return Budget(secs, evs)

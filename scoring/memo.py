"""A process-wide cache of values by key, least recently used out: what the candidate directories
(:func:`~rpeg.scoring.candidates.build_directories`) and the DP frontiers
(:func:`~rpeg.heuristics.dp_planner.build_frontier`) keep between calls."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["KeyedCache"]

V = TypeVar("V")


class KeyedCache(Generic[V]):
    """The last ``size`` values built, by key; thread-safe. A value is built outside the lock, so
    two threads may build one key at once (the later one's is kept; both are equal). Callers
    must not modify what :meth:`get` returns: it is the cached object.

    Parameters
    ----------
    size
        Values kept; ``0`` keeps none.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._values: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], V]) -> V:
        """The value of ``key``, ``build()`` when none is kept (then kept, the least recently
        used one dropped beyond :attr:`size`)."""
        with self._lock:
            hit = self._values.get(key)
            if hit is not None:
                self._values.move_to_end(key)
                return hit
        value = build()
        self.put(key, value)
        return value

    def peek(self, key: Hashable) -> V | None:
        """The value of ``key`` when one is kept (marked recently used), else ``None``."""
        with self._lock:
            hit = self._values.get(key)
            if hit is not None:
                self._values.move_to_end(key)
            return hit

    def put(self, key: Hashable, value: V) -> None:
        """Keep ``value`` for ``key`` (the least recently used one dropped beyond :attr:`size`)."""
        with self._lock:
            self._values[key] = value
            self._values.move_to_end(key)
            while len(self._values) > self.size:
                self._values.popitem(last=False)

    def clear(self) -> None:
        """Forget every value."""
        with self._lock:
            self._values.clear()

    def __len__(self) -> int:
        return len(self._values)

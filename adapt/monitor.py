"""The monitor and its triggers (SPEC §10 "Triggers"; Nereus paper §4.1).

At every safe boundary (an RL-step completion) the :class:`Monitor` reads the GPU pool, the mean
response length of the coming step and the current plan's predicted memory peak, and returns the
triggers that fire:

* *pool* — the number of available devices differs from the last step's; *urgent* when the
  current plan uses a device that is no longer in the pool (the pool of ``n`` devices is the
  first ``n`` flat ids of the full cluster, :func:`~rpeg.ir.cluster.pool_cluster`);
* *memory* — the evaluator's predicted peak of the current plan under the new length exceeds
  ``M_eff``; always urgent;
* *length* — ``|x − x_ref|/x_ref > δ_len`` (``δ_len = 0.30``, strictly greater) for the mean
  response length ``x``; ``x_ref`` is the length at the last replan and is reset at *every*
  replan, admitted or not, so a persistent deviation does not retrigger at every step.

**Horizons** ``H_x`` (:class:`Horizon`): per signal (pool, length), an exponential moving average
``H ← (1 − α_H)·H + α_H·Δ`` (``α_H = 0.5``) of the steps ``Δ`` between successive threshold
crossings, updated at crossings; ``H = 1`` before the first interval is observed. When several
signals trigger at once the smallest ``H_x`` is used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

__all__ = ["DELTA_LEN", "H_ALPHA", "Horizon", "Monitor", "Signal", "Trigger"]

DELTA_LEN = 0.30
H_ALPHA = 0.5


class Signal(str, Enum):
    """What a trigger watched."""

    POOL = "pool"
    MEMORY = "memory"
    LENGTH = "length"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Trigger:
    """One fired trigger: its signal, whether it makes the current plan infeasible, and why."""

    signal: Signal
    urgent: bool
    detail: str


class Horizon:
    """``H_x``: EMA of the steps between threshold crossings of one signal (module docstring).

    Parameters
    ----------
    alpha
        EMA weight ``α_H`` of the newest interval, in ``(0, 1]``.
    """

    def __init__(self, alpha: float = H_ALPHA) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"Horizon.alpha must be in (0, 1], got {alpha!r}")
        self.alpha = alpha
        self.value = 1.0
        self.last: int | None = None
        self.intervals: list[int] = []

    def cross(self, step: int) -> float:
        """Record a crossing at ``step`` and return the updated ``H``: the first interval sets
        ``H = Δ``; later ones ``H ← (1 − α)·H + α·Δ``."""
        if self.last is not None:
            gap = step - self.last
            if gap < 0:
                raise ValueError(f"Horizon.cross: step {step} is before the last crossing {self.last}")
            self.value = (
                float(gap) if not self.intervals else (1 - self.alpha) * self.value + self.alpha * gap
            )
            self.intervals.append(gap)
        self.last = step
        return self.value


class Monitor:
    """Monitor state (Nereus §4.1): pool, length statistics, peak memory, measured step times.

    Parameters
    ----------
    pool
        Devices available at start.
    length
        Mean response length at start (the first reference ``x_ref``).
    delta_len
        Relative drift threshold ``δ_len``.
    ma_alpha
        EMA weight of the length moving average (a statistic for reports).
    """

    def __init__(
        self, pool: int, length: float, *, delta_len: float = DELTA_LEN, ma_alpha: float = 0.5
    ) -> None:
        if not length > 0:
            raise ValueError(f"Monitor.length must be positive, got {length!r}")
        if not delta_len > 0:
            raise ValueError(f"Monitor.delta_len must be positive, got {delta_len!r}")
        self.pool = pool
        self.length = float(length)
        self.reference = float(length)
        self.length_ma = float(length)
        self.ma_alpha = ma_alpha
        self.delta_len = delta_len
        self.lengths: list[float] = [float(length)]
        self.pools: list[int] = [pool]
        self.peak_memory: float = 0.0
        self.m_eff: float = math.inf
        self.measured: list[float] = []
        self.predicted: list[float] = []

    @property
    def drift(self) -> float:
        """``|x − x_ref|/x_ref``."""
        return abs(self.length - self.reference) / self.reference

    def reset_reference(self) -> None:
        """``x_ref ← x`` (at every replan)."""
        self.reference = self.length

    def observe(
        self, length: float, pool: int, *, peak_memory: float, m_eff: float, plan_devices: int
    ) -> list[Trigger]:
        """Read the next boundary's signals and return the triggers that fire.

        Parameters
        ----------
        length, pool
            Mean response length of the coming step and the devices available.
        peak_memory
            The current plan's predicted per-GPU peak under ``length`` (bytes).
        m_eff
            ``M_eff`` in bytes.
        plan_devices
            ``1 + max flat id`` the current plan uses (it fits the pool iff ``≤ pool``).
        """
        if not length > 0:
            raise ValueError(f"Monitor.observe: length must be positive, got {length!r}")
        out: list[Trigger] = []
        if pool != self.pool:
            lost = plan_devices > pool
            out.append(
                Trigger(
                    Signal.POOL,
                    lost,
                    f"pool {self.pool} → {pool} devices" + (" (current plan loses GPUs)" if lost else ""),
                )
            )
        self.pool = pool
        self.length = float(length)
        self.length_ma = (1 - self.ma_alpha) * self.length_ma + self.ma_alpha * self.length
        self.lengths.append(self.length)
        self.pools.append(pool)
        self.peak_memory, self.m_eff = peak_memory, m_eff
        if peak_memory > m_eff * (1 + 1e-9):
            out.append(
                Trigger(
                    Signal.MEMORY,
                    True,
                    f"predicted peak {peak_memory / 2**30:.2f} GiB > M_eff {m_eff / 2**30:.2f} GiB",
                )
            )
        if self.drift > self.delta_len:
            out.append(
                Trigger(
                    Signal.LENGTH,
                    False,
                    f"length {self.reference:.0f} → {self.length:.0f} ({100 * self.drift:.1f}% > {100 * self.delta_len:.0f}%)",
                )
            )
        return out

"""Temperature schedules of a chain: constant (the RPEG optimizer) or geometric cooling."""

from __future__ import annotations

from typing import Protocol

__all__ = ["Constant", "Geometric", "Temperature"]


class Temperature(Protocol):
    """``start(t0)`` opens a chain at temperature ``t0``; ``step()`` returns the temperature of
    the next round."""

    def start(self, t0: float) -> float: ...

    def step(self) -> float: ...


class Constant:
    """Hold ``t`` fixed for the whole chain (SPEC §8: exploration is managed across chains by
    ``t_init < t_warm``, not within one)."""

    def __init__(self) -> None:
        self.t = 0.0

    def start(self, t0: float) -> float:
        self.t = t0
        return t0

    def step(self) -> float:
        return self.t


class Geometric:
    """Classical cooling ``t ← max(t_min, γ·t)`` after every round (the ablation of SPEC §8).

    Parameters
    ----------
    gamma
        Cooling factor per round, in (0, 1).
    t_min
        Floor of the temperature.
    """

    def __init__(self, gamma: float = 0.95, t_min: float = 1e-4) -> None:
        if not 0.0 < gamma < 1.0:
            raise ValueError(f"Geometric.gamma must be in (0, 1), got {gamma!r}")
        if t_min < 0.0:
            raise ValueError(f"Geometric.t_min must be ≥ 0, got {t_min!r}")
        self.gamma = gamma
        self.t_min = t_min
        self.t = 0.0

    def start(self, t0: float) -> float:
        self.t = t0
        return t0

    def step(self) -> float:
        self.t = max(self.t_min, self.gamma * self.t)
        return self.t

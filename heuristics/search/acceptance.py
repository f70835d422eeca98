"""Acceptance rules: given the current and the best proposed score, move or stay."""

from __future__ import annotations

import math
from random import Random
from typing import Protocol

__all__ = ["Acceptance", "Greedy", "Metropolis"]


class Acceptance(Protocol):
    """Decides whether the chain moves from score ``current`` to ``candidate`` at ``temperature``."""

    def __call__(self, rng: Random, current: float, candidate: float, temperature: float) -> bool: ...


class Metropolis:
    """Score-normalised Metropolis rule (RPEG paper §VI-D, SPEC §8).

    Accept when ``s′ > s``; otherwise with probability ``exp((s′ − s)/(|s|·t))``. Dividing by
    ``|s|`` makes the temperature independent of the score's scale (tokens/s vary by orders of
    magnitude between workloads).
    """

    def __call__(self, rng: Random, current: float, candidate: float, temperature: float) -> bool:
        if candidate > current:
            return True
        if temperature <= 0.0 or current == 0.0:
            return False
        return rng.random() < math.exp((candidate - current) / (abs(current) * temperature))


class Greedy:
    """Accept only strict improvements (a hill climber; useful as a baseline in studies)."""

    def __call__(self, rng: Random, current: float, candidate: float, temperature: float) -> bool:
        return candidate > current

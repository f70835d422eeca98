"""Tests for ``formulations/deadline.py``: one instant, computed once, asked how much is left."""

from __future__ import annotations

import pytest

from rpeg.formulations.deadline import BuildTimeout, Deadline


def test_deadline_arithmetic():
    d = Deadline(None)
    assert d.unlimited and d.remaining() == float("inf") and d.limit() is None and not d.expired()
    d.check()  # never raises
    d = Deadline(10)
    assert 9 < d.remaining() <= 10 and 9 < d.limit() <= 10
    sub = d.within(1)
    assert 0.9 < sub.remaining() <= 1 and sub.at <= d.at
    assert d.within(100).at == d.at  # never after the parent
    assert Deadline.of(d) is d and Deadline.of(None).unlimited
    expired = Deadline(0)
    assert expired.expired() and expired.limit(0.5) == 0.5
    tick = expired.ticker("testing", every=3)
    tick()
    tick()
    with pytest.raises(BuildTimeout, match="stopped while testing"):
        tick()
    with pytest.raises(ValueError, match="non-negative"):
        Deadline(-1)


def test_a_build_timeout_says_how_long_and_where():
    exc = BuildTimeout(0.5, "adding the memory constraints")
    assert str(exc) == "model too large to build in 0.5 s (stopped while adding the memory constraints)"
    assert str(BuildTimeout(2)) == "model too large to build in 2 s"

"""Tests for ``formulations/deadline.py``: one instant, computed once, asked how much is left."""

from __future__ import annotations

import gc

import pytest

from rpeg.formulations.deadline import BuildTimeout, Deadline, heap_frozen


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


@pytest.fixture
def nothing_frozen():
    """A collector with no frozen objects for the test (another library of the test process may
    have frozen some: they are handed back meanwhile and frozen again afterwards)."""
    frozen_before = gc.get_freeze_count()
    gc.unfreeze()
    try:
        yield
    finally:
        if frozen_before:
            gc.freeze()


@pytest.fixture
def collector_calls(monkeypatch):
    """Count the block's ``gc.freeze`` and ``gc.unfreeze`` calls. The frozen count alone cannot
    say whether the block unfroze: the test process's other threads free frozen objects at any
    time, so the count may drop by a few between two reads."""
    calls = {"freeze": 0, "unfreeze": 0}
    for name in calls:
        real = getattr(gc, name)

        def spy(real=real, name=name):
            calls[name] += 1
            real()

        monkeypatch.setattr(gc, name, spy)
    return calls


def test_a_build_freezes_the_callers_heap_and_hands_it_back(nothing_frozen, collector_calls):
    before = [object() for _ in range(10)]
    with heap_frozen():
        assert gc.get_freeze_count() > len(before)  # every tracked object that existed on entry
        with pytest.raises(BuildTimeout), heap_frozen():  # nested: leaves the outer freeze alone
            raise BuildTimeout(1)
        assert collector_calls == {"freeze": 1, "unfreeze": 0} and gc.get_freeze_count() > 0
    assert collector_calls == {"freeze": 1, "unfreeze": 1} and gc.get_freeze_count() == 0


def test_a_build_leaves_a_process_that_froze_its_own_objects_as_it_was(nothing_frozen, collector_calls):
    gc.freeze()
    with heap_frozen():
        pass
    assert collector_calls == {"freeze": 1, "unfreeze": 0} and gc.get_freeze_count() > 0

"""Runtime test fixtures: ``cpu_burner`` loads the machine while runtime scenarios run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.runtime.burner import Burner, start_burner


@pytest.fixture(scope="module")
def cpu_burner() -> Iterator[Burner]:
    """~6 busy-looping processes for the whole module, stopped in teardown even when a test
    fails (and by themselves if the test process dies)."""
    b = start_burner()
    try:
        yield b
    finally:
        b.stop()

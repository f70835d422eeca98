"""Runtime test fixtures: one local Ray instance for every runtime module, runs shared between
tests that need the same uninterrupted run, and ``cpu_burner`` to load the machine.

Worker start-up is what runtime tests spend their time on (one process per worker, each
importing torch and transformers' model code: about 4 CPU-seconds on the 2-core machine), so the
session keeps finished runs' worker processes for the next run (:class:`rpeg.runtime.driver.pool.
WorkerPool`; a pooled process computes what a fresh one does, tests/runtime/test_pool.py), and a
run that several tests compare against is made once per session (:func:`clean_run`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.runtime.burner import Burner, start_burner

#: ``rpeg_device`` resources of the session's instance: the largest plan the runtime tests run
#: has 4 devices; the pool keeps one placement group per plan size it has met (each serves every
#: plan up to its size, of any node shape), with room beside them for a nested pool (CPU slots,
#: not real devices).
RAY_DEVICES = 8


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """A local Ray instance (:data:`RAY_DEVICES` ``rpeg_device`` resources, 2 CPUs) with a
    :class:`~rpeg.runtime.driver.pool.WorkerPool` from the first runtime module that asks for it to the
    end of the session."""
    pytest.importorskip("ray")
    from rpeg.runtime.driver.pool import WorkerPool

    with WorkerPool(RAY_DEVICES, num_cpus=2, max_idle=16):
        yield


_RUNS: dict[str, Any] = {}


@pytest.fixture(scope="session")
def clean_run(ray_session) -> Callable[..., Any]:
    """``clean_run(result, **kwargs)``: ``rpeg.runtime.run(result, **kwargs)`` made once per
    session for each distinct plan and arguments (plain values only: no progress callback,
    no paths, no injected faults), so tests comparing against the same uninterrupted run share
    it. Callers must not modify the report they get."""
    from rpeg.runtime.driver.runner import run

    def get(result, **kwargs: Any) -> Any:
        assert all(isinstance(v, (int, float, str, bool, type(None))) for v in kwargs.values()), kwargs
        key = json.dumps([result.to_json(), sorted(kwargs.items())], sort_keys=True, default=str)
        if key not in _RUNS:
            _RUNS[key] = run(result, **kwargs)
        return _RUNS[key]

    return get


@pytest.fixture(scope="module")
def cpu_burner() -> Iterator[Burner]:
    """~6 busy-looping processes for the whole module, stopped in teardown even when a test
    fails (and by themselves if the test process dies)."""
    b = start_burner()
    try:
        yield b
    finally:
        b.stop()

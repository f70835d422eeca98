"""One :class:`~rpeg.runtime.worker.Worker` in the test process (a one-rank gloo group, no Ray)
for the worker tests: ``local_worker(binding, vertex)`` builds the worker of ``vertex``'s group
of a one-device plan and leaves its process group afterwards."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from rpeg.runtime.rl import RLConfig


@contextmanager
def local_worker(binding: Any, vertex: str, **kwargs: Any) -> Iterator[Any]:
    """The worker (rank 0 of a one-rank group) of ``vertex``'s group; torch's thread count is
    restored afterwards (a worker sets it to 1)."""
    import torch.distributed as dist

    from rpeg.runtime.worker import Worker

    group = next(g for g in binding.groups if vertex in g.vertices)
    assert group.size == 1, "local_worker runs one-rank groups only"
    threads = torch.get_num_threads()
    store = dist.TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=60), wait_for_workers=False)
    worker = Worker(group, 0, "", binding.shape, RLConfig(), 0, store=store, timeout_s=60.0, **kwargs)
    try:
        yield worker
    finally:
        worker.shutdown()
        torch.set_num_threads(threads)


def node(binding: Any, vertex: str, step: int = 0, **extra: Any) -> dict[str, Any]:
    """The OP node description the controller sends for ``vertex`` at ``step`` (phase 0)."""
    g = binding.graph
    v = g.vertices[g.index[vertex]]
    outs = [c for c in v.outputs if not c.startswith("W_") and g.containers[c].weights_of is None]
    desc = {
        "vertex": vertex,
        "role": v.role.value,
        "step": step,
        "phase": 0,
        "version": binding.version(g.index[vertex], step),
        "output": outs[0] if outs else "",
        "algorithm": g.algorithm,
        "publish": False,
        "keep_previous": False,
        "tau": 0,
        "keep": 0,
    }
    return desc | extra

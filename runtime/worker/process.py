"""The worker process: the Ray actor every worker runs in (SPEC §11).

This module is the one place the two sides of the process boundary meet: the driver names
:class:`WorkerProcess` when it asks Ray to start a process, and the process builds its
:class:`~rpeg.runtime.worker.core.Worker` inside. Importing it imports neither torch nor the
worker; :meth:`WorkerProcess.setup` does, in the worker process (the import-linter contract of
``pyproject.toml`` lets the driver import this module and nothing else of the worker package).
"""

from __future__ import annotations

import gc
import os
import sys
from typing import TYPE_CHECKING, Any

from ..protocol import PROTOCOL, ProtocolError

if TYPE_CHECKING:
    from ..protocol import NodeCall

__all__ = ["WorkerProcess"]


class WorkerProcess:
    """Ray actor shell around :class:`~rpeg.runtime.worker.core.Worker`: created cheaply, answers
    :meth:`hello` (rank 0 also opens the group's rendezvous store), then :meth:`setup` joins the
    group's process group (all ranks at once); :meth:`reset` leaves it again so that the process
    can serve another run (:class:`WorkerPool`)."""

    def __init__(self) -> None:
        self.worker = None
        self.store = None

    def hello(self, world: int = 0, timeout_s: float = 1800.0) -> dict[str, Any]:
        """``pid`` and ``host`` of this process and ``node_ip``, its Ray node's address; with
        ``world > 0`` also open a TCPStore for a group of ``world`` ranks on a port the OS picks
        (port 0: no pick-then-bind race) and return its ``master`` address."""
        import datetime
        import socket

        import ray

        out: dict[str, Any] = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "node_ip": ray.util.get_node_ip_address(),
            "master": None,
        }
        if world > 0:
            import torch.distributed as dist

            host = ray.util.get_node_ip_address()
            timeout = datetime.timedelta(seconds=timeout_s)
            self.store = dist.TCPStore(host, 0, world, True, timeout, wait_for_workers=False)
            out["master"] = f"{host}:{self.store.port}"
        return out

    def setup(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        from .core import Worker

        self.worker = Worker(*args, store=self.store, **kwargs)
        self.store = None  # the process group holds it now
        return self.worker.info()

    def call(self, method: str, *args: Any) -> Any:
        """Serve ``method`` of the protocol (:data:`~rpeg.runtime.protocol.PROTOCOL`; OP nodes come
        through :meth:`op`); any other name is refused with a
        :class:`~rpeg.runtime.protocol.ProtocolError`."""
        if method == "op" or method not in PROTOCOL:
            raise ProtocolError(f"worker process: {method!r} is not a protocol method served by call()")
        with self.worker.memory_peak.sampling():
            return getattr(self.worker, method)(*args)

    def op(self, node: NodeCall, inputs: dict[str, list]) -> tuple[Any, Any, Any]:
        """Execute one OP node (:meth:`~rpeg.runtime.worker.ops.WorkerOps.op`); three results."""
        with self.worker.memory_peak.sampling():
            return self.worker.op(node, inputs)

    def reset(self) -> bool:
        """Leave the run: stop the rollout engine, leave the process group, drop the worker and
        everything it held. Returns whether the process may serve another run (``False`` once
        it has started a vLLM engine)."""
        worker, self.worker, self.store = self.worker, None, None
        if worker is not None:
            worker.shutdown()
        del worker
        gc.collect()
        return "vllm" not in sys.modules

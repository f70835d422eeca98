"""The worker process: one Ray actor per device of a run, holding every worker placed on the
device (SPEC §11).

A plan places several roles on one device — colocated generation and training, the frozen
reference and reward models beside them — and each role's rank of its group is a
:class:`~rpeg.runtime.worker.core.Worker`. They share the device's one process, as verl's fused
workers, NeMo-RL and OpenRLHF's hybrid engine do on GPUs (one CUDA context, one allocator), and
a weight version can move between two groups on the same devices in place: the trainer keeps
its share in the process, and the other group's rank reads it there and the other shares over
the trainer's process group, not through Ray's object store
(:meth:`~rpeg.runtime.worker.transfers.WorkerTransfers.install_in_place`; whether it does is
``RunConfig.weight_handover``'s choice). The process joins the run's ``torch.distributed`` world
(one rank per device process), creates the process groups of every worker group as subgroups of it
(:func:`~rpeg.runtime.worker.parallel.plan_groups`), and builds its workers in group order.

The driver calls a worker through its process by group id (:meth:`WorkerProcess.call`,
:meth:`WorkerProcess.op`). A process serves those calls one at a time, in the order the driver
submits them; since the driver submits every group-wide call to all ranks of the group at once
and a device runs one node at a time, every process meets its groups' collectives in the same
order. A transition's per-worker calls (:meth:`WorkerProcess.call_concurrent`) are the
exception: two workers of one process exchange cells with each other, so calls to different
workers run at once, each on a thread of the actor's ``"transition"`` concurrency group, while
one worker's calls still run one at a time in the order the driver made them.

This module is the one place the two sides of the process boundary meet: the driver names
:class:`WorkerProcess` when it asks Ray to start a process, and the process builds its workers
inside. Importing it imports neither torch nor the worker; :meth:`WorkerProcess.setup` does, in
the worker process (the import-linter contract of ``pyproject.toml`` lets the driver import this
module and nothing else of the worker package).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

import ray

from ..protocol import PROTOCOL, ProtocolError

if TYPE_CHECKING:
    from ..binding import GroupSpec
    from ..protocol import NodeCall

__all__ = ["TRANSITION_THREADS", "WorkerProcess"]

#: Threads of a process's ``"transition"`` concurrency group, and so the most workers one device
#: may hold: a transition's calls to every worker of a process must be able to run at once (they
#: meet in the transition's process group).
TRANSITION_THREADS = 16


def _preload() -> None:
    """Import what :meth:`WorkerProcess.setup` needs — torch, the worker and ``transformers``'
    model code, about 5 CPU-seconds, most of a process's start-up — while the process waits
    for its first call: a plan's processes start a few at a time (Ray's start-up concurrency is
    the node's CPUs), so the first ones import while the last ones boot. A failed import is not
    reported here: ``setup`` imports the same modules and raises it."""
    with contextlib.suppress(Exception):
        import torch.distributed  # noqa: F401
        import transformers.modeling_utils  # noqa: F401

        from . import core  # noqa: F401


class WorkerProcess:
    """Ray actor of one device: created cheaply, answers :meth:`hello` (the run's first process
    also opens the world's rendezvous store), then :meth:`setup` joins the world and builds the
    device's workers (all processes at once); :meth:`reset` leaves the run again so that the
    process can serve another (:class:`~rpeg.runtime.driver.pool.WorkerPool`)."""

    def __init__(self) -> None:
        self.workers: dict[int, Any] = {}  # gid → the device's rank of that group
        self.store = None
        self.sampler = None
        self.turns: dict[int, int] = {}  # gid → the next concurrent call its worker serves
        self.turn_taken = threading.Condition()
        self.preload = threading.Thread(target=_preload, name="rpeg-preload", daemon=True)
        self.preload.start()

    def hello(self, world: int = 0, timeout_s: float = 1800.0) -> dict[str, Any]:
        """``pid`` and ``host`` of this process and ``node_ip``, its Ray node's address; with
        ``world > 0`` also open a TCPStore for a world of ``world`` processes on a port the OS
        picks (port 0: no pick-then-bind race) and return its ``master`` address."""
        import datetime
        import socket

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

    def setup(
        self,
        master: str,
        world: tuple[int, int],
        layouts: list[tuple[int, ...]],
        local: list[tuple[GroupSpec, int, tuple[Any, ...]]],
        backend: str = "gloo",
        *,
        timeout_s: float = 1800.0,
        rollout_engine: str = "torch",
    ) -> dict[int, dict[str, Any]]:
        """Join the run's world and build this device's workers.

        Parameters
        ----------
        master
            ``host:port`` of the world's store (opened by :meth:`hello` of world rank 0).
        world
            ``(this process's world rank, world size)``.
        layouts
            Every group of the run, in gid order: ``(gid, world rank of each of its ranks, dp,
            pp, tp)`` (every process creates every group's process groups, in this order).
        local
            This device's workers, in gid order: ``(group, rank, arguments)``, the
            :class:`~rpeg.runtime.worker.core.Worker`'s positional arguments after its process
            groups.
        backend
            ``"gloo"`` (CPU) or ``"nccl"`` (GPU).
        timeout_s
            torch.distributed's rendezvous and collective timeout.
        rollout_engine
            The workers' rollout engine (``"torch"`` or ``"vllm"``).

        Returns
        -------
        dict
            gid → the worker's :meth:`~rpeg.runtime.worker.core.Worker.info`, with ``setup_s``:
            the seconds the process waited for its imports (``imports``, :func:`_preload`), took
            to join the world (``world``) and to create every
            group's process groups (``groups``), and this worker's own construction
            (``worker``: model, optimizer, rollout engine).
        """
        import datetime
        import time

        import torch.distributed as dist

        from .core import Worker
        from .memory import PrivatePeak
        from .parallel import plan_groups

        t_in = time.perf_counter()
        self.preload.join()
        t0 = time.perf_counter()
        rank, size = world
        timeout = datetime.timedelta(seconds=timeout_s)
        store, self.store = self.store, None  # world rank 0 opened it; the process group holds it now
        if store is None:
            host, port = master.rsplit(":", 1)
            store = dist.TCPStore(host, int(port), size, False, timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout)
        t1 = time.perf_counter()
        groups = plan_groups(layouts, rank, timeout)
        t2 = time.perf_counter()
        self.turns = {}
        self.sampler = PrivatePeak(active=False)  # sampled only while a worker serves a call
        infos = {}
        for spec, r, args in local:
            t3 = time.perf_counter()
            self.workers[spec.gid] = Worker(
                spec,
                r,
                groups[spec.gid],
                *args,
                sampler=self.sampler,
                rollout_engine=rollout_engine,
                siblings=self.workers,
            )
            self.workers[spec.gid].memory.settle()  # before the next worker's imports
            times = {
                "imports": t0 - t_in,
                "world": t1 - t0,
                "groups": t2 - t1,
                "worker": time.perf_counter() - t3,
            }
            infos[spec.gid] = {**self.workers[spec.gid].info(), "setup_s": times}
        return infos

    def _worker(self, gid: int, method: str) -> Any:
        if method == "op" or method not in PROTOCOL:
            raise ProtocolError(f"worker process: {method!r} is not a protocol method served by call()")
        if gid not in self.workers:
            raise ProtocolError(
                f"worker process: no worker of group g{gid} on this device (asked for {method!r})"
            )
        return self.workers[gid]

    def call(self, gid: int, method: str, *args: Any) -> Any:
        """Serve ``method`` of the protocol (:data:`~rpeg.runtime.protocol.PROTOCOL`; OP nodes come
        through :meth:`op`) on this device's worker of group ``gid``; any other name is refused
        with a :class:`~rpeg.runtime.protocol.ProtocolError`."""
        worker = self._worker(gid, method)
        with worker.memory.counting():
            return getattr(worker, method)(*args)

    @ray.method(concurrency_group="transition")
    def call_concurrent(self, gid: int, turn: int, method: str, *args: Any) -> Any:
        """:meth:`call` on a thread of the ``"transition"`` concurrency group: a transition's
        per-worker calls, which run at once in a process (its workers exchange cells with each
        other). One worker's calls run one at a time, in the order of ``turn`` (the driver's count
        of its concurrent calls, :func:`~rpeg.runtime.driver.group.call_worker`): a transition
        sends several to one worker — past weight versions, primitives sharing a holder — whose
        collectives must meet the other ranks' in that order. Not counted in the workers' memory
        (:class:`~rpeg.runtime.worker.memory.WorkerMemory`)."""
        with self.turn_taken:
            self.turn_taken.wait_for(lambda: self.turns.get(gid, 0) == turn)
        try:
            return getattr(self._worker(gid, method), method)(*args)
        finally:
            with self.turn_taken:
                self.turns[gid] = turn + 1
                self.turn_taken.notify_all()

    def op(self, gid: int, node: NodeCall, inputs: dict[str, list]) -> tuple[Any, Any, Any]:
        """Execute one OP node on the worker of group ``gid``
        (:meth:`~rpeg.runtime.worker.ops.WorkerOps.op`); three results."""
        if gid not in self.workers:
            raise ProtocolError(f"worker process: no worker of group g{gid} on this device (asked for 'op')")
        worker = self.workers[gid]
        with worker.memory.counting():
            return worker.op(node, inputs)

    def reset(self) -> bool:
        """Leave the run: stop the rollout engines, drop the workers and everything they held,
        leave the process groups. Returns whether the process may serve another run (``False``
        once it has started a vLLM engine)."""
        workers, self.workers, self.store, self.turns = self.workers, {}, None, {}
        for worker in workers.values():
            worker.shutdown()
        workers.clear()
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        if "torch" in sys.modules:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        gc.collect()
        return "vllm" not in sys.modules

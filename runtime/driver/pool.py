"""Worker processes: the Ray actor every worker runs in, and a pool that keeps idle ones for
the next run (:class:`WorkerPool`).

Starting a worker is mostly starting its process: a Python interpreter that imports torch and
transformers' model code, about 4 CPU-seconds on the 2-core machine (docs/runtime.md), so a
9-worker plan spends some 30 s before its first rank builds a model. A job that runs several
plans in one Ray session — a sweep, a benchmark, a test suite — can keep the processes: inside
``with WorkerPool(): ...`` a finished run hands its workers back instead of killing them, and the
next run takes them on the same devices.

What a pooled process keeps and what it does not:

* A run that finishes cleanly returns its workers. Each leaves its process group and drops its
  model, optimizer and task (:meth:`~rpeg.runtime.worker.process.WorkerProcess.reset`); nothing of the run stays but imported
  modules. Every random choice of a worker comes from generators seeded from the run's ``seed``,
  never from process state, so a pooled process computes bit for bit what a fresh one does
  (tests/runtime/test_pool.py compares the final weights).
* A run that failed (a raised node, a lost worker, a stall) kills all of its workers, as without
  a pool: a rank of a failed group may still sit in a collective.
* A process that started a vLLM engine is killed rather than kept: vLLM keeps per-process state
  that is not meant to be set up twice.
* Processes are keyed by the placement-group bundle (the device) they reserve. The pool keeps the
  placement groups of finished runs too. On a one-node Ray instance (a local one) a run in the
  pool reserves its devices as one group, and a later run of at most that many devices takes it
  whatever its node shape (1x1x4 and 1x2x2 alike), so that its processes serve plans of every
  shape; a run needing more devices than any kept set takes a new one. On a cluster of several
  Ray nodes the groups are one per node and a set serves only runs of its shape. A run whose
  devices are not free evicts idle sets (their workers are killed first), oldest first.

The pool keeps at most ``max_idle`` idle processes (the oldest beyond that are killed); each
holds the memory of an interpreter with torch imported. Leaving the ``with`` block kills them
and removes the placement groups; a pool that started Ray (no instance was running) shuts it
down.
"""

from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from typing import Any

__all__ = ["WorkerPool", "active_pool", "one_node", "start_local_ray"]

#: Seconds a returned worker may take to leave its run before it is killed instead of kept.
RESET_S = 120.0


_ACTIVE: WorkerPool | None = None


def active_pool() -> WorkerPool | None:
    """The innermost :class:`WorkerPool` entered in this process and still connected to the
    running Ray instance, else ``None``."""
    if _ACTIVE is None or not _ACTIVE.connected():
        return None
    return _ACTIVE


def _ray_instance() -> str | None:
    """The running Ray instance (its GCS address), ``None`` when Ray is not initialised."""
    import ray

    if not ray.is_initialized():
        return None
    return str(ray.get_runtime_context().gcs_address)


class WorkerPool:
    """Keep the worker processes of finished runs for the next run (see the module docstring).

    Use as a context manager around the runs::

        with WorkerPool():
            report_a = rpeg.run(plan_a, steps=3)
            report_b = rpeg.run(plan_b, steps=3)  # on plan_a's processes where devices match

    Parameters
    ----------
    devices
        ``rpeg_device`` resources of the local Ray instance the pool starts when Ray is not
        running (the most devices any run inside needs); ignored when Ray runs. Required then.
    max_idle
        Most idle processes kept; the oldest beyond it are killed.
    num_cpus
        CPUs of the local instance the pool starts (:func:`start_local_ray`).

    Raises
    ------
    ValueError
        ``max_idle < 0``, or Ray is not running and ``devices`` was not given (on entering).
    """

    def __init__(
        self, devices: int | None = None, *, max_idle: int = 16, num_cpus: int | None = None
    ) -> None:
        if not isinstance(max_idle, int) or max_idle < 0:
            raise ValueError(f"max_idle must be an integer >= 0, got {max_idle!r}")
        if devices is not None and (not isinstance(devices, int) or devices < 1):
            raise ValueError(f"devices must be a positive integer, got {devices!r}")
        self.devices, self.max_idle, self.num_cpus = devices, max_idle, num_cpus
        self._instance: str | None = None
        self._started_ray = False
        self._previous: WorkerPool | None = None
        #: idle placement-group sets, oldest first: ``(groups, slots, shape)`` with ``slots`` the
        #: ``(group, bundle)`` of each device and ``shape`` ``(resource, bundles per group, groups)``
        self._placements: list[tuple[list[Any], list[tuple[Any, int]], tuple[str, int, int]]] = []
        #: idle processes, oldest first: actor → (placement group id, bundle index)
        self._idle: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        #: processes handed out again (a measure of what the pool saved)
        self.reused = 0

    # ------------------------------------------------------------------ lifetime
    def __enter__(self) -> WorkerPool:
        global _ACTIVE
        if _ray_instance() is None:
            if self.devices is None:
                raise ValueError(
                    "WorkerPool: Ray is not running; give devices= (the most devices a run needs) "
                    "to start a local instance, or call ray.init() first"
                )
            start_local_ray(self.devices, self.num_cpus)
            self._started_ray = True
        self._instance = _ray_instance()
        self._previous, _ACTIVE = _ACTIVE, self
        return self

    def __exit__(self, *exc: object) -> None:
        global _ACTIVE
        _ACTIVE = self._previous
        self.close()
        if self._started_ray:
            import ray

            ray.shutdown()
            self._started_ray = False

    def connected(self) -> bool:
        """Whether the Ray instance the pool was entered in still runs (its handles are valid)."""
        return self._instance is not None and _ray_instance() == self._instance

    def close(self) -> None:
        """Kill every idle process and remove every idle placement group."""
        if not self.connected():  # Ray is gone, and with it every process and group
            self._idle.clear()
            self._placements.clear()
            return
        for actor in list(self._idle):
            _kill(actor)
        self._idle.clear()
        while self._placements:
            _remove(self._placements.pop(0)[0])

    @property
    def idle(self) -> int:
        """Idle processes kept."""
        return len(self._idle)

    # ------------------------------------------------------------------ taking
    def take_placement(
        self, resource: str, per_node: int, devices: int
    ) -> tuple[list[Any], list[tuple[Any, int]], tuple[str, int, int]] | None:
        """An idle placement-group set for a run of ``devices`` devices of ``resource``, ``per_node``
        to a node, taken out of the pool: the smallest one-group set of at least ``devices``
        bundles (a one-node instance: any node shape fits), else a set of exactly this shape.
        Returns ``(groups, slots, shape)`` (:meth:`give_back`), or ``None`` when none fits — then
        idle sets (of this pool, then of the pools it is nested in) are evicted, oldest first,
        until the Ray cluster has the devices free for a new one."""
        import ray

        exact = (resource, per_node, devices // per_node)
        any_shape = one_node()
        fits = [
            (len(slots), i)
            for i, (_, slots, shape) in enumerate(self._placements)
            if shape == exact
            or (any_shape and shape[0] == resource and shape[2] == 1 and len(slots) >= devices)
        ]
        if fits:
            return self._placements.pop(min(fits)[1])
        pool: WorkerPool | None = self
        while pool is not None:  # this pool first, then the pools it is nested in
            while pool._placements and ray.available_resources().get(resource, 0) < devices:
                pool._evict(pool._placements.pop(0)[0])
            pool = pool._previous
        return None

    def take_worker(self, pg: Any, bundle: int) -> Any | None:
        """An idle process reserving bundle ``bundle`` of placement group ``pg``, or ``None``."""
        for actor, where in self._idle.items():
            if where == (pg.id, bundle):
                del self._idle[actor]
                self.reused += 1
                return actor
        return None

    # ------------------------------------------------------------------ giving back
    def give_back(
        self,
        workers: list[tuple[Any, int, Any]],
        placement: tuple[list[Any], list[tuple[Any, int]], tuple[str, int, int]] | None = None,
    ) -> None:
        """Take back the processes of a cleanly finished run: ``(placement group, bundle,
        actor)`` each; every one leaves its run (:meth:`~rpeg.runtime.worker.process.WorkerProcess.reset`) and is kept if it
        answers within :data:`RESET_S` and may be reused, else killed. ``placement``, ``(groups,
        slots, shape)`` as :meth:`take_placement` returns it, is kept for the next run it fits."""
        import ray

        refs = {a.reset.remote(): (pg, bundle, a) for pg, bundle, a in workers}
        done, late = ray.wait(list(refs), num_returns=len(refs), timeout=RESET_S) if refs else ([], [])
        for ref in late:
            _kill(refs[ref][2])
        for ref in done:
            pg, bundle, actor = refs[ref]
            try:
                reusable = bool(ray.get(ref))
            except Exception:  # the process is gone or its worker could not stop
                reusable = False
            if reusable:
                self._idle[actor] = (pg.id, bundle)
            else:
                _kill(actor)
        while len(self._idle) > self.max_idle:
            actor, _ = self._idle.popitem(last=False)
            _kill(actor)
        if placement:
            self._placements.append(placement)

    def _evict(self, pgs: list[Any]) -> None:
        """Kill the idle processes in ``pgs`` and remove the groups."""
        ids = {pg.id for pg in pgs}
        for actor, (pid, _) in list(self._idle.items()):
            if pid in ids:
                del self._idle[actor]
                _kill(actor)
        _remove(pgs)


def one_node() -> bool:
    """Whether the running Ray instance has one live node (a local instance): then a pool's
    placement groups are one group per set, lent to plans of any node shape."""
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive")) == 1


def _kill(actor: Any) -> None:
    import ray

    with contextlib.suppress(Exception):  # already dead
        ray.kill(actor)


def _remove(pgs: list[Any]) -> None:
    from ray.util.placement_group import remove_placement_group

    for pg in pgs:
        with contextlib.suppress(Exception):
            remove_placement_group(pg)


def start_local_ray(devices: int, num_cpus: int | None = None) -> str | None:
    """Start a local Ray instance for a run on ``devices`` devices: one ``rpeg_device`` resource
    per device, no dashboard, and worker processes at the driver's priority.

    Ray starts its worker processes with niceness 15 by default; the runtime's workers *are*
    the job, and niced they starve behind any other load on the machine (a loaded 2-core host
    ran a 2-step run for minutes), so they run at niceness 0 here. A cluster joined with
    ``address`` keeps its own setting (``RAY_worker_niceness`` when it was started).

    Parameters
    ----------
    devices
        Devices of the plan (``rpeg_device`` resources).
    num_cpus
        CPUs Ray may schedule (default: the machine's, at least 2).

    Returns
    -------
    str or None
        The Ray session's directory (its processes' logs are under ``logs/``), when Ray says.
    """
    import ray

    context = ray.init(
        num_cpus=num_cpus or max(2, os.cpu_count() or 2),
        resources={"rpeg_device": devices},
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _system_config={"worker_niceness": 0},
    )
    return context.address_info.get("session_dir")

"""Runtime: execute a plan on persistent Ray workers with real PyTorch models (SPEC §11).

* :func:`run` (``rpeg.run``, :mod:`~rpeg.runtime.driver.runner`) binds a
  :class:`~rpeg.solvers.result.Result` to worker groups (:mod:`~rpeg.runtime.binding`), starts one
  process per device holding the device's workers (:mod:`~rpeg.runtime.driver.controller`,
  :mod:`~rpeg.runtime.worker.process`), runs the lowered DAG completion-driven and returns a
  :class:`~rpeg.runtime.trace.report.RunReport` with the trace;
* ``rpeg.verify`` (:func:`rpeg.runtime.trace.verify.verify`) checks a trace against the plan;
* ``driver/``: what runs where ``run`` is called — placement and dispatch, the
  :class:`~rpeg.runtime.driver.group.WorkerGroup` every remote call goes through, the
  :class:`WorkerPool` that keeps processes between runs, progress-checked waits, transitions
  and the urgent path after a lost worker; it never imports torch;
* ``worker/``: what runs in a device's process — one rank of a group (``core.Worker``) with its
  OP nodes, rollouts, transfers and checkpoints, the Hugging Face decoder stages, DTensor TP and
  FSDP2, the RL math, the synthetic task, memory probes;
* ``trace/``: the trace, checkpoints, the verifier, the report and the fidelity comparison;
  ``calibrate/``: ``rpeg calibrate``; ``engines/``: the Hugging Face, vLLM and Megatron-core
  adapters.

Importing this package does not import torch or Ray; :func:`run` does.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RunConfig", "WorkerPool", "run"]


def __getattr__(name: str) -> Any:
    if name == "run":
        from .driver.runner import run

        globals()["run"] = run
        return run
    if name == "RunConfig":
        from .config import RunConfig

        globals()["RunConfig"] = RunConfig
        return RunConfig
    if name == "WorkerPool":
        from .driver.pool import WorkerPool

        globals()["WorkerPool"] = WorkerPool
        return WorkerPool
    raise AttributeError(f"module 'rpeg.runtime' has no attribute {name!r}")

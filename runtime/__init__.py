"""Runtime: execute a plan on persistent Ray workers with real PyTorch models (SPEC §11).

* :func:`run` (``rpeg.run``) binds a :class:`~rpeg.solvers.result.Result` to worker groups
  (``binding``), starts them on Ray with placement groups (``controller``), runs the lowered DAG
  completion-driven and returns a :class:`~rpeg.runtime.driver.runner.RunReport` with the trace;
* ``rpeg.verify`` (:func:`rpeg.runtime.trace.verify.verify`) checks a trace against the plan;
* ``model``, ``task``, ``rl``: the Hugging Face decoder stages, the synthetic task and the
  PPO/GRPO/ReMax/DPO math;
* ``worker`` (with ``worker_ops``, ``worker_rollouts``, ``worker_transfers``,
  ``worker_checkpoints``), ``parallel``: one rank of a group — DTensor TP, pipelined stages,
  FSDP2 data parallelism, vLLM rollouts; ``engines``: the Hugging Face, vLLM and Megatron-core adapters;
* ``pool``: the worker processes' Ray actor and :class:`WorkerPool`, which keeps them between
  runs;
* ``transition``, ``state``, ``recovery``: changing plans mid-run with real state, and the
  urgent path after a lost worker;
* ``measure``: the calibration microbenchmarks behind ``rpeg calibrate`` (fitted by
  :mod:`rpeg.costmodel.fit`).

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

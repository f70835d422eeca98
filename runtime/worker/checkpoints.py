"""A worker's checkpoints: copies of its state to roll back to, and files to resume from
(SPEC §11; the directory layout is :mod:`~rpeg.runtime.trace.checkpoint`'s).

* :meth:`~WorkerCheckpoints.save` / :meth:`~WorkerCheckpoints.load`: this rank's parameters,
  optimizer slice and version in a file (same layout on load);
* :meth:`~WorkerCheckpoints.rollback`: back to the boundary before a step after a failure
  elsewhere (the urgent path, :mod:`~rpeg.runtime.driver.recovery`), from the copy a training worker
  keeps before each update when the run recovers from worker loss.

:class:`WorkerCheckpoints` is a part of :class:`~rpeg.runtime.worker.core.Worker`, which owns the
state it uses.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from ..binding import GroupSpec
from .model import StageModel
from .parallel import FSDPAdam, FSDPShards, PackedShare, local
from .rollouts import Rollouts

__all__ = ["WorkerCheckpoints"]


class WorkerCheckpoints:
    """In-memory boundary copies and checkpoint files of one rank (uses the
    :class:`~rpeg.runtime.worker.core.Worker`'s state below)."""

    group: GroupSpec
    rank: int
    mesh: Any
    model: StageModel
    optimizer: FSDPAdam | None
    sharding: FSDPShards | None
    version: int
    published: dict[int, PackedShare]
    snapshots: dict[int, dict[str, torch.Tensor]]
    keep_boundary: bool
    boundary: dict[str, Any] | None
    mid_update: bool
    inbox: dict[tuple, list[dict[str, torch.Tensor]]]
    gen_state: dict[tuple[str, int], dict[str, Any]]
    rollouts: Rollouts

    def full_weights(self) -> contextlib.AbstractContextManager[None]:
        """A block in which :meth:`_weights` gives the full weights: with ZeRO stage 3 every
        unit is gathered for it (collectives: every DP rank of the group must enter it at the
        same point), otherwise they are already there."""
        return self.sharding.gathered() if self.sharding is not None else contextlib.nullcontext()

    def _weights(self) -> dict[str, torch.Tensor]:
        """This rank's parameters by name, as the model holds them between updates (TP DTensors
        or plain tensors; under FSDP2 the full ones, not the DP shards ``state_dict`` would give).

        Raises
        ------
        RuntimeError
            With ZeRO stage 3 outside :meth:`full_weights` (only shards are registered)."""
        if self.sharding is not None and self.sharding.resharded:
            raise RuntimeError(
                f"worker {self.group.worker(self.rank)}: ZeRO-3 keeps only shards between operations; "
                "read the weights inside full_weights()"
            )
        return dict(self.model.named_parameters())

    @torch.no_grad()
    def _write_weights(self, weights: dict[str, torch.Tensor], *, master: bool = True) -> None:
        """Copy ``weights`` (this rank's local tensors by name) into the model; with ``master``
        also into the optimizer's shards (FSDP2), so the next update starts from them. With ZeRO
        stage 3 the shards are the parameters: they alone are written (``master`` required)."""
        if self.sharding is not None and self.sharding.resharded:
            if not master:
                raise RuntimeError(
                    f"worker {self.group.worker(self.rank)}: ZeRO-3 shards cannot serve other weights"
                )
            self.sharding.set_masters(weights)
            return
        for name, p in self._weights().items():
            local(p).copy_(weights[name])
        if master and self.sharding is not None:  # FSDP2: the shards, which a gathered copy is not
            self.sharding.set_masters(weights)

    def _snapshot(self) -> dict[str, torch.Tensor]:
        """A copy of this rank's weights (local shards), by parameter name."""
        return {k: local(v).detach().clone() for k, v in self._weights().items()}

    def _keep_boundary(self, params: dict[str, torch.Tensor] | None) -> None:
        """Before an update (``keep_boundary``): keep the version, ``params`` (a fresh copy when
        ``None``), the optimizer slice and the snapshots to :meth:`rollback` to."""
        if not self.keep_boundary:
            return
        assert self.optimizer is not None
        self.boundary = {
            "version": self.version,
            "params": params if params is not None else self._snapshot(),
            "optimizer": self.optimizer.state(),
            "snapshots": dict(self.snapshots),
        }

    @torch.no_grad()
    def rollback(self, step: int) -> int:
        """Return to the boundary before ``step`` (segment-local) after a failure mid-step: drop
        in-flight data and gradients; a training worker that already applied the update of
        ``step`` — or some of its ``U`` optimizer steps (``mini_batches``) — restores its
        parameters and optimizer slice from before it. Returns the version held afterwards.

        Raises
        ------
        RuntimeError
            If the worker is past ``step + 1`` or has no boundary copy to return to.
        """
        self.inbox.clear()
        self.gen_state.clear()
        if self.optimizer is not None:
            self.optimizer.zero_grad()  # full and sharded gradients
        else:
            for p in self.model.parameters():
                p.grad = None
        partial = self.mid_update and self.version == step  # stopped between two of U updates
        self.mid_update = False
        if self.optimizer is not None and (self.version == step + 1 or partial):
            b = self.boundary
            if b is None or b["version"] != step:
                raise RuntimeError(
                    f"worker {self.group.worker(self.rank)} applied step {step}'s update and keeps no copy "
                    "from before it (run with worker-loss recovery to keep one)"
                )
            self._write_weights(b["params"])
            self.rollouts.weights_replaced()
            self.optimizer.load_state(b["optimizer"])
            self.snapshots = dict(b["snapshots"])
            self.version = step
        elif self.optimizer is not None and self.version != step:
            raise RuntimeError(
                f"worker {self.group.worker(self.rank)} holds version {self.version}; the boundary before "
                f"step {step} needs {step}"
            )
        # a kept publication of a version past the boundary is of an update now undone
        self.published = {v: pub for v, pub in self.published.items() if v <= self.version}
        return self.version

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str) -> str:
        """Write this rank's parameters, optimizer slice and version to ``path`` (a file; written
        to a temporary name first and renamed, so a crash never leaves a truncated file)."""
        with self.full_weights():
            params = self._snapshot()
        state = {
            "params": params,
            "optimizer": self.optimizer.state() if self.optimizer else None,
            "version": self.version,
            "coords": (self.mesh.d, self.mesh.p, self.mesh.t),
            "layout": self.group.layout(),
        }
        tmp = f"{path}.tmp{os.getpid()}"
        torch.save(state, tmp)
        os.replace(tmp, path)
        return path

    @torch.no_grad()
    def load(self, path: str) -> int:
        """Restore :meth:`save` (same layout); the loaded weights become version 0 of this run."""
        state = torch.load(path, weights_only=False)
        if state["layout"] != self.group.layout() or tuple(state["coords"]) != (
            self.mesh.d,
            self.mesh.p,
            self.mesh.t,
        ):
            raise ValueError(
                f"checkpoint {path} was written by layout {state['layout']} rank {state['coords']}; this worker "
                f"is {self.group.layout()} rank {(self.mesh.d, self.mesh.p, self.mesh.t)}"
            )
        self._write_weights(state["params"])
        self.rollouts.weights_replaced()
        if self.optimizer and state["optimizer"] is not None:
            self.optimizer.load_state(state["optimizer"])
        self.version = 0
        return int(state["version"])

"""One persistent worker: a rank of a worker group (SPEC §11).

A worker holds its pipeline stage of one model, tensor-parallel over its TP group (DTensor),
and — in a training group — its optimizer (:class:`~rpeg.runtime.worker.parallel.FSDPAdam`, FSDP2 shards
of the masters and moments, when ``Pd > 1``; a plain Adam otherwise). The
controller calls the same method on every rank of a group for each node of the executable
DAG; ranks talk to each other with ``torch.distributed`` (gloo on CPU, NCCL on GPU) and never
with the controller mid-node. Containers produced by a node are returned to Ray's object store
by the ranks that hold them (last pipeline stage, TP rank 0); a COMM node copies them into the
destination ranks' memory (:meth:`Worker.fetch`); weight COMM/RESHARD nodes install a
published parameter version in the destination layout (:meth:`Worker.install`).

:class:`Worker` owns the rank's state (this module: the mesh over the rank's process groups,
model, optimizer, task); what it does with it lives in four parts, each a mixin of its own module:

* :mod:`~rpeg.runtime.worker.ops` — the model invocations: OP nodes of generation, inference and
  training (the execution per role is described there);
* :mod:`~rpeg.runtime.worker.rollouts` — the rank's rollout engine behind one interface
  (:class:`~rpeg.runtime.worker.rollouts.Rollouts`: the torch model itself, or a replica's vLLM
  engine and its weight sync), held as :attr:`Worker.rollouts`;
* :mod:`~rpeg.runtime.worker.transfers` — weight publication and installation, data fetches,
  snapshots of past versions and the transition's cell moves;
* :mod:`~rpeg.runtime.worker.checkpoints` — boundary copies, rollback, checkpoint files.

Several workers share a process: the process of a device
(:class:`~rpeg.runtime.worker.process.WorkerProcess`) holds every worker placed on it — one per
group with a rank there — and serves the driver's calls to each by group id.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ...ir.plan import stage_layer_ranges
from ...ir.types import Head
from ..binding import GroupSpec, RunShape
from ..config import RLConfig
from .checkpoints import WorkerCheckpoints
from .context import ContextParallel
from .experts import ExpertGroup, ParallelExperts
from .memory import EXACT_HEAP_THRESHOLD, PrivatePeak, WorkerMemory, map_large_blocks
from .model import StageModel
from .ops import PackedOutput, WorkerOps
from .parallel import FSDPAdam, FSDPShards, PackedShare, RankGroups, local, make_mesh
from .rollouts import make_rollouts
from .task import SyntheticTask
from .transfers import WorkerTransfers

__all__ = ["Worker"]


def _import_before_model(group: GroupSpec, rollout_engine: str, hosts_engine: bool) -> None:
    """Import the libraries the worker's model and engine need — the model family's
    ``transformers`` modules; for a vLLM-generating group ``vllm``, and on a rank that hosts the
    replica's engine the engine client's modules, ``vllm.LLM`` and ``vllm.SamplingParams``: about
    115 MiB beyond ``import vllm``, which loads them lazily — so that the process's private
    resident memory after this, what a node's ``memory_bytes`` is measured against
    (:class:`~rpeg.runtime.worker.memory.WorkerMemory`), holds everything but the worker's state."""
    from ..engines.hf_models import family_modules, runtime_family

    family_modules(runtime_family(group.spec))
    if rollout_engine == "vllm" and group.generates:
        import vllm  # imported for its footprint; the engine imports it again

        if hosts_engine:
            _ = (vllm.LLM, vllm.SamplingParams)  # the lazy attributes import the engine client


class Worker(WorkerOps, WorkerTransfers, WorkerCheckpoints):
    """Rank ``rank`` of worker group ``group``, inside the process of its device
    (:class:`~rpeg.runtime.worker.process.WorkerProcess`, which holds every worker placed on the
    device and the run's process groups).

    Parameters
    ----------
    group
        The group's model, layout and devices.
    rank
        This worker's rank ``d·(Pp·Pt) + p·Pt + t``.
    groups
        This rank's process groups in the group (:func:`~rpeg.runtime.worker.parallel.plan_groups`).
    shape
        The scaled run shape.
    config
        RL hyper-parameters.
    seed
        Run seed (sampling noise and task).
    backend
        ``"gloo"`` (CPU) or ``"nccl"`` (GPU; untested here, see docs/runtime.md).
    fail_at
        Testing hook: ``(vertex, step)`` at which this worker raises, or ``(vertex, step, "exit")``
        at which its process exits abruptly (a lost device), to exercise fault handling.
    keep_boundary
        Training workers keep their parameters and optimizer slice from before each update, so a
        run can roll back to the last step boundary after losing another worker mid-step.
    sampler
        The process's private-memory sampler, shared by its workers (each counts its own share,
        :class:`~rpeg.runtime.worker.memory.WorkerMemory`).
    rollout_engine
        ``"torch"``: generation runs on this group's torch model; ``"vllm"``: each DP replica of a
        generating group starts a vLLM engine (:mod:`~rpeg.runtime.worker.rollouts`).
    siblings
        The workers of this worker's process by group id (the process's own dictionary, so it
        includes workers built later): an install in place reads the producing group's rank
        here (:meth:`~rpeg.runtime.worker.transfers.WorkerTransfers.install_in_place`).
    """

    def __init__(
        self,
        group: GroupSpec,
        rank: int,
        groups: RankGroups,
        shape: RunShape,
        config: RLConfig,
        seed: int,
        backend: str = "gloo",
        fail_at: tuple | None = None,
        step_offset: int = 0,
        keep_boundary: bool = False,
        *,
        sampler: PrivatePeak,
        rollout_engine: str = "torch",
        siblings: dict[int, Any] | None = None,
    ) -> None:
        torch.set_num_threads(1)
        self.group, self.rank, self.shape, self.cfg, self.seed = group, rank, shape, config, seed
        self.fail_at = fail_at
        self.keep_boundary = keep_boundary
        self.boundary: dict[str, Any] | None = None
        self.mid_update = False  # between a training node's first optimizer step and its end
        self.metadata_probe = False  # the next loss call is torch.distributed.pipelining's probe
        self.step_offset = step_offset
        if backend == "nccl" and not torch.cuda.is_available():
            raise RuntimeError(
                f"worker {group.worker(rank)}: Ray placed it on a GPU, but this process's torch "
                f"{torch.__version__} sees no CUDA device (a CPU build?); install a CUDA build of torch "
                "on the GPU nodes, or run on a Ray cluster without GPUs"
            )
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
        if groups.rank != rank:
            raise RuntimeError(
                f"worker {group.worker(rank)}: its process holds rank {groups.rank} of the group"
            )
        self.mesh = make_mesh(
            groups,
            group.replicas,
            group.pp,
            group.tp,
            "cuda" if backend == "nccl" else "cpu",
            cp=group.cp,
            ep=group.ep,
        )
        lo, hi = stage_layer_ranges(group.spec.layers, group.pp)[self.mesh.p]
        self.layer_range = (lo, hi)
        # a CPU worker's private memory is then the memory its tensors hold, which the cost model
        # counts (memory.map_large_blocks); a GPU worker's tensors are on the device
        self.mmap_threshold = EXACT_HEAP_THRESHOLD if backend != "nccl" and map_large_blocks() else None
        _import_before_model(group, rollout_engine, hosts_engine=self.mesh.p == 0 and self.mesh.t == 0)
        # from here on the process's memory grows by what this worker holds (WorkerMemory)
        self.memory = WorkerMemory(sampler)
        self.memory.begin()
        model = StageModel(
            group.spec,
            group.head,
            seed=group.seed,
            layer_range=(lo, hi),
            first=self.mesh.first,
            last=self.mesh.last,
            recompute=group.recompute_run,
            context=(
                ContextParallel(self.mesh.cp_group, group.cp, self.mesh.c, group.cp_kind)
                if group.cp > 1
                else None
            ),
            experts=(
                ExpertGroup(self.mesh.ep_group, group.ep, self.mesh.e, self.mesh.ep_replicas_group)
                if group.ep > 1
                else None
            ),
        )
        if group.spec.checkpoint:  # the plan's model, with the user's weights (full size)
            from ..engines.hf_models import load_stage_weights

            load_stage_weights(model, group.spec.checkpoint)
        if group.tp > 1:
            from torch.distributed.tensor.parallel import parallelize_module

            parallelize_module(model, self.mesh.tp_mesh, model.tp_plan())
        self.model = model
        self.packed = PackedOutput(model)
        self.version = 0
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self.published: dict[int, PackedShare] = {}  # kept shares (publish(keep=True))
        self.siblings: dict[int, Any] = siblings if siblings is not None else {group.gid: self}
        self.optimizer = None
        self.sharding: FSDPShards | None = None  # the FSDP2 wrapper of the weights, when any
        if group.trains:
            lr = config.critic_lr if group.head is Head.SCALAR else config.lr
            # FSDP2 shards the masters and moments over the DP ranks (Pd > 1); stage 3 also the
            # parameters, one unit per decoder layer
            self.optimizer = FSDPAdam(
                model,
                self.mesh.dp_mesh,
                self.mesh.dp_group,
                lr=lr,
                zero=group.zero,
                units=tuple(model.model.layers.values()) if group.zero == 3 else (),
                experts=tuple(m for m in model.modules() if isinstance(m, ParallelExperts)),
            )
            self.sharding = self.optimizer
        else:
            model.requires_grad_(False)
            if group.zero == 3:  # a frozen model's full sharding (SPEC §14.3): no optimizer
                self.sharding = FSDPShards(
                    model,
                    self.mesh.dp_mesh,
                    self.mesh.dp_group,
                    zero=3,
                    units=tuple(model.model.layers.values()),
                )
        self.task = SyntheticTask(shape.vocab, shape.prompt_len, shape.response_len, seed=seed)
        self.target = self.task.target
        self.inbox: dict[tuple, list[dict[str, torch.Tensor]]] = {}
        self.gen_state: dict[tuple[str, int], dict[str, Any]] = {}
        self.schedule = None
        self.lengths = torch.tensor(shape.response_lengths())
        self.rollouts = make_rollouts(self, rollout_engine)
        self.engine_info = self.rollouts.start()
        self.memory.end()  # WorkerProcess.call and .op count each call again

    # ------------------------------------------------------------------ small queries
    def info(self) -> dict[str, Any]:
        """Where this worker runs (for the trace)."""
        import socket

        import ray

        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            # the Ray node the process runs on (several may share a host: nodes started on one machine)
            "node": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None,
            "coords": (self.mesh.d, self.mesh.p, self.mesh.t),
            **(
                {"context": {"cp": self.group.cp, "c": self.mesh.c, "kind": self.group.cp_kind}}
                if self.group.cp > 1
                else {}
            ),
            **({"experts": {"ep": self.group.ep, "e": self.mesh.e}} if self.group.ep > 1 else {}),
            "layers": self.layer_range,
            "params": sum(local(p).numel() for p in self.model.parameters()),
            "optimizer": None if self.optimizer is None else ("fsdp2" if self.optimizer.sharded else "adam"),
            "mmap_threshold": self.mmap_threshold,  # bytes, glibc's pinned threshold (None: glibc's own)
            **({"zero": self.sharding.zero} if self.sharding is not None and self.sharding.sharded else {}),
            **({"rollout_engine": self.engine_info} if self.engine_info else {}),
        }

    def full_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of every parameter of this group's whole model (:func:`~rpeg.runtime.worker.state.full_shapes`),
        for the driver's transition planning."""
        from .state import full_shapes

        return full_shapes(self.group.spec, self.group.head)

    def _emits(self) -> bool:
        """Whether this rank hands its node's outputs on: the last stage's first TP rank of each
        data-parallel rank (context-parallel ranks, which all end with the whole output, leave it
        to CP rank 0)."""
        return self.mesh.last and self.mesh.t == 0 and self.mesh.c == 0

    def _check_fault(self, vertex: str, step: int) -> None:
        if self.fail_at is None or tuple(self.fail_at[:2]) != (vertex, step):
            return
        if len(self.fail_at) > 2 and self.fail_at[2] == "exit":  # the process vanishes: a lost device
            os._exit(1)
        raise RuntimeError(f"injected fault in worker {self.group.worker(self.rank)} at {vertex} step {step}")

    def shutdown(self) -> None:
        """Stop the rollout engine (the process leaves the process groups,
        :meth:`~rpeg.runtime.worker.process.WorkerProcess.reset`)."""
        self.rollouts.stop()

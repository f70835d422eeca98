"""Rollout engines: how a generating rank produces its replica's sequences (SPEC §11,
docs/engines.md), behind one interface, :class:`Rollouts`.

A worker of a group that holds a generation vertex drives one rollout engine, chosen by the run's
``rollout_engine``; the OP node, the weight installs and the transitions talk to it through the
same methods whatever the engine: :meth:`~Rollouts.start`, :meth:`~Rollouts.sync` (a new weight
version), :meth:`~Rollouts.weights_replaced`, :meth:`~Rollouts.generate` (one generation node, a
response-length phase at a time) and :meth:`~Rollouts.stop`; :meth:`~Rollouts.full_state`
gathers the replica's full tensors for any of them.

* :class:`TorchRollouts` (``"torch"``) generates on the group's own torch model: prefill, then
  one token per position with a KV cache, microbatch by microbatch, pipeline stages passing hidden
  states and the last stage sampling with Gumbel noise keyed by ``(seed, sample id, position)``.
  The model is the engine, so there is nothing to start or sync.
* :class:`VllmRollouts` (``"vllm"``): every DP replica generates on its own vLLM engine
  (:class:`~rpeg.runtime.engines.vllm_engine.RolloutEngine`), started by the replica's rank
  ``(d, 0, 0)`` with the replica's tensor parallelism (``tensor_parallel_size = Pt``; vLLM starts
  its own ``Pt`` processes; pipeline parallelism is refused before any worker starts, see
  :func:`~rpeg.runtime.engines.checks.check_rollout_layout`). The group's torch model stays where
  it was — it is what weight transfers, snapshots, checkpoints and transitions move — and the
  engine holds a copy of it:

  * **Weight sync.** When the group installs a new version (a weight COMM/RESHARD node) every rank
    gathers the full tensors of the replica (``DTensor.full_tensor`` over the TP group) and rank
    ``(d, 0, 0)`` pushes them into its engine (a safetensors file under ``/dev/shm``, reloaded by
    every vLLM rank, :meth:`RolloutEngine.update_weights`). The push's time, bytes and the
    checksums of what every vLLM rank loaded versus what the trainer sent are recorded on that
    node (``engine`` in the trace record). A generation node whose version differs from the
    engine's (a colocated group serving a stale version from a snapshot) syncs first and records
    it there.
  * **Phases.** The replica's sequences are submitted at phase 1 with per-request seeds
    ``stable_seed(seed, "vllm", sample_id)`` and ``max_tokens`` = the sequence's response length
    (``ignore_eos``: exactly that many tokens); the engine is stepped until every sequence that
    ends in the node's phase has finished (vLLM's step API, :meth:`RolloutEngine.stream`), and
    the rest stay in flight for the next phase node, paused (:meth:`RolloutEngine.pause`: vLLM
    V1's engine core would otherwise decode them between the nodes, beside whatever the plan runs
    on the device then). Sequences are released to inference as they finish, so the plan's
    gen–inf overlap happens on the engine.

Both emit the same containers (``ids``, ``tokens``, ``logp``, ``mask`` of the sequences that end
in the node's phase) from the same prompts, so a plan's trace verifies whatever the engine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..engines.vllm_engine import mapped_shared_memory
from ..protocol import NodeCall
from .memory import release_freed_memory
from .model import KVCache, sample_token, stable_seed

__all__ = [
    "ENGINE_CLASSES",
    "ENGINE_DIR_PREFIX",
    "Rollouts",
    "TorchRollouts",
    "VllmRollouts",
    "make_rollouts",
    "remove_orphaned_engine_dirs",
    "remove_orphaned_shared_memory",
]

_SEED_MOD = 2**31 - 1  # vLLM request seeds are 32-bit
#: ``engine_version`` after the torch weights were replaced by anything but an install (a
#: transition's hand-over, a checkpoint, a rollback): versions are renumbered per plan segment, so
#: no node's version may be taken to name what the engine holds; the next generation syncs.
_UNSYNCED = -(2**62)


@contextlib.contextmanager
def _inherited_affinity(core: str | None) -> Iterator[None]:
    """While it lasts, this process may run only on ``core`` (a core id as text; ``None``:
    unchanged), so that the processes it starts — a one-rank vLLM engine's scheduler (the engine
    core) and its model worker — start there; this process's affinity is restored afterwards.

    Without it the scheduler, which steps the engine between model calls, inherits every core
    and runs wherever the OS puts it, on another device's core too; bound, a CPU device's engine
    computes where ``rpeg calibrate`` timed it (next to its model worker). Measured effect in the
    fidelity benchmark's colocated plan: within that machine's run-to-run noise (RESULTS.md).
    """
    if core is None or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {int(core)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


#: Name prefix of a vLLM replica's weight directory, followed by the owning process's pid.
ENGINE_DIR_PREFIX = "rpeg-vllm-"


def remove_orphaned_engine_dirs(root: Path) -> list[Path]:
    """Remove the vLLM weight directories under ``root`` whose process is gone; return them.

    A replica's directory (a model-sized safetensors file in ``/dev/shm``, RAM) is removed by
    :meth:`VllmRollouts.stop`, but a process that is killed — a failed run's, or any run's outside
    a :class:`~rpeg.runtime.driver.pool.WorkerPool`, whose processes the driver kills at the end
    — never gets there: 192 such directories, 13 GB of RAM, had piled up on the development
    machine until Ray's memory monitor killed a run's workers. Every engine start sweeps them.
    Directories of live processes, and names without a pid, are left alone."""
    removed = []
    for path in root.glob(f"{ENGINE_DIR_PREFIX}*"):
        pid = path.name[len(ENGINE_DIR_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


#: Shared-memory segments vLLM's CPU build creates under ``/dev/shm`` and unlinks only when the
#: creating process ends cleanly: a TP group's ``vllm_dist_<id>-tp:…-cpushm_<rank>`` buffers and
#: the engine's message queues (Python ``SharedMemory``, ``psm_<hex>``, unlinked in its creator's
#: ``__del__``).
VLLM_SHM_PATTERNS = ("vllm_dist_*cpushm*", "psm_*")


def remove_orphaned_shared_memory(
    root: Path, mapped: set[str] | None = None, *, min_age_s: float = 60.0
) -> list[Path]:
    """Remove vLLM's shared-memory segments under ``root`` (:data:`VLLM_SHM_PATTERNS`) that no
    live process maps and that are older than ``min_age_s``; return them.

    An engine process that is killed leaves them behind (a TP-2 engine two 4 MiB buffers, its
    queues up to 250 MiB of address space each): 252 ``cpushm`` buffers and a few hundred queues,
    about 530 MB of RAM, had piled up on the development machine over several sessions. A live
    segment is mapped by its creator from the moment it exists, so "mapped by nobody" means
    orphaned; the age guards the microseconds between a creator's ``shm_open`` and its ``mmap``.
    ``mapped`` defaults to :func:`mapped_shared_memory` (``root``-relative paths are matched by
    name)."""
    names = {Path(p).name for p in (mapped_shared_memory() if mapped is None else mapped)}
    now = time.time()
    removed = []
    for pattern in VLLM_SHM_PATTERNS:
        for path in root.glob(pattern):
            with contextlib.suppress(OSError):
                if path.name in names or now - path.stat().st_mtime < min_age_s or not path.is_file():
                    continue
                path.unlink()
                removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class Rollouts:
    """The rollout engine of one rank of a worker group (the module docstring): the interface
    every engine implements. This base class is the group that generates nothing — it starts,
    syncs and stops nothing, and refuses a generation node.

    Parameters
    ----------
    worker
        The :class:`~rpeg.runtime.worker.core.Worker` whose rollouts these are (its group,
        mesh, model, run shape, seed, response lengths and the ops' batch and phase helpers).
    """

    #: The engine's name (``rollout_engine``).
    name = "none"

    def __init__(self, worker: Any) -> None:
        self.w = worker

    def start(self) -> dict[str, Any]:
        """Start the engine from the group's current weights; the engine's facts for the trace
        (empty when nothing started on this rank)."""
        return {}

    @property
    def takes_weights(self) -> bool:
        """Whether an install must hand the engine the new full weights (:meth:`sync`)."""
        return False

    def sync(self, version: int, full: dict[str, torch.Tensor] | None = None) -> dict[str, Any] | None:
        """Give the engine the model's current weights, version ``version`` (``full``: the
        replica's full tensors when the caller has them). The push's facts on the rank that
        pushed, ``None`` elsewhere or when the engine needs no push."""
        return None

    def weights_replaced(self) -> None:
        """The torch weights changed outside an install (a transition's hand-over, a checkpoint, a
        rollback): the engine's copy, if it keeps one, is stale."""

    def generate(
        self, node: NodeCall, temperature: float
    ) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
        """One generation node (a response-length phase of it): ``(containers of the sequences
        that end in the node's phase — on the ranks that emit them —, meta)``."""
        raise RuntimeError(
            f"worker {self.w.group.worker(self.w.rank)}: group g{self.w.group.gid} generates nothing, "
            f"asked for {node.vertex} step {node.step}"
        )

    @torch.no_grad()
    def full_state(self) -> dict[str, torch.Tensor]:
        """The replica's full tensors (collective over the TP group for sharded parameters), as
        copies: serialising a tensor through numpy marks its storage non-resizable, and FSDP2
        frees its unsharded parameters by resizing their storage (a replicated DTensor's
        ``full_tensor`` may return its local tensor)."""
        w = self.w
        out = {}
        for name, p in w._weights().items():
            out[name] = (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
        return out

    def stop(self) -> None:
        """Shut the engine down (idempotent)."""


class TorchRollouts(Rollouts):
    """Generation on the group's own torch model (the module docstring)."""

    name = "torch"

    @torch.no_grad()
    def generate(
        self, node: NodeCall, temperature: float
    ) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
        w = self.w
        sh, step = w.shape, node.step
        key = (node.vertex, step)
        phase = node.phase
        if phase <= 1:
            ids, mine, prompts = w._rollout_batch(step)
            tokens = torch.zeros(len(mine), sh.prompt_len + sh.response_len, dtype=torch.int64)
            tokens[:, : sh.prompt_len] = prompts
            mb = w.group.mb if node.mb is None else node.mb  # the vertex's microbatches (SPEC §14.2)
            chunks = [c for c in torch.tensor_split(torch.arange(len(mine)), mb) if len(c)]
            w.gen_state[key] = {
                "ids": ids,
                "mine": mine,
                "tokens": tokens,
                "logp": torch.zeros(len(mine), sh.response_len),
                "chunks": chunks,
                "caches": [KVCache() for _ in chunks],
                "pos": 0,
            }
        st = w.gen_state[key]
        hi = w._phase_end(phase)
        lo = st["pos"]
        Lp = sh.prompt_len
        m = w.mesh
        for t in range(lo, hi):
            for c, cache in zip(st["chunks"], st["caches"]):
                b = len(c)
                x = st["tokens"][c, :Lp] if t == 0 else st["tokens"][c, Lp + t - 1 : Lp + t]
                out = w._stage(x if m.first else None, b, Lp if t == 0 else 1, cache)
                tok = torch.empty(b, dtype=torch.int64)
                if m.last:
                    logits = out[0] if isinstance(out, tuple) else out
                    tok, lp = sample_token(logits[:, -1], w.seed, st["ids"][c], t, temperature)
                    st["logp"][c, t] = lp
                    if w.group.pp > 1:
                        dist.send(tok, group=m.group, group_dst=m.first_rank())
                elif m.first:
                    dist.recv(tok, group=m.group, group_src=m.last_rank())
                if m.first or m.last:
                    st["tokens"][c, Lp + t] = tok
        st["pos"] = hi
        lengths = w.lengths[st["mine"]]
        done = w._ends_in_phase(phase, lengths)
        if phase == 0 or hi == sh.response_len:
            del w.gen_state[key]
        mask = (torch.arange(sh.response_len)[None, :] < lengths[done][:, None]).float()
        tokens = st["tokens"][done].clone()
        tokens[:, Lp:] *= mask.long()
        out = {"ids": st["ids"][done], "tokens": tokens, "logp": st["logp"][done] * mask, "mask": mask}
        return out, {"sequences": int(done.sum())}


class VllmRollouts(Rollouts):
    """A replica's vLLM engine (rank ``(d, 0, 0)`` holds it) and its weight sync (the module
    docstring). ``engine_version`` is the version the engine holds (``None``: no engine in the
    replica)."""

    name = "vllm"

    def __init__(self, worker: Any) -> None:
        super().__init__(worker)
        self.engine: Any = None
        self.engine_version: int | None = None
        self.engine_dir: Path | None = None

    def start(self) -> dict[str, Any]:
        """Start the replica's vLLM engine from the group's current weights (every rank of the
        replica takes part in the gather). Returns the engine's facts (empty on other ranks)."""
        w = self.w
        self.engine, self.engine_version, self.engine_dir = None, None, None
        if not w.group.generates:
            return {}
        from ..engines.hf_models import save_checkpoint
        from ..engines.vllm_engine import RolloutEngine

        state = self.full_state()
        if not self.hosts_engine():
            del state
            release_freed_memory()
            self.engine_version = 0
            return {}
        shm = Path("/dev/shm")
        root = shm if shm.is_dir() else Path(tempfile.gettempdir())
        remove_orphaned_engine_dirs(root)
        if root == shm:
            remove_orphaned_shared_memory(shm)
        self.engine_dir = Path(
            tempfile.mkdtemp(prefix=f"{ENGINE_DIR_PREFIX}{os.getpid()}-g{w.group.gid}-d{w.mesh.d}-", dir=root)
        )
        save_checkpoint(state, w.group.spec, self.engine_dir, max_positions=self.max_len())
        del state
        release_freed_memory()
        env = self.engine_cores()
        with _inherited_affinity(env.get("VLLM_CPU_OMP_THREADS_BIND")):
            self.engine = RolloutEngine(
                self.engine_dir,
                tp=w.group.tp,
                max_model_len=self.max_len(),
                seed=w.seed,
                env=env,
            )
        self.engine_version = 0
        return {"engine": "vllm", "start_s": self.engine.start_seconds, "tp": w.group.tp}

    def weights_replaced(self) -> None:
        """The torch weights changed outside an install: the engine's copy is stale whatever the
        version numbers say (they restart in a new plan segment); the next generation syncs."""
        if self.engine_version is not None:
            self.engine_version = _UNSYNCED

    def engine_cores(self) -> dict[str, str]:
        """On a CPU "device" (one core), a one-rank engine computes on that core:
        ``VLLM_CPU_OMP_THREADS_BIND`` = the device's core (device id modulo the cores this process
        may use). Without it vLLM-CPU binds every engine to all the host's cores, so engines and
        trainers of different devices oversubscribe them. The engine's scheduler process is
        started on that core too (:func:`_inherited_affinity`). Multi-rank engines keep
        :func:`~rpeg.runtime.engines.vllm_engine.omp_threads_bind`'s split; GPU runs bind nothing."""
        w = self.w
        if w.device is not None or w.group.tp * w.group.pp > 1:
            return {}
        cores = sorted(os.sched_getaffinity(0))
        return {"VLLM_CPU_OMP_THREADS_BIND": str(cores[w.group.devices[w.rank] % len(cores)])}

    def max_len(self) -> int:
        """The engine's longest sequence: prompt and response, ``Lp + Lr``."""
        w = self.w
        return w.shape.prompt_len + w.shape.response_len

    def hosts_engine(self) -> bool:
        """Whether this rank, ``(d, 0, 0)`` of its replica, starts the replica's engine."""
        w = self.w
        return w.mesh.p == 0 and w.mesh.t == 0

    @property
    def takes_weights(self) -> bool:
        """Whether the replica has an engine (every rank of it takes part in a push)."""
        return self.engine_version is not None

    def sync(self, version: int, full: dict[str, torch.Tensor] | None = None) -> dict[str, Any] | None:
        """Push the model's current weights (version ``version``) into the replica's engine.

        ``full`` are the replica's full tensors when the caller has them (an install received
        them); otherwise every rank gathers them (:meth:`full_state`, collective over the TP
        group). Returns, on the engine's rank, ``{"weight_sync_s", "gathered", "gather_s",
        "checksum_s", "engine_s", "write_s", "bytes", "checksum", "rank_checksums",
        "checksums_match"}``:
        ``weight_sync_s`` is the whole push as this worker pays it (the gather, the checksum,
        the file's write and the engine's reload; what the calibration's weight-sync link
        measures), the others its parts; ``None`` elsewhere or when no engine runs here.
        """
        if self.engine_version is None:
            return None
        from ..engines.vllm_engine import state_checksum

        t0 = time.perf_counter()
        state = self.full_state() if full is None else full
        gathered = time.perf_counter()
        self.engine_version = version
        if self.engine is None:
            del state
            release_freed_memory()
            return None
        from ..engines.hf_models import checkpoint_state

        # the checkpoint's names (a MoE model's experts one by one), as vLLM reads them
        lm = checkpoint_state(
            {k: v for k, v in state.items() if not k.startswith("value_head.")}, self.w.group.spec
        )
        sent = state_checksum(lm)
        summed = time.perf_counter()
        res = self.engine.update_weights(lm)
        del state, lm
        release_freed_memory()
        return {
            "engine": "vllm",
            "weight_sync_s": time.perf_counter() - t0,
            "gathered": full is None,
            "gather_s": gathered - t0,
            "checksum_s": summed - gathered,
            "engine_s": res["seconds"],
            "write_s": res.get("write_seconds", 0.0),
            "bytes": res["bytes"],
            "version": version,
            "checksum": sent,
            "rank_checksums": res["rank_checksums"],
            "checksums_match": all(c == sent for c in res["rank_checksums"]),
        }

    def generate(self, node: NodeCall, temperature: float) -> tuple[dict | None, dict[str, Any]]:
        """One generation node on the replica's engine (phases as in the module docstring)."""
        w = self.w
        sh, step = w.shape, node.step
        key = (node.vertex, step)
        phase = node.phase
        meta: dict[str, Any] = {}
        if self.engine_version != node.version:
            sync = self.sync(node.version)
            if sync is not None:
                meta["engine"] = sync
        if phase <= 1:
            ids, mine, prompts = w._rollout_batch(step)
            lengths = w.lengths[mine]
            st: dict[str, Any] = {"ids": ids, "prompts": prompts, "lengths": lengths, "got": {}}
            if self.engine is not None:
                st["stream"] = self.engine.stream(
                    prompts.tolist(),
                    max_tokens=lengths.tolist(),
                    seeds=[stable_seed(w.seed, "vllm", int(i)) % _SEED_MOD for i in ids],
                    temperature=temperature,
                )
                st["t0"] = time.perf_counter()
            w.gen_state[key] = st
        st = w.gen_state[key]
        last = phase == 0 or w._phase_end(phase) == sh.response_len
        lengths = st["lengths"]
        done = w._ends_in_phase(phase, lengths)
        if last:
            del w.gen_state[key]
        if self.engine is None:
            return None, {**meta, "sequences": int(done.sum())}
        want = set(torch.nonzero(done).flatten().tolist())
        got = st["got"]
        while not want <= set(got):
            r = next(st["stream"])
            got[r.index] = r
        if last:
            st["stream"].close()
        # Later phases' sequences wait for their own nodes: the device runs other work between.
        self.engine.pause()
        rows = sorted(want)
        Lp, Lr = sh.prompt_len, sh.response_len
        tokens = torch.zeros(len(rows), Lp + Lr, dtype=torch.int64)
        logp = torch.zeros(len(rows), Lr)
        tokens[:, :Lp] = st["prompts"][rows]
        for j, i in enumerate(rows):
            r = got.pop(i)
            tokens[j, Lp : Lp + len(r.token_ids)] = torch.tensor(r.token_ids, dtype=torch.int64)
            logp[j, : len(r.logprobs)] = torch.tensor(r.logprobs, dtype=torch.float32)
        mask = (torch.arange(Lr)[None, :] < lengths[rows][:, None]).float()
        meta["engine"] = {
            **meta.get("engine", {}),
            "engine": "vllm",
            "generate_s": time.perf_counter() - st["t0"],
            "tokens": int(mask.sum()),
        }
        out = {"ids": st["ids"][rows], "tokens": tokens, "logp": logp * mask, "mask": mask}
        return out, {**meta, "sequences": len(rows)}

    def stop(self) -> None:
        """Shut the engine down and remove its checkpoint directory."""
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        if self.engine_dir is not None:
            shutil.rmtree(self.engine_dir, ignore_errors=True)
            self.engine_dir = None


#: The rollout engine of each ``rollout_engine`` name
#: (:data:`~rpeg.runtime.engines.checks.ROLLOUT_ENGINES`, which ``RunConfig`` checks a run's
#: choice against before any worker starts).
ENGINE_CLASSES: dict[str, type[Rollouts]] = {"torch": TorchRollouts, "vllm": VllmRollouts}


def make_rollouts(worker: Any, engine: str) -> Rollouts:
    """The rollout engine of ``worker``: ``engine``'s (:data:`ENGINE_CLASSES`) for a group that
    generates, the :class:`Rollouts` that generates nothing otherwise."""
    return ENGINE_CLASSES[engine](worker) if worker.group.generates else Rollouts(worker)

"""A worker's vLLM rollouts: generation replicas as vLLM engines (SPEC §11, docs/engines.md).

With ``rollout_engine="vllm"`` every DP replica of a group that holds a generation vertex
generates on its own vLLM engine (:class:`~rpeg.runtime.engines.vllm_engine.RolloutEngine`),
started by the replica's rank ``(d, 0, 0)`` with the replica's tensor parallelism
(``tensor_parallel_size = Pt``; vLLM starts its own ``Pt`` processes; pipeline parallelism is
refused before any worker starts, see :func:`~rpeg.runtime.engines.checks.check_rollout_layout`). The group's torch model
stays where it was — it is what weight transfers, snapshots, checkpoints and transitions move —
and the engine holds a copy of it:

* **Weight sync.** When the group installs a new version (a weight COMM/RESHARD node) every rank
  gathers the full tensors of the replica (``DTensor.full_tensor`` over the TP group) and rank
  ``(d, 0, 0)`` pushes them into its engine (a safetensors file under ``/dev/shm``, reloaded by
  every vLLM rank, :meth:`RolloutEngine.update_weights`). The push's time, bytes and the
  checksums of what every vLLM rank loaded versus what the trainer sent are recorded on that node
  (``engine`` in the trace record). A generation node whose version differs from the engine's
  (a colocated group serving a stale version from a snapshot) syncs first and records it there.
* **Phases.** The replica's sequences are submitted at phase 1 with per-request seeds
  ``stable_seed(seed, "vllm", sample_id)`` and ``max_tokens`` = the sequence's response length
  (``ignore_eos``: exactly that many tokens); the engine is stepped until every sequence that ends in the node's phase has
  finished (vLLM's step API, :meth:`RolloutEngine.stream`), and the rest stay in flight for the
  next phase node, paused (:meth:`RolloutEngine.pause`: vLLM V1's engine core would otherwise
  decode them between the nodes, beside whatever the plan runs on the device then). Sequences
  are released to inference as they finish, so the plan's gen–inf overlap happens on the engine.

:class:`WorkerRollouts` is a part of :class:`~rpeg.runtime.worker.core.Worker`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..binding import GroupSpec, RunShape
from ..protocol import NodeCall
from .memory import release_freed_memory
from .model import stable_seed

__all__ = ["WorkerRollouts"]

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


class WorkerRollouts:
    """vLLM engine of this rank's replica (rank ``(d, 0, 0)`` holds it) and its weight sync.

    Uses the :class:`~rpeg.runtime.worker.core.Worker`'s ``group``, ``mesh``, ``model``, ``shape``,
    ``seed``, ``lengths``, ``gen_state`` and the ops' batch and phase helpers (``_rollout_batch``,
    ``_phase_end``, ``_ends_in_phase``).
    """

    group: GroupSpec
    mesh: Any
    model: Any
    shape: RunShape
    seed: int
    lengths: torch.Tensor
    gen_state: dict[tuple[str, int], dict[str, Any]]
    _rollout_batch: Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    _phase_end: Callable[[int], int]
    _weights: Callable[[], dict[str, torch.Tensor]]
    _ends_in_phase: Callable[[int, torch.Tensor], torch.Tensor]
    rollout_engine: str
    device: Any
    engine: Any
    engine_version: int | None
    engine_dir: Path | None

    def _start_rollouts(self) -> dict[str, Any]:
        """Start the replica's vLLM engine from the group's current weights (every rank of the
        replica takes part in the gather). Returns the engine's facts (empty on other ranks)."""
        self.engine, self.engine_version, self.engine_dir = None, None, None
        if self.rollout_engine != "vllm" or not self.group.generates:
            return {}
        from ..engines.hf_models import save_checkpoint
        from ..engines.vllm_engine import RolloutEngine

        state = self._full_state()
        if not self._hosts_engine():
            del state
            release_freed_memory()
            self.engine_version = 0
            return {}
        shm = Path("/dev/shm")
        self.engine_dir = Path(
            tempfile.mkdtemp(
                prefix=f"rpeg-vllm-g{self.group.gid}-d{self.mesh.d}-", dir=shm if shm.is_dir() else None
            )
        )
        save_checkpoint(state, self.group.spec, self.engine_dir, max_positions=self._max_len())
        del state
        release_freed_memory()
        env = self._engine_cores()
        with _inherited_affinity(env.get("VLLM_CPU_OMP_THREADS_BIND")):
            self.engine = RolloutEngine(
                self.engine_dir,
                tp=self.group.tp,
                max_model_len=self._max_len(),
                seed=self.seed,
                env=env,
            )
        self.engine_version = 0
        return {"engine": "vllm", "start_s": self.engine.start_seconds, "tp": self.group.tp}

    def _weights_replaced(self) -> None:
        """The torch weights changed outside an install: the engine's copy is stale whatever the
        version numbers say (they restart in a new plan segment); the next generation syncs."""
        if getattr(self, "engine_version", None) is not None:
            self.engine_version = _UNSYNCED

    def _engine_cores(self) -> dict[str, str]:
        """On a CPU "device" (one core), a one-rank engine computes on that core:
        ``VLLM_CPU_OMP_THREADS_BIND`` = the device's core (device id modulo the cores this process
        may use). Without it vLLM-CPU binds every engine to all the host's cores, so engines and
        trainers of different devices oversubscribe them. The engine's scheduler process is
        started on that core too (:func:`_inherited_affinity`). Multi-rank engines keep
        :func:`~rpeg.runtime.engines.vllm_engine.omp_threads_bind`'s split; GPU runs bind nothing."""
        if self.device is not None or self.group.tp * self.group.pp > 1:
            return {}
        cores = sorted(os.sched_getaffinity(0))
        return {"VLLM_CPU_OMP_THREADS_BIND": str(cores[self.group.devices[self.rank] % len(cores)])}

    def _max_len(self) -> int:
        return self.shape.prompt_len + self.shape.response_len

    def _hosts_engine(self) -> bool:
        return self.mesh.p == 0 and self.mesh.t == 0

    @torch.no_grad()
    def _full_state(self) -> dict[str, torch.Tensor]:
        """The replica's full tensors (collective over the TP group for sharded parameters), as
        copies: serialising a tensor through numpy marks its storage non-resizable, and FSDP2
        frees its unsharded parameters by resizing their storage (a replicated DTensor's
        ``full_tensor`` may return its local tensor)."""
        out = {}
        for name, p in self._weights().items():
            out[name] = (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
        return out

    def _sync_rollouts(
        self, version: int, full: dict[str, torch.Tensor] | None = None
    ) -> dict[str, Any] | None:
        """Push the model's current weights (version ``version``) into the replica's engine.

        ``full`` are the replica's full tensors when the caller has them (an install received
        them); otherwise every rank gathers them (:meth:`_full_state`, collective over the TP
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
        state = self._full_state() if full is None else full
        gathered = time.perf_counter()
        self.engine_version = version
        if self.engine is None:
            del state
            release_freed_memory()
            return None
        lm = {k: v for k, v in state.items() if not k.startswith("value_head.")}
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

    def _generate_vllm(self, node: NodeCall, temperature: float) -> tuple[dict | None, dict[str, Any]]:
        """One generation node on the replica's engine (phases as in the module docstring)."""
        sh, step = self.shape, node.step
        key = (node.vertex, step)
        phase = node.phase
        meta: dict[str, Any] = {}
        if self.engine_version != node.version:
            sync = self._sync_rollouts(node.version)
            if sync is not None:
                meta["engine"] = sync
        if phase <= 1:
            ids, mine, prompts = self._rollout_batch(step)
            lengths = self.lengths[mine]
            st: dict[str, Any] = {"ids": ids, "prompts": prompts, "lengths": lengths, "got": {}}
            if self.engine is not None:
                st["stream"] = self.engine.stream(
                    prompts.tolist(),
                    max_tokens=lengths.tolist(),
                    seeds=[stable_seed(self.seed, "vllm", int(i)) % _SEED_MOD for i in ids],
                    temperature=temperature,
                )
                st["t0"] = time.perf_counter()
            self.gen_state[key] = st
        st = self.gen_state[key]
        last = phase == 0 or self._phase_end(phase) == sh.response_len
        lengths = st["lengths"]
        done = self._ends_in_phase(phase, lengths)
        if last:
            del self.gen_state[key]
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

    def _stop_rollouts(self) -> None:
        """Shut the engine down and remove its checkpoint directory."""
        if getattr(self, "engine", None) is not None:
            self.engine.shutdown()
            self.engine = None
        if getattr(self, "engine_dir", None) is not None:
            shutil.rmtree(self.engine_dir, ignore_errors=True)
            self.engine_dir = None

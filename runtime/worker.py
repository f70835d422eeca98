"""One persistent worker: a rank of a worker group (SPEC §11).

A worker holds its pipeline stage of one model, tensor-parallel over its TP group (DTensor),
and — in a training group — its slice of the optimizer state (:class:`ShardedAdam`). The
controller calls the same method on every rank of a group for each node of the executable
DAG; ranks talk to each other with ``torch.distributed`` (gloo on CPU, NCCL on GPU) and never
with the controller mid-node. Containers produced by a node are returned to Ray's object store
by the ranks that hold them (last pipeline stage, TP rank 0); a COMM node copies them into the
destination ranks' memory (:meth:`Worker.fetch`); weight COMM/RESHARD nodes install a
published parameter version in the destination layout (:meth:`Worker.install`).

Execution per role (``B'·R'`` sequences of one step, global order = sample id):

* generation: prefill the prompt, then one token per decode position, microbatch by microbatch,
  stage by stage (``send``/``recv`` of hidden states between stages; the last stage samples with
  layout-independent Gumbel noise and sends the token back to the first). A response-length
  phase ``q`` decodes positions ``t_{q−1}..t_q − 1`` and emits the sequences that end there.
* inference: teacher-forced forward, microbatched; reference → log-probs, critic → values,
  reward → reward-model score plus the task's verifiable reward (the score the RL update uses:
  a randomly initialised reward model carries no signal).
* training: advantages over the whole step's batch (PPO: KL-shaped rewards and GAE γ = 1,
  λ = 0.95; GRPO: group-relative), then this rank's DP slice in ``mb`` microbatches — with
  ``torch.distributed.pipelining``'s 1F1B schedule when ``Pp > 1`` — losses divided by the
  global token count, then one :class:`ShardedAdam` step.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import torch
import torch.distributed as dist

from ..ir.types import Head, Role
from .binding import GroupSpec, RunShape
from .model import KVCache, Transformer, sample_token, stage_layer_ranges, token_logprobs
from .parallel import ShardedAdam, assemble, local, make_mesh, publication, shard_of
from .rl import (
    RLConfig,
    gae,
    grpo_advantages,
    kl_loss,
    policy_loss,
    response_slice,
    token_rewards,
    value_loss,
)
from .task import SyntheticTask

__all__ = ["Worker"]

# columns of the packed per-token training target (pipelining passes one tensor to the loss)
_TOK, _OLD, _ADV, _MASK, _REF, _RET, _VAL = range(7)


class _Packed(torch.nn.Module):
    """Last-stage wrapper whose output is one tensor: logits ``[b,s,V]``, values ``[b,s,1]``, or
    both concatenated (``BOTH``) — the form ``torch.distributed.pipelining`` passes to the loss."""

    def __init__(self, inner: Transformer) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x)
        if not self.inner.last:
            return out
        if isinstance(out, tuple):
            return torch.cat([out[0], out[1].unsqueeze(-1)], dim=-1)
        return out if self.inner.head is Head.LM else out.unsqueeze(-1)


class Worker:
    """Rank ``rank`` of worker group ``group`` (a Ray actor; see ``runtime.dispatch``).

    Parameters
    ----------
    group
        The group's model, layout and devices.
    rank
        This worker's rank ``d·(Pp·Pt) + p·Pt + t``.
    master
        ``host:port`` of the group's rendezvous.
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
    store
        Rank 0: the group's ``TCPStore``, already listening on a port the OS picked (``master``
        names it); other ranks connect to ``master``.
    timeout_s
        torch.distributed's rendezvous and collective timeout.
    """

    def __init__(
        self,
        group: GroupSpec,
        rank: int,
        master: str,
        shape: RunShape,
        config: RLConfig,
        seed: int,
        backend: str = "gloo",
        fail_at: tuple | None = None,
        step_offset: int = 0,
        keep_boundary: bool = False,
        *,
        store: Any = None,
        timeout_s: float = 1800.0,
    ) -> None:
        import datetime

        torch.set_num_threads(1)
        self.group, self.rank, self.shape, self.cfg, self.seed = group, rank, shape, config, seed
        self.fail_at = fail_at
        self.keep_boundary = keep_boundary
        self.boundary: dict[str, Any] | None = None
        self.step_offset = step_offset
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
        timeout = datetime.timedelta(seconds=timeout_s)
        if store is None:  # rank 0 opened the store on a port the OS picked (controller._Actor.hello)
            host, port = master.rsplit(":", 1)
            store = dist.TCPStore(host, int(port), group.size, False, timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=group.size, timeout=timeout)
        self.mesh = make_mesh(rank, group.dp, group.pp, group.tp, "cuda" if backend == "nccl" else "cpu")
        lo, hi = stage_layer_ranges(group.spec.layers, group.pp)[self.mesh.p]
        self.layer_range = (lo, hi)
        model = Transformer(
            group.spec,
            group.head,
            seed=group.seed,
            layer_range=(lo, hi),
            first=self.mesh.first,
            last=self.mesh.last,
        )
        if group.tp > 1:
            from torch.distributed.tensor.parallel import parallelize_module

            parallelize_module(model, self.mesh.tp_mesh, model.tp_plan())
        self.model = model
        self.packed = _Packed(model)
        self.version = 0
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self.optimizer = None
        if group.trains:
            lr = config.critic_lr if group.head is Head.SCALAR else config.lr
            self.optimizer = ShardedAdam(list(model.parameters()), self.mesh.dp_group, lr=lr)
        else:
            model.requires_grad_(False)
        self.task = SyntheticTask(shape.vocab, shape.prompt_len, shape.response_len, seed=seed)
        self.target = self.task.target
        self.inbox: dict[tuple, list[dict[str, torch.Tensor]]] = {}
        self.gen_state: dict[tuple[str, int], dict[str, Any]] = {}
        self.schedule = None
        self.lengths = torch.tensor(shape.response_lengths())

    # ------------------------------------------------------------------ small queries
    def info(self) -> dict[str, Any]:
        """Where this worker runs (for the trace)."""
        import socket

        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "coords": (self.mesh.d, self.mesh.p, self.mesh.t),
            "layers": self.layer_range,
            "params": sum(local(p).numel() for p in self.model.parameters()),
        }

    def _emits(self) -> bool:
        return self.mesh.last and self.mesh.t == 0

    def _check_fault(self, vertex: str, step: int) -> None:
        if self.fail_at is None or tuple(self.fail_at[:2]) != (vertex, step):
            return
        if len(self.fail_at) > 2 and self.fail_at[2] == "exit":  # the process vanishes: a lost device
            os._exit(1)
        raise RuntimeError(f"injected fault in worker {self.group.worker(self.rank)} at {vertex} step {step}")

    # ------------------------------------------------------------------ weights
    def publish(self) -> tuple[tuple[int, int], dict[str, tuple[torch.Tensor, int | None]]] | None:
        """This rank's share of the current weights (DP replica 0 only; replicated tensors from
        TP rank 0 only) as ``((p, t), publication)``, or ``None``."""
        if self.mesh.d != 0:
            return None
        return (self.mesh.p, self.mesh.t), publication(self.model, include_replicated=self.mesh.t == 0)

    def publish_version(
        self, version: int
    ) -> tuple[tuple[int, int], dict[str, tuple[torch.Tensor, int | None]]] | None:
        """Like :meth:`publish` for ``version``: the current weights or a kept snapshot (a
        transition hands the versions an asynchronous target still reads to its workers)."""
        if self.mesh.d != 0:
            return None
        if version == self.version:
            return self.publish()
        snap = self.snapshots.get(version)
        if snap is None:
            raise RuntimeError(
                f"worker {self.group.worker(self.rank)} holds version {self.version} and snapshots "
                f"{sorted(self.snapshots)} of {self.group.model}, not version {version}"
            )
        return (self.mesh.p, self.mesh.t), publication(
            self.model, include_replicated=self.mesh.t == 0, weights=snap
        )

    @torch.no_grad()
    def install_snapshot(self, pubs: list, version: int) -> dict[str, Any]:
        """Keep published weights of ``version`` as a snapshot in this rank's layout (a serving
        vertex on this training group reads it, see :meth:`op`)."""
        self.snapshots[version] = {k: t.clone() for k, t in self._shards_of(pubs, version)[0].items()}
        return {"version": version}

    def _shards_of(self, pubs: list, version: int) -> tuple[dict[str, torch.Tensor], int]:
        """This rank's shard of every tensor in the publications ``pubs`` (object refs of
        :meth:`publish` results) of ``version``, and the bytes received."""
        import ray

        got = [x for x in ray.get(list(pubs)) if x is not None]
        nbytes = sum(t.numel() * t.element_size() for _, pub in got for t, _ in pub.values())
        full = assemble([(coords[1], pub) for coords, pub in got])
        state = self.model.state_dict()
        missing = [name for name in state if name not in full]
        if missing:
            raise RuntimeError(
                f"worker {self.group.worker(self.rank)}: published weights of version {version} lack "
                f"{missing[:3]}"
            )
        return {
            name: shard_of(full[name], p, self.group.tp, self.mesh.t) for name, p in state.items()
        }, nbytes

    @torch.no_grad()
    def install(self, pubs: list, version: int) -> dict[str, Any]:
        """Install published weights of ``version`` into this rank's layout (a COMM/RESHARD node).

        ``pubs`` are object refs of :meth:`publish` results of the producing group; each rank
        fetches them, assembles the full tensors of its stage and keeps its TP shard. Returns the
        bytes received and the time spent.
        """
        t0 = time.perf_counter()
        shards, nbytes = self._shards_of(pubs, version)
        for name, p in self.model.state_dict().items():
            local(p).copy_(shards[name])
        self.version = version
        if self.optimizer is None:  # a training group prunes its own snapshots (see _train)
            self.snapshots.clear()
        return {"bytes": nbytes, "worker_time": time.perf_counter() - t0, "version": version}

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {k: local(v).detach().clone() for k, v in self.model.state_dict().items()}

    @torch.no_grad()
    def _swap(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        current = self._snapshot()
        for k, v in self.model.state_dict().items():
            local(v).copy_(weights[k])
        return current

    # ------------------------------------------------------------------ data movement
    def fetch(self, key: tuple, refs: list) -> dict[str, Any]:
        """A data COMM node: copy containers from the object store into this rank's memory."""
        import ray

        t0 = time.perf_counter()
        parts = [x for x in ray.get(list(refs)) if x is not None]
        self.inbox[key] = parts
        nbytes = sum(t.numel() * t.element_size() for part in parts for t in part.values())
        return {"bytes": nbytes, "worker_time": time.perf_counter() - t0}

    def _inputs(self, node: dict[str, Any], inputs: dict[str, list]) -> dict[str, torch.Tensor]:
        """Merge the containers of all data inputs into one batch ordered by sample id."""
        import ray

        merged: dict[str, torch.Tensor] = {}
        for src, refs in inputs.items():
            key = (node["vertex"], node["step"], src, node["phase"])
            parts = self.inbox.pop(key, None)
            if parts is None:
                parts = [x for x in ray.get(list(refs)) if x is not None]
            if not parts:
                continue
            cat = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
            order = torch.argsort(cat["ids"])
            cat = {k: v[order] for k, v in cat.items()}
            if "ids" in merged and not torch.equal(merged["ids"], cat["ids"]):
                raise RuntimeError(
                    f"inputs of {node['vertex']} step {node['step']} cover different sequences"
                )
            merged.update(cat)
        return merged

    # ------------------------------------------------------------------ pipeline plumbing
    def _stage(
        self, x: torch.Tensor | None, b: int, s: int, cache: KVCache | None = None
    ) -> torch.Tensor | None:
        """Run this stage on ``b × s`` positions; hidden states travel stage to stage by P2P.
        Returns the last stage's output (heads applied), ``None`` on other stages."""
        m = self.mesh
        if not m.first:
            x = torch.empty(b, s, self.group.spec.hidden)
            dist.recv(x, src=m.prev_rank())
        out = self.model(x, cache=cache)
        if not m.last:
            dist.send(out.contiguous(), dst=m.next_rank())
            return None
        return out

    def _my_slice(self, n: int) -> torch.Tensor:
        """Indices of this DP rank's sequences among ``n``: ``tensor_split`` into ``Pd`` parts."""
        return torch.tensor_split(torch.arange(n), self.group.dp)[self.mesh.d]

    # ------------------------------------------------------------------ OP nodes
    def op(self, node: dict[str, Any], inputs: dict[str, list]) -> tuple[dict[str, Any], Any, Any]:
        """Execute one OP node; returns ``(meta, containers or None, publication or None)``."""
        t0 = time.perf_counter()
        self._check_fault(node["vertex"], node["step"])
        role = Role(node["role"])
        version = node["version"]
        swapped = None
        if role is not Role.TRAINING and version != self.version:
            if version not in self.snapshots:
                raise RuntimeError(
                    f"worker {self.group.worker(self.rank)} holds version {self.version} of "
                    f"{self.group.model} but {node['vertex']} step {node['step']} needs {version}"
                )
            swapped = self._swap(self.snapshots[version])
        try:
            if role is Role.GENERATION:
                out, meta = self._generate(node)
            elif role is Role.INFERENCE:
                out, meta = self._infer(node, self._inputs(node, inputs))
            else:
                if version != self.version:
                    raise RuntimeError(
                        f"{node['vertex']} step {node['step']} must train version {version}, "
                        f"worker {self.group.worker(self.rank)} holds {self.version}"
                    )
                out, meta = self._train(node, self._inputs(node, inputs))
        finally:
            if swapped is not None:
                self._swap(swapped)
        pub = self.publish() if node.get("publish") and role is Role.TRAINING else None
        meta["worker_time"] = time.perf_counter() - t0
        meta["version_used"] = version if role is not Role.TRAINING else meta["version"] - 1
        return meta, (out if self._emits() else None), pub

    @torch.no_grad()
    def _generate(self, node: dict[str, Any]) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
        sh, step = self.shape, node["step"]
        gstep = step + self.step_offset
        key = (node["vertex"], step)
        phase = node["phase"]
        if phase <= 1:
            n = sh.sequences
            mine = self._my_slice(n)
            prompts = self.task.prompts(gstep, sh.batch).repeat_interleave(sh.rollouts, dim=0)[mine]
            ids = gstep * n + mine
            tokens = torch.zeros(len(mine), sh.prompt_len + sh.response_len, dtype=torch.int64)
            tokens[:, : sh.prompt_len] = prompts
            chunks = [c for c in torch.tensor_split(torch.arange(len(mine)), self.group.mb) if len(c)]
            self.gen_state[key] = {
                "ids": ids,
                "mine": mine,
                "tokens": tokens,
                "logp": torch.zeros(len(mine), sh.response_len),
                "chunks": chunks,
                "caches": [KVCache() for _ in chunks],
                "pos": 0,
            }
        st = self.gen_state[key]
        hi = sh.phase_lengths[phase - 1] if phase > 0 else sh.response_len
        lo = st["pos"]
        Lp = sh.prompt_len
        for t in range(lo, hi):
            for c, cache in zip(st["chunks"], st["caches"]):
                b = len(c)
                x = st["tokens"][c, :Lp] if t == 0 else st["tokens"][c, Lp + t - 1 : Lp + t]
                out = self._stage(x if self.mesh.first else None, b, Lp if t == 0 else 1, cache)
                tok = torch.empty(b, dtype=torch.int64)
                if self.mesh.last:
                    logits = out[0] if isinstance(out, tuple) else out
                    tok, lp = sample_token(logits[:, -1], self.seed, st["ids"][c], t, self.cfg.temperature)
                    st["logp"][c, t] = lp
                    if self.group.pp > 1:
                        dist.send(tok, dst=self.mesh.first_rank())
                elif self.mesh.first:
                    dist.recv(tok, src=self.mesh.last_rank())
                if self.mesh.first or self.mesh.last:
                    st["tokens"][c, Lp + t] = tok
        st["pos"] = hi
        lengths = self.lengths[st["mine"]]
        done = (lengths == hi) if phase > 0 else torch.ones(len(st["mine"]), dtype=torch.bool)
        if phase == 0 or hi == sh.response_len:
            del self.gen_state[key]
        mask = (torch.arange(sh.response_len)[None, :] < lengths[done][:, None]).float()
        tokens = st["tokens"][done].clone()
        tokens[:, Lp:] *= mask.long()
        out = {"ids": st["ids"][done], "tokens": tokens, "logp": st["logp"][done] * mask, "mask": mask}
        return out, {"sequences": int(done.sum())}

    @torch.no_grad()
    def _infer(
        self, node: dict[str, Any], batch: dict[str, torch.Tensor]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        sh = self.shape
        Lp, Lr = sh.prompt_len, sh.response_len
        sl = response_slice(Lp, Lr)
        n = len(batch["ids"])
        mine = self._my_slice(n)
        tokens, mask = batch["tokens"][mine], batch["mask"][mine]
        results: list[torch.Tensor] = []
        meta: dict[str, Any] = {"sequences": len(mine)}
        for c in torch.tensor_split(torch.arange(len(mine)), self.group.mb):
            if not len(c):
                continue
            out = self._stage(tokens[c] if self.mesh.first else None, len(c), Lp + Lr)
            if out is None:
                continue
            logits = out[0] if isinstance(out, tuple) else (out if self.group.head is Head.LM else None)
            values = out[1] if isinstance(out, tuple) else (out if self.group.head is Head.SCALAR else None)
            kind = node["output"]
            if kind == "ref_logp" or kind == "logp":
                assert logits is not None
                lp = token_logprobs(logits[:, sl] / self.cfg.temperature, tokens[c][:, Lp : Lp + Lr])
                results.append(lp * mask[c])
            elif kind == "values":
                assert values is not None
                results.append(values[:, sl] * mask[c])
            else:  # rewards: reward-model score at the last valid token, and the task's reward
                assert values is not None
                last = Lp - 1 + mask[c].sum(dim=1).long()
                results.append(values[torch.arange(len(c)), last])
        if not self._emits():
            return {}, meta
        ids = batch["ids"][mine]
        if node["output"] == "rewards":
            resp = tokens[:, Lp:]
            hits = self.target[resp].float() * mask
            score = hits.sum(dim=1) / mask.sum(dim=1).clamp(min=1)
            rm = torch.cat(results) if results else torch.zeros(0)
            meta.update(reward_sum=float(score.sum()), reward_count=len(score))
            return {"ids": ids, "rewards": score, "rm_score": rm}, meta
        return {"ids": ids, node["output"]: torch.cat(results) if results else torch.zeros(0, Lr)}, meta

    def _train(self, node: dict[str, Any], batch: dict[str, torch.Tensor]) -> tuple[None, dict[str, Any]]:
        sh, cfg = self.shape, self.cfg
        Lp, Lr = sh.prompt_len, sh.response_len
        n = len(batch["ids"])
        mask = batch["mask"]
        head = self.group.head
        want_policy = head in (Head.LM, Head.BOTH)
        want_value = head in (Head.SCALAR, Head.BOTH)
        pack = torch.zeros(n, Lr, 7)
        pack[..., _TOK] = batch["tokens"][:, Lp:].float()
        pack[..., _MASK] = mask
        if node["algorithm"] == "grpo":
            adv = grpo_advantages(batch["rewards"], sh.rollouts)[:, None].expand(n, Lr)
            pack[..., _ADV] = adv
            pack[..., _OLD] = batch["logp"]
            pack[..., _REF] = batch["ref_logp"]
        else:
            if "logp" in batch and "ref_logp" in batch:
                rewards = token_rewards(batch["rewards"], batch["logp"], batch["ref_logp"], mask, cfg.kl_coef)
            else:  # critic_train: the PPO graph routes it no log-probs, so it regresses on the task reward
                zero = torch.zeros_like(mask)
                rewards = token_rewards(batch["rewards"], zero, zero, mask, 0.0)
            adv, ret = gae(rewards, batch["values"], mask, cfg.gamma, cfg.lam)
            pack[..., _ADV] = adv
            pack[..., _RET] = ret
            pack[..., _VAL] = batch["values"]
            if "logp" in batch:
                pack[..., _OLD] = batch["logp"]
        total = float(mask.sum())
        algorithm = node["algorithm"]
        V = self.group.spec.vocab
        sl = response_slice(Lp, Lr)

        def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            m = target[..., _MASK]
            loss = output.new_zeros(())
            if want_policy:
                logits = output[:, sl, :V]
                lp = token_logprobs(logits / cfg.temperature, target[..., _TOK].long())
                p_sum, _ = policy_loss(lp, target[..., _OLD], target[..., _ADV], m, cfg.clip)
                loss = loss + p_sum
                if algorithm == "grpo":
                    loss = loss + kl_loss(lp, target[..., _REF], m, cfg.kl_coef)[0]
            if want_value:
                values = output[:, sl, -1]
                v_sum, _ = value_loss(values, target[..., _RET], m, target[..., _VAL], cfg.value_clip)
                loss = loss + v_sum
            return loss / total

        mine = self._my_slice(n)
        tokens, target = batch["tokens"][mine], pack[mine]
        losses: list[torch.Tensor] = []
        if self.group.pp == 1:
            for c in torch.tensor_split(torch.arange(len(mine)), self.group.mb):
                if len(c):
                    loss = loss_fn(self.packed(tokens[c]), target[c])
                    loss.backward()
                    losses.append(loss.detach())
        else:
            if self.schedule is None:
                from torch.distributed.pipelining import PipelineStage, Schedule1F1B

                stage = PipelineStage(
                    self.packed, self.mesh.p, self.group.pp, torch.device("cpu"), group=self.mesh.pp_group
                )
                self.schedule = Schedule1F1B(
                    stage, n_microbatches=self.group.mb, loss_fn=loss_fn, scale_grads=False
                )
            self.schedule._loss_fn = loss_fn  # this step's normaliser and batch
            if self.mesh.first:
                self.schedule.step(tokens)
            elif self.mesh.last:
                self.schedule.step(target=target, losses=losses)
            else:
                self.schedule.step()
        assert self.optimizer is not None
        old = self._snapshot() if node.get("keep_previous") else None
        if self.keep_boundary:
            self.boundary = {
                "version": self.version,
                "params": old if old is not None else self._snapshot(),
                "optimizer": self.optimizer.state(),
                "snapshots": dict(self.snapshots),
            }
        self.optimizer.step()
        if old is not None:
            self.snapshots[self.version] = old
            for v in [
                v for v in self.snapshots if v < self.version + 1 - node.get("keep", node.get("tau", 0))
            ]:
                del self.snapshots[v]
        self.version += 1
        meta: dict[str, Any] = {"loss": float(sum(losses)) if losses else None, "version": self.version}
        if node.get("save"):
            os.makedirs(node["save"], exist_ok=True)
            name = f"g{self.group.gid}-r{self.rank}.pt"
            path = self.save(os.path.join(node["save"], name))
            from .checkpoint import file_digest

            meta["checkpoint"] = {"name": name, **file_digest(path)}
        return None, meta

    @torch.no_grad()
    def rollback(self, step: int) -> int:
        """Return to the boundary before ``step`` (segment-local) after a failure mid-step: drop
        in-flight data and gradients; a training worker that already applied the update of
        ``step`` restores its parameters and optimizer slice from before it. Returns the version
        held afterwards.

        Raises
        ------
        RuntimeError
            If the worker is past ``step + 1`` or has no boundary copy to return to.
        """
        self.inbox.clear()
        self.gen_state.clear()
        for p in self.model.parameters():
            p.grad = None
        if self.optimizer is not None and self.version == step + 1:
            b = self.boundary
            if b is None or b["version"] != step:
                raise RuntimeError(
                    f"worker {self.group.worker(self.rank)} applied step {step}'s update and keeps no copy "
                    "from before it (run with worker-loss recovery to keep one)"
                )
            for k, v in self.model.state_dict().items():
                local(v).copy_(b["params"][k])
            self.optimizer.load_state(b["optimizer"])
            self.snapshots = dict(b["snapshots"])
            self.version = step
        elif self.optimizer is not None and self.version != step:
            raise RuntimeError(
                f"worker {self.group.worker(self.rank)} holds version {self.version}; the boundary before "
                f"step {step} needs {step}"
            )
        return self.version

    # ------------------------------------------------------------------ transitions (SPEC §10)
    def xfer_host(self, world: int, timeout_s: float = 1800.0) -> str:
        """Open the transition group's store for ``world`` ranks on a port the OS picks (port 0:
        no pick-then-bind race); returns its ``host:port``. Called on the rank-0 worker first."""
        import datetime

        import ray

        host = ray.util.get_node_ip_address()
        timeout = datetime.timedelta(seconds=timeout_s)
        self.xstore = dist.TCPStore(host, 0, world, True, timeout, wait_for_workers=False)
        return f"{host}:{self.xstore.port}"

    def xfer_join(self, master: str, rank: int, world: int, timeout_s: float = 1800.0) -> None:
        """Join the transition's process group: every worker of the current and the target plan,
        a standalone gloo group beside this worker's own (``rank`` 0 hosts the store, opened by
        :meth:`xfer_host`)."""
        import datetime

        timeout = datetime.timedelta(seconds=timeout_s)
        if rank == 0:
            store = self.xstore
        else:
            host, port = master.rsplit(":", 1)
            store = dist.TCPStore(host, int(port), world, False, timeout)
        self.xpg = dist.ProcessGroupGloo(dist.PrefixStore("xfer", store), rank, world, timeout)
        self.xrank = rank
        self.units: dict[tuple, Any] = {}

    @torch.no_grad()
    def xfer_export(self, cells: list[tuple[Any, str, int, bool]]) -> dict[str, Any]:
        """Hand this rank's state to the transition as EMU cells ``(unit key, vertex, rank,
        with optimizer)``.

        Parameters come from the model; for a training vertex the ZeRO slices of the Adam moments
        are first all-gathered over the DP group (every rank of a replica then holds its cell's
        full moments, SPEC §10's unsharded EMU optimizer state). Must be called on every rank of
        the group at once (the gather is a collective).
        """
        from .state import CellState

        t0 = time.perf_counter()
        moments = None
        if self.optimizer is not None:
            moments = self._full_moments()
        params = self._snapshot()
        for key, vertex, i, trains in cells:
            mine = self.mesh.p * self.group.tp + self.mesh.t
            if i != mine or vertex not in self.group.vertices:
                raise RuntimeError(
                    f"worker {self.group.worker(self.rank)} holds cell {mine} of {self.group.vertices}, "
                    f"asked for cell {i} of {vertex!r}"
                )
            if trains and moments is None:
                raise RuntimeError(
                    f"worker {self.group.worker(self.rank)} trains nothing but {vertex!r} does"
                )
            cell = CellState(dict(params), step=self.optimizer.t if trains and self.optimizer else 0)
            if trains:
                assert moments is not None
                cell.m, cell.v = moments
            self.units[(key, i)] = cell
        return {"worker_time": time.perf_counter() - t0, "bytes": sum(c.nbytes for c in self.units.values())}

    def _full_moments(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Adam moments of this rank's whole local parameters, by name (AllGather of the ZeRO
        slices over the DP group)."""
        assert self.optimizer is not None
        flats = self.optimizer.full_moments()
        out: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] = ({}, {})
        off = 0
        for name, p in self.model.named_parameters():
            lp = local(p)
            k = lp.numel()
            for d, flat in zip(out, flats):
                d[name] = flat[off : off + k].view_as(lp).clone()
            off += k
        return out

    @torch.no_grad()
    def xfer_run(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
        """Execute this worker's part of one primitive: assemble target cells from source cells.

        Each entry names a target cell (``dst`` key, its holder, its parameter names) and per
        source rank the holder, the source cell and the pieces (:class:`~rpeg.runtime.state.Piece`)
        with their shapes. This worker sends the pieces it holds to other holders, receives the
        pieces its own target cells need (gloo point-to-point, all posted before any wait) and
        assembles its cells. Returns bytes sent/received and the time spent.
        """
        from .state import CellState, assemble_cell

        t0 = time.perf_counter()
        works, recvs, sent, got = [], [], 0, 0
        staged: dict[int, dict[int, CellState]] = {}
        for n, e in enumerate(entries):
            mine_dst = e["holder"] == self.xrank
            for r, src in e["sources"].items():
                if src["holder"] == self.xrank:
                    cell = self.units[tuple(src["key"])]
                    if e["moments"] and cell.m is None:
                        raise RuntimeError(f"cell {src['key']} holds no optimizer state for {e['key']}")
                    parts = cell.tensors(src["pieces"])
                    if not e["moments"]:  # the target keeps parameters only
                        parts = parts[: len(src["pieces"])]
                    if mine_dst:
                        staged.setdefault(n, {})[r] = _sliced(cell, src["pieces"], parts, e["moments"])
                    else:
                        flat = torch.cat([t.reshape(-1) for t in parts] + [torch.tensor([float(cell.step)])])
                        works.append(self.xpg.send([flat], e["holder"], src["tag"]))
                        sent += flat.numel() * flat.element_size()
                elif mine_dst:
                    numel = sum(math.prod(s) for s in src["shapes"]) * (3 if e["moments"] else 1) + 1
                    buf = torch.empty(numel)
                    works.append(self.xpg.recv([buf], src["holder"], src["tag"]))
                    recvs.append((n, r, src, buf))
                    got += buf.numel() * buf.element_size()
        for w in works:
            w.wait()
        for n, r, src, buf in recvs:
            staged.setdefault(n, {})[r] = _unpack(buf, src["pieces"], src["shapes"], entries[n]["moments"])
        for n, e in enumerate(entries):
            if e["holder"] == self.xrank:
                cell = assemble_cell(
                    e["names"], staged.get(n, {}), {r: s["pieces"] for r, s in e["sources"].items()}
                )
                if not e["moments"]:
                    cell.m = cell.v = None
                self.units[tuple(e["key"])] = cell
        return {"sent": sent, "received": got, "worker_time": time.perf_counter() - t0}

    def xfer_drop(self, keys: list[tuple]) -> int:
        """Destroy: forget cells; returns the bytes freed."""
        freed = 0
        for k in keys:
            cell = self.units.pop(tuple(k), None)
            freed += cell.nbytes if cell is not None else 0
        return freed

    @torch.no_grad()
    def xfer_adopt(self, keys: dict[str, Any]) -> dict[str, Any]:
        """Load this worker's model (and optimizer slice) from the cells the transition built for
        it: ``keys["cells"]`` maps each vertex it serves to a unit key, ``keys["train"]`` names the
        training vertex (or is ``None``). Every vertex must bring identical parameters (copies of
        one version). Leaves the transition group."""
        i = self.mesh.p * self.group.tp + self.mesh.t
        cells = {v: self.units.pop((tuple(k), i)) for v, k in keys["cells"].items()}
        train = keys["train"]
        main = cells[train] if train in cells else next(iter(cells.values()))
        for v, c in cells.items():
            for name, t in c.params.items():
                if not torch.equal(t, main.params[name]):
                    raise RuntimeError(
                        f"worker {self.group.worker(self.rank)}: vertex {v!r} brings parameter {name!r} "
                        f"different from {train or 'the group'}'s copy (versions out of sync)"
                    )
        state = self.model.state_dict()
        if set(state) != set(main.params):
            raise RuntimeError(
                f"worker {self.group.worker(self.rank)}: transition cell holds {sorted(main.params)[:3]}…, "
                f"the model needs {sorted(state)[:3]}…"
            )
        for name, p in state.items():
            src = main.params[name]
            if tuple(src.shape) != tuple(local(p).shape):
                raise RuntimeError(
                    f"worker {self.group.worker(self.rank)}: {name!r} arrives as {tuple(src.shape)}, "
                    f"the layout needs {tuple(local(p).shape)}"
                )
            local(p).copy_(src)
        if self.optimizer is not None:
            if main.m is None or main.v is None:
                raise RuntimeError(f"worker {self.group.worker(self.rank)}: no optimizer state arrived")
            names = [n for n, _ in self.model.named_parameters()]
            self.optimizer.load_full_moments(
                torch.cat([main.m[n].reshape(-1) for n in names]),
                torch.cat([main.v[n].reshape(-1) for n in names]),
                main.step,
            )
        self.units.clear()
        self.xpg = self.xstore = None
        return {"step": main.step}

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str) -> str:
        """Write this rank's parameters, optimizer slice and version to ``path`` (a file; written
        to a temporary name first and renamed, so a crash never leaves a truncated file)."""
        state = {
            "params": self._snapshot(),
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
        for k, v in self.model.state_dict().items():
            local(v).copy_(state["params"][k])
        if self.optimizer and state["optimizer"] is not None:
            self.optimizer.load_state(state["optimizer"])
        self.version = 0
        return int(state["version"])

    def shutdown(self) -> None:
        """Leave the process group."""
        if dist.is_initialized():
            dist.destroy_process_group()


def _sliced(cell: Any, pieces: list, parts: list[torch.Tensor], moments: bool) -> Any:
    """The pieces of a local cell as a cell of their own (views, no copy)."""
    from .state import CellState

    k = len(pieces)
    out = CellState({pc.name: parts[j] for j, pc in enumerate(pieces)}, step=cell.step)
    if moments:
        out.m = {pc.name: parts[k + j] for j, pc in enumerate(pieces)}
        out.v = {pc.name: parts[2 * k + j] for j, pc in enumerate(pieces)}
    return out


def _unpack(buf: torch.Tensor, pieces: list, shapes: list, moments: bool) -> Any:
    """Inverse of the sender's packing: parameters, then ``m``, then ``v``, then the counter."""
    from .state import CellState

    groups, off = [], 0
    for _ in range(3 if moments else 1):
        d = {}
        for pc, shape in zip(pieces, shapes):
            n = math.prod(shape)
            d[pc.name] = buf[off : off + n].view(shape)
            off += n
        groups.append(d)
    cell = CellState(groups[0], step=int(buf[off].item()))
    if moments:
        cell.m, cell.v = groups[1], groups[2]
    return cell

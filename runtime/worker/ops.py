"""A worker's model invocations: the OP nodes of generation, inference and training (SPEC §11).

Execution per role (``B'·R'`` sequences of one step, global order = sample id):

* generation: prefill the prompt, then one token per decode position, microbatch by microbatch,
  stage by stage (``send``/``recv`` of hidden states between stages; the last stage samples with
  layout-independent Gumbel noise and sends the token back to the first). A response-length
  phase ``q`` decodes positions ``t_{q−1}..t_q − 1`` and emits the sequences that end there.
  With a rule reward (``reward = "rule"``, SPEC §14.8) it also emits each sequence's task reward
  (:func:`rule_reward`) as ``rewards``; with ``old_logprob = "trainer"`` it emits no log-probs
  (the ``actor_logp`` inference computes them).
* inference: teacher-forced forward, microbatched; reference or actor (``actor_logp``, DPO's
  ``actor_inf``) → log-probs, critic → values, reward → reward-model score plus the task's
  verifiable reward (the score the RL update uses: a randomly initialised reward model carries
  no signal). ReMax's reward inference also scores each sequence's greedy rollout (same sample
  id, inputs prefixed ``greedy_``) and emits its reward as the ``baseline``. DPO's inferences
  (reference and actor log-probs) build the step's preference pairs from the task themselves:
  the pairs are a graph input, like the prompts.
* training: advantages over the whole step's batch (PPO: KL-shaped rewards and GAE γ = 1,
  λ = 0.95; GRPO: group-relative; ReMax: reward minus the greedy baseline, REINFORCE loss; DPO:
  the per-sequence split of ``−log σ(β·margin)`` with the partner's log-ratio from the actor's
  inference; without a reference, ``kl_coef = 0``, no KL term), then ``U`` updates
  (``mini_batches``, SPEC §14.2), each over a contiguous mini-batch of the step's samples: this
  rank's DP slice of it in ``⌈mb/U⌉`` microbatches — with ``torch.distributed.pipelining``'s
  1F1B schedule when ``Pp > 1`` — losses divided by the mini-batch's global token count (DPO:
  pair count), then one Adam step (FSDP2 when ``Pd > 1``). The version counts RL steps: it
  moves once per training node, whatever ``U``.

:class:`WorkerOps` is a part of :class:`~rpeg.runtime.worker.core.Worker`, which owns the state it
uses (model, mesh, optimizer, task, version and snapshots).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ...ir.types import Head, Role
from ..binding import GroupSpec, RunShape, mini_batch_bounds, update_microbatches
from ..config import RLConfig
from ..protocol import NodeCall
from .memory import WorkerMemory, heap_live_bytes
from .model import KVCache, StageModel, in_token_chunks, token_logprobs
from .parallel import FSDPAdam, FSDPShards
from .rl import (
    behavior_weight,
    dpo_batch,
    dpo_margins,
    dpo_sequence_loss,
    gae,
    grpo_advantages,
    kl_loss,
    policy_loss,
    reinforce_loss,
    remax_advantages,
    response_slice,
    sequence_logratio,
    token_rewards,
    value_loss,
)
from .rollouts import Rollouts
from .task import SyntheticTask

__all__ = ["PackedOutput", "WorkerOps", "rule_reward"]

# columns of the packed per-token training target (pipelining passes one tensor to the loss)
_TOK, _OLD, _ADV, _MASK, _REF, _RET, _VAL = range(7)


def rule_reward(
    target: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor, prompt_len: int
) -> torch.Tensor:
    """The synthetic task's rule (:class:`~rpeg.runtime.worker.task.SyntheticTask`) of each sequence: the
    fraction of its valid response tokens in the target set.

    Parameters
    ----------
    target
        ``[V]`` bool membership of every token in the target set (``SyntheticTask.target``).
    tokens
        ``[n, Lp + Lr]`` prompts and responses.
    mask
        ``[n, Lr]`` valid response tokens.
    prompt_len
        ``Lp``.

    Returns
    -------
    torch.Tensor
        ``[n]`` float rewards in ``[0, 1]`` (0 for an empty response).
    """
    hits = target[tokens[:, prompt_len:]].float() * mask
    return hits.sum(dim=1) / mask.sum(dim=1).clamp(min=1)


class PackedOutput(torch.nn.Module):
    """Last-stage wrapper whose output is one tensor: logits ``[b,s,V]``, values ``[b,s,1]``, or
    both concatenated (``BOTH``) — the form ``torch.distributed.pipelining`` passes to the loss.
    With :attr:`hidden` set (a chunked training loss, SPEC §14.6) the last stage returns its
    hidden states ``[b,s,d]`` instead and the loss applies the heads (:meth:`WorkerOps._loss_fn`)."""

    def __init__(self, inner: StageModel) -> None:
        super().__init__()
        self.inner = inner
        self.hidden = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.hidden:
            return self.inner(x, heads=False)
        out = self.inner(x)
        if not self.inner.last:
            return out
        if isinstance(out, tuple):
            return torch.cat([out[0], out[1].unsqueeze(-1)], dim=-1)
        return out if self.inner.head is Head.LM else out.unsqueeze(-1)


class WorkerOps:
    """OP nodes of one rank (:meth:`op`) and the pipeline plumbing they share.

    Uses the :class:`~rpeg.runtime.worker.core.Worker`'s state below, its ``_check_fault`` and
    ``_emits``, the transfers' ``_inputs`` and ``publish`` and the checkpoints' ``_snapshot``,
    ``_keep_boundary``, ``full_weights`` and ``save``.
    """

    group: GroupSpec
    rank: int
    shape: RunShape
    cfg: RLConfig
    seed: int
    step_offset: int
    memory: WorkerMemory
    mesh: Any
    model: StageModel
    packed: PackedOutput
    optimizer: FSDPAdam | None
    sharding: FSDPShards | None
    task: SyntheticTask
    target: torch.Tensor
    gen_state: dict[tuple[str, int], dict[str, Any]]
    schedule: Any
    lengths: torch.Tensor
    snapshots: dict[int, dict[str, torch.Tensor]]
    version: int
    mid_update: bool
    metadata_probe: bool
    rollouts: Rollouts
    _write_weights: Callable[..., None]
    full_weights: Callable[[], contextlib.AbstractContextManager[None]]

    # ------------------------------------------------------------------ pipeline plumbing
    def _stage(
        self, x: torch.Tensor | None, b: int, s: int, cache: KVCache | None = None, *, heads: bool = True
    ) -> torch.Tensor | None:
        """Run this stage on ``b × s`` positions; hidden states travel stage to stage by P2P.
        Returns the last stage's output (heads applied; its hidden states before the final norm
        with ``heads=False``), ``None`` on other stages. With context parallelism (``Pc > 1``, one
        stage, no cache: a log-prob or value pass) every CP rank computes its positions and one
        AllReduce over the CP group gives each the whole output (the others' positions are zeros,
        so the sum is exact)."""
        m = self.mesh
        if m.cp > 1:  # one stage: each CP rank computes its positions, the sum is the whole output
            out = self.model(x, heads=heads)
            for t in out if isinstance(out, tuple) else (out,):
                dist.all_reduce(t, group=m.cp_group)
            return out
        if not m.first:
            x = torch.empty(b, s, self.group.spec.hidden)
            dist.recv(x, group=m.group, group_src=m.prev_rank())
        if m.last and not heads:
            return self.model(x, cache=cache, heads=False)
        out = self.model(x, cache=cache)
        if not m.last:
            dist.send(out.contiguous(), group=m.group, group_dst=m.next_rank())
            return None
        return out

    def _chunked_logprobs(
        self, hidden: torch.Tensor, tokens: torch.Tensor, sl: slice, chunk: int
    ) -> torch.Tensor:
        """Log-probs of the response tokens from the last stage's ``hidden`` states with the
        head applied to ``chunk`` tokens of the microbatch at a time (a chunked loss, SPEC §14.6:
        ``c·V`` logits at once), and only to the response positions'."""
        Lp, Lr = self.shape.prompt_len, self.shape.response_len
        T = self.cfg.temperature

        def head(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (token_logprobs(self.model.heads(h), t, temperature=T),)

        # position p predicts token p + 1: the response tokens Lp … Lp + Lr − 1
        return in_token_chunks(head, hidden[:, sl], tokens[:, Lp : Lp + Lr], chunk)[0]

    def _my_slice(self, n: int) -> torch.Tensor:
        """Indices of this DP rank's sequences among ``n``: every ``Pd``-th from its DP rank
        ``d`` (``d, d + Pd, d + 2·Pd, …``; ``⌈n/Pd⌉`` or ``⌊n/Pd⌋`` of them). The context-parallel
        ranks of a DP rank share its sequences (:attr:`~rpeg.runtime.worker.parallel.Mesh.data_rank`).

        Strided, not contiguous: a step's sequences are indexed by response length (shortest
        first, :meth:`RunShape.response_lengths`), so contiguous blocks gave the last DP rank every
        long response — its replica generated 1.9–2.9× longer than the first — where the cost
        model splits each length phase evenly over the ``Pd`` ranks."""
        return torch.arange(self.mesh.data_rank, n, self.group.dp)

    # ------------------------------------------------------------------ OP nodes
    def op(self, node: NodeCall, inputs: dict[str, list]) -> tuple[dict[str, Any], Any, Any]:
        """Execute one OP node; returns ``(meta, containers or None, publication or None)``."""
        t0 = time.perf_counter()
        self._check_fault(node.vertex, node.step)
        role = node.role
        version = node.version
        swapped = None
        if role is not Role.TRAINING and version != self.version:
            if version not in self.snapshots:
                raise RuntimeError(
                    f"worker {self.group.worker(self.rank)} holds version {self.version} of "
                    f"{self.group.model} but {node.vertex} step {node.step} needs {version}"
                )
            swapped = self._swap(self.snapshots[version])
        try:
            if role is Role.GENERATION:
                out, meta = self._generate(node)
                out = self._rollout_outputs(node, out, meta)
            elif role is Role.INFERENCE:
                out, meta = self._infer(node, self._inputs(node, inputs))
            else:
                if version != self.version:
                    raise RuntimeError(
                        f"{node.vertex} step {node.step} must train version {version}, "
                        f"worker {self.group.worker(self.rank)} holds {self.version}"
                    )
                out, meta = self._train(node, self._inputs(node, inputs))
        finally:
            if swapped is not None:
                self._swap(swapped)
        t_pub = time.perf_counter()
        publishes = node.publish and role is Role.TRAINING
        pub = self.publish(keep=node.publish_in_place) if publishes else None
        meta["publish_s"] = time.perf_counter() - t_pub if publishes else 0.0
        meta["worker_time"] = time.perf_counter() - t0
        meta["version_used"] = version if role is not Role.TRAINING else meta["version"] - 1
        meta["memory_bytes"] = max(0, self.memory.peak())
        if heap_live_bytes():  # 0 where the C library has no mallinfo2: nothing to report
            meta["memory_live_bytes"] = max(0, self.memory.live_peak())
        return meta, (out if self._emits() else None), pub

    @torch.no_grad()
    def _swap(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        current = self._snapshot()
        self._write_weights(weights, master=False)  # serving only: the trained version stays put
        return current

    def _temperature(self, node: NodeCall) -> float:
        """Sampling temperature of a generation node: 0 (greedy) for a node marked ``greedy``
        (ReMax's baseline rollout), the run's ``temperature`` otherwise."""
        return 0.0 if node.greedy else self.cfg.temperature

    def _rollout_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This DP rank's rollouts of ``step``: global sample ids ``k·n + i`` (``n = B'·R'``, ``k``
        the global step), their indices ``i`` among the step's ``n`` and their prompts (prompt
        ``i // R'`` of the task's step batch)."""
        sh = self.shape
        gstep = step + self.step_offset
        mine = self._my_slice(sh.sequences)
        prompts = self.task.prompts(gstep, sh.batch).repeat_interleave(sh.rollouts, dim=0)[mine]
        return gstep * sh.sequences + mine, mine, prompts

    def _phase_end(self, phase: int) -> int:
        """Response position ``t_q`` where phase ``q`` ends (``Lr`` for an unsplit node)."""
        return self.shape.phase_lengths[phase - 1] if phase > 0 else self.shape.response_len

    def _ends_in_phase(self, phase: int, lengths: torch.Tensor) -> torch.Tensor:
        """Which sequences of response ``lengths`` a node of ``phase`` emits: those ending at
        ``t_q`` (every one for an unsplit node)."""
        if phase == 0:
            return torch.ones(len(lengths), dtype=torch.bool)
        return lengths == self._phase_end(phase)

    def _rollout_outputs(
        self, node: NodeCall, out: dict[str, torch.Tensor] | None, meta: dict[str, Any]
    ) -> dict[str, torch.Tensor] | None:
        """What a generation node emits (SPEC §14.8): without its log-prob output (``gen_logp``
        false: the ``actor_logp`` inference computes them, or ReMax's greedy rollout) no ``logp``;
        with a rule reward each sequence's task reward as ``rewards``, computed on the rank that
        emits. The sampled generation's emitting rank also reports ``reward_sum`` and
        ``reward_count`` (the step's reward metric: every sampled sequence counted once; the
        greedy baseline's rewards are not)."""
        if out is None or not self._emits():
            return out
        if not node.gen_logp:
            out = {k: v for k, v in out.items() if k != "logp"}
        if node.reward == "rule":
            score = rule_reward(self.target, out["tokens"], out["mask"], self.shape.prompt_len)
            out = {**out, "rewards": score}
            if not node.greedy:
                meta.update(reward_sum=float(score.sum()), reward_count=len(score))
        return out

    def _generate(self, node: NodeCall) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
        """One generation node on the rank's rollout engine (:mod:`~rpeg.runtime.worker.rollouts`)."""
        return self.rollouts.generate(node, self._temperature(node))

    @torch.no_grad()
    def _infer(self, node: NodeCall, batch: dict[str, torch.Tensor]) -> tuple[dict[str, Any], dict[str, Any]]:
        """One inference node over this rank's DP slice of the batch, in ``mb`` microbatches:
        log-probs, values, or rewards (task reward and reward-model score; ReMax adds the greedy
        rollout's as ``baseline`` and ``rm_baseline``). DPO builds its batch, the step's
        preference pairs (:func:`~rpeg.runtime.worker.rl.dpo_batch`), itself."""
        sh = self.shape
        Lp, Lr = sh.prompt_len, sh.response_len
        sl = response_slice(Lp, Lr)
        kind = node.output
        if node.algorithm == "dpo":  # offline: the preference pairs are a graph input, built here
            batch = dpo_batch(self.task, node.step + self.step_offset, sh.batch)
        if "greedy_ids" in batch:  # ReMax: score the sampled sequences whose greedy rollout is here
            # (a phase node may get one generation's phase and the other's whole step)
            keep = torch.isin(batch["ids"], batch["greedy_ids"])
            batch = {k: v if k.startswith("greedy_") else v[keep] for k, v in batch.items()}
        n = len(batch["ids"])
        mine = self._my_slice(n)
        tokens, mask = batch["tokens"][mine], batch["mask"][mine]
        meta: dict[str, Any] = {"sequences": len(mine)}

        mb = self.group.mb if node.mb is None else node.mb  # the vertex's microbatches (SPEC §14.2)
        chunk = node.logits_chunk  # a chunked loss (SPEC §14.6)
        chunked = chunk > 0 and kind in ("ref_logp", "logp") and self.group.head is Head.LM

        # ZeRO-3 gathers each layer in every forward (collectives over the DP group): every rank
        # runs all mb passes, an empty microbatch as a one-sequence pass whose output is dropped;
        # so do expert-parallel ranks, which exchange tokens in every MoE layer (AlltoAll)
        gathers = (self.sharding is not None and self.sharding.resharded) or self.mesh.ep > 1

        def forward(tokens: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
            results: list[torch.Tensor] = []
            for c in torch.tensor_split(torch.arange(len(tokens)), mb):
                if not len(c):
                    if gathers:
                        self._stage(
                            torch.zeros(1, Lp + Lr, dtype=torch.long) if self.mesh.first else None,
                            1,
                            Lp + Lr,
                            heads=not chunked,
                        )
                    continue
                if chunked:  # the head over `chunk` response tokens at a time
                    hidden = self._stage(tokens[c] if self.mesh.first else None, len(c), Lp + Lr, heads=False)
                    if hidden is not None:
                        results.append(self._chunked_logprobs(hidden, tokens[c], sl, chunk) * mask[c])
                    continue
                out = self._stage(tokens[c] if self.mesh.first else None, len(c), Lp + Lr)
                if out is None:
                    continue
                head = self.group.head
                logits = out[0] if isinstance(out, tuple) else (out if head is Head.LM else None)
                values = out[1] if isinstance(out, tuple) else (out if head is Head.SCALAR else None)
                if kind == "ref_logp" or kind == "logp":
                    assert logits is not None
                    lp = token_logprobs(
                        logits[:, sl], tokens[c][:, Lp : Lp + Lr], temperature=self.cfg.temperature
                    )
                    results.append(lp * mask[c])
                elif kind == "values":
                    assert values is not None
                    results.append(values[:, sl] * mask[c])
                else:  # rewards: reward-model score at the last valid token, and the task's reward
                    assert values is not None
                    last = Lp - 1 + mask[c].sum(dim=1).long()
                    results.append(values[torch.arange(len(c)), last])
            return results

        def task_reward(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return rule_reward(self.target, tokens, mask, Lp)

        results = forward(tokens, mask)
        greedy = None
        if kind == "rewards" and "greedy_ids" in batch:
            # ReMax: the reward model also scores the greedy rollout of each of this rank's
            # sequences: the one with the same sample id (greedy decoding draws no noise, so it is
            # the greedy response of the sequence's prompt, cut at the sequence's response length)
            pos = torch.searchsorted(batch["greedy_ids"], batch["ids"][mine])
            g_tokens, g_mask = batch["greedy_tokens"][pos], batch["greedy_mask"][pos]
            greedy = (forward(g_tokens, g_mask), task_reward(g_tokens, g_mask))
            meta["sequences"] += len(pos)
        if self.sharding is not None and not self.group.trains:
            self.sharding.release()  # a frozen ZeRO-3 model frees its gathered root between nodes
        if not self._emits():
            return {}, meta
        ids = batch["ids"][mine]
        if kind == "rewards":
            score = task_reward(tokens, mask)
            meta.update(reward_sum=float(score.sum()), reward_count=len(score))
            rm = torch.cat(results) if results else torch.zeros(0)
            out = {"ids": ids, "rewards": score, "rm_score": rm}
            if greedy is not None:
                out["baseline"] = greedy[1]
                out["rm_baseline"] = torch.cat(greedy[0]) if greedy[0] else torch.zeros(0)
            return out, meta
        return {"ids": ids, kind: torch.cat(results) if results else torch.zeros(0, Lr)}, meta

    def _train(self, node: NodeCall, batch: dict[str, torch.Tensor]) -> tuple[None, dict[str, Any]]:
        """One training node: targets of the whole step's batch (:meth:`_targets`), then ``U =
        node.updates`` optimizer updates (SPEC §14.2). The step's samples split into ``U``
        contiguous mini-batches in sample order (:func:`~rpeg.runtime.binding.mini_batch_bounds`);
        for each, this rank's DP slice of it runs forward and backward in ``⌈mb/U⌉`` microbatches
        (:meth:`_backward`; ``mb`` for ``U = 1``) and one optimizer step follows. The version,
        the snapshot of the version before and the checkpoint are per node, not per update
        (:meth:`_begin_update`, :meth:`_finish_update`).

        Each update's loss is normalised by its mini-batch's global token count (PPO, GRPO, ReMax)
        or pair count (DPO); the reported loss is the mean over the updates. The log-prob gap is
        measured on the first mini-batch only (later ones train on updated weights). ReMax with a
        rule reward takes its baseline from the greedy rollouts' rewards (:meth:`_greedy_baseline`).
        DPO's pairs are a graph input, rebuilt here from the task (the inputs bring the
        reference's and the actor's log-probs); its rank 0 reports the step's metric, the mean
        implicit reward margin ``β·(h_w − h_l)`` of the pairs under the version ``actor_inf`` read.
        """
        algorithm = node.algorithm
        if algorithm == "dpo":
            pairs = dpo_batch(self.task, node.step + self.step_offset, self.shape.batch)
            if not torch.equal(pairs["ids"], batch["ids"]):
                raise RuntimeError(
                    f"{node.vertex} step {node.step}: the log-probs of the inputs are not those of "
                    "the step's preference pairs"
                )
            batch = {**batch, **pairs}
        elif algorithm == "remax" and "baseline" not in batch:
            batch = {**batch, "baseline": self._greedy_baseline(node, batch)}
        target = self._targets(node, batch)
        if self.mesh.cp > 1:  # each CP rank's loss counts the response tokens its positions predict
            sh = self.shape
            own = self.model.own_positions(sh.prompt_len + sh.response_len)
            target[..., _MASK] *= own[response_slice(sh.prompt_len, sh.response_len)].float()
        # were the rollouts sampled with the weights trained here? (τ = 0, or the run's first
        # version; not the first step after a transition, whose rollouts read the version before it)
        same_weights = (
            node.version if node.rollout_version is None else node.rollout_version
        ) == node.version
        gaps: list[float] | None = [] if algorithm != "dpo" and same_weights else None
        # stale rollouts: PPO/GRPO/ReMax train with the decoupled objective (RLConfig.stale_objective)
        decoupled = not same_weights and algorithm != "dpo" and self.cfg.stale_objective == "decoupled"
        reference = node.reference
        updates = node.updates
        # the vertex's microbatches (SPEC §14.2), formed within each update
        micro = update_microbatches(self.group.mb if node.mb is None else node.mb, updates)
        # a chunked loss (SPEC §14.6): the stage returns hidden states, the loss applies the
        # heads to `chunk` response tokens at a time and recomputes them in the backward
        chunk = node.logits_chunk if self.group.head is not Head.SCALAR else 0
        if self.packed.hidden != bool(chunk):
            self.packed.hidden = bool(chunk)
            self.schedule = None  # a pipeline's last stage now returns another shape
        assert self.optimizer is not None
        losses: list[torch.Tensor] = []
        old = None
        for j, (lo, hi) in enumerate(mini_batch_bounds(len(batch["ids"]), updates)):
            if hi == lo:
                raise RuntimeError(
                    f"{node.vertex} step {node.step}: {len(batch['ids'])} sequences cannot fill "
                    f"{updates} mini-batches"
                )
            total = (hi - lo) / 2 if algorithm == "dpo" else float(batch["mask"][lo:hi].sum())
            loss_fn = self._loss_fn(
                algorithm,
                total,
                gaps if j == 0 else None,
                decoupled=decoupled,
                reference=reference,
                chunk=chunk,
            )
            mine = lo + self._my_slice(hi - lo)
            losses += self._backward(batch["tokens"][mine], target[mine], loss_fn, micro)
            if j == 0:  # the weights before the node's first update: its version's snapshot
                old = self._begin_update(node)
            self.optimizer.step()
        meta = self._finish_update(node, old, losses, updates)
        if gaps:
            meta["logprob_gap"] = max(gaps)
        if algorithm == "dpo" and self.rank == 0:
            h = sequence_logratio(batch["logp"], batch["ref_logp"], batch["mask"])
            margins = dpo_margins(h, self.cfg.dpo_beta)
            meta.update(reward_sum=float(margins.sum()), reward_count=len(margins))
        return None, meta

    @staticmethod
    def _needs(node: NodeCall, batch: dict[str, torch.Tensor], key: str, what: str) -> torch.Tensor:
        """``batch[key]``, or a ``RuntimeError`` naming the node and ``what`` the key holds."""
        if key not in batch:
            raise RuntimeError(
                f"{node.vertex} step {node.step}: its inputs lack {key!r} ({what}); they hold {sorted(batch)}"
            )
        return batch[key]

    def _greedy_baseline(self, node: NodeCall, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """ReMax with a rule reward: the baseline of each sampled sequence is the rule reward of
        its greedy rollout, the greedy generation's sequence with the same sample id (inputs
        prefixed ``greedy_``), matched as the reward inference matches them."""
        rewards = self._needs(node, batch, "greedy_rewards", "the greedy rollouts' rule rewards")
        gids = batch["greedy_ids"].contiguous()
        pos = torch.searchsorted(gids, batch["ids"].contiguous()).clamp(max=max(0, len(gids) - 1))
        if len(gids) == 0 or not torch.equal(gids[pos], batch["ids"]):
            raise RuntimeError(
                f"{node.vertex} step {node.step}: the greedy rollouts do not cover the sampled "
                "sequences (no greedy rollout with the same sample id)"
            )
        return rewards[pos]

    def _targets(self, node: NodeCall, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The packed per-token target ``[n, Lr, 7]`` of the step's batch (columns ``_TOK`` …).

        GRPO: group-relative advantages ``A_i = (r_i − mean_g) / (std_g + 1e-6)`` broadcast over
        the tokens, old and reference log-probs. ReMax: ``A_i = r_i − r(greedy rollout of i's
        prompt)`` broadcast over the tokens. DPO: ``_ADV`` holds the sign ``s_i`` (+1 chosen, −1
        rejected), ``_RET`` the partner's sequence log-ratio ``h̄_j`` from the actor's inference
        (both constant over the tokens), ``_REF`` the reference's log-probs
        (:func:`~rpeg.runtime.worker.rl.dpo_sequence_loss`). PPO: KL-shaped rewards
        ``r_t = −β·(log π − log π_ref)_t + [t = last]·score`` and GAE ``(γ, λ)`` advantages and
        returns over the critic's values (:mod:`~rpeg.runtime.worker.rl`); the critic's own training
        node (a value head) regresses on the task reward alone (``β = 0``). Without a reference
        (``node.reference`` false: ``kl_coef = 0``) there is no KL term and ``_REF`` stays 0;
        with one, missing reference log-probs are an error, never a silent ``β = 0``.
        """
        sh, cfg = self.shape, self.cfg
        algorithm = node.algorithm
        reference = node.reference
        Lp, Lr = sh.prompt_len, sh.response_len
        n = len(batch["ids"])
        mask = batch["mask"]
        pack = torch.zeros(n, Lr, 7)
        pack[..., _TOK] = batch["tokens"][:, Lp:].float()
        pack[..., _MASK] = mask
        policy = self.group.head is not Head.SCALAR

        def ref_logp() -> torch.Tensor:
            return self._needs(node, batch, "ref_logp", "the reference's log-probs")

        if algorithm in ("grpo", "remax"):
            rewards = self._needs(node, batch, "rewards", "the task rewards")
            if algorithm == "grpo":
                adv = grpo_advantages(rewards, sh.rollouts)
            else:
                adv = remax_advantages(rewards, batch["baseline"])
            pack[..., _ADV] = adv[:, None].expand(n, Lr)
            pack[..., _OLD] = self._needs(node, batch, "logp", "the old policy's log-probs")
            if reference:
                pack[..., _REF] = ref_logp()
            return pack
        if algorithm == "dpo":
            h = sequence_logratio(batch["logp"], batch["ref_logp"], mask)  # [2P], pairs interleaved
            pack[..., _ADV] = batch["sign"][:, None]
            pack[..., _RET] = h.reshape(-1, 2).flip(1).reshape(-1)[:, None]  # the partner's h̄_j
            pack[..., _REF] = batch["ref_logp"]
            return pack
        scores = self._needs(node, batch, "rewards", "the task rewards")
        values = self._needs(node, batch, "values", "the critic's values")
        zero = torch.zeros_like(mask)
        if policy:
            logp = self._needs(node, batch, "logp", "the old policy's log-probs")
            if reference:
                rewards = token_rewards(scores, logp, ref_logp(), mask, cfg.kl_coef)
            else:
                rewards = token_rewards(scores, zero, zero, mask, 0.0)
            pack[..., _OLD] = logp
        else:  # critic_train: it regresses on the task reward alone
            rewards = token_rewards(scores, zero, zero, mask, 0.0)
        adv, ret = gae(rewards, values, mask, cfg.gamma, cfg.lam)
        pack[..., _ADV] = adv
        pack[..., _RET] = ret
        pack[..., _VAL] = values
        return pack

    def _loss_fn(
        self,
        algorithm: str,
        total: float,
        gaps: list[float] | None = None,
        *,
        decoupled: bool = False,
        reference: bool = True,
        chunk: int = 0,
    ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The loss of a microbatch's packed output and target, divided by ``total`` (the
        update's global token count; DPO: its pair count): PPO's clipped surrogate for a policy
        head (plus GRPO's ``k3`` KL term when there is a ``reference``; none with
        ``kl_coef = 0``; ReMax: REINFORCE ``−A·log π``; DPO: the per-sequence split of
        ``−log σ(β·margin)``), the clipped value regression for a value head, both for a shared
        one (the value part weighted by ``value_coef``). With ``decoupled`` (rollouts sampled by
        older weights than those trained), the policy terms take the decoupled form: PPO's ratio
        against this step's own first-forward log-probs ``π_prox``, each token weighted by
        ``w_t = π_prox/μ`` (:func:`~rpeg.runtime.worker.rl.behavior_weight`), ReMax's REINFORCE by
        ``w_t``. With several updates per step, ``π_prox`` is the weights each update starts
        from (the first forward of its own mini-batch).

        With ``gaps`` (a list), every microbatch appends the health metric of the rollouts it
        trains on: ``max_t |log π_trainer(y_t) − log π_rollout(y_t)|`` over its valid tokens, the
        trainer's log-probs of its first forward (before this step's update) against those the
        generation recorded — the log-prob gap between the rollout engine and the trainer.

        With ``chunk > 0`` (a chunked loss, SPEC §14.6) the output is the last stage's hidden
        states: the heads run on ``chunk`` response tokens of the microbatch at a time
        (:func:`in_token_chunks`), each chunk under
        activation checkpointing (:func:`torch.utils.checkpoint.checkpoint`), so its logits are
        freed after its log-probs and recomputed in the backward — no more than ``chunk × V``
        logits exist at once, at the cost of a second head forward.
        """
        cfg = self.cfg
        head = self.group.head
        want_policy = head in (Head.LM, Head.BOTH)
        want_value = head in (Head.SCALAR, Head.BOTH)
        V = self.group.spec.vocab
        sl = response_slice(self.shape.prompt_len, self.shape.response_len)

        def chunk_heads(hidden: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
            out = self.model.heads(hidden)
            logits = out[0] if isinstance(out, tuple) else out
            lp = token_logprobs(logits, tokens, temperature=cfg.temperature)
            return (lp, out[1]) if isinstance(out, tuple) else (lp,)

        def heads_in_chunks(hidden: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
            """Log-probs (and a shared head's values) of the response positions, ``chunk`` tokens
            at a time, each chunk's logits recomputed in the backward."""
            return in_token_chunks(chunk_heads, hidden[:, sl], tokens, chunk, checkpoint=True)

        def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            m = target[..., _MASK]
            loss = output.new_zeros(())
            chunked = heads_in_chunks(output, target[..., _TOK].long()) if chunk else None
            if want_policy:
                if chunked is not None:
                    lp = chunked[0]
                else:
                    lp = token_logprobs(
                        output[:, sl, :V], target[..., _TOK].long(), temperature=cfg.temperature
                    )
                weight = (
                    behavior_weight(lp, target[..., _OLD], cfg.behavior_weight_cap) if decoupled else None
                )
                if self.metadata_probe:  # torch's metadata probe (see _backward): no gap
                    self.metadata_probe = False
                elif gaps is not None and m.any():
                    gaps.append(float(((lp.detach() - target[..., _OLD]).abs() * m).max()))
                if algorithm == "dpo":
                    h = sequence_logratio(lp, target[..., _REF], m)
                    partner, sign = target[:, 0, _RET], target[:, 0, _ADV]
                    loss = loss + dpo_sequence_loss(h, partner, sign, cfg.dpo_beta)[0]
                elif algorithm == "remax":
                    loss = loss + reinforce_loss(lp, target[..., _ADV], m, weight)[0]
                else:
                    prox = lp if decoupled else None
                    loss = (
                        loss
                        + policy_loss(lp, target[..., _OLD], target[..., _ADV], m, cfg.clip, prox, weight)[0]
                    )
                if algorithm == "grpo" and reference:
                    loss = loss + kl_loss(lp, target[..., _REF], m, cfg.kl_coef)[0]
            if want_value:
                values = chunked[1] if chunked is not None else output[:, sl, -1]
                v_sum, _ = value_loss(values, target[..., _RET], m, target[..., _VAL], cfg.value_clip)
                loss = loss + (cfg.value_coef * v_sum if want_policy else v_sum)  # c_v: shared backbone
            return loss / total

        return loss_fn

    def _zero_pass(self, length: int) -> None:
        """A forward and backward of one dummy sequence whose loss is 0: takes part in the DP
        group's collectives without changing the gradients."""
        out = self.packed(torch.zeros(1, length, dtype=torch.long))
        if self.packed.hidden:  # every head takes part in the gradient reduction, as on other ranks
            heads = self.model.heads(out)
            out = sum(h.sum() for h in heads) if isinstance(heads, tuple) else heads.sum()
        (out.sum() * 0).backward()

    def _backward(
        self,
        tokens: torch.Tensor,
        target: torch.Tensor,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        mb: int,
    ) -> list[torch.Tensor]:
        """Forward and backward of this rank's sequences in ``mb`` microbatches — 1F1B over the
        pipeline stages when ``Pp > 1`` (one schedule per microbatch count) — accumulating
        gradients; returns the microbatch losses (on the last stage)."""
        losses: list[torch.Tensor] = []
        if self.group.pp == 1:
            assert self.optimizer is not None
            chunks = [c for c in torch.tensor_split(torch.arange(len(tokens)), mb) if len(c)]
            # ZeRO-3 gathers each layer in every forward and backward (collectives over the DP
            # group), expert parallelism exchanges tokens in every MoE layer: every rank runs all
            # mb passes, an empty microbatch as a zero one
            passes = mb if self.optimizer.zero == 3 or self.mesh.ep > 1 else len(chunks)
            for i in range(passes):
                self.optimizer.sync_gradients(i == passes - 1)  # FSDP2: one reduction per update
                if i < len(chunks):
                    c = chunks[i]
                    loss = loss_fn(self.packed(tokens[c]), target[c])
                    loss.backward()
                    losses.append(loss.detach())
                else:
                    self._zero_pass(tokens.shape[1])
            if not passes and self.optimizer.sharded:
                # no sequence on this DP rank: a zero backward takes part in the gradient reduction
                self._zero_pass(tokens.shape[1])
            return losses
        if self.schedule is None or self.schedule._n_microbatches != mb:
            from torch.distributed.pipelining import PipelineStage, Schedule1F1B

            stage = PipelineStage(
                self.packed, self.mesh.p, self.group.pp, torch.device("cpu"), group=self.mesh.pp_group
            )
            self.schedule = Schedule1F1B(stage, n_microbatches=mb, loss_fn=loss_fn, scale_grads=False)
        self.schedule._loss_fn = loss_fn  # this step's normaliser and batch
        # torch 2.13 infers the stages' tensor metadata at a schedule's first step, calling the
        # loss once on the last stage's forward of uninitialised activations (input gradients
        # only): that call measures no log-prob gap
        self.metadata_probe = self.mesh.last and not getattr(
            self.schedule, "_stage_backward_initialized", True
        )
        if self.mesh.first:
            self.schedule.step(tokens)
        elif self.mesh.last:
            self.schedule.step(target=target, losses=losses)
        else:
            self.schedule.step()
        self.metadata_probe = False
        return losses

    def _begin_update(self, node: NodeCall) -> dict[str, torch.Tensor] | None:
        """Before a training node's first optimizer step: a copy of the version it trains when a
        serving vertex of this group (or a later plan) still reads it (``keep_previous``), and the
        boundary copy when the run recovers from worker loss. Returns the copy (or ``None``)."""
        with self.full_weights():  # ZeRO-3: gathered on every DP rank for the copies
            old = self._snapshot() if node.keep_previous else None
            self._keep_boundary(old)
        self.mid_update = True  # a rollback before _finish_update restores the boundary copy
        return old

    def _finish_update(
        self,
        node: NodeCall,
        old: dict[str, torch.Tensor] | None,
        losses: list[torch.Tensor],
        updates: int = 1,
    ) -> dict[str, Any]:
        """After a training node's ``updates`` optimizer steps: keep ``old`` (:meth:`_begin_update`)
        as the snapshot of the version before and drop the snapshots no reader needs any more,
        bump the version (once per RL step) and, at a checkpointed step, write this rank's file.
        Returns the node's meta; its ``loss`` is this rank's share of the mean over the updates."""
        if old is not None:
            self.snapshots[self.version] = old
            for v in [v for v in self.snapshots if v < self.version + 1 - node.keep]:
                del self.snapshots[v]
        self.version += 1
        self.mid_update = False
        # every TP rank of the last stage computes the same loss: rank t = 0 reports it
        loss = float(sum(losses)) / updates if losses and self.mesh.t == 0 else None
        meta: dict[str, Any] = {"loss": loss, "version": self.version}
        if node.save:
            os.makedirs(node.save, exist_ok=True)
            name = f"g{self.group.gid}-r{self.rank}.pt"
            path = self.save(os.path.join(node.save, name))
            from ..trace.checkpoint import file_digest

            meta["checkpoint"] = {"name": name, **file_digest(path)}
        return meta

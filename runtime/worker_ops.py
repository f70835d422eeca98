"""A worker's model invocations: the OP nodes of generation, inference and training (SPEC §11).

Execution per role (``B'·R'`` sequences of one step, global order = sample id):

* generation: prefill the prompt, then one token per decode position, microbatch by microbatch,
  stage by stage (``send``/``recv`` of hidden states between stages; the last stage samples with
  layout-independent Gumbel noise and sends the token back to the first). A response-length
  phase ``q`` decodes positions ``t_{q−1}..t_q − 1`` and emits the sequences that end there.
* inference: teacher-forced forward, microbatched; reference → log-probs, critic → values,
  reward → reward-model score plus the task's verifiable reward (the score the RL update uses:
  a randomly initialised reward model carries no signal). ReMax's reward inference also scores
  each sequence's greedy rollout (same sample id, inputs prefixed ``greedy_``) and emits its
  reward as the ``baseline``. DPO's inferences (reference and actor log-probs) build the step's
  preference pairs from the task themselves: the pairs are a graph input, like the prompts.
* training: advantages over the whole step's batch (PPO: KL-shaped rewards and GAE γ = 1,
  λ = 0.95; GRPO: group-relative; ReMax: reward minus the greedy baseline, REINFORCE loss; DPO:
  the per-sequence split of ``−log σ(β·margin)`` with the partner's log-ratio from the actor's
  inference), then this rank's DP slice in ``mb`` microbatches — with
  ``torch.distributed.pipelining``'s 1F1B schedule when ``Pp > 1`` — losses divided by the
  global token count (DPO: pair count), then one Adam step (FSDP2 when ``Pd > 1``).

:class:`WorkerOps` is a part of :class:`~rpeg.runtime.worker.Worker`, which owns the state it
uses (model, mesh, optimizer, task, version and snapshots).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..ir.types import Head, Role
from .binding import GroupSpec, RunShape
from .model import KVCache, StageModel, sample_token, token_logprobs
from .parallel import FSDPAdam
from .rl import (
    RLConfig,
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
from .task import SyntheticTask

__all__ = ["PackedOutput", "WorkerOps"]

# columns of the packed per-token training target (pipelining passes one tensor to the loss)
_TOK, _OLD, _ADV, _MASK, _REF, _RET, _VAL = range(7)


class PackedOutput(torch.nn.Module):
    """Last-stage wrapper whose output is one tensor: logits ``[b,s,V]``, values ``[b,s,1]``, or
    both concatenated (``BOTH``) — the form ``torch.distributed.pipelining`` passes to the loss."""

    def __init__(self, inner: StageModel) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x)
        if not self.inner.last:
            return out
        if isinstance(out, tuple):
            return torch.cat([out[0], out[1].unsqueeze(-1)], dim=-1)
        return out if self.inner.head is Head.LM else out.unsqueeze(-1)


class WorkerOps:
    """OP nodes of one rank (:meth:`op`) and the pipeline plumbing they share.

    Uses the :class:`~rpeg.runtime.worker.Worker`'s state below, its ``_check_fault`` and
    ``_emits``, the transfers' ``_inputs`` and ``publish`` and the checkpoints' ``_snapshot``,
    ``_keep_boundary`` and ``save``.
    """

    group: GroupSpec
    rank: int
    shape: RunShape
    cfg: RLConfig
    seed: int
    step_offset: int
    rss_base: int
    memory_peak: Any
    mesh: Any
    model: StageModel
    packed: PackedOutput
    optimizer: FSDPAdam | None
    task: SyntheticTask
    target: torch.Tensor
    gen_state: dict[tuple[str, int], dict[str, Any]]
    schedule: Any
    lengths: torch.Tensor
    snapshots: dict[int, dict[str, torch.Tensor]]
    version: int
    rollout_engine: str
    _generate_vllm: Callable[..., tuple[dict[str, torch.Tensor] | None, dict[str, Any]]]
    _write_weights: Callable[..., None]

    # ------------------------------------------------------------------ pipeline plumbing
    def _stage(
        self, x: torch.Tensor | None, b: int, s: int, cache: KVCache | None = None, *, heads: bool = True
    ) -> torch.Tensor | None:
        """Run this stage on ``b × s`` positions; hidden states travel stage to stage by P2P.
        Returns the last stage's output (heads applied; its hidden states before the final norm
        with ``heads=False``), ``None`` on other stages."""
        m = self.mesh
        if not m.first:
            x = torch.empty(b, s, self.group.spec.hidden)
            dist.recv(x, src=m.prev_rank())
        if m.last and not heads:
            return self.model.forward_hidden(x, cache=cache)
        out = self.model(x, cache=cache)
        if not m.last:
            dist.send(out.contiguous(), dst=m.next_rank())
            return None
        return out

    def _chunked_logprobs(
        self, hidden: torch.Tensor, tokens: torch.Tensor, sl: slice, chunk: int
    ) -> torch.Tensor:
        """Log-probs of the response tokens from the last stage's ``hidden`` states with the
        head applied to ``chunk`` positions at a time (a chunked loss, SPEC §14.6): no more than
        ``chunk × V`` logits per sequence exist at once, and only the response positions'."""
        Lp = self.shape.prompt_len
        pieces = []
        for lo in range(sl.start, sl.stop, chunk):
            hi = min(lo + chunk, sl.stop)
            logits = self.model.heads(hidden[:, lo:hi])
            # position p predicts token p + 1: the response tokens Lp + (lo − sl.start) …
            first = Lp + (lo - sl.start)
            pieces.append(token_logprobs(logits / self.cfg.temperature, tokens[:, first : first + hi - lo]))
        return torch.cat(pieces, dim=1)

    def _my_slice(self, n: int) -> torch.Tensor:
        """Indices of this DP rank's sequences among ``n``: every ``Pd``-th from its DP rank
        ``d`` (``d, d + Pd, d + 2·Pd, …``; ``⌈n/Pd⌉`` or ``⌊n/Pd⌋`` of them).

        Strided, not contiguous: a step's sequences are indexed by response length (shortest
        first, :meth:`RunShape.response_lengths`), so contiguous blocks gave the last DP rank every
        long response — its replica generated 1.9–2.9× longer than the first — where the cost
        model splits each length phase evenly over the ``Pd`` ranks."""
        return torch.arange(self.mesh.d, n, self.group.dp)

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
        t_pub = time.perf_counter()
        pub = self.publish() if node.get("publish") and role is Role.TRAINING else None
        meta["publish_s"] = time.perf_counter() - t_pub if pub is not None else 0.0
        meta["worker_time"] = time.perf_counter() - t0
        meta["version_used"] = version if role is not Role.TRAINING else meta["version"] - 1
        meta["memory_bytes"] = max(0, self.memory_peak.peak() - self.rss_base)
        return meta, (out if self._emits() else None), pub

    @torch.no_grad()
    def _swap(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        current = self._snapshot()
        self._write_weights(weights, master=False)  # serving only: the trained version stays put
        return current

    def _temperature(self, node: dict[str, Any]) -> float:
        """Sampling temperature of a generation node: 0 (greedy) for a node marked ``greedy``
        (ReMax's baseline rollout), the run's ``temperature`` otherwise."""
        return 0.0 if node.get("greedy") else self.cfg.temperature

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

    @torch.no_grad()
    def _generate(self, node: dict[str, Any]) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
        if self.rollout_engine == "vllm":
            return self._generate_vllm(node, self._temperature(node))
        sh, step = self.shape, node["step"]
        key = (node["vertex"], step)
        phase = node["phase"]
        if phase <= 1:
            ids, mine, prompts = self._rollout_batch(step)
            tokens = torch.zeros(len(mine), sh.prompt_len + sh.response_len, dtype=torch.int64)
            tokens[:, : sh.prompt_len] = prompts
            mb = int(node.get("mb", self.group.mb))  # the vertex's microbatches (SPEC §14.2)
            chunks = [c for c in torch.tensor_split(torch.arange(len(mine)), mb) if len(c)]
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
        hi = self._phase_end(phase)
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
                    tok, lp = sample_token(logits[:, -1], self.seed, st["ids"][c], t, self._temperature(node))
                    st["logp"][c, t] = lp
                    if self.group.pp > 1:
                        dist.send(tok, dst=self.mesh.first_rank())
                elif self.mesh.first:
                    dist.recv(tok, src=self.mesh.last_rank())
                if self.mesh.first or self.mesh.last:
                    st["tokens"][c, Lp + t] = tok
        st["pos"] = hi
        lengths = self.lengths[st["mine"]]
        done = self._ends_in_phase(phase, lengths)
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
        """One inference node over this rank's DP slice of the batch, in ``mb`` microbatches:
        log-probs, values, or rewards (task reward and reward-model score; ReMax adds the greedy
        rollout's as ``baseline`` and ``rm_baseline``). DPO builds its batch, the step's
        preference pairs (:func:`~rpeg.runtime.rl.dpo_batch`), itself."""
        sh = self.shape
        Lp, Lr = sh.prompt_len, sh.response_len
        sl = response_slice(Lp, Lr)
        kind = node["output"]
        if node["algorithm"] == "dpo":  # offline: the preference pairs are a graph input, built here
            batch = dpo_batch(self.task, node["step"] + self.step_offset, sh.batch)
        if "greedy_ids" in batch:  # ReMax: score the sampled sequences whose greedy rollout is here
            # (a phase node may get one generation's phase and the other's whole step)
            keep = torch.isin(batch["ids"], batch["greedy_ids"])
            batch = {k: v if k.startswith("greedy_") else v[keep] for k, v in batch.items()}
        n = len(batch["ids"])
        mine = self._my_slice(n)
        tokens, mask = batch["tokens"][mine], batch["mask"][mine]
        meta: dict[str, Any] = {"sequences": len(mine)}

        mb = int(node.get("mb", self.group.mb))  # the vertex's microbatches (SPEC §14.2)
        chunk = int(node.get("logits_chunk", 0))  # a chunked loss (SPEC §14.6)
        chunked = chunk > 0 and kind in ("ref_logp", "logp") and self.group.head is Head.LM

        def forward(tokens: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
            results: list[torch.Tensor] = []
            for c in torch.tensor_split(torch.arange(len(tokens)), mb):
                if not len(c):
                    continue
                if chunked:  # the head over `chunk` response positions at a time
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
                    lp = token_logprobs(logits[:, sl] / self.cfg.temperature, tokens[c][:, Lp : Lp + Lr])
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
            hits = self.target[tokens[:, Lp:]].float() * mask
            return hits.sum(dim=1) / mask.sum(dim=1).clamp(min=1)

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

    def _train(self, node: dict[str, Any], batch: dict[str, torch.Tensor]) -> tuple[None, dict[str, Any]]:
        """One training node: targets of the whole step's batch (:meth:`_targets`), this rank's
        DP slice forward and backward (:meth:`_backward`), then the update (:meth:`_update`).

        The loss is normalised by the step's global token count (PPO, GRPO, ReMax) or pair count
        (DPO). DPO's pairs are a graph input, rebuilt here from the task (the inputs bring the
        reference's and the actor's log-probs); its rank 0 reports the step's metric, the mean
        implicit reward margin ``β·(h_w − h_l)`` of the pairs under the version ``actor_inf`` read.
        """
        algorithm = node["algorithm"]
        if algorithm == "dpo":
            pairs = dpo_batch(self.task, node["step"] + self.step_offset, self.shape.batch)
            if not torch.equal(pairs["ids"], batch["ids"]):
                raise RuntimeError(
                    f"{node['vertex']} step {node['step']}: the log-probs of the inputs are not those of "
                    "the step's preference pairs"
                )
            batch = {**batch, **pairs}
        target = self._targets(algorithm, batch)
        total = len(batch["ids"]) / 2 if algorithm == "dpo" else float(batch["mask"].sum())
        # were the rollouts sampled with the weights trained here? (τ = 0, or the run's first
        # version; not the first step after a transition, whose rollouts read the version before it)
        same_weights = node.get("rollout_version", node["version"]) == node["version"]
        gaps: list[float] | None = [] if algorithm != "dpo" and same_weights else None
        # stale rollouts: PPO/GRPO/ReMax train with the decoupled objective (RLConfig.stale_objective)
        decoupled = not same_weights and algorithm != "dpo" and self.cfg.stale_objective == "decoupled"
        loss_fn = self._loss_fn(algorithm, total, gaps, decoupled=decoupled)
        mine = self._my_slice(len(batch["ids"]))
        mb = int(node.get("mb", self.group.mb))  # the vertex's microbatches (SPEC §14.2)
        losses = self._backward(batch["tokens"][mine], target[mine], loss_fn, mb)
        meta = self._update(node, losses)
        if gaps:
            meta["logprob_gap"] = max(gaps)
        if algorithm == "dpo" and self.rank == 0:
            h = sequence_logratio(batch["logp"], batch["ref_logp"], batch["mask"])
            margins = dpo_margins(h, self.cfg.dpo_beta)
            meta.update(reward_sum=float(margins.sum()), reward_count=len(margins))
        return None, meta

    def _targets(self, algorithm: str, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The packed per-token target ``[n, Lr, 7]`` of the step's batch (columns ``_TOK`` …).

        GRPO: group-relative advantages ``A_i = (r_i − mean_g) / (std_g + 1e-6)`` broadcast over
        the tokens, old and reference log-probs. ReMax: ``A_i = r_i − r(greedy rollout of i's
        prompt)`` broadcast over the tokens. DPO: ``_ADV`` holds the sign ``s_i`` (+1 chosen, −1
        rejected), ``_RET`` the partner's sequence log-ratio ``h̄_j`` from the actor's inference
        (both constant over the tokens), ``_REF`` the reference's log-probs
        (:func:`~rpeg.runtime.rl.dpo_sequence_loss`). PPO: KL-shaped rewards
        ``r_t = −β·(log π − log π_ref)_t + [t = last]·score`` and GAE ``(γ, λ)`` advantages and
        returns over the critic's values (:mod:`~rpeg.runtime.rl`); the critic's own training
        node gets no log-probs and regresses on the task reward alone (``β = 0``).
        """
        sh, cfg = self.shape, self.cfg
        Lp, Lr = sh.prompt_len, sh.response_len
        n = len(batch["ids"])
        mask = batch["mask"]
        pack = torch.zeros(n, Lr, 7)
        pack[..., _TOK] = batch["tokens"][:, Lp:].float()
        pack[..., _MASK] = mask
        if algorithm in ("grpo", "remax"):
            if algorithm == "grpo":
                adv = grpo_advantages(batch["rewards"], sh.rollouts)
            else:
                adv = remax_advantages(batch["rewards"], batch["baseline"])
            pack[..., _ADV] = adv[:, None].expand(n, Lr)
            pack[..., _OLD] = batch["logp"]
            pack[..., _REF] = batch["ref_logp"]
            return pack
        if algorithm == "dpo":
            h = sequence_logratio(batch["logp"], batch["ref_logp"], mask)  # [2P], pairs interleaved
            pack[..., _ADV] = batch["sign"][:, None]
            pack[..., _RET] = h.reshape(-1, 2).flip(1).reshape(-1)[:, None]  # the partner's h̄_j
            pack[..., _REF] = batch["ref_logp"]
            return pack
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
        return pack

    def _loss_fn(
        self, algorithm: str, total: float, gaps: list[float] | None = None, *, decoupled: bool = False
    ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The loss of a microbatch's packed output and target, divided by ``total`` (the step's
        global token count; DPO: its pair count): PPO's clipped surrogate for a policy head (plus
        GRPO's ``k3`` KL term; ReMax: REINFORCE ``−A·log π``; DPO: the per-sequence split of
        ``−log σ(β·margin)``), the clipped value regression for a value head, both for a shared
        one (the value part weighted by ``value_coef``). With ``decoupled`` (rollouts sampled by
        older weights than those trained), the policy terms take the decoupled form: PPO's ratio
        against this step's own first-forward log-probs ``π_prox``, each token weighted by
        ``w_t = π_prox/μ`` (:func:`~rpeg.runtime.rl.behavior_weight`), ReMax's REINFORCE by
        ``w_t``.

        With ``gaps`` (a list), every microbatch appends the health metric of the rollouts it
        trains on: ``max_t |log π_trainer(y_t) − log π_rollout(y_t)|`` over its valid tokens, the
        trainer's log-probs of its first forward (before this step's update) against those the
        generation recorded — the log-prob gap between the rollout engine and the trainer.
        """
        cfg = self.cfg
        head = self.group.head
        want_policy = head in (Head.LM, Head.BOTH)
        want_value = head in (Head.SCALAR, Head.BOTH)
        V = self.group.spec.vocab
        sl = response_slice(self.shape.prompt_len, self.shape.response_len)

        def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            m = target[..., _MASK]
            loss = output.new_zeros(())
            if want_policy:
                logits = output[:, sl, :V]
                lp = token_logprobs(logits / cfg.temperature, target[..., _TOK].long())
                weight = (
                    behavior_weight(lp, target[..., _OLD], cfg.behavior_weight_cap) if decoupled else None
                )
                if gaps is not None and m.any():
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
                if algorithm == "grpo":
                    loss = loss + kl_loss(lp, target[..., _REF], m, cfg.kl_coef)[0]
            if want_value:
                values = output[:, sl, -1]
                v_sum, _ = value_loss(values, target[..., _RET], m, target[..., _VAL], cfg.value_clip)
                loss = loss + (cfg.value_coef * v_sum if want_policy else v_sum)  # c_v: shared backbone
            return loss / total

        return loss_fn

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
            for i, c in enumerate(chunks):
                self.optimizer.sync_gradients(i == len(chunks) - 1)  # FSDP2: one reduction per update
                loss = loss_fn(self.packed(tokens[c]), target[c])
                loss.backward()
                losses.append(loss.detach())
            if not chunks and self.optimizer.sharded:
                # no sequence on this DP rank: a zero backward takes part in the gradient reduction
                (self.packed(torch.zeros(1, tokens.shape[1], dtype=torch.long)).sum() * 0).backward()
            return losses
        if self.schedule is None or self.schedule._n_microbatches != mb:
            from torch.distributed.pipelining import PipelineStage, Schedule1F1B

            stage = PipelineStage(
                self.packed, self.mesh.p, self.group.pp, torch.device("cpu"), group=self.mesh.pp_group
            )
            self.schedule = Schedule1F1B(stage, n_microbatches=mb, loss_fn=loss_fn, scale_grads=False)
        self.schedule._loss_fn = loss_fn  # this step's normaliser and batch
        if self.mesh.first:
            self.schedule.step(tokens)
        elif self.mesh.last:
            self.schedule.step(target=target, losses=losses)
        else:
            self.schedule.step()
        return losses

    def _update(self, node: dict[str, Any], losses: list[torch.Tensor]) -> dict[str, Any]:
        """One optimizer step (FSDP2 or plain Adam): keep the version before it as a
        snapshot when a serving vertex of this group (or a later plan) still reads it, keep the
        boundary copy when the run recovers from worker loss, bump the version and, at a
        checkpointed step, write this rank's file. Returns the node's meta."""
        assert self.optimizer is not None
        old = self._snapshot() if node.get("keep_previous") else None
        self._keep_boundary(old)
        self.optimizer.step()
        if old is not None:
            self.snapshots[self.version] = old
            for v in [
                v for v in self.snapshots if v < self.version + 1 - node.get("keep", node.get("tau", 0))
            ]:
                del self.snapshots[v]
        self.version += 1
        # every TP rank of the last stage computes the same loss: rank t = 0 reports it
        loss = float(sum(losses)) if losses and self.mesh.t == 0 else None
        meta: dict[str, Any] = {"loss": loss, "version": self.version}
        if node.get("save"):
            os.makedirs(node["save"], exist_ok=True)
            name = f"g{self.group.gid}-r{self.rank}.pt"
            path = self.save(os.path.join(node["save"], name))
            from .checkpoint import file_digest

            meta["checkpoint"] = {"name": name, **file_digest(path)}
        return meta

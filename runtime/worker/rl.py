"""PPO, GRPO, ReMax and DPO math, independent of where it runs (SPEC §11), and a single-process
reference loop.

Every loss is returned as a **sum over valid tokens together with the token count**. A distributed
trainer adds the sums of all data-parallel ranks and microbatches and divides by the *global* token
count, so its gradient equals the single-process gradient whatever the split. For the same reason
nothing here normalises with batch statistics (no advantage whitening across the batch): GRPO's
statistics are per prompt group, which a rank always holds whole. DPO's loss couples the two
sequences of a preference pair, which a rank or microbatch may hold apart: :func:`dpo_sequence_loss`
splits it into one term per sequence whose gradients add up to the pair's.

Shapes: ``n`` sequences, ``T = Lr`` response tokens; ``mask[n, T]`` is 1 for a valid response token.
Logits at sequence position ``Lp − 1 + t`` predict response token ``t``, which is why the loop below
slices ``[:, Lp − 1 : Lp − 1 + Lr]`` (:func:`response_slice`).
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
from torch import Tensor

from ...ir.models import ModelSpec, model_preset
from ...ir.types import Head
from ..binding import scale_spec
from ..config import RLConfig
from .model import StageModel, generate, token_logprobs
from .task import SyntheticTask

__all__ = [
    "behavior_weight",
    "dpo_batch",
    "dpo_loss",
    "dpo_margins",
    "dpo_sequence_loss",
    "gae",
    "grpo_advantages",
    "kl_loss",
    "kl_penalty",
    "policy_loss",
    "reinforce_loss",
    "remax_advantages",
    "response_slice",
    "rollout_sample_ids",
    "sequence_logratio",
    "token_rewards",
    "train_reference",
    "value_loss",
]


# ---------------------------------------------------------------------------------------------- rewards
def kl_penalty(logp: Tensor, ref_logp: Tensor, mask: Tensor, kl_coef: float = 0.01) -> Tensor:
    """Per-token KL penalty of PPO's reward, ``β·(log π(y_t) − log π_ref(y_t))·mask_t``.

    The sampled-token estimator ``k1`` of ``KL(π ‖ π_ref)``; returned ``[n, T]``, no gradient intended.
    """
    return kl_coef * (logp - ref_logp) * mask


def token_rewards(
    scores: Tensor, logp: Tensor, ref_logp: Tensor, mask: Tensor, kl_coef: float = 0.01
) -> Tensor:
    """PPO's per-token rewards: ``r_t = −β·(log π − log π_ref)_t + [t = last valid]·score``.

    Parameters
    ----------
    scores
        ``[n]`` task rewards of the sequences.
    logp, ref_logp, mask
        ``[n, T]`` log-probs of the sampled tokens under the actor and the reference, valid mask.
    """
    rewards = -kl_penalty(logp, ref_logp, mask, kl_coef)
    last = mask.long().cumsum(dim=1).argmax(dim=1, keepdim=True)  # first index of the final count
    score = scores.to(rewards.dtype) * (mask.sum(dim=1) > 0)  # an empty response earns nothing
    return rewards.scatter_add(1, last, score[:, None])


def gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al., 2016) over ``[n, T]`` response tokens.

    ``δ_t = r_t + γ·m_{t+1}·V_{t+1} − V_t`` and ``A_t = δ_t + γλ·m_{t+1}·A_{t+1}`` backwards from the
    last token (``m_T = 0``: the episode ends with the response), ``R_t = A_t + V_t`` are the value
    targets. Both are zero where ``mask`` is 0 and carry no gradient.

    Example: ``r = [0, 1]``, ``V = [0.5, 0.25]``, ``γ = 1``, ``λ = 0.5`` → ``δ = [−0.25, 0.75]``,
    ``A = [−0.25 + 0.5·0.75, 0.75] = [0.125, 0.75]``, ``R = [0.625, 1.0]``.
    """
    rewards, values, mask = rewards.detach().float(), values.detach().float(), mask.float()
    values = values * mask
    adv = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        nxt_mask = mask[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros_like(running)
        nxt_value = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * nxt_mask * nxt_value - values[:, t]
        running = delta + gamma * lam * nxt_mask * running
        adv[:, t] = running
    adv = adv * mask
    return adv, (adv + values) * mask


def grpo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """Group-relative advantages (Shao et al., 2024): ``A_i = (r_i − mean_g) / (std_g + 1e-6)``.

    ``rewards`` is ``[n]`` with the ``group_size`` rollouts of one prompt contiguous
    (``n = B·R``, sequence ``i`` belongs to prompt ``i // R``); ``std_g`` is the sample standard
    deviation (``n − 1`` in the denominator) of the group. Returns ``[n]``; broadcast it over the
    tokens of each sequence.

    Raises
    ------
    ValueError
        If ``group_size < 2`` or does not divide ``n``.
    """
    if group_size < 2 or rewards.shape[0] % group_size:
        raise ValueError(
            f"grpo_advantages: group_size={group_size} must be >= 2 and divide n={rewards.shape[0]}"
        )
    groups = rewards.float().reshape(-1, group_size)
    adv = (groups - groups.mean(dim=1, keepdim=True)) / (groups.std(dim=1, keepdim=True) + 1e-6)
    return adv.reshape(-1)


def remax_advantages(rewards: Tensor, baseline: Tensor) -> Tensor:
    """ReMax's advantages (Li et al., 2024): ``A_i = r(x_i, y_i) − r(x_i, ȳ_i)``.

    ``rewards`` are the ``[n]`` rewards of the sampled responses, ``baseline`` the ``[n]`` rewards of
    the greedy response ``ȳ_i`` of each one's prompt (REINFORCE with the greedy rollout's reward as
    the baseline). Returns ``[n]``, no gradient; broadcast it over the tokens of each sequence.

    Example: rewards ``[0.5, 0.25]`` of two rollouts of a prompt whose greedy response scores 0.375
    → ``A = [0.125, −0.125]``.

    Raises
    ------
    ValueError
        If the shapes differ.
    """
    if rewards.shape != baseline.shape:
        raise ValueError(
            f"remax_advantages: rewards {tuple(rewards.shape)} and baseline {tuple(baseline.shape)} differ"
        )
    return (rewards.float() - baseline.float()).detach()


# ---------------------------------------------------------------------------------------------- losses
def behavior_weight(prox_logp: Tensor, old_logp: Tensor, cap: float | None = None) -> Tensor:
    """Per-token importance weights ``w_t = min(π_prox(y_t)/μ(y_t), w̄)`` of stale samples (no gradient).

    ``μ`` is the policy that sampled (its log-probs recorded at generation), ``π_prox`` the weights
    being trained, before this update; ``w̄ = cap`` (``None``: no truncation).
    """
    weight = torch.exp(prox_logp.detach() - old_logp.detach())
    return weight if cap is None else weight.clamp(max=cap)


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip: float = 0.2,
    prox_logp: Tensor | None = None,
    weight: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate (Schulman et al., 2017), summed over valid tokens.

    ``ρ_t = exp(log π − log π_old)``, ``ℓ_t = −min(ρ_t·A_t, clip(ρ_t, 1 − ε, 1 + ε)·A_t)``.

    Decoupled form (Hilton et al., 2022), for samples older than the weights being trained: the
    ratio is taken against the proximal policy ``π_prox`` (those weights before this update) and
    the term is importance-weighted back to the sampling policy ``μ``,
    ``ρ_t = exp(log π − log π_prox)``, ``ℓ_t = −w_t·min(ρ_t·A_t, clip(ρ_t, 1 − ε, 1 + ε)·A_t)``,
    ``w_t = π_prox/μ`` (:func:`behavior_weight`). The trust region is then centred on the
    current weights, not on the ``τ``-updates-old ones, so a stale batch is not clipped away.

    Parameters
    ----------
    logp
        ``[n, T]`` log-probs under the policy being trained (carries the gradient).
    old_logp
        ``[n, T]`` log-probs at sampling time.
    advantages
        ``[n, T]``, or ``[n]`` (one per sequence, as in GRPO) broadcast over tokens.
    mask
        ``[n, T]`` valid tokens.
    clip
        ``ε``.
    prox_logp
        ``[n, T]`` log-probs under ``π_prox`` (decoupled form), or ``None`` (``π_prox = μ``).
    weight
        ``[n, T]`` importance weights ``w_t`` of the decoupled form (``None``: 1).

    Returns
    -------
    sum_loss, n_tokens
        ``Σ_t mask_t·ℓ_t`` (scalar) and ``Σ mask`` (scalar tensor).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    adv = advantages.detach()
    ratio = torch.exp(logp - (old_logp if prox_logp is None else prox_logp).detach())
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1.0 - clip, 1.0 + clip) * adv)
    if weight is not None:
        surrogate = weight.detach() * surrogate
    mask = mask.to(logp.dtype)
    return -(surrogate * mask).sum(), mask.sum()


def value_loss(
    values: Tensor,
    returns: Tensor,
    mask: Tensor,
    old_values: Tensor | None = None,
    clip: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Critic regression, summed over valid tokens: ``½·(V_t − R_t)²``.

    With ``old_values`` and ``clip`` the clipped form of PPO2 is used:
    ``½·max((V_t − R_t)², (V_old + clip(V_t − V_old, −c, c) − R_t)²)``.

    Returns
    -------
    sum_loss, n_tokens
        As in :func:`policy_loss`.
    """
    returns = returns.detach()
    err = (values - returns) ** 2
    if old_values is not None and clip is not None:
        old = old_values.detach()
        clipped = old + (values - old).clamp(-clip, clip)
        err = torch.maximum(err, (clipped - returns) ** 2)
    mask = mask.to(values.dtype)
    return 0.5 * (err * mask).sum(), mask.sum()


def kl_loss(logp: Tensor, ref_logp: Tensor, mask: Tensor, kl_coef: float = 0.01) -> tuple[Tensor, Tensor]:
    """GRPO's KL term, summed over valid tokens: ``β·(exp(Δ) − Δ − 1)`` with ``Δ = log π_ref − log π``.

    The unbiased, non-negative ``k3`` estimator of ``KL(π ‖ π_ref)`` (Schulman, 2020), as in
    DeepSeekMath; the gradient flows through ``logp``.

    Returns
    -------
    sum_loss, n_tokens
        As in :func:`policy_loss`.
    """
    delta = ref_logp.detach() - logp
    mask = mask.to(logp.dtype)
    return kl_coef * ((torch.exp(delta) - delta - 1.0) * mask).sum(), mask.sum()


def reinforce_loss(
    logp: Tensor, advantages: Tensor, mask: Tensor, weight: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """REINFORCE (ReMax's policy gradient), summed over valid tokens: ``ℓ_t = −w_t·A·log π(y_t)``.

    ``w_t = 1`` for on-policy samples; for samples of an older policy ``μ`` the caller passes the
    importance weight ``w_t = π_prox(y_t)/μ(y_t)`` of the weights being trained (no gradient), so
    ``∇ℓ`` is the off-policy gradient ``E_μ[(π/μ)·A·∇log π]`` at ``θ = θ_prox``.

    Parameters
    ----------
    logp
        ``[n, T]`` log-probs under the policy being trained (carries the gradient).
    advantages
        ``[n, T]``, or ``[n]`` broadcast over tokens (:func:`remax_advantages`); no gradient.
    mask
        ``[n, T]`` valid tokens.
    weight
        ``[n, T]`` importance weights ``w_t`` (``None``: 1).

    Returns
    -------
    sum_loss, n_tokens
        As in :func:`policy_loss`. Its gradient equals :func:`policy_loss`'s whenever the samples
        come from the policy being trained (ratio 1, nothing clipped).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    mask = mask.to(logp.dtype)
    w = mask if weight is None else mask * weight.detach()
    return -(advantages.detach() * logp * w).sum(), mask.sum()


def sequence_logratio(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """``[n]`` sequence log-ratios ``h_i = Σ_t mask_t·(log π(y_t) − log π_ref(y_t))`` (DPO's implicit
    reward is ``β·h``); the gradient flows through ``logp``."""
    mask = mask.to(logp.dtype)
    return ((logp - ref_logp.detach()) * mask).sum(dim=1)


def dpo_loss(
    logp_chosen: Tensor,
    logp_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    beta: float = 0.1,
) -> tuple[Tensor, Tensor]:
    """DPO (Rafailov et al., 2023), summed over pairs: ``−log σ(β·[(log π(y_w) − log π_ref(y_w)) −
    (log π(y_l) − log π_ref(y_l))])``.

    All four arguments are ``[P]`` *sequence* log-probs (summed over response tokens) of the chosen
    (``w``) and rejected (``l``) responses; the gradient flows through the policy's two.

    Example: ``β = 0.1``, policy ``(−4, −6)``, reference ``(−5, −5)`` → margin ``(−4 + 5) − (−6 + 5)
    = 2``, loss ``−log σ(0.2) = 0.598``; the policy equal to the reference gives ``log 2``.

    Returns
    -------
    sum_loss, n_pairs
        ``Σ_p ℓ_p`` (scalar) and ``P`` (scalar tensor).
    """
    margin = (logp_chosen - ref_chosen.detach()) - (logp_rejected - ref_rejected.detach())
    loss = -torch.nn.functional.logsigmoid(beta * margin)
    return loss.sum(), torch.tensor(float(margin.numel()))


def dpo_sequence_loss(
    logratio: Tensor, partner_logratio: Tensor, sign: Tensor, beta: float = 0.1
) -> tuple[Tensor, Tensor]:
    """DPO's loss split into one term per sequence, so a pair may straddle ranks and microbatches.

    Sequence ``i`` with log-ratio ``h_i`` (:func:`sequence_logratio`, carries the gradient), sign
    ``s_i = +1`` when it is the chosen response and ``−1`` when rejected, and its partner's log-ratio
    ``h̄_j`` (a constant: the actor's inference log-probs of the same version) gets
    ``ℓ_i = −log σ(β·z_i)`` with ``z_i = s_i·(h_i − h̄_j)``. For the pair ``(w, l)``,
    ``∂ℓ_w/∂h_w = ∂ℓ_p/∂h_w`` and ``∂ℓ_l/∂h_l = ∂ℓ_p/∂h_l`` of the pair's :func:`dpo_loss`
    ``ℓ_p``, so the gradients of the two terms add up to the pair's gradient exactly when the
    partners' constants equal the trained policy's log-ratios (a synchronous plan; with staleness
    ``τ`` they are ``τ`` updates old). The returned value counts each term half
    (``Σ_i ℓ_i − ½·Σ_i ℓ_i`` with the second sum detached), so the sums over a pair's two sequences
    also equal ``ℓ_p`` in value.

    Returns
    -------
    sum_loss, n_pairs
        The sum over the given sequences (value ``½·Σ_i ℓ_i``, gradient ``Σ_i ∇ℓ_i``) and half their
        number, so sums over all of a step's sequences divided by the counts give the mean pair loss.
    """
    z = sign.to(logratio.dtype) * (logratio - partner_logratio.detach())
    terms = -torch.nn.functional.logsigmoid(beta * z)
    total = terms.sum()
    return total - 0.5 * total.detach(), torch.tensor(logratio.numel() / 2)


def dpo_margins(logratio: Tensor, beta: float = 0.1) -> Tensor:
    """``[P]`` implicit reward margins ``β·(h_w − h_l)`` of pairs whose ``[2P]`` sequence log-ratios
    are interleaved (chosen at ``2p``, rejected at ``2p + 1``, as :func:`dpo_batch` orders them)."""
    pairs = logratio.detach().reshape(-1, 2)
    return beta * (pairs[:, 0] - pairs[:, 1])


# ---------------------------------------------------------------------------------------------- loop
def response_slice(prompt_len: int, response_len: int) -> slice:
    """Positions whose outputs score the response: ``Lp − 1, …, Lp + Lr − 2``.

    Logits (or critic values) at position ``Lp − 1 + t`` belong to the state before response token
    ``t``.
    """
    return slice(prompt_len - 1, prompt_len - 1 + response_len)


def rollout_sample_ids(step: int, n: int) -> Tensor:
    """Global sample ids of the ``n = B·R`` rollouts of RL step ``step``: ``step·n + i``.

    Rollout ``i`` is rollout ``i mod R`` of prompt ``i // R``. Together with the run's seed these key
    the sampling noise (:func:`~rpeg.runtime.worker.model.sample_token`), so every placement generates the
    same tokens.
    """
    return torch.arange(step * n, (step + 1) * n, dtype=torch.int64)


def dpo_batch(task: SyntheticTask, step: int, pairs: int) -> dict[str, Tensor]:
    """The ``2·pairs`` sequences of DPO step ``step`` from :meth:`SyntheticTask.preference_pairs`.

    Sequence ``2p`` is pair ``p``'s chosen response and ``2p + 1`` its rejected one, both after the
    pair's prompt; ``ids`` are :func:`rollout_sample_ids` (as a generation would number them),
    ``mask`` is all ones (every response has ``Lr`` tokens) and ``sign`` is ``+1`` for chosen and
    ``−1`` for rejected.

    Returns
    -------
    dict
        ``ids [2P]``, ``tokens [2P, Lp + Lr]`` int64, ``mask [2P, Lr]``, ``sign [2P]``.
    """
    prompts, chosen, rejected = task.preference_pairs(step, pairs)
    responses = torch.stack([chosen, rejected], dim=1).reshape(2 * pairs, task.response_len)
    tokens = torch.cat([prompts.repeat_interleave(2, dim=0), responses], dim=1)
    n = 2 * pairs
    return {
        "ids": rollout_sample_ids(step, n),
        "tokens": tokens,
        "mask": torch.ones(n, task.response_len),
        "sign": torch.tensor([1.0, -1.0]).repeat(pairs),
    }


def _response_logp(model: StageModel, tokens: Tensor, sl: slice, temperature: float) -> Tensor:
    out = model(tokens)
    logits = out[0] if isinstance(out, tuple) else out
    return token_logprobs(logits[:, sl], tokens[:, sl.start + 1 : sl.stop + 1], temperature=temperature)


def train_reference(
    algorithm: Literal["ppo", "grpo", "remax", "dpo"],
    steps: int,
    *,
    seed: int,
    batch: int,
    rollouts: int,
    scale: str | dict[str, int] = "tiny",
    config: RLConfig | None = None,
    task: SyntheticTask | None = None,
    spec: ModelSpec | None = None,
    actor_seed: int | None = None,
) -> list[float]:
    """Single-process PPO/GRPO/ReMax/DPO on :class:`SyntheticTask`: the ground truth for distributed runs.

    Online algorithms, each step ``k``: prompts ``task.prompts(k, batch)``, each repeated
    ``rollouts`` times (rollout ``i`` of the ``B·R`` belongs to prompt ``i // R``); the actor
    generates ``Lr`` tokens with ``generate(actor, …, seed=seed, sample_ids=rollout_sample_ids(k,
    B·R))`` and the log-probs recorded there are ``log π_old``; the task scores the completions;
    the frozen reference (the initial actor) gives ``log π_ref``.

    * PPO: the critic's values ``V_t`` (critic = ``StageModel(SCALAR, seed=seed + 1)``) and
      :func:`token_rewards` feed :func:`gae`; the actor minimises
      ``Σ policy_loss / N_tok``, the critic ``Σ value_loss / N_tok``.
    * GRPO: :func:`grpo_advantages` per sequence; the actor minimises
      ``(Σ policy_loss + Σ kl_loss) / N_tok``.
    * ReMax: the actor also decodes each prompt greedily (temperature 0); :func:`remax_advantages`
      against the greedy response's reward; the actor minimises ``Σ reinforce_loss / N_tok``.
    * DPO (``rollouts = 2``, offline): the ``batch`` pairs of :func:`dpo_batch` at step ``k``; the
      actor minimises the mean :func:`dpo_loss` with ``β = config.dpo_beta``.

    One epoch, one Adam step per model per RL step, over the whole batch. The actor is
    ``StageModel(spec, LM, seed=actor_seed)`` (``actor_seed`` defaults to ``seed``; a distributed
    run's actor group seed reproduces its initial weights) with ``spec = scale_spec(spec or
    llama2-7b, scale, vocab=task.vocab)``.

    Returns
    -------
    list[float]
        Per step, before that step's update: the mean task reward of the sampled rollouts (PPO,
        GRPO, ReMax), or the mean implicit reward margin :func:`dpo_margins` of the pairs (DPO).

    Raises
    ------
    ValueError
        For an unknown ``algorithm`` (listing the known ones), ``steps < 1``, GRPO with
        ``rollouts < 2`` or DPO with ``rollouts != 2``.
    """
    if algorithm not in ("ppo", "grpo", "remax", "dpo"):
        raise ValueError(f"train_reference: unknown algorithm={algorithm!r}; known: ppo, grpo, remax, dpo")
    if steps < 1:
        raise ValueError(f"train_reference: steps must be >= 1, got {steps!r}")
    if algorithm == "dpo" and rollouts != 2:
        raise ValueError(f"train_reference: dpo needs rollouts=2 (chosen, rejected), got {rollouts!r}")
    cfg = config or RLConfig()
    task = task or SyntheticTask(seed=seed)
    spec = scale_spec(spec or model_preset("llama2-7b"), scale, vocab=task.vocab)
    actor = StageModel(spec, Head.LM, seed=seed if actor_seed is None else actor_seed)
    reference = copy.deepcopy(actor).requires_grad_(False)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=cfg.lr)
    critic = critic_opt = None
    if algorithm == "ppo":
        critic = StageModel(spec, Head.SCALAR, seed=seed + 1)
        critic_opt = torch.optim.Adam(critic.parameters(), lr=cfg.critic_lr)

    n, Lp, Lr = batch * rollouts, task.prompt_len, task.response_len
    sl = response_slice(Lp, Lr)
    history: list[float] = []
    for step in range(steps):
        if algorithm == "dpo":
            pairs = dpo_batch(task, step, batch)
            tokens, mask = pairs["tokens"], pairs["mask"]
            with torch.no_grad():
                ref_seq = (_response_logp(reference, tokens, sl, cfg.temperature) * mask).sum(dim=1)
            seq = (_response_logp(actor, tokens, sl, cfg.temperature) * mask).sum(dim=1)
            history.append(float(dpo_margins(seq - ref_seq, cfg.dpo_beta).mean()))
            d_sum, d_count = dpo_loss(seq[0::2], seq[1::2], ref_seq[0::2], ref_seq[1::2], cfg.dpo_beta)
            actor_opt.zero_grad()
            (d_sum / d_count).backward()
            actor_opt.step()
            continue
        prompts = task.prompts(step, batch).repeat_interleave(rollouts, dim=0)
        tokens, old_logp = generate(
            actor, prompts, Lr, seed=seed, sample_ids=rollout_sample_ids(step, n), temperature=cfg.temperature
        )
        scores = task.reward(prompts, tokens[:, Lp:])
        history.append(float(scores.mean()))
        mask = torch.ones(n, Lr)
        with torch.no_grad():
            ref_logp = _response_logp(reference, tokens, sl, cfg.temperature)

        if algorithm == "ppo":
            values = critic(tokens)[:, sl]
            old_values = values.detach()  # V_old: the critic before this step's update
            rewards = token_rewards(scores, old_logp, ref_logp, mask, cfg.kl_coef)
            advantages, returns = gae(rewards, old_values, mask, cfg.gamma, cfg.lam)
            v_sum, v_count = value_loss(values, returns, mask, old_values, cfg.value_clip)
            critic_opt.zero_grad()
            (v_sum / v_count).backward()
            critic_opt.step()
        elif algorithm == "remax":
            greedy, _ = generate(
                actor,
                task.prompts(step, batch),
                Lr,
                seed=seed,
                sample_ids=rollout_sample_ids(step, batch),
                temperature=0.0,
            )
            baseline = task.reward(greedy[:, :Lp], greedy[:, Lp:]).repeat_interleave(rollouts)
            advantages = remax_advantages(scores, baseline)
        else:
            advantages = grpo_advantages(scores, rollouts)

        logp = _response_logp(actor, tokens, sl, cfg.temperature)
        if algorithm == "remax":
            p_sum, count = reinforce_loss(logp, advantages, mask)
        else:
            p_sum, count = policy_loss(logp, old_logp, advantages, mask, cfg.clip)
        if algorithm == "grpo":
            p_sum = p_sum + kl_loss(logp, ref_logp, mask, cfg.kl_coef)[0]
        actor_opt.zero_grad()
        (p_sum / count).backward()
        actor_opt.step()
    return history

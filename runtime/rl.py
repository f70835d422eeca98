"""PPO and GRPO math, independent of where it runs (SPEC §11), and a single-process reference loop.

Every loss is returned as a **sum over valid tokens together with the token count**. A distributed
trainer adds the sums of all data-parallel ranks and microbatches and divides by the *global* token
count, so its gradient equals the single-process gradient whatever the split. For the same reason
nothing here normalises with batch statistics (no advantage whitening across the batch): GRPO's
statistics are per prompt group, which a rank always holds whole.

Shapes: ``n`` sequences, ``T = Lr`` response tokens; ``mask[n, T]`` is 1 for a valid response token.
Logits at sequence position ``Lp − 1 + t`` predict response token ``t``, which is why the loop below
slices ``[:, Lp − 1 : Lp − 1 + Lr]`` (:func:`response_slice`).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from ..ir.models import ModelSpec, model_preset
from ..ir.types import Head
from .model import Transformer, generate, scale_spec, token_logprobs
from .task import SyntheticTask

__all__ = [
    "RLConfig",
    "gae",
    "grpo_advantages",
    "kl_loss",
    "kl_penalty",
    "policy_loss",
    "response_slice",
    "rollout_sample_ids",
    "token_rewards",
    "train_reference",
    "value_loss",
]


@dataclass(frozen=True)
class RLConfig:
    """Hyper-parameters of PPO/GRPO (defaults from SPEC §11 where it fixes them).

    Parameters
    ----------
    gamma, lam
        GAE discount ``γ`` and ``λ`` (``γ = 1``, ``λ = 0.95``), both in ``[0, 1]``.
    clip
        PPO ratio clip ``ε = 0.2`` (positive).
    kl_coef
        KL coefficient ``β = 0.01`` (non-negative): a per-token reward penalty in PPO, a loss term in
        GRPO.
    lr, critic_lr
        Adam learning rates of the actor and the critic (positive).
    value_clip
        Clip range of the clipped value loss, or ``None`` for the plain squared error.
    temperature
        Sampling temperature ``T`` (positive); log-probs are under ``softmax(logits/T)``.

    Raises
    ------
    ValueError
        If a field is out of range; the message names the field and its value.
    """

    gamma: float = 1.0
    lam: float = 0.95
    clip: float = 0.2
    kl_coef: float = 0.01
    lr: float = 1e-2
    critic_lr: float = 1e-2
    value_clip: float | None = None
    temperature: float = 1.0

    def __post_init__(self) -> None:
        for name in ("gamma", "lam"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"RLConfig: {name} must be in [0, 1], got {value!r}")
        for name in ("clip", "lr", "critic_lr", "temperature"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"RLConfig: {name} must be a positive number, got {value!r}")
        if not (math.isfinite(self.kl_coef) and self.kl_coef >= 0):
            raise ValueError(f"RLConfig: kl_coef must be non-negative, got {self.kl_coef!r}")
        if self.value_clip is not None and not self.value_clip > 0:
            raise ValueError(f"RLConfig: value_clip must be positive or None, got {self.value_clip!r}")


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


# ---------------------------------------------------------------------------------------------- losses
def policy_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip: float = 0.2
) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate (Schulman et al., 2017), summed over valid tokens.

    ``ρ_t = exp(log π − log π_old)``, ``ℓ_t = −min(ρ_t·A_t, clip(ρ_t, 1 − ε, 1 + ε)·A_t)``.

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

    Returns
    -------
    sum_loss, n_tokens
        ``Σ_t mask_t·ℓ_t`` (scalar) and ``Σ mask`` (scalar tensor).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    ratio = torch.exp(logp - old_logp.detach())
    adv = advantages.detach()
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1.0 - clip, 1.0 + clip) * adv)
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
    the sampling noise (:func:`~rpeg.runtime.model.sample_token`), so every placement generates the
    same tokens.
    """
    return torch.arange(step * n, (step + 1) * n, dtype=torch.int64)


def _response_logp(model: Transformer, tokens: Tensor, sl: slice, temperature: float) -> Tensor:
    out = model(tokens)
    logits = out[0] if isinstance(out, tuple) else out
    return token_logprobs(logits[:, sl] / temperature, tokens[:, sl.start + 1 : sl.stop + 1])


def train_reference(
    algorithm: Literal["ppo", "grpo"],
    steps: int,
    *,
    seed: int,
    batch: int,
    rollouts: int,
    scale: str | dict[str, int] = "tiny",
    config: RLConfig | None = None,
    task: SyntheticTask | None = None,
    spec: ModelSpec | None = None,
) -> list[float]:
    """Single-process PPO/GRPO on :class:`SyntheticTask`: the ground truth for distributed runs.

    Each step ``k``: prompts ``task.prompts(k, batch)``, each repeated ``rollouts`` times (rollout
    ``i`` of the ``B·R`` belongs to prompt ``i // R``); the actor generates ``Lr`` tokens with
    ``generate(actor, …, seed=seed, sample_ids=rollout_sample_ids(k, B·R))`` and the log-probs
    recorded there are ``log π_old``; the task scores the completions; the frozen reference (the
    initial actor) gives ``log π_ref``.

    * PPO: the critic's values ``V_t`` (critic = ``Transformer(SCALAR, seed=seed + 1)``) and
      :func:`token_rewards` feed :func:`gae`; the actor minimises
      ``Σ policy_loss / N_tok``, the critic ``Σ value_loss / N_tok``.
    * GRPO: :func:`grpo_advantages` per sequence; the actor minimises
      ``(Σ policy_loss + Σ kl_loss) / N_tok``.

    One epoch, one Adam step per model per RL step, over the whole batch. The actor is
    ``Transformer(spec, LM, seed=seed)`` with ``spec = scale_spec(spec or llama2-7b, scale,
    vocab=task.vocab)``.

    Returns
    -------
    list[float]
        Mean task reward of each step's rollouts (before that step's update).

    Raises
    ------
    ValueError
        For an unknown ``algorithm`` (listing the known ones), ``steps < 1`` or GRPO with
        ``rollouts < 2``.
    """
    if algorithm not in ("ppo", "grpo"):
        raise ValueError(f"train_reference: unknown algorithm={algorithm!r}; known: ppo, grpo")
    if steps < 1:
        raise ValueError(f"train_reference: steps must be >= 1, got {steps!r}")
    cfg = config or RLConfig()
    task = task or SyntheticTask(seed=seed)
    spec = scale_spec(spec or model_preset("llama2-7b"), scale, vocab=task.vocab)
    actor = Transformer(spec, Head.LM, seed=seed)
    reference = copy.deepcopy(actor).requires_grad_(False)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=cfg.lr)
    critic = critic_opt = None
    if algorithm == "ppo":
        critic = Transformer(spec, Head.SCALAR, seed=seed + 1)
        critic_opt = torch.optim.Adam(critic.parameters(), lr=cfg.critic_lr)

    n, Lp, Lr = batch * rollouts, task.prompt_len, task.response_len
    sl = response_slice(Lp, Lr)
    history: list[float] = []
    for step in range(steps):
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
        else:
            advantages = grpo_advantages(scores, rollouts)

        logp = _response_logp(actor, tokens, sl, cfg.temperature)
        p_sum, count = policy_loss(logp, old_logp, advantages, mask, cfg.clip)
        if algorithm == "grpo":
            p_sum = p_sum + kl_loss(logp, ref_logp, mask, cfg.kl_coef)[0]
        actor_opt.zero_grad()
        (p_sum / count).backward()
        actor_opt.step()
    return history

"""Tests of ``runtime/rl.py`` and ``runtime/task.py``: hand-computed GAE, GRPO advantages, clipping,
loss sums, configuration errors, the synthetic reward, and learning in the reference loop."""

from __future__ import annotations

import pytest
import torch

from rpeg.runtime.rl import (
    RLConfig,
    gae,
    grpo_advantages,
    kl_loss,
    kl_penalty,
    policy_loss,
    response_slice,
    rollout_sample_ids,
    token_rewards,
    train_reference,
    value_loss,
)
from rpeg.runtime.task import SyntheticTask


# ---------------------------------------------------------------------------------------------- GAE
def test_gae_hand_computed():
    # docstring example: δ = [−0.25, 0.75], A = [−0.25 + 0.5·0.75, 0.75]
    adv, ret = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.25]]), torch.ones(1, 2), 1.0, 0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.125, 0.75]]))
    torch.testing.assert_close(ret, torch.tensor([[0.625, 1.0]]))


def test_gae_with_spec_defaults_and_padding():
    """γ = 1, λ = 0.95, three tokens, the last one padded: A_1 = 1 − 0.2 = 0.8,
    A_0 = (0 + 0.2 − 0.1) + 0.95·0.8 = 0.86; padded positions are zero."""
    rewards = torch.tensor([[0.0, 1.0, 5.0]])
    values = torch.tensor([[0.1, 0.2, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv, ret = gae(rewards, values, mask)
    torch.testing.assert_close(adv, torch.tensor([[0.86, 0.8, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.96, 1.0, 0.0]]))
    # λ = 1, γ = 1: A_t + V_t is the reward-to-go (Monte-Carlo return).
    _, ret = gae(torch.tensor([[0.5, 0.0, 1.0]]), torch.rand(1, 3), torch.ones(1, 3), 1.0, 1.0)
    torch.testing.assert_close(ret, torch.tensor([[1.5, 1.0, 1.0]]))


def test_token_rewards_put_score_on_last_valid_token():
    logp = torch.tensor([[-1.0, -2.0, -1.0], [-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-2.0, -2.0, -1.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    r = token_rewards(torch.tensor([1.0, 0.5]), logp, ref, mask, kl_coef=0.1)
    torch.testing.assert_close(r, torch.tensor([[-0.1, 1.0, 0.0], [0.0, 0.0, 0.5]]))
    torch.testing.assert_close(kl_penalty(logp, ref, mask, 0.1), torch.tensor([[0.1, 0.0, 0.0], [0.0] * 3]))


# ---------------------------------------------------------------------------------------------- GRPO
def test_grpo_advantages_are_normalised_per_group():
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5, 0.0, 1.0]), group_size=2)
    s = 1 / (2**0.5 / 2 + 1e-6)  # sample std of {0, 1} is 1/√2
    torch.testing.assert_close(adv, torch.tensor([0.5 * s, -0.5 * s, 0.0, 0.0, -0.5 * s, 0.5 * s]))
    with pytest.raises(ValueError, match="group_size=4"):
        grpo_advantages(torch.zeros(6), group_size=4)


# ---------------------------------------------------------------------------------------------- losses
def test_policy_loss_clipping():
    """ε = 0.2: with A > 0 the ratio 1.5 is clipped to 1.2 (no gradient); with A < 0 the ratio 0.5
    is clipped to 0.8 (no gradient); a ratio inside the band keeps ρ·A and its gradient."""
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1]])).requires_grad_()
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    loss, n = policy_loss(logp, old, adv, torch.ones(1, 3), clip=0.2)
    torch.testing.assert_close(loss, torch.tensor(-(1.2 - 0.8 + 2.2)))
    assert n == 3
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0, -2.2]]))
    # pessimistic side: A > 0 with ρ < 1 − ε and A < 0 with ρ > 1 + ε are not clipped
    logp = torch.log(torch.tensor([[0.5, 1.5]]))
    loss, _ = policy_loss(logp, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2))
    torch.testing.assert_close(loss, torch.tensor(-(0.5 - 1.5)))


def test_losses_are_sums_so_splits_add_up():
    g = torch.Generator().manual_seed(0)
    logp, old = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
    adv, mask = torch.randn(4, generator=g), (torch.rand(4, 5, generator=g) > 0.3).float()
    whole, n = policy_loss(logp, old, adv, mask)
    halves = [policy_loss(logp[i : i + 2], old[i : i + 2], adv[i : i + 2], mask[i : i + 2]) for i in (0, 2)]
    torch.testing.assert_close(halves[0][0] + halves[1][0], whole)
    assert halves[0][1] + halves[1][1] == n == mask.sum()


def test_value_and_kl_losses():
    v, r = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 0.0]])
    loss, n = value_loss(v, r, torch.ones(1, 2))
    assert float(loss) == 0.5 and n == 2
    # clipped, old value 0, c = 0.2, target −1: unclipped (1 + 1)² = 4 > clipped (0.2 + 1)² = 1.44 → ½·4
    loss, _ = value_loss(
        torch.tensor([[1.0]]), torch.tensor([[-1.0]]), torch.ones(1, 1), torch.zeros(1, 1), 0.2
    )
    assert float(loss) == pytest.approx(2.0)
    # target 2: unclipped (1 − 2)² = 1, clipped (0.2 − 2)² = 3.24 → ½·3.24
    loss, _ = value_loss(
        torch.tensor([[1.0]]), torch.tensor([[2.0]]), torch.ones(1, 1), torch.zeros(1, 1), 0.2
    )
    assert float(loss) == pytest.approx(1.62)
    same, _ = kl_loss(torch.tensor([[-1.0]]), torch.tensor([[-1.0]]), torch.ones(1, 1))
    assert float(same) == 0.0
    d = torch.tensor(0.5)  # Δ = log π_ref − log π
    kl, _ = kl_loss(torch.tensor([[-1.5]]), torch.tensor([[-1.0]]), torch.ones(1, 1), kl_coef=0.1)
    assert float(kl) == pytest.approx(0.1 * float(torch.exp(d) - d - 1))


def test_rl_config_validation():
    assert RLConfig().gamma == 1.0 and RLConfig().lam == 0.95 and RLConfig().clip == 0.2
    for kwargs, text in [
        ({"lam": 1.5}, "lam must be in"),
        ({"clip": 0.0}, "clip must be a positive number, got 0.0"),
        ({"kl_coef": -0.1}, "kl_coef must be non-negative, got -0.1"),
        ({"lr": float("nan")}, "lr must be a positive number"),
        ({"value_clip": -1.0}, "value_clip must be positive or None, got -1.0"),
    ]:
        with pytest.raises(ValueError, match=text):
            RLConfig(**kwargs)


# ---------------------------------------------------------------------------------------------- task
def test_synthetic_task_is_seeded_and_verifiable():
    task = SyntheticTask(vocab=16, prompt_len=8, response_len=8, seed=0)
    assert torch.equal(task.prompts(3, 4), task.prompts(3, 4))
    assert not torch.equal(task.prompts(3, 4), task.prompts(4, 4))
    assert task.prompts(0, 5).shape == (5, 8) and task.random_baseline == 0.25
    members = task.target.nonzero().squeeze(1)
    outside = (~task.target).nonzero().squeeze(1)
    completions = torch.stack([members[:2].repeat(4), torch.cat([members[:2], outside[:6]])])
    torch.testing.assert_close(task.reward(task.prompts(0, 2), completions), torch.tensor([1.0, 0.25]))
    uniform = torch.randint(0, 16, (4000, 8), generator=torch.Generator().manual_seed(0))
    assert float(task.reward(task.prompts(0, 4000), uniform).mean()) == pytest.approx(0.25, abs=0.01)
    with pytest.raises(ValueError, match="vocab must be a positive integer, got 0"):
        SyntheticTask(vocab=0)


def test_response_slice_and_sample_ids():
    assert response_slice(8, 4) == slice(7, 11)
    assert rollout_sample_ids(2, 3).tolist() == [6, 7, 8]


# ---------------------------------------------------------------------------------------------- learning
@pytest.mark.parametrize(
    ("algorithm", "margin"),
    # measured with seed 0, 5 steps, B = 8, R = 4, lr 1e-2: PPO 0.293 → 0.629, 0.727;
    # GRPO 0.293 → 0.672, 0.812 (random policy: 0.25)
    [("ppo", 0.2), ("grpo", 0.25)],
)
def test_reference_training_raises_reward(algorithm, margin):
    torch.manual_seed(0)  # the loop must not depend on the global RNG; this guards against it
    history = train_reference(algorithm, 5, seed=0, batch=8, rollouts=4)
    assert len(history) == 5
    assert (history[-1] + history[-2]) / 2 > history[0] + margin
    torch.manual_seed(123)
    assert train_reference(algorithm, 2, seed=0, batch=8, rollouts=4) == history[:2]


def test_train_reference_rejects_unknown_algorithm():
    with pytest.raises(ValueError, match="algorithm='dpo'; known: ppo, grpo"):
        train_reference("dpo", 1, seed=0, batch=2, rollouts=2)

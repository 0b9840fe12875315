"""Metrics as a dashboard reads them: no meaningless huge numbers, and TRL ≤ 1.12's PPO names."""

import math

import pytest

from vcppo_trl import PPOConfig, PPOTrainer


def constant_reward(completions, **kwargs):
    return [-1.0] * len(completions)


@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
def test_explained_variance_with_equal_scores_is_nan(make_trainer, tiny_config, kl_coef):
    """Every response scores −1 (Monte-Carlo targets, λ_critic = 1): the returns differ only by float noise or small KL
    penalties, so EV is nan, never a huge negative number."""
    args = tiny_config(kl_coef=kl_coef, total_episodes=64, value_pretrain_steps=1)
    trainer = make_trainer(reward_funcs=constant_reward, args=args)
    trainer.train()
    evs = [
        h.get("value/explained_variance", h.get("value_pretrain/explained_variance"))
        for h in trainer.state.log_history
        if "objective/scores" in h
    ]
    assert len(evs) == 5
    assert all(math.isnan(ev) for ev in evs), evs


def test_explained_variance_with_lambda_below_one_stays_finite(make_trainer, tiny_config):
    """With λ < 1 the targets bootstrap from the critic and vary with it: a real (modest) number is logged."""
    args = tiny_config(PPOConfig, kl_coef=0.0, total_episodes=32)
    trainer = make_trainer(cls=PPOTrainer, reward_funcs=constant_reward, args=args)
    trainer.train()
    evs = [h["value/explained_variance"] for h in trainer.state.log_history if "value/explained_variance" in h]
    assert all(math.isfinite(ev) and -10 < ev <= 1 for ev in evs), evs

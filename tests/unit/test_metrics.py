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


# TRL ≤ 1.12 `trl.experimental.ppo.PPOTrainer` logged these (besides `eps`, a wall-clock rate).
TRL_PPO_METRICS = (
    "objective/kl",
    "objective/entropy",
    "objective/non_score_reward",
    "objective/rlhf_reward",
    "objective/scores",
    "policy/approxkl_avg",
    "policy/clipfrac_avg",
    "loss/policy_avg",
    "loss/value_avg",
    "val/clipfrac_avg",
    "policy/entropy_avg",
    "val/ratio",
    "val/ratio_var",
    "val/num_eos_tokens",
    "lr",
    "episode",
)


def test_trl_ppo_metric_names_are_logged(make_trainer, tiny_config):
    from ..builders import length_reward

    args = tiny_config(PPOConfig, kl_coef=0.05, total_episodes=32)
    trainer = make_trainer(cls=PPOTrainer, reward_funcs=length_reward, args=args)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "episode" in h]
    assert len(logs) == 2
    for log in logs:
        missing = [name for name in TRL_PPO_METRICS if name not in log]
        assert not missing, missing
        assert log["val/ratio"] == log["val/ratio_avg"]
        assert log["val/ratio_var"] >= 0 and math.isfinite(log["val/ratio_var"])
    # Values as TRL defined them, checked on the last rollout.
    rollout = trainer.last_update.rollout
    last = logs[-1]
    assert last["val/num_eos_tokens"] == float(rollout.has_stop.sum())
    mask = rollout.response_mask
    expected_entropy = float((-rollout.logprobs * mask).sum(1)[mask.any(1)].mean())
    assert last["objective/entropy"] == pytest.approx(expected_entropy, rel=1e-6)
    assert last["objective/entropy"] > 0

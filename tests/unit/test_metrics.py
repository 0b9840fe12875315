"""Metrics as a dashboard reads them: no meaningless huge numbers, and TRL ≤ 1.12's PPO names."""

import math

import pytest
import torch

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


@pytest.mark.parametrize("estimator", ["gae", "grpo"])
def test_trl_grpo_metric_names_are_logged_with_its_meanings(make_trainer, tiny_config, estimator):
    """TRL GRPO's keys beside ours (issue 59), each checked on the last update against TRL's own definition."""
    from trl.trainer.utils import nanstd

    from ..builders import length_reward

    args = tiny_config(kl_coef=0.05, num_generations=4, advantage_estimator=estimator, max_steps=2)
    trainer = make_trainer(reward_funcs=length_reward, args=args)
    trainer.train()
    last = [h for h in trainer.state.log_history if "episode" in h][-1]
    rollout = trainer.last_update.rollout
    raw = rollout.raw_scores
    assert last["reward"] == pytest.approx(float(raw.mean()))
    assert last["reward_std"] == pytest.approx(float(nanstd(raw)))
    zero = torch.isclose(nanstd(raw.view(-1, 4), dim=1), torch.zeros(raw.numel() // 4))
    assert last["frac_reward_zero_std"] == pytest.approx(float(zero.float().mean()))
    lengths = rollout.action_tokens.sum(1).float()
    assert last["completions/mean_length"] == pytest.approx(float(lengths.mean()))
    assert last["completions/min_length"] == float(lengths.min())
    assert last["completions/max_length"] == float(lengths.max())
    assert last["completions/clipped_ratio"] == pytest.approx(float((~rollout.has_stop).float().mean()))
    stopped = lengths[rollout.has_stop] if rollout.has_stop.any() else torch.zeros(1)
    assert last["completions/mean_terminated_length"] == pytest.approx(float(stopped.mean()))
    for grpo, ours in (
        ("entropy", "policy/entropy_avg"),
        ("clip_ratio/low_mean", "policy/clipfrac_low_avg"),
        ("clip_ratio/high_mean", "policy/clipfrac_high_avg"),
        ("clip_ratio/region_mean", "policy/clipfrac_avg"),
    ):
        assert last[grpo] == last[ours], grpo
    assert 0 <= last["clip_ratio/low_min"] <= last["clip_ratio/low_mean"] + 1e-9
    assert last["clip_ratio/high_max"] >= last["clip_ratio/high_mean"] - 1e-9
    if estimator == "grpo":  # the KL is a loss term: TRL's `kl` is its mean k3 × ratio
        assert last["kl"] == last["policy/kl_loss_term_avg"]
    else:  # the KL is in the rewards: per token, where objective/kl sums it per response
        tokens = rollout.action_tokens
        assert last["kl"] == pytest.approx(float(rollout.kl[tokens].mean()), rel=1e-5)
        assert last["objective/kl"] == pytest.approx(float(rollout.kl.sum(1).mean()), rel=1e-5)


def test_without_a_kl_no_kl_is_logged_under_grpo_names(make_trainer, tiny_config):
    from ..builders import length_reward

    trainer = make_trainer(reward_funcs=length_reward, args=tiny_config(kl_coef=0.0, max_steps=1))
    trainer.train()
    last = [h for h in trainer.state.log_history if "episode" in h][-1]
    assert "kl" not in last and "reward" in last

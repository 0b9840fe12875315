"""The trainer with a group advantage estimator: no critic anywhere, TRL's advantages trained on as they are, GRPO's KL
as a loss term; and one field turning the critic back on."""

import pytest
import torch

from vcppo_trl import PPOTrainer, ValuePretrainCallback, VCPPOTrainer
from vcppo_trl.algo import group_advantages
from vcppo_trl.trainer.advantages import sequence_scores

from ..builders import step_logs


def test_grpo_builds_no_critic_and_trains_on_trls_advantage_unwhitened(make_trainer, tiny_config):
    args = tiny_config(
        advantage_estimator="grpo", num_generations=4, num_mini_batches=1, gradient_accumulation_steps=1
    )
    trainer = make_trainer(args=args)
    assert trainer.model.critic is None and trainer.unwrapped_policy_and_critic()[1] is None
    trainer.train()
    assert {group.get("role") for group in trainer.optimizer.param_groups} == {"policy"}
    record = trainer.last_update
    rollout = record.rollout
    assert rollout.values is None and record.returns is None
    expected = group_advantages(sequence_scores(rollout), 4).unsqueeze(1) * rollout.action_tokens
    assert torch.equal(record.advantages, expected)
    for metrics in step_logs(trainer).values():
        assert not [k for k in metrics if k.startswith(("value/", "val/vpred", "loss/value", "value_lr"))]


def test_the_policy_loss_is_minus_the_token_mean_advantage_at_ratio_one(make_trainer, tiny_config):
    """One epoch of one mini-batch at ratio 1: the token-mean policy loss is −(the token-mean advantage), so the
    advantages reached the loss as TRL's, not whitened (whitened ones have token mean 0)."""
    args = tiny_config(
        advantage_estimator="rloo",
        num_generations=4,
        num_mini_batches=1,
        gradient_accumulation_steps=1,
        per_device_train_batch_size=16,
        total_episodes=16,
        learning_rate=0.0,
    )
    trainer = make_trainer(args=args)
    trainer.train()
    record = trainer.last_update
    tokens = record.rollout.action_tokens
    token_mean = float((record.advantages * tokens).sum() / tokens.sum())
    assert trainer.state.log_history[0]["loss/policy_avg"] == pytest.approx(-token_mean, abs=1e-5)


def test_grpo_beta_is_a_kl_loss_term(make_trainer, tiny_config):
    args = tiny_config(advantage_estimator="grpo", num_generations=4, kl_coef=0.1, total_episodes=48)
    trainer = make_trainer(args=args)
    assert trainer.ref_model is not None  # the reference the loss term needs
    trainer.train()
    logs = step_logs(trainer)
    kl_terms = [m["policy/kl_loss_term_avg"] for m in logs.values()]
    assert all(k >= 0 for k in kl_terms) and kl_terms[-1] > 0  # k3 ≥ 0, and the policy moved from the reference
    assert all(m["objective/non_score_reward"] == 0 for m in logs.values())  # not in the reward


def test_critic_inputs_are_refused_without_a_critic(make_trainer, tiny_config, tiny_policy):
    args = tiny_config(advantage_estimator="grpo", num_generations=2)
    with pytest.raises(ValueError, match="builds no critic, so `value_model`"):
        make_trainer(args=args, value_model=tiny_policy)
    with pytest.raises(ValueError, match="A ValuePretrainCallback pretrains the critic"):
        make_trainer(args=args, callbacks=[ValuePretrainCallback(max_steps=2)])


@pytest.mark.parametrize("cls", [PPOTrainer, VCPPOTrainer])
def test_one_field_turns_the_critic_on(make_trainer, tiny_config, cls):
    kwargs = dict(num_generations=2, total_episodes=16)
    group = make_trainer(cls, args=tiny_config(cls._config_class, advantage_estimator="rloo", **kwargs))
    with_critic = make_trainer(cls, args=tiny_config(cls._config_class, **kwargs))
    assert group.model.critic is None and with_critic.model.critic is not None
    with_critic.train()
    assert "value/explained_variance" in step_logs(with_critic)[1]

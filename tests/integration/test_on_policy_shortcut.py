"""The on-policy shortcut (issue 11): with one PPO epoch, one mini-batch, no KL and no dropout, the old log-probs are
the training forward's, detached, and the rollout runs no policy forward. Losses and gradients must equal the path
with the extra forward."""

from __future__ import annotations

import copy

import pytest
import torch

from vcppo_trl import PPOConfig, PPOTrainer
from vcppo_trl.rollout import WholeResponses
from vcppo_trl.rollout.settings import old_logprobs_from_training_forward


def _rows(trainer):
    return [trainer.train_dataset[i] for i in range(trainer.batches.local_batch_size)]


def _spy_rollout_policy_forwards(trainer):
    """Record `compute_policy` of every rollout forward (the maker's [`~rollout.forwards.RolloutForwards`] runs them)."""
    calls = []
    original = trainer.rollout_maker.forwarder.forward

    def spy(rollout, compute_policy, **kwargs):
        calls.append(compute_policy)
        return original(rollout, compute_policy, **kwargs)

    trainer.rollout_maker.forwarder.forward = spy
    return calls


def _capture_step_grads(trainer):
    grads = {}
    wrapper = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    original = trainer.optimizer.step

    def step(*args, **kwargs):
        for name, p in wrapper.named_parameters():
            grads[name] = None if p.grad is None else p.grad.detach().clone()
        return original(*args, **kwargs)

    trainer.optimizer.step = step
    return grads


ON_POLICY = dict(num_mini_batches=1, num_ppo_epochs=1, kl_coef=0.0, gradient_accumulation_steps=2)


@pytest.mark.parametrize("loss_type", ["token_mean", "seq_mean_token_mean"])
def test_shortcut_gives_the_same_losses_and_gradients_without_the_rollout_policy_forward(
    make_trainer, tiny_policy, tiny_config, loss_type
):
    policy0 = copy.deepcopy(tiny_policy)
    critic0 = None
    results = {}
    for shortcut in (False, True):
        args = tiny_config(PPOConfig, on_policy_shortcut=shortcut, loss_type=loss_type, max_grad_norm=0.0, **ON_POLICY)
        trainer = make_trainer(
            cls=PPOTrainer,
            model=copy.deepcopy(policy0),
            value_model=None if critic0 is None else copy.deepcopy(critic0),
            args=args,
        )
        if critic0 is None:
            critic0 = copy.deepcopy(trainer.model.critic)
        assert old_logprobs_from_training_forward(trainer.args) is shortcut
        trainer._setup_training()
        forwards = _spy_rollout_policy_forwards(trainer)
        grads = _capture_step_grads(trainer)
        torch.manual_seed(0)  # the same responses on both paths (no forward draws random numbers)
        rows = _rows(trainer)
        trainer.rollouts = WholeResponses(trainer.rollout_maker, draw=lambda rows=rows: rows)
        metrics = trainer.training_update()
        results[shortcut] = (forwards, grads, metrics, trainer.last_update.rollout)

    slow_forwards, slow_grads, slow_metrics, slow_rollout = results[False]
    fast_forwards, fast_grads, fast_metrics, fast_rollout = results[True]
    assert slow_forwards == [True] and fast_forwards == [False]  # the shortcut skips the rollout's policy forward
    torch.testing.assert_close(fast_rollout.response_ids, slow_rollout.response_ids)
    mask = slow_rollout.response_mask
    assert mask.any()
    # The learner's forward gave the old log-probs, equal to the rollout forward's (eval mode, no dropout).
    torch.testing.assert_close(fast_rollout.logprobs[mask], slow_rollout.logprobs[mask], rtol=1e-5, atol=1e-5)
    assert fast_metrics["val/ratio"] == 1.0 and fast_metrics["policy/approxkl_avg"] == 0.0
    for name in ("loss/policy_avg", "loss/value_avg", "objective/entropy"):
        assert fast_metrics[name] == pytest.approx(slow_metrics[name], rel=1e-5, abs=1e-7), name
    assert set(fast_grads) == set(slow_grads)
    for name, grad in slow_grads.items():
        assert grad is not None and fast_grads[name] is not None, name
        torch.testing.assert_close(fast_grads[name], grad, rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.parametrize(
    "overrides",
    [
        {"on_policy_shortcut": False},
        {"num_ppo_epochs": 2},
        {"num_mini_batches": 2},
        {"kl_coef": 0.05},
        {"disable_dropout": False},
    ],
    ids=["turned-off", "two-epochs", "two-mini-batches", "kl", "dropout"],
)
def test_shortcut_is_not_taken_when_the_update_is_not_exactly_on_policy(make_trainer, tiny_config, overrides):
    trainer = make_trainer(cls=PPOTrainer, args=tiny_config(PPOConfig, **{**ON_POLICY, **overrides}))
    assert not old_logprobs_from_training_forward(trainer.args)
    rollout, _ = trainer.rollout_maker.make(_rows(trainer))
    assert rollout.logprobs is not None and rollout.logprobs.shape == rollout.response_mask.shape


def test_value_pretraining_under_the_shortcut_computes_no_policy_logprobs(make_trainer, tiny_config):
    trainer = make_trainer(args=tiny_config(value_pretrain_steps=1, total_episodes=8, **ON_POLICY))
    assert old_logprobs_from_training_forward(trainer.args)
    forwards = _spy_rollout_policy_forwards(trainer)
    trainer.train()
    assert forwards == [False, False]  # one pretraining update, one VC-PPO update: no rollout policy forward
    logged = [entry for entry in trainer.state.log_history if "objective/entropy" in entry]
    assert len(logged) == 1 and logged[0]["val/ratio"] == 1.0

"""`critic_target_correction="vtrace"` in training: the critic's targets are V-trace's over the rollout's own tensors,
they differ from GAE's λ = 1 returns only where an older policy sampled the tokens, and what V-trace cannot combine
with is refused with the reason."""

from __future__ import annotations

import pytest
import torch

from vcppo_trl.algo import dual_lambda_gae, vtrace_returns
from vcppo_trl.rollout import gae_bootstrap, old_logprobs_from_training_forward


def test_vtrace_targets_on_one_step_off_rollouts(fresh_trainer, monkeypatch):
    from vcppo_trl.learner.ppo_learner import PPOLearner

    seen = []
    update = PPOLearner.update

    def spy(self, rollout, advantages, returns, **kwargs):
        seen.append((rollout, returns))
        return update(self, rollout, advantages, returns, **kwargs)

    monkeypatch.setattr(PPOLearner, "update", spy)
    trainer = fresh_trainer(
        max_staleness=1, value_pretrain_steps=1, total_episodes=64, critic_target_correction="vtrace"
    )
    trainer.train()
    args = trainer.args
    assert len(seen) == 5
    gaps = []
    for rollout, returns in seen:
        if rollout.logprobs is None:  # value pretraining: the frozen policy sampled its own rollout
            log_ratio = torch.zeros_like(rollout.values, dtype=torch.float32)
        else:
            log_ratio = rollout.logprobs.float() - rollout.sampler_logprobs.float()
        want = vtrace_returns(
            rollout.rewards,
            rollout.values,
            rollout.action_tokens,
            log_ratio,
            gamma=args.gamma,
            rho_bar=args.vtrace_rho_bar,
            c_bar=args.vtrace_c_bar,
            bootstrap_values=gae_bootstrap(rollout, args.window_bootstrap),
        )
        assert torch.equal(returns, want)
        _, lambda_one = dual_lambda_gae(
            rollout.rewards, rollout.values, rollout.response_mask, gamma=args.gamma, lam_actor=1.0, lam_critic=1.0
        )
        gaps.append(float((returns - lambda_one).abs().max()))
    # Updates 1 and 2 were sampled by the weights that train them (value pretraining leaves the policy as it was):
    # V-trace is GAE's λ = 1 return. From update 3 on the sampler's weights are one update old: the targets move.
    assert max(gaps[:2]) < 1e-4
    assert min(gaps[2:]) > 1e-4


def test_vtrace_turns_off_the_on_policy_shortcut(tiny_config):
    shortcut = dict(num_ppo_epochs=1, num_mini_batches=1, on_policy_shortcut=True, value_pretrain_steps=0)
    assert old_logprobs_from_training_forward(tiny_config(**shortcut))
    assert not old_logprobs_from_training_forward(tiny_config(critic_target_correction="vtrace", **shortcut))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(critic_target_correction="retrace"), "`critic_target_correction` must be None or one of 'vtrace'"),
        (dict(critic_target_correction="vtrace", vtrace_rho_bar=0.0), "`vtrace_rho_bar` must be > 0"),
        (dict(critic_target_correction="vtrace", vtrace_c_bar=-1.0), "`vtrace_c_bar` must be > 0"),
        (
            dict(critic_target_correction="vtrace", generation_window=4),
            "generate in the trainer's process keeps none for a generation window's earlier tokens",
        ),
    ],
)
def test_what_vtrace_cannot_take_is_refused_with_the_reason(tiny_config, overrides, match):
    with pytest.raises(ValueError, match=match):
        tiny_config(**overrides)


def test_vtrace_without_a_critic_is_refused(tiny_config):
    from vcppo_trl import PPOConfig

    with pytest.raises(ValueError, match="has no critic"):
        tiny_config(
            PPOConfig, advantage_estimator="grpo", num_generations=2, critic_target_correction="vtrace", lam=0.95
        )


def test_the_behaviour_ratio_takes_ppos_ratio_against_the_samplers_log_probs(fresh_trainer, monkeypatch):
    """`off_policy_ratio="behaviour"`: the loss's old log-probs are the rollout worker's, with no separate weight;
    the default ("decoupled") keeps the trainer's recomputed ones and weights by π_old / π_sampler."""
    from vcppo_trl.learner.ppo_learner import PPOLearner

    batch_of = PPOLearner.batch_of
    for mode in ("behaviour", "decoupled"):
        seen = []

        def spy(self, rollout, advantages, seen=seen, **kwargs):
            batch = batch_of(self, rollout, advantages, **kwargs)
            seen.append((rollout, batch, kwargs["train_policy"]))
            return batch

        monkeypatch.setattr(PPOLearner, "batch_of", spy)
        trainer = fresh_trainer(max_staleness=1, value_pretrain_steps=0, total_episodes=48, off_policy_ratio=mode)
        trainer.train()
        assert [train for _, _, train in seen] == [True] * 3
        for rollout, batch, _ in seen:
            if mode == "behaviour":
                assert torch.equal(batch.old_logprobs, rollout.sampler_logprobs.float())
                assert batch.sampler_logprobs is None
            else:
                assert torch.equal(batch.old_logprobs, rollout.logprobs)
                assert torch.equal(batch.sampler_logprobs, rollout.sampler_logprobs)
        losses = [entry["loss/policy_avg"] for entry in trainer.state.log_history if "loss/policy_avg" in entry]
        assert len(losses) == 3 and bool(torch.isfinite(torch.tensor(losses)).all())

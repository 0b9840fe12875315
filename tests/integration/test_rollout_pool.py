"""`rollout_pool_size`: more responses in flight than the rollout batch under generation windows (issue 49). Every
in-flight response advances by its window each update, and the update trains all of the pool's rows in the same
`num_ppo_epochs × num_mini_batches` optimizer steps (more micro-batches, not more steps)."""

from __future__ import annotations

import pytest
import torch

from ..builders import step_logs, weights


def test_a_larger_pool_trains_every_in_flight_row_in_the_same_optimizer_steps(fresh_trainer, monkeypatch):
    from vcppo_trl.learner.optimizer_steps import OptimizerSteps
    from vcppo_trl.learner.ppo_learner import PPOLearner

    seen, steps = [], []
    update, optimizer_step = PPOLearner.update, OptimizerSteps.step

    def spy_update(self, rollout, advantages, returns, **kwargs):
        steps.append(0)
        seen.append((rollout, self.policy_mask(rollout)))
        return update(self, rollout, advantages, returns, **kwargs)

    def spy_step(self, *args, **kwargs):
        steps[-1] += 1
        return optimizer_step(self, *args, **kwargs)

    monkeypatch.setattr(PPOLearner, "update", spy_update)
    monkeypatch.setattr(OptimizerSteps, "step", spy_step)
    # The rollout batch is 16 (4 × 2 × 2); the pool holds 32 responses in flight.
    trainer = fresh_trainer(generation_window=4, rollout_pool_size=32, total_episodes=96, num_ppo_epochs=2)
    trainer.train()
    logs = step_logs(trainer)
    assert len(logs) == 6  # total_episodes keeps its meaning: updates × rollout batch
    assert steps == [2 * 2] * 6  # num_ppo_epochs × num_mini_batches, whatever the pool's size
    for (rollout, policy_mask), entry in zip(seen, logs.values()):
        assert rollout.response_ids.shape[0] == 32  # every in-flight response, advanced by its window
        assert bool((policy_mask == rollout.window_mask).all())
        assert entry["rollout/finished_responses"] + entry["rollout/in_flight"] == 32
    # Once the pool is full, the responses finished per update exceed what a pool of the batch would finish.
    assert sum(e["rollout/finished_responses"] for e in logs.values()) > 0


def test_the_default_pool_is_the_rollout_batch(fresh_trainer):
    from vcppo_trl.rollout.windowed import WindowedRollouts

    trainer = fresh_trainer(generation_window=4, total_episodes=16)
    trainer.train()
    assert isinstance(trainer.rollouts, WindowedRollouts) and trainer.rollouts.pool.size == 16


def test_a_resumed_run_with_a_larger_pool_continues_exactly(fresh_trainer, tmp_path):
    overrides = dict(generation_window=4, rollout_pool_size=32, total_episodes=64, output_dir=str(tmp_path / "run"))
    whole = fresh_trainer(save_strategy="steps", save_steps=2, **overrides)
    whole.train()
    checkpoint = tmp_path / "run" / "checkpoint-2"
    assert len(torch.load(checkpoint / "rollout_pool_0.pt", weights_only=False)["slots"]) > 16
    resumed = fresh_trainer(**overrides)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    after = {s: e for s, e in step_logs(resumed).items() if s > 2}
    assert after == {s: e for s, e in step_logs(whole).items() if s > 2} and len(after) == 2
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), weights(whole)))
    smaller = fresh_trainer(**{**overrides, "rollout_pool_size": None})
    with pytest.raises(ValueError, match="more than this run's pool of 16"):
        smaller.train(resume_from_checkpoint=str(checkpoint))


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(rollout_pool_size=32), "set generation_window too"),
        (dict(generation_window=4, rollout_pool_size=8), "at least the rollout batch"),
        (dict(generation_window=4, rollout_pool_size=20), "multiple of per_device_train_batch_size"),
    ],
)
def test_bad_pool_sizes_are_refused_with_the_fix(tiny_config, overrides, match):
    with pytest.raises(ValueError, match=match):
        tiny_config(**overrides)


def test_whitening_statistics_from_finished_responses(fresh_trainer, monkeypatch):
    """`window_whitening="finished"`: the mean and variance come from the finished responses' window tokens and are
    applied to every window token; with a window as long as the response every response finishes and it is 'all'."""
    from vcppo_trl.learner.ppo_learner import PPOLearner

    whitened = []
    whiten = PPOLearner.whiten

    def spy(self, values, mask, shift_mean=True, stats_mask=None):
        out = whiten(self, values, mask, shift_mean=shift_mean, stats_mask=stats_mask)
        whitened.append((out, mask, stats_mask))
        return out

    monkeypatch.setattr(PPOLearner, "whiten", spy)
    trainer = fresh_trainer(generation_window=4, window_whitening="finished", total_episodes=64)
    trainer.train()
    checked = 0
    for out, mask, stats_mask in whitened:
        if stats_mask is None:  # no response finished in that update: every window token's statistics
            continue
        finished_tokens = mask & stats_mask
        assert abs(float(out[finished_tokens].mean())) < 1e-5 and bool((out[~mask] == 0).all())
        if bool((mask & ~stats_mask).any()):
            checked += 1
    assert checked > 0  # updates with unfinished window tokens whitened by the finished ones' statistics
    full = {}
    for mode in ("all", "finished"):
        run = fresh_trainer(generation_window=16, window_whitening=mode, total_episodes=32)
        run.train()
        full[mode] = weights(run)
    assert all(torch.equal(a, b) for a, b in zip(full["all"], full["finished"]))

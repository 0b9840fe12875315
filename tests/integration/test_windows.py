"""Generation windows (`generation_window`): the pool of in-flight responses, the rollout of a window, and training
with it (one process, HF sampler)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vcppo_trl.rollout.response_pool import ResponsePool
from vcppo_trl.sampling.seam import Samples, truncate_at_stop

from ..builders import step_logs, weights

STOP, PAD = 2, 0


def window_samples(rows: list[list[int]]) -> Samples:
    width = max(len(r) for r in rows)
    padded = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
    return Samples(*truncate_at_stop(padded, [STOP], PAD))


def test_pool_continues_responses_and_finishes_them_only_at_a_stop_or_the_length_cap():
    pool = ResponsePool(3, window=4, response_length=6)
    batches = iter([[{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c"}], [{"prompt": "d"}, {"prompt": "e"}]])
    assert pool.refill(lambda: next(batches), lambda rows: [[10 + i] for i, _ in enumerate(rows)]) == 3
    assert pool.budget() == 4
    # a: stops inside the window; b: no stop (cut, goes on); c: no stop either.
    step = pool.advance(window_samples([[5, STOP, 9, 9], [5, 6, 7, 8], [5, 6, 7, 8]]))
    assert step.finished == [True, False, False] and step.has_stop == [True, False, False]
    assert step.starts == [0, 0, 0] and step.new_tokens == 2 + 4 + 4 and step.prefilled_tokens == 0
    assert pool.release(step.finished) == 2
    assert pool.refill(lambda: next(batches), lambda rows: [[20]] * len(rows)) == 1
    assert [s.row["prompt"] for s in pool.slots] == ["b", "c", "d"] and pool.pending == [{"prompt": "e"}]
    ids, mask = pool.contexts(PAD, torch.device("cpu"))
    assert ids[0].tolist() == [11, 5, 6, 7, 8] and ids[2].tolist() == [PAD, PAD, PAD, PAD, 20]
    assert mask[2].tolist() == [0, 0, 0, 0, 1]
    assert pool.budget() == 4  # d has 6 tokens of room
    # b: 2 tokens of room, its stop would come third (never sampled within the cap): finished at the cap, no stop.
    # c: stops on its last allowed token. d: a fresh response, cut.
    step = pool.advance(window_samples([[1, 1, STOP, 9], [1, STOP, 9, 9], [1, 1, 1, 1]]))
    assert step.finished == [True, True, False] and step.has_stop == [False, True, False]
    assert [s.response_ids for s in pool.slots] == [[5, 6, 7, 8, 1, 1], [5, 6, 7, 8, 1, STOP], [1, 1, 1, 1]]
    assert step.windows == [2, 2, 1] and step.prefilled_tokens == 8
    pool.tag_new_tokens(0)
    state = pool.state_dict()
    restored = ResponsePool(3, window=4, response_length=6)
    restored.load_state_dict(state)
    assert restored.state_dict() == state


def test_pool_tokens_age_with_each_policy_step_and_an_old_checkpoint_gets_an_age():
    pool = ResponsePool(2, window=3, response_length=8)
    pool.refill(lambda: [{"prompt": "a"}, {"prompt": "b"}], lambda rows: [[10]] * len(rows))
    pool.advance(window_samples([[5, 6, 7], [5, 6, 7]]))
    pool.tag_new_tokens(0)
    pool.after_policy_step()
    pool.advance(window_samples([[1, 1, 1], [1, STOP, 9]]))
    pool.tag_new_tokens(1)  # sampled by a worker one update ahead
    assert [s.token_staleness for s in pool.slots] == [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
    pool.after_policy_step()
    assert pool.slots[1].token_staleness == [2] * 5
    mask = torch.tensor([[True] * 6 + [False], [True] * 5 + [False] * 2])
    assert pool.token_staleness(mask).tolist() == [[2] * 6 + [0], [2] * 5 + [0, 0]]
    # A pool saved before tokens carried their age: its tokens count as sampled one update before the resume.
    state = pool.state_dict()
    for slot in state["slots"]:
        del slot["token_staleness"]
    restored = ResponsePool(2, window=3, response_length=8)
    restored.load_state_dict(state)
    assert [s.token_staleness for s in restored.slots] == [[1] * 6, [1] * 5]


def test_a_window_of_zero_tokens_is_refused(tiny_config):
    with pytest.raises(ValueError, match="`generation_window` must be at least 1 token"):  # once, by the config
        tiny_config(generation_window=0)


def test_a_window_as_long_as_the_response_reproduces_the_whole_response_run(fresh_trainer):
    runs = {}
    for window in (None, 16, 40):
        trainer = fresh_trainer(value_pretrain_steps=1, generation_window=window)
        trainer.train()
        runs[window] = (step_logs(trainer), weights(trainer))
    plain_logs, plain_weights = runs[None]
    for window in (16, 40):
        logs, trained = runs[window]
        # The window's own metrics are the only additions; every other logged value is the same.
        added = {k for entry in logs.values() for k in entry} - {k for entry in plain_logs.values() for k in entry}
        assert added == {"rollout/finished_responses", "rollout/window_tokens", "rollout/prefilled_tokens",
                         "rollout/in_flight", "rollout/windows_per_finished_mean",
                         "sample/token_staleness_mean", "sample/oldest_token_staleness_max"}  # fmt: skip
        # Every response starts and finishes in its update: sampled by the weights that train it.
        assert all(
            e["sample/oldest_token_staleness_max"] == 0 == e["sample/token_staleness_mean"] for e in logs.values()
        )
        # ... but TRL GRPO's frac_reward_zero_std, which reads whole groups and is left out under windows.
        plain = {s: {k: v for k, v in e.items() if k != "frac_reward_zero_std"} for s, e in plain_logs.items()}
        assert {s: {k: v for k, v in e.items() if k not in added} for s, e in logs.items()} == plain
        assert all(torch.equal(a, b) for a, b in zip(trained, plain_weights))
        assert all(entry["rollout/in_flight"] == 0 for entry in logs.values())


def test_short_windows_train_on_window_tokens_and_the_critic_on_finished_responses(fresh_trainer, monkeypatch):
    from vcppo_trl.learner.ppo_learner import PPOLearner

    seen = []
    update = PPOLearner.update

    def spy(self, rollout, advantages, returns, **kwargs):
        seen.append((rollout, advantages, self.policy_mask(rollout)))
        return update(self, rollout, advantages, returns, **kwargs)

    monkeypatch.setattr(PPOLearner, "update", spy)
    trainer = fresh_trainer(generation_window=4, total_episodes=128)
    trainer.train()
    logs = step_logs(trainer)
    assert len(logs) == 8  # total_episodes keeps its meaning: updates × batch
    for (rollout, advantages, policy_mask), entry in zip(seen, logs.values()):
        lengths = rollout.response_mask.sum(1)
        window_tokens = rollout.window_mask.sum(1)
        assert bool((window_tokens <= 4).all()) and bool((policy_mask == rollout.window_mask).all())
        assert entry["rollout/window_tokens"] == float(window_tokens.sum())
        assert entry["rollout/finished_responses"] == float(rollout.finished.sum())
        # Outcomes per optimizer step: finished responses per mini-batch; advantages split by finished or not.
        assert entry["rollout/outcomes_per_step"] == float(rollout.finished.sum()) / trainer.args.num_mini_batches
        assert ("diagnostics/advantage_unfinished_mean" in entry) == bool((~rollout.finished).any())
        assert ("diagnostics/advantage_finished_mean" in entry) == bool(rollout.finished.any())
        # A response is unfinished only below the cap and without a stop token.
        unfinished = ~rollout.finished
        assert not bool((rollout.has_stop & unfinished).any()) and bool((lengths[unfinished] < 16).all())
        # Unfinished responses carry no score or reward, and bootstrap from the critic's value after their cut.
        assert not bool(rollout.rewards[unfinished].any())
        assert bool((rollout.bootstrap_values[rollout.finished] == 0).all())
        assert bool(torch.isfinite(advantages).all())
        assert not bool(rollout.value_mask[unfinished].any())
        # This window's tokens are the training weights'; an earlier window's are as old as the policy steps since.
        assert not bool(rollout.token_staleness[rollout.window_mask].any())
        assert entry["sample/token_staleness_mean"] == 0.0
        assert entry["sample/oldest_token_staleness_max"] == float(rollout.sample_staleness.max())
        earlier = rollout.response_mask & ~rollout.window_mask
        assert bool((rollout.token_staleness[earlier] >= 1).all())
    assert any(entry["sample/oldest_token_staleness_max"] >= 2 for entry in logs.values())
    assert any(entry["rollout/in_flight"] > 0 for entry in logs.values())
    assert any(entry.get("rollout/windows_per_finished_mean", 1) > 1 for entry in logs.values())


def test_the_bootstrap_is_the_critics_value_after_the_last_token(fresh_trainer, toy_splits):
    """The extra pad token of an unfinished row gives V at the cut: the critic's output at the last real token, which
    a forward over the sequence alone gives too."""
    from vcppo_trl.models.value_model import value_forward
    from vcppo_trl.rollout.windowed import make_window
    from vcppo_trl.trainer.prompts import PromptStream

    trainer = fresh_trainer(generation_window=3)
    trainer._setup_training()
    pool = ResponsePool(8, window=3, response_length=16)
    prompts = PromptStream(toy_splits["train"], trainer.batches, 0, seed=0, num_generations=1)
    rollout, _ = make_window(trainer.rollout_maker, pool, draw=prompts.draw)
    critic = trainer.model.critic
    checked = 0
    for i in (~rollout.finished).nonzero().flatten().tolist():
        prompt = rollout.query_ids[i][rollout.query_mask[i].bool()]
        response = rollout.response_ids[i][rollout.response_mask[i]]
        ids = torch.cat([prompt, response]).unsqueeze(0)
        with torch.no_grad():
            positions = torch.arange(ids.shape[1]).unsqueeze(0)
            # The state after the last token: the value read at the last position (a one-token "response" after it).
            extended = torch.cat([ids, ids[:, -1:]], dim=1)
            values = value_forward(
                critic.eval(),
                extended,
                torch.ones_like(extended),
                position_ids=torch.cat([positions, positions[:, -1:] + 1], dim=1),
                context_length=ids.shape[1],
            )
        torch.testing.assert_close(rollout.bootstrap_values[i], values[0, 0], atol=1e-5, rtol=0)
        checked += 1
    assert checked > 0


def test_t_ppo_rule_bootstraps_from_the_last_value_before_the_cut(fresh_trainer, toy_splits):
    from vcppo_trl.algo.gae import last_valid_values
    from vcppo_trl.rollout import gae_bootstrap, make_window
    from vcppo_trl.trainer.prompts import PromptStream

    trainer = fresh_trainer(generation_window=3, window_bootstrap="last_value")
    trainer._setup_training()
    pool = ResponsePool(8, window=3, response_length=16)
    prompts = PromptStream(toy_splits["train"], trainer.batches, 0, seed=0, num_generations=1)
    rollout, _ = make_window(trainer.rollout_maker, pool, draw=prompts.draw)
    expected = torch.where(rollout.finished, 0.0, last_valid_values(rollout.values, rollout.response_mask))
    assert torch.equal(gae_bootstrap(rollout, "last_value"), expected)
    assert not torch.equal(gae_bootstrap(rollout, "value"), expected)


def test_a_resumed_windowed_run_continues_its_pool_exactly(fresh_trainer, tmp_path):
    overrides = dict(generation_window=4, total_episodes=48, value_pretrain_steps=2, output_dir=str(tmp_path / "run"))
    whole = fresh_trainer(save_strategy="steps", save_steps=3, **overrides)
    whole.train()  # value pretraining for 2 updates, then PPO; saved after update 3 with responses in flight
    checkpoint = tmp_path / "run" / "checkpoint-3"
    assert len(torch.load(checkpoint / "rollout_pool_0.pt", weights_only=False)["slots"]) > 0
    resumed = fresh_trainer(**overrides)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    after = {s: e for s, e in step_logs(resumed).items() if s > 3}  # the log history before comes from the checkpoint
    assert after == {s: e for s, e in step_logs(whole).items() if s > 3} and len(after) == 2
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), weights(whole)))


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(kl_coef=0.1), "kl_coef > 0"),
        (dict(dynamic_sampling=True, num_generations=2), "dynamic_sampling"),
        (dict(generation_window=0), "at least 1 token"),
        (dict(window_bootstrap="zero"), "window_bootstrap"),
    ],
)
def test_what_windows_do_not_support_yet_is_refused_with_the_reason(tiny_config, overrides, match):
    with pytest.raises(ValueError, match=match):
        tiny_config(**({"generation_window": 4} | overrides))


def test_an_update_that_finished_no_response_moves_the_policy_and_not_the_critic(fresh_trainer, toy_splits):
    from accelerate import Accelerator

    from vcppo_trl.rollout import gae_bootstrap, make_window
    from vcppo_trl.trainer.metrics import UpdateRecord, critic_fit
    from vcppo_trl.trainer.prompts import PromptStream

    trainer = fresh_trainer(generation_window=2)
    trainer._setup_training()
    pool = ResponsePool(16, window=2, response_length=16)
    prompts = PromptStream(toy_splits["train"], trainer.batches, 0, seed=0, num_generations=1)
    rollout, _ = make_window(trainer.rollout_maker, pool, draw=prompts.draw)
    trainer.learner.steps.start_policy_schedule()  # the policy's learning-rate clock starts at its first update
    # A first update with every response finished gives AdamW moments: a zero gradient alone would move nothing.
    finished = dataclasses.replace(rollout, finished=torch.ones_like(rollout.finished))
    trainer.learner.update(finished, *trainer.compute_advantages(finished), train_policy=True, update_index=1)
    rollout.finished = torch.zeros_like(rollout.finished)  # as if every response were cut
    rollout.rewards = torch.zeros_like(rollout.rewards)
    advantages, returns = trainer.compute_advantages(rollout)
    assert gae_bootstrap(rollout, "value") is rollout.bootstrap_values
    critic = [p.detach().clone() for p in trainer.model.critic.parameters()]
    policy = [p.detach().clone() for p in trainer.model.policy.parameters()]
    result = trainer.learner.update(rollout, advantages, returns, train_policy=True, update_index=2)
    assert all(torch.equal(a, b) for a, b in zip(trainer.model.critic.parameters(), critic))
    assert not all(torch.equal(a, b) for a, b in zip(trainer.model.policy.parameters(), policy))
    fit = critic_fit(Accelerator(cpu=True), UpdateRecord(rollout, advantages, returns, result=result))
    assert fit.loss != fit.loss and fit.explained_variance != fit.explained_variance  # nan: the rule learns nothing


def test_a_pool_saved_by_another_number_of_processes_is_refused(tmp_path):
    from vcppo_trl.rollout import WindowedRollouts
    from vcppo_trl.trainer.resuming import load_rollout_pool
    from vcppo_trl.trainer.saving import rollout_pool_file

    pool = ResponsePool(2, window=4, response_length=8)
    source = WindowedRollouts(None, pool, draw=list)  # loading a state touches neither the maker nor the stream
    for rank in (0, 1):
        torch.save(source.state_dict(), rollout_pool_file(str(tmp_path), rank))
    with pytest.raises(ValueError, match="rollouts in flight of 2 processes, and this run has 1"):
        load_rollout_pool(source, str(tmp_path), rank=0, world=1)
    load_rollout_pool(source, str(tmp_path), rank=1, world=2)

"""TRL's `tools=` under generation windows: an episode advances by at most `generation_window` policy tokens per
update, its turns and tool calls within that budget, a turn cut by the window resumed at the next update. A window as
long as the response is the whole-episode run; a short one trains on the policy's tokens of its window only, logs the
tool metrics over finished episodes and resumes exactly from a checkpoint. The policy's turns are scripted (a tiny
random model does not call tools: row i calls the tool i % 3 times) and continue where a window cut them; the rest of
the trainer is the real one."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset

from tests import builders
from tests.builders import step_logs
from tests.tool_fixtures import ResumingScriptedSampler, add, chat_tokenizer

RESPONSE_LENGTH = 512


def reward(completions, **kwargs):
    """1 for the right answer, less a little per tool round (so that the scores differ)."""
    return [(1.0 if c[-1]["content"] == "5" else -1.0) - 0.1 * len(c) for c in completions]


def _trainer(tiny_config, **overrides):
    tokenizer = chat_tokenizer()
    rows = [[{"role": "user", "content": f"Add 2 and 3 ({i})."}] for i in range(96)]
    trainer = builders.tiny_trainer(
        model=builders.tiny_policy(tokenizer),
        processing_class=tokenizer,
        reward_funcs=reward,
        train_dataset=Dataset.from_dict({"prompt": rows}),
        tools=[add],
        args=tiny_config(**{"response_length": RESPONSE_LENGTH, "max_steps": 2, "kl_coef": 0.0, **overrides}),
    )
    trainer.rollout_maker.sampler = ResumingScriptedSampler(tokenizer)
    return trainer


def _without_window_metrics(logs: dict) -> dict:
    return {
        step: {
            k: v for k, v in entry.items() if not k.startswith(("rollout/", "sample/")) and k != "frac_reward_zero_std"
        }
        for step, entry in logs.items()
    }


def test_a_window_as_long_as_the_response_is_the_whole_episode_run(tiny_config):
    whole = _trainer(tiny_config, value_pretrain_steps=1)
    whole.train()
    windowed = _trainer(tiny_config, value_pretrain_steps=1, generation_window=RESPONSE_LENGTH)
    windowed.train()
    assert windowed.rollout_maker.sampler.calls == whole.rollout_maker.sampler.calls
    for (name, a), (_, b) in zip(whole.model.named_parameters(), windowed.model.named_parameters()):
        assert torch.equal(a, b), name
    whole_logs = step_logs(whole)
    assert "tools/call_frequency" in whole_logs[3]
    assert _without_window_metrics(step_logs(windowed)) == _without_window_metrics(whole_logs)


def test_a_short_window_trains_on_its_policy_tokens_and_logs_finished_episodes(tiny_config, monkeypatch):
    from vcppo_trl.episodes.tool_loop import ToolLoop
    from vcppo_trl.learner.ppo_learner import PPOLearner

    window = 24
    seen, parsed = [], []
    update, parse = PPOLearner.update, ToolLoop.parse

    def spy_update(self, rollout, advantages, returns, **kwargs):
        seen.append((rollout, self.policy_mask(rollout)))
        return update(self, rollout, advantages, returns, **kwargs)

    def spy_parse(self, ids, prefix, tools):
        parsed.append(len(ids))
        return parse(self, ids, prefix, tools)

    monkeypatch.setattr(PPOLearner, "update", spy_update)
    monkeypatch.setattr(ToolLoop, "parse", spy_parse)
    trainer = _trainer(tiny_config, generation_window=window, max_steps=12)
    trainer.train()
    assert max(parsed) > window  # a turn spanned windows: its ids accumulated across updates
    logs = step_logs(trainer)
    finished_updates = 0
    for (rollout, policy_mask), entry in zip(seen, logs.values()):
        tool_tokens = rollout.response_mask & ~rollout.action_mask
        assert not (policy_mask & tool_tokens).any()  # the policy never trains on a tool's tokens
        assert not (policy_mask & ~rollout.window_mask).any()  # nor on an earlier window's
        assert int((rollout.window_mask & rollout.action_mask).sum(1).max()) <= window
        if bool(rollout.finished.any()):
            finished_updates += 1
            calls = rollout.episode_counts["calls"][rollout.finished]
            assert entry["tools/call_frequency"] == pytest.approx(float(calls.mean()))
            turns = rollout.episode_counts["turns"][rollout.finished]
            assert entry["tools/turns_mean"] == pytest.approx(float(turns.mean()))
            assert "rewards/reward/mean" in entry
        else:
            assert "tools/call_frequency" not in entry
    assert finished_updates >= 3
    assert set(seen[-1][0].episode_counts["calls"].tolist()) <= {0.0, 1.0, 2.0}


def test_a_run_with_tools_under_windows_resumed_from_a_checkpoint_equals_the_uninterrupted_run(tiny_config, tmp_path):
    def make(name):
        return _trainer(
            tiny_config,
            output_dir=str(tmp_path / name),
            generation_window=24,
            max_steps=6,
            save_strategy="steps",
            save_steps=3,
        )

    full = make("full")
    full.train()
    pool = torch.load(tmp_path / "full" / "checkpoint-3" / "rollout_pool_0.pt", weights_only=False)
    assert any(slot["episode"]["completion_ids"] for slot in pool["slots"])  # episodes in flight, saved
    resumed = make("resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-3"))
    assert resumed.state.global_step == full.state.global_step == 6
    for (name, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(a, b), name
    full_logs, resumed_logs = step_logs(full), step_logs(resumed)
    for step in (4, 5, 6):
        assert resumed_logs[step] == full_logs[step], step


def _environment_trainer(tiny_config, environment_factory, reward_funcs, **overrides):
    tokenizer = chat_tokenizer()
    rows = [[{"role": "user", "content": f"Count ({i})."}] for i in range(96)]
    trainer = builders.tiny_trainer(
        model=builders.tiny_policy(tokenizer),
        processing_class=tokenizer,
        reward_funcs=reward_funcs,
        train_dataset=Dataset.from_dict({"prompt": rows, "start": [10 * i for i in range(96)]}),
        environment_factory=environment_factory,
        args=tiny_config(
            **{
                "response_length": RESPONSE_LENGTH,
                "kl_coef": 0.0,
                "generation_window": 24,
                "max_steps": 6,
                **overrides,
            }
        ),
    )
    trainer.rollout_maker.sampler = ResumingScriptedSampler(tokenizer)
    return trainer


def test_environments_under_a_window_keep_their_episode_across_updates_and_resume_exactly(tiny_config, tmp_path):
    from tests.integration.test_tools import Counter

    checked = []

    def reward(completions, environments, start, **kwargs):
        # Each finished episode's own environment: reset with its row, then `add` ran once per tool message.
        for completion, environment, first in zip(completions, environments, start):
            calls = sum(message["role"] == "tool" for message in completion)
            checked.append(environment.total == first + 5 * calls)
        return [0.1 * len(c) for c in completions]

    def make(name):
        return _environment_trainer(
            tiny_config, Counter, reward, output_dir=str(tmp_path / name), save_strategy="steps", save_steps=3
        )

    full = make("full")
    full.train()
    assert checked and all(checked)
    assert any(c > 0 for e in step_logs(full).values() for c in [e.get("tools/call_frequency", 0)])
    pool = torch.load(tmp_path / "full" / "checkpoint-3" / "rollout_pool_0.pt", weights_only=False)
    assert all("environment" in slot for slot in pool["slots"])  # each in-flight episode's instance, pickled
    resumed = make("resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-3"))
    assert all(checked)
    for (name, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(a, b), name
    full_logs, resumed_logs = step_logs(full), step_logs(resumed)
    for step in (4, 5, 6):
        assert resumed_logs[step] == full_logs[step], step


def test_an_environment_that_cannot_be_pickled_is_refused_at_save_time_naming_its_class(tiny_config):
    import threading

    from tests.integration.test_tools import Counter

    class Locked(Counter):
        def reset(self, prompt, start=0, **row):
            self.lock = threading.Lock()
            return super().reset(prompt, start=start, **row)

    trainer = _environment_trainer(tiny_config, Locked, None, max_steps=2, save_strategy="steps", save_steps=1)
    with pytest.raises(
        ValueError, match=r"The environment Locked of an episode in flight cannot be pickled.*__getstate__"
    ):
        trainer.train()


def test_tools_under_a_window_still_refuse_the_vllm_server(tiny_config):
    overrides = dict(response_length=RESPONSE_LENGTH, kl_coef=0.0, generation_window=24)
    for more, message in (
        (dict(use_vllm=True, vllm_mode="server"), r"`tools` cannot be combined with `vllm_mode='server'`.*as many"),
    ):
        with pytest.raises(ValueError, match=message):
            builders.tiny_trainer(
                processing_class=chat_tokenizer(), args=tiny_config(**overrides, **more), tools=[add]
            )

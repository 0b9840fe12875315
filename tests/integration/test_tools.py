"""TRL's `tools=` on the trainers (issue 48): episodes with tool calls train with tool tokens out of every action
term, rewards see the episode as TRL gives it, and the tool metrics are logged. The policy's turns are scripted
(`tests/tool_fixtures.py`: a tiny random model does not call tools), the rest of the trainer is the real one."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset

from tests import builders
from tests.tool_fixtures import ScriptedSampler, add, chat_tokenizer


def _dataset(n: int = 32) -> Dataset:
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Add 2 and 3 ({i})."}] for i in range(n)]})


def _trainer(tiny_config, reward, **overrides):
    tokenizer = chat_tokenizer()
    trainer = builders.tiny_trainer(
        model=builders.tiny_policy(tokenizer),
        processing_class=tokenizer,
        reward_funcs=reward,
        train_dataset=_dataset(),
        eval_dataset=_dataset(4),
        tools=[add],
        args=tiny_config(**{"response_length": 300, "max_steps": 1, "kl_coef": 0.1, **overrides}),
    )
    trainer.rollout_maker.sampler = ScriptedSampler(tokenizer)
    return trainer


def test_tool_episodes_train_with_tool_tokens_out_of_every_action_term(tiny_config):
    seen = []

    def reward(completions, **kwargs):
        seen.append(completions[0])
        return [1.0 if c[-1]["content"] == "5" else -1.0 for c in completions]

    trainer = _trainer(tiny_config, reward)
    trainer.train()
    rollout, update = trainer.last_update.rollout, trainer.last_update
    tool = rollout.response_mask & ~rollout.action_mask
    assert bool(tool.any(1).all())  # every episode holds a tool result
    for name, tensor in (("kl", rollout.kl), ("rewards", rollout.rewards), ("advantages", update.advantages)):
        assert not tensor[tool].any(), f"{name} on tool tokens"
    assert not update.returns[tool].any()
    assert [m["role"] for m in seen[0]] == ["assistant", "tool", "assistant"]  # TRL's completion: the episode
    assert seen[0][0]["tool_calls"][0]["function"]["name"] == "add"
    logged = next(e for e in trainer.state.log_history if "tools/call_frequency" in e)
    assert logged["tools/call_frequency"] == 1.0 and logged["tools/failure_frequency"] == 0.0
    assert logged["tools/turns_mean"] == 2.0 and 0 < logged["tools/trained_token_share"] < 1
    assert logged["objective/scores"] == pytest.approx(1.0)
    from vcppo_trl.trainer.completions import completion_table

    logged_completion = completion_table(update, trainer.reward_func_names, step=1)["completion"][0]
    assert logged_completion == '[call add({"a": 2, "b": 3})]\n[tool add -> 5]\n5'  # the whole episode, tools marked
    metrics = trainer.evaluate()  # evaluation samples the same episodes (greedy)
    assert metrics["eval_accuracy"] == 1.0


def test_value_pretraining_learns_on_tool_episodes_with_the_policy_frozen(tiny_config):
    from vcppo_trl import VCPPOConfig

    trainer = _trainer(tiny_config, lambda completions, **kw: [1.0] * len(completions), value_pretrain_steps=2)
    assert isinstance(trainer.args, VCPPOConfig)
    before = {
        n: p.detach().clone() for n, p in trainer.accelerator.unwrap_model(trainer.model).policy.named_parameters()
    }
    trainer.train()
    pretrain = [e for e in trainer.state.log_history if "value_pretrain/explained_variance" in e]
    assert len(pretrain) == 2 and all("tools/call_frequency" in e for e in pretrain)
    assert trainer.num_ppo_updates == 1  # then the one PPO update
    changed = any(
        not torch.equal(before[n], p)
        for n, p in trainer.accelerator.unwrap_model(trainer.model).policy.named_parameters()
    )
    assert changed  # the PPO update moved it (the phase alone would not: its metric lines say lr 0 for the policy)


def test_tools_and_a_rollout_func_together_are_refused(tiny_config):
    with pytest.raises(ValueError, match="not both"):
        builders.tiny_trainer(
            processing_class=chat_tokenizer(), args=tiny_config(), tools=[add], rollout_func=lambda p, t: {}
        )


def test_a_run_with_tools_resumed_from_a_checkpoint_equals_the_uninterrupted_run(tiny_config, tmp_path):
    from tests.builders import step_logs

    def reward(completions, **kwargs):
        return [1.0 if c[-1]["content"] == "5" else -1.0 for c in completions]

    def make(name):
        return _trainer(
            tiny_config,
            reward,
            output_dir=str(tmp_path / name),
            max_steps=3,
            save_strategy="steps",
            save_steps=1,
            value_pretrain_steps=1,
        )

    full = make("full")
    full.train()
    resumed = make("resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    assert resumed.state.global_step == full.state.global_step == 4
    for (name, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(a, b), name
    full_logs, resumed_logs = step_logs(full), step_logs(resumed)
    for step in (3, 4):
        assert resumed_logs[step] == full_logs[step], step


class Counter:
    """An environment: `reset` appends the row's start to the prompt; `add` is its tool; it owns the reward."""

    def __init__(self):
        self.total = None

    def reset(self, prompt, start=0, **row):
        self.total = start
        return f" Start at {start}."

    def add(self, a: int, b: int) -> int:
        """Add two numbers to the running total.

        Args:
            a: The first number.
            b: The second number.
        """
        self.total += a + b
        return self.total

    def get_reward(self) -> float:
        return float(self.total)


def test_an_environment_per_episode_gives_its_methods_as_tools_and_its_reward(tiny_config):
    tokenizer = chat_tokenizer()
    seen = {}

    def reward(completions, environments, **kwargs):
        seen["environments"] = environments
        return [0.0] * len(completions)

    rows = [[{"role": "user", "content": f"Count ({i})."}] for i in range(32)]
    trainer = builders.tiny_trainer(
        model=builders.tiny_policy(tokenizer),
        processing_class=tokenizer,
        reward_funcs=reward,
        train_dataset=Dataset.from_dict({"prompt": rows, "start": list(range(32))}),
        environment_factory=Counter,
        args=tiny_config(response_length=300, max_steps=1),
    )
    trainer.rollout_maker.sampler = ScriptedSampler(tokenizer)
    assert trainer.reward_func_names == ["reward", "Counter"]  # the environment's reward, after the given ones
    trainer.train()
    environments = seen["environments"]
    assert len(environments) == 16 and len({id(e) for e in environments}) == 16  # one instance per episode
    starts = [e.total - 5 for e in environments]  # each reset with its row, then add(2, 3) ran on it
    assert sorted(starts) == sorted(set(starts))
    rollout = trainer.last_update.rollout
    torch.testing.assert_close(rollout.rewards_per_func[:, 1], torch.tensor([float(e.total) for e in environments]))
    first_prompts = trainer.rollout_maker.sampler.contexts[:16]  # reset's text appended to the last user message
    assert all(f" Start at {s}.<|im_end|>" in c for s, c in zip(sorted(starts), sorted(first_prompts, key=_start)))


def _start(context: str) -> int:
    return int(context.split(" Start at ")[1].split(".")[0])


def test_an_environment_that_fails_to_reset_names_the_row(tiny_config):
    class Broken(Counter):
        def reset(self, prompt, **row):
            raise KeyError("no board")

    tokenizer = chat_tokenizer()
    trainer = builders.tiny_trainer(
        model=builders.tiny_policy(tokenizer),
        processing_class=tokenizer,
        reward_funcs=builders.length_reward,
        train_dataset=_dataset(),
        environment_factory=Broken,
        args=tiny_config(response_length=300, max_steps=1),
    )
    trainer.rollout_maker.sampler = ScriptedSampler(tokenizer)
    with pytest.raises(RuntimeError, match=r"The environment Broken failed to reset for row 0 .*KeyError"):
        trainer.train()

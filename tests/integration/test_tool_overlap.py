"""TRL's `tools=` under one-step-off overlap (`max_staleness`): the rollout worker process runs whole tool episodes
(`rollout/tool_overlap.py`). The policy is a [`~tests.tool_fixtures.ToolCallingPolicy`]: the tiny random policy whose
first turn on even rows is a scripted call of `add`, an importable class, so the calls happen in the worker."""

from __future__ import annotations

import threading
import time
import types

import pytest
import torch
from datasets import Dataset

from tests import builders
from tests.builders import step_logs, weights
from tests.tool_fixtures import AddingEnvironment, add, chat_tokenizer, tool_calling_policy

RESPONSE_LENGTH = 160  # the call (72 tokens), the tool's suffix and room for an answer


def _dataset(n: int = 64) -> Dataset:
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Add 2 and 3 ({i})."}] for i in range(n)]})


def reward(completions, **kwargs):
    """+1 for an episode that called the tool, then the shorter its last turn the better."""
    return [float(any(m["role"] == "tool" for m in c)) - len(c[-1]["content"] or "") / 100 for c in completions]


def _trainer(tiny_config, tools=(add,), environment_factory=None, **overrides):
    tokenizer = chat_tokenizer()
    args = {"response_length": RESPONSE_LENGTH, "max_staleness": 1, "total_episodes": 48, "kl_coef": 0.1, **overrides}
    return builders.tiny_trainer(
        model=tool_calling_policy(tokenizer),
        processing_class=tokenizer,
        reward_funcs=reward if environment_factory is None else None,
        train_dataset=_dataset(),
        tools=list(tools) or None,
        environment_factory=environment_factory,
        args=tiny_config(**args),
    )


def test_tool_episodes_run_in_the_rollout_worker_one_update_stale_and_reproducible(tiny_config):
    runs = []
    for _ in range(2):
        trainer = _trainer(tiny_config)
        trainer.train()
        assert not trainer.rollouts.worker.process.is_alive()  # stopped with training
        runs.append((step_logs(trainer), weights(trainer), trainer.last_update.rollout))
    logs, rollout = runs[0][0], runs[0][2]
    # Update 1 was sampled by the initial weights; from update 2 on each batch by the weights before the previous one.
    assert [logs[s]["sampling/staleness_max"] for s in sorted(logs)] == [0.0, 1.0, 1.0]
    for entry in logs.values():  # the even rows called `add` once, in the worker, and it answered
        assert 0 < entry["tools/call_frequency"] < 1 and entry["tools/failure_frequency"] == 0.0
        assert 0 < entry["tools/trained_token_share"] < 1 and "rewards/reward/mean" in entry
    tool = rollout.response_mask & ~rollout.action_mask
    assert int(tool.any(1).sum()) == round(logs[3]["tools/call_frequency"] * 16)  # each call's episode: its result
    assert not (rollout.trained_tokens & tool).any()  # tool tokens are never the policy's
    assert not rollout.kl[tool].any() and not rollout.rewards[tool].any()
    assert (rollout.sampler_logprobs[tool] == 0).all()
    # Reproducible: each request's generation calls are seeded by the request, whatever the timing.
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


def test_environments_travel_to_the_worker_and_back_with_their_episodes(tiny_config):
    trainer = _trainer(tiny_config, tools=(), environment_factory=AddingEnvironment, total_episodes=32)
    trainer.train()
    for entry in step_logs(trainer).values():  # each reward: the calls its own instance counted in the worker
        assert 0 < entry["tools/call_frequency"] < 1
        assert entry["rewards/AddingEnvironment/mean"] == pytest.approx(entry["tools/call_frequency"])
    assert [entry["sampling/staleness_max"] for entry in step_logs(trainer).values()] == [0.0, 1.0]


class Locked(AddingEnvironment):
    def reset(self, prompt=None, **row):
        self.lock = threading.Lock()
        return super().reset(prompt, **row)


def test_an_environment_that_cannot_be_pickled_is_refused_naming_its_class(tiny_config):
    trainer = _trainer(tiny_config, tools=(), environment_factory=Locked, total_episodes=16)
    with pytest.raises(ValueError, match=r"The environment Locked cannot be sent to the rollout worker.*__getstate__"):
        trainer.train()


@pytest.mark.parametrize("environment", [False, True])
def test_a_resumed_run_with_tool_episodes_in_the_worker_equals_the_uninterrupted_one(
    tiny_config, tmp_path, environment
):
    overrides = dict(total_episodes=64, output_dir=str(tmp_path / "run"))
    if environment:
        overrides.update(tools=(), environment_factory=AddingEnvironment)
    whole = _trainer(tiny_config, save_strategy="steps", save_steps=2, **overrides)
    whole.train()
    checkpoint = tmp_path / "run" / "checkpoint-2"
    saved = torch.load(checkpoint / "rollout_pool_0.pt", weights_only=False)
    (batch,) = saved["batches"]  # the batch of episodes run ahead, as plain data (and their environments)
    episodes = batch["episodes"]["episodes"]
    assert len(episodes) == 16 and sum(e["counts"]["calls"] for e in episodes) > 0
    assert (batch["episodes"]["environments"] is not None) == environment
    resumed = _trainer(tiny_config, **overrides)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    after = {s: e for s, e in step_logs(resumed).items() if s > 2}
    assert after == {s: e for s, e in step_logs(whole).items() if s > 2} and len(after) == 2
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), weights(whole)))


def slow_add(a: int, b: int) -> int:
    """Add two numbers, slowly.

    Args:
        a: The first number.
        b: The second number.
    """
    time.sleep(2.0)
    return a + b


slow_add.__name__ = "add"  # the scripted policy calls `add`; pickled by reference under its own qualified name


def test_a_tool_past_its_timeout_in_the_worker_answers_an_error_and_the_episode_goes_on(tiny_config):
    trainer = _trainer(tiny_config, tools=[slow_add], total_episodes=16, tool_timeout=0.2)
    trainer.train()
    (entry,) = step_logs(trainer).values()
    assert entry["tools/call_frequency"] > 0 and entry["tools/failure_frequency"] == 1.0  # every call timed out
    assert entry["tools/turns_mean"] > 1  # and each calling episode wrote its next turn


def local_tool(a: int) -> int:
    """A tool.

    Args:
        a: A number.
    """
    return a


def test_a_tool_or_factory_that_cannot_travel_to_the_worker_is_refused_naming_it(tiny_config):
    from vcppo_trl.rollout import check_tools_travel, check_tools_under_overlap

    def nested(a: int) -> int:
        """A tool.

        Args:
            a: A number.
        """
        return a

    with pytest.raises(ValueError, match=r"the tool 'nested' cannot be sent to the rollout worker.*module level"):
        builders.tiny_trainer(
            processing_class=chat_tokenizer(), args=tiny_config(max_staleness=1), tools=[add, nested]
        )
    in_main = types.FunctionType(local_tool.__code__, {}, "in_main")
    in_main.__module__ = "__main__"
    with pytest.raises(ValueError, match=r"'in_main'.*defined in the script being run"):
        check_tools_travel([in_main])
    check_tools_travel([add, local_tool])  # importable by name: they travel
    with pytest.raises(ValueError, match=r"the environment factory 'in_main' cannot be sent.*script being run"):
        check_tools_under_overlap(
            types.SimpleNamespace(max_staleness=1, generation_window=None),
            tools=[add],
            environment_factory={"a": AddingEnvironment, "b": in_main},
        )


@pytest.mark.parametrize("kill_after", [1, 2])
def test_a_worker_killed_while_it_runs_episodes_stops_training_instead_of_hanging(tiny_config, tmp_path, kill_after):
    """The worker killed at the end of an update, whether it is sampling the next episodes or writing them back (an
    answer of episodes is larger than the pipe's buffer): training stops with a `SamplerError` and a checkpoint of the
    last finished update, in seconds."""
    import time

    from transformers import TrainerCallback

    from vcppo_trl.sampling.seam import SamplerError

    class KillWorker(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == kill_after:
                trainer.rollouts.worker.process.kill()

    trainer = _trainer(tiny_config, total_episodes=64, output_dir=str(tmp_path / "run"))
    trainer.add_callback(KillWorker())
    start = time.perf_counter()
    with pytest.raises(SamplerError, match="Sampling failed at update"):
        trainer.train()
    assert time.perf_counter() - start < 300
    last = trainer.state.global_step
    assert last in (kill_after, kill_after + 1)
    assert (tmp_path / "run" / f"checkpoint-{last}" / "vcppo_state.json").is_file()


@pytest.mark.parametrize("environment", [False, True])
def test_tool_episodes_under_windows_advance_in_the_worker_one_window_ahead_and_resume_exactly(
    tiny_config, tmp_path, environment
):
    """`tools` (or an `environment_factory`) with `generation_window` and `max_staleness=1`: the worker advances the
    pool's episodes by a window (the scripted call, longer than a window, is cut and resumed there; the tool runs
    there) while the update trains; a checkpoint holds the pool's episodes and the window sampled ahead (with their
    environments), and the resumed run equals the uninterrupted one."""
    overrides = dict(generation_window=24, kl_coef=0.0, max_steps=6, output_dir=str(tmp_path / "run"))
    if environment:
        overrides.update(tools=(), environment_factory=AddingEnvironment)
    whole = _trainer(tiny_config, save_strategy="steps", save_steps=3, **overrides)
    whole.train()
    logs = step_logs(whole)
    assert [logs[s]["sampling/staleness_max"] for s in sorted(logs)] == [0.0] + [1.0] * 5
    assert [logs[s]["sample/token_staleness_mean"] for s in sorted(logs)] == [0.0] + [1.0] * 5
    called = [e["tools/call_frequency"] for e in logs.values() if "tools/call_frequency" in e]
    assert called and any(c > 0 for c in called)  # finished episodes that called `add` in the worker
    assert any(e.get("rollout/windows_per_finished_mean", 1) > 1 for e in logs.values())  # across windows
    if environment:  # each reward reads the instance that travelled with its episode: the calls it counted
        assert all(
            e["rewards/AddingEnvironment/mean"] == pytest.approx(e["tools/call_frequency"])
            for e in logs.values()
            if "tools/call_frequency" in e
        )
    rollout = whole.last_update.rollout
    assert not (rollout.trained_tokens & ~rollout.action_tokens).any()  # tool tokens are never trained
    saved = torch.load(tmp_path / "run" / "checkpoint-3" / "rollout_pool_0.pt", weights_only=False)
    assert saved["ahead"]["episodes"] is not None and saved["slots"]  # the window ahead, as the worker returned it
    resumed = _trainer(tiny_config, **overrides)
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-3"))
    after = {s: e for s, e in step_logs(resumed).items() if s > 3}
    assert after == {s: e for s, e in logs.items() if s > 3} and len(after) == 3
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), weights(whole)))

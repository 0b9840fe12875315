"""TRL's `rollout_func` (issue 48): a user's function samples, the trainer trains on its completions; an `env_mask`
marks tool and environment tokens, which are context for the policy and the critic, never actions."""

from __future__ import annotations

import pytest
import torch

from tests import builders
from vcppo_trl.sampling.seam import unpadded_prompts

TOOL_TEXT = "[=42]"  # what the "tool" writes into each completion, after the policy's first 3 tokens


def sample_as_the_trainer(prompts, trainer, tool_ids=None):
    """A rollout_func that samples exactly as the trainer's own sampler would (one completion per prompt received: TRL
    passes each prompt num_generations times), optionally with a tool block spliced in after the policy's first 3
    tokens (`env_mask` 0 on it)."""
    maker = trainer.rollout_maker
    rows = [{"prompt": p} for p in prompts]
    query_ids, query_mask = maker.tokenize_prompts(maker.prompt_texts(rows))
    samples = maker.generate(query_ids, query_mask)
    completions = [ids[m].tolist() for ids, m in zip(samples.response_ids, samples.response_mask)]
    out = {"prompt_ids": unpadded_prompts(query_ids, query_mask), "completion_ids": completions, "logprobs": None}
    if tool_ids is not None:
        room = trainer.args.response_length - len(tool_ids)
        spliced = [c[:3] + tool_ids + c[3:room] for c in completions]
        out["completion_ids"] = spliced
        out["env_mask"] = [[1] * len(c[:3]) + [0] * len(tool_ids) + [1] * len(c[3:room]) for c in completions]
        out["tool_calls"] = [1] * len(spliced)  # an extra key: to the reward functions
    return out


def _train(tiny_config, tokenizer, rollout_func=None, reward=builders.length_reward, **overrides):
    trainer = builders.tiny_trainer(
        processing_class=tokenizer,
        model=builders.tiny_policy(tokenizer),
        reward_funcs=reward,
        args=tiny_config(**overrides),
        rollout_func=rollout_func,
    )
    trainer.train()
    return trainer


def test_a_rollout_func_that_samples_as_the_trainer_trains_exactly_as_the_trainer(tiny_config, tokenizer):
    plain = _train(tiny_config, tokenizer)
    through = _train(
        tiny_config, tokenizer, rollout_func=sample_as_the_trainer, output_dir=str(plain.args.output_dir) + "-f"
    )
    for (name, a), (_, b) in zip(plain.model.named_parameters(), through.model.named_parameters()):
        assert torch.equal(a, b), name
    logged = [
        [{k: v for k, v in e.items() if not k.startswith("time/")} for e in t.state.log_history]
        for t in (plain, through)
    ]
    differ = {k for a, b in zip(logged[0][:-1], logged[1][:-1]) for k in a if a[k] != b.get(k) and a[k] == a[k]}
    assert not differ, differ  # the last entry is the run's summary (its wall time)


def test_an_env_mask_keeps_tool_tokens_out_of_every_action_term(tiny_config, tokenizer):
    tool_ids = tokenizer(TOOL_TEXT, add_special_tokens=False)["input_ids"]
    seen_extra = []

    def reward(completions, tool_calls, **kwargs):
        seen_extra.append(list(tool_calls))
        return [1.0 if len(c) < 12 else -1.0 for c in completions]

    def rollout_func(prompts, trainer):
        return sample_as_the_trainer(prompts, trainer, tool_ids=tool_ids)

    trainer = _train(tiny_config, tokenizer, rollout_func=rollout_func, reward=reward, kl_coef=0.1, max_steps=1)
    rollout, advantages, returns = (
        trainer.last_update.rollout,
        trainer.last_update.advantages,
        trainer.last_update.returns,
    )
    tool = rollout.response_mask & ~rollout.action_mask
    assert (tool.sum(1) == len(tool_ids)).all()  # every completion holds the tool's block
    assert seen_extra and all(v == 1 for batch in seen_extra for v in batch)
    for name, tensor in (
        ("kl", rollout.kl),
        ("rewards", rollout.rewards),
        ("advantages", advantages),
        ("returns", returns),
    ):
        assert not tensor[tool].any(), f"{name} on tool tokens"
    # The score lands on the policy's last token (a completion of < 3 tokens ends in the tool block: its last policy
    # token comes before it) ...
    actions = rollout.action_tokens
    last = actions.shape[1] - 1 - actions.flip(1).int().argmax(1)
    rows = torch.arange(len(last))
    torch.testing.assert_close(rollout.rewards[rows, last] + 0.1 * rollout.kl[rows, last], rollout.scores)
    # ... and the critic's targets carry it across the tool block undecayed (γ = λ_critic = 1: a Monte-Carlo sum).
    after_tool = 3 + len(tool_ids)
    crosses = actions[:, after_tool]  # a policy token after the block
    torch.testing.assert_close(
        returns[crosses, 2], returns[crosses, after_tool] + rollout.rewards[crosses, 2], rtol=1e-5, atol=1e-5
    )
    assert crosses.any()
    # Response lengths are counted as TRL counts a completion: the model's tokens.
    logged = next(e for e in trainer.state.log_history if "diagnostics/response_length_mean" in e)
    expected = rollout.action_tokens.sum(1).float().mean()
    assert logged["diagnostics/response_length_mean"] == pytest.approx(float(expected))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda out: out.pop("logprobs"), r"must return the keys .*missing: \['logprobs'\]"),
        (lambda out: out["completion_ids"].pop(), "one list per completion"),
        (
            lambda out: out["completion_ids"].__setitem__(0, list(range(5, 45))),
            "each must have 1 to response_length=16",
        ),
        (lambda out: out.__setitem__("env_mask", [[2] * len(c) for c in out["completion_ids"]]), "must hold 1"),
        (lambda out: out.__setitem__("extra", [1, 2]), "`extra` with 2 values"),
    ],
)
def test_a_faulty_rollout_func_output_is_refused_with_the_reason(tiny_config, tokenizer, change, message):
    def faulty(prompts, trainer):
        out = sample_as_the_trainer(prompts, trainer)
        change(out)
        return out

    with pytest.raises((ValueError, TypeError), match=message):
        _train(tiny_config, tokenizer, rollout_func=faulty, max_steps=1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(generation_window=8), "generation_window"),
        (dict(max_staleness=1), "max_staleness"),
    ],
)
def test_what_a_rollout_func_cannot_be_combined_with_is_refused_by_name(tiny_config, tokenizer, fields, message):
    with pytest.raises(ValueError, match=f"`rollout_func` cannot be combined with `{message}`"):
        builders.tiny_trainer(
            processing_class=tokenizer, args=tiny_config(**fields), rollout_func=sample_as_the_trainer
        )
    with pytest.raises(TypeError, match="must be callable"):
        builders.tiny_trainer(processing_class=tokenizer, args=tiny_config(), rollout_func="not a function")


def test_a_function_that_makes_num_generations_per_prompt_received_is_told_the_migration(tiny_config, tokenizer):
    def earlier_form(prompts, trainer):  # this package's form before TRL's: its own loop over num_generations
        return sample_as_the_trainer([p for p in prompts for _ in range(trainer.args.num_generations)], trainer)

    with pytest.raises(ValueError, match="drop its own loop over num_generations"):
        _train(tiny_config, tokenizer, rollout_func=earlier_form, max_steps=1, num_generations=2)

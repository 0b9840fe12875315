"""The tool toy (`vcppo_trl.toy.tool_use`): short prompts, cold-start text that is token for token what the tool loop
builds, the reward on episodes, and the held-out evaluation through the tool loop."""

from __future__ import annotations

import torch

from vcppo_trl.episodes import ToolLoop, ToolSettings
from vcppo_trl.toy.tool_use import (
    add,
    build_tool_tokenizer,
    cold_start_examples,
    episode_answer,
    evaluate_with_tools,
    make_tool_splits,
    tool_call_rate,
    tool_reward,
)


def test_the_template_text_is_single_tokens_and_round_trips():
    tokenizer = build_tool_tokenizer()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Add 4738 and 2919."}], tools=[add], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(prompt, add_special_tokens=False).input_ids
    assert len(prompt) > 700 and len(ids) < 40
    assert tokenizer.decode(ids) == prompt


def test_the_cold_start_tool_episode_is_what_the_tool_loop_builds():
    tokenizer = build_tool_tokenizer()
    splits = make_tool_splits(40, 4, seed=3)
    examples = cold_start_examples(tokenizer, splits["train"], tool_fraction=1.0)
    row, example = splits["train"][0], examples[0]
    assert example["form"] == "tool"
    loop = ToolLoop(
        [add],
        tokenizer,
        ToolSettings(max_iterations=2, response_length=256, timeout=5.0, max_concurrency=2),
        stop_token_ids=[tokenizer.eos_token_id],
    )
    call = f'<tool_call>\n{{"name": "add", "arguments": {{"a": {row["a"]}, "b": {row["b"]}}}}}\n</tool_call>'
    suffix = loop.suffix_ids([{"role": "tool", "name": "add", "content": row["solution"]}])
    answer = f"\\boxed{{{row['solution']}}}"
    encode = lambda text: tokenizer(text, add_special_tokens=False).input_ids  # noqa: E731
    built = encode(call) + [tokenizer.eos_token_id] + suffix + encode(answer)
    assert encode(example["completion"]) == built
    # The worked form is the addition toy's solution.
    worked = cold_start_examples(tokenizer, splits["train"], tool_fraction=0.0)[0]
    assert worked["form"] == "worked" and worked["completion"].endswith(answer)


def test_reward_reads_the_last_assistant_turn():
    episode = [
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "add"}}]},
        {"role": "tool", "name": "add", "content": "12"},
        {"role": "assistant", "content": "\\boxed{12}"},
    ]
    text = [{"role": "assistant", "content": "<think>x</think> \\boxed{13}"}]
    assert tool_reward([episode, text, "\\boxed{12}"], ["12", "12", "12"]) == [1.0, -1.0, 1.0]
    assert tool_call_rate([episode, text]) == [1.0, 0.0]
    assert episode_answer([{"role": "assistant", "content": "no answer"}]) is None


class _ScriptedPolicy:
    """A stand-in for a model: its first turn calls `add` with the prompt's numbers, its second boxes the result."""

    training = False

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, 0

    def eval(self):
        return self

    def train(self, mode=True):
        return self

    def generate(self, input_ids, attention_mask, max_new_tokens, **kwargs):
        rows = []
        for ids, mask in zip(input_ids, attention_mask):
            text = self.tokenizer.decode(ids[mask.bool()])
            if "<tool_response>" in text:
                result = text.split("<tool_response>\n")[-1].split("\n</tool_response>")[0]
                turn = f"\\boxed{{{result}}}"
            else:
                a, b = text.split("Add ")[-1].split(".")[0].split(" and ")
                turn = f'<tool_call>\n{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'
            rows.append(self.tokenizer(turn, add_special_tokens=False).input_ids + [self.tokenizer.eos_token_id])
        self.calls += 1
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id
        new = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        return torch.cat([input_ids, new], dim=1)


def test_evaluation_runs_the_tool_loop():
    tokenizer = build_tool_tokenizer()
    test = make_tool_splits(2, 6, seed=1)["test"]
    policy = _ScriptedPolicy(tokenizer)
    result = evaluate_with_tools(policy, tokenizer, test, max_new_tokens=96)
    assert result["accuracy"] == 1.0 and result["tool_call_rate"] == 1.0 and result["num_episodes"] == 6
    assert result["accuracy_with_tool"] == 1.0 and result["accuracy_without_tool"] is None
    assert policy.calls == 2  # one call for the first turns, one after the tool's answers
    assert result["completion_tokens_mean"] > result["length_mean"] > 0

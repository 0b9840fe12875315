"""The tool loop (issue 48): TRL's `tools=` episodes on the trainer's sampler, tokens in and tokens out, tool tokens
masked, faults answered to the policy and counted."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from tests.tool_fixtures import ANSWER, CALL, ScriptedSampler, add, chat_tokenizer
from vcppo_trl.episodes.tool_loop import ToolLoop, ToolSettings, episode_metrics, sample_tool_episodes

ROWS = [{"prompt": [{"role": "user", "content": "Add 2 and 3."}]}] * 2


def _loop(tools=(add,), response_length=400, max_iterations=None, timeout=5.0):
    tokenizer = chat_tokenizer()
    settings = ToolSettings(max_iterations, response_length, timeout=timeout, max_concurrency=4)
    return ToolLoop(list(tools), tokenizer, settings, [tokenizer.eos_token_id]), tokenizer


def _tokenize(tokenizer):
    def tokenize(texts):
        encoded = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        return encoded["input_ids"], encoded["attention_mask"]

    return tokenize


def _episodes(loop, tokenizer, script=None, rows=ROWS, response_length=400):
    sampler = ScriptedSampler(tokenizer, script)
    out = sample_tool_episodes(
        loop,
        sampler,
        rows,
        greedy=False,
        temperature=1.0,
        tokenize=_tokenize(tokenizer),
        any_process=bool,
        response_length=response_length,
        stop_token_ids=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
        device=torch.device("cpu"),
    )
    return (*out[1:], sampler)


def test_an_episode_keeps_the_sampled_tokens_and_masks_only_what_the_tool_wrote():
    loop, tokenizer = _loop()
    query_ids, query_mask, samples, prompt_texts, episodes, sampler = _episodes(loop, tokenizer)
    call_ids = tokenizer(CALL, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(ANSWER, add_special_tokens=False)["input_ids"]
    ids = samples.response_ids[0][samples.response_mask[0]].tolist()
    assert ids[: len(call_ids)] == call_ids and ids[-len(answer_ids) :] == answer_ids  # the policy's turns as sampled
    tool = samples.response_mask[0] & ~samples.action_mask[0]
    suffix = tokenizer.decode(samples.response_ids[0][tool].tolist())
    assert "<tool_response>\n5\n</tool_response>" in suffix and suffix.endswith("<|im_start|>assistant\n")
    assert int(samples.action_mask[0].sum()) == len(call_ids) + len(answer_ids)
    assert episodes[0][0]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 2, "b": 3}}
    assert episodes[0][1] == {"role": "tool", "name": "add", "content": "5"} and episodes[0][2]["content"] == "5"
    assert bool(samples.has_stop[0]) and sampler.calls == 2 and "add" in prompt_texts[0]
    counts = {k: v.tolist() for k, v in samples.episode_counts.items()}
    assert counts == {"calls": [1, 1], "failures": [0, 0], "malformed": [0, 0], "overflows": [0, 0], "turns": [2, 2]}
    metrics = episode_metrics(samples.episode_counts, samples.response_mask, samples.action_mask)
    assert metrics["tools/call_frequency"] == 1.0 and metrics["tools/failure_frequency"] == 0.0
    assert metrics["tools/tool_tokens_mean"] == float(tool.sum()) and 0 < metrics["tools/trained_token_share"] < 1


def test_a_tool_that_raises_or_hangs_or_is_unknown_answers_an_error_and_counts_as_a_failure():
    def add(a: int, b: int) -> int:
        """Add.

        Args:
            a: a.
            b: b.
        """
        raise RuntimeError("adder broken")

    loop, tokenizer = _loop(tools=(add,))
    _, _, samples, _, episodes, _ = _episodes(loop, tokenizer)
    assert "adder broken" in episodes[0][1]["content"] and samples.episode_counts["failures"].tolist() == [1, 1]

    def slow(a: int, b: int) -> int:
        """Add slowly.

        Args:
            a: a.
            b: b.
        """
        time.sleep(3)
        return a + b

    slow.__name__ = "add"
    loop, tokenizer = _loop(tools=(slow,), timeout=0.2)
    _, _, samples, _, episodes, _ = _episodes(loop, tokenizer)
    assert "timed out after 0.2 s" in episodes[0][1]["content"] and samples.episode_counts["failures"].sum() == 2

    unknown = '<tool_call>\n{"name": "mul", "arguments": {"a": 2}}\n</tool_call><|im_end|>'
    loop, tokenizer = _loop()
    _, _, samples, _, episodes, _ = _episodes(loop, tokenizer, script={0: unknown})
    assert "Tool mul not found" in episodes[0][1]["content"] and samples.episode_counts["failures"].sum() == 2


def test_async_tools_are_awaited():
    async def add(a: int, b: int) -> int:
        """Add.

        Args:
            a: a.
            b: b.
        """
        await asyncio.sleep(0.01)
        return a + b

    loop, tokenizer = _loop(tools=(add,))
    _, _, samples, _, episodes, _ = _episodes(loop, tokenizer)
    assert episodes[0][1]["content"] == "5" and samples.episode_counts["failures"].sum() == 0


def test_a_malformed_call_ends_the_episode_as_text_and_is_counted():
    malformed = '<tool_call>\n{"name": "add", "argu</tool_call><|im_end|>'
    loop, tokenizer = _loop()
    _, _, samples, _, episodes, sampler = _episodes(loop, tokenizer, script={0: malformed})
    assert len(episodes[0]) == 1 and "tool_calls" not in episodes[0][0] and sampler.calls == 1
    assert samples.episode_counts["malformed"].tolist() == [1, 1] and bool(
        samples.action_mask.all() == samples.response_mask.all()
    )


def test_a_tool_result_that_would_overflow_the_response_is_dropped_and_counted():
    call_length = len(chat_tokenizer()(CALL, add_special_tokens=False)["input_ids"])
    loop, tokenizer = _loop(response_length=call_length + 10)  # the tool's suffix does not fit
    _, _, samples, _, episodes, sampler = _episodes(loop, tokenizer, response_length=call_length + 10)
    assert samples.episode_counts["overflows"].tolist() == [1, 1] and sampler.calls == 1
    assert len(episodes[0]) == 1 and bool(samples.action_mask[samples.response_mask].all())


def test_max_tool_calling_iterations_bounds_the_rounds():
    loop, tokenizer = _loop(max_iterations=2)
    always_call = {k: CALL for k in range(10)}
    _, _, samples, _, episodes, sampler = _episodes(loop, tokenizer, script=always_call)
    assert samples.episode_counts["calls"].tolist() == [2, 2] and samples.episode_counts["turns"].tolist() == [3, 3]
    assert sampler.calls == 3 and "tool_calls" in episodes[0][-1]


def test_what_the_loop_cannot_use_is_refused():
    tokenizer = chat_tokenizer()
    settings = ToolSettings(None, 100, timeout=1.0, max_concurrency=1)
    with pytest.raises(TypeError, match="non-empty list of functions"):
        ToolLoop([], tokenizer, settings, [0])
    with pytest.raises(ValueError, match="two functions of one name"):
        ToolLoop([add, add], tokenizer, settings, [0])
    # A template that renders tools, in no form TRL knows a response schema for.
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if tools %}{{ tools }}{% endif %}"
    )
    with pytest.raises(ValueError, match="no response schema"):
        ToolLoop([add], tokenizer, settings, [0])
    loop, tokenizer = _loop()
    with pytest.raises(ValueError, match="conversational prompts"):
        loop.render(["Add 2 and 3."])


def test_a_chat_template_that_does_not_render_tools_is_refused():
    """SmolLM2's template (and any like it) ignores `tools`: the policy would never see one, so tools are refused."""
    from vcppo_trl.episodes.tool_loop import ToolLoop, renders_tools

    tokenizer = chat_tokenizer()
    assert renders_tools(tokenizer)  # TRL's Qwen2.5 template does
    tokenizer.chat_template = (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    assert not renders_tools(tokenizer)
    with pytest.raises(ValueError, match="does not render tools"):
        ToolLoop([add], tokenizer, settings=None, stop_token_ids=[tokenizer.eos_token_id])

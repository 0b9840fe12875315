"""A tiny tokenizer that speaks TRL's Qwen2.5 chat template (tools included), a tool, and a scripted policy that
calls it, for the tool-loop tests (no download: the template ships with TRL)."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
ANSWER = "5<|im_end|>"


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def chat_tokenizer():
    """The toy's character-level tokenizer with TRL's Qwen2.5 template ([`~toy.tokenizer.build_chat_tokenizer`])."""
    from vcppo_trl.toy import build_chat_tokenizer

    return build_chat_tokenizer()


def scripted_turn(tokenizer, context: str, script: dict | None = None) -> str:
    """What the scripted policy says next: a call of `add` until a tool answered, then the answer. `script` may map
    the number of tool answers seen so far to another turn."""
    answers = context.count("<tool_response>")
    if script is not None and answers in script:
        return script[answers]
    return CALL if answers == 0 else ANSWER


class ScriptedSampler:
    """Stands in for the trainer's sampler: every context gets `scripted_turn`, cut at `max_new_tokens`."""

    name = "scripted"
    start_seconds = 0.0

    def __init__(self, tokenizer, script: dict | None = None):
        self.tokenizer, self.script, self.calls, self.contexts = tokenizer, script, 0, []

    def generate(self, query_ids, query_mask, greedy, temperature, max_new_tokens=None):
        from vcppo_trl.sampling.seam import Samples, pad_responses

        self.calls += 1
        turns = []
        for ids, mask in zip(query_ids, query_mask):
            context = self.tokenizer.decode(ids[mask.bool()].tolist())
            self.contexts.append(context)
            turn = self.tokenizer(scripted_turn(self.tokenizer, context, self.script), add_special_tokens=False)
            turns.append(turn["input_ids"][: max_new_tokens or None])
        responses = pad_responses(turns, self.tokenizer.pad_token_id, query_ids.device)
        lengths = torch.tensor([len(t) for t in turns], device=query_ids.device)
        mask = torch.arange(responses.shape[1], device=query_ids.device).unsqueeze(0) < lengths.unsqueeze(1)
        has_stop = torch.tensor([bool(t) and t[-1] == self.tokenizer.eos_token_id for t in turns])
        return Samples(responses, mask, has_stop)

    def mark_stale(self):
        pass

    def close(self):
        pass


ASSISTANT = "<|im_start|>assistant\n"


def calls_by_row(context: str) -> int:
    """Row i (its prompt says "(i)") calls `add` i % 3 times before answering."""
    return int(re.search(r"\((\d+)\)", context).group(1)) % 3


class ResumingScriptedSampler(ScriptedSampler):
    """A scripted policy for generation windows: each context calls `add` `calls_wanted(context)` times, then answers;
    a turn a window cut is continued from its text so far (the context after its last assistant header)."""

    def __init__(self, tokenizer, calls_wanted: Callable[[str], int] = calls_by_row):
        super().__init__(tokenizer)
        self.calls_wanted = calls_wanted

    def generate(self, query_ids, query_mask, greedy, temperature, max_new_tokens=None):
        from vcppo_trl.sampling.seam import Samples, pad_responses

        self.calls += 1
        turns = []
        for ids, mask in zip(query_ids, query_mask):
            context = self.tokenizer.decode(ids[mask.bool()].tolist())
            self.contexts.append(context)
            full = CALL if context.count("<tool_response>") < self.calls_wanted(context) else ANSWER
            so_far = context.rsplit(ASSISTANT, 1)[-1]
            assert full.startswith(so_far), (so_far, full)
            turn = self.tokenizer(full[len(so_far) :], add_special_tokens=False)["input_ids"]
            turns.append(turn[: max_new_tokens or None])
        responses = pad_responses(turns, self.tokenizer.pad_token_id, query_ids.device)
        lengths = torch.tensor([len(t) for t in turns], device=query_ids.device)
        mask = torch.arange(responses.shape[1], device=query_ids.device).unsqueeze(0) < lengths.unsqueeze(1)
        has_stop = torch.tensor([bool(t) and t[-1] == self.tokenizer.eos_token_id for t in turns])
        return Samples(responses, mask, has_stop)

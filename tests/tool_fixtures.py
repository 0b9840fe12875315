"""A tiny tokenizer that speaks TRL's Qwen2.5 chat template (tools included), a tool, and a scripted policy that
calls it, for the tool-loop tests (no download: the template ships with TRL)."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from transformers import LlamaForCausalLM

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


_TOKENIZERS: dict = {}


def cached_chat_tokenizer():
    if "chat" not in _TOKENIZERS:
        _TOKENIZERS["chat"] = chat_tokenizer()
    return _TOKENIZERS["chat"]


def row_wants_call(context: str) -> bool:
    """Row i (its prompt says "(i)") calls `add` first when i is even, until a tool answered."""
    return "<tool_response>" not in context and int(re.search(r"\((\d+)\)", context).group(1)) % 2 == 0


class ToolCallingPolicy(LlamaForCausalLM):
    """The tiny random policy, but its first turn on an even row is the scripted call of `add` (its scores: the
    policy's own logits over it, so its sampler log-probs are the policy's); every other turn is its own sampling. An
    importable class, so a rollout worker process (`max_staleness`) samples it as the trainer's process would: the
    tool calls happen in the worker."""

    def generate(self, input_ids=None, attention_mask=None, generation_config=None, **kwargs):
        out = super().generate(
            input_ids=input_ids, attention_mask=attention_mask, generation_config=generation_config, **kwargs
        )
        tokenizer = cached_chat_tokenizer()
        contexts = [tokenizer.decode(ids[m.bool()].tolist()) for ids, m in zip(input_ids, attention_mask)]
        scripted = [i for i, context in enumerate(contexts) if row_wants_call(context)]
        as_dict = not isinstance(out, torch.Tensor)
        if not scripted:
            return out
        sequences = out.sequences if as_dict else out
        width, pad = input_ids.shape[1], generation_config.pad_token_id
        call = tokenizer(CALL, add_special_tokens=False)["input_ids"]
        new = sequences[:, width:]
        total = max(new.shape[1], len(call))
        new = torch.nn.functional.pad(new, (0, total - new.shape[1]), value=pad)
        scores = None
        if as_dict:
            scores = torch.stack(out.scores, dim=1)
            scores = torch.nn.functional.pad(scores, (0, 0, 0, total - scores.shape[1]))
        for i in scripted:
            # A generation window may have cut the call: the context then ends with its first tokens; go on from there.
            context = input_ids[i][attention_mask[i].bool()].tolist()
            done = max(k for k in range(len(call)) if k == 0 or context[-k:] == call[:k])
            rest = call[done:][: generation_config.max_new_tokens]
            new[i] = pad
            new[i, : len(rest)] = torch.tensor(rest)
            if scores is not None:
                ids = torch.cat([input_ids[i][attention_mask[i].bool()], new[i, : len(rest)]]).unsqueeze(0)
                with torch.no_grad():
                    logits = self(input_ids=ids).logits[0, -len(rest) - 1 : -1].float()
                scores[i] = 0.0
                scores[i, : len(rest)] = logits / (generation_config.temperature or 1.0)
        sequences = torch.cat([input_ids, new], dim=1)
        if not as_dict:
            return sequences
        out.sequences, out.scores = sequences, tuple(scores.unbind(1))
        return out


def tool_calling_policy(tokenizer, seed: int = 0) -> ToolCallingPolicy:
    """The tests' tiny policy as a [`ToolCallingPolicy`]."""
    from tests import builders

    policy = builders.tiny_policy(tokenizer, seed=seed)
    policy.__class__ = ToolCallingPolicy
    return policy


class AddingEnvironment:
    """An environment whose `add` method is the episode's tool (the scripted call reaches it) and whose reward is the
    number of its calls: state that lives in the instance, for the reward to read once the episode is over."""

    def reset(self, prompt=None, **row):
        self.calls = 0
        return None

    def add(self, a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        self.calls += 1
        return a + b

    def get_reward(self) -> float:
        return float(self.calls)

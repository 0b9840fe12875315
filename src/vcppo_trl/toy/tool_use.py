"""A toy where a tool matters: the addition task with an `add` tool, in TRL's tool format.

The policy answers "Add A and B." either by the worked column-by-column solution of the addition toy (one turn,
`<think>...</think> \\boxed{N}`; a tiny model makes errors that grow with the number of digits) or by calling the
tool and copying its answer (two turns):

```text
<tool_call>
{"name": "add", "arguments": {"a": 4738, "b": 2919}}
</tool_call><|im_end|>                                            <- the policy's turn
<|im_start|>user\\n<tool_response>\\n7657\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n   <- the tool's
\\boxed{7657}<|im_end|>                                            <- the policy's turn
```

The cold start learns both forms, the tool form on a minority of its examples, so that the first policy sometimes
calls the tool; reinforcement learning then has a reason to call it more. The tokenizer is the toy's character-level
one with TRL's bundled Qwen2.5 chat template (TRL parses its tool calls), and with the template's constant text (the
system block that lists the tools, the role headers, the tool-call tags) as single tokens, so that prompts stay about
25 tokens long instead of about 800 characters. Nothing is downloaded.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

import torch
from datasets import Dataset, DatasetDict
from tokenizers import AddedToken
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .task import format_solution
from .tokenizer import build_chat_tokenizer

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def build_tool_tokenizer(tools: tuple[Callable, ...] = (add,)):
    """The chat tokenizer of [`~toy.build_chat_tokenizer`] with the template's constant text as single tokens: the
    system block that lists `tools` (one token), the role headers and the tool-call and tool-response tags. Text the
    policy writes (digits, JSON punctuation) stays one character per token."""
    tokenizer = build_chat_tokenizer()
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tools=list(tools), tokenize=False)
    # "system\n...</tool_call>": after the special "<|im_start|>", which is matched first.
    system_block = rendered.split("<|im_end|>")[0].removeprefix("<|im_start|>")
    chunks = [
        system_block,
        "user\n",
        "assistant\n",
        "<tool_call>\n",
        "\n</tool_call>",
        "<tool_response>\n",
        "\n</tool_response>",
        '{"name": ',
        '"arguments": ',
    ]
    tokenizer.add_tokens([AddedToken(chunk, special=False, normalized=False) for chunk in chunks])
    return tokenizer


def tool_prompt(a: int, b: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Add {a} and {b}."}]


def make_tool_splits(num_train: int, num_eval: int, *, min_digits: int = 1, max_digits: int = 6, seed: int = 0):
    """Train and test splits of conversational addition prompts: `prompt` (a user message), `solution` (the sum as
    text), `difficulty` (digits of the operands), `a`, `b`; the two splits share no pair."""
    rng = random.Random(seed)
    seen, rows = set(), []
    while len(rows) < num_train + num_eval:
        digits = rng.randint(min_digits, max_digits)
        low = 0 if digits == 1 else 10 ** (digits - 1)
        a, b = rng.randint(low, 10**digits - 1), rng.randint(low, 10**digits - 1)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        rows.append({"prompt": tool_prompt(a, b), "solution": str(a + b), "difficulty": digits, "a": a, "b": b})

    def split(part):
        return Dataset.from_list(part)

    return DatasetDict(train=split(rows[:num_train]), test=split(rows[num_train:]))


def cold_start_examples(
    tokenizer: PreTrainedTokenizerBase, dataset: Dataset, *, tool_fraction: float, seed: int = 0
) -> Dataset:
    """Prompt-completion text pairs for the cold start: the prompt as the policy reads it (the tools' system block,
    the question, the generation prompt) and either the worked solution or, on `tool_fraction` of the rows, the tool
    episode as the chat template renders it (the call, the tool's answer, the boxed copy). The final end-of-turn
    token is left to the SFT trainer, which appends the EOS token (`<|im_end|>`) to every completion."""
    rng = random.Random(seed)
    prompts, completions, forms = [], [], []
    for row in dataset:
        prompt = tokenizer.apply_chat_template(row["prompt"], tools=[add], add_generation_prompt=True, tokenize=False)
        if rng.random() < tool_fraction:
            call = {"type": "function", "function": {"name": "add", "arguments": {"a": row["a"], "b": row["b"]}}}
            episode = row["prompt"] + [
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": "add", "content": row["solution"]},
                {"role": "assistant", "content": f"\\boxed{{{row['solution']}}}"},
            ]
            text = tokenizer.apply_chat_template(episode, tools=[add], tokenize=False)
            completion = text[len(prompt) :].rstrip("\n").removesuffix("<|im_end|>")
            forms.append("tool")
        else:
            completion = format_solution(row["a"], row["b"])
            forms.append("worked")
        prompts.append(prompt)
        completions.append(completion)
    return Dataset.from_dict({"prompt": prompts, "completion": completions, "form": forms})


def episode_answer(episode: list[dict[str, Any]] | str) -> str | None:
    """The last `\\boxed{...}` of the episode's last assistant turn (an episode is its list of messages, as reward
    functions receive it with tools; a string is one turn's text)."""
    if isinstance(episode, str):
        text = episode
    else:
        turns = [m for m in episode if m.get("role") == "assistant"]
        text = str(turns[-1].get("content") or "") if turns else ""
    found = _BOXED.findall(text)
    return found[-1].strip() if found else None


def tool_reward(completions, solution, **kwargs) -> list[float]:
    """+1 when the episode's last turn boxes the right sum, -1 otherwise (the toy's rule-based verifier)."""
    return [1.0 if episode_answer(c) == s else -1.0 for c, s in zip(completions, solution)]


def tool_call_rate(completions, **kwargs) -> list[float]:
    """1 for an episode that called a tool, else 0: logged with weight 0, never trained on."""
    return [float(any(m.get("role") == "tool" for m in c)) if isinstance(c, list) else 0.0 for c in completions]


def evaluate_with_tools(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: Dataset,
    *,
    max_new_tokens: int,
    samples_per_prompt: int = 0,
    seed: int = 0,
    batch_size: int = 100,
) -> dict[str, Any]:
    """Held-out episodes run through the trainers' own tool loop ([`~episodes.ToolLoop`]) on `model.generate`: greedy
    (`samples_per_prompt=0`) or that many samples at temperature 1 per prompt. Returns `accuracy`,
    `tool_call_rate` (episodes that called the tool), `length_mean` (the policy's own tokens per episode),
    `completion_tokens_mean` (tool results included), `num_episodes`, `accuracy_by_difficulty`, and the accuracy of
    the episodes that called the tool and of those that did not (`accuracy_with_tool`, `accuracy_without_tool`; None
    when there are none)."""
    from ..episodes import ToolLoop, ToolSettings

    settings = ToolSettings(max_iterations=2, response_length=max_new_tokens, timeout=10.0, max_concurrency=8)
    loop = ToolLoop([add], tokenizer, settings, stop_token_ids=[tokenizer.eos_token_id])
    greedy = samples_per_prompt == 0
    repeats = 1 if greedy else samples_per_prompt
    rows = [row for row in dataset for _ in range(repeats)]
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)

    def tokenize(texts):
        batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        return batch["input_ids"], batch["attention_mask"]

    def generate(ids, mask, new_tokens):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                do_sample=not greedy,
                temperature=None if greedy else 1.0,
                top_k=None if greedy else 0,
                top_p=None if greedy else 1.0,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )[:, ids.shape[1] :].tolist()
        turns = []
        for turn in out:
            end = turn.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in turn else len(turn)
            turns.append(turn[:end])
        return turns, None

    correct, called, policy_tokens, all_tokens, by_difficulty = [], [], [], [], {}
    for start in range(0, len(rows), batch_size):
        part = rows[start : start + batch_size]
        episodes = loop.sample(generate, tokenize, part)
        for row, messages, env_mask in zip(part, episodes.completions, episodes.output["env_mask"]):
            right = episode_answer(messages) == row["solution"]
            correct.append(right)
            called.append(any(m.get("role") == "tool" for m in messages))
            policy_tokens.append(sum(env_mask))
            all_tokens.append(len(env_mask))
            by_difficulty.setdefault(row["difficulty"], []).append(right)
    model.train(was_training)
    n = len(rows)

    def accuracy_where(flag: bool) -> float | None:
        picked = [right for right, call in zip(correct, called) if call == flag]
        return sum(picked) / len(picked) if picked else None

    return {
        "accuracy": sum(correct) / n,
        "tool_call_rate": sum(called) / n,
        "length_mean": sum(policy_tokens) / n,
        "completion_tokens_mean": sum(all_tokens) / n,
        "num_episodes": n,
        "accuracy_by_difficulty": {d: sum(v) / len(v) for d, v in sorted(by_difficulty.items())},
        "accuracy_with_tool": accuracy_where(True),
        "accuracy_without_tool": accuracy_where(False),
    }


def build_tool_toy(
    *,
    output_dir: str,
    seed: int = 0,
    num_train: int | None = None,
    num_eval: int | None = None,
    min_digits: int | None = None,
    max_digits: int | None = None,
    num_heads: int | None = None,
    cold_start_steps: int | None = None,
    cold_start_learning_rate: float | None = None,
    tool_fraction: float = 0.3,
):
    """The command line's tool toy (`train.py --toy_task tool_use`), to train with `tools=[add]`: the tool tokenizer,
    the conversational splits, and a tiny policy cold-started for `cold_start_steps` SFT steps (no early stop; logs in
    `<output_dir>/cold_start`) on worked solutions and, on `tool_fraction` of the examples, `add` episodes. A value
    left `None` takes the text toy's default (`toy.defaults`: 4000 and 300 prompts of 1 to 6 digits, 4 heads, 1000
    steps at 3e-3). Returns the policy, the tokenizer and the train and test splits (`prompt`, `solution`,
    `difficulty`)."""
    import logging
    import os

    from . import defaults
    from .cold_start import cold_start_sft
    from .model import build_tiny_model

    def pick(value, default):
        return default if value is None else value

    tokenizer = build_tool_tokenizer()
    splits = make_tool_splits(
        pick(num_train, defaults.TOY_NUM_TRAIN),
        pick(num_eval, defaults.TOY_NUM_EVAL),
        min_digits=pick(min_digits, defaults.TOY_MIN_DIGITS),
        max_digits=pick(max_digits, defaults.TOY_MAX_DIGITS),
        seed=seed,
    )
    examples = cold_start_examples(tokenizer, splits["train"], tool_fraction=tool_fraction, seed=seed)
    steps = pick(cold_start_steps, defaults.TOY_SFT_STEPS)
    logging.getLogger(__name__).warning(
        f"Embedded tool toy run: cold-start SFT for {steps} steps on {len(examples)} examples, "
        f"{examples['form'].count('tool')} of them calling the `add` tool."
    )
    model = cold_start_sft(
        build_tiny_model(tokenizer, num_heads=pick(num_heads, defaults.TOY_NUM_HEADS), seed=seed),
        tokenizer,
        examples,
        output_dir=os.path.join(output_dir, "cold_start"),
        max_steps=steps,
        learning_rate=pick(cold_start_learning_rate, defaults.TOY_SFT_LEARNING_RATE),
        target_accuracy=None,
        seed=seed,
    )
    columns = ["prompt", "solution", "difficulty"]
    return model, tokenizer, splits["train"].select_columns(columns), splits["test"].select_columns(columns)

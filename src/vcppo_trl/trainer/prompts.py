"""Prompt-dataset checks that run before any training time is spent.

The schema (a `prompt` column of text or chat messages) is checked once and a wrong schema stops with a clear message.
Faults of single rows (an empty prompt, a missing value a reward function needs, a prompt longer than
`max_prompt_length`) drop or truncate that row and are counted, so a few bad rows never crash a batch deep inside
training. [`prompt_batches`] is the order in which training reads the prompts.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from datasets import Dataset
from transformers import PreTrainedTokenizerBase

from ..rollout import prompt_text

# Reward-function parameters that the trainer fills itself, not from dataset columns.
_TRAINER_ARGUMENTS = {
    *("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "kwargs", "args", "self")
}


@dataclass
class DataReport:
    """What preparing one dataset did: rows kept, and rows dropped or truncated per reason."""

    num_rows: int
    kept: int
    dropped: dict[str, int] = field(default_factory=dict)
    truncated_prompts: int = 0

    def metrics(self, prefix: str) -> dict[str, float]:
        out = {f"data/{prefix}_rows_dropped_{reason}": float(n) for reason, n in self.dropped.items() if n}
        if self.truncated_prompts:
            out[f"data/{prefix}_prompts_truncated"] = float(self.truncated_prompts)
        return out

    def summary(self) -> str:
        parts = [f"{n} dropped ({reason.replace('_', ' ')})" for reason, n in self.dropped.items() if n]
        if self.truncated_prompts:
            parts.append(f"{self.truncated_prompts} prompts left-truncated to max_prompt_length")
        return f"{self.kept}/{self.num_rows} rows kept" + (": " + ", ".join(parts) if parts else "")


def reward_function_columns(reward_funcs: Sequence[Any], columns: Sequence[str]) -> list[str]:
    """Dataset columns that reward functions name as parameters (e.g. `solution`): a row needs a value in each."""
    needed: list[str] = []
    for func in reward_funcs:
        if not callable(func) or not _is_plain_callable(func):
            continue
        try:
            parameters = inspect.signature(func).parameters
        except (TypeError, ValueError):
            continue
        for name, parameter in parameters.items():
            if parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL) or name in _TRAINER_ARGUMENTS:
                continue
            if name in columns and name not in needed:
                needed.append(name)
    return needed


REWARD_CONTRACT = (
    "A reward function is called with keywords: f(prompts=..., completions=..., completion_ids=..., "
    "trainer_state=..., log_extra=..., log_metric=..., **every other column of the dataset), and returns one float "
    "(or None: does not apply) per completion; TRL's protocol, so it should take **kwargs."
)


def check_reward_signatures(
    reward_funcs: Sequence[Any], columns: Sequence[str], dataset_name: str, rollout_func_keys: bool = False
) -> None:
    """
    Refuse, when the trainer is built, a reward function that its calls would fail: a required parameter that is
    neither a column of the dataset nor one the trainer passes (e.g. `math_verify_reward`'s `solution` on a dataset
    without that column), a positional-only one, or a function without `**kwargs` that does not take every keyword
    it will be given. Functions whose signature cannot be read, and reward models, are not checked. With
    `rollout_func_keys` a `rollout_func` may add keys when it runs, so a parameter that is not a column is left to it.
    """
    passed = {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric"}
    passed |= {c for c in columns if c not in ("prompt", "completion")}
    for func in reward_funcs:
        if not callable(func) or not _is_plain_callable(func):
            continue
        try:
            parameters = inspect.signature(func).parameters
        except (TypeError, ValueError):
            continue
        name = getattr(func, "__name__", type(func).__name__)
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        for param in parameters.values():
            if param.kind is param.POSITIONAL_ONLY and param.default is param.empty:
                raise ValueError(
                    f"Reward function {name!r} has the positional-only parameter {param.name!r}, which it cannot be "
                    f"given. {REWARD_CONTRACT}"
                )
            required = param.default is param.empty and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)
            if required and param.name not in passed and not rollout_func_keys:
                raise ValueError(
                    f"Reward function {name!r} needs the argument {param.name!r}, which is neither a column of "
                    f"{dataset_name} (its columns: {', '.join(columns)}) nor one the trainer passes (prompts, "
                    f"completions, completion_ids, trainer_state, log_extra, log_metric). Add a {param.name!r} column to the dataset, or give "
                    f"the parameter a default. {REWARD_CONTRACT}"
                )
        unexpected = sorted(passed - set(parameters))
        if not takes_kwargs and unexpected:
            raise ValueError(
                f"Reward function {name!r} takes no **kwargs and would be given {', '.join(unexpected)}, which it does "
                f"not accept. Add **kwargs to its parameters. {REWARD_CONTRACT}"
            )


def _is_plain_callable(func: Any) -> bool:
    """Reward models (torch modules) are scored from text, not dataset columns."""
    try:
        import torch

        return not isinstance(func, torch.nn.Module)
    except ImportError:  # pragma: no cover - torch is a dependency
        return True


def check_prompt_schema(dataset: Dataset, name: str) -> None:
    """Stop before training when the `prompt` column is neither text nor a list of chat messages."""
    feature = dataset.features.get("prompt")
    sample = next((p for p in dataset["prompt"][:64] if p is not None), None)
    if sample is None:
        raise ValueError(
            f"`{name}`: the 'prompt' column holds no values in its first rows; fill it with text prompts."
        )
    if isinstance(sample, str):
        return
    if isinstance(sample, list) and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in sample):
        return
    raise ValueError(
        f"`{name}`: the 'prompt' column must hold text or chat messages (a list of {{'role', 'content'}} dicts), but "
        f"its type is {feature} (first value: {sample!r:.120}). Convert it, e.g. dataset.map(lambda r: "
        "{'prompt': str(r['prompt'])})."
    )


def check_chat_template(dataset: Dataset, name: str, tokenizer: PreTrainedTokenizerBase) -> None:
    """Stop when the prompts are chat messages but the tokenizer has no chat template to turn them into text."""
    sample = next((p for p in dataset["prompt"][:64] if p is not None), None)
    if isinstance(sample, list) and getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"`{name}` holds chat messages (conversational prompts) but the tokenizer "
            f"({type(tokenizer).__name__}, {getattr(tokenizer, 'name_or_path', '') or 'built in-process'}) has no chat "
            "template to format them. Use the instruct/chat variant's tokenizer, set `tokenizer.chat_template`, or "
            "give text prompts (train.py: drop --conversational)."
        )


def _is_empty_prompt(prompt: Any) -> bool:
    if prompt is None:
        return True
    if isinstance(prompt, str):
        return not prompt.strip()
    if isinstance(prompt, list):
        return not any(isinstance(m, dict) and str(m.get("content") or "").strip() for m in prompt)
    return False


def prompt_token_lengths(
    prompts: Sequence[Any], tokenizer: PreTrainedTokenizerBase, chat_template_kwargs: dict | None = None
) -> list[int]:
    """Token counts of prompts as the trainer feeds them (chat template applied, no added special tokens)."""
    texts = [prompt_text(p, tokenizer, chat_template_kwargs) for p in prompts]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [len(ids) for ids in encoded]


def prepare_prompt_dataset(
    dataset: Dataset,
    name: str,
    tokenizer: PreTrainedTokenizerBase,
    required_columns: Sequence[str],
    max_prompt_length: int | None,
    overlong_prompt: str,
    chat_template_kwargs: dict | None = None,
) -> tuple[Dataset, DataReport]:
    """
    Drop rows that cannot be trained on, and count them.

    Args:
        dataset: Rows with a `prompt` column (checked by [`check_prompt_schema`] first).
        name: The argument's name, for messages.
        tokenizer: The policy's tokenizer (to measure prompt lengths).
        required_columns: Columns that must hold a value (not `None`) in every row.
        max_prompt_length: Longest prompt in tokens, or `None` for no limit.
        overlong_prompt: `"truncate"` (left-truncated when tokenized, counted) or `"drop"`.

    Returns:
        `(dataset, report)`: the rows kept, and what was dropped or truncated per reason.
    """
    check_prompt_schema(dataset, name)
    check_chat_template(dataset, name, tokenizer)
    prompts = dataset["prompt"]
    keep = [True] * len(dataset)
    dropped = {"empty_prompt": 0}
    for i, prompt in enumerate(prompts):
        if _is_empty_prompt(prompt):
            keep[i] = False
            dropped["empty_prompt"] += 1
    for column in required_columns:
        reason = f"missing_{column}"
        dropped[reason] = 0
        for i, value in enumerate(dataset[column]):
            if keep[i] and (value is None or (isinstance(value, str) and not value.strip())):
                keep[i] = False
                dropped[reason] += 1
    truncated = 0
    if max_prompt_length is not None:
        dropped["overlong_prompt"] = 0
        candidates = [i for i, k in enumerate(keep) if k]
        lengths = prompt_token_lengths([prompts[i] for i in candidates], tokenizer, chat_template_kwargs)
        for i, length in zip(candidates, lengths):
            if length > max_prompt_length:
                if overlong_prompt == "drop":
                    keep[i] = False
                    dropped["overlong_prompt"] += 1
                else:
                    truncated += 1
    kept_indices = [i for i, k in enumerate(keep) if k]
    report = DataReport(len(dataset), len(kept_indices), dropped, truncated_prompts=truncated)
    if not kept_indices:
        raise ValueError(f"`{name}`: no usable rows are left ({report.summary()}).")
    if len(kept_indices) < len(dataset):
        dataset = dataset.select(kept_indices)
    return dataset, report


def prompt_batches(
    dataset: Dataset, batches, rank: int, seed: int, num_generations: int, start: int = 0, shuffle: bool = True
) -> Iterator[list[dict[str, Any]]]:
    """
    Endless stream of one process's prompt batches, from batch number `start` on (for resuming).

    Each pass over the dataset is a permutation drawn from `seed + pass` (so a position is just a batch count), or the
    dataset's own order in every pass when not `shuffle` (`shuffle_dataset=False`); every
    update takes the next `batches.prompts_per_update` prompts of it and process `rank` the `rank`-th slice of
    `batches.local_prompts_per_update` (a [`~config.batch_plan.BatchPlan`]), so processes never overlap; each prompt
    appears `num_generations` times in a row. The tail that does not fill a whole batch is left out of that pass.
    """
    per_update, local = batches.prompts_per_update, batches.local_prompts_per_update
    batches_per_pass = len(dataset) // per_update
    batch = start
    while True:
        epoch, index = divmod(batch, batches_per_pass)
        if shuffle:
            order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed + epoch))
        else:
            order = torch.arange(len(dataset))
        first = index * per_update + rank * local
        rows = [dataset[int(i)] for i in order[first : first + local]]
        yield [row for row in rows for _ in range(num_generations)]
        batch += 1


class PromptStream:
    """
    One process's [`prompt_batches`] with the count of batches drawn: one per update, more under dynamic sampling.
    Checkpoints save the count (`batches_consumed`), so that a resumed run draws the same prompts.
    """

    def __init__(
        self,
        dataset: Dataset,
        batches,
        rank: int,
        seed: int,
        num_generations: int,
        consumed: int = 0,
        shuffle: bool = True,
    ):
        self._order = dict(
            dataset=dataset, batches=batches, rank=rank, seed=seed, num_generations=num_generations, shuffle=shuffle
        )
        self.seek(consumed)

    def seek(self, consumed: int) -> None:
        """Continue after `consumed` batches (a checkpoint's count): the next draw is batch number `consumed`."""
        self.consumed = consumed
        self._batches = prompt_batches(**self._order, start=consumed)

    def draw(self) -> list[dict[str, Any]]:
        """The next batch of prompt rows (each `num_generations` times in a row)."""
        self.consumed += 1
        return next(self._batches)

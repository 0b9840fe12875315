"""Greedy evaluation of a toy policy with a plain exact-match check of the boxed answer."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .defaults import TOY_MAX_NEW_TOKENS
from .task import extract_boxed_answer, is_correct, response_mode


@torch.no_grad()
def greedy_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: Dataset,
    max_new_tokens: int = TOY_MAX_NEW_TOKENS,
    batch_size: int = 64,
) -> dict[str, Any]:
    """Evaluates `model` with greedy decoding on a prompt/solution dataset.

    Prompts are left-padded and batched by length. A response counts as correct when the content of its last
    `\\boxed{...}` after `</think>` is exactly the gold integer.

    Args:
        model ([`~transformers.PreTrainedModel`]):
            Causal language model to evaluate.
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]):
            Its tokenizer (must define `pad_token` and `eos_token`).
        dataset ([`~datasets.Dataset`]):
            Dataset with `prompt` and `solution` columns, and optionally `difficulty`.
        max_new_tokens (`int`, *optional*, defaults to `TOY_MAX_NEW_TOKENS`):
            Maximum number of generated tokens per response.
        batch_size (`int`, *optional*, defaults to `64`):
            Number of prompts generated together.

    Returns:
        `dict[str, Any]`: With keys `accuracy` (fraction of correct responses), `response_length_mean` (mean number of
        generated tokens, eos included), `format_rate` (fraction that close `</think>` and give a boxed answer),
        `eos_rate` (fraction that end with the eos token within `max_new_tokens`), `short_rate` (fraction in the
        compressed form, see [`~vcppo_trl.toy.task.response_mode`]), `num_examples`, and, when the
        dataset has a `difficulty` column, `accuracy_by_difficulty` and `response_length_by_difficulty` (dicts keyed by
        difficulty).
    """
    was_training = model.training
    model.eval()
    padding_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    eos_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id
    prompts = list(dataset["prompt"])
    solutions = list(dataset["solution"])
    difficulties = list(dataset["difficulty"]) if "difficulty" in dataset.column_names else None
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    correct = [False] * len(prompts)
    formatted = [False] * len(prompts)
    stopped = [False] * len(prompts)
    short = [False] * len(prompts)
    lengths = [0] * len(prompts)
    device = next(model.parameters()).device
    try:
        for start in range(0, len(order), batch_size):
            indices = order[start : start + batch_size]
            batch = tokenizer([prompts[i] for i in indices], return_tensors="pt", padding=True).to(device)
            output = model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=eos_id,
                pad_token_id=pad_id,
            )
            completions = output[:, batch["input_ids"].shape[1] :].tolist()
            for i, ids in zip(indices, completions):
                if eos_id in ids:
                    ids = ids[: ids.index(eos_id) + 1]
                    stopped[i] = True
                lengths[i] = len(ids)
                text = tokenizer.decode(ids, skip_special_tokens=True)
                formatted[i] = extract_boxed_answer(text) is not None
                short[i] = response_mode(text) == "short"
                correct[i] = is_correct(text, solutions[i])
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)

    n = max(len(prompts), 1)
    metrics: dict[str, Any] = {
        "accuracy": sum(correct) / n,
        "response_length_mean": sum(lengths) / n,
        "format_rate": sum(formatted) / n,
        "eos_rate": sum(stopped) / n,
        "short_rate": sum(short) / n,
        "num_examples": len(prompts),
    }
    if difficulties is not None:
        groups: dict[int, list[int]] = defaultdict(list)
        for i, d in enumerate(difficulties):
            groups[d].append(i)
        metrics["accuracy_by_difficulty"] = {
            d: sum(correct[i] for i in idx) / len(idx) for d, idx in sorted(groups.items())
        }
        metrics["response_length_by_difficulty"] = {
            d: sum(lengths[i] for i in idx) / len(idx) for d, idx in sorted(groups.items())
        }
        metrics["short_rate_by_difficulty"] = {
            d: sum(short[i] for i in idx) / len(idx) for d, idx in sorted(groups.items())
        }
    return metrics


@torch.no_grad()
def teacher_forced_exact_match(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: Dataset,
    batch_size: int = 64,
) -> dict[str, Any]:
    """Fraction of examples whose whole gold completion (eos included) is the model's argmax at every position.

    This needs a single forward pass per batch, and it equals the fraction of prompts for which greedy decoding
    reproduces the gold completion exactly, so it is a cheap lower bound of the greedy accuracy of
    [`greedy_accuracy`] (which also accepts a right answer reached through a different reasoning).

    Args:
        model ([`~transformers.PreTrainedModel`]):
            Causal language model to evaluate.
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]):
            Its tokenizer (must define `pad_token` and `eos_token`).
        dataset ([`~datasets.Dataset`]):
            Dataset with `prompt` and `completion` columns, and optionally `difficulty`.
        batch_size (`int`, *optional*, defaults to `64`):
            Number of sequences per forward pass.

    Returns:
        `dict[str, Any]`: With keys `exact_match` and, when the dataset has a `difficulty` column,
        `exact_match_by_difficulty`.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    prompts = list(dataset["prompt"])
    completions = list(dataset["completion"])
    matched = []
    try:
        for start in range(0, len(prompts), batch_size):
            sequences, starts = [], []
            for prompt, completion in zip(
                prompts[start : start + batch_size], completions[start : start + batch_size]
            ):
                prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
                ids = tokenizer(prompt + completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                sequences.append(ids)
                starts.append(len(prompt_ids))
            max_len = max(len(ids) for ids in sequences)
            input_ids = torch.full((len(sequences), max_len), tokenizer.pad_token_id, dtype=torch.long)
            attention_mask = torch.zeros_like(input_ids)
            target_mask = torch.zeros_like(input_ids, dtype=torch.bool)
            for row, (ids, first) in enumerate(zip(sequences, starts)):
                input_ids[row, : len(ids)] = torch.tensor(ids)
                attention_mask[row, : len(ids)] = 1
                target_mask[row, first : len(ids)] = True
            logits = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits
            predictions = logits[:, :-1].argmax(-1).cpu()
            correct = (predictions == input_ids[:, 1:]) | ~target_mask[:, 1:]
            matched.extend(correct.all(dim=1).tolist())
    finally:
        model.train(was_training)

    metrics: dict[str, Any] = {"exact_match": sum(matched) / max(len(matched), 1)}
    if "difficulty" in dataset.column_names:
        groups: dict[int, list[bool]] = defaultdict(list)
        for ok, d in zip(matched, dataset["difficulty"]):
            groups[d].append(ok)
        metrics["exact_match_by_difficulty"] = {d: sum(v) / len(v) for d, v in sorted(groups.items())}
    return metrics


@torch.no_grad()
def sampled_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: Dataset,
    num_samples: int = 4,
    max_new_tokens: int = TOY_MAX_NEW_TOKENS,
    temperature: float = 1.0,
    seed: int = 0,
    batch_size: int = 64,
) -> dict[str, Any]:
    """Evaluates `model` by sampling `num_samples` responses per prompt at `temperature` (pure sampling).

    Greedy decoding hides a stop whose probability stays below one half at every step; sampling shows the policy's own
    length and accuracy. The sampling uses its own generator state (`seed`), so the caller's random state is left as
    it was and the same model always gives the same figures.

    Returns:
        `dict[str, Any]`: `accuracy` (share of correct samples), `pass_at_k` (share of prompts with a correct sample
        among their `num_samples`), `response_length_mean` (generated tokens, eos included), `eos_rate`,
        `num_samples`, `num_examples` and `temperature`.
    """
    from .reward_model import sample_responses

    if num_samples < 1:
        raise ValueError(f"`num_samples` must be at least 1, got {num_samples}.")
    prompts = [p for p in dataset["prompt"] for _ in range(num_samples)]
    solutions = [s for s in dataset["solution"] for _ in range(num_samples)]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        responses = sample_responses(
            model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size, temperature=temperature
        )
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    correct = [is_correct(t, s) for t, s in zip(texts, solutions)]
    per_prompt = [correct[i : i + num_samples] for i in range(0, len(correct), num_samples)]
    return {
        "accuracy": sum(correct) / max(len(correct), 1),
        "pass_at_k": sum(any(c) for c in per_prompt) / max(len(per_prompt), 1),
        "response_length_mean": sum(len(r) for r in responses) / max(len(responses), 1),
        "eos_rate": sum(tokenizer.eos_token_id in r for r in responses) / max(len(responses), 1),
        "num_samples": num_samples,
        "num_examples": len(per_prompt),
        "temperature": temperature,
    }

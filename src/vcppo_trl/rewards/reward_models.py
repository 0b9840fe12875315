"""Reward models as reward functions: their names in the logs and their scores of a rollout's sequences."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..algo.micro_batches import plan_forwards


def reward_func_name(func: Callable | PreTrainedModel) -> str:
    if isinstance(func, PreTrainedModel):
        return func.config._name_or_path.split("/")[-1] or type(func).__name__
    return getattr(func, "__name__", type(func).__name__)


@torch.no_grad()
def reward_model_scores(
    reward_model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    batch_size: int,
    max_tokens: int | None = None,
    max_across: Callable[[list[int]], list[int]] | None = None,
) -> list[float]:
    """
    Score full texts (prompt + completion) with a sequence-classification reward model, one scalar each.

    `batch_size` texts per forward in order, or, with a token budget `max_tokens`, texts grouped by their token count
    into forwards of at most that many padded tokens (the same count on every process: `max_across`, see
    [`~algo.micro_batches.plan_forwards`]).
    """
    device = next(reward_model.parameters()).device
    if max_tokens is None:
        lengths = torch.zeros(len(texts), dtype=torch.long)  # unused: `batch_size` texts at a time
    else:
        lengths = torch.tensor([len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]])
    rows = torch.arange(len(texts))
    (plan,) = plan_forwards(
        [rows],
        lengths,
        torch.zeros_like(lengths),
        max_tokens=max_tokens,
        rows_per_micro_batch=batch_size,
        context_length=0,
        response_length=0,
        max_across=max_across,
    )
    scores = [0.0] * len(texts)
    for micro in plan:
        chunk = micro.indices.tolist()
        inputs = tokenizer(
            [texts[i] for i in chunk],
            return_tensors="pt",
            padding=True,
            padding_side="right",
            add_special_tokens=False,
        )
        inputs = {k: v.to(device) for k, v in inputs.items()}
        logits = reward_model(**inputs).logits
        for i, score in zip(chunk, logits[:, 0].float().tolist()):
            scores[i] = score
    return scores

"""What samples a batch of prompts: the trainer's sampler (one response per row), a user's `rollout_func` (TRL's), or
the tool loop (TRL's `tools=`, multi-turn episodes on the trainer's sampler). Each gives the same things to score."""

from __future__ import annotations

from typing import Any

import torch

from ..sampling.seam import Samples
from .rollout_function import sample_with_rollout_function
from .tool_loop import flag_on_any_process, sample_tool_episodes


def sample_episodes(
    maker, rows: list[dict[str, Any]], *, greedy: bool, temperature: float | None, num_generations: int | None
) -> tuple[list[dict[str, Any]], torch.Tensor, torch.Tensor, Samples, list[str], list[list[dict]] | None]:
    """
    `rows` sampled by `maker`'s source of samples ([`~rollout.maker.RolloutMaker`]): `(rows, query_ids, query_mask,
    samples, prompt_texts, episodes)`. `rows` gain a `rollout_func`'s extra keys; `episodes` are the tool episodes as
    messages (what TRL gives reward functions as completions), else `None`; `num_generations` is how many times each
    prompt is repeated in a row (and so given to a `rollout_func`, as TRL gives it).
    """
    settings = maker.settings
    tensors = dict(
        response_length=settings.response_length,
        stop_token_ids=maker.stop_token_ids,
        pad_token_id=maker.tokenizer.pad_token_id,
        device=maker.accelerator.device,
    )
    if maker.tool_loop is not None:
        rows, query_ids, query_mask, samples, prompt_texts, episodes = sample_tool_episodes(
            maker.tool_loop,
            maker.sampler,
            rows,
            greedy=greedy,
            temperature=temperature or settings.temperature,
            tokenize=maker.tokenize_prompts,
            any_process=flag_on_any_process(maker.accelerator),
            **tensors,
        )
        return rows, query_ids, query_mask, samples, prompt_texts, episodes
    prompt_texts = maker.prompt_texts(rows)
    if maker.rollout_function is not None:
        k = num_generations or settings.num_generations
        rows, query_ids, query_mask, samples = sample_with_rollout_function(maker.rollout_function, rows, k, **tensors)
        return rows, query_ids, query_mask, samples, prompt_texts, None
    query_ids, query_mask = maker.tokenize_prompts(prompt_texts)
    samples = maker.generate(query_ids, query_mask, greedy=greedy, temperature=temperature)
    return rows, query_ids, query_mask, samples, prompt_texts, None

"""Scored samples, what [`~rollout_maker.RolloutMaker.sample_and_score`] returns to training and evaluation, and the
decoding of responses into what reward functions receive."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase
from trl.data_utils import is_conversational

from .generation import Samples


@dataclasses.dataclass
class ScoredSamples:
    """What [`~rollout_maker.RolloutMaker.sample_and_score`] returns: prompts as tokens, the samples, and their rewards."""

    query_ids: torch.Tensor  # [B, P] left-padded
    query_mask: torch.Tensor  # [B, P]
    samples: Samples
    completions: list[Any]  # what the reward functions received
    rewards_per_func: torch.Tensor  # [B, F], nan where a function returned None
    reward_failed: torch.Tensor  # [B] bool
    raw_scores: torch.Tensor  # [B] weighted sum of the functions, nan where none applied


def decode_completions(
    rows: list[dict[str, Any]],
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    stop_token_ids: list[int],
    tokenizer: PreTrainedTokenizerBase,
) -> tuple[list[Any], list[str], list[list[int]]]:
    """Decode responses (stop token excluded) into what reward functions receive: `(completions, texts, ids)`."""
    stop = torch.isin(response_ids, torch.tensor(stop_token_ids, device=response_ids.device))
    content_mask = response_mask & ~stop
    completion_ids = [ids[m].tolist() for ids, m in zip(response_ids, content_mask)]
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    if rows and is_conversational({"prompt": rows[0]["prompt"]}):
        completions = [[{"role": "assistant", "content": t}] for t in texts]
    else:
        completions = texts
    return completions, texts, completion_ids

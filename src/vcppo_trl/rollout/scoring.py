"""Scored samples, what [`~rollout.maker.RolloutMaker.sample_and_score`] returns to training and evaluation, and the
decoding of responses into what reward functions receive."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase
from trl.data_utils import is_conversational, maybe_apply_chat_template

from ..rewards.reward_logs import merged_columns, merged_metrics
from ..sampling.seam import Samples


@dataclasses.dataclass
class ScoredSamples:
    """What [`~rollout.maker.RolloutMaker.sample_and_score`] returns: prompts as tokens, the samples, and their rewards."""

    query_ids: torch.Tensor  # [B, P] left-padded
    query_mask: torch.Tensor  # [B, P]
    samples: Samples
    completions: list[Any]  # what the reward functions received
    rewards_per_func: torch.Tensor  # [B, F], nan where a function returned None
    reward_failed: torch.Tensor  # [B] bool
    raw_scores: torch.Tensor  # [B] weighted sum of the functions, nan where none applied
    # What the reward functions logged (TRL's `log_extra`, `log_metric`; `rewards/reward_logs.py`): columns of B
    # values for the logged completions, and metrics' values.
    logged_columns: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    logged_metrics: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    def select(self, idx: list[int]) -> ScoredSamples:
        """The samples `idx`, in that order (tensors stay as wide as they are)."""
        rows = torch.tensor(idx, dtype=torch.long, device=self.query_ids.device)
        samples = self.samples
        return ScoredSamples(
            self.query_ids[rows],
            self.query_mask[rows],
            Samples(
                samples.response_ids[rows],
                samples.response_mask[rows],
                samples.has_stop[rows],
                logprobs=None if samples.logprobs is None else samples.logprobs[rows],
                seconds=samples.seconds,
                action_mask=None if samples.action_mask is None else samples.action_mask[rows],
                episode_counts=None
                if samples.episode_counts is None
                else {k: v[rows] for k, v in samples.episode_counts.items()},
            ),
            completions=[self.completions[i] for i in idx],
            rewards_per_func=self.rewards_per_func[rows],
            reward_failed=self.reward_failed[rows],
            raw_scores=self.raw_scores[rows],
            logged_columns={name: [column[i] for i in idx] for name, column in self.logged_columns.items()},
            logged_metrics=self.logged_metrics,
        )


def padded_to_multiple(scored: ScoredSamples, multiple: int | None, pad_token_id: int) -> ScoredSamples:
    """`scored` with its prompts left-padded and its responses right-padded to a multiple of `multiple` tokens
    (`pad_to_multiple_of`; masked out like any padding), or itself when `multiple` is None or they already are."""
    if multiple is None:
        return scored
    return concat_scored([scored], pad_token_id, multiple=multiple)


def concat_scored(parts: list[ScoredSamples], pad_token_id: int, multiple: int = 1) -> ScoredSamples:
    """
    The samples of several generation rounds as one batch: prompts left-padded and responses right-padded to the
    widest, rounded up to a multiple of `multiple` (`pad_token_id`, mask 0; sampler log-probs 0), generation seconds
    summed.
    """
    prompt_width = -(-max(p.query_ids.shape[1] for p in parts) // multiple) * multiple
    response_width = -(-max(p.samples.response_ids.shape[1] for p in parts) // multiple) * multiple
    if len(parts) == 1 and parts[0].query_ids.shape[1] == prompt_width:
        if parts[0].samples.response_ids.shape[1] == response_width:
            return parts[0]

    def left(t: torch.Tensor, value) -> torch.Tensor:
        return torch.nn.functional.pad(t, (prompt_width - t.shape[1], 0), value=value)

    def right(t: torch.Tensor, value) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, response_width - t.shape[1]), value=value)

    logprobs = [p.samples.logprobs for p in parts]
    action_masks = [p.samples.action_mask for p in parts]
    if any(m is not None for m in action_masks):  # a part without one: all its response tokens are the policy's
        action_masks = [p.samples.response_mask if m is None else m for p, m in zip(parts, action_masks)]
    samples = Samples(
        torch.cat([right(p.samples.response_ids, pad_token_id) for p in parts]),
        torch.cat([right(p.samples.response_mask, False) for p in parts]),
        torch.cat([p.samples.has_stop for p in parts]),
        logprobs=None if any(lp is None for lp in logprobs) else torch.cat([right(lp, 0.0) for lp in logprobs]),
        seconds=sum(p.samples.seconds for p in parts),
        action_mask=torch.cat([right(m, False) for m in action_masks]) if action_masks[0] is not None else None,
        episode_counts=None
        if any(p.samples.episode_counts is None for p in parts)
        else {k: torch.cat([p.samples.episode_counts[k] for p in parts]) for k in parts[0].samples.episode_counts},
    )
    return ScoredSamples(
        torch.cat([left(p.query_ids, pad_token_id) for p in parts]),
        torch.cat([left(p.query_mask, 0) for p in parts]),
        samples,
        completions=[c for p in parts for c in p.completions],
        rewards_per_func=torch.cat([p.rewards_per_func for p in parts]),
        reward_failed=torch.cat([p.reward_failed for p in parts]),
        raw_scores=torch.cat([p.raw_scores for p in parts]),
        logged_columns=merged_columns([p.logged_columns for p in parts], [len(p.completions) for p in parts]),
        logged_metrics=merged_metrics([p.logged_metrics for p in parts]),
    )


def prompt_text(prompt: Any, tokenizer: PreTrainedTokenizerBase, chat_template_kwargs: dict | None) -> str:
    """A prompt as the policy reads it: chat messages rendered by the tokenizer's chat template (with
    `chat_template_kwargs`, the config's), text as it is."""
    return maybe_apply_chat_template({"prompt": prompt}, tokenizer, **(chat_template_kwargs or {}))["prompt"]


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

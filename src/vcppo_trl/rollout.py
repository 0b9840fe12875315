"""Rollout pieces: the joint policy/critic module, stop-token truncation, and reward scoring.

The trainer composes these into one [`Rollout`] per update: tokens, masks, log-probabilities, values and scores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .logprobs import packed_response_logprobs, response_logprobs
from .masked import masked_whiten
from .micro_batches import plan_forwards
from .packing import PackedRow
from .value_model import packed_value_forward, value_forward


@dataclass
class Rollout:
    """
    One batch of experience, all tensors on the trainer's device.

    Shapes: `B` sequences, `P` prompt tokens (left-padded), `T` response tokens (right-padded).
    """

    prompts: list[Any]
    completions: list[Any]
    extra_columns: dict[str, list[Any]]
    query_ids: torch.Tensor  # [B, P]
    query_mask: torch.Tensor  # [B, P]
    response_ids: torch.Tensor  # [B, T], padded after the stop token
    response_mask: torch.Tensor  # [B, T] bool: valid response tokens (stop token included)
    has_stop: torch.Tensor  # [B] bool: the response ended with a stop token
    scores: torch.Tensor  # [B] reward used for training (penalties included), 0 where skipped
    raw_scores: torch.Tensor  # [B] weighted reward-function sum before penalties, nan where skipped
    rewards_per_func: torch.Tensor  # [B, F], nan where a function returned None
    reward_failed: torch.Tensor  # [B] bool: a reward function failed on the sample (given reward_failure_value)
    values: torch.Tensor | None = None  # [B, T]
    logprobs: torch.Tensor | None = None  # [B, T] old log-probs; filled by the update under the on-policy shortcut
    ref_logprobs: torch.Tensor | None = None  # [B, T]
    rewards: torch.Tensor | None = None  # [B, T] per-token rewards fed to GAE
    kl: torch.Tensor | None = None  # [B, T] per-token KL estimate
    sampler_logprobs: torch.Tensor | None = None  # [B, T] the sampler's own log-probs (vLLM), 0 outside the mask
    # [B] ≤ 0: the overlong shaping term included in `scores` ([`overlong_penalty`]); None when shaping is off
    overlong_penalties: torch.Tensor | None = None

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.query_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.query_mask.bool(), self.response_mask], dim=1).long()

    @property
    def context_length(self) -> int:
        return self.query_ids.shape[1]

    def is_correct(self, accuracy_threshold: float) -> torch.Tensor:
        """`[B]` bool: [`is_correct`] of the raw scores (the accuracy metric's rule)."""
        return is_correct(self.raw_scores, accuracy_threshold)


def is_correct(raw_scores: torch.Tensor, accuracy_threshold: float) -> torch.Tensor:
    """Whether each response counts as correct: its reward before penalties and shaping exceeds the threshold (False
    where it was not scored, nan). The rule of `diagnostics/accuracy`, `eval/accuracy` and the positive-example LM loss."""
    return raw_scores > accuracy_threshold  # nan compares False


def overlong_penalty(
    lengths: torch.Tensor, has_stop: torch.Tensor, response_length: int, buffer_length: int, factor: float
) -> torch.Tensor:
    """
    DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13; verl's `overlong_buffer`), as a reward term ≤ 0.

    With `L = response_length` and the buffer `L_b`, a response of `|y|` tokens gets `0` up to `L − L_b` tokens, then
    `−factor × (|y| − (L − L_b)) / L_b`, reaching `−factor` at `|y| = L`; a response without a stop token (cut at `L`,
    or earlier by the sampler's context limit) gets `−factor` whatever its length.

    Args:
        lengths (`torch.Tensor` of shape `[B]`): Response lengths `|y|`, the stop token counted (the response mask's
            sum, as verl's `valid_response_length`).
        has_stop (`torch.Tensor` of shape `[B]`): Whether each response ended with a stop token.
        response_length, buffer_length, factor: `L`, `L_b` and the largest penalty.

    Returns:
        `torch.Tensor` of shape `[B]`, float32, in `[−factor, 0]`.
    """
    excess = (lengths.float() - (response_length - buffer_length)) / buffer_length
    penalty = -factor * excess.clamp(min=0.0, max=1.0)
    return torch.where(has_stop, penalty, torch.full_like(penalty, -factor))


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over attended tokens only, as `generate` does for left-padded prompts."""
    return (attention_mask.long().cumsum(1) - 1).clamp(min=0)


def truncate_at_stop(
    responses: torch.Tensor, stop_token_ids: list[int], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """
    Cut generated responses after their first stop token.

    The mask is built from the position of the first stop token, never from `ids != pad_token_id` (which would hide a
    real EOS token when the tokenizer pads with EOS).

    Args:
        responses (`torch.Tensor` of shape `[B, T]`): Generated token ids.
        stop_token_ids (`list[int]`): Ids that end a response.
        pad_token_id (`int`): Id written after the stop token.

    Returns:
        `(responses, response_mask, has_stop)`: padded ids `[B, T]`, bool mask `[B, T]` of the valid tokens (the stop
        token included), and bool `[B]` telling whether a stop token was produced.
    """
    is_stop = torch.isin(responses, torch.tensor(stop_token_ids, device=responses.device))
    has_stop = is_stop.any(dim=1)
    length = responses.shape[1]
    first_stop = torch.where(
        has_stop, is_stop.int().argmax(dim=1), torch.full_like(has_stop, length - 1, dtype=torch.long)
    )
    positions = torch.arange(length, device=responses.device).unsqueeze(0)
    response_mask = positions <= first_stop.unsqueeze(1)
    responses = torch.where(response_mask, responses, torch.full_like(responses, pad_token_id))
    return responses, response_mask, has_stop


class PolicyAndValueModel(nn.Module):
    """
    The policy and the critic as one module, so that one optimizer (with a learning rate per model) and one
    `accelerator.prepare` (DDP or DeepSpeed) serve both, and one forward feeds the PPO loss.
    """

    def __init__(self, policy: PreTrainedModel, critic: PreTrainedModel):
        super().__init__()
        self.policy = policy
        self.critic = critic
        self.config = policy.config

    @property
    def is_gradient_checkpointing(self) -> bool:
        # transformers ≥ 5.2x renamed the flag `is_activation_checkpointing`; older versions only have the old name.
        flag = getattr(self.policy, "is_activation_checkpointing", None)
        if flag is None:
            flag = getattr(self.policy, "is_gradient_checkpointing", False)
        return bool(flag)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        for model in (self.policy, self.critic):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)

    def gradient_checkpointing_disable(self) -> None:
        for model in (self.policy, self.critic):
            model.gradient_checkpointing_disable()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        context_length: int,
        temperature: float,
        compute_policy: bool = True,
        compute_entropy: bool = True,
        packed: PackedRow | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """
        Log-probabilities (and entropy) of the response tokens under the policy, and the critic's values.

        With `packed` (a padding-free micro-batch, [`~packing.PackedRow`]) the padded inputs are ignored.

        Returns:
            `(logprobs, entropy, values)`, each `[B, T]` for the `T` tokens after `context_length` (`[b, w]` of the
            packed row's responses); the first two are `None` when `compute_policy` is False (value-only updates leave
            the policy out of the graph).
        """
        if packed is not None:
            values = packed_value_forward(self.critic, packed)
            if not compute_policy:
                return None, None, values
            logprobs, entropy = packed_response_logprobs(self.policy, packed, temperature, compute_entropy)
            return logprobs, entropy, values
        position_ids = position_ids_from_mask(attention_mask)
        values = value_forward(self.critic, input_ids, attention_mask, position_ids, context_length)
        if not compute_policy:
            return None, None, values
        logprobs, entropy = policy_logprobs(
            self.policy, input_ids, attention_mask, context_length, temperature, compute_entropy, position_ids
        )
        return logprobs, entropy, values


def policy_logprobs(
    policy: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    context_length: int,
    temperature: float,
    compute_entropy: bool = False,
    position_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """
    Log-probabilities of the response tokens (after `context_length`), at the sampling temperature.

    The log-probability of response token `t` comes from the logits at position `context_length - 1 + t`. One backbone
    pass; the LM head is applied in vocabulary tiles, so the `[B, T, V]` logits are never materialised (see
    [`~logprobs.response_logprobs`]), and the prompt's logits are never computed.

    Returns:
        `(logprobs, entropy)`: `[B, T]` float32 tensors; `entropy` is `None` unless `compute_entropy`.
    """
    if position_ids is None:
        position_ids = position_ids_from_mask(attention_mask)
    return response_logprobs(
        policy, input_ids, attention_mask, position_ids, context_length, temperature, compute_entropy
    )


def token_rewards(
    scores: torch.Tensor,
    kl: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    whiten: bool = False,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """
    Per-token rewards: −kl_coef·KL on every token, plus the score on the last valid response token (never on a
    padding token after it: TRL ≤ 1.12 put it at the first PAD after EOS).

    Args:
        scores: `[B]` sequence scores (penalties included).
        kl: `[B, T]` per-token KL estimates (0 where masked).
        response_mask: `[B, T]` bool, right-padded.
        kl_coef: The KL penalty's coefficient.
        whiten: Scale the rewards to unit variance over the valid tokens, keeping their mean (`whiten_rewards`).
        all_reduce: Sum over processes for the whitening statistics (`None`: this process's alone).

    Returns:
        `[B, T]` rewards, 0 outside the mask.
    """
    mask = response_mask
    rewards = -kl_coef * kl
    lengths = mask.sum(dim=1)
    has_tokens = lengths > 0
    last = (lengths - 1).clamp(min=0)
    rows = torch.arange(mask.shape[0], device=mask.device)
    rewards[rows[has_tokens], last[has_tokens]] += scores[has_tokens]
    if whiten:
        rewards = masked_whiten(rewards, mask, shift_mean=False, all_reduce=all_reduce)
    return rewards * mask


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
    [`~micro_batches.plan_forwards`]).
    """
    device = next(reward_model.parameters()).device
    if max_tokens is None:
        lengths = torch.zeros(len(texts), dtype=torch.long)  # unused: `batch_size` texts at a time
    else:
        lengths = torch.tensor([len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]])
    rows = torch.arange(len(texts))
    (plan,) = plan_forwards([rows], lengths, torch.zeros_like(lengths), max_tokens, batch_size, 0, 0, max_across)
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

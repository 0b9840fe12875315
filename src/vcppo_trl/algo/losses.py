"""PPO losses and KL estimators: pure tensor functions over `[B, T]` response tokens.

How per-token losses become one scalar is the loss aggregation ([`aggregate_loss`], `loss_type`). Every mode is a
sum over valid tokens divided by a normaliser: the trainer computes the normaliser over a whole mini-batch (all
micro-batches, all processes) and passes it in, so that gradient accumulation and data parallelism give the same
gradient as one big batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from .masked import masked_mean

# The allowed values of each choice, written once: the configs annotate their fields with these types (the command
# line takes its choices from them) and every check tests against the tuples.
LossType = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
LOSS_TYPES: tuple[str, ...] = get_args(LossType)
KLEstimator = Literal["k1", "k3"]
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)
# How the sampler/training mismatch is corrected (TRL GRPO's `vllm_importance_sampling_mode` values).
ImportanceSamplingMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
IMPORTANCE_SAMPLING_MODES: tuple[str, ...] = get_args(ImportanceSamplingMode)


def _check_loss_type(loss_type: str) -> None:
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}.")


def loss_normalizer(
    mask: torch.Tensor, loss_type: LossType = "token_mean", max_length: int | None = None
) -> torch.Tensor:
    """
    The denominator of [`aggregate_loss`] for the sequences in `mask` (sum it over micro-batches and processes to get
    the normaliser of a whole mini-batch).

    - `"token_mean"`: the number of valid tokens.
    - `"seq_mean_token_mean"`, `"seq_mean_token_sum"`: the number of sequences with at least one valid token.
    - `"seq_mean_token_sum_norm"`: that number times `max_length` (a constant per sequence, Dr. GRPO).

    Args:
        mask (`torch.Tensor` of shape `[B, T]`): Valid response tokens.
        loss_type (`str`): One of `LOSS_TYPES`.
        max_length (`int`, *optional*): The constant token count of `"seq_mean_token_sum_norm"` (default: `T`).

    Returns:
        `torch.Tensor`: float32 scalar.
    """
    _check_loss_type(loss_type)
    mask = mask.bool()
    if loss_type == "token_mean":
        return mask.sum().float()
    sequences = mask.any(dim=1).sum().float()
    if loss_type == "seq_mean_token_sum_norm":
        return sequences * float(max_length if max_length is not None else mask.shape[1])
    return sequences


def aggregate_loss(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    loss_type: LossType = "token_mean",
    normalizer: torch.Tensor | float | None = None,
    max_length: int | None = None,
) -> torch.Tensor:
    r"""
    Reduce a `[B, T]` per-token loss to a scalar.

    - `"token_mean"`: Σ_{i,t} l_{i,t} / (number of valid tokens). Every token weighs the same; a long response weighs
      in proportion to its length (TRL ≤ 1.12's PPO, DAPO, VAPO).
    - `"seq_mean_token_mean"`: mean over sequences of each sequence's token mean. Every sequence weighs the same, so a
      token of a long response weighs less than one of a short response: long wrong answers are under-penalised and
      long right ones under-rewarded (the length bias Dr. GRPO, arXiv 2503.20783, points out in GRPO).
    - `"seq_mean_token_sum"`: mean over sequences of each sequence's token sum. Tokens weigh the same; the loss (and
      gradient) scale grows with the response length.
    - `"seq_mean_token_sum_norm"`: token sum divided by (sequences × `max_length`), a constant: tokens weigh the same
      and the scale does not depend on the lengths in the batch (Dr. GRPO's choice).

    Args:
        per_token (`torch.Tensor` of shape `[B, T]`): Loss of every token (padding may hold anything finite or not).
        mask (`torch.Tensor` of shape `[B, T]`): Valid response tokens.
        loss_type (`str`): One of `LOSS_TYPES`.
        normalizer (`torch.Tensor` or `float`, *optional*): The denominator; default [`loss_normalizer`] of this
            `mask` alone. Pass the sum over all micro-batches and processes of a mini-batch to get its true mean.
        max_length (`int`, *optional*): The constant of `"seq_mean_token_sum_norm"` (default: `T`).

    Returns:
        `torch.Tensor`: scalar (0 when nothing is valid).
    """
    _check_loss_type(loss_type)
    mask = mask.bool()
    per_token = torch.where(mask, per_token, torch.zeros((), dtype=per_token.dtype, device=per_token.device))
    if loss_type == "seq_mean_token_mean":
        numerator = (per_token.sum(dim=1) / mask.sum(dim=1).clamp(min=1)).sum()
    else:
        numerator = per_token.sum()
    if normalizer is None:
        normalizer = loss_normalizer(mask, loss_type, max_length)
    normalizer = torch.as_tensor(normalizer, dtype=numerator.dtype, device=numerator.device)
    # Normalisers count tokens or sequences (≥ 1 when anything is valid; with nothing valid the numerator is 0).
    return numerator / normalizer.clamp(min=1.0)


@dataclass
class PolicyLossOutput:
    """Clipped policy loss and the statistics TRL's PPO logged for it (all scalars, detached except `loss`)."""

    loss: torch.Tensor
    clipfrac: torch.Tensor  # tokens whose ratio was clipped (= clipfrac_low + clipfrac_high)
    approxkl: torch.Tensor
    ratio: torch.Tensor
    clipfrac_low: torch.Tensor | None = None  # ratio below 1 − ε_low with a negative advantage
    clipfrac_high: torch.Tensor | None = None  # ratio above 1 + ε_high with a positive advantage
    clipfrac_dual: torch.Tensor | None = None  # negative advantage, ratio above c (dual-clip bound); None when off
    # Over the responses with a token in `mask`: the least low-clipped fraction and the most high-clipped one (TRL
    # GRPO's `clip_ratio/low_min` and `clip_ratio/high_max`, per micro-batch); nan when no response has a token.
    clipfrac_low_min: torch.Tensor | None = None
    clipfrac_high_max: torch.Tensor | None = None


@dataclass
class ValueLossOutput:
    """Clipped value loss and its clip fraction (scalars, detached except `loss`)."""

    loss: torch.Tensor
    clipfrac: torch.Tensor


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cliprange: float,
    loss_type: LossType = "token_mean",
    normalizer: torch.Tensor | float | None = None,
    max_length: int | None = None,
    importance_weights: torch.Tensor | None = None,
    cliprange_high: float | None = None,
    dual_clip_c: float | None = None,
) -> PolicyLossOutput:
    r"""
    PPO's clipped surrogate, aggregated over valid tokens as `loss_type` says (see [`aggregate_loss`]).

    Per token, with r = π/π_old: `max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))`. A larger ε_high than ε_low
    ("clip-higher", DAPO arXiv 2503.14476, VAPO arXiv 2504.05118) lets the probability of an unlikely token with a
    positive advantage grow further in one update, which keeps the policy's entropy from collapsing. Dual-clip
    (Ye et al., arXiv 1912.09729; verl's `clip_ratio_c`) also bounds the loss of a negative-advantage token at
    `−c·A`: a token whose ratio is already far above 1 (r > c) is not pushed down without bound.

    Args:
        logprobs (`torch.Tensor` of shape `[B, T]`): Log-probabilities of the sampled tokens under the current policy.
        old_logprobs (`torch.Tensor` of shape `[B, T]`): The same under the policy that generated the rollout.
        advantages (`torch.Tensor` of shape `[B, T]`): Advantage of each token.
        mask (`torch.Tensor` of shape `[B, T]`): Valid response tokens.
        cliprange (`float`): ε_low, the lower clip bound `1 − ε_low` (and the upper one without `cliprange_high`).
        loss_type (`str`, defaults to `"token_mean"`): How token losses are reduced ([`aggregate_loss`]).
        normalizer (`torch.Tensor` or `float`, *optional*): Denominator of the reduction (default: from `mask`).
        max_length (`int`, *optional*): Constant of `"seq_mean_token_sum_norm"`.
        importance_weights (`torch.Tensor` of shape `[B, T]` or `[B, 1]`, *optional*): Detached weights of each
            token's loss: the sampler-mismatch correction ([`sampler_importance_weights`]).
        cliprange_high (`float`, *optional*): ε_high, the upper clip bound `1 + ε_high` (default: `cliprange`).
        dual_clip_c (`float`, *optional*): c > 1 of dual-clip: negative-advantage tokens lose at most `−c·A`.
            `None` turns it off.

    Returns:
        [`PolicyLossOutput`]; the statistics are token means over `mask` whatever the `loss_type`.
    """
    high = cliprange if cliprange_high is None else cliprange_high
    # Zeroed outside the mask before `exp`: a masked position's ratio could overflow, and although the aggregation
    # drops it from the forward, its backward would still be `0 · inf = NaN` and make the whole step non-finite.
    log_ratio = torch.where(
        mask.bool(), logprobs - old_logprobs, torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    )
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + high)
    per_token = torch.maximum(unclipped, clipped)
    if dual_clip_c is not None:
        per_token = torch.where(advantages < 0, torch.minimum(per_token, -advantages * dual_clip_c), per_token)
    if importance_weights is not None:
        per_token = per_token * importance_weights
    loss = aggregate_loss(per_token, mask, loss_type, normalizer=normalizer, max_length=max_length)
    with torch.no_grad():
        clipfrac = masked_mean((clipped > unclipped).float(), mask)
        approxkl = 0.5 * masked_mean(log_ratio**2, mask)
        mean_ratio = masked_mean(ratio, mask)
        low = ((ratio < 1.0 - cliprange) & (advantages < 0)).float()
        high_clipped = ((ratio > 1.0 + high) & (advantages > 0)).float()
        clipfrac_low = masked_mean(low, mask)
        clipfrac_high = masked_mean(high_clipped, mask)
        low_min, high_max = _response_fraction_extremes(low, high_clipped, mask)
        clipfrac_dual = None
        if dual_clip_c is not None:
            clipfrac_dual = masked_mean(((ratio > dual_clip_c) & (advantages < 0)).float(), mask)
    return PolicyLossOutput(
        loss,
        clipfrac,
        approxkl,
        ratio=mean_ratio,
        clipfrac_low=clipfrac_low,
        clipfrac_high=clipfrac_high,
        clipfrac_dual=clipfrac_dual,
        clipfrac_low_min=low_min,
        clipfrac_high_max=high_max,
    )


def _response_fraction_extremes(
    low: torch.Tensor, high: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest per-response fraction of `low` and the largest of `high` (`[B, T]` 0/1), over the responses with
    a token in `mask`; nan when there is none."""
    mask = mask.float()
    tokens = mask.sum(-1)
    rows = tokens > 0
    if not bool(rows.any()):
        nan = torch.tensor(float("nan"), device=low.device)
        return nan, nan
    low_frac = (low * mask).sum(-1)[rows] / tokens[rows]
    high_frac = (high * mask).sum(-1)[rows] / tokens[rows]
    return low_frac.min(), high_frac.max()


def token_mean_term(per_token: torch.Tensor, mask: torch.Tensor, normalizer: torch.Tensor | float) -> torch.Tensor:
    """
    `Σ per_token over mask / normalizer`: a token mean whose denominator is counted over the whole mini-batch (all
    micro-batches and processes), so the gradient does not depend on the split; 0 when nothing is in `mask`.

    The entropy bonus and the positive-example LM loss use it: both are token means whatever the `loss_type` (TRL
    GRPO's `entropy_coef`, VAPO's NLL term).
    """
    numerator = torch.where(mask.bool(), per_token, torch.zeros((), dtype=per_token.dtype, device=per_token.device))
    normalizer = torch.as_tensor(normalizer, dtype=per_token.dtype, device=per_token.device)
    return numerator.sum() / normalizer.clamp(min=1.0)


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float | None,
    loss_type: LossType = "token_mean",
    normalizer: torch.Tensor | float | None = None,
    max_length: int | None = None,
) -> ValueLossOutput:
    """
    PPO's clipped value loss, `0.5 · max((V − R)², (clip(V, V_old ± ε) − R)²)`, aggregated over valid tokens as
    `loss_type` says (see [`aggregate_loss`]). With `cliprange_value=None` it is the plain `0.5 · (V − R)²`.

    Args:
        values (`torch.Tensor` of shape `[B, T]`): Current critic predictions.
        old_values (`torch.Tensor` of shape `[B, T]`): Critic predictions at rollout time.
        returns (`torch.Tensor` of shape `[B, T]`): Regression targets.
        mask (`torch.Tensor` of shape `[B, T]`): Valid response tokens.
        cliprange_value (`float` or `None`): ε for clipping the new values around the old ones; `None` does not clip.
        loss_type (`str`, defaults to `"token_mean"`): How token losses are reduced ([`aggregate_loss`]).
        normalizer (`torch.Tensor` or `float`, *optional*): Denominator of the reduction (default: from `mask`).
        max_length (`int`, *optional*): Constant of `"seq_mean_token_sum_norm"`.

    Returns:
        [`ValueLossOutput`]; `clipfrac` is a token mean over `mask` (0 without clipping).
    """
    loss_unclipped = (values - returns) ** 2
    if cliprange_value is None:
        per_token = loss_unclipped
        clipfrac = torch.zeros((), device=values.device)
    else:
        clipped_values = torch.clamp(values, old_values - cliprange_value, old_values + cliprange_value)
        loss_clipped = (clipped_values - returns) ** 2
        per_token = torch.maximum(loss_unclipped, loss_clipped)
        with torch.no_grad():
            clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), mask)
    loss = 0.5 * aggregate_loss(per_token, mask, loss_type, normalizer=normalizer, max_length=max_length)
    return ValueLossOutput(loss=loss, clipfrac=clipfrac)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k1") -> torch.Tensor:
    """
    Per-token estimate of KL(π ‖ π_ref) from sampled-token log-probabilities (http://joschu.net/blog/kl-approx.html).

    Args:
        logprobs (`torch.Tensor`): log π(a_t | s_t) of the sampled tokens.
        ref_logprobs (`torch.Tensor`): log π_ref(a_t | s_t) of the same tokens.
        estimator (`str`): `"k1"` (log-ratio, unbiased) or `"k3"` ((r − 1) − log r, unbiased, lower variance).

    Returns:
        `torch.Tensor`: per-token KL estimates, same shape as the inputs.
    """
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {estimator!r}.")


def sampler_importance_weights(
    old_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: ImportanceSamplingMode = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> torch.Tensor:
    """
    Importance weights that correct for a sampler (vLLM) whose probabilities differ from the training forward's.

    The ratio is π_train(y) / π_sampler(y) of the sampled tokens, per token (`token_*`) or per sequence (`sequence_*`:
    the product over the response's tokens), then clipped to `[clip_min, clip_max]` (`*_truncate`, truncated IS) or
    set to 0 outside it (`*_mask`), as TRL's GRPO does with `vllm_importance_sampling_mode`.

    Args:
        old_logprobs (`torch.Tensor` of shape `[B, T]`): Training-forward log-probs of the sampled tokens (the PPO
            "old" log-probs).
        sampler_logprobs (`torch.Tensor` of shape `[B, T]`): The sampler's log-probs of the same tokens.
        mask (`torch.Tensor` of shape `[B, T]`): Valid response tokens.

    Returns:
        Detached weights, `[B, T]` for token modes and `[B, 1]` for sequence modes.
    """
    if mode not in IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"mode must be one of {IMPORTANCE_SAMPLING_MODES}, got {mode!r}.")
    with torch.no_grad():
        diff = ((old_logprobs.float() - sampler_logprobs.float()) * mask).nan_to_num(0.0)
        if mode.startswith("sequence"):
            diff = diff.sum(dim=1, keepdim=True)
        ratio = torch.exp(diff)
        if mode.endswith("truncate"):
            return torch.clamp(ratio, min=clip_min, max=clip_max)
        low = -float("inf") if clip_min is None else clip_min
        high = float("inf") if clip_max is None else clip_max
        return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)

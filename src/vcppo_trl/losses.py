"""PPO losses and KL estimators: pure tensor functions over `[B, T]` response tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .gae import masked_mean


@dataclass
class PolicyLossOutput:
    """Clipped policy loss and the statistics TRL's PPO logged for it (all scalars, detached except `loss`)."""

    loss: torch.Tensor
    clipfrac: torch.Tensor
    approxkl: torch.Tensor
    ratio: torch.Tensor


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
) -> PolicyLossOutput:
    """
    PPO's clipped surrogate, averaged over valid tokens.

    Args:
        logprobs (`torch.Tensor` of shape `[B, T]`): Log-probabilities of the sampled tokens under the current policy.
        old_logprobs (`torch.Tensor` of shape `[B, T]`): The same under the policy that generated the rollout.
        advantages (`torch.Tensor` of shape `[B, T]`): Advantage of each token.
        mask (`torch.Tensor` of shape `[B, T]`): Valid response tokens.
        cliprange (`float`): ε in clip(ratio, 1 − ε, 1 + ε).

    Returns:
        [`PolicyLossOutput`]
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    with torch.no_grad():
        clipfrac = masked_mean((clipped > unclipped).float(), mask)
        approxkl = 0.5 * masked_mean(log_ratio**2, mask)
        mean_ratio = masked_mean(ratio, mask)
    return PolicyLossOutput(loss=loss, clipfrac=clipfrac, approxkl=approxkl, ratio=mean_ratio)


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float,
) -> ValueLossOutput:
    """
    PPO's clipped value loss, `0.5 · max((V − R)², (clip(V, V_old ± ε) − R)²)`, averaged over valid tokens.

    Args:
        values (`torch.Tensor` of shape `[B, T]`): Current critic predictions.
        old_values (`torch.Tensor` of shape `[B, T]`): Critic predictions at rollout time.
        returns (`torch.Tensor` of shape `[B, T]`): Regression targets.
        mask (`torch.Tensor` of shape `[B, T]`): Valid response tokens.
        cliprange_value (`float`): ε for clipping the new values around the old ones.

    Returns:
        [`ValueLossOutput`]
    """
    clipped_values = torch.clamp(values, old_values - cliprange_value, old_values + cliprange_value)
    loss_unclipped = (values - returns) ** 2
    loss_clipped = (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(loss_unclipped, loss_clipped), mask)
    with torch.no_grad():
        clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), mask)
    return ValueLossOutput(loss=loss, clipfrac=clipfrac)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
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
    raise ValueError(f"kl_estimator must be 'k1' or 'k3', got {estimator!r}.")

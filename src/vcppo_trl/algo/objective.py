"""One micro-batch's PPO loss as a pure function of the model's outputs and the rollout's rows.

The seam TRL's GRPO calls `_compute_loss`: the trainer runs the forward, scales the backward for DDP/DeepSpeed and
steps the optimizer; what is optimised lives here, and can be tested without a model or processes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from .losses import (
    ImportanceSamplingMode,
    LossType,
    PolicyLossOutput,
    ValueLossOutput,
    aggregate_loss,
    clipped_policy_loss,
    clipped_value_loss,
    sampler_importance_weights,
    token_mean_term,
)
from .masked import masked_mean


@dataclass(frozen=True)
class PPOLossSettings:
    """The configuration values one update's losses use (the value clip range can change with the training phase)."""

    cliprange: float
    cliprange_value: float | None
    vf_coef: float
    loss_type: LossType = "token_mean"
    value_loss_type: LossType = "token_mean"
    max_length: int | None = None  # the constant of "seq_mean_token_sum_norm": the response length
    importance_sampling_mode: ImportanceSamplingMode = "sequence_mask"
    importance_sampling_clip_min: float | None = None
    importance_sampling_clip_max: float | None = 3.0
    cliprange_high: float | None = None  # ε_high of clip-higher; None: `cliprange`
    dual_clip_c: float | None = None  # c of dual-clip; None: off
    entropy_coef: float = 0.0  # − entropy_coef × token-mean entropy is added to the loss
    positive_example_lm_coef: float = 0.0  # μ × token-mean NLL of the correct responses is added to the loss
    # β of a KL loss term (TRL GRPO's beta, with advantage_estimator="grpo"): β × k3(π, π_ref) × ratio per token,
    # aggregated with the policy loss; 0: the KL, if any, is in the rewards instead.
    kl_loss_coef: float = 0.0

    @classmethod
    def from_args(cls, args: Any, cliprange_value: float | None) -> PPOLossSettings:
        """The settings of a [`PPOConfig`], with the value clip range of the current update."""
        return cls(
            cliprange=args.cliprange,
            cliprange_value=cliprange_value,
            vf_coef=args.vf_coef,
            loss_type=args.loss_type,
            value_loss_type=args.value_loss_type,
            max_length=args.response_length,
            importance_sampling_mode=args.vllm_importance_sampling_mode,
            importance_sampling_clip_min=args.vllm_importance_sampling_clip_min,
            importance_sampling_clip_max=args.vllm_importance_sampling_clip_max,
            cliprange_high=args.cliprange_high,
            dual_clip_c=args.dual_clip_c,
            entropy_coef=args.entropy_coef,
            positive_example_lm_coef=args.positive_example_lm_coef,
            kl_loss_coef=args.kl_coef if args.advantage_estimator == "grpo" else 0.0,
        )


@dataclass
class PPOBatch:
    """The rollout's tensors the PPO losses read, all `[B, T]`; [`select`] takes the rows of a micro-batch."""

    mask: torch.Tensor  # valid response tokens: the value loss's (and the policy's unless `policy_mask` is given)
    old_values: torch.Tensor | None  # the critic's values at rollout time (None: no critic)
    returns: torch.Tensor | None  # the critic's regression targets (None: no critic)
    advantages: torch.Tensor  # of the policy loss (whitened)
    old_logprobs: torch.Tensor | None = None  # of the policy that sampled the rollout; unused in value-only updates
    # The sampler's log-probs when another engine (vLLM) sampled the rollout: the policy loss is then weighted by
    # π_train/π_sampler ([`~algo.losses.sampler_importance_weights`]). None: no correction.
    sampler_logprobs: torch.Tensor | None = None
    # The policy loss's tokens when they differ from `mask` (`mask_truncated_completions` leaves out the responses
    # without a stop token); None: `mask`.
    policy_mask: torch.Tensor | None = None
    # Tokens of the positive-example LM loss (the policy's tokens of responses judged correct); None: no such loss.
    positive_mask: torch.Tensor | None = None
    # Tokens the sampler correction covers when they differ from `mask`: a generation window's, sampled by this
    # update's weights (a `sequence_*` weight is the product over them); None: `mask`.
    sampler_mask: torch.Tensor | None = None
    # The reference policy's log-probs when the KL is a loss term (`kl_loss_coef`, GRPO's beta); None: no such term.
    ref_logprobs: torch.Tensor | None = None

    def select(self, idx: torch.Tensor, width: int | None = None) -> PPOBatch:
        """The rows `idx`, and only the first `width` response columns (a micro-batch cut to its longest response:
        the columns left out are masked in every row)."""
        rows = {f.name: getattr(self, f.name) for f in fields(self)}
        cut = slice(None) if width is None else slice(0, width)
        return PPOBatch(**{name: None if t is None else t[idx][:, cut] for name, t in rows.items()})


@dataclass
class MicroBatchLoss:
    """What [`ppo_micro_batch_loss`] returns: the loss to backpropagate and its statistics."""

    loss: torch.Tensor  # vf_coef · value loss (+ policy loss)
    value: ValueLossOutput | None  # None without a critic
    vpred: torch.Tensor | None  # masked mean of the critic's predictions, detached
    policy: PolicyLossOutput | None = None  # None in a value-only update
    entropy: torch.Tensor | None = None  # masked mean of the policy's entropy, detached
    # π_old/π_sampler weights of the policy loss ([`~algo.losses.sampler_importance_weights`]), None without correction
    importance_weights: torch.Tensor | None = None

    # μ's term before μ: the token-mean NLL of the correct responses (this micro-batch's share of the mini-batch's
    # mean, as the losses), None when the term is off
    positive_example_lm: torch.Tensor | None = None
    # The KL loss term's per-token mean KL (k3, before β and the ratio), None when there is no such term
    kl: torch.Tensor | None = None

    def metrics(self) -> dict[str, torch.Tensor]:
        """The micro-batch's statistics under TRL's PPO metric names (the losses are summed per mini-batch); the
        ratio's low and high clip fractions under TRL GRPO's meaning (`clip_ratio/low_mean`, `clip_ratio/high_mean`)."""
        metrics = {} if self.value is None else {"val/clipfrac": self.value.clipfrac, "val/vpred": self.vpred}
        if self.kl is not None:
            metrics["policy/kl_loss_term"] = self.kl
        if self.policy is not None:
            metrics["policy/clipfrac"] = self.policy.clipfrac
            metrics["policy/clipfrac_low"] = self.policy.clipfrac_low
            metrics["policy/clipfrac_high"] = self.policy.clipfrac_high
            metrics["policy/clipfrac_low_min"] = self.policy.clipfrac_low_min
            metrics["policy/clipfrac_high_max"] = self.policy.clipfrac_high_max
            if self.policy.clipfrac_dual is not None:
                metrics["policy/clipfrac_dual"] = self.policy.clipfrac_dual
            metrics["policy/approxkl"] = self.policy.approxkl
            metrics["val/ratio"] = self.policy.ratio
            metrics["policy/entropy"] = self.entropy
        return metrics


def ppo_micro_batch_loss(
    settings: PPOLossSettings,
    batch: PPOBatch,
    logprobs: torch.Tensor | None,
    entropy: torch.Tensor | None,
    vpred: torch.Tensor | None,
    policy_normalizer: torch.Tensor | float,
    value_normalizer: torch.Tensor | float,
    policy_tokens: torch.Tensor | float | None = None,
    positive_tokens: torch.Tensor | float | None = None,
) -> MicroBatchLoss:
    """
    `vf_coef ×` clipped value loss plus clipped policy loss of one micro-batch, minus `entropy_coef ×` the token-mean
    entropy, plus `positive_example_lm_coef ×` the token-mean negative log-likelihood of the correct responses.

    The normalisers are those of the whole mini-batch ([`~algo.losses.loss_normalizer`] summed over its micro-batches and
    processes), so that the gradient does not depend on how the mini-batch is split.

    Args:
        settings ([`PPOLossSettings`]): Clip ranges, loss types, `vf_coef` and the importance-sampling settings.
        batch ([`PPOBatch`]): The rollout's rows of the micro-batch.
        logprobs, entropy (`torch.Tensor` of shape `[b, T]` or `None`): The policy's outputs; `None` in a value-only
            update (then the policy gets no loss).
        vpred (`torch.Tensor` of shape `[b, T]` or `None`): The critic's values (`None` without a critic: no value
            loss).
        policy_normalizer, value_normalizer: Denominators of the policy and value losses.
        policy_tokens: The policy's valid tokens in the mini-batch (the entropy bonus's denominator); default: this
            micro-batch's.
        positive_tokens: Tokens of correct responses in the mini-batch (the LM loss's denominator); default: this
            micro-batch's.
    """
    mask = batch.mask
    value = value_term(settings, batch, vpred=vpred, normalizer=value_normalizer)
    loss = torch.zeros((), device=mask.device) if value is None else settings.vf_coef * value.loss
    vpred_mean = None if vpred is None else masked_mean(vpred.detach(), mask)
    if logprobs is None:
        return MicroBatchLoss(loss=loss, value=value, vpred=vpred_mean)
    importance_weights = None
    if batch.sampler_logprobs is not None:
        importance_weights = sampler_importance_weights(
            batch.old_logprobs,
            batch.sampler_logprobs,
            mask if batch.sampler_mask is None else batch.sampler_mask,
            mode=settings.importance_sampling_mode,
            clip_min=settings.importance_sampling_clip_min,
            clip_max=settings.importance_sampling_clip_max,
        )
    policy_mask = mask if batch.policy_mask is None else batch.policy_mask
    policy = clipped_policy_loss(
        logprobs,
        batch.old_logprobs,
        batch.advantages,
        mask=policy_mask,
        cliprange=settings.cliprange,
        loss_type=settings.loss_type,
        normalizer=policy_normalizer,
        max_length=settings.max_length,
        importance_weights=importance_weights,
        cliprange_high=settings.cliprange_high,
        dual_clip_c=settings.dual_clip_c,
    )
    loss = loss + policy.loss
    kl = None
    if settings.kl_loss_coef and batch.ref_logprobs is not None:
        kl_term, kl = grpo_kl_term(
            logprobs,
            batch.old_logprobs,
            batch.ref_logprobs,
            mask=policy_mask,
            loss_type=settings.loss_type,
            normalizer=policy_normalizer,
            max_length=settings.max_length,
        )
        loss = loss + settings.kl_loss_coef * kl_term
    if settings.entropy_coef:
        tokens = policy_mask.sum() if policy_tokens is None else policy_tokens
        loss = loss - settings.entropy_coef * token_mean_term(entropy, policy_mask, tokens)
    positive_lm = None
    if settings.positive_example_lm_coef and batch.positive_mask is not None:
        positives = batch.positive_mask
        tokens = positives.sum() if positive_tokens is None else positive_tokens
        positive_lm = token_mean_term(-logprobs, positives, tokens)
        loss = loss + settings.positive_example_lm_coef * positive_lm
    return MicroBatchLoss(
        loss=loss,
        value=value,
        vpred=vpred_mean,
        policy=policy,
        entropy=masked_mean(entropy.detach(), policy_mask),
        importance_weights=importance_weights,
        positive_example_lm=None if positive_lm is None else positive_lm.detach(),
        kl=kl,
    )


def value_term(
    settings: PPOLossSettings, batch: PPOBatch, *, vpred: torch.Tensor | None, normalizer: torch.Tensor | float
) -> ValueLossOutput | None:
    """The clipped value loss of a micro-batch (before `vf_coef`), or `None` without a critic (`vpred` is `None`)."""
    if vpred is None:
        return None
    return clipped_value_loss(
        vpred,
        batch.old_values,
        batch.returns,
        mask=batch.mask,
        cliprange_value=settings.cliprange_value,
        loss_type=settings.value_loss_type,
        normalizer=normalizer,
        max_length=settings.max_length,
    )


def grpo_kl_term(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    *,
    mask: torch.Tensor,
    loss_type: LossType,
    normalizer: torch.Tensor | float,
    max_length: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    TRL GRPO's KL loss term before β: per token `k3 = exp(ref − logp) − (ref − logp) − 1` (≥ 0), times the policy
    ratio `exp(logp − old)` (TRL's default `use_bias_correction_kl=True`: the unbiased reverse-KL gradient), aggregated
    as the policy loss is (`loss_type`, `normalizer`).

    Returns:
        `(term, mean_kl)`: the term to add to the loss (× β), and the detached masked mean of `k3 × ratio` (what TRL
        GRPO logs as `kl`).
    """
    mask = mask.bool()
    delta = torch.where(mask, ref_logprobs - logprobs, 0.0)  # zero outside the mask before exp (no inf·0 = nan)
    per_token_kl = torch.exp(delta) - delta - 1
    ratio = torch.exp(torch.where(mask, logprobs - old_logprobs, 0.0))
    term = aggregate_loss(per_token_kl * ratio, mask, loss_type, normalizer=normalizer, max_length=max_length)
    return term, masked_mean((per_token_kl * ratio).detach(), mask)  # TRL logs it after the ratio


EXTREMES_OVER_RESPONSES = frozenset({"policy/clipfrac_low_min", "policy/clipfrac_high_max"})


def mean_metrics(stats: dict[str, list[torch.Tensor | float]]) -> dict[str, float]:
    """An update's metrics: the mean of each statistic over its micro-batches (or mini-batches, or steps)."""
    out = {}
    for k, v in stats.items():
        stacked = torch.stack([torch.as_tensor(x, dtype=torch.float32) for x in v])
        # A micro-batch with no response to take an extreme over has none (nan): left out of the mean.
        out[k] = float(stacked.nanmean() if k in EXTREMES_OVER_RESPONSES else stacked.mean())
    if len(stats.get("val/ratio", [])) > 1:  # TRL ≤ 1.12's val/ratio_var: variance of the micro-batch mean ratios
        out["val/ratio_var"] = float(torch.stack([torch.as_tensor(x).float() for x in stats["val/ratio"]]).var())
    return out

"""The metrics [`PPOTrainer`] logs per update about its rollout (the training side's: `trainer/learner_metrics.py`).

Pure functions of the update's tensors, the accelerator (every metric is over all processes) and the fields of the
config they read ([`MetricSettings`]), so that the trainer file keeps the training loop.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from accelerate import Accelerator
from transformers.utils import logging

from ..algo.diagnostics import (
    explained_variance,
    position_bucket_explained_variance,
    position_bucket_means,
    position_correlation,
    stop_advantage_gap,
    stop_positions,
)
from ..algo.gae import dual_lambda_gae
from ..algo.masked import masked_mean
from ..config.ppo import PPOConfig
from ..episodes import episode_metrics
from ..learner.ppo_learner import UpdateResult
from ..rewards import reward_log_metrics
from ..rollout.types import Rollout, is_correct
from .value_pretraining import CriticFit

logger = logging.get_logger(__name__)

# Value-only updates log their critic statistics under `value_pretrain/`.
PRETRAIN_METRIC_NAMES = {
    "loss/value": "value_pretrain/loss",
    "val/clipfrac": "value_pretrain/clipfrac",
    "val/vpred": "value_pretrain/vpred",
}


@dataclasses.dataclass(frozen=True)
class MetricSettings:
    """The fields of [`PPOConfig`] the update's metrics read (their meanings are the config's)."""

    accuracy_threshold: float
    kl_coef: float  # of the KL penalty in the rewards (0 when the KL is a loss term, as GRPO's)
    gamma: float
    response_length: int
    position_buckets: int
    num_mini_batches: int
    # How the sampler-mismatch weights are computed when the loss did not compute them.
    importance_sampling_mode: str
    importance_sampling_clip_min: float | None
    importance_sampling_clip_max: float | None
    num_generations: int = 1  # responses per prompt, in a row (TRL GRPO's `frac_reward_zero_std` reads the groups)

    @classmethod
    def from_args(cls, args: PPOConfig) -> MetricSettings:
        return cls(
            accuracy_threshold=args.accuracy_threshold,
            kl_coef=0.0 if args.advantage_estimator == "grpo" else args.kl_coef,  # GRPO's KL is a loss term
            gamma=args.gamma,
            response_length=args.response_length,
            position_buckets=args.position_buckets,
            num_mini_batches=args.num_mini_batches,
            importance_sampling_mode=args.vllm_importance_sampling_mode,
            importance_sampling_clip_min=args.vllm_importance_sampling_clip_min,
            importance_sampling_clip_max=args.vllm_importance_sampling_clip_max,
            num_generations=args.num_generations,
        )


@dataclasses.dataclass(frozen=True)
class UpdateRecord:
    """The last update as the trainer keeps it: its rollout (with the old log-probs it trained on), the raw advantages
    and returns it computed, and the learner's result (`None` when no sample could be scored and it did not train)."""

    rollout: Rollout
    advantages: torch.Tensor
    returns: torch.Tensor
    result: UpdateResult | None


def critic_fit(accelerator: Accelerator, update: UpdateRecord) -> CriticFit:
    """
    How well the critic fit an update's targets, over all processes, as the value-pretraining rule takes it: the
    update's mean value loss (the learner's `loss/value`, averaged over processes as the logged `_avg` is) and the
    explained variance of the rollout's values against `returns` over the whole batch (as `value/explained_variance`
    is logged: the critic's tokens, those of finished responses under generation windows). An update that did not
    train (`update.result` is `None`), or whose critic had no finished response to learn from, has a nan loss and a
    nan explained variance: the rule records no progress from it.
    """
    rollout, result = update.rollout, update.result
    values, returns_g, mask_g = gather_masked(accelerator, rollout.values, update.returns, rollout.value_mask.long())
    loss = math.nan
    if not int(accelerator.reduce(rollout.finished_rows.sum().reshape(1), "sum")):  # (a window that finished none)
        return CriticFit(loss=loss, explained_variance=math.nan)
    if result is not None and "loss/value" in result.stats:
        loss = mean_across(accelerator, torch.tensor([result.stats["loss/value"]], device=accelerator.device))
    return CriticFit(loss=loss, explained_variance=explained_variance(values, returns_g, mask_g.bool()))


def heldout_fit(accelerator: Accelerator, rollouts: list[Rollout], returns: list[torch.Tensor]) -> CriticFit:
    """
    How well the critic, as it is now, fits held-out rollouts it never trained on, over all processes: the mean of
    ½(V − R)² over their critic tokens (the unclipped value loss) and the explained variance of V against R.
    """
    values, targets, masks = [], [], []
    for rollout, ret in zip(rollouts, returns):
        v, r, m = gather_masked(accelerator, rollout.values, ret, rollout.value_mask.long())
        mask = m.bool()
        values.append(v[mask].float())
        targets.append(r[mask].float())
        masks.append(mask[mask])
    values, targets, mask = torch.cat(values), torch.cat(targets), torch.cat(masks)
    if not len(values):
        return CriticFit(loss=math.nan, explained_variance=math.nan)
    loss = float(0.5 * ((values - targets) ** 2).mean())
    return CriticFit(loss=loss, explained_variance=explained_variance(values, targets, mask))


def gather_masked(accelerator: Accelerator, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """Gather `[B, T]` tensors from every process (padded to a common T)."""
    out = []
    for t in tensors:
        t = accelerator.pad_across_processes(t, dim=1, pad_index=0)
        out.append(accelerator.gather(t))
    return out


def mean_across(accelerator: Accelerator, values: torch.Tensor) -> float:
    """Mean over all processes' values, nan left out (nan when nothing is left)."""
    gathered = accelerator.gather(values.float().reshape(-1))
    gathered = gathered[~torch.isnan(gathered)]
    return float(gathered.mean()) if gathered.numel() else float("nan")


def reduce_stats(accelerator: Accelerator, values: torch.Tensor) -> tuple[float, float, float]:
    """Mean, min and max of a 1-D tensor whose length differs between processes (nan when empty everywhere)."""
    values = values.detach().float().reshape(-1)
    device = accelerator.device
    inf = torch.tensor(float("inf"), device=device)
    total = torch.stack([values.sum(), torch.tensor(float(values.numel()), device=device)])
    low = values.min() if values.numel() else inf
    high = values.max() if values.numel() else -inf
    if accelerator.num_processes > 1:
        total = accelerator.reduce(total, "sum")
        low = -accelerator.reduce(-low.reshape(1), "max")[0]  # accelerate has no "min"
        high = accelerator.reduce(high.reshape(1), "max")[0]
    if float(total[1]) == 0:
        return float("nan"), float("nan"), float("nan")
    return float(total[0] / total[1]), float(low), float(high)


def _mean_or_nan(x: torch.Tensor) -> float:
    return float(x.mean()) if x.numel() else float("nan")


def rollout_metrics(
    accelerator: Accelerator,
    settings: MetricSettings,
    rollout: Rollout,
    advantages: torch.Tensor,
    returns: torch.Tensor | None,
    end_of_thinking_ids: list[int],
    reward_func_names: list[str],
    prefix: str = "",
    returns_are_monte_carlo: bool = False,
) -> dict[str, float]:
    """
    Batch-level metrics of a rollout, computed over all processes; with `prefix`, the `value/...` ones are renamed
    `<prefix>...` (value pretraining). `returns_are_monte_carlo`: the returns were computed with λ = 1 (then the
    per-position explained variance against Monte-Carlo returns uses them instead of computing them again).
    The advantage diagnostics read the raw `advantages` of the tokens the policy trains on (`Rollout.trained_tokens`); the
    value error and Monte-Carlo explained variance by position the critic's tokens (finished responses, `value_mask`).
    Without a critic (`rollout.values` and `returns` are `None`: a group advantage estimator) the critic's metrics
    are left out.
    """
    mask = rollout.action_tokens  # the policy's own tokens (tool and environment tokens are context)
    has_critic = rollout.values is not None
    values = returns_g = None
    if has_critic:
        values, returns_g = gather_masked(accelerator, rollout.values, returns)
    advantages_g, mask_g, kl_g, value_mask_g = gather_masked(
        accelerator, advantages, mask.long(), rollout.kl, rollout.value_mask.long()
    )
    mask_g, value_mask_g = mask_g.bool(), value_mask_g.bool()  # value_mask: finished responses (windows)
    # The advantage diagnostics read the tokens the policy trains on: under windows this window's only.
    trained_g = gather_masked(accelerator, rollout.trained_tokens.long())[0].bool()
    # Per-sample metrics count scored samples only: a skipped sample (no reward function applied) has no score,
    # and its response mask is empty. Under generation windows an unfinished response has no score either, and is
    # not skipped.
    scored = ~torch.isnan(rollout.raw_scores)
    raw = accelerator.gather(rollout.raw_scores)
    valid = ~torch.isnan(raw)
    finished_g = accelerator.gather(rollout.finished_rows.long()).bool()
    lengths = accelerator.gather(mask.sum(1).float())[valid]  # as TRL counts a completion: the model's tokens
    kl_per_sample = (kl_g * mask_g).sum(1)[valid]
    correct = is_correct(raw[valid], settings.accuracy_threshold).float()

    nan = torch.full_like(rollout.scores, float("nan"))
    metrics = {
        "objective/scores": mean_across(accelerator, torch.where(scored, rollout.scores, nan)),
        "objective/kl": _mean_or_nan(kl_per_sample),
        "objective/non_score_reward": _mean_or_nan(-settings.kl_coef * kl_per_sample),
        "diagnostics/response_length_mean": _mean_or_nan(lengths),
        "diagnostics/response_length_min": float(lengths.min()) if lengths.numel() else float("nan"),
        "diagnostics/response_length_max": float(lengths.max()) if lengths.numel() else float("nan"),
        "diagnostics/accuracy": _mean_or_nan(correct),
        "diagnostics/advantage_position_corr": position_correlation(advantages_g, trained_g),
        "diagnostics/stop_rate": mean_across(accelerator, torch.where(scored, rollout.has_stop.float(), nan)),
        "diagnostics/skipped_samples": float((~valid & finished_g).sum()),
        "reward/verifier_failures": float(accelerator.gather(rollout.reward_failed.float()).sum()),
    }
    metrics["objective/rlhf_reward"] = metrics["objective/scores"] + metrics["objective/non_score_reward"]
    if has_critic:
        metrics["value/explained_variance"] = explained_variance(values, returns_g, value_mask_g)
        metrics["value/mean"] = float(masked_mean(values, value_mask_g))
        metrics["value/returns_mean"] = float(masked_mean(returns_g, value_mask_g))
    # Outcomes (finished responses, all processes) per optimizer step. An outcome is in every PPO epoch's pass, so
    # this is per mini-batch: the update's finished responses / num_mini_batches (whole responses: the batch's share).
    metrics["rollout/outcomes_per_step"] = float(finished_g.sum()) / settings.num_mini_batches
    # Raw advantages (as the other advantage diagnostics) over the trained tokens, by finished and unfinished response
    # (all finished without windows); a group without a trained token is left out.
    for group, rows in (("finished", finished_g), ("unfinished", ~finished_g)):
        tokens = trained_g & rows.unsqueeze(1)
        if bool(tokens.any()):
            metrics[f"diagnostics/advantage_{group}_mean"] = float(masked_mean(advantages_g.double(), tokens))
    # The critic-bias signature that shortens responses: advantage of stopping to think minus continuing, by
    # absolute position (see vcppo_trl.diagnostics), over the trained tokens (a stop in an earlier window is not).
    stops = stop_positions(rollout.response_ids, mask, end_of_thinking_ids, has_stop=rollout.has_stop)
    num_stop_buckets = settings.position_buckets or 8
    stop_gap = stop_advantage_gap(
        advantages_g,
        trained_g,
        accelerator.gather(stops),
        num_buckets=num_stop_buckets,
        max_length=settings.response_length,
    )
    metrics["diagnostics/stop_advantage_gap"] = stop_gap.gap
    if settings.position_buckets > 0:
        for k in range(num_stop_buckets):
            metrics[f"diagnostics/stop_advantage_gap_bucket_{k}"] = float(stop_gap.bucket_gaps[k])
    if settings.position_buckets > 0:
        # The paper's Figure 2 per update: advantage (over the trained tokens, placed by their position in the
        # response so far) and value error (over the critic's tokens) by relative position in the response.
        num = settings.position_buckets
        adv_buckets = position_bucket_means(
            advantages_g, mask_g, num, tokens=None if trained_g is mask_g else trained_g
        )
        for k in range(num):
            metrics[f"diagnostics/advantage_bucket_{k}"] = float(adv_buckets[k])
    if settings.position_buckets > 0 and has_critic:
        num = settings.position_buckets
        err_buckets = position_bucket_means(values - returns_g, value_mask_g, num)
        for k in range(num):
            metrics[f"diagnostics/value_error_bucket_{k}"] = float(err_buckets[k])
        # Against Monte-Carlo returns (λ = 1), whatever λ the critic trains with: the paper's Figure 3.
        if returns_are_monte_carlo:
            mc_returns = returns_g
        else:
            if rollout.action_mask is None:
                rewards_g, response_g, action_g = gather_masked(accelerator, rollout.rewards)[0], mask_g, None
            else:  # over the policy's tokens, across tool blocks, as the critic's own targets
                rewards_g, response_g = gather_masked(accelerator, rollout.rewards, rollout.response_mask.long())
                response_g, action_g = response_g.bool(), mask_g
            mc_returns = dual_lambda_gae(
                rewards_g,
                values,
                response_g,
                gamma=settings.gamma,
                lam_actor=1.0,
                lam_critic=1.0,
                action_mask=action_g,
            )[1]
        # Finished responses only (value_mask: all without windows): an unfinished one's λ = 1 return is V(s_cut).
        mc_ev = position_bucket_explained_variance(values, mc_returns, value_mask_g, num_buckets=num)
        for k, ev in enumerate(mc_ev):
            metrics[f"diagnostics/mc_explained_variance_bucket_{k}"] = ev
    for i, name in enumerate(reward_func_names):
        metrics[f"rewards/{name}/mean"] = mean_across(accelerator, rollout.rewards_per_func[:, i])
    metrics.update(reward_log_metrics(accelerator, rollout.reward_metrics))  # TRL's `log_metric`, under its names
    if rollout.overlong_penalties is not None:  # the shaping term, apart from the correctness score
        penalties = torch.where(scored, rollout.overlong_penalties, nan)
        metrics["reward/overlong_penalty"] = mean_across(accelerator, penalties)
        metrics["reward/overlong_fraction"] = mean_across(
            accelerator, torch.where(scored, (penalties < 0).float(), nan)
        )
    if rollout.episode_counts is not None:  # tool episodes: the finished ones (under windows; else all)
        counts = {k: accelerator.gather(v)[finished_g] for k, v in rollout.episode_counts.items()}
        response_g, action_g = (
            m.bool()[finished_g]
            for m in gather_masked(accelerator, rollout.response_mask.long(), rollout.action_mask.long())
        )
        metrics.update(episode_metrics(counts, response_g, action_g))
    if rollout.token_staleness is not None:  # sampled by older weights (a rollout worker, a window's earlier tokens)
        metrics.update(staleness_metrics(accelerator, rollout))
    if not bool(finished_g.any()):
        # No response finished in this window: no score, length or critic fit to report (left out, not nan).
        metrics = {k: v for k, v in metrics.items() if not k.startswith(PER_FINISHED_RESPONSE_METRICS)}
    if prefix:
        metrics = {f"{prefix}{k.split('/', 1)[-1]}" if k.startswith("value/") else k: v for k, v in metrics.items()}
    return metrics


def staleness_metrics(accelerator: Accelerator, rollout: Rollout) -> dict[str, float]:
    """From the rollout's `token_staleness` tags, over all processes: `sample/token_staleness_mean` (the trained
    tokens' mean age in policy updates) and `sample/oldest_token_staleness_max` (the oldest policy token of any
    response, context of earlier windows included: a sample's age is its oldest token's)."""
    trained = rollout.trained_tokens
    sums = torch.stack([(rollout.token_staleness * trained).sum().double(), trained.sum().double()]).to(
        accelerator.device
    )
    oldest = rollout.sample_staleness.amax().reshape(1) if rollout.sample_staleness.numel() else torch.zeros(1)
    oldest = oldest.to(device=accelerator.device, dtype=torch.long)
    if accelerator.num_processes > 1:
        sums = accelerator.reduce(sums, "sum")
        oldest = accelerator.reduce(oldest, "max")
    total, count = sums.tolist()
    return {
        "sample/token_staleness_mean": total / count if count else float("nan"),
        "sample/oldest_token_staleness_max": float(oldest[0]),
    }


# Metrics of finished responses, which a generation window that finished none leaves out.
PER_FINISHED_RESPONSE_METRICS = (
    "objective/",
    "value/",
    "diagnostics/response_length",
    "diagnostics/accuracy",
    "diagnostics/stop_rate",
    "diagnostics/value_error_bucket",
    "diagnostics/mc_explained_variance_bucket",
    "rewards/",
    "reward/overlong",
    "tools/",
)

"""The metrics [`PPOTrainer`] logs per update: the rollout's, the sampler's, the PPO epochs' and TRL's old names.

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
from ..algo.dynamic_sampling import DynamicSamplingStats
from ..algo.gae import dual_lambda_gae
from ..algo.losses import sampler_importance_weights
from ..algo.masked import masked_mean
from ..algo.micro_batches import ForwardWork
from ..config.ppo import PPOConfig
from ..learner.ppo_learner import UpdateResult
from ..rollout import episode_metrics
from ..rollout.maker import GenerationStats, RolloutStats
from ..rollout.response_pool import WindowStep
from ..rollout.types import OverlapStats, Rollout, is_correct
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
    kl_coef: float
    gamma: float
    response_length: int
    position_buckets: int
    # How the sampler-mismatch weights are computed when the loss did not compute them.
    importance_sampling_mode: str
    importance_sampling_clip_min: float | None
    importance_sampling_clip_max: float | None

    @classmethod
    def from_args(cls, args: PPOConfig) -> MetricSettings:
        return cls(
            accuracy_threshold=args.accuracy_threshold,
            kl_coef=args.kl_coef,
            gamma=args.gamma,
            response_length=args.response_length,
            position_buckets=args.position_buckets,
            importance_sampling_mode=args.vllm_importance_sampling_mode,
            importance_sampling_clip_min=args.vllm_importance_sampling_clip_min,
            importance_sampling_clip_max=args.vllm_importance_sampling_clip_max,
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
    if rollout.finished is not None and not int(accelerator.reduce(rollout.finished.sum().reshape(1), "sum")):
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
    returns: torch.Tensor,
    end_of_thinking_ids: list[int],
    reward_func_names: list[str],
    prefix: str = "",
    returns_are_monte_carlo: bool = False,
) -> dict[str, float]:
    """
    Batch-level metrics of a rollout, computed over all processes; with `prefix`, the `value/...` ones are renamed
    `<prefix>...` (value pretraining). `returns_are_monte_carlo`: the returns were computed with λ = 1 (then the
    per-position explained variance against Monte-Carlo returns uses them instead of computing them again).
    """
    mask = rollout.action_tokens  # the policy's own tokens (tool and environment tokens are context)
    values, returns_g, advantages_g, mask_g, kl_g, value_mask_g = gather_masked(
        accelerator, rollout.values, returns, advantages, mask.long(), rollout.kl, rollout.value_mask.long()
    )
    mask_g, value_mask_g = mask_g.bool(), value_mask_g.bool()  # value_mask: finished responses (windows)
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
        "value/explained_variance": explained_variance(values, returns_g, value_mask_g),
        "value/mean": float(masked_mean(values, value_mask_g)),
        "value/returns_mean": float(masked_mean(returns_g, value_mask_g)),
        "diagnostics/response_length_mean": _mean_or_nan(lengths),
        "diagnostics/response_length_min": float(lengths.min()) if lengths.numel() else float("nan"),
        "diagnostics/response_length_max": float(lengths.max()) if lengths.numel() else float("nan"),
        "diagnostics/accuracy": _mean_or_nan(correct),
        "diagnostics/advantage_position_corr": position_correlation(advantages_g, mask_g),
        "diagnostics/stop_rate": mean_across(accelerator, torch.where(scored, rollout.has_stop.float(), nan)),
        "diagnostics/skipped_samples": float((~valid & finished_g).sum()),
        "reward/verifier_failures": float(accelerator.gather(rollout.reward_failed.float()).sum()),
    }
    metrics["objective/rlhf_reward"] = metrics["objective/scores"] + metrics["objective/non_score_reward"]
    # The critic-bias signature that shortens responses: advantage of stopping to think minus continuing, by
    # absolute position (see vcppo_trl.diagnostics).
    stops = stop_positions(rollout.response_ids, mask, end_of_thinking_ids, has_stop=rollout.has_stop)
    num_stop_buckets = settings.position_buckets or 8
    stop_gap = stop_advantage_gap(
        advantages_g,
        mask_g,
        accelerator.gather(stops),
        num_buckets=num_stop_buckets,
        max_length=settings.response_length,
    )
    metrics["diagnostics/stop_advantage_gap"] = stop_gap.gap
    if settings.position_buckets > 0:
        for k in range(num_stop_buckets):
            metrics[f"diagnostics/stop_advantage_gap_bucket_{k}"] = float(stop_gap.bucket_gaps[k])
    if settings.position_buckets > 0:
        # The paper's Figure 2 per update: advantage and value error by relative position in the response.
        num = settings.position_buckets
        adv_buckets = position_bucket_means(advantages_g, mask_g, num)
        err_buckets = position_bucket_means(values - returns_g, value_mask_g, num)
        for k in range(num):
            metrics[f"diagnostics/advantage_bucket_{k}"] = float(adv_buckets[k])
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
        for k, ev in enumerate(position_bucket_explained_variance(values, mc_returns, mask_g, num_buckets=num)):
            metrics[f"diagnostics/mc_explained_variance_bucket_{k}"] = ev
    for i, name in enumerate(reward_func_names):
        metrics[f"rewards/{name}/mean"] = mean_across(accelerator, rollout.rewards_per_func[:, i])
    if rollout.overlong_penalties is not None:  # the shaping term, apart from the correctness score
        penalties = torch.where(scored, rollout.overlong_penalties, nan)
        metrics["reward/overlong_penalty"] = mean_across(accelerator, penalties)
        metrics["reward/overlong_fraction"] = mean_across(
            accelerator, torch.where(scored, (penalties < 0).float(), nan)
        )
    if rollout.episode_counts is not None:  # tool episodes
        counts = {k: accelerator.gather(v) for k, v in rollout.episode_counts.items()}
        response_g, action_g = (
            m.bool() for m in gather_masked(accelerator, rollout.response_mask.long(), rollout.action_mask.long())
        )
        metrics.update(episode_metrics(counts, response_g, action_g))
    if rollout.finished is not None and not bool(finished_g.any()):
        # No response finished in this window: no score, length or critic fit to report (left out, not nan).
        metrics = {k: v for k, v in metrics.items() if not k.startswith(PER_FINISHED_RESPONSE_METRICS)}
    if prefix:
        metrics = {f"{prefix}{k.split('/', 1)[-1]}" if k.startswith("value/") else k: v for k, v in metrics.items()}
    return metrics


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
)


def window_metrics(accelerator: Accelerator, step: WindowStep) -> dict[str, float]:
    """
    A generation window over all processes: `rollout/finished_responses` (responses that finished and were
    scored), `rollout/window_tokens` (tokens sampled, the policy's), `rollout/prefilled_tokens` (earlier tokens of
    continued responses, run again as context), `rollout/in_flight` (responses carried to the next update) and
    `rollout/windows_per_finished_mean` (policy versions that sampled a finished response).
    """
    finished_windows = [w for w, done in zip(step.windows, step.finished) if done]
    counts = torch.tensor(
        [sum(step.finished), step.new_tokens, step.prefilled_tokens, step.in_flight, sum(finished_windows)],
        dtype=torch.float64,
        device=accelerator.device,
    )
    if accelerator.num_processes > 1:
        counts = accelerator.reduce(counts, "sum")
    finished, new, prefilled, in_flight, windows = counts.tolist()
    metrics = {
        "rollout/finished_responses": finished,
        "rollout/window_tokens": new,
        "rollout/prefilled_tokens": prefilled,
        "rollout/in_flight": in_flight,
    }
    if finished:
        metrics["rollout/windows_per_finished_mean"] = windows / finished
    return metrics


def overlap_metrics(accelerator: Accelerator, overlap: OverlapStats) -> dict[str, float]:
    """
    A rollout that a worker sampled ahead (`max_staleness`): `sampling/staleness_max` (policy updates between the
    weights that sampled the batch and those that train it, the most over processes), `time/sampler_wait_s` (the
    trainer idle, waiting for the samples), `time/sampler_idle_s` (the worker idle before it sampled them),
    `time/weight_push_s` (the last weight push) and `rollout/prefetched` (generations queued beyond this one).
    """
    values = torch.tensor(
        [overlap.staleness, overlap.wait_seconds, overlap.sampler_idle_seconds, overlap.push_seconds],
        dtype=torch.float64,
        device=accelerator.device,
    )
    if accelerator.num_processes > 1:
        values = accelerator.reduce(values, "max")
    staleness, wait, idle, push = values.tolist()
    return {
        "sampling/staleness_max": staleness,
        "time/sampler_wait_s": wait,
        "time/sampler_idle_s": idle,
        "time/weight_push_s": push,
        "rollout/prefetched": float(overlap.in_flight),
    }


def sampling_metrics(
    accelerator: Accelerator,
    settings: MetricSettings,
    rollout: Rollout,
    generation: GenerationStats,
    importance_weights: torch.Tensor | None = None,
) -> dict[str, float]:
    """
    Generation time and throughput of the update's rollout (`generation`, with the sampler's weight sync when it has
    one), and, when vLLM sampled, how far its log-probs are from the training forward's (TRL GRPO's `sampling/...`
    names): |Δ log p| over valid tokens, and the importance ratios the correction uses (per token, or per sequence in
    `sequence_*` modes; 0 where masked). `rollout.logprobs` must be the old log-probabilities of the update;
    `importance_weights` are the weights the loss used, when it used them (else they are computed here).
    """
    seconds, tokens, sync_seconds = generation.seconds, generation.tokens, generation.sync_seconds
    metrics = {"time/generation_s": seconds}
    total_tokens = accelerator.reduce(torch.tensor([float(tokens)], device=accelerator.device), "sum")
    slowest = accelerator.reduce(torch.tensor([seconds], device=accelerator.device), "max")
    metrics["time/generation_tokens_per_s"] = float(total_tokens) / max(float(slowest), 1e-9)
    if sync_seconds is not None:
        metrics["time/weight_sync_s"] = float(sync_seconds)
    if rollout.sampler_logprobs is None or rollout.logprobs is None:
        return metrics
    # A generation window's tokens: earlier windows were sampled by earlier weights (and corrected when trained).
    mask = rollout.action_tokens if rollout.window_mask is None else rollout.window_mask
    delta = (rollout.logprobs - rollout.sampler_logprobs).abs()[mask]
    mean, _, high = reduce_stats(accelerator, delta)
    if not math.isnan(mean):
        metrics["sampling/sampling_logp_difference/mean"] = mean
        metrics["sampling/sampling_logp_difference/max"] = high
    weights = importance_weights
    if weights is None:
        weights = sampler_importance_weights(
            rollout.logprobs,
            rollout.sampler_logprobs,
            mask,
            mode=settings.importance_sampling_mode,
            clip_min=settings.importance_sampling_clip_min,
            clip_max=settings.importance_sampling_clip_max,
        )
    flat = weights.flatten()[mask.any(1)] if weights.shape[1] == 1 else weights[mask]
    mean, low, high = reduce_stats(accelerator, flat)
    if not math.isnan(mean):
        metrics["sampling/importance_sampling_ratio/min"] = low
        metrics["sampling/importance_sampling_ratio/mean"] = mean
        metrics["sampling/importance_sampling_ratio/max"] = high
    if settings.importance_sampling_mode.endswith("_mask"):  # the share of tokens (or sequences) the bounds dropped
        masked, _, _ = reduce_stats(accelerator, (flat == 0).float())
        if not math.isnan(masked):
            metrics["sampling/importance_sampling_masked_fraction"] = masked
    return metrics


def update_metrics(accelerator: Accelerator, update_stats: dict[str, float], train_policy: bool) -> dict[str, float]:
    """
    The PPO epochs' statistics ([`~learner.ppo_learner.PPOLearner.update`]) as logged: averaged over processes under `<name>_avg`
    (`_var` ones keep their name), the critic's under `value_pretrain/` in value-only updates.
    """
    stats = dict(update_stats)
    metrics = {"diagnostics/nonfinite_steps": stats.pop("diagnostics/nonfinite_steps")}
    for name, value in stats.items():
        key = name if name.endswith("_var") else f"{name}_avg"
        if not train_policy and name in PRETRAIN_METRIC_NAMES:
            key = f"{PRETRAIN_METRIC_NAMES[name]}_avg"
        metrics[key] = mean_across(accelerator, torch.tensor([value], device=accelerator.device))
    return metrics


def learner_metrics(
    accelerator: Accelerator,
    settings: MetricSettings,
    rollout: Rollout,
    made: RolloutStats,
    result: UpdateResult,
    train_policy: bool,
    rollout_side: dict[str, float],
) -> dict[str, float]:
    """The metrics of an update after its PPO epochs: the sampler's ([`sampling_metrics`]), the epochs'
    ([`update_metrics`]), the forwards' work ([`work_metrics`]), the ranks' token balance and TRL's old names
    ([`trl_metric_names`]).
    `rollout.logprobs` must be the update's old log-probabilities; `rollout_side` the metrics logged before."""
    metrics = sampling_metrics(
        accelerator, settings, rollout, generation=made.generation, importance_weights=result.importance_weights
    )
    metrics.update(update_metrics(accelerator, result.stats, train_policy))
    metrics.update(work_metrics(accelerator, made.forwards, result.work))
    metrics.update(result.balance)  # perf/rank_token_imbalance(_before): the same on every process
    if made.dynamic_sampling is not None:
        metrics.update(dynamic_sampling_metrics(accelerator, made.dynamic_sampling))
    if made.window is not None:
        metrics.update(window_metrics(accelerator, made.window))
    if made.overlap is not None:
        metrics.update(overlap_metrics(accelerator, made.overlap))
    metrics.update(trl_metric_names(accelerator, rollout, rollout_side | metrics))
    return metrics


def dynamic_sampling_metrics(accelerator: Accelerator, stats: DynamicSamplingStats) -> dict[str, float]:
    """Dynamic sampling over all processes: `sampling/dynamic_rounds` (generation rounds, the same on every process),
    `sampling/dynamic_informative_fraction` (of the groups drawn, those with both correct and wrong samples) and
    `sampling/dynamic_filled_groups` (uninformative groups that completed the batch at the round limit)."""
    counts = torch.tensor(
        [stats.groups_drawn, stats.informative_groups, stats.filled_groups],
        dtype=torch.float64,
        device=accelerator.device,
    )
    if accelerator.num_processes > 1:
        counts = accelerator.reduce(counts, "sum")
    drawn, informative, filled = counts.tolist()
    return {
        "sampling/dynamic_rounds": float(stats.rounds),
        "sampling/dynamic_informative_fraction": informative / drawn if drawn else float("nan"),
        "sampling/dynamic_filled_groups": filled,
    }


def work_metrics(accelerator: Accelerator, rollout_forwards: ForwardWork, update: ForwardWork) -> dict[str, float]:
    """
    What the update's forwards computed, over all processes: `perf/{rollout_forward,update}_padding_fraction`
    (1 − real / computed tokens of the rollout's no-grad forwards and of the PPO epochs' forwards),
    `time/update_tokens_per_s` (real tokens through the PPO epochs' forward and backward, all processes, per second
    of the slowest), `perf/update_micro_batches` (per process) and, on CUDA, `perf/{rollout_forward,update}_peak_
    memory_gib` (peak allocated memory of the largest process).
    """
    counts = torch.tensor(
        [rollout_forwards.real_tokens, rollout_forwards.computed_tokens, update.real_tokens, update.computed_tokens],
        dtype=torch.float64,
        device=accelerator.device,
    )
    if accelerator.num_processes > 1:
        counts = accelerator.reduce(counts, "sum")
    slowest = float(accelerator.gather(torch.tensor([update.seconds], device=accelerator.device)).max())
    rollout_real, rollout_computed, update_real, update_computed = counts.tolist()
    metrics = {
        "perf/rollout_forward_padding_fraction": 1 - rollout_real / rollout_computed if rollout_computed else 0.0,
        "perf/update_padding_fraction": 1 - update_real / update_computed if update_computed else 0.0,
        "time/update_tokens_per_s": update_real / max(slowest, 1e-9),
        "perf/update_micro_batches": float(update.micro_batches),
    }
    for name, work in (("rollout_forward", rollout_forwards), ("update", update)):
        if work.peak_memory_bytes is not None:
            peak = torch.tensor([float(work.peak_memory_bytes)], device=accelerator.device)
            metrics[f"perf/{name}_peak_memory_gib"] = float(accelerator.gather(peak).max()) / 2**30
    return metrics


def trl_metric_names(accelerator: Accelerator, rollout: Rollout, metrics: dict[str, float]) -> dict[str, float]:
    """
    TRL ≤ 1.12's PPO metrics under their names: `val/ratio` (mean policy ratio), `val/num_eos_tokens` (responses
    that ended with the stop token, all processes), `objective/entropy` (Σ −log π of the sampled tokens per
    response, averaged over responses: TRL's sequence-level entropy estimate).
    """
    out = {"val/num_eos_tokens": float(accelerator.gather(rollout.has_stop.float()).sum())}
    if "val/ratio_avg" in metrics:
        out["val/ratio"] = metrics["val/ratio_avg"]
    if rollout.logprobs is not None:
        mask = rollout.action_tokens
        out["objective/entropy"] = mean_across(accelerator, (-rollout.logprobs * mask).sum(1)[mask.any(1)])
    return out

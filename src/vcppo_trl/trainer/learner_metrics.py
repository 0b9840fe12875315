"""The metrics of an update's training side, over all processes: the sampler's, the PPO epochs', the forwards'
work, dynamic sampling, what the rollout source reports of itself (`RolloutStats.reports`) and TRL's old names
([`learner_metrics`] puts them together). The rollout's own metrics are `trainer/metrics.py`'s."""

from __future__ import annotations

import math

import torch
from accelerate import Accelerator

from ..algo.dynamic_sampling import DynamicSamplingStats
from ..algo.losses import sampler_importance_weights
from ..algo.micro_batches import ForwardWork
from ..learner.ppo_learner import UpdateResult
from ..rollout.maker import GenerationStats, RolloutStats
from ..rollout.types import Rollout
from .grpo_metrics import grpo_learner_metrics, grpo_rollout_metrics
from .metrics import PRETRAIN_METRIC_NAMES, MetricSettings, mean_across, reduce_stats


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
    mask = rollout.trained_tokens
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


def epoch_metrics(accelerator: Accelerator, update_stats: dict[str, float], train_policy: bool) -> dict[str, float]:
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
    ([`epoch_metrics`]), the forwards' work ([`work_metrics`]), the ranks' token balance and TRL's old names
    ([`trl_metric_names`]), and TRL GRPO's names ([`~trainer.grpo_metrics`]).
    `rollout.logprobs` must be the update's old log-probabilities; `rollout_side` the metrics logged before."""
    metrics = sampling_metrics(
        accelerator, settings, rollout, generation=made.generation, importance_weights=result.importance_weights
    )
    metrics.update(epoch_metrics(accelerator, result.stats, train_policy))
    metrics.update(work_metrics(accelerator, made.forwards, result.work))
    metrics.update(result.balance)  # perf/rank_token_imbalance(_before): the same on every process
    if made.dynamic_sampling is not None:
        metrics.update(dynamic_sampling_metrics(accelerator, made.dynamic_sampling))
    for report in made.reports:  # the source's own (a window's step, an overlap's staleness): no mode named here
        metrics.update(report.metrics(accelerator))
    metrics.update(trl_metric_names(accelerator, rollout, rollout_side | metrics))
    metrics.update(grpo_learner_metrics(metrics))
    metrics.update(
        grpo_rollout_metrics(
            accelerator, rollout, num_generations=settings.num_generations, kl_in_rewards=settings.kl_coef != 0
        )
    )
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

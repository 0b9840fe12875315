"""TRL `GRPOTrainer`'s metric names, logged beside this package's so that a dashboard ported from GRPO shows the same
curves on the same scale (docs/migrating_from_grpo.md, "Metrics", maps every key).

Each is TRL 1.16's meaning, computed from the update's rollout over all processes, or this package's learner
statistic that is the same quantity under TRL's name. Where the meanings differ in a detail the page says so.
"""

from __future__ import annotations

import torch
from accelerate import Accelerator

from ..algo.masked import masked_mean
from ..rollout.types import Rollout

# TRL GRPO's name -> this package's learner statistic of the same quantity (averaged over micro-batches and processes).
LEARNER_ALIASES: dict[str, str] = {
    "entropy": "policy/entropy_avg",
    "clip_ratio/low_mean": "policy/clipfrac_low_avg",
    "clip_ratio/high_mean": "policy/clipfrac_high_avg",
    "clip_ratio/region_mean": "policy/clipfrac_avg",
    "clip_ratio/low_min": "policy/clipfrac_low_min_avg",
    "clip_ratio/high_max": "policy/clipfrac_high_max_avg",
}


def _nanstd(values: torch.Tensor) -> float:
    """Standard deviation with Bessel's correction, nan left out (TRL's `nanstd`); nan for fewer than 2 values."""
    values = values[~torch.isnan(values)].double()
    return float(values.std()) if values.numel() > 1 else float("nan")


def grpo_rollout_metrics(
    accelerator: Accelerator, rollout: Rollout, *, num_generations: int, kl_in_rewards: bool
) -> dict[str, float]:
    """
    TRL GRPO's rollout metrics of the finished responses, all processes:

    - `reward`, `reward_std`: mean and standard deviation (Bessel) of the weighted reward sum before penalties and
      shaping, over the scored responses;
    - `frac_reward_zero_std`: the fraction of responses whose prompt's group has rewards of standard deviation 0 (1
      when `num_generations` is 1, as TRL counts it); left out under generation windows (groups finish apart);
    - `completions/{mean,min,max}_length`: the policy's tokens per response; `completions/clipped_ratio`: the fraction
      that ran out of tokens without a stop token; `completions/{mean,min,max}_terminated_length` over those that
      stopped (0 when none did, as TRL);
    - `kl` (when the rewards carry a KL penalty): the per-token mean of the rollout's KL estimate (`kl_estimator`) over
      the policy's tokens. With `advantage_estimator="grpo"` the KL is a loss term and `kl` is the learner's
      ([`grpo_learner_metrics`]).
    """
    finished = accelerator.gather(rollout.finished_rows)
    raw = accelerator.gather(rollout.raw_scores)[finished]
    lengths = accelerator.gather(rollout.action_tokens.sum(1).float())[finished]
    stopped = accelerator.gather(rollout.has_stop)[finished]
    metrics: dict[str, float] = {}
    if not lengths.numel():
        return metrics
    scored = raw[~torch.isnan(raw)]
    metrics["reward"] = float(scored.mean()) if scored.numel() else float("nan")
    metrics["reward_std"] = _nanstd(raw)
    if rollout.responses_are_whole:
        if num_generations > 1 and raw.numel() % num_generations == 0:
            groups = raw.view(-1, num_generations)
            zero = torch.tensor([_nanstd(g) == 0.0 for g in groups], dtype=torch.float64)  # nan (one score): not zero
            metrics["frac_reward_zero_std"] = float(zero.mean())
        elif num_generations == 1:
            metrics["frac_reward_zero_std"] = 1.0
    metrics["completions/mean_length"] = float(lengths.mean())
    metrics["completions/min_length"] = float(lengths.min())
    metrics["completions/max_length"] = float(lengths.max())
    metrics["completions/clipped_ratio"] = float((~stopped).float().mean())
    terminated = lengths[stopped] if bool(stopped.any()) else torch.zeros(1)
    metrics["completions/mean_terminated_length"] = float(terminated.mean())
    metrics["completions/min_terminated_length"] = float(terminated.min())
    metrics["completions/max_terminated_length"] = float(terminated.max())
    if kl_in_rewards:
        kl, tokens = (accelerator.gather(t) for t in _padded_kl_and_tokens(accelerator, rollout))
        metrics["kl"] = float(masked_mean(kl, tokens)) if bool(tokens.any()) else float("nan")
    return metrics


def _padded_kl_and_tokens(accelerator: Accelerator, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
    """The rollout's per-token KL and the finished responses' policy tokens, padded to a width common to all
    processes (for a gather)."""
    tokens = rollout.action_tokens & rollout.finished_rows.unsqueeze(1)
    kl = accelerator.pad_across_processes(rollout.kl, dim=1, pad_index=0)
    tokens = accelerator.pad_across_processes(tokens.long(), dim=1, pad_index=0).bool()
    return kl, tokens


def grpo_learner_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """TRL GRPO's learner metrics from this package's logged ones ([`LEARNER_ALIASES`]), and `kl` as the KL loss
    term's mean `k3 × ratio` (TRL's) when there is one (`advantage_estimator="grpo"` with `beta` ≠ 0)."""
    out = {grpo: metrics[ours] for grpo, ours in LEARNER_ALIASES.items() if ours in metrics}
    if "policy/kl_loss_term_avg" in metrics:
        out["kl"] = metrics["policy/kl_loss_term_avg"]
    return out

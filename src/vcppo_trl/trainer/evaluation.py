"""Evaluation: accuracy, score and length on held-out prompts, and pass@k with k samples each.

It uses the generate-and-score path of training ([`~rollout.maker.RolloutMaker.sample_and_score`]), so a reward
function sees evaluation completions exactly as it sees training ones. The trainer's `evaluate` logs the result.
"""

from __future__ import annotations

import dataclasses

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from datasets import Dataset

from ..config.ppo import PPOConfig
from ..rollout.maker import RolloutMaker


@dataclasses.dataclass(frozen=True)
class EvaluationSettings:
    """The fields of [`PPOConfig`] evaluation reads (their meanings are the config's)."""

    num_generations: int  # `eval_num_generations`: 1 decodes greedily
    temperature: float  # `eval_temperature`, for k > 1
    accuracy_threshold: float
    prompts_per_chunk: int  # prompts generated together: `local_rollout_forward_batch_size` // k, at least 1

    @classmethod
    def from_args(cls, args: PPOConfig) -> EvaluationSettings:
        return cls(
            num_generations=args.eval_num_generations,
            temperature=args.eval_temperature,
            accuracy_threshold=args.accuracy_threshold,
            prompts_per_chunk=max(1, args.local_rollout_forward_batch_size // args.eval_num_generations),
        )


@torch.no_grad()
def evaluation_metrics(
    maker: RolloutMaker,
    dataset: Dataset,
    *,
    settings: EvaluationSettings,
    accelerator: Accelerator,
    trainer_state=None,
    metric_key_prefix: str = "eval",
) -> dict[str, float]:
    """
    Generate on held-out prompts (each process its share), score with the training reward functions, and gather.

    Greedy decoding when `settings.num_generations == 1` (`eval_num_generations`); otherwise `k` samples per prompt at `eval_temperature`,
    and `<prefix>_pass@k` (share of prompts with at least one correct sample).

    Returns:
        `<prefix>_accuracy`, `<prefix>_score`, `<prefix>_response_length_mean`, `<prefix>_num_samples` and, for
        k > 1, `<prefix>_pass@k`.
    """
    k = settings.num_generations
    rank, world = accelerator.process_index, accelerator.num_processes
    indices = list(range(rank, len(dataset), world))
    chunk = settings.prompts_per_chunk
    records = []  # (prompt index, correct, score, length)
    for start in range(0, len(indices), chunk):
        idx = indices[start : start + chunk]
        rows = [dataset[i] for i in idx for _ in range(k)]
        scored = maker.sample_and_score(
            rows, greedy=(k == 1), temperature=settings.temperature, trainer_state=trainer_state, num_generations=k
        )
        scores, valid = scored.raw_scores.nan_to_num(0.0), ~torch.isnan(scored.raw_scores)
        lengths = scored.samples.response_mask.sum(1)
        for j, i in enumerate(r for r in idx for _ in range(k)):
            if bool(valid[j]):
                correct = float(scores[j]) > settings.accuracy_threshold
                records.append((i, correct, float(scores[j]), int(lengths[j])))
    records = gather_object(records) if world > 1 else records
    metrics = {}
    if records:
        metrics[f"{metric_key_prefix}_accuracy"] = sum(r[1] for r in records) / len(records)
        metrics[f"{metric_key_prefix}_score"] = sum(r[2] for r in records) / len(records)
        metrics[f"{metric_key_prefix}_response_length_mean"] = sum(r[3] for r in records) / len(records)
        if k > 1:
            by_prompt: dict[int, bool] = {}
            for i, correct, _, _ in records:
                by_prompt[i] = by_prompt.get(i, False) or correct
            metrics[f"{metric_key_prefix}_pass@{k}"] = sum(by_prompt.values()) / len(by_prompt)
    metrics[f"{metric_key_prefix}_num_samples"] = float(len(records))
    return metrics

"""Scoring sampled responses: decode them into what reward functions receive, call every reward function (and reward
model) on them, and weigh their rewards into one raw score per sample ([`RewardScorer`]). No penalty is applied here:
raw scores are the correctness that training (with its penalties, `rollout/shaping.py`) and evaluation share.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator
from transformers import PreTrainedTokenizerBase

from ..parallel.collectives import max_across_processes
from ..rewards.calls import call_reward_function
from ..rewards.reward_logs import RewardLogs, scattered_columns
from ..rewards.reward_models import reward_model_scores
from ..sampling.seam import Samples
from .scoring import ScoredSamples, decode_completions, prompt_text
from .settings import RolloutSettings


def weighted_scores(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor) -> torch.Tensor:
    """`[B]` weighted sum of the functions' `[B, F]` rewards, nan where none applied."""
    weights = reward_weights.to(rewards_per_func.device)
    raw_scores = (rewards_per_func.nan_to_num(0.0) * weights).sum(dim=1)
    all_none = torch.isnan(rewards_per_func).all(dim=1)
    return torch.where(all_none, torch.full_like(raw_scores, float("nan")), raw_scores)


class RewardScorer:
    """
    Scores samples with the reward functions.

    Args:
        settings ([`~rollout.settings.RolloutSettings`]): What it reads of the config (reward timeouts, failure
            value and concurrency, reward models' batch size and token budget, the chat template's kwargs).
        accelerator: The trainer's accelerator (device; reward models' batches agree across processes).
        tokenizer: The policy's tokenizer (decoding, and the prompt as the policy read it for reward models).
        stop_token_ids: Ids that end a response (left out of the decoded completions).
        reward_funcs, reward_processing_classes: Reward functions and the tokenizers of reward models among them.
        reward_weights: `[F]` weight of each reward function.
    """

    def __init__(
        self,
        settings: RolloutSettings,
        accelerator: Accelerator,
        *,
        tokenizer: PreTrainedTokenizerBase,
        stop_token_ids: list[int],
        reward_funcs: list,
        reward_processing_classes: list,
        reward_weights: torch.Tensor,
    ):
        self.settings = settings
        self.accelerator = accelerator
        self.tokenizer = tokenizer
        self.stop_token_ids = stop_token_ids
        self.reward_funcs = reward_funcs
        self.reward_processing_classes = reward_processing_classes
        self.reward_weights = reward_weights

    def decode(self, rows: list[dict[str, Any]], samples: Samples) -> tuple[list[Any], list[str], list[list[int]]]:
        """[`~rollout.scoring.decode_completions`] of the samples: `(completions, texts, ids)`."""
        return decode_completions(
            rows,
            samples.response_ids,
            samples.response_mask,
            stop_token_ids=self.stop_token_ids,
            tokenizer=self.tokenizer,
        )

    def rewards(
        self,
        rows: list[dict[str, Any]],
        prompt_texts: list[str],
        completions: list[Any],
        completion_texts: list[str],
        completion_ids: list[list[int]],
        trainer_state=None,
    ) -> tuple[torch.Tensor, torch.Tensor, RewardLogs]:
        """
        Rewards of every function for every completion, and what the functions logged (TRL's `log_extra`,
        `log_metric`).

        A function's failures on single samples (raised, timed out, NaN) give those samples `reward_failure_value`
        (see [`~rewards.calls.call_reward_function`]); a function that fails on the whole batch stops the run.

        Returns:
            `(rewards, failed)`: `[B, F]` float32 rewards on device (`nan` where a function returned `None`), and
            `[B]` bool, true where at least one function failed on the sample; the [`~rewards.RewardLogs`].
        """
        prompts = [row["prompt"] for row in rows]
        extra = {key: [row[key] for row in rows] for key in rows[0] if key not in ("prompt", "completion")}
        columns, logs = [], RewardLogs()
        failed = [False] * len(rows)
        for func, proc in zip(self.reward_funcs, self.reward_processing_classes):
            if isinstance(func, torch.nn.Module):
                texts = [p + c for p, c in zip(prompt_texts, completion_texts)]
                values = reward_model_scores(
                    func,
                    proc,
                    texts,
                    batch_size=self.settings.reward_model_batch_size,
                    max_tokens=self.settings.forwards.max_tokens,
                    max_across=max_across_processes(self.accelerator),
                )
            else:
                result = call_reward_function(
                    func,
                    prompts,
                    completions,
                    completion_ids=completion_ids,
                    extra_columns=extra,
                    timeout=self.settings.reward_timeout,
                    failure_value=self.settings.reward_failure_value,
                    max_concurrency=self.settings.reward_max_concurrency,
                    trainer_state=trainer_state,
                    **logs.kwargs(),
                )
                values = result.values
                if result.failures:
                    failed = [f or value_failed for f, value_failed in zip(failed, result.failed)]
            columns.append([float("nan") if v is None else float(v) for v in values])
        device = self.accelerator.device
        rewards = torch.tensor(columns, dtype=torch.float32, device=device).T
        return rewards, torch.tensor(failed, dtype=torch.bool, device=device), logs

    def score_all(
        self,
        rows: list[dict[str, Any]],
        prompt_texts: list[str],
        query_ids: torch.Tensor,
        query_mask: torch.Tensor,
        samples: Samples,
        episodes: list[list[dict]] | None = None,
        trainer_state=None,
    ) -> ScoredSamples:
        """Decode and score every sample of a batch as it was sampled: `prompt_texts` as the sampler read them, and
        `episodes` (a tool episode's messages, as TRL gives them) in place of the decoded completions when given."""
        completions, texts, completion_ids = self.decode(rows, samples)
        completions = completions if episodes is None else episodes
        rewards_per_func, reward_failed, logs = self.rewards(
            rows,
            prompt_texts,
            completions,
            completion_texts=texts,
            completion_ids=completion_ids,
            trainer_state=trainer_state,
        )
        return ScoredSamples(
            query_ids,
            query_mask,
            samples,
            completions=completions,
            rewards_per_func=rewards_per_func,
            reward_failed=reward_failed,
            raw_scores=weighted_scores(rewards_per_func, self.reward_weights),
            logged_columns=logs.columns_for(len(rows)),
            logged_metrics=logs.metrics,
        )

    def score_where(
        self,
        rows: list[dict[str, Any]],
        query_ids: torch.Tensor,
        query_mask: torch.Tensor,
        samples: Samples,
        which: torch.Tensor,
        trainer_state=None,
        episodes: list[list[dict]] | None = None,
        prompt_texts: list[str] | None = None,
    ) -> ScoredSamples:
        """Decode every sample and score those in `which` (`[B]` bool); the others get nan rewards and scores.
        `episodes` (tool episodes' messages so far) stand in for the decoded completions when given, and
        `prompt_texts` for the prompts as the chat template renders them (with the tools' schemas)."""
        completions, texts, completion_ids = self.decode(rows, samples)
        completions = completions if episodes is None else episodes
        device = self.accelerator.device
        rewards_per_func = torch.full((len(rows), len(self.reward_funcs)), float("nan"), device=device)
        reward_failed = torch.zeros(len(rows), dtype=torch.bool, device=device)
        chosen = which.nonzero().flatten().tolist()
        logged_columns, logged_metrics = {}, {}
        if chosen:
            # Rendered here, for the chosen rows only: a reward model scores the prompt as the policy read it.
            chosen_prompts = [
                prompt_text(rows[i]["prompt"], self.tokenizer, self.settings.chat_template_kwargs)
                if prompt_texts is None
                else prompt_texts[i]
                for i in chosen
            ]
            rewards, failed, logs = self.rewards(
                [rows[i] for i in chosen],
                chosen_prompts,
                [completions[i] for i in chosen],
                completion_texts=[texts[i] for i in chosen],
                completion_ids=[completion_ids[i] for i in chosen],
                trainer_state=trainer_state,
            )
            rewards_per_func[chosen], reward_failed[chosen] = rewards, failed
            logged_columns = scattered_columns(logs.columns_for(len(chosen)), chosen, len(rows))
            logged_metrics = logs.metrics
        return ScoredSamples(
            query_ids,
            query_mask,
            samples,
            completions=completions,
            rewards_per_func=rewards_per_func,
            reward_failed=reward_failed,
            raw_scores=weighted_scores(rewards_per_func, self.reward_weights),
            logged_columns=logged_columns,
            logged_metrics=logged_metrics,
        )

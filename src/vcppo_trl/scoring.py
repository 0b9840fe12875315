"""From dataset rows to scored samples, the path training and evaluation share: the training prompt stream, chat
template and tokenisation, generation with the configured sampler, decoding, and the reward functions.

A mixin, like [`~trainer_saving.SavingMixin`], because these steps read the trainer's tokenizer, sampler, reward
functions and state; `make_rollout` and `evaluate` both start from [`sample_and_score`].
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase
from trl.data_utils import is_conversational, maybe_apply_chat_template

from .generation import Samples
from .reward_calls import call_reward_function
from .rollout import reward_model_scores


@dataclasses.dataclass
class ScoredSamples:
    """What [`PPOTrainer.sample_and_score`] returns: prompts as tokens, the samples, and their rewards."""

    query_ids: torch.Tensor  # [B, P] left-padded
    query_mask: torch.Tensor  # [B, P]
    samples: Samples
    completions: list[Any]  # what the reward functions received
    rewards_per_func: torch.Tensor  # [B, F], nan where a function returned None
    reward_failed: torch.Tensor  # [B] bool
    raw_scores: torch.Tensor  # [B] weighted sum of the functions, nan where none applied


def decode_completions(
    rows: list[dict[str, Any]],
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    stop_token_ids: list[int],
    tokenizer: PreTrainedTokenizerBase,
) -> tuple[list[Any], list[str], list[list[int]]]:
    """Decode responses (stop token excluded) into what reward functions receive: `(completions, texts, ids)`."""
    stop = torch.isin(response_ids, torch.tensor(stop_token_ids, device=response_ids.device))
    content_mask = response_mask & ~stop
    completion_ids = [ids[m].tolist() for ids, m in zip(response_ids, content_mask)]
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    if rows and is_conversational({"prompt": rows[0]["prompt"]}):
        completions = [[{"role": "assistant", "content": t}] for t in texts]
    else:
        completions = texts
    return completions, texts, completion_ids


class ScoringMixin:
    """Prompts in, scored samples out."""

    def _prompt_batches(self, start: int = 0) -> Iterator[list[dict[str, Any]]]:
        """
        Endless stream of this process's prompt batches, from batch number `start` on (for resuming).

        Each pass over the dataset is a permutation drawn from `seed + pass` (so a position is just a batch count);
        every update takes the next `prompts_per_update` prompts of it and process `r` the `r`-th slice of
        `local_prompts_per_update`, so processes never overlap; each prompt appears `num_generations` times in a row.
        The tail that does not fill a whole batch is left out of that pass.
        """
        per_update, local = self.prompts_per_update, self.local_prompts_per_update
        batches_per_pass = len(self.train_dataset) // per_update
        rank = self.accelerator.process_index
        batch = start
        while True:
            epoch, index = divmod(batch, batches_per_pass)
            generator = torch.Generator().manual_seed(self.args.seed + epoch)
            order = torch.randperm(len(self.train_dataset), generator=generator)
            first = index * per_update + rank * local
            rows = [self.train_dataset[int(i)] for i in order[first : first + local]]
            yield [row for row in rows for _ in range(self.args.num_generations)]
            batch += 1

    def _prompt_texts(self, rows: list[dict[str, Any]]) -> list[str]:
        return [maybe_apply_chat_template({"prompt": row["prompt"]}, self.processing_class)["prompt"] for row in rows]

    def _tokenize_prompts(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        encoded = self.processing_class(
            texts,
            return_tensors="pt",
            padding=True,
            padding_side="left",
            add_special_tokens=False,
            truncation=self.args.max_prompt_length is not None,
            truncation_side="left",
            max_length=self.args.max_prompt_length,
        )
        return encoded["input_ids"].to(self.accelerator.device), encoded["attention_mask"].to(self.accelerator.device)

    @torch.no_grad()
    def generate(
        self, query_ids: torch.Tensor, query_mask: torch.Tensor, greedy: bool = False, temperature: float | None = None
    ) -> Samples:
        """
        Sample responses for left-padded prompts and cut them at the stop token, with the configured sampler (HF
        `generate` or vLLM; see [`~generation`]).

        Returns:
            [`~generation.Samples`]: response ids, mask and `has_stop` as in [`~rollout.truncate_at_stop`], and the
            sampler's own log-probabilities when it reports them (vLLM).
        """
        samples = self.sampler.generate(query_ids, query_mask, greedy, temperature or self.args.temperature)
        self._generation_log.append((samples.seconds, samples.num_tokens))
        return samples

    def score(
        self,
        rows: list[dict[str, Any]],
        prompt_texts: list[str],
        completions: list[Any],
        completion_texts: list[str],
        completion_ids: list[list[int]],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """
        Rewards of every function for every completion.

        A function's failures on single samples (raised, timed out, NaN) give those samples `reward_failure_value`
        (see [`~reward_calls.call_reward_function`]); a function that fails on the whole batch stops the run.

        Returns:
            `(rewards, failed)`: `[B, F]` float32 rewards on device (`nan` where a function returned `None`), and
            `[B]` bool, true where at least one function failed on the sample.
        """
        prompts = [row["prompt"] for row in rows]
        extra = {key: [row[key] for row in rows] for key in rows[0] if key not in ("prompt", "completion")}
        columns = []
        failed = [False] * len(rows)
        for func, proc in zip(self.reward_funcs, self.reward_processing_classes):
            if isinstance(func, torch.nn.Module):
                texts = [p + c for p, c in zip(prompt_texts, completion_texts)]
                values = reward_model_scores(func, proc, texts, self.args.local_rollout_forward_batch_size)
            else:
                result = call_reward_function(
                    func,
                    prompts,
                    completions,
                    completion_ids,
                    extra,
                    timeout=self.args.reward_timeout,
                    failure_value=self.args.reward_failure_value,
                    trainer_state=self.state,
                )
                values = result.values
                if result.failures:
                    failed = [f or value_failed for f, value_failed in zip(failed, result.failed)]
            columns.append([float("nan") if v is None else float(v) for v in values])
        device = self.accelerator.device
        rewards = torch.tensor(columns, dtype=torch.float32, device=device).T
        return rewards, torch.tensor(failed, dtype=torch.bool, device=device)

    def sample_and_score(
        self, rows: list[dict[str, Any]], greedy: bool = False, temperature: float | None = None
    ) -> ScoredSamples:
        """
        The steps training and evaluation share: chat template and tokenization, generation with the configured
        sampler, decoding, and every reward function's score with their weighted sum (`raw_scores`, nan where no
        function scored the sample). No penalty is applied here.
        """
        prompt_texts = self._prompt_texts(rows)
        query_ids, query_mask = self._tokenize_prompts(prompt_texts)
        samples = self.generate(query_ids, query_mask, greedy=greedy, temperature=temperature)
        completions, texts, completion_ids = decode_completions(
            rows, samples.response_ids, samples.response_mask, self.stop_token_ids, self.processing_class
        )
        rewards_per_func, reward_failed = self.score(rows, prompt_texts, completions, texts, completion_ids)
        weights = self.reward_weights.to(rewards_per_func.device)
        raw_scores = (rewards_per_func.nan_to_num(0.0) * weights).sum(dim=1)
        all_none = torch.isnan(rewards_per_func).all(dim=1)
        raw_scores = torch.where(all_none, torch.full_like(raw_scores, float("nan")), raw_scores)
        return ScoredSamples(query_ids, query_mask, samples, completions, rewards_per_func, reward_failed, raw_scores)

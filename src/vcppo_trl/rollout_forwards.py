"""Making a rollout from scored samples: the no-grad forwards (old log-probabilities, values, reference
log-probabilities), the KL penalty, the per-token rewards, and the whitening both rewards and advantages use.

A mixin, like [`~trainer_saving.SavingMixin`], because the forwards run the trainer's wrapped models; generation and
scoring come from [`~scoring.ScoringMixin.sample_and_score`], the advantages from the trainer's `compute_advantages`.
"""

from __future__ import annotations

from typing import Any

import torch

from .generation import eval_mode
from .losses import kl_penalty
from .masked import masked_whiten
from .rollout import Rollout, policy_logprobs


class RolloutMixin:
    """One batch of prompts in, a [`~rollout.Rollout`] with everything the PPO epochs need out."""

    @torch.no_grad()
    def _forward_in_chunks(self, rollout: Rollout, compute_policy: bool):
        """Old log-probabilities and values of a rollout, in eval mode (no dropout), like generation."""
        model = self.accelerator.unwrap_model(self.model_wrapped)
        chunk = self.args.local_rollout_forward_batch_size
        input_ids, attention_mask = rollout.input_ids, rollout.attention_mask
        logprobs, values = [], []
        with eval_mode(model):
            for start in range(0, input_ids.shape[0], chunk):
                lp, _, v = model(
                    input_ids[start : start + chunk],
                    attention_mask[start : start + chunk],
                    rollout.context_length,
                    self.args.temperature,
                    compute_policy=compute_policy,
                    compute_entropy=False,
                )
                logprobs.append(lp)
                values.append(v)
        return (torch.cat(logprobs) if compute_policy else None), torch.cat(values)

    @torch.no_grad()
    def _ref_logprobs(self, rollout: Rollout) -> torch.Tensor:
        chunk = self.args.local_rollout_forward_batch_size
        input_ids, attention_mask = rollout.input_ids, rollout.attention_mask
        out = []
        for start in range(0, input_ids.shape[0], chunk):
            ids, mask = input_ids[start : start + chunk], attention_mask[start : start + chunk]
            if self.ref_model is not None:
                with eval_mode(self.ref_model):
                    lp, _ = policy_logprobs(self.ref_model, ids, mask, rollout.context_length, self.args.temperature)
            else:  # PEFT: the reference is the base model, adapters disabled.
                policy = self.accelerator.unwrap_model(self.model_wrapped).policy
                with policy.disable_adapter(), eval_mode(policy):
                    lp, _ = policy_logprobs(policy, ids, mask, rollout.context_length, self.args.temperature)
            out.append(lp)
        return torch.cat(out)

    def make_rollout(self, rows: list[dict[str, Any]], train_policy: bool = True) -> Rollout:
        """
        Generate, score and evaluate one batch of prompts.

        Args:
            rows: Dataset rows for this process.
            train_policy: When False (value-only updates) the policy does not move. The KL penalty then still
                enters the critic's targets when the reference is not the initial policy (a `ref_model` given by the
                user, or the base model of a PEFT policy whose adapter may not start at zero); only when the
                reference is a copy of the initial policy, where it is exactly 0, are the log-probabilities skipped.
        """
        args = self.args
        scored = self.sample_and_score(rows)
        samples, raw_scores, has_stop = scored.samples, scored.raw_scores, scored.samples.has_stop
        scores = raw_scores.nan_to_num(0.0).clone()
        if args.missing_eos_penalty is not None:
            scores = scores - args.missing_eos_penalty * (~has_stop).float()
        # A sample that no reward function could score is dropped from the losses.
        response_mask = samples.response_mask & ~torch.isnan(raw_scores).unsqueeze(1)

        rollout = Rollout(
            prompts=[row["prompt"] for row in rows],
            completions=scored.completions,
            extra_columns={k: [row[k] for row in rows] for k in rows[0] if k != "prompt"},
            query_ids=scored.query_ids,
            query_mask=scored.query_mask,
            response_ids=samples.response_ids,
            response_mask=response_mask,
            has_stop=has_stop,
            scores=scores,
            raw_scores=raw_scores,
            rewards_per_func=scored.rewards_per_func,
            reward_failed=scored.reward_failed,
            sampler_logprobs=samples.logprobs,
        )
        with_kl = args.kl_coef > 0 and (train_policy or not self.reference_is_initial_policy)
        # Under the on-policy shortcut ppo_update fills rollout.logprobs from its own forward.
        needs_old_logprobs = train_policy and not self.old_logprobs_from_training_forward()
        rollout.logprobs, rollout.values = self._forward_in_chunks(
            rollout, compute_policy=needs_old_logprobs or with_kl
        )
        if with_kl:
            rollout.ref_logprobs = self._ref_logprobs(rollout)
            rollout.kl = kl_penalty(rollout.logprobs, rollout.ref_logprobs, args.kl_estimator) * response_mask
        else:
            rollout.kl = torch.zeros_like(rollout.values)
        rollout.rewards = self.token_rewards(rollout)
        return rollout

    def old_logprobs_from_training_forward(self) -> bool:
        """
        Whether policy updates take their old log-probabilities from the training forward, detached (the on-policy
        shortcut, `on_policy_shortcut`), instead of a policy forward in the rollout.

        Exact only when the single optimizer step of the update sees the weights that sampled the rollout (one epoch,
        one mini-batch: its micro-batches all run before the step), no KL term needs the log-probabilities before the
        update, and dropout does not make the training forward differ from the rollout's eval-mode forward.
        """
        args = self.args
        return (
            args.on_policy_shortcut
            and args.num_ppo_epochs == 1
            and args.num_mini_batches == 1
            and args.kl_coef == 0
            and args.disable_dropout
        )

    def token_rewards(self, rollout: Rollout) -> torch.Tensor:
        """Per-token rewards: −kl_coef·KL on every token, plus the score on the last valid response token."""
        mask = rollout.response_mask
        rewards = -self.args.kl_coef * rollout.kl
        lengths = mask.sum(dim=1)
        has_tokens = lengths > 0
        last = (lengths - 1).clamp(min=0)
        rows = torch.arange(mask.shape[0], device=mask.device)
        rewards[rows[has_tokens], last[has_tokens]] += rollout.scores[has_tokens]
        if self.args.whiten_rewards:
            rewards = self.whiten(rewards, mask, shift_mean=False)
        return rewards * mask

    def whiten(self, values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
        """[`~masked.masked_whiten`] with the statistics `args.advantage_whitening` asks for (all processes, or this one)."""
        all_reduce = None
        if self.args.advantage_whitening == "global" and self.accelerator.num_processes > 1:
            all_reduce = lambda t: self.accelerator.reduce(t, "sum")  # noqa: E731
        return masked_whiten(values, mask, shift_mean=shift_mean, all_reduce=all_reduce)

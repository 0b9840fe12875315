"""What the learner reads of the config: a frozen view built from it ([`LearnerSettings.from_args`])."""

from __future__ import annotations

import dataclasses

from ..algo.advantages import get_advantage_estimator
from ..algo.logits_processing import NO_KNOBS, SamplingKnobs
from ..algo.objective import PPOLossSettings
from ..config.ppo import PPOConfig
from ..models.forward_engine import ForwardSettings


@dataclasses.dataclass(frozen=True)
class LearnerSettings:
    """The fields of [`PPOConfig`] the PPO epochs act on (their meanings are the config's)."""

    num_ppo_epochs: int
    shuffle_seed: int  # `seed`: the mini-batch order's own generator (see `ppo_learner.mini_batch_order`)
    # The micro-batch objective; its `cliprange_value` is the current update's (the trainer's `value_cliprange`).
    loss: PPOLossSettings
    temperature: float
    response_length: int
    advantage_whitening: str
    whiten_advantages: bool  # the advantage estimator's are whitened (GAE's), or used as they are (group baselines)
    window_whitening: str  # generation windows: the tokens of the whitening statistics ("all" or "finished")
    accuracy_threshold: float
    mask_truncated_completions: bool
    correct_sampler_mismatch: bool  # `vllm_importance_sampling_correction`
    ratio_against_sampler: bool  # `off_policy_ratio="behaviour"`: PPO's ratio against the sampler's log-probs
    max_grad_norm: float | None
    max_consecutive_nonfinite_steps: int | None
    output_dir: str  # where the error of too many non-finite steps looks for the latest checkpoint
    # The training forwards: by `max_tokens_per_micro_batch`, else `per_device_train_batch_size` sequences.
    forwards: ForwardSettings
    # What shapes the sampled distribution besides `temperature`: the learner's log-probs are taken under it.
    knobs: SamplingKnobs = NO_KNOBS

    @classmethod
    def from_args(cls, args: PPOConfig) -> LearnerSettings:
        return cls(
            num_ppo_epochs=args.num_ppo_epochs,
            shuffle_seed=args.seed,
            loss=PPOLossSettings.from_args(args, args.cliprange_value),
            temperature=args.temperature,
            response_length=args.response_length,
            advantage_whitening=args.advantage_whitening,
            whiten_advantages=get_advantage_estimator(args.advantage_estimator).whiten,
            window_whitening=args.window_whitening,
            accuracy_threshold=args.accuracy_threshold,
            mask_truncated_completions=args.mask_truncated_completions,
            correct_sampler_mismatch=args.vllm_importance_sampling_correction,
            ratio_against_sampler=args.off_policy_ratio == "behaviour",
            max_grad_norm=args.max_grad_norm,
            max_consecutive_nonfinite_steps=args.max_consecutive_nonfinite_steps,
            output_dir=args.output_dir,
            forwards=ForwardSettings(
                max_tokens=args.max_tokens_per_micro_batch,
                budget_field="max_tokens_per_micro_batch",
                sequences=args.per_device_train_batch_size,
                padding_free=args.padding_free,
            ),
            knobs=SamplingKnobs.from_args(args),
        )

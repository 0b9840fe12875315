"""What the rollout maker reads of the config: a frozen view built from it ([`RolloutSettings.from_args`])."""

from __future__ import annotations

import dataclasses

from ..algo.logits_processing import NO_KNOBS, SamplingKnobs
from ..config.ppo import PPOConfig
from ..models.forward_engine import ForwardSettings


def old_logprobs_from_training_forward(args: PPOConfig) -> bool:
    """
    Whether policy updates take their old log-probabilities from the training forward, detached (the on-policy
    shortcut, `on_policy_shortcut`), instead of a policy forward in the rollout.

    Exact only when the single optimizer step of the update sees the weights that sampled the rollout (one epoch,
    one mini-batch: its micro-batches all run before the step), no KL term nor V-trace (`critic_target_correction`)
    needs the log-probabilities before the update, the ratio is the old policy's (`off_policy_ratio="decoupled"`), and dropout does not make the training forward differ from the
    rollout's eval-mode forward.
    """
    return (
        args.on_policy_shortcut
        and args.num_ppo_epochs == 1
        and args.num_mini_batches == 1
        and args.kl_coef == 0
        and args.disable_dropout
        and args.critic_target_correction is None  # V-trace reads the current policy's log-probs before the update
        and args.off_policy_ratio == "decoupled"  # the ratio against the sampler's: the old ones only measure the gap
    )


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
    """The fields of [`PPOConfig`] the rollout maker acts on (their meanings are the config's)."""

    temperature: float
    response_length: int
    max_prompt_length: int | None
    num_generations: int
    # Rewards: calling the functions, the penalties added to their score, whitening.
    reward_timeout: float | None
    reward_failure_value: float
    reward_max_concurrency: int
    missing_eos_penalty: float | None
    overlong_buffer_length: int | None
    overlong_penalty_factor: float
    accuracy_threshold: float
    whiten_rewards: bool
    advantage_whitening: str
    # The KL penalty against the reference.
    kl_coef: float
    kl_estimator: str
    # Dynamic sampling (DAPO).
    dynamic_sampling: bool
    dynamic_sampling_max_rounds: int
    # The no-grad forwards: how they are cut, and whether the policy's is left to the PPO epochs.
    forwards: ForwardSettings
    reward_model_batch_size: int
    old_logprobs_from_training_forward: bool
    # What shapes the sampled distribution besides `temperature`: the old and reference log-probs are taken under it.
    knobs: SamplingKnobs = NO_KNOBS
    # How prompts become tokens: the chat template's keyword arguments, and the width multiple of every rollout tensor.
    chat_template_kwargs: dict | None = None
    pad_to_multiple_of: int | None = None

    @classmethod
    def from_args(cls, args: PPOConfig) -> RolloutSettings:
        return cls(
            temperature=args.temperature,
            response_length=args.response_length,
            max_prompt_length=args.max_prompt_length,
            num_generations=args.num_generations,
            reward_timeout=args.reward_timeout,
            reward_failure_value=args.reward_failure_value,
            reward_max_concurrency=args.reward_max_concurrency,
            missing_eos_penalty=args.missing_eos_penalty,
            overlong_buffer_length=args.overlong_buffer_length,
            overlong_penalty_factor=args.overlong_penalty_factor,
            accuracy_threshold=args.accuracy_threshold,
            whiten_rewards=args.whiten_rewards,
            advantage_whitening=args.advantage_whitening,
            kl_coef=args.kl_coef,
            kl_estimator=args.kl_estimator,
            dynamic_sampling=args.dynamic_sampling,
            dynamic_sampling_max_rounds=args.dynamic_sampling_max_rounds,
            forwards=ForwardSettings(
                max_tokens=args.max_tokens_per_forward,
                budget_field="max_tokens_per_forward",
                sequences=args.local_rollout_forward_batch_size,
                padding_free=args.padding_free,
            ),
            reward_model_batch_size=args.local_rollout_forward_batch_size,
            old_logprobs_from_training_forward=old_logprobs_from_training_forward(args),
            knobs=SamplingKnobs.from_args(args),
            chat_template_kwargs=args.chat_template_kwargs,
            pad_to_multiple_of=args.pad_to_multiple_of,
        )

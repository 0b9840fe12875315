"""An update's advantages: the rollout's tensors handed to the estimator the config names
([`~algo.advantages.get_advantage_estimator`]), with the responses' scores of every process when it reads them."""

from __future__ import annotations

import torch
from accelerate import Accelerator

from ..algo import AdvantageEstimator, AdvantageInputs, Advantages, LambdaLike, get_advantage_estimator
from ..config.ppo import PPOConfig
from ..rollout import Rollout, gae_bootstrap


def sequence_scores(rollout: Rollout) -> torch.Tensor:
    """`[B]` each response's training score (penalties included), `nan` where no reward function scored it."""
    return torch.where(torch.isnan(rollout.raw_scores), float("nan"), rollout.scores.float())


def compute_advantages(
    rollout: Rollout,
    args: PPOConfig,
    accelerator: Accelerator,
    *,
    lam_actor: LambdaLike,
    lam_critic: LambdaLike,
) -> Advantages:
    """
    The advantages (and the critic's targets, with a critic) of one rollout by `args.advantage_estimator`. An
    estimator that reads the responses' scores gets every process's (one all-gather of `[B]` floats, two with a KL):
    its batch statistics are the whole batch's, as in TRL.

    Args:
        rollout: This process's rollout.
        args: The run's config.
        accelerator: Gathers the scores across processes.
        lam_actor, lam_critic: GAE's λs of this update (the trainer's: `lam` in PPO, decoupled in VC-PPO).
    """
    estimator = get_advantage_estimator(args.advantage_estimator)
    return estimator.function(
        advantage_inputs(rollout, args, accelerator, estimator=estimator, lam_actor=lam_actor, lam_critic=lam_critic)
    )


def advantage_inputs(
    rollout: Rollout,
    args: PPOConfig,
    accelerator: Accelerator,
    *,
    estimator: AdvantageEstimator,
    lam_actor: LambdaLike,
    lam_critic: LambdaLike,
) -> AdvantageInputs:
    """The [`~algo.advantages.AdvantageInputs`] of a rollout (see [`compute_advantages`])."""
    scores = sequence_scores(rollout)
    kl_sums = None
    if args.kl_coef > 0 and rollout.kl is not None:
        kl_sums = (rollout.kl.float() * rollout.action_tokens).sum(dim=1)
    local = slice(0, scores.shape[0])
    if estimator.reads_scores and accelerator.num_processes > 1:
        start = accelerator.process_index * scores.shape[0]  # every process rolls out the same number of rows
        local = slice(start, start + scores.shape[0])
        scores = accelerator.gather(scores)
        kl_sums = None if kl_sums is None else accelerator.gather(kl_sums)
    return AdvantageInputs(
        rewards=rollout.rewards,
        values=rollout.values if estimator.uses_critic else None,
        response_mask=rollout.response_mask,
        action_mask=rollout.action_mask,
        scores=scores,
        kl_sums=kl_sums,
        local_rows=local,
        num_generations=args.num_generations,
        gamma=args.gamma,
        lam_actor=lam_actor,
        lam_critic=lam_critic,
        bootstrap_values=gae_bootstrap(rollout, args.window_bootstrap) if estimator.uses_critic else None,
        action_mask_mode=args.action_mask_mode,
        kl_coef=args.kl_coef,
        scale_rewards=args.scale_rewards,
        normalize_advantages=args.normalize_advantages,
    )

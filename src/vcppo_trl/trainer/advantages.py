"""An update's advantages: the rollout's tensors handed to the estimator the config names
([`~algo.advantages.get_advantage_estimator`]), with the responses' scores of every process when it reads them."""

from __future__ import annotations

import dataclasses

import torch
from accelerate import Accelerator

from ..algo import (
    AdvantageEstimator,
    AdvantageInputs,
    Advantages,
    LambdaLike,
    get_advantage_estimator,
    vtrace_returns,
)
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
    made = estimator.function(
        advantage_inputs(rollout, args, accelerator, estimator=estimator, lam_actor=lam_actor, lam_critic=lam_critic)
    )
    if args.critic_target_correction == "vtrace" and made.returns is not None:
        made = dataclasses.replace(made, returns=vtrace_critic_targets(rollout, args))
    return made


def vtrace_critic_targets(rollout: Rollout, args: PPOConfig) -> torch.Tensor:
    """The critic's V-trace targets ([`~algo.vtrace.vtrace_returns`]) over the policy's own tokens, with the log-ratio
    of the current policy (the old log-probs recomputed at consumption) to the one that sampled each token (the
    sampler's log-probs: vLLM's, or the rollout worker's under `max_staleness`), bootstrapped from a window's cut.
    Without the sampler's log-probs the sampler was the current policy itself (generate in this process, or stored
    rollouts of the frozen policy in value pretraining): the log-ratio is 0, and so it is without the current
    policy's (a value-only update, whose policy is the one that sampled)."""
    if rollout.sampler_logprobs is None or rollout.logprobs is None:
        log_ratio = torch.zeros_like(rollout.values, dtype=torch.float32)
    else:
        log_ratio = rollout.logprobs.float() - rollout.sampler_logprobs.float()
    return vtrace_returns(
        rewards=rollout.rewards,
        values=rollout.values,
        mask=rollout.action_tokens,
        log_ratio=log_ratio,
        gamma=args.gamma,
        rho_bar=args.vtrace_rho_bar,
        c_bar=args.vtrace_c_bar,
        bootstrap_values=gae_bootstrap(rollout, args.window_bootstrap),
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

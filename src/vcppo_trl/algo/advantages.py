"""Advantage estimators by name: GAE with a critic, and TRL's group baselines (GRPO, RLOO) without one.

An estimator is a pure function of one rollout's tensors ([`AdvantageInputs`]) that returns the policy's advantages
and, when it uses a critic, the critic's targets ([`Advantages`]). It is registered under a name
([`register_advantage_estimator`]) and picked by the config's `advantage_estimator`; the trainer never subclasses to
change it. Built in:

- `"gae"`: GAE with the critic, `λ_actor` for the advantages and `λ_critic` for the targets ([`~algo.gae.dual_lambda_gae`]:
  single-λ in `PPOTrainer`, where both are `lam`; decoupled in `VCPPOTrainer`; length-adaptive λ_actor in VAPO).
- `"grpo"`: TRL `GRPOTrainer`'s group-relative advantage (no critic): `r − mean` over a prompt's `num_generations`
  samples, divided by `std + 1e-4` as `scale_rewards` says.
- `"rloo"`: TRL `RLOOTrainer`'s leave-one-out baseline (no critic), with its `normalize_advantages`.

A sequence advantage goes to every policy token of its response (tool and environment tokens get 0).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal

import torch

from .gae import LambdaLike, dual_lambda_gae

ScaleRewards = Literal["group", "batch", "none"]
SCALE_REWARDS: tuple[str, ...] = ("group", "batch", "none")
# TRL GRPOConfig's boolean spellings of `scale_rewards` (`GRPOConfig.__post_init__`).
SCALE_REWARDS_ALIASES: dict[bool, str] = {True: "group", False: "none"}
GROUP_ESTIMATORS: tuple[str, ...] = ("grpo", "rloo")
# TRL's constant in both trainers' denominators (`std + 1e-4`).
STD_EPSILON = 1e-4


@dataclasses.dataclass(frozen=True)
class AdvantageInputs:
    """
    What an estimator reads of one rollout. Token tensors are this process's rows (`B` responses of `T` tokens,
    right-padded); the sequence tensors are the whole rollout batch of every process (`N` responses, this process's
    at `local_rows`), so that batch statistics and normalisation are global, as in TRL. A prompt's `num_generations`
    samples are consecutive rows of one process.

    Attributes:
        rewards: `[B, T]` per-token rewards: the score on the last response token, `−kl_coef·KL` on every token.
        values: `[B, T]` the critic's V(s_t) at rollout time, or `None` when the run has no critic.
        response_mask: `[B, T]` bool, the valid response tokens (tool and environment tokens included).
        action_mask: `[B, T]` bool, the policy's own tokens within `response_mask` (`None`: all of them).
        scores: `[N]` each response's score (reward functions' weighted sum with penalties), `nan` where no reward
            function scored it; every process's responses.
        kl_sums: `[N]` each response's summed per-token KL to the reference (every process's), or `None` without a
            KL penalty.
        local_rows: This process's rows of `scores` and `kl_sums`.
        num_generations: Samples per prompt (the group size).
        gamma, lam_actor, lam_critic: GAE's discount and λs (`lam_actor` may be one per response, `[B]`).
        bootstrap_values: `[B]` V after the last token of an unfinished response (generation windows), or `None`.
        action_mask_mode: How GAE crosses tool tokens ([`~algo.gae.dual_lambda_gae`]).
        kl_coef: The KL coefficient (β): RLOO takes `β × kl_sums` from the reward before its baseline.
        scale_rewards: GRPO's `"group"`, `"batch"` or `"none"`.
        normalize_advantages: RLOO's batch normalisation of its advantages.
    """

    rewards: torch.Tensor
    values: torch.Tensor | None
    response_mask: torch.Tensor
    scores: torch.Tensor
    local_rows: slice
    num_generations: int
    action_mask: torch.Tensor | None = None
    kl_sums: torch.Tensor | None = None
    gamma: float = 1.0
    lam_actor: LambdaLike = 1.0
    lam_critic: LambdaLike = 1.0
    bootstrap_values: torch.Tensor | None = None
    action_mask_mode: str = "skip"
    kl_coef: float = 0.0
    scale_rewards: ScaleRewards = "group"
    normalize_advantages: bool = False

    @property
    def action_tokens(self) -> torch.Tensor:
        """`[B, T]` bool: the policy's own response tokens."""
        return self.response_mask if self.action_mask is None else self.response_mask & self.action_mask.bool()


@dataclasses.dataclass(frozen=True)
class Advantages:
    """What an estimator returns: `advantages` `[B, T]` for the policy (0 outside the policy's tokens) and `returns`
    `[B, T]`, the critic's targets, or `None` for an estimator without a critic."""

    advantages: torch.Tensor
    returns: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class AdvantageEstimator:
    """A registered estimator: its function, whether it needs a critic (the values it reads, the targets it returns),
    and whether the learner whitens its advantages (GAE's are; TRL's group advantages are used as they are)."""

    name: str
    function: Callable[[AdvantageInputs], Advantages]
    uses_critic: bool
    whiten: bool
    # Whether it reads `scores`/`kl_sums` (gathered from every process each update): the group estimators do.
    reads_scores: bool


_REGISTRY: dict[str, AdvantageEstimator] = {}


def register_advantage_estimator(
    name: str, *, uses_critic: bool = True, whiten: bool | None = None, reads_scores: bool | None = None
) -> Callable[[Callable[[AdvantageInputs], Advantages]], Callable[[AdvantageInputs], Advantages]]:
    """
    Register an advantage estimator under `name`, for `advantage_estimator=name` in any trainer's config.

    The function takes one [`AdvantageInputs`] and returns [`Advantages`]: `advantages` `[B, T]` for this process's
    rows, 0 outside the policy's tokens (`inputs.action_tokens`), and `returns` `[B, T]` (the critic's targets) when
    `uses_critic`, else `None`. Register it before the config is built (at import of your module).

    Args:
        name: The name the config's `advantage_estimator` takes. A name already registered is refused.
        uses_critic: Whether it reads `inputs.values` and returns critic targets. `False`: the trainer builds, trains,
            saves and pushes no critic, and `inputs.values` is `None`.
        whiten: Whether the learner whitens the advantages (`advantage_whitening`'s statistics). Default:
            `uses_critic` (GAE's advantages are whitened; a group baseline's are used as they are, as in TRL).
        reads_scores: Whether it reads `inputs.scores` and `inputs.kl_sums` (every process's responses, gathered each
            update). Default: `not uses_critic`.

    Example:
    ```python
    import torch
    from vcppo_trl import register_advantage_estimator
    from vcppo_trl.algo import AdvantageInputs, Advantages


    @register_advantage_estimator("best_of_group", uses_critic=False)
    def best_of_group(inputs: AdvantageInputs) -> Advantages:
        # +1 for the best response of each prompt's group, 0 for the others, on every policy token.
        scores = inputs.scores.nan_to_num(float("-inf")).view(-1, inputs.num_generations)
        best = (scores == scores.max(dim=1, keepdim=True).values).float().view(-1)[inputs.local_rows]
        return Advantages(best.unsqueeze(1) * inputs.action_tokens)


    # then: VCPPOConfig(advantage_estimator="best_of_group", ...)
    ```
    """

    def register(function: Callable[[AdvantageInputs], Advantages]) -> Callable[[AdvantageInputs], Advantages]:
        if name in _REGISTRY:
            raise ValueError(f"An advantage estimator named {name!r} is already registered; pick another name.")
        _REGISTRY[name] = AdvantageEstimator(
            name=name,
            function=function,
            uses_critic=uses_critic,
            whiten=uses_critic if whiten is None else whiten,
            reads_scores=(not uses_critic) if reads_scores is None else reads_scores,
        )
        return function

    return register


def advantage_estimator_names() -> list[str]:
    """The registered names, built-in first."""
    return list(_REGISTRY)


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered under `name`; an unknown name is refused with the choices."""
    if name not in _REGISTRY:
        choices = ", ".join(repr(n) for n in _REGISTRY)
        raise ValueError(
            f"Unknown advantage_estimator {name!r}: choose one of {choices}, or register your own with "
            "vcppo_trl.register_advantage_estimator (before the config is built)."
        )
    return _REGISTRY[name]


def nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Standard deviation ignoring `nan`s, with Bessel's correction (`nan` with fewer than two numbers): the statistic
    TRL's GRPO and RLOO divide by, computed as `trl.trainer.utils.nanstd` does (`algo/` imports only torch)."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    variance = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=True)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(variance, float("nan")))
    std = torch.sqrt(variance * correction)
    return std.squeeze() if dim is None else std.squeeze(dim)


def group_advantages(
    scores: torch.Tensor,
    num_generations: int,
    *,
    estimator: Literal["grpo", "rloo"] = "grpo",
    scale_rewards: ScaleRewards | bool = "group",
    normalize: bool = False,
) -> torch.Tensor:
    """
    TRL 1.16's per-response advantages of a group baseline, from the responses' scores.

    - `"grpo"` (`GRPOTrainer`, `multi_objective_aggregation="sum_then_normalize"`): `r − mean(group)`, divided by
      `std + 1e-4` where `std` is the group's (`scale_rewards="group"` or `True`), the whole batch's (`"batch"`), or
      not divided (`"none"` or `False`).
    - `"rloo"` (`RLOOTrainer`): `r − mean(the group's other responses)`, then with `normalize` (TRL's
      `normalize_advantages`) `(a − mean) / (std + 1e-4)` over the batch.

    A response no reward function scored (`nan`) is left out of its group's statistics and gets advantage 0, as in
    TRL; so does every response of an RLOO group with a single scored response.

    Args:
        scores (`torch.Tensor` of shape `[N]`): Rewards, `nan` where unscored; each prompt's `num_generations`
            responses consecutive.
        num_generations (`int`): The group size (≥ 2).
        estimator: `"grpo"` or `"rloo"`.
        scale_rewards: GRPO's scaling (ignored by RLOO).
        normalize: RLOO's `normalize_advantages` (ignored by GRPO).

    Returns:
        `torch.Tensor` of shape `[N]`: the advantages.
    """
    if estimator not in GROUP_ESTIMATORS:
        raise ValueError(f"`estimator` must be one of {GROUP_ESTIMATORS}, got {estimator!r}.")
    if num_generations < 2:
        raise ValueError(f"A group baseline needs num_generations >= 2, got {num_generations}.")
    if scores.dim() != 1 or scores.numel() % num_generations:
        raise ValueError(
            f"`scores` must be 1-D with a multiple of num_generations ({num_generations}) entries, got shape "
            f"{tuple(scores.shape)}."
        )
    if isinstance(scale_rewards, bool):
        scale_rewards = SCALE_REWARDS_ALIASES[scale_rewards]
    groups = scores.view(-1, num_generations)
    if estimator == "grpo":
        mean = torch.nanmean(groups, dim=1).repeat_interleave(num_generations)
        advantages = scores - mean
        if scale_rewards == "group":
            advantages = advantages / (nanstd(groups, dim=1).repeat_interleave(num_generations) + STD_EPSILON)
        elif scale_rewards == "batch":
            std = nanstd(scores) if scores.numel() > 1 else torch.zeros((), dtype=scores.dtype, device=scores.device)
            advantages = advantages / (std + STD_EPSILON)
        elif scale_rewards != "none":
            raise ValueError(f"`scale_rewards` must be one of {SCALE_REWARDS} (or True/False), got {scale_rewards!r}.")
    else:
        scored = (~torch.isnan(groups)).sum(dim=1, keepdim=True)
        baselines = (torch.nansum(groups, dim=1, keepdim=True) - groups) / (scored - 1)
        advantages = scores - baselines.view(-1)
        if normalize:
            advantages = (advantages - torch.nanmean(advantages)) / (nanstd(advantages) + STD_EPSILON)
    return torch.nan_to_num(advantages, nan=0.0)


def sequence_to_tokens(per_response: torch.Tensor, action_tokens: torch.Tensor) -> torch.Tensor:
    """`[B]` advantages put on every policy token of their response: `[B, T]`, 0 elsewhere."""
    return per_response.to(torch.float32).unsqueeze(1) * action_tokens.to(torch.float32)


@register_advantage_estimator("gae", uses_critic=True)
def gae_advantages(inputs: AdvantageInputs) -> Advantages:
    """GAE with the critic: advantages with `lam_actor`, targets with `lam_critic` ([`~algo.gae.dual_lambda_gae`])."""
    if inputs.values is None:
        raise ValueError("advantage_estimator='gae' needs the critic's values; this run has no critic.")
    advantages, returns = dual_lambda_gae(
        inputs.rewards,
        inputs.values,
        inputs.response_mask,
        gamma=inputs.gamma,
        lam_actor=inputs.lam_actor,
        lam_critic=inputs.lam_critic,
        bootstrap_values=inputs.bootstrap_values,
        action_mask=inputs.action_mask,
        action_mask_mode=inputs.action_mask_mode,
    )
    return Advantages(advantages, returns)


@register_advantage_estimator("grpo", uses_critic=False)
def grpo_advantages(inputs: AdvantageInputs) -> Advantages:
    """TRL GRPO's group-relative advantage on every policy token ([`group_advantages`] with `scale_rewards`). The KL
    is not in the reward: with `kl_coef` > 0 it is a loss term, as GRPO's `beta`."""
    per_response = group_advantages(
        inputs.scores, inputs.num_generations, estimator="grpo", scale_rewards=inputs.scale_rewards
    )
    return Advantages(sequence_to_tokens(per_response[inputs.local_rows], inputs.action_tokens))


@register_advantage_estimator("rloo", uses_critic=False)
def rloo_advantages(inputs: AdvantageInputs) -> Advantages:
    """TRL RLOO's leave-one-out advantage on every policy token ([`group_advantages`] with `normalize_advantages`),
    the reward less `kl_coef ×` the response's summed KL, before the baseline (RLOO's β)."""
    scores = inputs.scores
    if inputs.kl_coef and inputs.kl_sums is not None:
        scores = scores - inputs.kl_coef * inputs.kl_sums
    per_response = group_advantages(
        scores, inputs.num_generations, estimator="rloo", normalize=inputs.normalize_advantages
    )
    return Advantages(sequence_to_tokens(per_response[inputs.local_rows], inputs.action_tokens))

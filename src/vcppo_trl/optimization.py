"""The optimizer and scheduler of [`PPOTrainer`]: one parameter group per model and weight-decay class, tagged with
its role, and one schedule clock per role. The steps themselves are the learner's ([`~learner.PPOLearner`]).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .config import PPOConfig
from .schedules import RoleLR, schedule_multiplier

ROLES = ("policy", "value")


class NonFiniteTrainingError(RuntimeError):
    """Too many optimizer steps in a row had a non-finite loss or gradient."""


def role_prefix(role: str) -> str:
    """Parameter-name prefix of each model inside [`~rollout.PolicyAndValueModel`]."""
    return {"policy": "policy.", "value": "critic."}[role]


def split_by_role(state_dict: dict[str, torch.Tensor], role: str) -> dict[str, torch.Tensor]:
    """The entries of a [`~rollout.PolicyAndValueModel`] state dict that belong to one role, prefix removed."""
    prefix = role_prefix(role)
    return {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}


def parameter_groups(
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]], decay_names: set[str], args: PPOConfig
) -> list[dict]:
    """
    Parameter groups for the optimizer: per role (policy at `learning_rate`, critic at `value_learning_rate`), those
    with weight decay and those without (`decay_names`), each tagged `role`. Frozen parameters are left out.
    """
    named = [(n, p) for n, p in named_parameters if p.requires_grad]
    groups = []
    for role, lr in (("policy", args.learning_rate), ("value", args.value_learning_rate)):
        mine = [(n, p) for n, p in named if n.startswith(role_prefix(role))]
        for use_decay in (True, False):
            params = [p for n, p in mine if (n in decay_names) == use_decay]
            if params:
                wd = args.weight_decay if use_decay else 0.0
                groups.append({"params": params, "weight_decay": wd, "lr": lr, "role": role})
    return groups


def role_scheduler(optimizer: torch.optim.Optimizer, args: PPOConfig, ppo_steps: int, pretrain_steps: int) -> RoleLR:
    """
    `lr_scheduler_type` with one clock per model ([`~schedules.RoleLR`]): the policy's schedule spans the `ppo_steps`
    optimizer steps and starts at the first of them; the critic's spans value pretraining and PPO.
    """
    multipliers = {
        "policy": schedule_multiplier(args, ppo_steps),
        "value": schedule_multiplier(args, ppo_steps + pretrain_steps),
    }
    starts = {"policy": None, "value": 0}  # the policy's clock starts at its first PPO update
    return RoleLR(optimizer, multipliers, starts)

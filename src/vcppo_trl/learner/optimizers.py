"""The optimizer and scheduler of [`PPOTrainer`]: one parameter group per model and weight-decay class, tagged with
its role, and one schedule clock per role. The steps themselves are the learner's ([`~learner.ppo_learner.PPOLearner`]).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .schedules import RoleLR, ScheduleSettings, schedule_multiplier

ROLES = ("policy", "value")


class NonFiniteTrainingError(RuntimeError):
    """Too many optimizer steps in a row had a non-finite loss or gradient."""


def role_prefix(role: str) -> str:
    """Parameter-name prefix of each model inside [`~models.policy_and_value.PolicyAndValueModel`]."""
    return {"policy": "policy.", "value": "critic."}[role]


def split_by_role(state_dict: dict[str, torch.Tensor], role: str) -> dict[str, torch.Tensor]:
    """The entries of a [`~models.policy_and_value.PolicyAndValueModel`] state dict that belong to one role, prefix removed."""
    prefix = role_prefix(role)
    return {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}


def parameter_groups(
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]],
    decay_names: set[str],
    *,
    learning_rate: float,
    value_learning_rate: float,
    weight_decay: float,
) -> list[dict]:
    """
    Parameter groups for the optimizer: per role (policy at `learning_rate`, critic at `value_learning_rate`), those
    with `weight_decay` and those without (`decay_names`), each tagged `role`. Frozen parameters are left out.
    """
    named = [(n, p) for n, p in named_parameters if p.requires_grad]
    groups = []
    for role, lr in (("policy", learning_rate), ("value", value_learning_rate)):
        mine = [(n, p) for n, p in named if n.startswith(role_prefix(role))]
        for use_decay in (True, False):
            params = [p for n, p in mine if (n in decay_names) == use_decay]
            if params:
                wd = weight_decay if use_decay else 0.0
                groups.append({"params": params, "weight_decay": wd, "lr": lr, "role": role})
    return groups


def role_scheduler(
    optimizer: torch.optim.Optimizer, settings: ScheduleSettings, *, ppo_steps: int, pretrain_steps: int
) -> RoleLR:
    """
    `settings.lr_scheduler_type` with one clock per model ([`~learner.schedules.RoleLR`]): both models' PPO
    schedules span the `ppo_steps` optimizer steps and start at the first of them; the critic has its own schedule over
    value pretraining's `pretrain_steps` before it (when there are any).
    """
    ppo = schedule_multiplier(settings, ppo_steps)
    pretrain = {"value": schedule_multiplier(settings, pretrain_steps)} if pretrain_steps > 0 else {}
    starts = {"policy": None, "value": 0 if pretrain else None}  # the PPO clocks start at the first PPO update
    # The critic's one clock over both phases, for a checkpoint saved before the phases had their own schedules.
    single_clock = {"value": schedule_multiplier(settings, ppo_steps + pretrain_steps)}
    return RoleLR(
        optimizer,
        {"policy": ppo, "value": ppo},
        starts,
        pretrain_multipliers=pretrain,
        single_clock_multipliers=single_clock,
    )


def _role_optimizer_states(optimizer: torch.optim.Optimizer, role: str) -> tuple[torch.optim.Optimizer, list]:
    """
    The optimizer that holds the per-tensor states (Adam's step and moments) and the state keys of `role`'s
    parameter groups: the parameters themselves for a torch optimizer, the flat fp32 partitions under DeepSpeed ZeRO
    (one per group and rank with ZeRO-1/2, one per sub-group with ZeRO-3).
    """
    from accelerate.optimizer import AcceleratedOptimizer

    while isinstance(optimizer, AcceleratedOptimizer):
        optimizer = optimizer.optimizer
    if hasattr(optimizer, "fp32_partitioned_groups_flat") and hasattr(optimizer, "sub_group_to_group_id"):  # ZeRO-3
        inner = optimizer.optimizer
        groups = {i for i, group in enumerate(inner.param_groups) if group.get("role") == role}
        keys = [
            optimizer.fp32_partitioned_groups_flat[sub]
            for sub, group in optimizer.sub_group_to_group_id.items()
            if group in groups
        ]
        return inner, keys
    if hasattr(optimizer, "single_partition_of_fp32_groups"):  # ZeRO-1/2
        inner = optimizer.optimizer
        keys = [
            optimizer.single_partition_of_fp32_groups[i]
            for i, group in enumerate(inner.param_groups)
            if group.get("role") == role
        ]
        return inner, keys
    keys = [p for group in optimizer.param_groups if group.get("role") == role for p in group["params"]]
    return optimizer, keys


def optimizer_state_summary(optimizer: torch.optim.Optimizer, role: str) -> dict[str, float]:
    """
    How far `role`'s optimizer state has advanced on this process: the largest step count, and the summed absolute
    values of the other state tensors (Adam's moments). All zero for a fresh optimizer.
    """
    inner, keys = _role_optimizer_states(optimizer, role)
    steps, moments, tensors = 0.0, 0.0, 0
    for key in keys:
        for name, value in inner.state.get(key, {}).items():
            tensors += 1
            if name == "step":
                steps = max(steps, float(value))
            elif torch.is_tensor(value):
                moments += float(value.detach().float().abs().sum())
    for group in inner.param_groups:  # optimizers that count steps per group (e.g. FusedAdam)
        if group.get("role") == role and "step" in group:
            steps = max(steps, float(group["step"]))
    return {"steps": steps, "moments": moments, "state_tensors": float(tensors)}


def reset_optimizer_state(optimizer: torch.optim.Optimizer, role: str) -> None:
    """
    Forget `role`'s optimizer state (step counts and moments), so that its next step is the first of a fresh optimizer.

    Value pretraining needs it under DeepSpeed: ZeRO hands the frozen policy's partitions zero gradients, so Adam's
    step count advances (and its moments decay to zero) through pretraining, and the first PPO step would use the bias
    correction of step N + 1 with moments built from one gradient (up to ≈ 3× Adam's usual first step). Without
    DeepSpeed the frozen policy gets no gradient and no state; after this both paths start PPO alike.
    """
    inner, keys = _role_optimizer_states(optimizer, role)
    for key in keys:
        inner.state.pop(key, None)
    for group in inner.param_groups:
        if group.get("role") == role:
            group.pop("step", None)

"""The trainer's optimizer and learning-rate schedule: one AdamW (or `args.optim`) with a parameter group per model,
and one schedule clock per model ([`~learner.optimizers.role_scheduler`]). Built for [`PPOTrainer`]'s
`create_optimizer` / `create_scheduler`, which transformers' `Trainer` calls."""

from __future__ import annotations

import torch

from ..config.ppo import PPOConfig
from ..learner.optimizers import parameter_groups, role_scheduler
from ..learner.schedules import ScheduleSettings


def build_optimizer(trainer, wrapper: torch.nn.Module, args: PPOConfig) -> torch.optim.Optimizer:
    """AdamW (or `args.optim`, as transformers resolves it) over `wrapper`'s parameters: the policy's group at
    `learning_rate`, the critic's at `value_learning_rate`, weight decay where transformers applies it."""
    decay = set(trainer.get_decay_parameter_names(wrapper))
    optimizer_cls, optimizer_kwargs = trainer.get_optimizer_cls_and_kwargs(args, wrapper)
    optimizer_kwargs.pop("lr", None)
    groups = parameter_groups(
        wrapper.named_parameters(),
        decay,
        learning_rate=args.learning_rate,
        value_learning_rate=args.value_learning_rate,
        weight_decay=args.weight_decay,
    )
    return optimizer_cls(groups, lr=args.learning_rate, **optimizer_kwargs)


def build_scheduler(
    optimizer: torch.optim.Optimizer, args: PPOConfig, *, ppo_steps: int, pretrain_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """`lr_scheduler_type` with one clock per model and phase: the critic's over value pretraining's `pretrain_steps`
    optimizer steps, then the policy's and the critic's over the `ppo_steps` after them."""
    return role_scheduler(
        optimizer, ScheduleSettings.from_args(args), ppo_steps=ppo_steps, pretrain_steps=pretrain_steps
    )

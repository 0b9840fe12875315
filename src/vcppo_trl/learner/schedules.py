"""Learning-rate schedules with one clock per model: the policy's starts at its first PPO update.

transformers' schedulers apply one multiplier, counted from the first optimizer step, to every parameter group. With
value pretraining that is wrong for the policy: its warmup would be spent while it is frozen and its decay would count
updates in which it does not move. [`RoleLR`] gives each role (the `role` key of a parameter group) its own schedule
over its own steps:

- **policy**: warmup and decay span the PPO optimizer steps only, and start at the first of them. While the policy is
  frozen its multiplier is exactly 0.
- **value** (the critic): one schedule over value pretraining's planned optimizer steps, started at the first step,
  and another over the PPO optimizer steps (the policy's span), started with the policy's clock at the first PPO
  update. Each phase has its own schedule, as a separate critic-pretraining job would: a linear decay does not spend
  the critic's rate in pretraining and leave the PPO phase ≈ 0 (a short run after pretraining would barely train its
  critic), and an early stop of pretraining changes nothing of the PPO phase's schedule. Without value pretraining
  (PPO) the critic has the PPO schedule only, like the policy.

Each role's schedule is transformers' own (`lr_scheduler_type`, `warmup_steps`/`warmup_ratio` of that role's span,
`lr_scheduler_kwargs`). Groups without a role (a user optimizer) follow the value schedule, i.e. all steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import get_scheduler

from ..config.ppo import PPOConfig

ROLES = ("policy", "value")


@dataclasses.dataclass(frozen=True)
class ScheduleSettings:
    """What the schedules read of the config: transformers' schedule, its kwargs and its warmup."""

    lr_scheduler_type: str
    lr_scheduler_kwargs: dict[str, Any] | None
    # The warmup steps of a span of `n` optimizer steps: TrainingArguments' own `get_warmup_steps` (`warmup_steps`, or
    # a fraction of `n`), taken as it is rather than re-derived, so the steps stay transformers' in every version.
    warmup_steps: Callable[[int], int]

    @classmethod
    def from_args(cls, args: PPOConfig) -> ScheduleSettings:
        return cls(args.lr_scheduler_type, args.lr_scheduler_kwargs, args.get_warmup_steps)


def schedule_multiplier(settings: ScheduleSettings, num_training_steps: int) -> Callable[[int], float]:
    """
    The multiplier of transformers' schedule `settings.lr_scheduler_type` over `num_training_steps` optimizer steps.

    Raises:
        `ValueError`: for schedules that are not a function of the step (e.g. `reduce_lr_on_plateau`).
    """
    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)  # a scratch optimizer: nothing to disturb
    scheduler = get_scheduler(
        settings.lr_scheduler_type,
        optimizer=probe,
        num_warmup_steps=settings.warmup_steps(num_training_steps),
        num_training_steps=num_training_steps,
        scheduler_specific_kwargs=settings.lr_scheduler_kwargs,
    )
    if not isinstance(scheduler, LambdaLR):
        raise ValueError(
            f"lr_scheduler_type={settings.lr_scheduler_type!r} is not supported by this trainer (it needs a schedule that "
            "is a function of the step, to give the policy and the critic their own clocks): use linear, cosine, "
            "constant_with_warmup, ..., or pass your own `optimizers=(optimizer, scheduler)`."
        )
    return scheduler.lr_lambdas[0]


class RoleLR(LambdaLR):
    """
    A `LambdaLR` whose parameter groups follow the schedule of their role, each counted from that role's start.

    Args:
        optimizer: Optimizer whose groups carry `role` (`"policy"` or `"value"`).
        multipliers: `{role: multiplier(step)}` in the PPO phase, the step counted from the role's start.
        starts: `{role: first optimizer step of the role}`, or `None` for a role that has not started (multiplier 0).
        pretrain_multipliers: `{role: multiplier(step)}` for a role that trains before the PPO phase (the critic in
            value pretraining), used until the policy's clock starts; the role's clock restarts with the policy's.
        single_clock_multipliers: `{role: multiplier(step)}` over both phases, the schedule of a checkpoint saved
            before each phase had its own (its state has no `phases`): a resumed older run keeps its schedule.

    `starts` and `phases` are in the state dict, so a resumed run keeps each clock and its phase where they were.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        multipliers: dict[str, Callable[[int], float]],
        starts: dict[str, int | None],
        pretrain_multipliers: dict[str, Callable[[int], float]] | None = None,
        single_clock_multipliers: dict[str, Callable[[int], float]] | None = None,
    ):
        self.starts = dict(starts)
        self.phases = True  # False: an older run's schedule, one clock over both phases (see load_state_dict)
        pretrain_multipliers = dict(pretrain_multipliers or {})
        single_clock = dict(single_clock_multipliers or {})

        def role_lambda(role: str) -> Callable[[int], float]:
            def lr_lambda(step: int) -> float:
                start = self.starts[role]
                if start is None:
                    return 0.0
                if not self.phases and role in single_clock:
                    return single_clock[role](max(0, step - start))
                pretraining = role in pretrain_multipliers and self.starts["policy"] is None
                multiplier = (pretrain_multipliers if pretraining else multipliers)[role]
                return multiplier(max(0, step - start))

            return lr_lambda

        lambdas = [role_lambda(group.get("role", "value")) for group in optimizer.param_groups]
        super().__init__(optimizer, lambdas)

    def start(self, role: str, step: int | None = None) -> None:
        """Start (or re-anchor) `role`'s clock so that its step `0` is optimizer step `step` (default: now)."""
        self.starts[role] = self.last_epoch if step is None else step
        self._apply()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # A state without `phases` was saved before each phase had its own critic schedule: the run resumes on its
        # single clock (`single_clock_multipliers`), as it would have continued.
        super().load_state_dict({"phases": False, **state_dict})

    def started(self, role: str) -> bool:
        return self.starts[role] is not None

    def _apply(self) -> None:
        """Set every group's lr for the current step (after a clock moved between two `step()` calls)."""
        for group, base_lr, lr_lambda in zip(self.optimizer.param_groups, self.base_lrs, self.lr_lambdas):
            group["lr"] = base_lr * lr_lambda(self.last_epoch)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

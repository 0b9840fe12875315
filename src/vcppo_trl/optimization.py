"""The optimizer step of [`PPOTrainer`]: parameter groups per model, their schedules, loss scaling, gradient clipping
and the non-finite skip.

A mixin, like [`~trainer_saving.SavingMixin`], because every step reads and writes the trainer's optimizer, scheduler
and accelerator; `ppo_update` calls [`_loss_normalizers`] and [`_optimizer_step`] once per mini-batch.
"""

from __future__ import annotations

import math
import os

import torch
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import logging

from .distributed import reset_optimizer_state
from .losses import loss_normalizer
from .schedules import RoleLR, schedule_multiplier

logger = logging.get_logger(__name__)


class NonFiniteTrainingError(RuntimeError):
    """Too many optimizer steps in a row had a non-finite loss or gradient."""


def role_prefix(role: str) -> str:
    """Parameter-name prefix of each model inside [`~rollout.PolicyAndValueModel`]."""
    return {"policy": "policy.", "value": "critic."}[role]


class OptimizationMixin:
    """One optimizer with a policy and a critic role, each with its learning rate, schedule and clipping."""

    # ------------------------------------------------------- optimizer, schedule

    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        """AdamW (or `args.optim`) with separate parameter groups for the policy and the critic."""
        if self.optimizer is not None:
            return self.optimizer
        wrapper = self.model if model is None else model
        decay = set(self.get_decay_parameter_names(wrapper))
        groups = []
        for role, lr in (("policy", self.args.learning_rate), ("value", self.args.value_learning_rate)):
            named = [
                (n, p) for n, p in wrapper.named_parameters() if p.requires_grad and n.startswith(role_prefix(role))
            ]
            for use_decay in (True, False):
                params = [p for n, p in named if (n in decay) == use_decay]
                if params:
                    wd = self.args.weight_decay if use_decay else 0.0
                    groups.append({"params": params, "weight_decay": wd, "lr": lr, "role": role})
        optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, wrapper)
        optimizer_kwargs.pop("lr", None)
        self.optimizer = optimizer_cls(groups, lr=self.args.learning_rate, **optimizer_kwargs)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        """
        `lr_scheduler_type` with one clock per model ([`~schedules.RoleLR`]): the policy's schedule spans the PPO
        updates only and starts at the first of them; the critic's spans value pretraining and PPO.
        """
        if self.lr_scheduler is None:
            per_update = self.optimizer_steps_per_update()
            policy_steps = self.num_ppo_updates * per_update
            critic_steps = policy_steps + self.num_value_pretrain_updates() * per_update
            multipliers = {
                "policy": schedule_multiplier(self.args, policy_steps),
                "value": schedule_multiplier(self.args, critic_steps),
            }
            starts = {"policy": None, "value": 0}  # the policy's clock starts at its first PPO update
            self.lr_scheduler = RoleLR(optimizer or self.optimizer, multipliers, starts)
        return self.lr_scheduler

    def _start_policy_schedule(self) -> None:
        """At the first PPO update: start the policy's clock, and move the critic's past unused pretraining steps."""
        scheduler = self.lr_scheduler
        if not isinstance(scheduler, RoleLR) or scheduler.started("policy"):
            return
        planned = self.num_value_pretrain_updates() * self.optimizer_steps_per_update()
        scheduler.start("value", scheduler.last_epoch - planned)  # last_epoch: the pretraining steps actually run
        scheduler.start("policy")

    def _reset_policy_optimizer_state(self) -> None:
        """Forget the policy's optimizer state (see [`~distributed.reset_optimizer_state`]); done when value
        pretraining ends, so that the first PPO step is the same with and without DeepSpeed."""
        if self.optimizer is not None:
            reset_optimizer_state(self.optimizer, "policy")

    def _set_policy_lr_to_zero(self) -> None:
        for group in self.optimizer.param_groups:
            if group.get("role") == "policy":
                group["lr"] = 0.0

    def _learning_rate(self, role: str) -> float:
        """Current learning rate of the policy or the critic (0 for the policy while it is frozen)."""
        if role == "policy" and self.in_value_pretraining:
            return 0.0
        for group in self.optimizer.param_groups:
            if group.get("role") == role:
                return float(group["lr"])
        return float("nan")

    # -------------------------------------------------------------------- step

    def _loss_normalizers(self, mask: torch.Tensor) -> torch.Tensor:
        """
        `[policy, value]` denominators of the loss aggregation for one mini-batch, summed over all processes.

        `mask` holds this process's sequences of the mini-batch (all its micro-batches), so every micro-batch's loss is
        normalised by the count of the whole mini-batch (see [`~losses.aggregate_loss`]).
        """
        length = self.args.response_length
        counts = torch.stack(
            [
                loss_normalizer(mask, self.args.loss_type, length),
                loss_normalizer(mask, self.args.value_loss_type, length),
            ]
        )
        if self.accelerator.num_processes > 1:
            counts = self.accelerator.reduce(counts, "sum")
        return counts

    def _optimizer_step(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """
        The end of a mini-batch: clip the gradients, step the optimizer unless they are non-finite, step the scheduler
        (after a skipped step too) and clear the gradients.

        Returns:
            The gradient norms before clipping (`grad_norm`, `grad_norm/policy`, `grad_norm/value`), or `None` when
            the step was skipped: the weights and optimizer state stay as they were.
        """
        norms = self._clip_gradients(model)
        grad_norms = None
        if norms["total"] is None or self._step_is_finite(norms["total"]):
            names = (("total", "grad_norm"), ("policy", "grad_norm/policy"), ("value", "grad_norm/value"))
            grad_norms = {
                name: torch.as_tensor(norms[key]).detach().float() for key, name in names if norms.get(key) is not None
            }
            self.optimizer.step()  # a no-op under DeepSpeed, whose engine stepped in the last backward
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norms

    def _clip_gradients(self, model: torch.nn.Module) -> dict[str, torch.Tensor | None]:
        """
        Clip the policy's and the critic's gradients each to `max_grad_norm` (a large critic gradient does not shrink
        the policy's step); returns their norms before clipping and the joint norm (`"total"`).

        Under DeepSpeed the engine has already clipped the joint norm of both models (its `gradient_clipping`) inside
        the last backward: only the joint norm is returned.
        """
        args = self.args
        # The norms are computed even without clipping (max_norm=inf): they tell a non-finite step.
        max_norm = args.max_grad_norm if args.max_grad_norm and args.max_grad_norm > 0 else math.inf
        if self.is_deepspeed_enabled:
            return {"total": self.accelerator.clip_grad_norm_(model.parameters(), max_norm)}
        self.accelerator.unscale_gradients()
        wrapper = self.accelerator.unwrap_model(model)
        norms: dict[str, torch.Tensor | None] = {}
        for role, module in (("policy", wrapper.policy), ("value", wrapper.critic)):
            params = [p for p in module.parameters() if p.grad is not None]
            norms[role] = torch.nn.utils.clip_grad_norm_(params, max_norm) if params else None
        present = [n.float() for n in norms.values() if n is not None]
        norms["total"] = torch.linalg.vector_norm(torch.stack(present)) if present else None
        return norms

    def _step_is_finite(self, grad_norm: torch.Tensor) -> bool:
        """
        Whether an optimizer step's gradient is finite; counts non-finite steps in a row and stops past the limit.

        One host sync per optimizer step. Under DDP the gradient is already all-reduced, so all ranks agree.
        """
        if bool(torch.isfinite(torch.as_tensor(grad_norm))):
            self.nonfinite_steps_in_a_row = 0
            return True
        self.nonfinite_steps_in_a_row += 1
        limit = self.args.max_consecutive_nonfinite_steps
        what = "DeepSpeed has already applied it" if self.is_deepspeed_enabled else "optimizer step skipped"
        logger.warning(
            f"Non-finite loss or gradient at update {self.state.global_step + 1}: {what} "
            f"({self.nonfinite_steps_in_a_row} in a row, limit {limit})."
        )
        if self.nonfinite_steps_in_a_row > limit:
            last = get_last_checkpoint(self.args.output_dir) if os.path.isdir(self.args.output_dir) else None
            raise NonFiniteTrainingError(
                f"{self.nonfinite_steps_in_a_row} optimizer steps in a row had a non-finite loss or gradient (limit "
                f"max_consecutive_nonfinite_steps={limit}); stopping. "
                + (
                    f"The last checkpoint, {last}, was saved before this and is intact: resume from it with a lower "
                    "learning rate, or check the rewards and the data."
                    if last
                    else "No checkpoint was saved yet (set save_steps to keep one)."
                )
            )
        return False

"""The end of every mini-batch, apart from the loss that came before it: the optimizer's parameter groups by role
(hold one at learning rate 0, read its rate), the policy's and the critic's schedule clocks, gradient clipping per
model, the non-finite skip and its limit, the optimizer and scheduler steps ([`OptimizerSteps`]).
"""

from __future__ import annotations

import math
import os

import torch
from accelerate import Accelerator
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import logging

from ..parallel.fsdp import full_tensor
from .optimizers import NonFiniteTrainingError, reset_optimizer_state
from .schedules import RoleLR
from .settings import LearnerSettings

logger = logging.get_logger(__name__)


class OptimizerSteps:
    """
    The optimizer and its scheduler as the PPO epochs use them, and the count of non-finite steps in a row (saved
    in checkpoints).

    Args:
        model: The prepared (wrapped) policy-and-critic model whose gradients are clipped.
        optimizer: The prepared optimizer, with parameter groups tagged `role="policy"` / `role="value"`.
        lr_scheduler: The scheduler stepped once per optimizer step (a [`~learner.schedules.RoleLR`] by default), or `None`.
        accelerator: The trainer's accelerator.
        settings ([`~learner.settings.LearnerSettings`]): `max_grad_norm`, `max_consecutive_nonfinite_steps` and
            `output_dir` (where the error of too many non-finite steps looks for the latest checkpoint).
        is_deepspeed: Whether the model is a DeepSpeed engine (it clips and steps inside the last backward).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        lr_scheduler,
        accelerator: Accelerator,
        settings: LearnerSettings,
        is_deepspeed: bool,
    ):
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.accelerator = accelerator
        self.settings = settings
        self.is_deepspeed = is_deepspeed
        self.nonfinite_steps_in_a_row = 0

    # --------------------------------------------------------- learning rates

    def set_lr_to_zero(self, role: str) -> None:
        """Hold the `"policy"` or `"value"` parameter groups for the next optimizer step."""
        for group in self.optimizer.param_groups:
            if group.get("role") == role:
                group["lr"] = 0.0

    def learning_rate(self, role: str) -> float:
        """Current learning rate of the policy's or the critic's parameter groups (nan when the role has none)."""
        for group in self.optimizer.param_groups:
            if group.get("role") == role:
                return float(group["lr"])
        return float("nan")

    def start_policy_schedule(self) -> None:
        """At the first PPO update: start the PPO phase's clocks, the policy's and the critic's (whose value-pretraining
        schedule, if any, ends here however far it got)."""
        scheduler = self.lr_scheduler
        if not isinstance(scheduler, RoleLR) or scheduler.started("policy"):
            return
        if scheduler.phases:  # (an older run resumed in pretraining keeps its critic's one clock)
            scheduler.start("value")
        scheduler.start("policy")

    def reset_policy_optimizer_state(self) -> None:
        """Forget the policy's optimizer state (see [`~learner.optimizers.reset_optimizer_state`]); done when value
        pretraining ends, so that the first PPO step is the same with and without DeepSpeed."""
        reset_optimizer_state(self.optimizer, "policy")

    # -------------------------------------------------------------------- step

    def deepspeed_accumulation_steps(self, micro_batches: int) -> int:
        """The DeepSpeed engine's `gradient_accumulation_steps` (it divides every backward's loss by it). Without a
        token budget it equals the micro-batch count (checked at setup); with one the count varies per mini-batch."""
        steps = getattr(self.model, "gradient_accumulation_steps", None)
        return int(steps()) if callable(steps) else micro_batches

    def step(self, update_index: int = 0) -> dict[str, torch.Tensor] | None:
        """
        The end of a mini-batch: clip the gradients, step the optimizer unless they are non-finite, step the scheduler
        (after a skipped step too) and clear the gradients.

        Returns:
            The gradient norms before clipping (`grad_norm`, `grad_norm/policy`, `grad_norm/value`), or `None` when
            the step was skipped: the weights and optimizer state stay as they were.
        """
        norms = self.clip_gradients()
        grad_norms = None
        if norms["total"] is None or self.step_is_finite(norms["total"], update_index):
            names = (("total", "grad_norm"), ("policy", "grad_norm/policy"), ("value", "grad_norm/value"))
            grad_norms = {
                name: torch.as_tensor(norms[key]).detach().float() for key, name in names if norms.get(key) is not None
            }
            self.optimizer.step()  # a no-op under DeepSpeed, whose engine stepped in the last backward
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norms

    def clip_gradients(self) -> dict[str, torch.Tensor | None]:
        """
        Clip the policy's and the critic's gradients each to `max_grad_norm` (a large critic gradient does not shrink
        the policy's step); returns their norms before clipping and the joint norm (`"total"`).

        Under DeepSpeed the engine has already clipped the joint norm of both models (its `gradient_clipping`) inside
        the last backward: only the joint norm is returned.
        """
        settings = self.settings
        # The norms are computed even without clipping (max_norm=inf): they tell a non-finite step.
        max_norm = settings.max_grad_norm if settings.max_grad_norm and settings.max_grad_norm > 0 else math.inf
        if self.is_deepspeed:
            return {"total": self.accelerator.clip_grad_norm_(self.model.parameters(), max_norm)}
        self.accelerator.unscale_gradients()
        wrapper = self.accelerator.unwrap_model(self.model)
        norms: dict[str, torch.Tensor | None] = {}
        for role, module in (("policy", wrapper.policy), ("value", wrapper.critic)):
            params = [] if module is None else [p for p in module.parameters() if p.grad is not None]
            norms[role] = full_tensor(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else None
        present = [n.float() for n in norms.values() if n is not None]
        norms["total"] = torch.linalg.vector_norm(torch.stack(present)) if present else None
        return norms

    def step_is_finite(self, grad_norm: torch.Tensor, update_index: int = 0) -> bool:
        """
        Whether an optimizer step's gradient is finite; counts non-finite steps in a row and stops past the limit.

        One host sync per optimizer step. Under DDP the gradient is already all-reduced, so all ranks agree.
        """
        if bool(torch.isfinite(torch.as_tensor(grad_norm))):
            self.nonfinite_steps_in_a_row = 0
            return True
        self.nonfinite_steps_in_a_row += 1
        limit = self.settings.max_consecutive_nonfinite_steps
        what = "DeepSpeed has already applied it" if self.is_deepspeed else "optimizer step skipped"
        logger.warning(
            f"Non-finite loss or gradient at update {update_index}: {what} "
            f"({self.nonfinite_steps_in_a_row} in a row, limit {limit})."
        )
        if self.nonfinite_steps_in_a_row > limit:
            last = get_last_checkpoint(self.settings.output_dir) if os.path.isdir(self.settings.output_dir) else None
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

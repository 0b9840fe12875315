"""VC-PPO's value-pretraining phase as a callback (the base trainer's progress display is in `progress.py`)."""

from __future__ import annotations

import math
import os
from typing import Any

from transformers import Trainer, TrainerCallback
from transformers.utils import logging

# Re-exported: these lived here before the VC-PPO layer and the base trainer's display were separated.
from .progress import CompactPrinterCallback, RolloutProgressCallback  # noqa: F401

logger = logging.get_logger(__name__)

VALUE_PRETRAINED_DIRNAME = "value_pretrained"


class ValuePretrainCallback(TrainerCallback):
    """
    When VC-PPO's value-pretraining phase stops, and the critics it saves; the trainer owns the phase itself.

    The callback begins the phase at the start of training (`trainer.begin_value_pretraining()`); while it runs the
    trainer rolls out with the frozen initial policy and updates only the critic, with Monte-Carlo targets (λ = 1).
    The phase ends (`trainer.end_value_pretraining(steps)`) after `max_steps` updates, or earlier (never before
    `min_steps`) when the explained variance of an update reaches `stop_explained_variance`, or when the value loss
    has not improved by `min_delta` (relative) for `patience` updates. At the end the critic is saved as a
    token-classification checkpoint under `<output_dir>/value_pretrained` (and at each of `save_steps` under
    `value_pretrained-step-<n>`), then PPO training starts from it.

    [`VCPPOTrainer`] adds this callback by itself when `value_pretrain_steps > 0`; pass one in `callbacks=` to control
    the phase by hand (the trainer binds it).

    Args:
        max_steps (`int`): Maximum number of value-pretraining updates.
        stop_explained_variance (`float`, *optional*): Stop once an update's explained variance reaches this.
        patience (`int`, *optional*): Stop when the value loss has not improved for this many updates.
        min_delta (`float`, defaults to `0.01`): Relative value-loss improvement that counts as progress.
        min_steps (`int`, defaults to `1`): Never stop early before this many updates.
        save_steps (`list[int]`, *optional*): Pretraining steps at which to also save the critic.
    """

    def __init__(
        self,
        max_steps: int,
        stop_explained_variance: float | None = None,
        patience: int | None = None,
        min_delta: float = 0.01,
        min_steps: int = 1,
        save_steps: list[int] | None = None,
    ):
        if max_steps < 1:
            raise ValueError(f"ValuePretrainCallback needs max_steps >= 1, got {max_steps}.")
        self.max_steps = max_steps
        self.stop_explained_variance = stop_explained_variance
        self.patience = patience
        self.min_delta = min_delta
        self.min_steps = min_steps
        self.save_steps = set(save_steps or [])
        self.trainer: Trainer | None = None
        self.done = False
        self.steps = 0
        self.best_loss = math.inf
        self.updates_since_best = 0
        self.stop_reason: str | None = None
        self.saved_paths: list[str] = []

    @classmethod
    def from_config(cls, args) -> ValuePretrainCallback:
        return cls(
            max_steps=args.value_pretrain_steps,
            stop_explained_variance=args.value_pretrain_stop_explained_variance,
            patience=args.value_pretrain_patience,
            min_delta=args.value_pretrain_min_delta,
            min_steps=args.value_pretrain_min_steps,
            save_steps=args.value_pretrain_save_steps,
        )

    # Progress saved in checkpoints, so a resumed run continues the phase (or skips it when it was done); the phase
    # itself is the trainer's (older checkpoints also hold an `active` flag, now ignored).
    _RESUMABLE = ("done", "steps", "best_loss", "updates_since_best", "stop_reason", "saved_paths")

    def state_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._RESUMABLE} | {"max_steps": self.max_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("max_steps") != self.max_steps and not state.get("done"):
            logger.warning(
                f"Resuming value pretraining saved with max_steps={state.get('max_steps')} under max_steps="
                f"{self.max_steps}: the phase keeps the new limit."
            )
        for name in self._RESUMABLE:
            setattr(self, name, state[name])

    def bind(self, trainer: Trainer) -> None:
        """Attach the trainer whose phase this callback drives."""
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        if self.trainer is None:
            raise RuntimeError(
                "ValuePretrainCallback is not bound to a trainer: pass it to VCPPOTrainer(callbacks=...)."
            )
        if self.done:
            return
        self.trainer.begin_value_pretraining()
        if state.is_world_process_zero:
            logger.warning(
                f"Value pretraining: training the critic alone (λ = 1, policy frozen) for up to {self.max_steps} updates."
            )

    def on_step_end(self, args, state, control, metrics: dict[str, Any] | None = None, **kwargs):
        if not self.trainer.in_value_pretraining:
            return
        metrics = metrics or {}
        self.steps += 1
        if self.steps in self.save_steps:
            self._save(os.path.join(args.output_dir, f"{VALUE_PRETRAINED_DIRNAME}-step-{self.steps}"))
        reason = self._stop_reason(metrics)
        if reason is not None:
            self._finish(args, state, control, reason)

    def _stop_reason(self, metrics: dict[str, Any]) -> str | None:
        loss = metrics.get("value_pretrain/loss_avg", math.nan)
        if not math.isnan(loss):
            if loss < self.best_loss * (1.0 - self.min_delta):
                self.best_loss = loss
                self.updates_since_best = 0
            else:
                self.updates_since_best += 1
        if self.steps >= self.max_steps:
            return f"reached max_steps={self.max_steps}"
        if self.steps < self.min_steps:
            return None
        ev = metrics.get("value_pretrain/explained_variance", math.nan)
        if self.stop_explained_variance is not None and not math.isnan(ev) and ev >= self.stop_explained_variance:
            return f"explained variance {ev:.3f} >= {self.stop_explained_variance}"
        if self.patience is not None and self.updates_since_best >= self.patience:
            return f"value loss has not improved by {self.min_delta:.0%} for {self.patience} updates"
        return None

    def _save(self, path: str) -> None:
        self.trainer.save_value_model(path)
        self.saved_paths.append(path)
        if self.trainer.is_world_process_zero():
            logger.warning(f"Value pretraining: saved the critic to {path}")

    def _finish(self, args, state, control, reason: str) -> None:
        self.done = True
        self.stop_reason = reason
        path = os.path.join(args.output_dir, VALUE_PRETRAINED_DIRNAME)
        self._save(path)
        if getattr(args, "value_pretrain_push", False):
            from .hub import push_pretrained_critic

            push_pretrained_critic(self.trainer, path, steps=self.steps)
        self.trainer.end_value_pretraining(self.steps)
        if state.is_world_process_zero:
            logger.warning(f"Value pretraining finished after {self.steps} updates ({reason}); PPO training starts.")

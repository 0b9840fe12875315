"""VC-PPO's value-pretraining callback: configures the phase the trainer runs (the base trainer's progress display is
in `progress.py`)."""

from __future__ import annotations

from typing import Any

from transformers import Trainer, TrainerCallback
from transformers.utils import logging

# Re-exported: these lived here before the VC-PPO layer and the base trainer's display were separated.
from .progress import CompactPrinterCallback, RolloutProgressCallback  # noqa: F401
from .value_pretraining import ValuePretrainingPhase, ValuePretrainRule

logger = logging.get_logger(__name__)

VALUE_PRETRAINED_DIRNAME = "value_pretrained"


class ValuePretrainCallback(TrainerCallback):
    """
    Configures VC-PPO's value-pretraining phase and shows its progress; the trainer runs the phase.

    While the phase runs the trainer rolls out with the frozen initial policy and updates only the critic, with
    Monte-Carlo targets (λ = 1). It ends after `max_steps` updates, or earlier (never before `min_steps`) when the
    explained variance of an update reaches `stop_explained_variance`, or when the value loss has not improved by
    `min_delta` (relative) for `patience` updates (see [`~value_pretraining.ValuePretrainingPhase`], which this
    callback holds as `phase`). At the end the trainer saves the critic as a token-classification checkpoint under
    `<output_dir>/value_pretrained` (and at each of `save_steps` under `value_pretrained-step-<n>`), then PPO training
    starts from it.

    [`VCPPOTrainer`] adds this callback by itself when `value_pretrain_steps > 0`; pass one in `callbacks=` to control
    the phase by hand (the trainer adopts its phase).

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
        rule = ValuePretrainRule(
            max_updates=max_steps,
            stop_explained_variance=stop_explained_variance,
            patience=patience,
            min_delta=min_delta,
            min_updates=min_steps,
            save_at=frozenset(save_steps or []),
        )
        self.phase = ValuePretrainingPhase(rule)
        self.trainer: Trainer | None = None

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

    # The phase's configuration and progress, read-only.
    max_steps = property(lambda self: self.phase.rule.max_updates)
    stop_explained_variance = property(lambda self: self.phase.rule.stop_explained_variance)
    patience = property(lambda self: self.phase.rule.patience)
    min_delta = property(lambda self: self.phase.rule.min_delta)
    min_steps = property(lambda self: self.phase.rule.min_updates)
    save_steps = property(lambda self: set(self.phase.rule.save_at))
    done = property(lambda self: self.phase.done, doc="Whether the phase has ended.")
    steps = property(lambda self: self.phase.updates, doc="Value-pretraining updates run so far.")
    stop_reason = property(lambda self: self.phase.stop_reason)
    saved_paths = property(lambda self: self.phase.saved_paths, doc="Where the critic was saved, in order.")

    def state_dict(self) -> dict[str, Any]:
        """The phase's progress, saved in checkpoints so a resumed run continues the phase (or skips it when done)."""
        return self.phase.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        warning = self.phase.load_rule_progress(state)
        if warning:
            logger.warning(warning)

    def bind(self, trainer: Trainer) -> None:
        """Attach the trainer that runs this callback's phase."""
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        if self.trainer is None:
            raise RuntimeError(
                "ValuePretrainCallback is not bound to a trainer: pass it to VCPPOTrainer(callbacks=...)."
            )

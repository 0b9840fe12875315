"""VC-PPO's value-pretraining phase as an object: whether it runs, how many updates it planned and ran, when it stops,
and what a checkpoint keeps of it.

The trainer owns one [`ValuePretrainingPhase`] (with no planned update for plain PPO), begins it, feeds it each
pretraining update's [`CriticFit`], and ends it when the phase says so; [`~trainer.value_pretraining.ValuePretrainCallback`] is the
public way to configure it. Nothing here touches a model: saving the critic and pushing it are the trainer's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from transformers import Trainer, TrainerCallback
from transformers.utils import logging

# Re-exported: these lived here before the VC-PPO layer and the base trainer's display were separated.

logger = logging.get_logger(__name__)


@dataclasses.dataclass(frozen=True)
class CriticFit:
    """How well the critic fits one update's targets: the stop rule's inputs (nan when the update had none)."""

    loss: float  # the update's mean value loss
    explained_variance: float  # 1 − Var(returns − values) / Var(returns), over the whole batch


@dataclasses.dataclass(frozen=True)
class ValuePretrainRule:
    """
    When value pretraining stops: after `max_updates` updates, or earlier (never before `min_updates`) when an update's
    explained variance reaches `stop_explained_variance`, or when the value loss has not improved by `min_delta`
    (relative) for `patience` updates. The critic is also saved after each update counted in `save_at`.
    """

    max_updates: int
    stop_explained_variance: float | None = None
    patience: int | None = None
    min_delta: float = 0.01
    min_updates: int = 1
    save_at: frozenset[int] = frozenset()

    def __post_init__(self):
        if self.max_updates < 1:
            raise ValueError(f"Value pretraining needs max_steps >= 1, got {self.max_updates}.")


class ValuePretrainingPhase:
    """
    The phase's state: `active` while updates train the critic alone; `updates` counted so far; `ended_after`, the
    updates it ran once it has ended (`None` before); and the stop rule's progress (best loss, updates since it).

    Args:
        rule ([`ValuePretrainRule`], *optional*): When to stop; `None` for a run with no value pretraining.
    """

    # The rule's progress a checkpoint keeps (the key names of the callback state checkpoints have always held).
    _RESUMABLE = ("done", "steps", "best_loss", "updates_since_best", "stop_reason", "saved_paths")

    def __init__(self, rule: ValuePretrainRule | None = None):
        self.rule = rule
        self.active = False
        self.ended_after: int | None = None
        self.updates = 0
        self.best_loss = math.inf
        self.updates_since_best = 0
        self.stop_reason: str | None = None
        self.saved_paths: list[str] = []

    @property
    def planned_updates(self) -> int:
        """The most updates the phase may run (0 without a rule)."""
        return self.rule.max_updates if self.rule is not None else 0

    @property
    def done(self) -> bool:
        return self.ended_after is not None

    def updates_in_run(self) -> int:
        """The updates the run gives the phase: those planned until it ends, those it ran after."""
        return self.planned_updates if self.ended_after is None else self.ended_after

    def should_begin(self) -> bool:
        """Whether training starts (or resumes) inside the phase."""
        return self.rule is not None and not self.done

    def begin(self) -> None:
        if self.done:
            raise RuntimeError(f"Value pretraining already ended after {self.ended_after} updates.")
        self.active = True

    def record(self, fit: CriticFit) -> str | None:
        """
        Count one pretraining update and apply the stop rule to its fit.

        Returns:
            Why the phase stops now, or `None` to go on.
        """
        rule = self.rule
        self.updates += 1
        if not math.isnan(fit.loss):
            if fit.loss < self.best_loss * (1.0 - rule.min_delta):
                self.best_loss = fit.loss
                self.updates_since_best = 0
            else:
                self.updates_since_best += 1
        if self.updates >= rule.max_updates:
            return f"reached max_steps={rule.max_updates}"
        if self.updates < rule.min_updates:
            return None
        ev = fit.explained_variance
        if rule.stop_explained_variance is not None and not math.isnan(ev) and ev >= rule.stop_explained_variance:
            return f"explained variance {ev:.3f} >= {rule.stop_explained_variance}"
        if rule.patience is not None and self.updates_since_best >= rule.patience:
            return f"value loss has not improved by {rule.min_delta:.0%} for {rule.patience} updates"
        return None

    def save_now(self) -> bool:
        """Whether the critic is saved after the update just recorded (one of the rule's `save_at`)."""
        return self.rule is not None and self.updates in self.rule.save_at

    def end(self, reason: str | None = None) -> int:
        """End the phase after the updates recorded so far; returns their number."""
        if not self.active:
            raise RuntimeError("Value pretraining ended outside the phase.")
        self.active = False
        self.ended_after = self.updates
        self.stop_reason = reason
        return self.updates

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The rule's progress, in the form checkpoints hold it (the callback's entry of `vcppo_state.json`)."""
        state = {
            "done": self.done,
            "steps": self.updates,
            "best_loss": self.best_loss,
            "updates_since_best": self.updates_since_best,
            "stop_reason": self.stop_reason,
            "saved_paths": list(self.saved_paths),
        }
        return state | {"max_steps": self.planned_updates}

    def load_rule_progress(self, state: dict[str, Any]) -> str | None:
        """
        Restore the rule's progress from [`state_dict`]; returns a warning when the saved limit differs from this
        run's and the phase has not ended (the phase keeps the new limit).
        """
        self.updates = state["steps"]
        self.best_loss = state["best_loss"]
        self.updates_since_best = state["updates_since_best"]
        self.stop_reason = state["stop_reason"]
        self.saved_paths = list(state["saved_paths"])
        if state.get("max_steps") != self.planned_updates and not state.get("done"):
            return (
                f"Resuming value pretraining saved with max_steps={state.get('max_steps')} under max_steps="
                f"{self.planned_updates}: the phase keeps the new limit."
            )
        return None

    def restore(self, active: bool, ended_after: int | None) -> None:
        """Whether the phase was running and the updates it ran, as the checkpoint's training state says."""
        self.active = active
        self.ended_after = ended_after


def saved_phase(saved: dict[str, Any]) -> tuple[bool, int | None]:
    """
    The value-pretraining phase of a checkpoint's training state: whether it was running, and the updates it ran once
    ended (`None`: it has not ended, or never ran). Checkpoints written before the trainer saved it have
    `policy_frozen`, and a `max_steps` that counted those updates once the phase had ended.
    """
    if "value_pretraining" in saved:
        return saved["value_pretraining"], saved["value_pretrain_updates"]
    if saved["policy_frozen"]:
        return True, None
    return False, (saved["max_steps"] - saved["num_ppo_updates"]) or None


VALUE_PRETRAINED_DIRNAME = "value_pretrained"


class ValuePretrainCallback(TrainerCallback):
    """
    Configures VC-PPO's value-pretraining phase and shows its progress; the trainer runs the phase.

    While the phase runs the trainer rolls out with the frozen initial policy and updates only the critic, with
    Monte-Carlo targets (λ = 1). It ends after `max_steps` updates, or earlier (never before `min_steps`) when the
    explained variance of an update reaches `stop_explained_variance`, or when the value loss has not improved by
    `min_delta` (relative) for `patience` updates (see [`~trainer.value_pretraining.ValuePretrainingPhase`], which this
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

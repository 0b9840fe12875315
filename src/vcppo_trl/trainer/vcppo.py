"""VCPPOTrainer: PPOTrainer plus VC-PPO's two changes (arXiv 2503.01491).

1. Value pretraining: before the policy moves, the critic is trained alone on the frozen policy's rollouts with
   Monte-Carlo targets (λ = 1). The phase ([`~trainer.value_pretraining.ValuePretrainingPhase`]) is configured by a
   [`ValuePretrainCallback`] and run by the trainer.
2. Decoupled GAE: value targets with `lam_critic` (1.0), policy advantages with `lam_actor` (≈ 0.95).
"""

from __future__ import annotations

import math
import os

import torch
from transformers.utils import logging

from ..config.vcppo import VCPPOConfig
from ..rollout import HeldOutRollouts, StoredSourceSettings, with_stored_pretraining
from . import saving as trainer_saving
from .metrics import critic_fit, heldout_fit
from .ppo import PPOTrainer
from .store_job import run_info
from .value_pretraining import VALUE_PRETRAINED_DIRNAME, ValuePretrainCallback, ValuePretrainingPhase, saved_phase

logger = logging.get_logger(__name__)


class VCPPOTrainer(PPOTrainer):
    """
    Value-Calibrated PPO. Same arguments as [`PPOTrainer`], with a [`VCPPOConfig`].

    With `args.value_model_path` the critic is loaded from that pretrained checkpoint and value pretraining is
    skipped; otherwise, with `args.value_pretrain_steps > 0`, a [`ValuePretrainCallback`] runs the pretraining phase
    first (pass your own in `callbacks` to configure it by hand).
    """

    _tag_names = ["trl", "ppo", "vc-ppo", "vcppo-trl"]
    _name = "VC-PPO"
    _config_class = VCPPOConfig
    _paper = {
        "title": "What's Behind PPO's Collapse in Long-CoT? Value Optimization Holds the Secret",
        "id": "2503.01491",
    }

    def __init__(self, model, reward_funcs, args: VCPPOConfig | None = None, value_model=None, **kwargs):
        if args is not None and not isinstance(args, VCPPOConfig):
            raise TypeError(f"VCPPOTrainer needs a VCPPOConfig, got {type(args).__name__}.")
        if args is not None and args.value_model_path is not None:
            if value_model is not None:
                raise ValueError("Give either `value_model` or `args.value_model_path`, not both.")
            value_model = args.value_model_path
        super().__init__(model, reward_funcs, args=args, value_model=value_model, **kwargs)
        self.value_pretrain_callback = self._bind_value_pretrain_callback()
        # The phase belongs to the trainer; the callback configures it (without one: a phase that never runs).
        self.value_pretraining = ValuePretrainingPhase()
        self.stored_rollouts: HeldOutRollouts | None = None  # the phase's stored rollouts, when it reads some
        if self.value_pretrain_callback is not None:
            self.value_pretraining = self.value_pretrain_callback.phase
            ddp = self.accelerator.num_processes > 1 and not self.is_deepspeed_enabled
            if ddp and self.args.ddp_find_unused_parameters is False:
                raise ValueError(
                    "ddp_find_unused_parameters=False cannot run value pretraining under DDP: its updates train the "
                    "critic alone, so the policy's parameters get no gradient and DDP would wait for them. Leave "
                    "ddp_find_unused_parameters unset (None), or skip the phase (value_pretrain_steps=0, or a "
                    "pretrained critic in value_model_path)."
                )

    def _bind_value_pretrain_callback(self) -> ValuePretrainCallback | None:
        given = [cb for cb in self.callback_handler.callbacks if isinstance(cb, ValuePretrainCallback)]
        if len(given) > 1:
            raise ValueError("Pass at most one ValuePretrainCallback.")
        if not self.args.uses_critic:  # a group advantage estimator: no critic to pretrain
            if given:
                raise ValueError(
                    f"A ValuePretrainCallback pretrains the critic, and advantage_estimator="
                    f"{self.args.advantage_estimator!r} builds none: drop the callback, or use advantage_estimator='gae'."
                )
            return None
        if self.args.value_model_path is not None:
            for cb in given:
                self.remove_callback(cb)
            if self.is_world_process_zero():
                logger.warning(
                    f"Critic loaded from value_model_path={self.args.value_model_path!r}: value pretraining is skipped "
                    f"(value_pretrain_steps={self.args.value_pretrain_steps} unused); PPO starts at the first update."
                )
            return None  # the critic is already pretrained
        callback = given[0] if given else None
        if callback is None and self.args.value_pretrain_steps > 0:
            callback = ValuePretrainCallback.from_config(self.args)
            self.add_callback(callback)
        if callback is not None:
            callback.bind(self)
        return callback

    # ---------------------------------------------------- the value-pretraining phase

    @property
    def in_value_pretraining(self) -> bool:
        """Whether updates train the critic alone, on rollouts of the frozen policy (the policy's lr reads 0)."""
        return self.value_pretraining.active

    def num_value_pretrain_updates(self) -> int:
        """Value-pretraining updates planned for this run (at most; 0 when the phase does not run)."""
        return self.value_pretraining.planned_updates

    def trains_policy(self) -> bool:
        return not self.in_value_pretraining

    def critic_only_updates(self) -> int:
        return self.num_value_pretrain_updates()

    def num_training_updates(self) -> int:
        """Rollout batches of this run (`state.max_steps`): the PPO updates plus the value-pretraining ones, planned until
        the phase ends, run after (unused pretraining updates are not given to PPO)."""
        return self.num_ppo_updates + self.value_pretraining.updates_in_run()

    def begin_value_pretraining(self) -> None:
        """Freeze the policy from the next update on (training starts it; resuming inside the phase finds it begun)."""
        self.value_pretraining.begin()

    def end_value_pretraining(self, reason: str | None = None) -> None:
        """End value pretraining: PPO starts at the next update, from a fresh optimizer state for the policy, and the
        run shrinks by the unused pretraining updates."""
        updates = self.value_pretraining.end(reason)
        self.state.max_steps = self.num_training_updates()
        if self.learner is not None:
            self.learner.steps.reset_policy_optimizer_state()
        self.log({"value_pretrain/steps": float(updates)})

    def phase_state(self) -> dict:
        """Whether the phase is running and the updates it ran once ended (its rule's progress is the callback's
        entry of the checkpoint)."""
        return {
            "value_pretraining": self.value_pretraining.active,
            "value_pretrain_updates": self.value_pretraining.ended_after,
        }

    def restore_phase_state(self, saved: dict) -> None:
        active, ended_after = saved_phase(saved)
        self.value_pretraining.restore(active=active, ended_after=ended_after)

    def before_training(self) -> None:
        """Begin value pretraining unless it has ended (a resumed run may find it begun, or done)."""
        if not self.value_pretraining.should_begin():
            return
        self.begin_value_pretraining()
        # With stored rollouts the phase's rollouts are read, PPO's sampled after it.
        self.rollouts, self.stored_rollouts = with_stored_pretraining(
            StoredSourceSettings.from_args(self.args),
            self.rollouts,
            self.rollout_maker,
            this_run=lambda: run_info(self),
            process_index=self.accelerator.process_index,
            draw=None if self.prompts is None else self.prompts.draw,
        )
        if self.is_world_process_zero():
            source = (
                "" if self.stored_rollouts is None else f" from the stored rollouts in {self.stored_rollouts.path}"
            )
            logger.warning(
                "Value pretraining: training the critic alone (λ = 1, policy frozen) for up to "
                f"{self.value_pretraining.planned_updates} updates{source}, then {self.num_ppo_updates} PPO updates"
                + (
                    " (max_steps counts the PPO updates; value pretraining's come on top)."
                    if self.args.max_steps > 0
                    else "."
                )
            )

    def phase_fit(self):
        """The critic's fit the stop rule reads: on the update's own rollout, or on the held-out stored batches."""
        if self.stored_rollouts is None or not self.stored_rollouts.heldout_batches:
            return critic_fit(self.accelerator, self.last_update)
        rollouts = self.stored_rollouts.heldout()
        returns = [self.compute_advantages(rollout)[1] for rollout in rollouts]
        return heldout_fit(self.accelerator, rollouts, returns)

    def after_update(self, metrics: dict[str, float]) -> None:
        """In value pretraining: count the update, save the critic where the rule asks, and end the phase when the
        rule says so (saving the pretrained critic, and pushing it with `value_pretrain_push`)."""
        phase = self.value_pretraining
        if not phase.active:
            return
        fit = self.phase_fit()
        if self.stored_rollouts is not None and self.stored_rollouts.heldout_batches:
            metrics["value_pretrain/heldout_loss"] = fit.loss
            metrics["value_pretrain/heldout_explained_variance"] = fit.explained_variance
        reason = phase.record(fit)
        if phase.save_now():
            self._save_pretrained_critic(f"{VALUE_PRETRAINED_DIRNAME}-step-{phase.updates}")
        if reason is None:
            return
        path = self._save_pretrained_critic(VALUE_PRETRAINED_DIRNAME)
        if getattr(self.args, "value_pretrain_push", False):
            trainer_saving.push_pretrained_critic(self, path, steps=phase.updates)
        self.end_value_pretraining(reason)
        if self.args.value_pretrain_only:  # a critic job: nothing after the phase
            self.control.should_training_stop = True
        if self.is_world_process_zero():
            then = f"the critic is in {path}" if self.args.value_pretrain_only else "PPO training starts"
            logger.warning(f"Value pretraining finished after {phase.updates} updates ({reason}); {then}.")

    def _save_pretrained_critic(self, name: str) -> str:
        path = os.path.join(self.args.output_dir, name)
        self.save_value_model(path)
        self.value_pretraining.saved_paths.append(path)
        if self.is_world_process_zero():
            logger.warning(f"Value pretraining: saved the critic to {path}")
        return path

    def actor_lambda(self, action_tokens: torch.Tensor) -> float | torch.Tensor:
        """`lam_actor`, or with `lam_actor_length_alpha` one λ = 1 − 1/(α·l) per response of l policy tokens (VAPO;
        tool and environment tokens not counted)."""
        alpha = self.args.lam_actor_length_alpha
        if alpha is None:
            return self.args.lam_actor
        lengths = action_tokens.sum(dim=1).clamp(min=1).double()
        return (1.0 - 1.0 / (alpha * lengths)).clamp(0.0, 1.0)

    def value_cliprange(self) -> float | None:
        """`value_pretrain_cliprange_value` during value pretraining when set (`inf`: no clipping), else `cliprange_value`."""
        clip = self.args.value_pretrain_cliprange_value
        if not self.in_value_pretraining or clip is None:
            return self.args.cliprange_value
        return None if math.isinf(clip) else clip

    def critic_lambda(self) -> float:
        """λ of the critic's targets: 1 during value pretraining (Monte-Carlo returns), else `lam_critic`."""
        return 1.0 if self.in_value_pretraining else self.args.lam_critic

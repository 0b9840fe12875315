"""PPOTrainer on current TRL: rollout → advantages → PPO epochs, with `compute_advantages` as the seam for subclasses.

This file is the loop: construction, `train`, `training_update`, `ppo_update`, the hooks subclasses override, and the
value-pretraining phase with the count of updates it implies. Each other concern has one home, mixed into the class
or called from it: building and readying the trainer (`trainer_setup`), prompts to scored samples, shared with
evaluation (`scoring`), the rollout's forwards and per-token rewards (`rollout_forwards`), the optimizer step
(`optimization`), `evaluate` (`evaluation`), saving and resuming (`trainer_saving`); the micro-batch loss is
`ppo_loss`, the metrics `trainer_metrics`.
"""

from __future__ import annotations

import os
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from accelerate.utils import is_peft_model, set_seed
from datasets import Dataset
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PrinterCallback,
    ProgressCallback,
    TrainerCallback,
)
from transformers.trainer_utils import (
    PREFIX_CHECKPOINT_DIR,
    IntervalStrategy,
    enable_full_determinism,
)
from transformers.utils import is_peft_available, logging
from trl.trainer.base_trainer import _BaseTrainer

from .config import PPOConfig
from .diagnostics import marker_token_ids
from .distributed import check_deepspeed_setup, check_launch_environment, micro_batch_context
from .evaluation import EvaluationMixin
from .gae import gae
from .generation import SamplerError, neutralised_generation_fields
from .loading import build_critic, load_policy, load_reward_funcs, load_tokenizer, resolve_stop_token_ids
from .optimization import NonFiniteTrainingError, OptimizationMixin, role_prefix
from .output import quiet_replica
from .ppo_loss import PPOBatch, PPOLossSettings, mean_metrics, ppo_micro_batch_loss
from .preemption import SignalWatcher, TrainingInterrupted, agreed_signal
from .progress import CompactPrinterCallback, RolloutProgressCallback
from .rollout import PolicyAndValueModel, Rollout, reward_func_name
from .rollout_forwards import RolloutMixin
from .scoring import ScoredSamples, ScoringMixin
from .trainer_metrics import print_samples, rollout_metrics, sampling_metrics, trl_metric_names, update_metrics
from .trainer_saving import SavingMixin
from .trainer_setup import SetupMixin, check_dataset, prepare_models, reference_model, reward_weights

if is_peft_available():
    from peft import PeftConfig

# The public names of this module, some now defined in the modules the trainer is made of (imports and pickles that
# name `vcppo_trl.ppo_trainer` or the `vcppo_trl.trainer` shim keep working).
__all__ = ["NonFiniteTrainingError", "PPOTrainer", "RewardFunc", "ScoredSamples", "role_prefix"]

logger = logging.get_logger(__name__)

RewardFunc = str | PreTrainedModel | Callable[..., list[float | None]]


class PPOTrainer(
    SetupMixin, ScoringMixin, RolloutMixin, OptimizationMixin, EvaluationMixin, SavingMixin, _BaseTrainer
):
    """
    Proximal Policy Optimization with a learned critic, for prompt datasets and rule-based or model-based rewards.

    One update: generate responses for a batch of prompts → cut them at the stop token → score them (reward on the
    last response token, `missing_eos_penalty` when no stop token) → critic values → reference log-probabilities and a
    per-token KL penalty when `kl_coef > 0` → advantages and returns ([`compute_advantages`]) → `num_ppo_epochs ×
    num_mini_batches` optimizer steps of clipped policy loss plus `vf_coef ×` clipped value loss → metrics.

    Args:
        model (`str` or `PreTrainedModel`): The policy: a causal LM or its name/path.
        reward_funcs (callable, `str`, `PreTrainedModel`, or a list of them): Reward functions with TRL's protocol
            (`f(prompts, completions, completion_ids, **columns) -> list[float | None]`), or sequence-classification
            reward models (or their names/paths). Their weighted sum is the score of a response.
        args ([`PPOConfig`], *optional*): Training configuration.
        train_dataset (`Dataset`): Rows with a `prompt` column (text, or a list of chat messages). Other columns
            (e.g. `solution`) are passed to the reward functions as keyword arguments.
        eval_dataset (`Dataset`, *optional*): Same format; used by [`evaluate`].
        processing_class (`PreTrainedTokenizerBase`, *optional*): The policy's tokenizer. Loaded from the model when
            omitted.
        value_model (`str` or `PreTrainedModel`, *optional*): The critic. `None` builds one from the policy's weights
            with a fresh scalar head; a path or model is loaded (a token-classification checkpoint with
            `num_labels=1`, or a sequence-classification reward model to reproduce the paper's PPO baseline).
        ref_model (`PreTrainedModel`, *optional*): Reference policy for the KL penalty; only used when
            `kl_coef > 0`. Defaults to a frozen copy of the initial policy (or the base model with adapters
            disabled under PEFT).
        reward_processing_classes (tokenizer or list, *optional*): Tokenizers of reward models given as objects.
        callbacks (`list[TrainerCallback]`, *optional*): Extra callbacks.
        optimizers (`tuple`, *optional*): `(optimizer, lr_scheduler)` to use instead of the default AdamW with one
            parameter group per model (policy at `learning_rate`, critic at `value_learning_rate`).
        peft_config (`PeftConfig`, *optional*): LoRA (or other PEFT) configuration for the policy.
        value_peft_config (`PeftConfig` or `dict`, *optional*): LoRA for the critic (default: `args.value_peft_config`);
            its scalar head is trained fully (`modules_to_save`). A LoRA critic is saved as a PEFT adapter.
    """

    _tag_names = ["trl", "ppo", "vcppo-trl"]
    _name = "PPO"
    _config_class = PPOConfig

    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs: RewardFunc | list[RewardFunc],
        args: PPOConfig | None = None,
        train_dataset: Dataset | None = None,
        eval_dataset: Dataset | None = None,
        processing_class: PreTrainedTokenizerBase | None = None,
        value_model: str | PreTrainedModel | None = None,
        ref_model: PreTrainedModel | None = None,
        reward_processing_classes: PreTrainedTokenizerBase | list[PreTrainedTokenizerBase] | None = None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers: tuple[torch.optim.Optimizer | None, torch.optim.lr_scheduler.LambdaLR | None] = (None, None),
        peft_config: PeftConfig | None = None,
        value_peft_config: PeftConfig | dict | None = None,
    ):
        model_id = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
        if args is None:
            args = self._config_class(output_dir=f"{str(model_id).split('/')[-1] or 'model'}-{self._name}")
        if not isinstance(args, PPOConfig):
            raise TypeError(f"`args` must be a PPOConfig (or VCPPOConfig), got {type(args).__name__}.")
        quiet_replica(args.process_index)  # warnings once per job, from the first process
        check_launch_environment()
        # Seed before anything draws from the RNG (the critic's fresh scalar head, LoRA matrices), as `Trainer` does.
        enable_full_determinism(args.seed) if args.full_determinism else set_seed(args.seed)
        check_dataset(train_dataset, "train_dataset", required=True)
        check_dataset(eval_dataset, "eval_dataset", required=False)

        policy = load_policy(model, args)
        tokenizer = load_tokenizer(processing_class, policy)
        self.stop_token_ids = resolve_stop_token_ids(args, tokenizer)
        self.end_of_thinking_ids = marker_token_ids(tokenizer, args.end_of_thinking_marker)
        critic = build_critic(value_model, policy, tokenizer, args)
        policy, critic = prepare_models(policy, critic, args, peft_config, value_peft_config)
        self.ref_model = reference_model(policy, ref_model, args)
        # Whether KL(policy ‖ reference) is exactly 0 while the policy is frozen (value pretraining).
        self.reference_is_initial_policy = ref_model is None and not is_peft_model(policy)

        self.reward_funcs, self.reward_processing_classes = load_reward_funcs(
            reward_funcs, reward_processing_classes, args
        )
        self.reward_func_names = [reward_func_name(f) for f in self.reward_funcs]
        self.reward_weights = reward_weights(args, len(self.reward_funcs))
        train_dataset, eval_dataset = self._prepare_datasets(train_dataset, eval_dataset, tokenizer, args)

        if args.ddp_find_unused_parameters is None:
            # Value-only updates leave the policy out of the graph.
            args.ddp_find_unused_parameters = True

        super().__init__(
            model=PolicyAndValueModel(policy, critic),
            args=args,
            data_collator=lambda rows: rows,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=tokenizer,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        if self.is_fsdp_enabled:
            raise ValueError(
                "FSDP is not supported by this version of vcppo-trl yet: launch with DeepSpeed ZeRO-3 "
                "(configs/accelerate/zero3.yaml), DDP (multi_gpu.yaml) or a single device."
            )
        if self.is_deepspeed_enabled:
            check_deepspeed_setup(self)
        if self.accelerator.num_processes > 1:
            # With one seed every rank would sample the same tokens (correlated rollouts); the prompt order does not
            # depend on this RNG (see `_prompt_batches`), so offsetting it per rank keeps the ranks' prompts disjoint.
            set_seed(args.seed, device_specific=True)
        self.remove_callback(ProgressCallback)
        self.remove_callback(PrinterCallback)
        self.add_callback(CompactPrinterCallback if args.disable_tqdm else RolloutProgressCallback)

        self._prepare_auxiliary_models()
        self._compute_batch_sizes()
        ignored = neutralised_generation_fields(policy)
        if ignored and self.is_world_process_zero():
            logger.warning(
                "The policy's generation_config sets "
                + ", ".join(f"{k}={v!r}" for k, v in sorted(ignored.items()))
                + f": PPO does not apply them. Rollouts sample at temperature={args.temperature} with no other logits "
                "processing, the distribution the policy-gradient ratio and the training log-probabilities assume."
            )
        self.latest_metrics: dict[str, float] = {}
        # The value-pretraining phase, this trainer's alone (see `begin_value_pretraining`); saved in checkpoints.
        self._value_pretraining = False
        self._value_pretrain_updates: int | None = None  # the updates the phase ran, once it has ended
        self.nonfinite_steps_in_a_row = 0
        self._generation_log: list[tuple[float, int]] = []  # (seconds, tokens) of each generation in an update
        self.sampler = self._build_sampler(policy)

    # ------------------------------------------------- what subclasses change

    def optimizer_steps_per_update(self) -> int:
        return self.args.num_ppo_epochs * self.args.num_mini_batches

    def num_value_pretrain_updates(self) -> int:
        """Value-pretraining updates planned for this run (at most; 0 for plain PPO)."""
        return 0

    def compute_advantages(self, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
        """
        The seam where a subclass changes how advantages are made.

        Returns:
            `(advantages, returns)`, both `[B, T]`: raw (not whitened) advantages for the policy and regression
            targets for the critic. [`PPOTrainer`] uses single-λ GAE with `lam`.
        """
        return gae(rollout.rewards, rollout.values, rollout.response_mask, self.args.gamma, self.args.lam)

    def value_cliprange(self) -> float | None:
        """Clip range of the value loss for the current update (`None`: no clipping); subclasses vary it by phase."""
        return self.args.cliprange_value

    # ---------------------------------------------------- value-pretraining phase

    @property
    def in_value_pretraining(self) -> bool:
        """Whether updates train the critic alone, on rollouts of the frozen policy (the policy's lr reads 0)."""
        return self._value_pretraining

    def num_training_updates(self) -> int:
        """
        Rollout batches this run uses: the PPO updates plus the value-pretraining ones, those planned until the phase
        ends and those it ran after (unused pretraining updates are not given to PPO). `state.max_steps` is this.
        """
        ran = self._value_pretrain_updates
        return self.num_ppo_updates + (self.num_value_pretrain_updates() if ran is None else ran)

    def begin_value_pretraining(self) -> None:
        """Freeze the policy from the next update on (called at the start of training; resuming inside the phase
        finds it begun)."""
        if self._value_pretrain_updates is not None:
            raise RuntimeError(f"Value pretraining already ended after {self._value_pretrain_updates} updates.")
        self._value_pretraining = True

    def end_value_pretraining(self, updates: int) -> None:
        """
        End value pretraining after `updates` updates: PPO starts at the next update, from a fresh optimizer state for
        the policy, and the run shrinks by the unused pretraining updates.
        """
        if not self._value_pretraining:
            raise RuntimeError("end_value_pretraining() called outside value pretraining.")
        self._value_pretraining = False
        self._value_pretrain_updates = updates
        self.state.max_steps = self.num_training_updates()
        self._reset_policy_optimizer_state()
        self.log({"value_pretrain/steps": float(updates)})

    # --------------------------------------------------------------- updating

    def ppo_update(
        self, rollout: Rollout, advantages: torch.Tensor, returns: torch.Tensor, train_policy: bool = True
    ) -> dict[str, float]:
        """
        `num_ppo_epochs × num_mini_batches` optimizer steps over one rollout.

        Each micro-batch's loss is its token (or sequence) sum divided by the count of the whole mini-batch across all
        micro-batches and processes (`loss_type`, `value_loss_type`), so the gradient of a mini-batch does not depend
        on how it is split. With `train_policy=False` only the value loss is optimised and the policy's parameters get
        no gradient and no optimizer step (their learning rate is also held at exactly 0, so no weight decay touches
        them).
        """
        args = self.args
        model = self.model_wrapped
        model.train()
        mask = rollout.response_mask
        adv = self.whiten(advantages, mask) if train_policy else advantages
        settings = PPOLossSettings.from_args(args, self.value_cliprange())
        input_ids, attention_mask = rollout.input_ids, rollout.attention_mask
        # On-policy shortcut: the old log-probs are this update's own forward, detached (ratio exactly 1), written
        # into the batch's tensor before each micro-batch's loss reads them.
        fill_old_logprobs = train_policy and rollout.logprobs is None
        old_logprobs = rollout.logprobs
        if fill_old_logprobs:
            old_logprobs = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        # vLLM sampled the rollout: weight the policy loss by π_train/π_sampler of the sampled tokens (see
        # `losses.sampler_importance_weights`). Under the on-policy shortcut the "old" log-probs are this forward's.
        correct_sampler = args.vllm_importance_sampling_correction
        batch = PPOBatch(
            mask, rollout.values, returns, adv, old_logprobs, rollout.sampler_logprobs if correct_sampler else None
        )
        stats = defaultdict(list)
        nonfinite_steps = 0
        world = self.accelerator.num_processes
        for _ in range(args.num_ppo_epochs):
            order = torch.randperm(input_ids.shape[0], device=input_ids.device)
            for mb_idx in order.split(self.local_mini_batch_size):
                if not train_policy:  # before the backward passes: DeepSpeed steps inside the last one
                    self._set_policy_lr_to_zero()
                micro_batches = list(mb_idx.split(args.per_device_train_batch_size))
                pg_norm, vf_norm = self._loss_normalizers(mask[mb_idx])
                # DDP and DeepSpeed average gradients over processes (× world undoes it: the normaliser is global);
                # DeepSpeed also divides by its gradient_accumulation_steps (== len(micro_batches)).
                scale = world * (len(micro_batches) if self.is_deepspeed_enabled else 1)
                vf_total = pg_total = 0.0
                for i, idx in enumerate(micro_batches):
                    # Gradient accumulation over the micro-batches of one minibatch; DDP syncs on the last one only.
                    with micro_batch_context(self, model, is_last=i == len(micro_batches) - 1):
                        logprobs, entropy, vpred = model(
                            input_ids[idx],
                            attention_mask[idx],
                            rollout.context_length,
                            args.temperature,
                            compute_policy=train_policy,
                        )
                        if fill_old_logprobs:
                            old_logprobs[idx] = logprobs.detach().float()
                        out = ppo_micro_batch_loss(
                            settings, batch.select(idx), logprobs, entropy, vpred, pg_norm, vf_norm
                        )
                        self.accelerator.backward(out.loss * scale)
                    for name, value in out.metrics().items():
                        stats[name].append(value)
                    vf_total = vf_total + out.value.loss.detach() * world
                    if train_policy:
                        pg_total = pg_total + out.policy.loss.detach() * world
                # This process's share of the mini-batch loss, × world: its mean over processes is the global loss.
                stats["loss/value"].append(vf_total)
                if train_policy:
                    stats["loss/policy"].append(pg_total)
                grad_norms = self._optimizer_step(model)
                if grad_norms is None:
                    nonfinite_steps += 1
                else:
                    for name, value in grad_norms.items():
                        stats[name].append(value)
        if fill_old_logprobs:
            rollout.logprobs = old_logprobs
        return mean_metrics(stats) | {"diagnostics/nonfinite_steps": float(nonfinite_steps)}

    # ------------------------------------------------------------------- loop

    def _should(self, interval: float | int, strategy) -> bool:
        if strategy not in (IntervalStrategy.STEPS, "steps") or not interval:
            return False
        step = self.state.global_step
        every = interval if interval >= 1 else max(1, int(interval * self.state.max_steps))
        return step % int(every) == 0

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        """
        Run the whole training: `num_training_updates()` rollout-and-update cycles.

        On SIGTERM or SIGINT the running update is finished, a checkpoint is saved and [`TrainingInterrupted`] is
        raised (its message names the checkpoint).

        Args:
            resume_from_checkpoint (`str` or `bool`, *optional*): A `checkpoint-<step>` directory, or `True` for the
                latest one in `output_dir`. Training continues exactly where it stopped: weights, optimizer, scheduler,
                RNG states, the update counter, the position in the data, and the value-pretraining phase.
        """
        args = self.args
        checkpoint = self._resolve_checkpoint(resume_from_checkpoint)
        if checkpoint is not None:
            self._load_checkpoint_weights(checkpoint)
        self._setup_training()
        if checkpoint is not None:
            self._restore_training_state(checkpoint)
        prompt_batches = self._prompt_batches(start=self.state.global_step)
        self.sampler.mark_stale()  # the sampler starts from the weights training starts from (resumed ones included)
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        if self.args.use_vllm:  # 0 when this process's engine was started by an earlier trainer and reused
            self.log({"time/sampler_start_s": self.sampler.start_seconds})
        if checkpoint is None:
            data_metrics = {k: v for name, r in self.data_reports.items() for k, v in r.metrics(name).items()}
            if data_metrics:
                self.log(data_metrics)
            if args.eval_on_start and self.eval_dataset is not None:
                self.evaluate()
        start_time = time.time()
        sample_every = (
            max(1, self.state.max_steps // args.num_sample_generations) if args.num_sample_generations > 0 else 0
        )
        with SignalWatcher() as signals:
            while self.state.global_step < self.state.max_steps:
                self.control = self.callback_handler.on_step_begin(args, self.state, self.control)
                rows = next(prompt_batches)
                try:
                    metrics = self.training_update(rows)
                except SamplerError as err:
                    raise self._sampler_failed(err) from err
                self.state.global_step += 1
                self.state.epoch = self.state.global_step * self.prompts_per_update / len(self.train_dataset)
                metrics["episode"] = self.state.global_step * self.batch_size
                metrics["lr"] = self._learning_rate("policy")
                metrics["value_lr"] = self._learning_rate("value")
                metrics["time/update_s"] = time.time() - self._update_start
                self.latest_metrics = metrics
                self.control = self.callback_handler.call_event(
                    "on_step_end", args, self.state, self.control, metrics=metrics
                )
                if self._should(args.logging_steps, args.logging_strategy) or self.control.should_log:
                    self.log(dict(metrics))
                    self.control.should_log = False
                if sample_every and self.state.global_step % sample_every == 0 and self.is_world_process_zero():
                    print_samples(*self._last_rollout, self.reward_func_names, self.state.global_step)
                if self.eval_dataset is not None and self._should(args.eval_steps, args.eval_strategy):
                    self.evaluate()
                saved = self._should(args.save_steps, args.save_strategy)
                if saved:
                    self._save_checkpoint(self.model, trial=None)
                signum = agreed_signal(self.accelerator, signals.signum)
                if signum is not None:
                    if not saved:
                        self._save_checkpoint(self.model, trial=None)
                    path = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
                    raise TrainingInterrupted(
                        f"Training stopped by {signal.Signals(signum).name} after update {self.state.global_step}; "
                        f"checkpoint saved to {path}. Resume with trainer.train(resume_from_checkpoint={path!r}) "
                        "(or --resume_from_checkpoint with train.py).",
                        signum,
                        path,
                    )
                if self.control.should_training_stop:
                    break
        self.state.total_flos = 0
        self.log({"train_runtime": time.time() - start_time})
        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        return self.state

    def training_update(self, rows: list[dict[str, Any]]) -> dict[str, float]:
        """One rollout and the PPO epochs on it; returns the update's metrics."""
        self._update_start = time.time()
        self._generation_log = []
        train_policy = not self.in_value_pretraining
        if train_policy:
            self._start_policy_schedule()
        rollout = self.make_rollout(rows, train_policy=train_policy)
        advantages, returns = self.compute_advantages(rollout)
        prefix = "" if train_policy else "value_pretrain/"
        metrics = rollout_metrics(
            self.accelerator,
            self.args,
            rollout,
            advantages,
            returns,
            self.end_of_thinking_ids,
            self.reward_func_names,
            prefix=prefix,
        )
        valid_tokens = self.accelerator.reduce(rollout.response_mask.sum().reshape(1), "sum")
        if int(valid_tokens) == 0:
            # Every sample was skipped (no reward function applied): an update would train on nothing.
            logger.warning(f"Update {self.state.global_step + 1}: no sample could be scored; skipping the update.")
            metrics["diagnostics/skipped_update"] = 1.0
            self._last_rollout = (rollout, advantages)
            return metrics
        update_stats = self.ppo_update(rollout, advantages, returns, train_policy=train_policy)
        if train_policy:
            self.sampler.mark_stale()  # the next generation loads the updated weights first (once per update)
        sync_seconds = getattr(self.sampler, "sync_seconds", None)
        metrics.update(sampling_metrics(self.accelerator, self.args, rollout, self._generation_log, sync_seconds))
        metrics.update(update_metrics(self.accelerator, update_stats, train_policy))
        metrics.update(trl_metric_names(self.accelerator, rollout, metrics))
        self._last_rollout = (rollout, advantages)
        return metrics

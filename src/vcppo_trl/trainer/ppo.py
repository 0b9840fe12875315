"""PPOTrainer on current TRL: the parts it holds (see `training_update`): the rollout source (`rollout/sources.py`,
over the rollout maker `rollout/maker.py`), `compute_advantages` (by the estimator the config names), the learner
(`learner/ppo_learner.py`) and the metrics (`trainer/metrics.py`). A subclass adds a phase through the seams
`trains_policy`, `critic_only_updates`, `num_training_updates`, `phase_state` and the `before_training`/`after_update`
hooks (VC-PPO's value pretraining: `trainer/vcppo.py`). Construction: `trainer/model_setup.py`; loop and cadence:
`trainer/loop.py`; saving and resuming: `trainer/saving.py`, `trainer/resuming.py` (thin overrides at the end)."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import torch
from accelerate.utils import is_peft_model
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase, PrinterCallback, ProgressCallback, TrainerCallback
from transformers.trainer_callback import ExportableState, TrainerControl
from transformers.utils import is_peft_available, logging
from trl.trainer.base_trainer import _BaseTrainer

from ..algo.diagnostics import marker_token_ids
from ..checkpoint import HubSettings
from ..config.batch_plan import plan_batches
from ..config.ppo import PPOConfig
from ..learner.ppo_learner import PPOLearner
from ..learner.settings import LearnerSettings
from ..models.loading import resolve_stop_token_ids
from ..models.policy_and_value import PolicyAndValueModel
from ..rewards.reward_models import reward_func_name
from ..rollout import Rollout, RolloutSource, SourceSettings, build_rollout_source
from . import advantages, loop, model_setup, sampler_setup
from . import saving as trainer_saving
from .console import CompactPrinterCallback, RolloutProgressCallback
from .evaluation import EvaluationSettings, evaluation_metrics
from .learner_metrics import learner_metrics
from .metrics import MetricSettings, UpdateRecord, rollout_metrics
from .optimization import build_optimizer, build_scheduler
from .prompts import PromptStream

if is_peft_available():
    from peft import PeftConfig

__all__ = ["PPOTrainer", "RewardFunc"]

logger = logging.get_logger(__name__)

RewardFunc = str | PreTrainedModel | Callable[..., list[float | None]]


class PPOTrainer(_BaseTrainer):
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
        rollout_func (`Callable`, *optional*): TRL's `rollout_func(prompts, trainer) -> dict`, which samples in
            place of the trainer's sampler (`prompt_ids`, `completion_ids`, `logprobs`, an optional `env_mask` whose 0s
            mark tool or environment tokens, other keys to the reward functions; see
            [`~episodes.rollout_function`]).
        tools (`list[Callable]`, *optional*): TRL's tools: functions (sync or `async def`) the policy calls between
            its turns, in episodes sampled by the trainer's sampler; their results are context, never actions
            ([`~episodes.tool_loop`], docs/tools_and_environments.md). Conversational prompts only.
        environment_factory (`Callable` or `dict[str, Callable]`, *optional*): TRL's: an environment per episode, whose
            methods are tools and `get_reward()` a reward source ([`~episodes.environments`]).
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
        rollout_func: sampler_setup.RolloutFunc | None = None,
        tools: list[Callable] | None = None,
        environment_factory: Callable | dict[str, Callable] | None = None,
    ):
        args = model_setup.checked_args(args, model, config_class=self._config_class, trainer_name=self._name)
        model_setup.prepare_process(args)
        model_setup.check_datasets(train_dataset, eval_dataset)
        sampler_setup.check_rollout_func(args, rollout_func, tools=tools, environment_factory=environment_factory)
        built = model_setup.build_models(
            model,
            args,
            value_model=value_model,
            ref_model=ref_model,
            processing_class=processing_class,
            peft_config=peft_config,
            value_peft_config=value_peft_config,
        )
        policy, critic, reference, tokenizer = built.policy, built.critic, built.reference, built.tokenizer
        self.initial_policy = built.initial_policy  # who the critic was built beside, in a critic job (no policy)
        self.stop_token_ids = resolve_stop_token_ids(tokenizer, stop_token_id=args.stop_token_id)
        self.end_of_thinking_ids = marker_token_ids(tokenizer, args.end_of_thinking_marker)
        reward_funcs, reward_processing_classes, environments = sampler_setup.rewards_and_environments(
            reward_funcs, reward_processing_classes, args, tools=tools, environment_factory=environment_factory
        )
        self.reward_func_names = [reward_func_name(f) for f in reward_funcs]
        train_dataset, eval_dataset, self.data_reports = model_setup.prepare_datasets(
            train_dataset,
            eval_dataset,
            tokenizer,
            args=args,
            reward_funcs=reward_funcs,
            rollout_func_keys=rollout_func is not None or bool(tools) or environments is not None,
        )

        # DDP finds unused parameters (value-only updates leave the policy out) for a model not a `PreTrainedModel`.
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
        self.is_fsdp2 = model_setup.check_launch(self.accelerator, args, is_deepspeed=self.is_deepspeed_enabled)
        for old in (ProgressCallback, PrinterCallback):  # one console line per update instead
            self.remove_callback(old)
        self.add_callback(CompactPrinterCallback if args.disable_tqdm else RolloutProgressCallback)

        for_inference = functools.partial(model_setup.prepare_for_inference, accelerator=self.accelerator)
        self.ref_model = None if reference is None else for_inference(reference, shard=self.is_fsdp2)
        self.reward_funcs = [for_inference(f) if isinstance(f, PreTrainedModel) else f for f in reward_funcs]
        main = self.is_world_process_zero()
        self.batches = plan_batches(args, self.accelerator.num_processes, len(self.train_dataset), warn=main)
        if main and policy is not None:
            sampler_setup.warn_about_generation_config(policy, args)
        self.latest_metrics: dict[str, float] = {}
        self.learner: PPOLearner | None = None  # built by `_setup_training`, on the prepared model and optimizer
        self.last_update: UpdateRecord | None = None  # for the sample printout and the value-pretraining rule
        self.prompts: PromptStream | None = None  # this process's prompt batches, from `train`
        self.rollouts: RolloutSource | None = None  # where each update's rollout comes from, from `train`

        # One sequence-parallel group (None without one), shared by the rollout's forwards and the learner's.
        self.sequence_group = model_setup.build_sequence_group(args, self.model, ref_model=self.ref_model)
        # The maker forwards the prepared model; it skips the KL (exactly 0) of a frozen policy to the initial one.
        self.rollout_maker = sampler_setup.build_rollout_maker(
            args,
            self.accelerator,
            tokenizer=tokenizer,
            stop_token_ids=self.stop_token_ids,
            policy=policy,
            current_model=lambda: self.model_wrapped,
            ref_model=self.ref_model,
            reference_is_initial_policy=ref_model is None and (policy is None or not is_peft_model(policy)),
            reward_funcs=self.reward_funcs,
            reward_processing_classes=reward_processing_classes,
            datasets=[self.train_dataset, self.eval_dataset],
            sequence_group=self.sequence_group,
            rollout_function=None if rollout_func is None else lambda prompts: rollout_func(prompts, self),
            tools=tools,
            environments=environments,
        )

    @property
    def sampler(self):
        """The generation backend (HF `generate` or vLLM); `trainer.sampler.close()` frees a vLLM engine."""
        return self.rollout_maker.sampler

    @property
    def num_ppo_updates(self) -> int:
        return self.batches.num_ppo_updates

    # ------------------------------------------------- what subclasses change

    def optimizer_steps_per_update(self) -> int:
        return self.args.num_ppo_epochs * self.args.num_mini_batches

    def trains_policy(self) -> bool:
        """Whether the next update trains the policy (always in PPO; not in [`VCPPOTrainer`]'s value pretraining).
        An update that does not leaves the policy out of the optimizer's step and logs its learning rate as 0."""
        return True

    def critic_only_updates(self) -> int:
        """Updates planned before the policy's first, in which only the critic trains (0 in PPO; VC-PPO's value
        pretraining): the critic's learning rate has its own schedule over them, and both PPO schedules start after them."""
        return 0

    def num_training_updates(self) -> int:
        """Rollout batches of this run (`state.max_steps`): the PPO updates, and in a subclass its phase's."""
        return self.num_ppo_updates

    def phase_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of a subclass's phases, in `vcppo_state.json` (nothing in PPO)."""
        return {}

    def restore_phase_state(self, saved: dict[str, Any]) -> None:
        """Restore a subclass's phases from a checkpoint's training state, after the callbacks' states."""

    def compute_advantages(self, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`(advantages, returns)`, raw (not whitened) `[B, T]` advantages for the policy and the critic's targets
        (`None` without a critic), by the estimator `advantage_estimator` names (`trainer/advantages.py`), with this
        update's [`actor_lambda`] and [`critic_lambda`]."""
        made = advantages.compute_advantages(
            rollout,
            self.args,
            self.accelerator,
            lam_actor=self.actor_lambda(rollout.action_tokens),
            lam_critic=self.critic_lambda(),
        )
        return made.advantages, made.returns

    def build_rollout_source(self, draw: Callable[[], list[dict[str, Any]]]) -> RolloutSource:
        """This run's source of rollouts ([`~rollout.sources.build_rollout_source`]), drawing prompt rows with `draw`.
        [`VCPPOTrainer`] composes value pretraining's stored rollouts in front of it when it begins the phase."""
        return build_rollout_source(
            SourceSettings.from_args(self.args),
            self.rollout_maker,
            draw=draw,
            policy=lambda: self.unwrapped_policy_and_critic()[0],
            local_batch_size=self.batches.local_batch_size,
        )

    def critic_lambda(self) -> float:
        """The λ of the critic's targets that [`compute_advantages`] gives in the current update (the metrics reuse
        targets computed with λ = 1 as the Monte-Carlo returns); subclasses that change one change both."""
        return self.args.lam

    def actor_lambda(self, action_tokens: torch.Tensor) -> float | torch.Tensor:
        """GAE's λ of the policy's advantages in the current update: `lam` in PPO (subclasses decouple it)."""
        return self.args.lam

    def value_cliprange(self) -> float | None:
        """Clip range of the value loss for the current update (`None`: no clipping); subclasses vary it by phase."""
        return self.args.cliprange_value

    def before_training(self) -> None:
        """Called when training starts or resumes, before the callbacks' `on_train_begin`; [`VCPPOTrainer`] begins
        its value-pretraining phase here."""

    def after_update(self, metrics: dict[str, float]) -> None:
        """Called after each update with its metrics, before the callbacks see them; [`VCPPOTrainer`] runs its
        value-pretraining phase here."""

    # ------------------------------------------------------------------- loop

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        """Run the whole training: `num_training_updates()` rollout-and-update cycles (`trainer/loop.py`). On SIGTERM
        or SIGINT the running update is finished, a checkpoint is saved and [`TrainingInterrupted`] is raised.

        Args:
            resume_from_checkpoint (`str` or `bool`, *optional*): A `checkpoint-<step>` directory, or `True` for the
                latest one in `output_dir`. Training continues exactly where it stopped: weights, optimizer, scheduler,
                RNG states, the update counter, the position in the data, and the value-pretraining phase.
        """
        return loop.run(self, resume_from_checkpoint)

    @property
    def batches_consumed(self) -> int:
        """Prompt batches drawn so far: one per update, more under dynamic sampling (saved in checkpoints)."""
        return self.prompts.consumed if self.prompts is not None else 0

    def training_update(self) -> dict[str, float]:
        """One rollout from the rollout source (`self.rollouts`, built by `train`) and the PPO epochs on it; returns
        the update's metrics."""
        self._update_start = time.time()
        train_policy = self.trains_policy()
        if train_policy:
            self.learner.steps.start_policy_schedule()
        rollout, made = self.rollouts.next(train_policy, self.state)
        advantages, returns = self.compute_advantages(rollout)
        metric_settings = MetricSettings.from_args(self.args)
        metrics = rollout_metrics(
            self.accelerator,
            metric_settings,
            rollout,
            advantages=advantages,
            returns=returns,
            end_of_thinking_ids=self.end_of_thinking_ids,
            reward_func_names=self.reward_func_names,
            prefix="" if train_policy else "value_pretrain/",
            returns_are_monte_carlo=self.critic_lambda() == 1.0,
        )
        if int(self.accelerator.reduce(rollout.response_mask.sum().reshape(1), "sum")) == 0:
            # Every sample was skipped (no reward function applied): an update would train on nothing.
            logger.warning(f"Update {self.state.global_step + 1}: no sample could be scored; skipping the update.")
            metrics["diagnostics/skipped_update"] = 1.0
            self.last_update = UpdateRecord(rollout, advantages, returns, result=None)
            return metrics
        result = self.learner.update(
            rollout,
            advantages,
            returns,
            train_policy=train_policy,
            value_cliprange=self.value_cliprange(),
            update_index=self.state.global_step + 1,
        )
        if result.old_logprobs is not None:  # the on-policy shortcut: the learner's forward gave them
            rollout = dataclasses.replace(rollout, logprobs=result.old_logprobs)
        if train_policy:
            self.rollouts.after_policy_step()  # later generations sample from the updated weights
        metrics.update(
            learner_metrics(
                self.accelerator,
                metric_settings,
                rollout,
                made=made,
                result=result,
                train_policy=train_policy,
                rollout_side=metrics,
            )
        )
        self.last_update = UpdateRecord(rollout, advantages, returns, result=result)
        return metrics

    def _learning_rate(self, role: str) -> float:
        """Current learning rate of the policy or the critic (0 for the policy while it is frozen)."""
        return 0.0 if role == "policy" and not self.trains_policy() else self.learner.steps.learning_rate(role)

    # ------------------------------------------------ setup, optimizer, resume

    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        """AdamW (or `args.optim`) with separate parameter groups for the policy and the critic."""
        if self.optimizer is None:
            self.optimizer = build_optimizer(self, self.model if model is None else model, self.args)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        """`lr_scheduler_type` with one clock per model (see [`~learner.optimizers.role_scheduler`])."""
        if self.lr_scheduler is None:
            per_update = self.optimizer_steps_per_update()
            self.lr_scheduler = build_scheduler(
                optimizer or self.optimizer,
                self.args,
                ppo_steps=self.num_ppo_updates * per_update,
                pretrain_steps=self.critic_only_updates() * per_update,
            )
        return self.lr_scheduler

    def _setup_training(self) -> None:
        """The optimizer, scheduler and prepared model that `train` starts from, the learner on them, a fresh state."""
        args = self.args
        steps = self.num_training_updates() * self.optimizer_steps_per_update()
        self.model_wrapped, self.optimizer = model_setup.prepare_for_training(
            self.accelerator,
            self.model,
            fsdp2=self.is_fsdp2,
            create_optimizer=lambda: self.create_optimizer_and_scheduler(num_training_steps=steps) or self.optimizer,
        )
        if self.is_deepspeed_enabled:
            self.deepspeed = self.model_wrapped
        self.learner = PPOLearner(
            self.model_wrapped,
            self.optimizer,
            lr_scheduler=self.lr_scheduler,
            accelerator=self.accelerator,
            settings=LearnerSettings.from_args(args),
            is_deepspeed=self.is_deepspeed_enabled,
            local_mini_batch_size=self.batches.local_mini_batch_size,
            sequence_group=self.sequence_group,
            epoch_rows=model_setup.epoch_rows(args, self.accelerator, self.sequence_group),
        )
        stateful = [cb for cb in self.callback_handler.callbacks + [self.control] if isinstance(cb, ExportableState)]
        self.state = model_setup.new_trainer_state(
            args, stateful, self.num_training_updates(), batch_size=self.batches.batch_size
        )
        self.state.is_local_process_zero = self.is_local_process_zero()
        self.state.is_world_process_zero = self.is_world_process_zero()
        self.control = TrainerControl()

    # -------------------------------------------- evaluation, saving, the Hub

    @torch.no_grad()
    def evaluate(self, eval_dataset: Dataset | None = None, ignore_keys=None, metric_key_prefix: str = "eval"):
        """Generate on held-out prompts, score with the training reward functions, and log `<prefix>_accuracy`,
        `_score`, `_response_length_mean`, `_num_samples` and, with `eval_num_generations` k > 1, `_pass@k` (see
        [`~trainer.evaluation.evaluation_metrics`]); integrations show them as `eval/accuracy`, ... Returns them."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("No evaluation dataset: pass `eval_dataset` to the trainer or to `evaluate`.")
        metrics = evaluation_metrics(
            self.rollout_maker,
            dataset,
            settings=EvaluationSettings.from_args(self.args),
            accelerator=self.accelerator,
            trainer_state=self.state,
            metric_key_prefix=metric_key_prefix,
        )
        self.log(dict(metrics))
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics=metrics)
        return metrics

    def unwrapped_policy_and_critic(self) -> tuple[PreTrainedModel, PreTrainedModel]:
        wrapper = self.accelerator.unwrap_model(self.model_wrapped)
        return wrapper.policy, wrapper.critic

    def save_value_model(self, output_dir: str, state_dict: dict | None = None) -> None:
        """Save the critic as a standard token-classification checkpoint (with the tokenizer). Call on every rank."""
        _, critic = self.unwrapped_policy_and_critic()
        trainer_saving.save_critic(
            critic, self.processing_class, self.args, output_dir=output_dir, state_dict=state_dict
        )

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Save the policy (or its adapter) and tokenizer in `output_dir`, the critic in `output_dir/value_model`."""
        policy, critic = self.unwrapped_policy_and_critic()
        trainer_saving.save_models(
            policy,
            critic,
            tokenizer=self.processing_class,
            args=self.args,
            output_dir=output_dir if output_dir is not None else self.args.output_dir,
            state_dict=state_dict,
            write_cards=self._write_cards,
        )

    def _write_cards(self, folder: str, tags: list[str] | None = None) -> None:
        trainer_saving.write_run_cards(
            self, folder, dataset_name=getattr(self, "model_card_dataset_name", None), tags=tags
        )

    def _save_checkpoint(self, model, trial=None) -> None:
        """Write `checkpoint-<step>` atomically (see [`~trainer.saving.save_trainer_checkpoint`])."""
        trainer_saving.save_trainer_checkpoint(self, self._get_output_dir(trial=trial))

    def create_model_card(
        self,
        model_name: str | None = None,
        dataset_name: str | list[str] | None = None,
        tags: str | list[str] | None = None,
        **kwargs,
    ) -> None:
        """This package's model cards in `output_dir`, the same `save_model()` and `push_to_hub()` write; see
        [`~trainer.saving.create_model_card`]."""
        trainer_saving.create_model_card(self, dataset_name=dataset_name, tags=tags)

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """Name the policy's repo; repos are created at the first push, so building the trainer needs no network."""
        self.hub_model_id = HubSettings.from_args(self.args).policy_repo
        self.push_in_progress = None

    def push_to_hub(
        self,
        commit_message: str | None = "End of training",
        blocking: bool = True,
        token: str | None = None,
        revision: str | None = None,
        private: bool | None = None,
        **kwargs,
    ):
        """Save, then push the policy to `hub_model_id` and the critic to `value_hub_model_id` (default
        `<hub_model_id>-value`), each with a model card; see [`~trainer.saving.push_trainer`]. `kwargs`: `dataset_name`, `tags`."""
        kwargs.pop("model_name", None)
        if kwargs.get("dataset_name") is not None:
            self.model_card_dataset_name = kwargs["dataset_name"]  # later saves keep naming it
        return trainer_saving.push_trainer(
            self, commit_message=commit_message or "Upload", token=token, revision=revision, private=private, **kwargs
        )

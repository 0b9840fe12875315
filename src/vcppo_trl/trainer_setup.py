"""Building a [`PPOTrainer`] and readying it to train: the models as the config asks (LoRA, dropout, activation
checkpointing, the reference policy), reward weights, dataset checks, batch arithmetic, the sampler, and the
optimizer, accelerator and state that `train` starts from.

Plain functions where only the models and the config are needed; a mixin, like [`~trainer_saving.SavingMixin`], for
the steps that read and set the trainer's state.
"""

from __future__ import annotations

import copy
import math

import torch
from accelerate.utils import is_peft_model
from datasets import IterableDataset
from transformers import PreTrainedModel, TrainerControl, TrainerState
from transformers.trainer_callback import ExportableState
from transformers.utils import is_peft_available, logging
from trl.trainer.utils import disable_dropout_in_model

from .config import PPOConfig
from .data import DataReport, prepare_prompt_dataset, prompt_token_lengths, reward_function_columns
from .generation import HFSampler
from .peft_utils import wrap_value_model
from .vllm_sampling import (
    VLLMColocateSampler,
    VLLMServerSampler,
    check_vllm_model,
    require_vllm,
    server_base_url,
    vllm_dtype,
    vllm_platform_is_cpu,
)

if is_peft_available():
    from peft import PeftConfig, get_peft_model

logger = logging.get_logger(__name__)


def check_dataset(dataset, name: str, required: bool) -> None:
    """Fail at construction on a dataset the trainer cannot use (missing, streaming, no prompts, empty)."""
    if dataset is None:
        if required:
            raise ValueError(f"`{name}` is required: a dataset with a 'prompt' column.")
        return
    if isinstance(dataset, IterableDataset):
        raise ValueError(f"`{name}` must be a map-style `datasets.Dataset`; IterableDataset is not supported yet.")
    columns = getattr(dataset, "column_names", None)
    if columns is None or "prompt" not in columns:
        raise ValueError(
            f"`{name}` must have a 'prompt' column (text or chat messages), but its columns are {columns}. "
            "Rename your prompt column, e.g. dataset.rename_column('question', 'prompt')."
        )
    if len(dataset) == 0:
        raise ValueError(f"`{name}` is empty.")


def prepare_models(
    policy: PreTrainedModel,
    critic: PreTrainedModel,
    args: PPOConfig,
    peft_config: PeftConfig | None,
    value_peft_config: PeftConfig | dict | None,
) -> tuple[PreTrainedModel, PreTrainedModel]:
    """The policy and critic as the config asks: LoRA adapters, dropout off, activation checkpointing."""
    if peft_config is not None:
        if not is_peft_available():
            raise ImportError("`peft_config` needs the `peft` package: pip install peft")
        policy = get_peft_model(policy, peft_config)
    value_peft_config = value_peft_config if value_peft_config is not None else args.value_peft_config
    if value_peft_config is not None:
        if is_peft_model(critic):
            logger.warning("The value model is already a PEFT model: `value_peft_config` is not applied.")
        else:
            critic = wrap_value_model(critic, value_peft_config)
    if args.disable_dropout:
        disable_dropout_in_model(policy)
        disable_dropout_in_model(critic)
    if args.activation_checkpointing:
        for m in (policy, critic):
            if hasattr(m, "activation_checkpointing_enable"):  # transformers ≥ 5.2's name
                m.activation_checkpointing_enable(activation_checkpointing_kwargs=args.activation_checkpointing_kwargs)
            else:
                m.gradient_checkpointing_enable(gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs)
    return policy, critic


def reference_model(
    policy: PreTrainedModel, ref_model: PreTrainedModel | None, args: PPOConfig
) -> PreTrainedModel | None:
    """The frozen reference policy, which exists only when the KL penalty is on; under PEFT it is the base model
    (adapters disabled at use), so there is none to keep."""
    if args.kl_coef > 0 and not is_peft_model(policy):
        reference = ref_model if ref_model is not None else copy.deepcopy(policy)
        reference.eval().requires_grad_(False)
        if args.disable_dropout:
            disable_dropout_in_model(reference)
        return reference
    if ref_model is not None and args.kl_coef == 0:
        logger.warning("`ref_model` was given but `kl_coef == 0`: the reference model is not used.")
    return None


def reward_weights(args: PPOConfig, num_funcs: int) -> torch.Tensor:
    """One weight per reward function: `args.reward_weights`, or all ones."""
    if args.reward_weights is None:
        return torch.ones(num_funcs)
    if len(args.reward_weights) != num_funcs:
        raise ValueError(
            f"`reward_weights` has {len(args.reward_weights)} entries but there are {num_funcs} "
            "reward functions: give one weight per function."
        )
    return torch.tensor(args.reward_weights, dtype=torch.float32)


class SetupMixin:
    """The steps of construction and of the start of `train` that need the trainer's accelerator and datasets."""

    def _prepare_datasets(self, train_dataset, eval_dataset, tokenizer, args):
        """Check the schema and drop (or count truncated) bad rows before training; see [`~data.prepare_prompt_dataset`]."""
        self.data_reports: dict[str, DataReport] = {}
        prepared = []
        for name, dataset in (("train", train_dataset), ("eval", eval_dataset)):
            if dataset is not None:
                required = reward_function_columns(self.reward_funcs, dataset.column_names)
                dataset, report = prepare_prompt_dataset(
                    dataset, f"{name}_dataset", tokenizer, required, args.max_prompt_length, args.overlong_prompt
                )
                self.data_reports[name] = report
                if report.kept < report.num_rows or report.truncated_prompts:
                    logger.warning(f"{name}_dataset: {report.summary()}.")
            prepared.append(dataset)
        return prepared

    def _build_sampler(self, policy: torch.nn.Module):
        """The generation backend (see [`~generation`]): HF `generate`, or vLLM colocate/server with `use_vllm`."""
        args = self.args
        if not args.use_vllm:
            return HFSampler(
                lambda: self.model_wrapped,
                self.accelerator,
                self.processing_class,
                self.stop_token_ids,
                args.response_length,
                args.local_rollout_forward_batch_size,
                args.ds3_gather_for_generation,
            )
        require_vllm()
        from trl.distributed import DistributedBackend

        backend = DistributedBackend(self.accelerator)
        gather = backend.gather_params

        def current_policy():
            return self.accelerator.unwrap_model(self.model_wrapped).policy

        common = (current_policy, gather, self.accelerator, self.processing_class, self.stop_token_ids)
        longest_prompt = args.max_prompt_length
        if longest_prompt is None:
            datasets = [d for d in (self.train_dataset, self.eval_dataset) if d is not None]
            longest_prompt = max(max(prompt_token_lengths(d["prompt"], self.processing_class)) for d in datasets)
        needed_length = longest_prompt + args.response_length
        if args.vllm_mode == "server":
            sampler = VLLMServerSampler(
                *common,
                args.response_length,
                base_url=server_base_url(args),
                timeout=args.vllm_server_timeout,
                group_port=args.vllm_group_port,
                needed_length=needed_length,
            )
            logger.warning(f"Rollouts are sampled by the vLLM server at {sampler.base_url}.")
            return sampler
        config = (policy.get_base_model() if is_peft_model(policy) else policy).config
        max_model_length = args.vllm_max_model_length or (
            args.max_prompt_length + args.response_length
            if args.max_prompt_length is not None
            else config.max_position_embeddings
        )
        check_vllm_model(config, max_model_length, needed_length, vllm_platform_is_cpu())
        dtype = vllm_dtype(args, policy)
        sampler = VLLMColocateSampler(
            *common,
            args.response_length,
            dtype=dtype,
            max_model_length=max_model_length,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            tensor_parallel_size=args.vllm_tensor_parallel_size,
            enable_sleep_mode=args.vllm_enable_sleep_mode,
            model_impl=args.vllm_model_impl,
            seed=args.seed,
            copy_weights=backend.is_zero3,
        )
        started = f"engine started in {sampler.start_seconds:.0f} s" if sampler.start_seconds else "engine reused"
        logger.warning(
            f"Rollouts are sampled by vLLM (colocate, {dtype}, context {max_model_length} tokens); {started}."
        )
        return sampler

    def _prepare_auxiliary_models(self) -> None:
        """Place the reference and reward models for inference (DeepSpeed-initialised under DeepSpeed)."""

        def prepare(model):
            if self.is_deepspeed_enabled:
                from trl.models import prepare_deepspeed

                return prepare_deepspeed(model, self.accelerator)
            return self.accelerator.prepare_model(model, evaluation_mode=True)

        if self.ref_model is not None:
            self.ref_model = prepare(self.ref_model)
        self.reward_funcs = [prepare(f) if isinstance(f, PreTrainedModel) else f for f in self.reward_funcs]

    def _compute_batch_sizes(self) -> None:
        """TRL's PPO batch arithmetic, checked against the dataset before any training time is spent."""
        args = self.args
        self.world_size = self.accelerator.num_processes
        self.local_batch_size = (
            args.per_device_train_batch_size * args.gradient_accumulation_steps * args.num_mini_batches
        )
        self.local_mini_batch_size = self.local_batch_size // args.num_mini_batches
        self.batch_size = self.local_batch_size * self.world_size
        k = args.num_generations
        if self.local_batch_size % k:
            raise ValueError(
                f"num_generations={k} must divide the {self.local_batch_size} sequences each process rolls out per "
                f"update (per_device_train_batch_size × gradient_accumulation_steps × num_mini_batches = "
                f"{args.per_device_train_batch_size} × {args.gradient_accumulation_steps} × {args.num_mini_batches})."
            )
        self.local_prompts_per_update = self.local_batch_size // k
        self.prompts_per_update = self.batch_size // k
        if len(self.train_dataset) < self.prompts_per_update:
            raise ValueError(
                f"One update needs batch_size = per_device_train_batch_size ({args.per_device_train_batch_size}) × "
                f"gradient_accumulation_steps ({args.gradient_accumulation_steps}) × num_mini_batches "
                f"({args.num_mini_batches}) × processes ({self.world_size}) / num_generations ({k}) = "
                f"{self.prompts_per_update} prompts, but the train dataset has only {len(self.train_dataset)} rows. "
                "Lower those settings or add data."
            )
        total_episodes = args.total_episodes or int(args.num_train_epochs * len(self.train_dataset) * k)
        self.num_ppo_updates = max(1, math.ceil(total_episodes / self.batch_size))
        self.total_episodes = total_episodes
        if total_episodes % self.batch_size and self.is_world_process_zero():
            logger.warning(
                f"total_episodes={total_episodes} is not a multiple of the {self.batch_size} "
                f"{'prompts' if k == 1 else 'responses'} per update: "
                f"rounded up to {self.num_ppo_updates} updates = {self.num_ppo_updates * self.batch_size} episodes."
            )

    def _setup_training(self) -> None:
        args = self.args
        steps = self.num_training_updates() * self.optimizer_steps_per_update()
        self.create_optimizer_and_scheduler(num_training_steps=steps)
        # The scheduler is not prepared: accelerate would step it once per process on every call.
        self.model_wrapped, self.optimizer = self.accelerator.prepare(self.model, self.optimizer)
        if self.is_deepspeed_enabled:
            self.deepspeed = self.model_wrapped
        self.state = TrainerState(
            stateful_callbacks=[
                cb for cb in self.callback_handler.callbacks + [self.control] if isinstance(cb, ExportableState)
            ],
        )
        self.state.max_steps = self.num_training_updates()
        self.state.num_train_epochs = args.num_train_epochs
        self.state.logging_steps = args.logging_steps
        self.state.eval_steps = args.eval_steps
        self.state.save_steps = args.save_steps
        self.state.is_local_process_zero = self.is_local_process_zero()
        self.state.is_world_process_zero = self.is_world_process_zero()
        self.state.train_batch_size = self.batch_size
        self.control = TrainerControl()

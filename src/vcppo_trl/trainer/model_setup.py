"""Building a [`PPOTrainer`]'s parts: the models as the config asks (LoRA, dropout, activation checkpointing, the
reference policy), dataset checks, the sequence-parallel group, the learner's rows, and models placed for inference
(what makes rollouts: [`~trainer.sampler_setup`]).

Plain functions of their inputs; the trainer calls them in its constructor and keeps what they return.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import torch
from accelerate import Accelerator
from accelerate.utils import is_peft_model, set_seed
from datasets import IterableDataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerState
from transformers.trainer_utils import enable_full_determinism
from transformers.utils import is_peft_available, logging
from trl.trainer.utils import disable_dropout_in_model

from ..config.ppo import PPOConfig
from ..learner import EpochRowSource, OwnRows, RankBalancer, SequenceGroupRows
from ..models.critic_peft import wrap_value_model
from ..models.fp32_head import cast_lm_head_to_fp32
from ..models.loading import build_critic, is_zero3_partitioned, load_policy, load_tokenizer
from ..parallel import (
    SequenceGroup,
    apply_fsdp2_activation_checkpointing,
    check_distributed_setup,
    check_launch_environment,
    setup_sequence_parallel,
    shard_with_fsdp2,
)
from .console import quiet_replica
from .prompts import (
    DataReport,
    check_reward_signatures,
    prepare_prompt_dataset,
    reward_function_columns,
)
from .store_job import policy_identity

if is_peft_available():
    from peft import PeftConfig, get_peft_model


logger = logging.get_logger(__name__)


def checked_args(args: PPOConfig | None, model, *, config_class: type, trainer_name: str) -> PPOConfig:
    """The trainer's config: `args`, or `config_class`'s defaults writing to `<model name>-<trainer_name>` when none is
    given (as TRL's trainers do); anything but a `PPOConfig` refused."""
    if args is None:
        model_id = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
        args = config_class(output_dir=f"{str(model_id).split('/')[-1] or 'model'}-{trainer_name}")
    if not isinstance(args, PPOConfig):
        raise TypeError(f"`args` must be a PPOConfig (or VCPPOConfig), got {type(args).__name__}.")
    return args


def check_datasets(train_dataset, eval_dataset) -> None:
    """[`check_dataset`] of the training set (required) and the evaluation set (optional)."""
    check_dataset(train_dataset, "train_dataset", required=True)
    check_dataset(eval_dataset, "eval_dataset", required=False)


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


def prepare_process(args: PPOConfig) -> None:
    """Before anything is built: warnings once per job (from the first process), the launch checked, and the seed set
    before anything draws from the RNG (the critic's fresh scalar head, LoRA matrices), as `Trainer` does."""
    quiet_replica(args.process_index)
    check_launch_environment()
    if args.full_determinism:
        enable_full_determinism(args.seed)
    else:
        set_seed(args.seed)


def check_launch(accelerator: Accelerator, args: PPOConfig, *, is_deepspeed: bool) -> bool:
    """The FSDP or DeepSpeed launch checked once the accelerator exists ([`~parallel.checks.check_distributed_setup`],
    with the fields it reads), and the backend logged; returns whether the models are sharded with FSDP2. With
    several processes each gets a seed of its own: distinct samples on each (the prompt order does not depend on it:
    `trainer/prompts.py`)."""
    is_fsdp2 = check_distributed_setup(
        accelerator,
        is_deepspeed=is_deepspeed,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        activation_checkpointing=args.activation_checkpointing,
        sequence_parallel_size=args.sequence_parallel_size,
    )
    if accelerator.num_processes > 1:
        set_seed(args.seed, device_specific=True)
    return is_fsdp2


@dataclasses.dataclass
class BuiltModels:
    """What [`build_models`] gives the trainer. In a critic job `policy` and `reference` are `None` and
    `initial_policy` says which policy the critic was built beside (its name, revision and weights hash)."""

    policy: PreTrainedModel | None
    critic: PreTrainedModel | None  # None: the advantage estimator uses no critic
    reference: PreTrainedModel | None
    tokenizer: PreTrainedTokenizerBase
    initial_policy: dict | None = None


def build_models(
    model: str | PreTrainedModel,
    args: PPOConfig,
    *,
    value_model: str | PreTrainedModel | None,
    ref_model: PreTrainedModel | None,
    processing_class: PreTrainedTokenizerBase | None,
    peft_config: PeftConfig | None,
    value_peft_config: PeftConfig | dict | None,
) -> BuiltModels:
    """The policy, the critic, the reference policy (`None` when there is none to keep) and the tokenizer, loaded or
    built and readied as the config asks (see [`prepare_models`], [`reference_model`]); under `cast_lm_head_to_fp32`
    the LM heads of the policy and the reference in float32 ([`~models.fp32_head.cast_lm_head_to_fp32`]; the critic,
    built from the policy first, keeps its dtype). A critic job ([`critic_job_models`]) keeps no policy."""
    if args.is_critic_job:
        check_critic_job_inputs(args, ref_model=ref_model, peft_config=peft_config)
    check_critic_inputs(args, value_model=value_model, value_peft_config=value_peft_config)
    policy = load_policy(model, model_init_kwargs=args.model_init_kwargs, trust_remote_code=args.trust_remote_code)
    tokenizer = load_tokenizer(
        processing_class,
        policy,
        trust_remote_code=args.trust_remote_code,
        gguf_file=(args.model_init_kwargs or {}).get("gguf_file") if isinstance(model, str) else None,
    )
    critic = None  # a group advantage estimator has none: no memory, no step, nothing saved or pushed
    if args.uses_critic:
        critic = build_critic(
            value_model,
            policy,
            tokenizer,
            model_init_kwargs=args.model_init_kwargs,
            trust_remote_code=args.trust_remote_code,
            deepspeed_config=registered_deepspeed_config(args),
        )
    policy, critic = prepare_models(policy, critic, args, peft_config=peft_config, value_peft_config=value_peft_config)
    reference = None if args.is_critic_job else reference_model(policy, ref_model, args)
    if args.cast_lm_head_to_fp32:
        for m in (policy, reference):
            if m is not None:
                cast_lm_head_to_fp32(m)
    if args.is_critic_job:
        return critic_job_models(policy, critic, tokenizer)
    return BuiltModels(policy=policy, critic=critic, reference=reference, tokenizer=tokenizer)


def registered_deepspeed_config(args: PPOConfig):
    """The `HfDeepSpeedConfig` transformers registered for this run's DeepSpeed config (TrainingArguments keeps it, or
    its accelerate plugin does), or `None` without DeepSpeed: what [`~models.loading.zero3_init_like`] sets back."""
    return getattr(args, "hf_deepspeed_config", None) or getattr(
        getattr(args, "deepspeed_plugin", None), "dschf", None
    )


def check_critic_inputs(args: PPOConfig, *, value_model, value_peft_config) -> None:
    """Refuse a critic's inputs in a run whose advantage estimator builds no critic (`"grpo"`, `"rloo"`)."""
    if args.uses_critic:
        return
    given = [
        name for name, v in (("value_model", value_model), ("value_peft_config", value_peft_config)) if v is not None
    ]
    if given:
        raise ValueError(
            f"advantage_estimator={args.advantage_estimator!r} builds no critic, so `{'` and `'.join(given)}` has "
            "nothing to act on: drop it, or use advantage_estimator='gae' to train with this critic."
        )


def check_critic_job_inputs(args: PPOConfig, *, ref_model, peft_config) -> None:
    """Refuse a critic job's inputs that would need the policy it does not keep."""
    if peft_config is not None:
        raise ValueError(
            "`peft_config` puts adapters on the policy, which a critic job (value_pretrain_only with "
            "value_pretrain_dataset) does not keep: drop it (a LoRA critic takes `value_peft_config`)."
        )
    if ref_model is not None and args.kl_coef > 0:
        raise ValueError(
            "A critic job with kl_coef > 0 and a `ref_model` of its own would need the policy's log-probabilities for "
            "the KL penalty, and it keeps no policy: drop `ref_model` (the KL to the initial policy is exactly 0 while "
            "the policy is frozen) or set kl_coef=0."
        )


def critic_job_models(policy: PreTrainedModel, critic: PreTrainedModel, tokenizer) -> BuiltModels:
    """A critic job's models: the critic, and what identifies the policy it was built beside (the hash stored
    rollouts are checked against, taken as a store job takes it). The policy itself is let go here."""
    identity = policy_identity(policy, gather=is_zero3_partitioned(policy))
    logger.warning(
        "Critic job: the policy was loaded to build the critic and hash its weights, and is not kept; nothing is "
        "sampled (value pretraining reads the stored rollouts)."
    )
    return BuiltModels(policy=None, critic=critic, reference=None, tokenizer=tokenizer, initial_policy=identity)


def prepare_models(
    policy: PreTrainedModel,
    critic: PreTrainedModel | None,
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
    if value_peft_config is not None and critic is not None:
        if is_peft_model(critic):
            logger.warning("The value model is already a PEFT model: `value_peft_config` is not applied.")
        else:
            critic = wrap_value_model(critic, value_peft_config)
    models = [m for m in (policy, critic) if m is not None]
    if args.disable_dropout:
        for m in models:
            disable_dropout_in_model(m)
    if args.activation_checkpointing:
        for m in models:
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


def prepare_datasets(
    train_dataset,
    eval_dataset,
    tokenizer: PreTrainedTokenizerBase,
    args: PPOConfig,
    reward_funcs: list,
    rollout_func_keys: bool = False,
) -> tuple[object, object, dict[str, DataReport]]:
    """
    Check the schema and drop (or count truncated) bad rows before training; see [`~trainer.prompts.prepare_prompt_dataset`].

    Returns:
        `(train_dataset, eval_dataset, reports)`, with one [`~trainer.prompts.DataReport`] per dataset given (`"train"`, `"eval"`).
    """
    reports: dict[str, DataReport] = {}
    prepared = []
    for name, dataset in (("train", train_dataset), ("eval", eval_dataset)):
        if dataset is not None:
            check_reward_signatures(
                reward_funcs, dataset.column_names, f"{name}_dataset", rollout_func_keys=rollout_func_keys
            )
            required = reward_function_columns(reward_funcs, dataset.column_names)
            dataset, report = prepare_prompt_dataset(
                dataset,
                f"{name}_dataset",
                tokenizer,
                required_columns=required,
                max_prompt_length=args.max_prompt_length,
                overlong_prompt=args.overlong_prompt,
                chat_template_kwargs=args.chat_template_kwargs,
            )
            reports[name] = report
            if report.kept < report.num_rows or report.truncated_prompts:
                logger.warning(f"{name}_dataset: {report.summary()}.")
        prepared.append(dataset)
    return prepared[0], prepared[1], reports


def prepare_for_training(
    accelerator: Accelerator,
    model: torch.nn.Module,
    *,
    fsdp2: bool,
    create_optimizer: Callable[[], torch.optim.Optimizer],
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The prepared policy-and-critic model and optimizer that training starts from. Under FSDP2 the policy and the
    critic are sharded first, each its own root ([`~parallel.fsdp.shard_with_fsdp2`]), and the optimizer is built on
    their shards; otherwise accelerate prepares both (DDP or DeepSpeed). The scheduler is not prepared: accelerate
    would step it once per process on every call."""
    if fsdp2:
        apply_fsdp2_activation_checkpointing(accelerator, list(model.models().values()))
        shard_with_fsdp2(accelerator, list(model.models().values()))
        return model, accelerator.prepare_optimizer(create_optimizer())
    return accelerator.prepare(model, create_optimizer())


def prepare_for_inference(model: PreTrainedModel, accelerator: Accelerator, shard: bool = False) -> PreTrainedModel:
    """Place a reference or reward model for inference (DeepSpeed-initialised under DeepSpeed; with `shard`, sharded
    with FSDP2 as the trained models are)."""
    if shard:
        shard_with_fsdp2(accelerator, [model])
        return model
    if accelerator.state.deepspeed_plugin is not None:
        from trl.models import prepare_deepspeed

        return prepare_deepspeed(model, accelerator)
    return accelerator.prepare_model(model, evaluation_mode=True)


def build_sequence_group(
    args: PPOConfig, model: torch.nn.Module, ref_model: torch.nn.Module | None
) -> SequenceGroup | None:
    """This process's one sequence-parallel group of `args.sequence_parallel_size` processes (`None` at 1), with
    Ulysses installed in front of the attention of every model whose forwards it splits, each checked first: the
    policy and the critic of `model` (a [`~models.policy_and_value.PolicyAndValueModel`]) and the reference. The
    rollout's no-grad forwards and the learner's are handed the same group."""
    if args.sequence_parallel_size == 1:
        return None
    models = dict(model.models())
    if ref_model is not None:  # a DeepSpeed engine (ZeRO-3 reference) holds the model, its config a dict
        engine = not hasattr(getattr(ref_model, "config", None), "get_text_config")
        models["reference"] = ref_model.module if engine else ref_model
    return setup_sequence_parallel(models, args.sequence_parallel_size)


def epoch_rows(
    args: PPOConfig, accelerator: Accelerator, sequence_group: SequenceGroup | None
) -> Callable[[int], EpochRowSource]:
    """What hands the learner's PPO epochs their rows, built per update from the mini-batch size: a sequence-parallel
    group's shared rows, else with more than one process each epoch's global mini-batches handed out by tokens
    (`balance_ranks`) or only measured, else this process's own."""
    if sequence_group is not None:
        return lambda size: SequenceGroupRows(accelerator, mini_batch_size=size, group=sequence_group)
    if accelerator.num_processes > 1:
        return lambda size: RankBalancer(accelerator, mini_batch_size=size, balance=args.balance_ranks)
    return OwnRows


def new_trainer_state(args: PPOConfig, stateful_callbacks: list, max_steps: int, batch_size: int) -> TrainerState:
    """A fresh `TrainerState` for a run of `max_steps` updates of `batch_size` sequences."""
    state = TrainerState(stateful_callbacks=stateful_callbacks)
    state.max_steps = max_steps
    state.num_train_epochs = args.num_train_epochs
    state.logging_steps = args.logging_steps
    state.eval_steps = args.eval_steps
    state.save_steps = args.save_steps
    state.train_batch_size = batch_size
    return state

"""Building what makes a [`PPOTrainer`]'s rollouts: the sampler (HF `generate` or vLLM), a user's `rollout_func` in
its place (TRL's), the reward weights, and the [`~rollout.maker.RolloutMaker`] that holds them.

Plain functions of their inputs; the trainer calls them in its constructor and keeps what they return.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import is_peft_model
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging

from ..config.ppo import PPOConfig
from ..episodes import Environments, ToolLoop, ToolSettings
from ..models.loading import load_reward_funcs
from ..parallel import SequenceGroup
from ..rollout import SourceSettings, check_custom_sampling, check_tools_under_overlap
from ..rollout.maker import RolloutMaker
from ..rollout.settings import RolloutSettings
from ..sampling.hf import HFSampler, neutralised_generation_fields
from ..sampling.settings import SamplerSettings
from ..sampling.vllm_checks import check_vllm_model, require_vllm, vllm_dtype, vllm_platform_is_cpu
from ..sampling.vllm_colocate import VLLMColocateSampler
from ..sampling.vllm_server import VLLMServerSampler
from .prompts import prompt_token_lengths

logger = logging.get_logger(__name__)

RolloutFunc = Callable[[list[Any], Any], dict[str, Any]]


def check_rollout_func(
    args: PPOConfig, rollout_func: RolloutFunc | None, tools: list | None = None, environment_factory=None
) -> None:
    """Refuse what a `rollout_func`, `tools` or an `environment_factory` cannot be combined with yet, naming the field
    and what to do."""
    if rollout_func is not None and (tools or environment_factory is not None):
        raise ValueError(
            "Give `tools` (or an `environment_factory`) or a `rollout_func`, not both: a rollout_func samples (and "
            "calls tools) itself."
        )
    if rollout_func is not None and not callable(rollout_func):
        raise TypeError(
            f"`rollout_func` must be callable (prompts, trainer) -> dict, got {type(rollout_func).__name__}."
        )
    has_tools = bool(tools) or environment_factory is not None
    what = "rollout_func" if rollout_func is not None else "tools" if has_tools else None
    if what is None:
        return
    check_custom_sampling(SourceSettings.from_args(args), what)
    if what == "tools":
        check_tools_under_overlap(
            SourceSettings.from_args(args),
            tools=list(tools or []),
            environment_factory=environment_factory,
        )
    if args.use_vllm and what == "rollout_func":
        raise ValueError(
            "`rollout_func` cannot be combined with `use_vllm` yet (the trainer's vLLM engine is not handed to a "
            "rollout_func; sample with your own): unset `use_vllm`."
        )
    if args.use_vllm and args.vllm_mode != "colocate":
        # The server sampler hands each process its slice of the answers assuming all sent as many prompts, which a
        # tool round does not (each process continues its own episodes); and server-mode training needs CUDA.
        raise ValueError(
            f"`{what}` cannot be combined with `vllm_mode={args.vllm_mode!r}` yet (the tool loop runs on HF generate "
            "and on vLLM colocate; the server sampler assumes every process sends as many prompts per call, which a "
            "tool round does not): use `vllm_mode='colocate'` or unset `use_vllm`."
        )


def rewards_and_environments(
    reward_funcs, reward_processing_classes, args: PPOConfig, *, tools: list | None, environment_factory
) -> tuple[list, list, Environments | None]:
    """The reward functions and models (loaded as the config says) with their tokenizers, and the run's
    [`~episodes.environments.Environments`] (`None` without an `environment_factory`); an environment with
    `get_reward` adds its reward source after the given ones (TRL's: weight 1, named after its class), and then
    `reward_funcs` may be `None`."""
    environments = None
    if environment_factory is not None:
        environments = Environments(environment_factory, list(tools or []))
        if reward_funcs is None and environments.reward_functions():
            reward_funcs = []
    funcs, processing = [], []
    if reward_funcs != []:  # None or an empty list is refused there, with what to give
        funcs, processing = load_reward_funcs(
            reward_funcs,
            reward_processing_classes,
            model_init_kwargs=args.model_init_kwargs,
            trust_remote_code=args.trust_remote_code,
        )
    if environments is not None:
        extra = environments.reward_functions()
        funcs, processing = funcs + extra, processing + [None] * len(extra)
    return funcs, processing, environments


def reward_weights(args: PPOConfig, num_funcs: int, num_environment_rewards: int = 0) -> torch.Tensor:
    """One weight per reward function: `args.reward_weights`, or all ones; then 1 for each environment's reward."""
    if num_environment_rewards:
        ones = torch.ones(num_environment_rewards)
        return torch.cat([reward_weights(args, num_funcs - num_environment_rewards), ones])
    if args.reward_weights is None:
        return torch.ones(num_funcs)
    if len(args.reward_weights) != num_funcs:
        raise ValueError(
            f"`reward_weights` has {len(args.reward_weights)} entries but there are {num_funcs} "
            "reward functions: give one weight per function."
        )
    return torch.tensor(args.reward_weights, dtype=torch.float32)


def build_sampler(
    settings: SamplerSettings,
    accelerator: Accelerator,
    *,
    policy: torch.nn.Module,
    current_model: Callable[[], torch.nn.Module],
    tokenizer: PreTrainedTokenizerBase,
    stop_token_ids: list[int],
    datasets: list,
    render: Callable[[list[Any]], list[str]] | None = None,
):
    """
    The generation backend (see [`~sampling.seam`]): HF `generate`, or vLLM colocate/server with `use_vllm`.

    Args:
        policy: The policy as built (its config sizes the vLLM engine).
        current_model: Returns the current (prepared) [`~models.policy_and_value.PolicyAndValueModel`] at each generation.
        datasets: The prompt datasets, to size vLLM's context when `max_prompt_length` is not set.
        render: How the prompts are rendered when not by the chat template alone (the tool loop's
            [`~episodes.tool_loop.ToolLoop.render`], with the tools' schemas), for that measure.
    """
    if not settings.use_vllm:
        return HFSampler(
            current_model,
            accelerator,
            tokenizer,
            stop_token_ids=stop_token_ids,
            response_length=settings.response_length,
            chunk_size=settings.chunk_size,
            gather_deepspeed3_params=settings.gather_deepspeed3_params,
            knobs=settings.knobs,
        )
    require_vllm()
    from trl.distributed import DistributedBackend

    backend = DistributedBackend(accelerator)
    gather = backend.gather_params

    def current_policy():
        return accelerator.unwrap_model(current_model()).policy

    common = dict(
        gather=gather,
        accelerator=accelerator,
        tokenizer=tokenizer,
        stop_token_ids=stop_token_ids,
        response_length=settings.response_length,
        knobs=settings.knobs,
    )
    longest_prompt = settings.max_prompt_length
    if longest_prompt is None:
        longest_prompt = max(
            max(
                prompt_token_lengths(d["prompt"], tokenizer, settings.chat_template_kwargs)
                if render is None
                else [len(ids) for ids in tokenizer(render(list(d["prompt"])), add_special_tokens=False)["input_ids"]]
            )
            for d in datasets
            if d is not None
        )
    needed_length = longest_prompt + settings.response_length
    if settings.vllm_mode == "server":
        sampler = VLLMServerSampler(
            current_policy,
            **common,
            base_url=settings.server_base_url,
            timeout=settings.server_timeout,
            group_port=settings.group_port,
            weight_transfer=settings.weight_transfer,
            transfer_dir=settings.weight_transfer_dir,
            needed_length=needed_length,
        )
        logger.warning(f"Rollouts are sampled by the vLLM server at {sampler.base_url}.")
        if settings.cast_lm_head_to_fp32:
            logger.warning(
                "cast_lm_head_to_fp32=True computes the trainer's logits in float32; a vLLM server does so only when "
                'started with `--hf-overrides \'{"head_dtype": "float32"}\'` (the trainer cannot set it), else its '
                "log-probs come from a head in the model's dtype."
            )
        return sampler
    config = (policy.get_base_model() if is_peft_model(policy) else policy).config
    max_model_length = settings.max_model_length or (
        settings.max_prompt_length + settings.response_length
        if settings.max_prompt_length is not None
        else config.max_position_embeddings
    )
    check_vllm_model(config, max_model_length, needed_length, on_cpu=vllm_platform_is_cpu())
    dtype = vllm_dtype(settings.mixed_precision, policy)
    sampler = VLLMColocateSampler(
        current_policy,
        **common,
        dtype=dtype,
        max_model_length=max_model_length,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        tensor_parallel_size=settings.tensor_parallel_size,
        enable_sleep_mode=settings.enable_sleep_mode,
        model_impl=settings.model_impl,
        seed=settings.seed,
        copy_weights=backend.is_zero3,
        head_dtype="float32" if settings.cast_lm_head_to_fp32 else None,
        trust_remote_code=settings.trust_remote_code,
    )
    started = f"engine started in {sampler.start_seconds:.0f} s" if sampler.start_seconds else "engine reused"
    logger.warning(f"Rollouts are sampled by vLLM (colocate, {dtype}, context {max_model_length} tokens); {started}.")
    return sampler


def warn_about_generation_config(policy: PreTrainedModel, args: PPOConfig) -> None:
    """Say which fields of the policy's `generation_config` rollouts ignore (see
    [`~sampling.hf.neutralised_generation_fields`])."""
    ignored = neutralised_generation_fields(policy)
    if ignored:
        logger.warning(
            "The policy's generation_config sets "
            + ", ".join(f"{k}={v!r}" for k, v in sorted(ignored.items()))
            + f": PPO does not apply them. Rollouts sample at temperature={args.temperature} with the config's own "
            f"top_k={args.top_k}, top_p={args.top_p}, min_p={args.min_p} and repetition_penalty="
            f"{args.repetition_penalty} and no other logits processing, the distribution the policy-gradient ratio and "
            "the training log-probabilities assume (set those fields to sample with such knobs)."
        )


def build_rollout_maker(
    args: PPOConfig,
    accelerator: Accelerator,
    *,
    tokenizer: PreTrainedTokenizerBase,
    stop_token_ids: list[int],
    policy: PreTrainedModel | None,
    current_model: Callable[[], torch.nn.Module],
    ref_model: PreTrainedModel | None,
    reference_is_initial_policy: bool,
    reward_funcs: list,
    reward_processing_classes: list,
    datasets: list,
    sequence_group: SequenceGroup | None = None,
    rollout_function: Callable[[list[Any]], dict[str, Any]] | None = None,
    tools: list[Callable] | None = None,
    environments: Environments | None = None,
) -> RolloutMaker:
    """The [`~rollout.maker.RolloutMaker`] with its sampler ([`build_sampler`]; none without a policy, in a critic
    job), the reward weights, the sequence-parallel group of its forwards ([`~trainer.model_setup.build_sequence_group`]) and
    the `rollout_func` bound to the trainer (`rollout_function`), which samples in the sampler's place."""
    tool_loop = None
    if tools or environments is not None:
        tool_loop = ToolLoop(
            tools,
            tokenizer,
            settings=ToolSettings.from_args(args),
            stop_token_ids=stop_token_ids,
            environments=environments,
        )
    sampler = None
    if policy is not None:
        sampler = build_sampler(
            SamplerSettings.from_args(args),
            accelerator,
            policy=policy,
            current_model=current_model,
            tokenizer=tokenizer,
            stop_token_ids=stop_token_ids,
            datasets=datasets,
            # An episode's prompt holds the tools' schemas. An environment's reset text and methods are known only
            # once its episodes start: vLLM colocate checks each generation call's prompts then (check_prompts_fit).
            render=None if tool_loop is None else tool_loop.render,
        )
    return RolloutMaker(
        RolloutSettings.from_args(args),
        accelerator,
        tokenizer=tokenizer,
        sampler=sampler,
        current_model=current_model,
        ref_model=ref_model,
        reward_funcs=reward_funcs,
        reward_processing_classes=reward_processing_classes,
        reward_weights=reward_weights(
            args, len(reward_funcs), 0 if environments is None else len(environments.reward_functions())
        ),
        stop_token_ids=stop_token_ids,
        reference_is_initial_policy=reference_is_initial_policy,
        sequence_group=sequence_group,
        rollout_function=rollout_function,
        tool_loop=tool_loop,
    )

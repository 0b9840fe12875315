"""What building a sampler reads of the config: a frozen view built from it ([`SamplerSettings.from_args`])."""

from __future__ import annotations

import dataclasses
import os

from ..algo.logits_processing import NO_KNOBS, SamplingKnobs
from ..config.ppo import PPOConfig
from .vllm_checks import server_base_url


@dataclasses.dataclass(frozen=True)
class SamplerSettings:
    """The fields of [`PPOConfig`] the samplers act on (their meanings are the config's `vllm_*` fields)."""

    use_vllm: bool
    vllm_mode: str
    response_length: int
    max_prompt_length: int | None
    # HF `generate`: prompts generated together (`local_rollout_forward_batch_size`), ZeRO-3 weights gathered first.
    chunk_size: int
    gather_deepspeed3_params: bool  # `ds3_gather_for_generation`
    # The vLLM server.
    server_base_url: str
    server_timeout: float
    group_port: int
    weight_transfer: str  # `vllm_weight_transfer`
    weight_transfer_dir: str  # `vllm_weight_transfer_dir`, or the output folder's `vllm_weights`
    # The colocated vLLM engine.
    max_model_length: int | None
    gpu_memory_utilization: float
    tensor_parallel_size: int
    enable_sleep_mode: bool
    model_impl: str
    seed: int
    mixed_precision: str | None  # "bfloat16" under `bf16`, "float16" under `fp16`, else None (the weights' dtype)
    cast_lm_head_to_fp32: bool = False  # vLLM's head in float32 too (colocate; a server is started by the user)
    knobs: SamplingKnobs = (
        NO_KNOBS  # top-k, top-p, min-p, repetition penalty: what shapes sampling besides temperature
    )
    chat_template_kwargs: dict | None = None  # how prompts are rendered (their longest length sizes vLLM's context)
    trust_remote_code: bool = False  # the colocated engine may run the model's own code

    @classmethod
    def from_args(cls, args: PPOConfig) -> SamplerSettings:
        mixed_precision = "bfloat16" if args.bf16 else "float16" if args.fp16 else None
        return cls(
            use_vllm=args.use_vllm,
            vllm_mode=args.vllm_mode,
            response_length=args.response_length,
            max_prompt_length=args.max_prompt_length,
            chunk_size=args.local_rollout_forward_batch_size,
            gather_deepspeed3_params=args.ds3_gather_for_generation,
            server_base_url=server_base_url(args.vllm_server_base_url, args.vllm_server_host, args.vllm_server_port),
            server_timeout=args.vllm_server_timeout,
            group_port=args.vllm_group_port,
            weight_transfer=args.vllm_weight_transfer,
            weight_transfer_dir=args.vllm_weight_transfer_dir or os.path.join(args.output_dir or ".", "vllm_weights"),
            max_model_length=args.vllm_max_model_length,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            tensor_parallel_size=args.vllm_tensor_parallel_size,
            enable_sleep_mode=args.vllm_enable_sleep_mode,
            model_impl=args.vllm_model_impl,
            seed=args.seed,
            mixed_precision=mixed_precision,
            cast_lm_head_to_fp32=args.cast_lm_head_to_fp32,
            knobs=SamplingKnobs.from_args(args),
            chat_template_kwargs=args.chat_template_kwargs,
            trust_remote_code=args.trust_remote_code,
        )

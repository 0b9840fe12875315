"""The vLLM colocate sampler behind the generation seam (see [`~sampling.seam`]): [`VLLMColocateSampler`], an
in-process vLLM engine per process, started from the policy's config with dummy weights and loaded from the training
weights before its first use (so an in-memory policy, e.g. after a cold start or a resume, is what samples), then after
every policy update; and [`start_engine`], which the rollout worker's engine starts with too.

What it shares with the server sampler (sampling parameters, weight-sync bookkeeping, `generate`'s skeleton) is in
[`~sampling.vllm_common`]. Nothing here imports vLLM at module level: the package works without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from accelerate.utils import is_peft_model
from transformers import PreTrainedTokenizerBase

from ..algo.logits_processing import NO_KNOBS, SamplingKnobs
from .seam import SamplerError
from .vllm_checks import check_prompts_fit, named_policy_weights, require_vllm
from .vllm_common import VLLMSamplerBase, completions_and_logprobs, short_message

__all__ = [
    "DEFAULT_CPU_KVCACHE_GIB",
    "VLLMColocateSampler",
    "start_engine",
]

# The CPU backend reserves this much KV cache (GiB) when VLLM_CPU_KVCACHE_SPACE is unset; its own default is ~17 GiB.
DEFAULT_CPU_KVCACHE_GIB = 2


def _policy_config(policy: torch.nn.Module):
    return (policy.get_base_model() if is_peft_model(policy) else policy).config


class VLLMColocateSampler(VLLMSamplerBase):
    """
    One in-process vLLM engine per training process (`vllm_mode="colocate"`).

    Why not TRL's `VLLMGeneration`: it loads `model.name_or_path` (an in-memory policy has none, and a path would give
    the checkpoint's weights, not the trained ones), passes no dtype (vLLM then picks bf16 for an fp32 model), and its
    weight sync calls the model's `load_weights`, which fails on vLLM's CPU backend (its linear layers are repacked).
    Here the engine starts from the policy's config with dummy weights, in the training dtype, and every sync goes
    through the worker's `reload_weights` (layer-wise reload, which re-runs the backend's weight processing), on CPU
    and GPU alike. Sampling parameters are set per call ([`sampling_kwargs`]).
    """

    name = "vllm-colocate"
    sync_description = "Loading the policy's weights into vLLM"

    def __init__(
        self,
        policy_provider: Callable[[], torch.nn.Module],
        gather: Callable,
        accelerator,
        tokenizer: PreTrainedTokenizerBase,
        stop_token_ids: list[int],
        response_length: int,
        dtype: str,
        max_model_length: int,
        gpu_memory_utilization: float = 0.3,
        tensor_parallel_size: int = 1,
        enable_sleep_mode: bool = False,
        model_impl: str = "vllm",
        seed: int = 0,
        copy_weights: bool = False,
        head_dtype: str | None = None,
        knobs: SamplingKnobs = NO_KNOBS,
        trust_remote_code: bool = False,
    ):
        require_vllm()
        super().__init__(
            policy_provider,
            gather,
            accelerator,
            tokenizer,
            stop_token_ids,
            response_length=response_length,
            knobs=knobs,
        )
        self.copy_weights = copy_weights
        self.max_model_length = max_model_length
        self.enable_sleep_mode = enable_sleep_mode
        if tensor_parallel_size != 1:
            raise ValueError(
                "vllm_tensor_parallel_size > 1 is not supported by vcppo-trl's colocate sampler yet: use 1 (one engine "
                "per training process) or vllm_mode='server' with a tensor-parallel server."
            )
        if accelerator.num_processes > 1 and accelerator.device.type == "cpu":
            raise ValueError(
                "vLLM colocate with several processes is only supported on GPUs (one engine per GPU); on a CPU run a "
                "single process, or use vllm_mode='server'."
            )
        if accelerator.device.type == "cpu":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(DEFAULT_CPU_KVCACHE_GIB))
        # The engine runs inside this process, on this process's device, with torch.distributed set up by the launch.
        os.environ.setdefault("RANK", str(accelerator.process_index))
        os.environ.setdefault("LOCAL_RANK", str(accelerator.local_process_index))
        os.environ.setdefault("WORLD_SIZE", str(accelerator.num_processes))
        from trl.generation.vllm_generation import ensure_master_addr_port

        ensure_master_addr_port()
        config = _policy_config(policy_provider())
        engine_args = dict(
            dtype=dtype,
            max_model_len=max_model_length,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=enable_sleep_mode,
            model_impl=model_impl,
        )
        if head_dtype is not None:
            # `cast_lm_head_to_fp32`: vLLM's own knob (`ModelConfig.head_dtype`, for generation models since vLLM
            # 0.2x): its LogitsProcessor projects the hidden states through the head in this dtype.
            engine_args["hf_overrides"] = {"head_dtype": head_dtype}
        if trust_remote_code:  # the model's own code (its config names it in `auto_map`)
            engine_args["trust_remote_code"] = True
        self.config, self.engine_args, self.seed = config, engine_args, seed  # a rollout worker starts its own twin
        key = json.dumps([config.to_json_string(use_diff=False), engine_args], sort_keys=True)
        start = time.perf_counter()
        if key in _ENGINES:
            # Weights always come from the trainer, so an engine built for the same architecture and settings is
            # reused as is: a second trainer in a notebook or a test session does not start (and allocate) another.
            self.llm = _ENGINES[key]
        else:
            for old in _ENGINES.values():  # one engine per process: a new shape replaces (and frees) the old one
                _shutdown(old)
            _ENGINES.clear()
            self.llm = start_engine(config, engine_args, seed + accelerator.process_index)
            _ENGINES[key] = self.llm
            self.start_seconds = time.perf_counter() - start
        if enable_sleep_mode:
            self.llm.sleep(level=1)

    def _push_weights(self) -> None:
        """Load the policy's current weights into the engine (all of them, in checkpoint format)."""
        if self.enable_sleep_mode:
            self.llm.wake_up(tags=["weights"])
        weights = named_policy_weights(self.policy_provider(), self.gather, self.copy_weights)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()

    def _sample(self, prompts: list[list[int]], kwargs: dict[str, Any]) -> tuple[list[list[int]], list[list[float]]]:
        from vllm import SamplingParams

        check_prompts_fit([len(ids) for ids in prompts], kwargs["max_tokens"], self.max_model_length)
        params = SamplingParams(**kwargs, detokenize=False)
        try:
            if self.enable_sleep_mode:
                self.llm.wake_up(tags=["kv_cache"])
            outputs = self.llm.generate(
                [{"prompt_token_ids": ids} for ids in prompts], sampling_params=params, use_tqdm=False
            )
            if self.enable_sleep_mode:
                self.llm.sleep(level=1)
        except Exception as err:
            raise SamplerError(f"vLLM generation failed ({type(err).__name__}: {err}).") from err
        return completions_and_logprobs(outputs)

    def close(self) -> None:
        """Shut the engine down and free its memory (it is otherwise kept for the next trainer in this process)."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            for key in [k for k, v in _ENGINES.items() if v is llm]:
                del _ENGINES[key]
            _shutdown(llm)
            self.llm = None


def _shutdown(llm) -> None:
    with contextlib.suppress(Exception):
        llm.llm_engine.engine_core.shutdown()


# The colocated engine of this process, by architecture and engine settings (see VLLMColocateSampler).
_ENGINES: dict[str, Any] = {}


def start_engine(config, engine_args: dict[str, Any], seed: int):
    """Start an in-process vLLM engine for `config` with dummy weights (the first sync loads the real ones)."""
    from vllm import LLM

    with tempfile.TemporaryDirectory(prefix="vcppo-vllm-") as config_dir:
        config.save_pretrained(config_dir)
        try:
            return LLM(
                model=config_dir,
                load_format="dummy",  # the training weights are loaded by the first sync
                skip_tokenizer_init=True,  # prompts go in as token ids and come back as token ids
                distributed_executor_backend="external_launcher",
                generation_config="vllm",  # not the checkpoint's sampling defaults
                # log-probs after the penalty, temperature, min-p, top-k and top-p, as the training forward computes
                logprobs_mode="processed_logprobs",
                seed=seed,
                max_num_batched_tokens=max(4096, engine_args["max_model_len"]),
                **engine_args,
            )
        except Exception as err:
            raise SamplerError(
                f"vLLM could not start an engine for this policy ({type(err).__name__}: {short_message(err)}). Check "
                f"that vLLM supports the architecture ({config.architectures}), that vllm_max_model_length="
                f"{engine_args['max_model_len']} fits the model, and the memory settings (vllm_gpu_memory_utilization "
                "on a GPU, VLLM_CPU_KVCACHE_SPACE on a CPU); or set use_vllm=False."
            ) from err

"""vLLM samplers behind the generation seam (see [`~sampling.seam`]): colocate and server.

- [`VLLMColocateSampler`]: an in-process vLLM engine per process, started from the policy's config with dummy weights
  and loaded from the training weights before its first use (so an in-memory policy, e.g. after a cold start or a
  resume, is what samples), then after every policy update.
- [`VLLMServerSampler`]: a `vllm serve` process reached through TRL's `VLLMClient`; weights are pushed over NCCL, which
  needs GPUs.

Both sample with the trainer's temperature and knobs (top-k, top-p, min-p, repetition penalty) and return the
sampler's own log-probabilities of the sampled tokens under the distribution it drew from (vLLM's processed log-probs:
after the penalty, the temperature, min-p, top-k and top-p, in that order), which the trainer compares with its
training forward (`sampling/...` metrics, importance-sampling correction), computed in the same order. The checks the
trainer runs before any engine starts, and the policy's weights in the form both load, are in [`~sampling.vllm_checks`]
(importable from here too).
Nothing here imports vLLM at module level: the package works without it.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import json
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from accelerate.utils import is_peft_model
from transformers import PreTrainedTokenizerBase

from ..algo.logits_processing import NO_KNOBS, VLLM_ORDER, SamplingKnobs, require_order
from .seam import SamplerError, Samples, samples_from_token_lists, unpadded_prompts
from .vllm_checks import (
    check_prompts_fit,
    named_policy_weights,
    require_vllm,
)

__all__ = [
    "DEFAULT_CPU_KVCACHE_GIB",
    "VLLMColocateSampler",
    "VLLMServerSampler",
]

# The CPU backend reserves this much KV cache (GiB) when VLLM_CPU_KVCACHE_SPACE is unset; its own default is ~17 GiB.
DEFAULT_CPU_KVCACHE_GIB = 2


def _policy_config(policy: torch.nn.Module):
    return (policy.get_base_model() if is_peft_model(policy) else policy).config


class _VLLMSamplerBase(abc.ABC):
    """What colocate and server share: sampling parameters, the stale flag, the weight sync's bookkeeping."""

    sync_description = "Loading the policy's weights into the sampler"

    def __init__(
        self,
        policy_provider: Callable[[], torch.nn.Module],
        gather: Callable,
        accelerator,
        tokenizer,
        stop_token_ids: list[int],
        response_length: int,
        knobs: SamplingKnobs = NO_KNOBS,
    ):
        require_order(knobs, VLLM_ORDER, sampler="vLLM")
        self.knobs = knobs
        self.policy_provider = policy_provider
        self.gather = gather
        self.accelerator = accelerator
        self.device = accelerator.device
        self.tokenizer = tokenizer
        self.stop_token_ids = list(stop_token_ids)
        self.response_length = response_length
        self.stale = True  # the engine does not hold the training weights until the first sync
        self.start_seconds = 0.0
        self.sync_seconds = 0.0
        self.num_syncs = 0

    def sampling_kwargs(self, greedy: bool, temperature: float, max_new_tokens: int | None = None) -> dict[str, Any]:
        """
        vLLM `SamplingParams` equal in meaning to the HF path: the temperature and the knobs (TRL's `top_k=0` is
        vLLM's "off" too, `min_p=None` its 0; greedy decoding, temperature 0, takes none), our stop tokens only
        (`ignore_eos` keeps the model's EOS from stopping a response when it is not one of them), at most
        `max_new_tokens` tokens (`response_length` when not given), and the log-probability of each sampled token
        (processed: the engine runs with `logprobs_mode="processed_logprobs"`). No per-request seed: one seed shared
        by a batch would give identical samples for the repeated prompts of `num_generations`; the engine's random
        stream is seeded once from `args.seed` (and the process index) instead.
        """
        knobs = NO_KNOBS if greedy else self.knobs
        return {
            "n": 1,
            "temperature": 0.0 if greedy else float(temperature),
            "top_p": float(knobs.top_p),
            "top_k": int(knobs.top_k),
            "min_p": float(knobs.min_p or 0.0),
            "repetition_penalty": float(knobs.repetition_penalty),
            "max_tokens": self.response_length if max_new_tokens is None else max_new_tokens,
            "stop_token_ids": self.stop_token_ids,
            "ignore_eos": True,
            "logprobs": 0,
        }

    def mark_stale(self) -> None:
        self.stale = True

    def sync_weights(self) -> None:
        """Bring the sampler to the policy's current weights; a failure stops training (never stale samples)."""
        start = time.perf_counter()
        try:
            self._push_weights()
        except Exception as err:
            raise SamplerError(
                f"{self.sync_description} failed ({type(err).__name__}: {_shorten(err)}); training stops rather than "
                "sample from stale weights."
            ) from err
        self.stale = False
        self.num_syncs += 1
        self.sync_seconds = time.perf_counter() - start

    @abc.abstractmethod
    def _push_weights(self) -> None:
        """Send every weight of the policy to the engine (the subclass's transport)."""


class VLLMColocateSampler(_VLLMSamplerBase):
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

    @torch.no_grad()
    def generate(
        self,
        query_ids: torch.Tensor,
        query_mask: torch.Tensor,
        greedy: bool,
        temperature: float,
        max_new_tokens: int | None = None,
    ) -> Samples:
        from vllm import SamplingParams

        if self.stale:
            self.sync_weights()
        start = time.perf_counter()
        prompts = [{"prompt_token_ids": ids} for ids in unpadded_prompts(query_ids, query_mask)]
        kwargs = self.sampling_kwargs(greedy, temperature, max_new_tokens)
        check_prompts_fit([len(p["prompt_token_ids"]) for p in prompts], kwargs["max_tokens"], self.max_model_length)
        params = SamplingParams(**kwargs, detokenize=False)
        try:
            if self.enable_sleep_mode:
                self.llm.wake_up(tags=["kv_cache"])
            outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)
            if self.enable_sleep_mode:
                self.llm.sleep(level=1)
        except Exception as err:
            raise SamplerError(f"vLLM generation failed ({type(err).__name__}: {err}).") from err
        completions = [list(o.outputs[0].token_ids) for o in outputs]
        logprobs = [sampled_logprobs(o.outputs[0]) for o in outputs]
        samples = samples_from_token_lists(
            completions, logprobs, self.stop_token_ids, pad_token_id=self.tokenizer.pad_token_id, device=self.device
        )
        samples.seconds = time.perf_counter() - start
        return samples

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


def _shorten(err: Exception, limit: int = 600) -> str:
    """An exception's message, cut to `limit` characters (vLLM lists every supported architecture in some errors)."""
    text = str(err)
    return text if len(text) <= limit else text[:limit] + " [...]"


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
                f"vLLM could not start an engine for this policy ({type(err).__name__}: {_shorten(err)}). Check that vLLM "
                f"supports the architecture ({config.architectures}), that vllm_max_model_length="
                f"{engine_args['max_model_len']} fits the model, and the memory settings (vllm_gpu_memory_utilization "
                "on a GPU, VLLM_CPU_KVCACHE_SPACE on a CPU); or set use_vllm=False."
            ) from err


def sampled_logprobs(completion) -> list[float]:
    """The log-probability of each sampled token from a vLLM `CompletionOutput` (requested with `logprobs=0`)."""
    if completion.logprobs is None:
        return []
    return [step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids)]


class VLLMServerSampler(_VLLMSamplerBase):
    """
    Generation on a separate `vllm serve` process through TRL's `VLLMClient` (`vllm_mode="server"`).

    The server is started by the user (see docs/vllm.md), with the same model; weights are pushed to it after every
    policy update over the NCCL communicator TRL's client sets up, which needs a CUDA device: on a CPU the trainer
    refuses server mode before training (generation alone works against a CPU server, as the tests show).
    Only the main process talks to the server; every process gets its own prompts' responses back.

    Unlike TRL's `VLLMGeneration` in server mode, requests carry a read timeout (`vllm_server_timeout`), so a server
    that stops answering ends the run with an error naming its URL instead of hanging.
    """

    name = "vllm-server"

    def __init__(
        self,
        policy_provider: Callable[[], torch.nn.Module],
        gather: Callable,
        accelerator,
        tokenizer: PreTrainedTokenizerBase,
        stop_token_ids: list[int],
        response_length: int,
        base_url: str,
        timeout: float,
        group_port: int = 51216,
        init_communicator: bool = True,
        needed_length: int | None = None,
        knobs: SamplingKnobs = NO_KNOBS,
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
        self.base_url = base_url
        self.sync_description = f"Pushing the policy's weights to the vLLM server at {base_url}"
        self.timeout = timeout
        self.client = None
        self._weight_metadata = None  # names, dtypes and shapes the server expects; constant after the first sync
        if init_communicator and accelerator.device.type != "cuda":
            raise ValueError(
                "vllm_mode='server' pushes the policy's weights to the server over NCCL, which needs CUDA devices; "
                f"this run is on {accelerator.device.type}. Use vllm_mode='colocate' (which works on CPU) or "
                "use_vllm=False."
            )
        problem = [None]  # decided by the main process, raised by every process (none waits at a barrier forever)
        if accelerator.is_main_process:
            start = time.perf_counter()
            problem[0] = self._connect(group_port, needed_length)
            if problem[0] is None and init_communicator:
                try:
                    self.client.init_communicator(device=accelerator.device)
                except Exception as err:
                    problem[0] = (
                        f"No vLLM server weight-update group at {self.base_url} (group port {group_port}): "
                        f"{type(err).__name__}: {_shorten(err)}. Start the server with TRL's settings (docs/vllm.md)."
                    )
            self.start_seconds = time.perf_counter() - start
        if accelerator.num_processes > 1:
            from accelerate.utils import broadcast_object_list

            broadcast_object_list(problem, from_process=0)
        if problem[0] is not None:
            error = SamplerError if problem[0].startswith("No vLLM server") else ValueError
            raise error(problem[0])

    def _connect(self, group_port: int, needed_length: int | None) -> str | None:
        """Connect to the server (main process); returns what is wrong, or `None`."""
        from requests.adapters import HTTPAdapter, Retry
        from trl.generation.vllm_client import VLLMClient

        try:
            self.client = VLLMClient(base_url=self.base_url, group_port=group_port, connection_timeout=self.timeout)
        except Exception as err:
            return (
                f"No vLLM server answered at {self.base_url} within vllm_server_timeout={self.timeout:g} s "
                f"({type(err).__name__}: {_shorten(err)}). Start one (see docs/vllm.md) or fix "
                "vllm_server_base_url / vllm_server_host / vllm_server_port."
            )
        # Requests fail after `timeout` seconds without an answer, and retry a dead server only briefly.
        adapter = HTTPAdapter(max_retries=Retry(total=2, connect=2, read=0, status=0, backoff_factor=0.5))
        self.client.session.mount("http://", adapter)
        self.client.session.mount("https://", adapter)
        self.client.session.post = functools.partial(self.client.session.post, timeout=self.timeout)
        server_length = self.server_max_model_length()
        if needed_length is not None and server_length is not None and needed_length > server_length:
            return (
                f"Prompt plus response need up to {needed_length} tokens but the vLLM server at {self.base_url} serves "
                f"a context of {server_length} (its --max-model-len): restart it with a longer one, or lower "
                "max_prompt_length / response_length."
            )
        return None

    def server_max_model_length(self) -> int | None:
        """The server's context length, from its `/server_info` (dev mode); `None` when it does not say."""
        try:
            info = self.client.get_server_info()
            return int(info["model_config"]["max_model_len"])
        except Exception:
            return None

    def _push_weights(self) -> None:
        """Stream the policy's weights to the server over NCCL (every process takes part in the ZeRO-3 gathers)."""
        policy = self.policy_provider()
        if self._weight_metadata is None:  # one extra pass (with its ZeRO-3 gathers) on the first sync only
            self._weight_metadata = [
                (n, str(p.dtype).removeprefix("torch."), list(p.shape))
                for n, p in named_policy_weights(policy, self.gather)
            ]
        if self.client is not None:
            self.client.update_named_params(self._weight_metadata, named_policy_weights(policy, self.gather))
            self.client.reset_prefix_cache()
        else:
            for _ in named_policy_weights(policy, self.gather):  # take part in the ZeRO-3 gathers
                pass

    @torch.no_grad()
    def generate(
        self,
        query_ids: torch.Tensor,
        query_mask: torch.Tensor,
        greedy: bool,
        temperature: float,
        max_new_tokens: int | None = None,
    ) -> Samples:
        from accelerate.utils import broadcast_object_list, gather_object

        if self.stale:
            self.sync_weights()
        start = time.perf_counter()
        prompts = unpadded_prompts(query_ids, query_mask)
        all_prompts = gather_object(prompts) if self.accelerator.num_processes > 1 else prompts
        payload = [None]
        if self.client is not None:
            kwargs = self.sampling_kwargs(greedy, temperature, max_new_tokens)
            kwargs.pop("n")
            generation_kwargs = {k: kwargs.pop(k) for k in ("stop_token_ids", "ignore_eos")}
            try:
                out = self.client.generate(prompts=all_prompts, n=1, generation_kwargs=generation_kwargs, **kwargs)
                payload = [(out["completion_ids"], [[lp[0] for lp in row] for row in out["logprobs"]])]
            except Exception as err:
                payload = [f"{type(err).__name__}: {err}"]
        if self.accelerator.num_processes > 1:
            broadcast_object_list(payload, from_process=0)
        if isinstance(payload[0], str):
            raise SamplerError(f"The vLLM server at {self.base_url} failed to generate ({payload[0]}).")
        completions, logprobs = payload[0]
        first = self.accelerator.process_index * len(prompts)
        mine = slice(first, first + len(prompts))
        samples = samples_from_token_lists(
            completions[mine],
            logprobs[mine],
            self.stop_token_ids,
            pad_token_id=self.tokenizer.pad_token_id,
            device=self.device,
        )
        samples.seconds = time.perf_counter() - start
        return samples

    def close(self) -> None:
        if self.client is not None and self.client.communicator is not None:
            with contextlib.suppress(Exception):
                self.client.close_communicator()

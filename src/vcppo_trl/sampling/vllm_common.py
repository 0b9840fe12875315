"""What the vLLM samplers (colocate, [`~sampling.vllm_colocate`]; server, [`~sampling.vllm_server`]) share.

Both sample with the trainer's temperature and knobs (top-k, top-p, min-p, repetition penalty) and return the
sampler's own log-probabilities of the sampled tokens under the distribution it drew from (vLLM's processed log-probs:
after the penalty, the temperature, min-p, top-k and top-p, in that order), which the trainer compares with its
training forward (`sampling/...` metrics, importance-sampling correction), computed in the same order. The checks the
trainer runs before any engine starts, and the policy's weights in the form both load, are in [`~sampling.vllm_checks`].

- [`VLLMSamplerBase`]: the sampling parameters, the stale flag and the weight sync's bookkeeping, and `generate`'s
  skeleton (sync if stale, unpad the prompts, sample through the subclass's transport, cut and pad into `Samples`).
- [`completions_and_logprobs`]: an in-process engine's outputs as token lists and sampled log-probs (the colocated
  sampler's and the rollout worker's engine).

Nothing here imports vLLM at module level: the package works without it.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from typing import Any

import torch

from ..algo.logits_processing import NO_KNOBS, VLLM_ORDER, SamplingKnobs, require_order
from .seam import SamplerError, Samples, samples_from_token_lists, unpadded_prompts

__all__ = ["VLLMSamplerBase", "completions_and_logprobs", "sampled_logprobs", "short_message"]


class VLLMSamplerBase(abc.ABC):
    """What colocate and server share: sampling parameters, the stale flag, the weight sync's bookkeeping, and
    `generate`, around the subclass's transport ([`_sample`])."""

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
                f"{self.sync_description} failed ({type(err).__name__}: {short_message(err)}); training stops rather "
                "than sample from stale weights."
            ) from err
        self.stale = False
        self.num_syncs += 1
        self.sync_seconds = time.perf_counter() - start

    @torch.no_grad()
    def generate(
        self,
        query_ids: torch.Tensor,
        query_mask: torch.Tensor,
        greedy: bool,
        temperature: float,
        max_new_tokens: int | None = None,
    ) -> Samples:
        if self.stale:
            self.sync_weights()
        start = time.perf_counter()
        prompts = unpadded_prompts(query_ids, query_mask)
        completions, logprobs = self._sample(prompts, self.sampling_kwargs(greedy, temperature, max_new_tokens))
        samples = samples_from_token_lists(
            completions, logprobs, self.stop_token_ids, pad_token_id=self.tokenizer.pad_token_id, device=self.device
        )
        samples.seconds = time.perf_counter() - start
        return samples

    @abc.abstractmethod
    def _sample(self, prompts: list[list[int]], kwargs: dict[str, Any]) -> tuple[list[list[int]], list[list[float]]]:
        """This process's prompts' completions and their sampled log-probs, drawn with `kwargs` ([`sampling_kwargs`],
        which the subclass may reshape for its transport); a failure raises `SamplerError`."""

    @abc.abstractmethod
    def _push_weights(self) -> None:
        """Send every weight of the policy to the engine (the subclass's transport)."""


def short_message(err: Exception, limit: int = 600) -> str:
    """An exception's message, cut to `limit` characters (vLLM lists every supported architecture in some errors)."""
    text = str(err)
    return text if len(text) <= limit else text[:limit] + " [...]"


def sampled_logprobs(completion) -> list[float]:
    """The log-probability of each sampled token from a vLLM `CompletionOutput` (requested with `logprobs=0`)."""
    if completion.logprobs is None:
        return []
    return [step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids)]


def completions_and_logprobs(outputs) -> tuple[list[list[int]], list[list[float]]]:
    """The first completion of each vLLM `RequestOutput`: its token ids and their sampled log-probs."""
    return [list(o.outputs[0].token_ids) for o in outputs], [sampled_logprobs(o.outputs[0]) for o in outputs]

"""The HF sampler: `model.generate` behind the sampling seam, with the policy's own generation defaults neutralised and
the trainer's sampling knobs (temperature, top-k, top-p, min-p, repetition penalty) the only logits processing."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from accelerate.utils import is_peft_model
from transformers import GenerationConfig, PreTrainedTokenizerBase

from ..algo.logits_processing import NO_KNOBS, TRANSFORMERS_ORDER, SamplingKnobs, require_order
from ..models.modes import eval_mode
from .seam import Samples, truncate_at_stop

# ---------------------------------------------------------------------------------------------------- HF generate


class HFSampler:
    """
    `generate` on the training model, in eval mode, with a blank default generation config (see
    [`clean_generation_defaults`]) and the sampling knobs set, in chunks of `local_rollout_forward_batch_size` prompts.

    Args:
        model_provider: Returns the (possibly wrapped) joint policy-and-critic model; called at every generation
            because the trainer wraps the model only when training starts.
        accelerator: The trainer's accelerator.
        tokenizer: The policy's tokenizer (pad and BOS ids).
        stop_token_ids: Ids that end a response.
        response_length: Maximum new tokens.
        chunk_size: Prompts per `generate` call.
        gather_deepspeed3_params: Gather ZeRO-3 parameters for generation (`ds3_gather_for_generation`).
        knobs: Top-k, top-p, min-p and the repetition penalty of sampled (not greedy) generations
            ([`~algo.logits_processing.SamplingKnobs`]; none by default), the distribution the trainer scores.
    """

    name = "hf"

    def __init__(
        self,
        model_provider: Callable[[], torch.nn.Module],
        accelerator,
        tokenizer: PreTrainedTokenizerBase,
        stop_token_ids: list[int],
        response_length: int,
        chunk_size: int,
        gather_deepspeed3_params: bool = True,
        knobs: SamplingKnobs = NO_KNOBS,
    ):
        self.model_provider = model_provider
        self.accelerator = accelerator
        self.tokenizer = tokenizer
        self.stop_token_ids = stop_token_ids
        self.response_length = response_length
        self.chunk_size = chunk_size
        self.gather_deepspeed3_params = gather_deepspeed3_params
        require_order(knobs, TRANSFORMERS_ORDER, sampler="transformers' generate")
        self.knobs = knobs
        self.start_seconds = 0.0

    def generation_config(
        self, greedy: bool, temperature: float, max_new_tokens: int | None = None
    ) -> GenerationConfig:
        """
        The temperature and the knobs, nothing else: the distribution the training forward computes log-probs under
        (`generate` applies the repetition penalty, then the temperature, top-k, top-p and min-p; TRL's `top_k=0` is
        transformers' "off" too). Greedy decoding is the argmax of the model's own logits: no knob applies.
        """
        knobs = self.knobs
        return GenerationConfig(
            max_new_tokens=self.response_length if max_new_tokens is None else max_new_tokens,
            do_sample=not greedy,
            temperature=None if greedy else temperature,
            top_k=None if greedy else knobs.top_k,
            top_p=None if greedy else knobs.top_p,
            min_p=None if greedy else knobs.min_p,
            repetition_penalty=None if greedy else knobs.repetition_penalty,
            eos_token_id=self.stop_token_ids,
            pad_token_id=self.tokenizer.pad_token_id,
            bos_token_id=self.tokenizer.bos_token_id,
        )

    @torch.no_grad()
    def generate(
        self,
        query_ids: torch.Tensor,
        query_mask: torch.Tensor,
        greedy: bool,
        temperature: float,
        max_new_tokens: int | None = None,
    ) -> Samples:
        from trl.models import unwrap_model_for_generation

        start = time.perf_counter()
        config = self.generation_config(greedy, temperature, max_new_tokens)
        with unwrap_model_for_generation(
            self.model_provider(), self.accelerator, gather_deepspeed3_params=self.gather_deepspeed3_params
        ) as unwrapped:
            samples = sample_with_policy(
                unwrapped.policy,
                query_ids,
                query_mask,
                config=config,
                chunk_size=self.chunk_size,
                stop_token_ids=self.stop_token_ids,
            )
        samples.seconds = time.perf_counter() - start
        return samples

    def mark_stale(self) -> None:  # generates from the training weights themselves
        pass

    def close(self) -> None:
        pass


@torch.no_grad()
def sample_with_policy(
    policy: torch.nn.Module,
    query_ids: torch.Tensor,
    query_mask: torch.Tensor,
    *,
    config: GenerationConfig,
    chunk_size: int,
    stop_token_ids: list[int],
    with_logprobs: bool = False,
) -> Samples:
    """
    `policy.generate` over left-padded prompts in chunks of `chunk_size`, in eval mode and with the policy's own
    generation defaults set aside, cut at the stop tokens ([`~sampling.seam.truncate_at_stop`]).

    `with_logprobs`: also return the sampler's log-probability of each sampled token under the distribution it sampled
    from (the scores `generate` samples from: the logits after its processors, the temperature and the knobs of
    `config`), float32 and 0 outside the mask:
    the behaviour policy's log-probs that an importance weight divides by. Off, the samples carry none (as before).
    """
    pad = config.pad_token_id
    pieces, logprob_pieces = [], []
    scored_config = copy.deepcopy(config)  # the same sampling, with the scores it sampled from
    scored_config.output_scores, scored_config.return_dict_in_generate = True, True
    with eval_mode(policy), clean_generation_defaults(policy):
        for first in range(0, query_ids.shape[0], chunk_size):
            ids, mask = query_ids[first : first + chunk_size], query_mask[first : first + chunk_size]
            if not with_logprobs:
                out = policy.generate(input_ids=ids, attention_mask=mask, generation_config=config)
                pieces.append(out[:, ids.shape[1] :])
                continue
            out = policy.generate(input_ids=ids, attention_mask=mask, generation_config=scored_config)
            new = out.sequences[:, ids.shape[1] :]
            scores = torch.stack(out.scores, dim=1).float()  # [b, t, V]: what each step sampled from
            logprob_pieces.append(torch.log_softmax(scores, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1))
            pieces.append(new)
    width = max(p.shape[1] for p in pieces)
    responses = torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1]), value=pad) for p in pieces])
    response_ids, response_mask, has_stop = truncate_at_stop(responses, stop_token_ids, pad)
    logprobs = None
    if with_logprobs:
        logprobs = torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in logprob_pieces])
        logprobs = (logprobs * response_mask).nan_to_num(0.0)  # -inf of a forced pad after the stop: outside the mask
    return Samples(response_ids, response_mask, has_stop, logprobs=logprobs)


# Fields of a model's generation config that do not change which tokens are sampled (ids, lengths, caching, outputs).
_GENERATION_FIELDS_THAT_DO_NOT_SAMPLE = {
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "decoder_start_token_id",
    "max_length",
    "max_new_tokens",
    "use_cache",
    "cache_implementation",
    "do_sample",
    "cache_config",
    "transformers_version",
    "_from_model_config",
    "output_attentions",
    "output_hidden_states",
    "output_scores",
    "output_logits",
    "return_dict_in_generate",
}


def _generating_model(policy: torch.nn.Module) -> torch.nn.Module:
    """The transformers model whose `generation_config` `generate` reads (the base model of a PEFT model)."""
    return policy.get_base_model() if is_peft_model(policy) else policy


def neutralised_generation_fields(policy: torch.nn.Module) -> dict[str, Any]:
    """
    Settings of the policy's own `generation_config` that would change the sampling distribution (repetition penalty,
    `min_p`, `top_k`, `no_repeat_ngram_size`, `bad_words_ids`, `min_new_tokens`, beams, ...) and that PPO ignores.
    """
    config = getattr(_generating_model(policy), "generation_config", None)
    if config is None:
        return {}
    return {k: v for k, v in config.to_diff_dict().items() if k not in _GENERATION_FIELDS_THAT_DO_NOT_SAMPLE}


@contextlib.contextmanager
def clean_generation_defaults(policy: torch.nn.Module) -> Iterator[None]:
    """
    Set the policy's `generation_config` aside while generating.

    transformers fills every field a `GenerationConfig` passed to `generate` leaves unset from the model's own
    `generation_config`, so a checkpoint that ships `repetition_penalty`, `min_p`, `bad_words_ids`... would sample from
    another distribution than the one PPO's ratio assumes. With a blank default only what the trainer sets applies:
    the temperature and the config's own knobs (`top_k`, `top_p`, `min_p`, `repetition_penalty`), which the trainer
    scores.
    """
    model = _generating_model(policy)
    saved = getattr(model, "generation_config", None)
    if saved is None:
        yield
        return
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved

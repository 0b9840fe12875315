"""The sampling seam: one interface for HF `generate` and vLLM, the samples it returns, and the stop-token cut.

A sampler turns left-padded prompts into responses cut at the stop token, exactly as [`~sampling.seam.truncate_at_stop`]
cuts them, so the trainer's rollout and evaluation do not care which one sampled. Every sampler samples at the given
temperature with the trainer's sampling knobs (top-k, top-p, min-p, repetition penalty,
[`~algo.logits_processing.SamplingKnobs`], in its own order) and no other logits processing (no model defaults), the
distribution the trainer's log-probabilities are taken under; greedy decoding takes the raw argmax. It stops at the
trainer's stop tokens only (the model's own EOS does not stop a response unless it is one of them) and generates at
most `response_length` tokens, or `max_new_tokens` when the caller gives it (a generation window: the "prompts" are
then prompts with the response so far, as token ids, and the samples are the window's new tokens).

- [`~sampling.hf.HFSampler`]: `model.generate` on the training model (ZeRO-3 parameters gathered for generation).
- [`~sampling.vllm_colocate.VLLMColocateSampler`] and [`~sampling.vllm_server.VLLMServerSampler`]: vLLM in each
  training process, or a `vllm serve` process (their shared skeleton in [`~sampling.vllm_common`]); they also return
  the sampler's own log-probabilities of the sampled tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class SamplerError(RuntimeError):
    """The sampler failed (engine error, server gone, weight sync failed): training stops rather than go on stale."""


@dataclass
class Samples:
    """
    Responses of one generation call, all on the trainer's device.

    `response_ids`, `response_mask` and `has_stop` are as [`~sampling.seam.truncate_at_stop`] returns them. `logprobs` holds
    the sampler's log-probability of each sampled token under the distribution it sampled from (`[B, T]` float32, 0
    outside the mask), or `None` when the sampler does not report them (HF `generate`).
    """

    response_ids: torch.Tensor
    response_mask: torch.Tensor
    has_stop: torch.Tensor
    logprobs: torch.Tensor | None = None
    seconds: float = 0.0
    # [B, T] bool, True on the policy's own tokens: tool and environment tokens inside a response are context, not
    # actions (out of every loss, the KL and the token counts; GAE runs over the policy's tokens). None: all of them.
    action_mask: torch.Tensor | None = None
    # Tool episodes: per-sample counts (`[B]` float each: tool calls, failures, malformed calls, overflows, turns).
    episode_counts: dict[str, torch.Tensor] | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.response_mask.sum())


class Sampler(Protocol):
    """What the trainer needs from a generation backend."""

    name: str
    start_seconds: float

    def generate(
        self,
        query_ids: torch.Tensor,
        query_mask: torch.Tensor,
        greedy: bool,
        temperature: float,
        max_new_tokens: int | None = None,
    ) -> Samples: ...

    def mark_stale(self) -> None:
        """The policy's weights changed: load them into the sampler before its next generation."""

    def close(self) -> None: ...


def pad_responses(
    sequences: list[list[int]], pad_token_id: int, device: torch.device, width: int | None = None
) -> torch.Tensor:
    """Right-pad token lists into a `[B, max(len)]` tensor (at least one column)."""
    width = max([len(s) for s in sequences] + [1]) if width is None else width
    out = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    for i, seq in enumerate(sequences):
        if seq:
            out[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out.to(device)


def samples_from_token_lists(
    completion_ids: list[list[int]],
    logprobs: list[list[float]] | None,
    stop_token_ids: list[int],
    pad_token_id: int,
    device: torch.device,
) -> Samples:
    """Pad a backend's completions and cut them at the stop token exactly as the HF path does."""
    responses, mask, has_stop = truncate_at_stop(
        pad_responses(completion_ids, pad_token_id, device), stop_token_ids, pad_token_id
    )
    sampler_logprobs = None
    if logprobs is not None:
        padded = torch.zeros(responses.shape, dtype=torch.float32)
        for i, row in enumerate(logprobs):
            if row:
                padded[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
        sampler_logprobs = padded.to(device) * mask
    return Samples(responses, mask, has_stop, logprobs=sampler_logprobs)


def unpadded_prompts(query_ids: torch.Tensor, query_mask: torch.Tensor) -> list[list[int]]:
    """Left-padded prompt ids as token lists without their padding."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(query_ids.cpu(), query_mask.cpu())]


def truncate_at_stop(
    responses: torch.Tensor, stop_token_ids: list[int], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """
    Cut generated responses after their first stop token.

    The mask is built from the position of the first stop token, never from `ids != pad_token_id` (which would hide a
    real EOS token when the tokenizer pads with EOS).

    Args:
        responses (`torch.Tensor` of shape `[B, T]`): Generated token ids.
        stop_token_ids (`list[int]`): Ids that end a response.
        pad_token_id (`int`): Id written after the stop token.

    Returns:
        `(responses, response_mask, has_stop)`: padded ids `[B, T]`, bool mask `[B, T]` of the valid tokens (the stop
        token included), and bool `[B]` telling whether a stop token was produced.
    """
    is_stop = torch.isin(responses, torch.tensor(stop_token_ids, device=responses.device))
    has_stop = is_stop.any(dim=1)
    length = responses.shape[1]
    first_stop = torch.where(
        has_stop, is_stop.int().argmax(dim=1), torch.full_like(has_stop, length - 1, dtype=torch.long)
    )
    positions = torch.arange(length, device=responses.device).unsqueeze(0)
    response_mask = positions <= first_stop.unsqueeze(1)
    responses = torch.where(response_mask, responses, torch.full_like(responses, pad_token_id))
    return responses, response_mask, has_stop


def left_pad(sequences: list[list[int]], pad_token_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists left-padded into `(ids, mask)` `[B, max(len)]` (at least one column)."""
    width = max([len(s) for s in sequences] + [1])
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        if seq:
            ids[i, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[i, width - len(seq) :] = 1
    return ids.to(device), mask.to(device)


def right_pad(
    sequences: list[list[int]] | list[list[float]], pad_value: float, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Lists right-padded into `[B, max(len)]` (at least one column)."""
    width = max([len(s) for s in sequences] + [1])
    out = torch.full((len(sequences), width), pad_value, dtype=dtype)
    for i, seq in enumerate(sequences):
        if seq:
            out[i, : len(seq)] = torch.tensor(seq, dtype=dtype)
    return out.to(device)

"""How one batch of prompts becomes episodes ([`EpisodeKind`]): one turn on the trainer's sampler ([`SingleTurn`]),
TRL's `tools=` loop or `environment_factory` ([`ToolLoopEpisodes`]: multi-turn, tokens in and tokens out), or a
user's `rollout_func` ([`RolloutFunctionEpisodes`]). Each gives the same [`SampledBatch`] to score, so the rollout
sources compose with any of them without naming it."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import torch

from ..sampling.seam import Samples
from .rollout_function import sample_with_rollout_function
from .tool_loop import flag_on_any_process, sample_tool_episodes


@dataclasses.dataclass
class SampledBatch:
    """One batch of episodes, ready to score."""

    rows: list[dict[str, Any]]  # the dataset rows, with a `rollout_func`'s extra keys or the episodes' `environments`
    query_ids: torch.Tensor  # [B, P] left-padded prompts
    query_mask: torch.Tensor  # [B, P]
    samples: Samples  # the responses (with `action_mask` where tool or environment tokens are in them)
    prompt_texts: list[str]
    messages: list[list[dict]] | None  # tool episodes as messages (TRL gives them to reward functions), else None


@runtime_checkable
class EpisodeKind(Protocol):
    """How a batch of prompts becomes episodes. `name` says which (for messages and docs):
    `"single_turn"`, `"tools"`, `"environment"` or `"rollout_func"`."""

    name: str

    def sample(
        self, rows: list[dict[str, Any]], *, greedy: bool, temperature: float | None, num_generations: int | None
    ) -> SampledBatch: ...


def response_tensors(maker) -> dict[str, Any]:
    """What turns token lists into padded response tensors (`function_rollouts`' keywords)."""
    return dict(
        response_length=maker.settings.response_length,
        stop_token_ids=maker.stop_token_ids,
        pad_token_id=maker.tokenizer.pad_token_id,
        device=maker.accelerator.device,
    )


@dataclasses.dataclass
class SingleTurn:
    """One response per row from the maker's sampler."""

    maker: Any
    name: str = "single_turn"

    def sample(self, rows, *, greedy, temperature, num_generations) -> SampledBatch:
        prompt_texts = self.maker.prompt_texts(rows)
        query_ids, query_mask = self.maker.tokenize_prompts(prompt_texts)
        samples = self.maker.generate(query_ids, query_mask, greedy=greedy, temperature=temperature)
        return SampledBatch(
            rows, query_ids, query_mask=query_mask, samples=samples, prompt_texts=prompt_texts, messages=None
        )


@dataclasses.dataclass
class ToolLoopEpisodes:
    """Multi-turn episodes of the maker's tool loop (TRL's `tools=`, or an `environment_factory`'s methods) on its
    sampler."""

    maker: Any

    @property
    def name(self) -> str:
        return "tools" if self.maker.tool_loop.environments is None else "environment"

    def sample(self, rows, *, greedy, temperature, num_generations) -> SampledBatch:
        maker = self.maker
        rows, query_ids, query_mask, samples, prompt_texts, messages = sample_tool_episodes(
            maker.tool_loop,
            maker.sampler,
            rows,
            greedy=greedy,
            temperature=temperature or maker.settings.temperature,
            tokenize=maker.tokenize_prompts,
            any_process=flag_on_any_process(maker.accelerator),
            **response_tensors(maker),
        )
        return SampledBatch(
            rows, query_ids, query_mask=query_mask, samples=samples, prompt_texts=prompt_texts, messages=messages
        )


@dataclasses.dataclass
class RolloutFunctionEpisodes:
    """A user's `rollout_func` (TRL's signature), given each prompt `num_generations` times in a row."""

    maker: Any
    name: str = "rollout_func"

    def sample(self, rows, *, greedy, temperature, num_generations) -> SampledBatch:
        maker = self.maker
        prompt_texts = maker.prompt_texts(rows)
        k = num_generations or maker.settings.num_generations
        rows, query_ids, query_mask, samples = sample_with_rollout_function(
            maker.rollout_function, rows, k, **response_tensors(maker)
        )
        return SampledBatch(
            rows, query_ids, query_mask=query_mask, samples=samples, prompt_texts=prompt_texts, messages=None
        )


def episode_kind(maker) -> EpisodeKind:
    """The maker's kind of episode: its tool loop's, its `rollout_func`'s, or one turn on its sampler."""
    if maker.tool_loop is not None:
        return ToolLoopEpisodes(maker)
    if maker.rollout_function is not None:
        return RolloutFunctionEpisodes(maker)
    return SingleTurn(maker)

"""Generation windows (`generation_window`): a pool of in-flight responses that each update extends by at most W
tokens, so an update no longer waits for its longest response (T-PPO, arXiv 2506.15050: successive batching and
extended GAE over a window).

[`ResponsePool`] holds one process's responses between updates as token ids (never decoded and re-encoded): each
update refills the slots of responses that finished with fresh prompts, continues every response from its prompt
and the tokens sampled so far, and reports which ones finished (at a stop token, or at `response_length`; a window's
cut is neither). The rollout maker turns the pool into a [`~rollout.types.Rollout`] whose `window_mask` marks the
tokens this update sampled (the policy's) and whose `finished` rows carry a score (the critic's).
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable
from typing import Any

import torch
from accelerate import Accelerator

from ..episodes import ToolEpisode
from ..sampling.seam import Samples, left_pad, right_pad


@dataclasses.dataclass
class InFlight:
    """One response of the pool: its dataset row, prompt ids (templated, tokenised, truncated) and what is sampled."""

    row: dict[str, Any]
    prompt_ids: list[int]
    response_ids: list[int] = dataclasses.field(default_factory=list)
    sampler_logprobs: list[float] = dataclasses.field(default_factory=list)  # empty when the sampler gives none
    windows: int = 0  # updates that sampled part of it
    # Per response token: policy updates since the weights that sampled it (`Rollout.token_staleness`).
    token_staleness: list[int] = dataclasses.field(default_factory=list)
    # With `tools`: the episode's state (its response is the episode's completion); `None` without tools, and then
    # left out of the checkpoint's state, whose format is the one saved before tools could take a window.
    episode: ToolEpisode | None = None
    environment: Any = None  # with `environment_factory`: the episode's environment instance

    def state_dict(self) -> dict[str, Any]:
        state = dataclasses.asdict(dataclasses.replace(self, environment=None))  # the episode's as plain data
        if self.episode is None:
            del state["episode"]
        del state["environment"]
        if self.environment is not None:
            state["environment"] = pickled_environment(self.environment)
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> InFlight:
        episode, environment = state.get("episode"), state.get("environment")
        return cls(
            **{
                **state,
                "episode": None if episode is None else ToolEpisode.from_state(episode),
                "environment": None if environment is None else pickle.loads(environment),
            }
        )


def pickled_environment(instance: Any) -> bytes:
    """An in-flight episode's environment as a checkpoint keeps it, or an error that names its class and the fix."""
    try:
        return pickle.dumps(instance)
    except Exception as err:
        name = type(instance).__name__
        raise ValueError(
            f"The environment {name} of an episode in flight cannot be pickled ({type(err).__name__}: {err}), and a "
            f"checkpoint under generation_window keeps each in-flight episode's environment to resume it. Make "
            f"{name} picklable (define __getstate__ and __setstate__ that leave out and rebuild what cannot be "
            "pickled: a connection, a process, a lock), or unset generation_window, or save no checkpoint."
        ) from err


@dataclasses.dataclass(frozen=True)
class WindowStep:
    """What one window did to the pool: each slot's tokens before it, and whether the slot's response finished."""

    starts: list[int]  # response tokens each slot had before this window
    finished: list[bool]
    has_stop: list[bool]
    windows: list[int]  # windows each slot's response has been sampled over, this one included
    new_tokens: int  # tokens sampled in this window (within the budgets)
    prefilled_tokens: int  # response tokens sampled earlier and prefilled again as context
    in_flight: int = 0  # responses left in the pool once the finished ones left it

    def metrics(self, accelerator: Accelerator) -> dict[str, float]:
        """
        This window over all processes (a collective: every process calls it): `rollout/finished_responses`
        (responses that finished and were scored), `rollout/window_tokens` (tokens sampled, the policy's),
        `rollout/prefilled_tokens` (earlier tokens of continued responses, run again as context), `rollout/in_flight`
        (responses carried to the next update) and `rollout/windows_per_finished_mean` (policy versions that sampled a
        finished response).
        """
        finished_windows = [w for w, done in zip(self.windows, self.finished) if done]
        counts = torch.tensor(
            [sum(self.finished), self.new_tokens, self.prefilled_tokens, self.in_flight, sum(finished_windows)],
            dtype=torch.float64,
            device=accelerator.device,
        )
        if accelerator.num_processes > 1:
            counts = accelerator.reduce(counts, "sum")
        finished, new, prefilled, in_flight, windows = counts.tolist()
        metrics = {
            "rollout/finished_responses": finished,
            "rollout/window_tokens": new,
            "rollout/prefilled_tokens": prefilled,
            "rollout/in_flight": in_flight,
        }
        if finished:
            metrics["rollout/windows_per_finished_mean"] = windows / finished
        return metrics


class ResponsePool:
    """
    One process's in-flight responses (a fixed number of slots: `rollout_pool_size`, by default the local rollout
    batch).

    Args:
        size: Slots (responses per update).
        window: Tokens decoded per response per update (`generation_window`).
        response_length: A response finishes at this many tokens if no stop token came first.
    """

    def __init__(self, size: int, window: int, response_length: int):
        self.size = size
        self.window = window  # at least 1: PPOConfig checks generation_window, once
        self.response_length = response_length
        self.slots: list[InFlight] = []
        self.pending: list[dict[str, Any]] = []  # rows drawn from the prompt stream, not started yet

    def refill(
        self,
        draw: Callable[[], list[dict[str, Any]]],
        tokenize: Callable[[list[dict[str, Any]]], list[list[int]]],
    ) -> int:
        """Fill the empty slots with the next rows (drawing whole batches from `draw` as needed, the rest kept for the
        next refill) and their prompt ids (`tokenize`); returns the number of slots filled."""
        needed = self.size - len(self.slots)
        while len(self.pending) < needed:
            self.pending.extend(draw())
        rows, self.pending = self.pending[:needed], self.pending[needed:]
        if rows:
            self.slots.extend(InFlight(row, ids) for row, ids in zip(rows, tokenize(rows)))
        return len(rows)

    def budget(self) -> int:
        """New tokens this window decodes: the window, or less when every response is nearer its end."""
        return min(self.window, max(self.response_length - len(s.response_ids) for s in self.slots))

    def contexts(self, pad_token_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Each slot's prompt and response so far, left-padded, as the sampler's "prompts" `(ids, mask)`."""
        sequences = [s.prompt_ids + s.response_ids for s in self.slots]
        return left_pad(sequences, pad_token_id, device)

    def advance(self, samples: Samples) -> WindowStep:
        """Append each slot's new tokens (cut at its remaining budget) and tell which responses finished."""
        starts, finished, has_stop = [], [], []
        new_tokens = prefilled = 0
        lengths = samples.response_mask.sum(1).tolist()
        stops = samples.has_stop.tolist()
        ids = samples.response_ids.tolist()
        logprobs = samples.logprobs.tolist() if samples.logprobs is not None else None
        for i, slot in enumerate(self.slots):
            start = len(slot.response_ids)
            room = self.response_length - start
            take = min(int(lengths[i]), room)
            stopped = bool(stops[i]) and int(lengths[i]) <= room  # a stop past the budget was never sampled
            slot.response_ids.extend(ids[i][:take])
            if logprobs is not None:
                slot.sampler_logprobs.extend(logprobs[i][:take])
            slot.windows += 1
            starts.append(start)
            finished.append(stopped or start + take >= self.response_length)
            has_stop.append(stopped)
            new_tokens += take
            prefilled += start
        return WindowStep(
            starts,
            finished,
            has_stop,
            windows=[slot.windows for slot in self.slots],
            new_tokens=new_tokens,
            prefilled_tokens=prefilled,
        )

    def tag_new_tokens(self, age: int) -> None:
        """Each slot's tokens appended since the last call were sampled `age` policy updates ago."""
        for slot in self.slots:
            slot.token_staleness.extend([age] * (len(slot.response_ids) - len(slot.token_staleness)))

    def after_policy_step(self) -> None:
        """The policy changed: every in-flight token is one update older."""
        for slot in self.slots:
            slot.token_staleness = [age + 1 for age in slot.token_staleness]

    def token_staleness(self, like: torch.Tensor) -> torch.Tensor:
        """`[B, T]` int64 as the response mask `like`: each slot's tokens' ages, 0 past its response."""
        ages = right_pad(
            [slot.token_staleness for slot in self.slots], pad_value=0, dtype=torch.long, device=like.device
        )
        out = torch.zeros(like.shape, dtype=torch.long, device=like.device)
        width = min(ages.shape[1], out.shape[1])
        out[:, :width] = ages[:, :width]
        return out * like

    def release(self, finished: list[bool]) -> int:
        """Drop the responses that finished (they were trained on); their slots refill at the next update. Returns the
        responses left in flight."""
        self.slots = [slot for slot, done in zip(self.slots, finished) if not done]
        return len(self.slots)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "slots": [slot.state_dict() for slot in self.slots],
            "pending": list(self.pending),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "slots" not in state:
            raise ValueError(
                "This checkpoint's rollouts in flight are a rollout worker's (max_staleness > 0), and this run has a "
                "generation window: resume it with its own settings."
            )
        if len(state["slots"]) > self.size:
            raise ValueError(
                f"This checkpoint holds {len(state['slots'])} responses in flight per process, more than this run's "
                f"pool of {self.size}: resume it with its rollout_pool_size (or larger)."
            )
        self.slots = [InFlight.from_state(slot) for slot in state["slots"]]
        for slot in self.slots:
            # A checkpoint saved before tokens carried their age: its tokens count as sampled one update before the
            # resume (they are context now, never trained again; only `sample/oldest_token_staleness_max` reads it).
            if len(slot.token_staleness) != len(slot.response_ids):
                slot.token_staleness = [1] * len(slot.response_ids)
        self.pending = list(state["pending"])

    def ages(self) -> list[int]:
        """Windows each in-flight response has been sampled over so far."""
        return [slot.windows for slot in self.slots]

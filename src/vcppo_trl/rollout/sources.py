"""Where the trainer's rollouts come from: one protocol that every source meets ([`RolloutSource`]) and the factory
that builds this run's source from its settings ([`build_rollout_source`]).

The trainer asks its source for the next rollout (`next`), tells it when the policy's weights changed
(`after_policy_step`), saves and restores what the source holds in flight between updates (`state_dict` /
`load_state_dict`, one file per process in a checkpoint) and closes it when training ends, however it ends. It never
asks which source it holds. The sources:

| source | `next` | held in flight between updates |
| --- | --- | --- |
| [`WholeResponses`] | the next prompts, sampled, scored and completed in this process | nothing |
| [`~rollout.windowed.WindowedRollouts`] | the pool of in-flight responses extended by one window (`generation_window`), sampled here or, composed with a [`~rollout.overlap.WindowAhead`], by a worker one update ahead | the pool, and the window sampled ahead |
| [`~rollout.overlap.OverlappedRollouts`] | the generation a rollout worker sampled ahead (`max_staleness`), with the next ones queued | the queued generations |
| [`~rollout.tool_overlap.OverlappedToolEpisodes`] | the same with `tools`: a batch of tool episodes the worker ran whole | the queued episodes |
| [`~rollout.stored_source.StoredRolloutSource`] | a stored batch of the frozen initial policy's rollouts (value pretraining from `value_pretrain_dataset`) | nothing |
| [`CriticFirst`] | one source's rollouts for critic-only updates, another's for the rest | the other's |

A new kind of rollout is one more source: build it in [`build_rollout_source`]. TRL's `tools=` are not a source of
their own: the maker samples tool episodes whole, and the windowed source advances them by a window per update.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch

from ..config.ppo import PPOConfig
from ..config.vcppo import VCPPOConfig
from .maker import RolloutMaker, RolloutStats
from .overlap import OverlappedRollouts, WindowAhead, rollout_worker
from .response_pool import ResponsePool
from .stored_format import StoredRolloutsInfo
from .stored_source import StoredRolloutSource, open_stored_rollouts
from .tool_overlap import EpisodesInWorker, OverlappedToolEpisodes, check_tools_travel
from .types import Rollout
from .windowed import WindowedRollouts

Rows = list[dict[str, Any]]


@runtime_checkable
class RolloutSource(Protocol):
    """What hands the trainer its rollouts. `holds_rollouts_in_flight`: whether [`state_dict`] has anything that a
    checkpoint must keep (responses or generations started for later updates)."""

    holds_rollouts_in_flight: bool

    def next(self, train_policy: bool, trainer_state=None) -> tuple[Rollout, RolloutStats]:
        """This update's rollout and what making it took. `train_policy`: whether the update trains the policy (a
        critic-only update's rollout is the frozen policy's)."""
        ...

    def after_policy_step(self) -> None:
        """The policy's weights changed: later generations sample from the new ones."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What this process holds in flight, for a checkpoint (empty when nothing is)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's [`state_dict`] (it refuses another source's, saying which)."""
        ...

    def close(self) -> None:
        """Stop what runs beside training (a rollout worker's process)."""
        ...


class WholeResponses:
    """
    Whole responses sampled in this process: each rollout draws the next prompts and hands them to
    [`~rollout.maker.RolloutMaker.make`] (dynamic sampling draws more from the same stream).

    Args:
        maker: The trainer's rollout maker.
        draw: The next batch of prompt rows of this process's stream.
    """

    holds_rollouts_in_flight = False

    def __init__(self, maker: RolloutMaker, draw: Callable[[], Rows]):
        self.maker = maker
        self.draw = draw

    def next(self, train_policy: bool, trainer_state=None) -> tuple[Rollout, RolloutStats]:
        return self.maker.make(self.draw(), train_policy, trainer_state, more_rows=self.draw)

    def after_policy_step(self) -> None:
        self.maker.sampler.mark_stale()  # the next generation loads the updated weights first

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class CriticFirst:
    """
    Value pretraining's rollouts from a source of its own (stored rollouts), the policy's updates from another: a
    critic-only update (`train_policy=False`) asks `critic_only`, every other update `then`. What is in flight is
    `then`'s (the critic-only source keeps nothing between updates).
    """

    def __init__(self, critic_only: RolloutSource, then: RolloutSource):
        if critic_only.holds_rollouts_in_flight:
            raise ValueError("A critic-only rollout source must keep nothing in flight between updates.")
        self.critic_only = critic_only
        self.then = then

    @property
    def holds_rollouts_in_flight(self) -> bool:
        return self.then.holds_rollouts_in_flight

    def next(self, train_policy: bool, trainer_state=None) -> tuple[Rollout, RolloutStats]:
        source = self.then if train_policy else self.critic_only
        return source.next(train_policy, trainer_state)

    def after_policy_step(self) -> None:
        self.then.after_policy_step()

    def state_dict(self) -> dict[str, Any]:
        return self.then.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.then.load_state_dict(state)

    def close(self) -> None:
        self.critic_only.close()
        self.then.close()


@dataclasses.dataclass(frozen=True)
class SourceSettings:
    """The fields of [`PPOConfig`] that choose and shape the rollout source (their meanings are the config's)."""

    generation_window: int | None
    rollout_pool_size: int | None
    max_staleness: int
    seed: int
    rollout_worker_threads: int

    @classmethod
    def from_args(cls, args: PPOConfig) -> SourceSettings:
        return cls(
            generation_window=args.generation_window,
            rollout_pool_size=args.rollout_pool_size,
            max_staleness=args.max_staleness,
            seed=args.seed,
            rollout_worker_threads=args.rollout_worker_threads,
        )


def check_custom_sampling(settings: SourceSettings, what: str) -> None:
    """Refuse a source that resumes or runs ahead of the trainer's own sampler when `what` samples instead (a
    `rollout_func`): generation windows and the rollout worker, each named with the reason. `tools` (with an
    `environment_factory` or not) take a window (the tool loop advances its episodes by a window per update), and
    `tools` the rollout worker (it runs whole episodes: `rollout/tool_overlap.py`; what they do not take yet is
    refused by `trainer/sampler_setup.py`'s `check_rollout_func`)."""
    refused = {
        "generation_window": (
            settings.generation_window is not None and what == "rollout_func",
            "a window resumes the trainer's own sampler",
        ),
        "max_staleness": (
            settings.max_staleness > 0 and what == "rollout_func",
            "the rollout worker samples with the trainer's own sampler",
        ),
    }
    for name, (is_set, why) in refused.items():
        if is_set:
            raise ValueError(f"`{what}` cannot be combined with `{name}` yet ({why}): unset `{name}`.")


def check_tools_under_overlap(settings: SourceSettings, *, tools: list[Callable], environment_factory=None) -> None:
    """With `max_staleness` > 0, refuse a tool or an environment factory that cannot travel to the rollout worker
    process, which runs the episodes ([`~rollout.tool_overlap.check_tools_travel`])."""
    if settings.max_staleness == 0:
        return
    factories = environment_factory if isinstance(environment_factory, dict) else {None: environment_factory}
    check_tools_travel(tools, [f for f in factories.values() if f is not None])


def build_rollout_source(
    settings: SourceSettings,
    maker: RolloutMaker,
    *,
    draw: Callable[[], Rows],
    policy: Callable[[], torch.nn.Module],
    local_batch_size: int,
) -> RolloutSource:
    """
    This run's source of rollouts: whole responses in this process; with `generation_window` a pool of
    `rollout_pool_size` in-flight responses (by default `local_batch_size`); with `max_staleness` ≥ 1 a rollout worker process sampling ahead (of
    whole responses, or of the pool's windows). `draw` gives this process's next prompt rows, `policy` the trainer's
    (unwrapped) policy, whose weights a worker starts from and is sent after each policy step.
    """
    worker = None
    if settings.max_staleness > 0:
        program = None if maker.tool_loop is None else EpisodesInWorker(maker.tool_loop)
        worker, request_config = rollout_worker(
            maker, policy(), num_threads=settings.rollout_worker_threads, program=program
        )
        common = dict(request_config=request_config, seed=settings.seed, rank=maker.accelerator.process_index)
    if settings.generation_window is not None:
        length = maker.settings.response_length
        size = settings.rollout_pool_size or local_batch_size
        pool = ResponsePool(size, window=settings.generation_window, response_length=length)
        ahead = None if worker is None else WindowAhead(maker, worker, policy, **common)
        return WindowedRollouts(maker, pool, draw=draw, ahead=ahead)
    if worker is not None:
        overlapped = OverlappedRollouts if maker.tool_loop is None else OverlappedToolEpisodes
        return overlapped(maker, worker, policy, draw=draw, max_staleness=settings.max_staleness, **common)
    return WholeResponses(maker, draw)


@dataclasses.dataclass(frozen=True)
class StoredSourceSettings:
    """The fields of [`VCPPOConfig`] that put stored rollouts in front of the online source for value pretraining."""

    dataset: str | None  # `value_pretrain_dataset`: a folder or a Hub dataset of stored rollouts, or None
    heldout_batches: int  # `value_pretrain_heldout_batches`
    token: str | None  # `hub_token`, to download a Hub dataset

    @classmethod
    def from_args(cls, args: VCPPOConfig) -> StoredSourceSettings:
        return cls(args.value_pretrain_dataset, args.value_pretrain_heldout_batches, args.hub_token)


def with_stored_pretraining(
    settings: StoredSourceSettings,
    online: RolloutSource,
    maker: RolloutMaker,
    *,
    this_run: Callable[[], StoredRolloutsInfo],
    process_index: int,
    draw: Callable[[], Rows] | None,
) -> tuple[RolloutSource, StoredRolloutSource | None]:
    """
    Value pretraining's source: with a stored-rollouts dataset, its rollouts for the critic-only updates in front of
    `online` ([`CriticFirst`]), refused when they are not this run's (`this_run()` describes it; computed only then);
    without one, `online` alone. Returns the source and the stored rollouts (`None` without a dataset), whose held-out
    batches the stop rule reads.
    """
    if settings.dataset is None:
        return online, None
    stored = open_stored_rollouts(
        settings.dataset,
        maker,
        this_run=this_run(),
        process_index=process_index,
        heldout_batches=settings.heldout_batches,
        token=settings.token,
        draw=draw,
    )
    return CriticFirst(stored, then=online), stored

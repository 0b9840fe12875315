"""Generation windows as a rollout source ([`WindowedRollouts`]): each update's rollout is the pool
([`~rollout.response_pool.ResponsePool`]) extended by one window, by the rollout maker's sampler or a rollout worker one
update ahead, scored where responses finished, and completed by the maker like any rollout. With `tools`, each slot
is a tool episode advanced by one window of policy tokens ([`tool_window`])."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable
from typing import Any

import torch

from ..episodes import ToolEpisode, episode_counts, flag_on_any_process, sampler_turns
from ..parallel.collectives import max_across_processes
from ..sampling.seam import Samples, left_pad, right_pad, unpadded_prompts
from .maker import GenerationStats, RolloutMaker, RolloutStats
from .overlap import WindowAhead
from .response_pool import ResponsePool, WindowStep
from .tool_overlap import pickled_environments
from .types import Rollout, WindowMarks


class WindowedRollouts:
    """
    The rollout source of generation windows (`generation_window`): the pool of in-flight responses, extended by one
    window per update ([`make_window`]).

    Args:
        maker: The trainer's rollout maker.
        pool: This process's in-flight responses.
        draw: This process's next prompt rows (the pool refills its free slots from them).
        ahead: With one-step-off overlap (`max_staleness=1`), the rollout worker that samples the next window while
            this update trains; `None`: the maker's sampler samples each window when it is needed.
    """

    holds_rollouts_in_flight = True

    def __init__(
        self,
        maker: RolloutMaker,
        pool: ResponsePool,
        *,
        draw: Callable[[], list[dict[str, Any]]],
        ahead: WindowAhead | None = None,
    ):
        self.maker = maker
        self.pool = pool
        self.draw = draw
        self.ahead = ahead

    def next(self, train_policy: bool, trainer_state=None) -> tuple[Rollout, RolloutStats]:
        return make_window(
            self.maker,
            self.pool,
            draw=self.draw,
            train_policy=train_policy,
            trainer_state=trainer_state,
            ahead=self.ahead,
        )

    def after_policy_step(self) -> None:
        self.maker.sampler.mark_stale()  # the next window sampled here loads the updated weights first
        self.pool.after_policy_step()
        if self.ahead is not None:
            self.ahead.push_weights()

    def state_dict(self) -> dict[str, Any]:
        """The pool's responses, and the window sampled ahead with the worker's counters."""
        state = self.pool.state_dict()
        if self.ahead is not None:
            state |= self.ahead.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pool.load_state_dict(state)
        if self.ahead is not None:
            self.ahead.load_state_dict(state)

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.close()


def make_window(
    maker: RolloutMaker,
    pool: ResponsePool,
    *,
    draw: Callable[[], list[dict[str, Any]]],
    train_policy: bool = True,
    trainer_state=None,
    ahead: WindowAhead | None = None,
) -> tuple[Rollout, RolloutStats]:
    """
    One generation window (`generation_window`): refill the pool's free slots with the next prompts (`draw` gives the
    stream's next batch), extend every in-flight response by at most the window from its token ids, score the
    responses that finished, and make the rollout of the whole pool: `window_mask` marks this window's tokens (the
    policy's), `finished` the responses with a score (the critic's), `bootstrap_values` the critic's value after the
    last token of the others. The finished responses then leave the pool.

    With a window as long as `response_length` every response starts and finishes in one update, and the rollout is
    the one [`~rollout.maker.RolloutMaker.make`] makes from the same prompts, bit for bit.

    `ahead` (`max_staleness=1`): a rollout worker samples the windows; this one was submitted at the end of the last
    update (or now, at the first), and the next one is submitted once this one's finished responses left the pool.
    """
    device = maker.accelerator.device
    pad = maker.tokenizer.pad_token_id
    overlap = None
    if ahead is not None and maker.tool_loop is not None:  # tool episodes the worker advanced by this window
        if ahead.pending is None:
            submit_tool_window(maker, pool, draw=draw, ahead=ahead)
        generated, wait = ahead.take_window()
        step, seconds, with_logprobs = take_tool_window(maker, pool, generated)
    elif ahead is not None:  # the worker sampled this window while the last update trained (or samples it now)
        if ahead.pending is None:
            context_ids, context_mask, budget = next_window(maker, pool, draw=draw)
            ahead.submit_window(context_ids, context_mask, budget=budget)
        generated, wait = ahead.take_window()
        samples = generated.samples
        step, seconds, with_logprobs = pool.advance(samples), samples.seconds, samples.logprobs is not None
    elif maker.tool_loop is not None:  # tool episodes: turns and tool calls within the window's policy tokens
        step, seconds, with_logprobs = tool_window(maker, pool, draw=draw)
    else:
        context_ids, context_mask, budget = next_window(maker, pool, draw=draw)
        samples = maker.sampler.generate(
            context_ids, context_mask, False, temperature=maker.settings.temperature, max_new_tokens=budget
        )
        step, seconds, with_logprobs = pool.advance(samples), samples.seconds, samples.logprobs is not None
    pool.tag_new_tokens(0 if ahead is None else ahead.age(generated))
    slots = pool.slots
    query_ids, query_mask = left_pad([slot.prompt_ids for slot in slots], pad, device)
    responses = right_pad([slot.response_ids for slot in slots], pad_value=pad, dtype=torch.long, device=device)
    lengths = torch.tensor([len(slot.response_ids) for slot in slots], device=device)
    positions = torch.arange(responses.shape[1], device=device).unsqueeze(0)
    response_mask = positions < lengths.unsqueeze(1)
    sampler_logprobs = None
    if with_logprobs:
        sampler_logprobs = right_pad(
            [slot.sampler_logprobs for slot in slots], pad_value=0.0, dtype=torch.float32, device=device
        )
        sampler_logprobs = sampler_logprobs * response_mask
    has_stop = torch.tensor(step.has_stop, device=device)
    whole = Samples(responses, response_mask, has_stop, logprobs=sampler_logprobs)
    finished = torch.tensor(step.finished, device=device)
    rows = [slot.row for slot in slots]
    episodes = prompt_texts = None
    if maker.tool_loop is not None:  # what the tool loop's samples carry besides: actions, counts, messages
        episodes = [slot.episode for slot in slots]
        env_mask = right_pad([e.env_mask for e in episodes], pad_value=0, dtype=torch.long, device=device)
        whole.action_mask = env_mask.bool() & response_mask
        whole.episode_counts = {
            k: torch.tensor(v, dtype=torch.float32, device=device) for k, v in episode_counts(episodes).items()
        }
        prompt_texts = [e.prompt_text for e in episodes]
        episodes = [e.messages for e in episodes]
        if maker.tool_loop.environments is not None:  # to the reward functions (TRL's `environments`), per episode
            rows = [{**row, "environments": slot.environment} for row, slot in zip(rows, slots)]
    scored = maker.scorer.score_where(
        rows,
        query_ids,
        query_mask,
        samples=whole,
        which=finished,
        trainer_state=trainer_state,
        episodes=episodes,
        prompt_texts=prompt_texts,
    )
    window_mask = response_mask & (positions >= torch.tensor(step.starts, device=device).unsqueeze(1))
    rollout, work = maker.complete(rows, scored, train_policy, window=WindowMarks(window_mask, finished))
    rollout.token_staleness = pool.token_staleness(rollout.response_mask)
    step = dataclasses.replace(step, in_flight=pool.release(step.finished))
    if ahead is not None and maker.tool_loop is not None:  # the next window's episodes go to the worker now
        submit_tool_window(maker, pool, draw=draw, ahead=ahead)
    elif ahead is not None:  # the next window's contexts are known now: the worker samples it while this update trains
        context_ids, context_mask, budget = next_window(maker, pool, draw=draw)
        ahead.submit_window(context_ids, context_mask, budget=budget)
    if ahead is not None:
        overlap = ahead.stats(generated, wait, in_flight=1)
    generation = GenerationStats(seconds, step.new_tokens, getattr(maker.sampler, "sync_seconds", None))
    return rollout, RolloutStats(generation, work, reports=(step,) if overlap is None else (step, overlap))


def tool_window(
    maker: RolloutMaker, pool: ResponsePool, draw: Callable[[], list[dict[str, Any]]]
) -> tuple[WindowStep, float, bool]:
    """
    One window of tool episodes (`tools` with `generation_window`): refill the pool's free slots with new episodes and
    advance every episode by at most the window's policy tokens ([`~episodes.tool_loop.ToolLoop.advance`]: its turns,
    and the tool calls of the turns that end, whose results are tool tokens, not counted against the window). Each
    slot's response is its episode's completion. Returns `(step, seconds, with_logprobs)`: the window's
    [`~rollout.response_pool.WindowStep`] (an episode finished when it is done: a turn without tool calls,
    `max_tool_calling_iterations`, an overflow, `response_length`), the generation calls' wall time, and whether the
    sampler gave log-probs.
    """
    loop = maker.tool_loop
    start_tool_episodes(maker, pool, draw, adopt=True)
    episodes = [slot.episode for slot in pool.slots]
    starts = [len(episode.completion_ids) for episode in episodes]
    generate, seconds = sampler_turns(maker.sampler, greedy=False, temperature=maker.settings.temperature)
    loop.advance(
        episodes,
        budget=pool.window,
        generate=generate,
        any_process=flag_on_any_process(maker.accelerator),
        row_tools=[
            loop.tools if slot.environment is None else loop.environments.tools_of(slot.environment)
            for slot in pool.slots
        ],
        device=maker.accelerator.device,
    )
    return tool_step(maker, pool, starts), seconds[0], all(episode.logprobs is not None for episode in episodes)


def start_tool_episodes(
    maker: RolloutMaker, pool: ResponsePool, draw: Callable[[], list[dict[str, Any]]], *, adopt: bool
) -> None:
    """Refill the pool's free slots with new tool episodes (with `environment_factory`, each with its environment,
    reset). `adopt`: the environments of episodes in flight (a checkpoint's, unpickled) join the pool of instances,
    to be reused once their episodes are over (in this process; not for the copies a rollout worker sends back)."""
    loop = maker.tool_loop
    for slot in pool.slots:
        if slot.episode is None:
            raise ValueError(
                "This checkpoint's pool holds responses without their tool episodes (saved by a run without "
                "`tools`): resume it with its own settings."
            )
        if adopt and slot.environment is not None:
            loop.environments.adopt(slot.environment, slot.row)
    started = []

    def start(rows: list[dict[str, Any]]) -> list[list[int]]:
        in_use = [slot.environment for slot in pool.slots if slot.environment is not None]
        episodes, _, _, _, instances = loop.start(rows, maker.tokenize_prompts, environments_in_use=in_use)
        started.extend(zip(episodes, instances or [None] * len(episodes)))
        return [episode.prompt_ids for episode in episodes]

    filled = pool.refill(draw, start)
    for slot, (episode, instance) in zip(pool.slots[len(pool.slots) - filled :], started):
        slot.episode, slot.environment = episode, instance


def tool_step(maker: RolloutMaker, pool: ResponsePool, starts: list[int]) -> WindowStep:
    """The window's step once every slot's episode advanced (`starts`: each completion's length before it): each
    slot's response is its episode's completion."""
    episodes = [slot.episode for slot in pool.slots]
    for slot, episode in zip(pool.slots, episodes):
        slot.response_ids = list(episode.completion_ids)
        slot.sampler_logprobs = list(episode.logprobs or [])
        slot.windows += 1
    stops = maker.stop_token_ids
    return WindowStep(
        starts,
        finished=[episode.done for episode in episodes],
        has_stop=[
            episode.done and bool(episode.completion_ids) and episode.completion_ids[-1] in stops
            for episode in episodes
        ],
        windows=[slot.windows for slot in pool.slots],
        new_tokens=sum(episode.policy_tokens_since(start) for episode, start in zip(episodes, starts)),
        prefilled_tokens=sum(starts),
    )


def submit_tool_window(
    maker: RolloutMaker, pool: ResponsePool, *, draw: Callable[[], list[dict[str, Any]]], ahead: WindowAhead
) -> None:
    """Windows of tool episodes one update ahead (`tools`, `generation_window`, `max_staleness=1`): refill the pool and
    send every slot's episode (and environment) to the worker, which advances them by the window
    ([`~rollout.tool_overlap.EpisodesInWorker`]) while this update trains."""
    start_tool_episodes(maker, pool, draw, adopt=False)
    environments = [slot.environment for slot in pool.slots]
    payload = {
        "episodes": [slot.episode.state_dict() for slot in pool.slots],
        "budget": pool.window,
        "environments": None if environments[0] is None else pickled_environments(environments),
    }
    ahead.submit_episodes(payload)


def take_tool_window(maker: RolloutMaker, pool: ResponsePool, generated) -> tuple[WindowStep, float, bool]:
    """The worker's window of tool episodes (`generated`, submitted by [`submit_tool_window`]): each slot's episode and
    environment as the worker left them, and the window's step."""
    starts = [len(slot.episode.completion_ids) for slot in pool.slots]
    returned = generated.episodes
    instances = [None] * len(pool.slots)
    if returned["environments"] is not None:
        instances = pickle.loads(returned["environments"])
    for slot, state, instance in zip(pool.slots, returned["episodes"], instances):
        slot.episode, slot.environment = ToolEpisode.from_state(state), instance
    episodes = [slot.episode for slot in pool.slots]
    return tool_step(maker, pool, starts), generated.seconds, all(e.logprobs is not None for e in episodes)


def next_window(
    maker: RolloutMaker, pool: ResponsePool, draw: Callable[[], list[dict[str, Any]]]
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Refill the pool's free slots and give its next window: each slot's context (prompt and response so far,
    left-padded) and the new tokens to decode, one budget on every process (generation is collective under ZeRO-3:
    sharded weights, or one gather per call)."""
    pool.refill(draw, lambda rows: prompt_ids(maker, rows))
    context_ids, context_mask = pool.contexts(maker.tokenizer.pad_token_id, maker.accelerator.device)
    budget, max_across = pool.budget(), max_across_processes(maker.accelerator)
    if max_across is not None:
        budget = max_across([budget])[0]
    return context_ids, context_mask, budget


def prompt_ids(maker: RolloutMaker, rows: list[dict[str, Any]]) -> list[list[int]]:
    """Prompt ids of rows as the rollout tokenises them (chat template, `max_prompt_length`), unpadded."""
    query_ids, query_mask = maker.tokenize_prompts(maker.prompt_texts(rows))
    return unpadded_prompts(query_ids, query_mask)

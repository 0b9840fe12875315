"""TRL's `tools=` under one-step-off and bounded-staleness overlap (`max_staleness` ≥ 1): the rollout worker runs
whole tool episodes.

The choice: the worker runs the episodes, tools included ([`EpisodesInWorker`], pickled to it at its start with the
tool loop: the tools, the tokenizer, the loop's settings), rather than the trainer driving the episodes while the
worker only generates each turn. Why:

- staleness stays exact by construction: a batch's episodes are one request on the worker's FIFO queue, so all their
  turns are sampled by the weights pushed before that request (a weight push queued behind it waits until its
  episodes are over); with turns as separate requests, the trainer would have to hold its pushes until every turn
  of every queued batch is submitted, which ties the learner to the episodes' turn structure;
- the trainer stays one loop (train, consume a finished batch); driving episodes from it would need tool calls and
  turn submissions interleaved with the learner's steps (a thread, or a poll inside the epochs);
- the worker's engine is used as it is (HF `generate` or its own vLLM engine) through the same
  `generate(ids, mask, max_new_tokens)` the tool loop already takes; each call's seed derives from the request's, so
  a run is reproducible;
- the faults the loop bounds (`tool_timeout`, errors answered `{"error": ...}`, overflows, malformed calls and
  their counts) are bounded the same way there: it is the same [`~episodes.tool_loop.ToolLoop.advance`]; anything
  that escapes stops the worker's request and training with a `SamplerError`.

The cost: a tool runs in the worker process, so it must be picklable by reference (a function defined at module
level in an importable module, not a lambda, closure, local function or one defined in the script being run);
anything else is refused when the trainer is built ([`check_tools_travel`]). The trainer starts the episodes (renders
and tokenizes the prompts with its truncation rules; with `environment_factory`, resets each episode's environment
and pickles it into the request at once) and scores them when it consumes the batch; the worker returns each
episode's state ([`~episodes.tool_episode.ToolEpisode`]: plain lists, dicts, strings and ints) and its environment
as the episode left it (pickled), which a checkpoint saves as it saves queued generations.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import torch

from ..episodes import ToolEpisode, ToolLoop, episode_counts, episodes_output, function_rollouts, tool_name
from .overlap import OverlappedRollouts, Prefetched


def travel_problem(thing: Any) -> str | None:
    """Why `thing` cannot be sent to the rollout worker process (pickled; a function or class by reference), or
    `None`."""
    if getattr(thing, "__module__", None) == "__main__":
        return "it is defined in the script being run (__main__), which the worker process does not run again"
    try:
        pickle.loads(pickle.dumps(thing))
    except Exception as err:  # noqa: BLE001 - any failure to travel is the same refusal
        return f"it cannot be pickled ({type(err).__name__}: {err})"
    return None


def check_tools_travel(tools: list[Callable], factories: list[Callable] = ()) -> None:
    """Refuse a tool or an environment factory the rollout worker process cannot receive (`max_staleness` ≥ 1 runs
    the episodes there), naming it and what to do."""
    for kind, things in (("tool", tools), ("environment factory", factories)):
        for thing in things:
            problem = travel_problem(thing)
            if problem is not None:
                raise ValueError(
                    f"`tools` with `max_staleness` > 0: the {kind} {tool_name(thing)!r} cannot be sent to the rollout "
                    f"worker process, which runs the episodes: {problem}. Define it at module level in an importable "
                    "module (not a lambda, closure or local function; `python_tool()` is a closure), or set "
                    "max_staleness=0."
                )


def pickled_environments(instances: list[Any]) -> bytes:
    """The episodes' environments as sent to the worker: pickled now (their state after `reset`; the pool may reset
    the same instances for the next batch before the queue's thread would pickle them), or an error naming the class
    of one that cannot be pickled and what to do."""
    try:
        return pickle.dumps(instances)
    except Exception:  # noqa: BLE001 - find which one, and say so
        for instance in instances:
            problem = travel_problem(instance)
            if problem is not None:
                raise ValueError(
                    f"The environment {type(instance).__name__} cannot be sent to the rollout worker process "
                    f"(max_staleness > 0), which runs its episode: {problem}. Give its class __getstate__/"
                    "__setstate__ that leave out and rebuild what cannot be pickled (a connection, a process, a "
                    "lock), or set max_staleness=0."
                ) from None
        raise


class EpisodesInWorker:
    """
    The worker's program for a request of tool episodes (pickled to the worker process at its start): the episodes
    the trainer started, advanced with a budget of `response_length` (which finishes them all) by the tool loop on
    the worker's engine's `generate`. Returns each episode's state.
    """

    def __init__(self, loop: ToolLoop):
        self.loop = loop

    def __call__(self, generate: Callable, payload: dict[str, Any]) -> dict[str, Any]:
        episodes = [ToolEpisode.from_state(state) for state in payload["episodes"]]
        # Whole episodes from their prompts' contexts, or (a generation window's) each resumed for `budget` tokens.
        first = (payload["query_ids"], payload["query_mask"]) if "query_ids" in payload else None
        environments = payload.get("environments")
        row_tools = [self.loop.tools] * len(episodes)
        if environments is not None:  # each episode's environment, reset by the trainer: its methods are tools
            environments = pickle.loads(environments)
            row_tools = [self.loop.environments.tools_of(instance) for instance in environments]
        self.loop.advance(
            episodes,
            budget=payload.get("budget", self.loop.settings.response_length),
            generate=generate,
            any_process=bool,  # each process's worker runs its own episodes: no collective
            row_tools=row_tools,
            device=torch.device("cpu"),
            first_contexts=first,
        )
        return {
            "episodes": [episode.state_dict() for episode in episodes],
            "environments": None if environments is None else pickle.dumps(environments),
        }


class OverlappedToolEpisodes(OverlappedRollouts):
    """
    [`OverlappedRollouts`] of tool episodes: each queued batch is one request of episodes the worker runs whole
    ([`EpisodesInWorker`]); consumed, they are scored as the tool loop's episodes are in the trainer's process
    (reward functions get their messages as completions, the `tools/...` metrics their counts).
    """

    def submit_rows(self, rows: list[dict[str, Any]]) -> Prefetched:
        episodes, _, _, (query_ids, query_mask), instances = self.maker.tool_loop.start(
            rows, self.maker.tokenize_prompts
        )
        payload = {
            "episodes": [episode.state_dict() for episode in episodes],
            "query_ids": query_ids.cpu(),
            "query_mask": query_mask.cpu(),
            "environments": None if instances is None else pickled_environments(instances),
        }
        request = self.worker.submit_episodes(payload, self.request_config(), seed=self.next_seed())
        return Prefetched(rows, query_ids, query_mask=query_mask, request=request)

    def scored(self, batch: Prefetched, generated, trainer_state=None):
        episodes = [ToolEpisode.from_state(state) for state in generated.episodes["episodes"]]
        rows = batch.rows
        if generated.episodes["environments"] is not None:  # to the reward functions (TRL's `environments`)
            instances = pickle.loads(generated.episodes["environments"])  # as the worker's episodes left them
            rows = [{**row, "environments": instance} for row, instance in zip(rows, instances)]
        maker = self.maker
        made = function_rollouts(
            episodes_output(episodes),
            num_completions=len(batch.rows),
            response_length=maker.settings.response_length,
            stop_token_ids=maker.stop_token_ids,
            pad_token_id=maker.tokenizer.pad_token_id,
            device=maker.accelerator.device,
        )
        made.samples.seconds = generated.seconds
        made.samples.episode_counts = {
            k: torch.tensor(v, dtype=torch.float32, device=made.query_ids.device)
            for k, v in episode_counts(episodes).items()
        }
        scored = maker.scorer.score_all(
            rows,
            [episode.prompt_text for episode in episodes],
            query_ids=made.query_ids,
            query_mask=made.query_mask,
            samples=made.samples,
            episodes=[episode.messages for episode in episodes],
            trainer_state=trainer_state,
        )
        return rows, scored

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
  their counts) are bounded the same way there: it is the same [`~rollout.tool_loop.ToolLoop.advance`]; anything
  that escapes stops the worker's request and training with a `SamplerError`.

The cost: a tool runs in the worker process, so it must be picklable by reference (a function defined at module
level in an importable module, not a lambda, closure, local function or one defined in the script being run);
anything else is refused when the trainer is built ([`check_tools_travel`]). The trainer starts the episodes (renders
and tokenizes the prompts with its truncation rules) and scores them when it consumes the batch; the worker returns
each episode's state ([`~rollout.tool_episodes.ToolEpisode`]: plain lists, dicts, strings and ints), which a
checkpoint saves as it saves queued generations.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import torch

from .overlap import OverlappedRollouts, Prefetched
from .rollout_function import function_rollouts
from .tool_episodes import ToolEpisode, episode_counts, episodes_output
from .tool_loop import ToolLoop, tool_name


def check_tools_travel(tools: list[Callable]) -> None:
    """Refuse a tool the rollout worker process cannot receive (`max_staleness` ≥ 1 runs the tools there), naming it
    and what to do."""
    for tool in tools:
        problem = None
        if getattr(tool, "__module__", None) == "__main__":
            problem = "it is defined in the script being run (__main__), which the worker process does not run again"
        else:
            try:
                pickle.loads(pickle.dumps(tool))
            except Exception as err:  # noqa: BLE001 - any failure to travel is the same refusal
                problem = f"it cannot be pickled ({type(err).__name__}: {err})"
        if problem is not None:
            raise ValueError(
                f"`tools` with `max_staleness` > 0: the tool {tool_name(tool)!r} cannot be sent to the rollout worker "
                f"process, which runs the episodes: {problem}. Define it at module level in an importable module "
                "(not a lambda, closure or local function; `python_tool()` is a closure), or set max_staleness=0."
            )


class EpisodesInWorker:
    """
    The worker's program for a request of tool episodes (pickled to the worker process at its start): the episodes
    the trainer started, advanced with a budget of `response_length` (which finishes them all) by the tool loop on
    the worker's engine's `generate`. Returns each episode's state.
    """

    def __init__(self, loop: ToolLoop):
        self.loop = loop

    def __call__(self, generate: Callable, payload: dict[str, Any]) -> list[dict[str, Any]]:
        episodes = [ToolEpisode.from_state(state) for state in payload["episodes"]]
        self.loop.advance(
            episodes,
            budget=self.loop.settings.response_length,
            generate=generate,
            any_process=bool,  # each process's worker runs its own episodes: no collective
            row_tools=[self.loop.tools] * len(episodes),
            device=torch.device("cpu"),
            first_contexts=(payload["query_ids"], payload["query_mask"]),
        )
        return [episode.state_dict() for episode in episodes]


class OverlappedToolEpisodes(OverlappedRollouts):
    """
    [`OverlappedRollouts`] of tool episodes: each queued batch is one request of episodes the worker runs whole
    ([`EpisodesInWorker`]); consumed, they are scored as the tool loop's episodes are in the trainer's process
    (reward functions get their messages as completions, the `tools/...` metrics their counts).
    """

    def submit_rows(self, rows: list[dict[str, Any]]) -> Prefetched:
        episodes, _, _, (query_ids, query_mask), _ = self.maker.tool_loop.start(rows, self.maker.tokenize_prompts)
        payload = {
            "episodes": [episode.state_dict() for episode in episodes],
            "query_ids": query_ids.cpu(),
            "query_mask": query_mask.cpu(),
        }
        request = self.worker.submit_episodes(payload, self.request_config(), seed=self.next_seed())
        return Prefetched(rows, query_ids, query_mask=query_mask, request=request)

    def scored(self, batch: Prefetched, generated, trainer_state=None):
        episodes = [ToolEpisode.from_state(state) for state in generated.episodes]
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
            batch.rows,
            [episode.prompt_text for episode in episodes],
            query_ids=made.query_ids,
            query_mask=made.query_mask,
            samples=made.samples,
            episodes=[episode.messages for episode in episodes],
            trainer_state=trainer_state,
        )
        return batch.rows, scored

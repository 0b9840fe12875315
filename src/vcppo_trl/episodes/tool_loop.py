"""TRL's `tools=`: episodes in which the policy calls Python functions between its turns, sampled by the trainer's own
sampler.

Tokens in, tokens out: the policy's sampled ids are kept as sampled; only what the tools add is tokenized, as the
suffix the chat template puts after the assistant's turn (the tool messages and the next generation prompt), found by
rendering a one-turn dummy conversation with and without them and cutting at its last end-of-turn token. The
conversation is never re-rendered and re-tokenized. Tool calls are parsed with transformers' `parse_response` and the
response schema TRL knows for the template (`trl.chat_template_utils.add_response_schema`).

An episode: the prompt (rendered with the tools' schemas), the policy's turn; while that turn calls tools (and at most
`max_iterations` times), every call runs (sync tools in threads, async ones on the trainer's event loop, each bounded
by `timeout`; one that raises, hangs or is unknown answers `{"error": ...}` and counts as a failure), their results
are appended as tool messages, and the policy writes its next turn from the whole history. `response_length` counts
every completion token, tool results included (as TRL's `max_completion_length`); a tool result that would leave no
room for a next turn is dropped and the episode ends (counted, `tools/overflow_frequency`). A turn whose text holds a
tool-call marker that does not parse is text, as in TRL, and counted (`tools/malformed_frequency`).

The loop's logic is one step ([`ToolLoop.advance`]): it advances a batch of episodes ([`~episodes.tool_episodes.
ToolEpisode`], their state between generation calls) by a budget of policy tokens. Whole episodes are the step with
a budget of `response_length` ([`ToolLoop.sample`]); a generation window's pool advances its episodes by the window
once per update (`rollout/windowed.py`).

The result is what a `rollout_func` returns ([`~episodes.rollout_function`]): prompt and completion ids, the sampler's
log-probs (0 on tool tokens), an `env_mask` (0 on tool tokens), plus the episodes as messages for the reward
functions and per-episode counts for the metrics.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from ..parallel.collectives import max_across_processes
from ..rewards import is_async_callable, run_awaitables, run_in_threads
from ..sampling import unpadded_prompts
from ..sampling.seam import left_pad
from .tool_episode import ToolEpisode, episode_counts, episodes_output, tool_messages


@dataclasses.dataclass(frozen=True)
class ToolSettings:
    """What the tool loop reads of the config (their meanings are the config's)."""

    max_iterations: int | None  # `max_tool_calling_iterations`: None, no limit but `response_length`
    response_length: int
    timeout: float | None  # `tool_timeout`
    max_concurrency: int  # `reward_max_concurrency`: async tool calls awaited at once
    chat_template_kwargs: dict | None = None

    @classmethod
    def from_args(cls, args) -> ToolSettings:
        return cls(
            max_iterations=args.max_tool_calling_iterations,
            response_length=args.response_length,
            timeout=args.tool_timeout,
            max_concurrency=args.reward_max_concurrency,
            chat_template_kwargs=args.chat_template_kwargs,
        )


@dataclasses.dataclass
class ToolEpisodes:
    """One batch of episodes: the `rollout_func`-style output, the episodes as messages, and their counts."""

    output: dict[str, list]  # prompt_ids, completion_ids, logprobs (or None), env_mask
    prompt_texts: list[str]
    completions: list[list[dict[str, Any]]]  # per episode: its assistant and tool messages
    counts: dict[str, list[int]]  # `tool_episodes.COUNTS`, per episode
    environments: list[Any] | None = None  # per episode: its environment (`environment_factory`)


def _probe_tool(value: int) -> int:
    """A tool that only probes a chat template.

    Args:
        value: Any number.
    """
    return value


def renders_tools(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer's chat template shows tools to the model: a one-message prompt rendered with a tool
    differs from the same prompt without it."""
    messages = [{"role": "user", "content": "Hello."}]
    bare = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    with_tool = tokenizer.apply_chat_template(
        messages, tools=[_probe_tool], add_generation_prompt=True, tokenize=False
    )
    return with_tool != bare


def tool_name(tool: Callable) -> str:
    return getattr(tool, "__name__", type(tool).__name__)


class ToolLoop:
    """
    Samples tool-calling episodes with the trainer's sampler (see the module's docstring).

    Args:
        tools: The functions the policy may call (sync or `async def`); their names, type hints and docstrings are
            the schemas the chat template shows the policy (transformers' `get_json_schema`).
        tokenizer: The policy's tokenizer, with a chat template that renders tools and a response schema for its
            tool calls (TRL's `add_response_schema` is applied when it has none).
        settings ([`ToolSettings`]).
        stop_token_ids: The ids that end a turn.
        environments ([`~episodes.environments.Environments`], *optional*): TRL's `environment_factory`: each episode
            gets an environment, reset with its row, whose methods are its tools besides `tools`.
    """

    def __init__(
        self,
        tools: list[Callable],
        tokenizer: PreTrainedTokenizerBase,
        settings: ToolSettings,
        stop_token_ids: list[int],
        environments=None,
    ):
        from trl.chat_template_utils import add_response_schema, is_chat_template_prefix_preserving

        tools = list(tools or [])
        if (not tools and environments is None) or not all(callable(t) for t in tools):
            raise TypeError("`tools` must be a non-empty list of functions (sync or async).")
        names = [tool_name(t) for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"`tools` holds two functions of one name: {sorted(names)}; each name must be unique.")
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("`tools` need a tokenizer with a chat template that renders tools (e.g. Qwen2.5's).")
        if not renders_tools(tokenizer):
            raise ValueError(
                "`tools`: the tokenizer's chat template does not render tools (a prompt rendered with tools is the "
                "prompt without them: SmolLM2-135M-Instruct's template is one such), so the policy would never be "
                "shown a tool. Use a model whose template renders `tools` (Qwen2.5/3, Llama 3.x, ...), or set "
                "`tokenizer.chat_template` to one that does."
            )
        if (
            getattr(tokenizer, "response_schema", None) is None
            and getattr(tokenizer, "response_template", None) is None
        ):
            try:
                add_response_schema(tokenizer)
            except ValueError as err:
                raise ValueError(
                    f"`tools`: the tokenizer's chat template has no response schema to parse tool calls with, and TRL "
                    f"knows none for it ({err}). Set `tokenizer.response_schema` (transformers' response parsing) or use "
                    "a template TRL recognises (Qwen2.5/3, Llama 3.x, GLM-4-MoE, GPT-OSS, ...)."
                ) from err
        if not is_chat_template_prefix_preserving(tokenizer):
            raise ValueError(
                "`tools`: the tokenizer's chat template is not prefix-preserving (rendering a longer conversation "
                "changes the tokens of its start), so the sampled turns cannot be kept as sampled. Use TRL's "
                "training template: tokenizer.chat_template = trl.chat_template_utils.get_training_chat_template("
                "tokenizer)."
            )
        self.tools = tools
        self.environments = environments
        self.tokenizer = tokenizer
        self.settings = settings
        self.stop_token_ids = list(stop_token_ids)

    # ------------------------------------------------------------------ rendering

    def render(self, prompts: list[Any], tools: list[list[Callable]] | None = None) -> list[str]:
        """The prompts as the policy reads them: chat messages with their tools' schemas (each row's `tools`, by
        default the loop's), the generation prompt."""
        kwargs = self.settings.chat_template_kwargs or {}
        texts = []
        for i, prompt in enumerate(prompts):
            if not isinstance(prompt, list):
                raise ValueError("`tools` need conversational prompts (a list of chat messages per row), got text.")
            row_tools = self.tools if tools is None else tools[i]
            texts.append(
                self.tokenizer.apply_chat_template(
                    prompt, tools=row_tools, add_generation_prompt=True, tokenize=False, **kwargs
                )
            )
        return texts

    def suffix_ids(self, tool_messages: list[dict[str, Any]]) -> list[int]:
        """The tokens the template puts after an assistant turn that called tools: the tool messages and the next
        generation prompt (rendered after a dummy turn, cut at its last end-of-turn token)."""
        kwargs = self.settings.chat_template_kwargs or {}
        call = {"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}
        dummy = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
        prefix = self.tokenizer.apply_chat_template(dummy, tokenize=True, return_dict=False, **kwargs)
        full = self.tokenizer.apply_chat_template(
            dummy + tool_messages, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
        )
        ends = [i for i, t in enumerate(prefix) if t in self.stop_token_ids]
        if ends:
            prefix = prefix[: ends[-1] + 1]
        if full[: len(prefix)] != prefix:
            raise ValueError("`tools`: the chat template renders a turn differently once tool messages follow it.")
        return list(full[len(prefix) :])

    def parse(self, ids: list[int], prefix: list[int], tools: list[Callable]) -> dict[str, Any]:
        from trl.chat_template_utils import parse_response

        content_ids = [t for t in ids if t not in self.stop_token_ids]
        if not content_ids:
            return {"role": "assistant", "content": ""}
        return parse_response(self.tokenizer, ids, prefix=prefix, tools=tools)

    # ------------------------------------------------------------------ tools

    def run_calls(self, calls: list[tuple[dict[str, Any], dict[str, Callable]]]) -> list[tuple[str, str, bool]]:
        """Run tool calls, each with its episode's tools by name (all of a step, across episodes, concurrently):
        `(name, result text, failed)` each."""
        timeout = self.settings.timeout
        results: list[tuple[str, str, bool] | None] = [None] * len(calls)
        sync, coros = [], []
        for i, (call, by_name) in enumerate(calls):
            function = call.get("function") or {}
            name = function.get("name", call.get("name", "unknown"))
            tool = by_name.get(name)
            arguments = function.get("arguments") or {}
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    arguments = None
            if call.get("type", "function") != "function" or tool is None or not isinstance(arguments, dict):
                problem = (
                    f"Tool {name} not found (tools: {sorted(by_name)})."
                    if tool is None
                    else f"Unusable call of {name}: {call!r}"
                )
                results[i] = (name, json.dumps({"error": problem}), True)
            elif is_async_callable(tool):
                coros.append((i, name, lambda tool=tool, arguments=arguments: tool(**arguments)))
            else:
                sync.append((i, name, lambda tool=tool, arguments=arguments: tool(**arguments)))
        outcomes = run_in_threads([fn for _, _, fn in sync], timeout) if sync else []
        if coros:
            outcomes += run_awaitables([fn for _, _, fn in coros], timeout, self.settings.max_concurrency)
        for (i, name, _), (status, value) in zip(sync + coros, outcomes):
            if status == "ok":
                results[i] = (name, value if isinstance(value, str) else str(value), False)
            else:
                error = f"timed out after {timeout} s" if status == "timeout" else value.splitlines()[0]
                results[i] = (name, json.dumps({"error": error}), True)
        return results

    # ------------------------------------------------------------------ episodes

    def start(
        self,
        rows: list[dict[str, Any]],
        tokenize: Callable[[list[str]], tuple[torch.Tensor, torch.Tensor]],
        environments_in_use: list[Any] = (),
    ) -> tuple[list[ToolEpisode], list[list[Callable]], list[str], tuple[torch.Tensor, torch.Tensor], list | None]:
        """New episodes of `rows`: `(episodes, row_tools, prompt_texts, (query_ids, query_mask), environments)`, each
        row's tools (with `environment_factory`, its environment's methods: the environment, not one of
        `environments_in_use`, is reset with the row), its prompt rendered with their schemas and tokenized by
        `tokenize` (left-padded)."""
        instances = None
        if self.environments is not None:  # each episode's environment, reset with its row; its methods are tools
            instances, prompts = self.environments.start(rows, in_use=environments_in_use)
            row_tools = [self.environments.tools_of(instance) for instance in instances]
        else:
            prompts, row_tools = [row["prompt"] for row in rows], [self.tools] * len(rows)
        texts = self.render(prompts, row_tools)
        query_ids, query_mask = tokenize(texts)
        episodes = [
            ToolEpisode(ids, prompt_text=text) for ids, text in zip(unpadded_prompts(query_ids, query_mask), texts)
        ]
        return episodes, row_tools, texts, (query_ids, query_mask), instances

    def sample(
        self,
        generate: Callable[[torch.Tensor, torch.Tensor, int], tuple[list[list[int]], list[list[float]] | None]],
        tokenize: Callable[[list[str]], tuple[torch.Tensor, torch.Tensor]],
        rows: list[dict[str, Any]],
        any_process: Callable[[bool], bool] = bool,
    ) -> ToolEpisodes:
        """
        Sample one whole episode per row: new episodes ([`start`]) advanced with a budget of `response_length`, which
        finishes them all ([`advance`]). `generate(ids, mask, max_new_tokens)` samples one turn per left-padded context
        and returns its ids (cut after the stop token) and sampler log-probs; `tokenize` turns rendered prompts into
        left-padded ids (the trainer's truncation rules). `any_process(flag)`: whether `flag` holds on any process.
        """
        episodes, row_tools, texts, queries, instances = self.start(rows, tokenize)
        self.advance(
            episodes,
            budget=self.settings.response_length,
            generate=generate,
            any_process=any_process,
            row_tools=row_tools,
            device=queries[0].device,
            first_contexts=queries,
        )
        return ToolEpisodes(
            episodes_output(episodes),
            prompt_texts=texts,
            completions=[e.messages for e in episodes],
            counts=episode_counts(episodes),
            environments=instances,
        )

    def advance(
        self,
        episodes: list[ToolEpisode],
        *,
        budget: int,
        generate: Callable[[torch.Tensor, torch.Tensor, int], tuple[list[list[int]], list[list[float]] | None]],
        any_process: Callable[[bool], bool],
        row_tools: list[list[Callable]],
        device: torch.device,
        first_contexts: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """
        Advance unfinished episodes by at most `budget` policy tokens each (tool tokens are not counted), in place.

        Each generation call continues every episode with a turn open and budget left, from its prompt and completion
        so far (`first_contexts`, when given, are the first call's left-padded contexts: the tokenized prompts of new
        episodes), for as many new tokens as the most room any of them has (its budget left, and `response_length`);
        each takes its own room. A turn ends at a stop token, at `response_length`, or when the sampler stopped short
        of its room; it is then parsed, and its tool calls, if any (and `max_iterations` allows), run before the next
        call, their results appended as tool tokens and a new turn opened (which may start with no budget left: it is
        then the first thing the next [`advance`] samples). A turn cut by the budget stays open, its ids kept. So an
        episode left unfinished has a turn open, never a call pending. The calls stop when no process has a turn to
        continue (`any_process`): under ZeRO-3 or FSDP2 every process takes the same number of generation calls; an
        idle one generates for a dummy context and drops it.
        """
        length, stops = self.settings.response_length, self.stop_token_ids
        by_name = [{tool_name(t): t for t in tools} for tools in row_tools]
        left = [budget] * len(episodes)
        contexts = first_contexts
        while True:
            calling = [i for i, episode in enumerate(episodes) if episode.calls_pending]
            if calling:
                self.run_pending_calls([episodes[i] for i in calling], [by_name[i] for i in calling])
            open_turns = [i for i, episode in enumerate(episodes) if not episode.done and left[i] > 0]
            if not any_process(bool(open_turns)):
                break
            rooms = [min(left[i], length - len(episodes[i].completion_ids)) for i in open_turns]
            if contexts is None:
                sequences = [episodes[i].prompt_ids + episodes[i].completion_ids for i in open_turns]
                # another process still generates: join its call on a dummy context
                contexts = left_pad(sequences or [episodes[0].prompt_ids], self.tokenizer.pad_token_id, device)
            context_ids, context_mask = contexts
            new_ids, new_logprobs = generate(context_ids, context_mask, max(rooms + [1]))
            contexts = None
            for k, i in enumerate(open_turns):
                episode = episodes[i]
                taken = list(new_ids[k])[: rooms[k]]
                episode.add_policy_tokens(taken, None if new_logprobs is None else list(new_logprobs[k])[: len(taken)])
                left[i] -= len(taken)
                stopped = bool(taken) and taken[-1] in stops
                if stopped or len(taken) < rooms[k] or len(episode.completion_ids) >= length:
                    prefix = episode.prompt_ids + episode.completion_ids[: episode.turn_start]
                    episode.end_turn(self.parse(episode.turn_ids, prefix, row_tools[i]), self.settings.max_iterations)

    def run_pending_calls(self, episodes: list[ToolEpisode], by_name: list[dict[str, Callable]]) -> None:
        """Run the pending tool calls of `episodes` (all at once, each with its episode's tools by name) and append
        their results ([`~episodes.tool_episodes.ToolEpisode.add_tool_results`])."""
        calls = [(k, call) for k, episode in enumerate(episodes) for call in episode.messages[-1]["tool_calls"]]
        results = self.run_calls([(call, by_name[k]) for k, call in calls])
        for k, episode in enumerate(episodes):
            mine = [result for (j, _), result in zip(calls, results) if j == k]
            suffix = self.suffix_ids(tool_messages(mine))
            episode.add_tool_results(mine, suffix, self.settings.response_length)


def sample_tool_episodes(
    loop: ToolLoop,
    sampler,
    rows: list[dict[str, Any]],
    *,
    greedy: bool,
    temperature: float,
    tokenize: Callable[[list[str]], tuple[torch.Tensor, torch.Tensor]],
    any_process: Callable[[bool], bool],
    **tensors,
):
    """The maker's tool episodes of `rows`: `(rows, query_ids, query_mask, samples, prompt_texts, completions)`, the
    rows with their `environments` (if any, for the reward functions), the samples with their `action_mask`,
    per-episode `episode_counts` and the generation calls' summed wall time (`seconds`). `tensors`:
    [`function_rollouts`]'s keywords but `num_completions`."""
    from .rollout_function import function_rollouts

    generate, seconds = sampler_turns(sampler, greedy=greedy, temperature=temperature)
    episodes = loop.sample(generate, tokenize, rows, any_process=any_process)
    if episodes.environments is not None:  # to the reward functions (TRL's `environments`), per episode
        rows = [{**row, "environments": env} for row, env in zip(rows, episodes.environments)]
    made = function_rollouts(episodes.output, num_completions=len(rows), **tensors)
    made.samples.seconds = seconds[0]
    device = made.query_ids.device
    made.samples.episode_counts = {
        k: torch.tensor(v, dtype=torch.float32, device=device) for k, v in episodes.counts.items()
    }
    return rows, made.query_ids, made.query_mask, made.samples, episodes.prompt_texts, episodes.completions


def flag_on_any_process(accelerator) -> Callable[[bool], bool]:
    """`any_process(flag)`: whether `flag` holds on any process (a collective: every process calls it)."""
    max_across = max_across_processes(accelerator) or (lambda flags: flags)
    return lambda flag: bool(max_across([int(flag)])[0])


def sampler_turns(sampler, *, greedy: bool, temperature: float):
    """`(generate, seconds)`: the tool loop's `generate(ids, mask, max_new_tokens)` on `sampler` (each context's turn
    ids and sampler log-probs, `None` when it gives none), and a one-item list that sums its calls' wall time (the
    tools' time is not generation)."""
    seconds = [0.0]

    def generate(ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int):
        samples = sampler.generate(ids, mask, greedy, temperature=temperature, max_new_tokens=max_new_tokens)
        seconds[0] += samples.seconds
        turns = [row[m].tolist() for row, m in zip(samples.response_ids, samples.response_mask)]
        if samples.logprobs is None:
            return turns, None
        return turns, [row[m].tolist() for row, m in zip(samples.logprobs, samples.response_mask)]

    return generate, seconds


def episode_metrics(counts: dict[str, torch.Tensor], response_mask: torch.Tensor, action_mask: torch.Tensor) -> dict:
    """The tool metrics of a batch of episodes (all processes' rows): TRL's `tools/call_frequency` (calls per
    episode) and `tools/failure_frequency` (failed calls per call, 0 without calls), malformed calls and overflows
    per episode, turns and tool tokens per episode, and the share of response tokens that are the policy's (trained)."""
    episodes = max(len(counts["calls"]), 1)
    calls = float(counts["calls"].sum())
    response_tokens = float(response_mask.sum())
    return {
        "tools/call_frequency": calls / episodes,
        "tools/failure_frequency": float(counts["failures"].sum()) / calls if calls else 0.0,
        "tools/malformed_frequency": float(counts["malformed"].sum()) / episodes,
        "tools/overflow_frequency": float(counts["overflows"].sum()) / episodes,
        "tools/turns_mean": float(counts["turns"].float().mean()),
        "tools/tool_tokens_mean": float((response_mask & ~action_mask).sum()) / episodes,
        "tools/trained_token_share": float((response_mask & action_mask).sum()) / response_tokens
        if response_tokens
        else float("nan"),
    }

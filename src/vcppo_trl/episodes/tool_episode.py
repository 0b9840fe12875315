"""The state of one tool-calling episode between generation calls ([`ToolEpisode`]): what the tool loop
([`~episodes.tool_loop.ToolLoop.advance`]) reads and writes as it advances a batch of episodes, and what a generation
window's pool keeps of an episode in flight between updates (and in a checkpoint: plain lists, dicts and ints).

An episode's completion is every token after its prompt: the policy's turns (actions, `env_mask` 1) and the tools'
results with the next generation prompt (`env_mask` 0). The current turn starts at `turn_start`; its ids accumulate
over generation calls (a window may end inside it) and it is parsed into a message only when it ends.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# How the tool-call turns of the common templates open (Qwen/Hermes, Llama 3.x python tag, Mistral): a turn that holds
# one of these but parses to no tool call is a malformed call.
TOOL_CALL_MARKERS = ("<tool_call>", "<|python_tag|>", "[TOOL_CALLS]")
COUNTS = ("calls", "failures", "malformed", "overflows", "turns")


@dataclasses.dataclass
class ToolEpisode:
    """One episode: its prompt ids, its completion so far, its messages and counts, and where it stands."""

    prompt_ids: list[int]
    prompt_text: str = ""  # the prompt as rendered for the policy, with its tools' schemas
    completion_ids: list[int] = dataclasses.field(default_factory=list)
    env_mask: list[int] = dataclasses.field(default_factory=list)  # 1: the policy's token, 0: a tool's
    logprobs: list[float] | None = dataclasses.field(default_factory=list)  # None once the sampler gave none
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # its assistant and tool messages
    counts: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    turn_start: int = 0  # where the current turn starts in `completion_ids`
    iterations: int = 0  # tool rounds run
    calls_pending: bool = False  # its last turn ended with tool calls that have not run yet
    done: bool = False

    @property
    def turn_ids(self) -> list[int]:
        """The current turn's ids so far."""
        return self.completion_ids[self.turn_start :]

    def policy_tokens_since(self, start: int) -> int:
        """The policy's tokens among the completion's tokens from `start` on."""
        return sum(self.env_mask[start:])

    def add_policy_tokens(self, ids: list[int], logprobs: list[float] | None) -> None:
        """Append tokens the policy sampled (with the sampler's log-probs, `None` when it gives none)."""
        self.completion_ids += ids
        self.env_mask += [1] * len(ids)
        if logprobs is None:
            self.logprobs = None
        elif self.logprobs is not None:
            self.logprobs += logprobs

    def end_turn(self, message: dict[str, Any], max_iterations: int | None) -> None:
        """The current turn ended and parsed to `message`: its tool calls run next (while `max_iterations` allows),
        else the episode is done."""
        self.messages.append(message)
        self.counts["turns"] += 1
        content = message.get("content") or ""
        if not message.get("tool_calls") and any(marker in content for marker in TOOL_CALL_MARKERS):
            self.counts["malformed"] += 1
        self.calls_pending = bool(message.get("tool_calls")) and (
            max_iterations is None or self.iterations < max_iterations
        )
        self.done = not self.calls_pending

    def add_tool_results(
        self, results: list[tuple[str, str, bool]], suffix_ids: list[int], response_length: int
    ) -> None:
        """The pending calls ran (`(name, text, failed)` each): their messages and `suffix_ids` (the tool tokens and
        the next generation prompt) are appended and a new turn starts, or, when they would leave no room for a next
        turn within `response_length`, they are dropped and the episode ends (an overflow)."""
        self.calls_pending = False
        self.iterations += 1
        self.counts["calls"] += len(results)
        self.counts["failures"] += sum(failed for _, _, failed in results)
        if len(self.completion_ids) + len(suffix_ids) >= response_length:
            self.counts["overflows"] += 1
            self.done = True
            return
        self.messages += tool_messages(results)
        self.completion_ids += suffix_ids
        self.env_mask += [0] * len(suffix_ids)
        if self.logprobs is not None:
            self.logprobs += [0.0] * len(suffix_ids)
        self.turn_start = len(self.completion_ids)

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ToolEpisode:
        return cls(**state)


def tool_messages(results: list[tuple[str, str, bool]]) -> list[dict[str, Any]]:
    """Tool results `(name, text, failed)` as the chat template's tool messages."""
    return [{"role": "tool", "name": name, "content": text} for name, text, _ in results]


def episodes_output(episodes: list[ToolEpisode]) -> dict[str, list]:
    """Episodes as a `rollout_func`'s output ([`~episodes.rollout_function.function_rollouts`]): prompt and
    completion ids, the sampler's log-probs (`None` when it gave none) and the `env_mask`."""
    logprobs = [e.logprobs for e in episodes]
    return {
        "prompt_ids": [e.prompt_ids for e in episodes],
        "completion_ids": [e.completion_ids for e in episodes],
        "logprobs": None if any(lp is None for lp in logprobs) else logprobs,
        "env_mask": [e.env_mask for e in episodes],
    }


def episode_counts(episodes: list[ToolEpisode]) -> dict[str, list[int]]:
    """Each count ([`COUNTS`]) per episode."""
    return {name: [e.counts[name] for e in episodes] for name in COUNTS}

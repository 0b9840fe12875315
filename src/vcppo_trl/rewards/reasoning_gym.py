"""Any reasoning-gym task (github.com/open-thought/reasoning-gym, Apache-2.0: ~100 procedural reasoning tasks, each
with its own answer scoring) as prompts and a reward, with the task's own scoring.

    from vcppo_trl.rewards.reasoning_gym import reasoning_gym_dataset, reasoning_gym_reward

    train = reasoning_gym_dataset("leg_counting", size=1000, seed=0)
    trainer = VCPPOTrainer(model=..., reward_funcs=reasoning_gym_reward, train_dataset=train, args=...)

- Prompts: chat messages, the task's system prompt (reasoning-gym's `SYSTEM_PROMPTS["default"]`: think step by step,
  then give the answer inside `<answer>…</answer>`; or a system message of your own) and the question. The entry
  (question, answer, metadata) is kept as JSON in the `reasoning_gym_entry` column, which the trainer passes to the
  reward function; the gold answer is also the `solution` column, for rewards that compare answers themselves
  (`math_verify_reward` on the numeric tasks).
- Reward: the answer extracted as the prompt asks for it (reasoning-gym's `extract_answer`: the last `<answer>` block,
  so a `<think>` part before it is ignored), scored by the task's own `score_answer(answer, entry)` in [0, 1] (1:
  correct; some tasks give partial credit, e.g. for a well-formed wrong answer), mapped to `2·score − 1`: +1 correct,
  −1 wrong or no answer, partial credit in between, the scale of `math_verify_reward`.

Needs the optional `reasoning-gym` package (`pip install -e ".[reasoning_gym]"`; it pins 11 packages of its own).
"""

from __future__ import annotations

import difflib
import json
from typing import Any

ENTRY_COLUMN = "reasoning_gym_entry"


def _reasoning_gym():
    try:
        import reasoning_gym
    except ImportError as err:
        raise ImportError(
            'reasoning-gym tasks need the `reasoning-gym` package: pip install -e ".[reasoning_gym]" (or '
            "pip install reasoning-gym)."
        ) from err
    return reasoning_gym


def reasoning_gym_tasks() -> list[str]:
    """The names of the tasks the installed reasoning-gym registers."""
    from reasoning_gym.factory import DATASETS

    _reasoning_gym()
    return sorted(DATASETS)


def reasoning_gym_dataset(
    task: str,
    size: int,
    seed: int = 0,
    *,
    system_prompt: str = "default",
    system_message: str | None = None,
    **task_config,
):
    """
    `size` problems of the reasoning-gym task `task` (its own generator, seeded by `seed`; `task_config`: the task's
    own settings, e.g. `min_animals=3`) as a `datasets.Dataset` with a conversational `prompt` (the system prompt
    `system_prompt` of reasoning-gym's `SYSTEM_PROMPTS`, or `system_message` as given when set, then the question),
    the entry as JSON in `reasoning_gym_entry` and its gold answer as text in `solution`.

    Raises:
        `ValueError`: `task` is not a reasoning-gym task (the closest names are given), `system_prompt` is not one
            of reasoning-gym's, or `task_config` names a setting the task does not have (its settings are listed).
    """
    from datasets import Dataset

    reasoning_gym = _reasoning_gym()
    from reasoning_gym.utils import SYSTEM_PROMPTS

    tasks = reasoning_gym_tasks()
    if task not in tasks:
        close = difflib.get_close_matches(task, tasks, n=3, cutoff=0.6)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(
            f"{task!r} is not a reasoning-gym task.{hint} reasoning_gym_tasks() lists the {len(tasks)} installed."
        )
    if system_prompt not in SYSTEM_PROMPTS:
        raise ValueError(
            f"system_prompt must be one of reasoning-gym's {sorted(SYSTEM_PROMPTS)}, got {system_prompt!r}."
        )
    _check_task_config(task, task_config)
    problems = reasoning_gym.create_dataset(task, size=size, seed=seed, **task_config)
    system = SYSTEM_PROMPTS[system_prompt] if system_message is None else system_message
    rows = [
        {
            "prompt": [{"role": "system", "content": system}, {"role": "user", "content": entry["question"]}],
            ENTRY_COLUMN: json.dumps(entry),
            "solution": str(entry["answer"]),
        }
        for entry in problems
    ]
    return Dataset.from_list(rows)


def _check_task_config(task: str, task_config: dict[str, Any]) -> None:
    """Refuses a setting the task's config does not declare (reasoning-gym's own error names only the class)."""
    import dataclasses

    from reasoning_gym.factory import DATASETS

    config_class = DATASETS[task][1]
    known = {f.name for f in dataclasses.fields(config_class)} - {"seed", "size"}
    unknown = sorted(set(task_config) - known)
    if unknown:
        raise ValueError(
            f"The reasoning-gym task {task!r} has no setting {', '.join(map(repr, unknown))}; its settings: "
            f"{', '.join(sorted(known))}."
        )


def _text(completion: Any) -> str:
    """A completion's text: a string, or the content of a conversation's assistant turns."""
    if isinstance(completion, str):
        return completion
    return "".join(turn.get("content") or "" for turn in completion if turn.get("role", "assistant") == "assistant")


def reasoning_gym_score(completion: Any, entry: dict[str, Any]) -> float:
    """The task's own score, in [0, 1], of the answer in `completion` (its last `<answer>` block)."""
    reasoning_gym = _reasoning_gym()
    from reasoning_gym.utils import extract_answer

    score_answer = reasoning_gym.get_score_answer_fn(entry["metadata"]["source_dataset"])
    return float(score_answer(extract_answer(_text(completion)), entry))


def reasoning_gym_reward(completions: list[Any], reasoning_gym_entry: list[str], **kwargs) -> list[float]:
    """TRL's reward protocol: `2·score − 1` for each completion, the score the task's own `score_answer` of the answer
    extracted as its prompt asks (see the module's docstring)."""
    return [
        2.0 * reasoning_gym_score(completion, json.loads(entry)) - 1.0
        for completion, entry in zip(completions, reasoning_gym_entry, strict=True)
    ]

"""TRL's `rollout_func`: the user's function samples the completions (its own backend, a multi-turn environment) and
the trainer scores them, takes their values and trains on them as on its own samples.

The function is called as TRL 1.16's `GRPOTrainer` calls it, `rollout_func(prompts, trainer)`, with this process's
batch as the trainer samples it: each prompt `num_generations` times in a row (TRL's docstring says "no duplication";
its code passes the repeated prompts, and this is what a function written for TRL expects). It returns a dict of
per-completion lists, one completion per prompt received, in their order:

- `prompt_ids`, `completion_ids`: token ids (the completion as the policy must be trained on it: every turn, tool
  results included);
- `logprobs`: the sampler's log-probability of each completion token (the importance-sampling correction's
  denominator and the `sampling/...` metrics), or `None`;
- `env_mask` (optional): 1 on the policy's own tokens, 0 on tokens the environment or a tool wrote; those are context,
  never actions (see [`~episodes.types.Rollout.action_mask`]);
- any other key: forwarded to the reward functions as a keyword argument (a list: one value per completion; anything
  else: the same value for every completion).

Completions are kept as returned, not cut at the first stop token (a multi-turn completion holds one per turn); a
completion "has a stop" when its last token is a stop token.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from ..sampling import Samples
from ..sampling.seam import left_pad, right_pad

REQUIRED_KEYS = ("prompt_ids", "completion_ids", "logprobs")


@dataclasses.dataclass
class FunctionRollouts:
    """What a `rollout_func` returned, as the trainer's tensors: left-padded prompts, the samples, and the extra keys
    for the reward functions (one value per completion)."""

    query_ids: torch.Tensor  # [B, P]
    query_mask: torch.Tensor  # [B, P]
    samples: Samples
    extra_columns: dict[str, list[Any]]


def _check_token_lists(name: str, lists: Any, count: int, num_generations: int = 1) -> list[list[int]]:
    if not isinstance(lists, (list, tuple)) or len(lists) != count:
        got = f"{len(lists)} entries" if isinstance(lists, (list, tuple)) else type(lists).__name__
        hint = ""
        if isinstance(lists, (list, tuple)) and num_generations > 1 and len(lists) == count * num_generations:
            hint = (
                f" It returned num_generations={num_generations} completions per prompt received: the function is "
                "now given each prompt num_generations times, as TRL's GRPOTrainer gives it, and makes one "
                "completion per prompt it receives (drop its own loop over num_generations)."
            )
        raise ValueError(
            f"rollout_func returned `{name}` with {got}; it must hold one list per completion: {count}, one per "
            f"prompt it was given (each prompt comes num_generations times in a row, as TRL passes them).{hint}"
        )
    return [list(map(int, ids.tolist() if isinstance(ids, torch.Tensor) else ids)) for ids in lists]


def _float_rows(name: str, rows: Any, lengths: list[int]) -> list[list[float]] | None:
    if rows is None or any(row is None for row in rows):
        return None
    if len(rows) != len(lengths):
        raise ValueError(f"rollout_func returned {len(rows)} `{name}` rows for {len(lengths)} completions.")
    out = []
    for i, (row, length) in enumerate(zip(rows, lengths)):
        row = row.tolist() if isinstance(row, torch.Tensor) else list(row)
        if len(row) != length:
            raise ValueError(
                f"rollout_func: completion {i} has {length} tokens but {len(row)} `{name}` values; give one per "
                "completion token."
            )
        out.append([float(v) for v in row])
    return out


def function_rollouts(
    output: dict[str, Any],
    *,
    num_completions: int,
    num_generations: int = 1,
    response_length: int,
    stop_token_ids: list[int],
    pad_token_id: int,
    device: torch.device,
) -> FunctionRollouts:
    """Check a `rollout_func`'s output and turn it into the trainer's tensors (see the module's docstring).

    Raises:
        `ValueError`: a required key is missing, a list has the wrong length, a completion is empty or longer than
            `response_length` (the trainer's tensors and the length penalties are sized by it), or `env_mask` holds
            values other than 0 and 1.
    """
    if not isinstance(output, dict):
        raise ValueError(f"rollout_func must return a dict, got {type(output).__name__}.")
    missing = [key for key in REQUIRED_KEYS if key not in output]
    if missing:
        raise ValueError(f"rollout_func must return the keys {list(REQUIRED_KEYS)}; missing: {missing}.")
    counts = dict(count=num_completions, num_generations=num_generations)
    prompt_ids = _check_token_lists("prompt_ids", output["prompt_ids"], **counts)
    completion_ids = _check_token_lists("completion_ids", output["completion_ids"], **counts)
    lengths = [len(ids) for ids in completion_ids]
    for i, length in enumerate(lengths):
        if not 0 < length <= response_length:
            raise ValueError(
                f"rollout_func: completion {i} has {length} tokens; each must have 1 to response_length="
                f"{response_length} (tool results included, as TRL counts them). Cut it in the function, or raise "
                "response_length."
            )
    if not all(prompt_ids):
        raise ValueError("rollout_func returned an empty `prompt_ids` row: every completion needs its prompt's ids.")
    logprobs = _float_rows("logprobs", output["logprobs"], lengths)
    env_mask = _float_rows("env_mask", output.get("env_mask"), lengths) if "env_mask" in output else None
    if env_mask is not None and any(v not in (0.0, 1.0) for row in env_mask for v in row):
        raise ValueError("rollout_func: `env_mask` must hold 1 (the policy's token) or 0 (a tool's or environment's).")

    query_ids, query_mask = left_pad(prompt_ids, pad_token_id, device)
    response_ids = right_pad(completion_ids, pad_value=pad_token_id, dtype=torch.long, device=device)
    positions = torch.arange(response_ids.shape[1], device=device).unsqueeze(0)
    response_mask = positions < torch.tensor(lengths, device=device).unsqueeze(1)
    has_stop = torch.tensor([ids[-1] in stop_token_ids for ids in completion_ids], device=device)

    def padded(rows: list[list[float]]) -> torch.Tensor:
        return right_pad(rows, pad_value=0.0, dtype=torch.float32, device=device)

    action_mask = None if env_mask is None else padded(env_mask).bool() & response_mask
    sampler_logprobs = None
    if logprobs is not None:
        mask = response_mask if action_mask is None else action_mask  # a tool's tokens were not sampled
        sampler_logprobs = padded(logprobs) * mask
    extra = {}
    for key, values in output.items():
        if key in REQUIRED_KEYS or key == "env_mask":
            continue
        if isinstance(values, list):
            if len(values) != num_completions:
                raise ValueError(
                    f"rollout_func returned `{key}` with {len(values)} values for {num_completions} completions: a "
                    "list is forwarded to the reward functions one value per completion."
                )
            extra[key] = values
        else:
            extra[key] = [values] * num_completions
    samples = Samples(response_ids, response_mask, has_stop, logprobs=sampler_logprobs, action_mask=action_mask)
    return FunctionRollouts(query_ids, query_mask, samples=samples, extra_columns=extra)


def sample_with_rollout_function(
    rollout_function: Callable[[list[Any]], dict[str, Any]],
    rows: list[dict[str, Any]],
    num_generations: int,
    **tensors,
) -> tuple[list[dict[str, Any]], torch.Tensor, torch.Tensor, Samples]:
    """The `rollout_func`'s completions of `rows` (each prompt `num_generations` times in a row, and so given to the
    function), timed, with the rows extended by its extra keys for the reward functions. `tensors`: the keyword
    arguments of [`function_rollouts`] but `num_completions` and `num_generations`."""
    start = time.perf_counter()
    made = function_rollouts(
        rollout_function([row["prompt"] for row in rows]),
        num_completions=len(rows),
        num_generations=num_generations,
        **tensors,
    )
    made.samples.seconds = time.perf_counter() - start
    extra = made.extra_columns
    rows = [{**row, **{key: values[i] for key, values in extra.items()}} for i, row in enumerate(rows)]
    return rows, made.query_ids, made.query_mask, made.samples

"""The datasets of `train.py` (`--dataset_name`): a dataset by name or path with its columns renamed to what the
trainer and the reward functions read (`prompt`, `solution`), or a reasoning-gym task (`reasoning_gym:<task>`), built
in-process with its own scoring ([`~rewards.reasoning_gym`])."""

from __future__ import annotations

import json
from typing import Any

from datasets import Dataset, DatasetDict, load_dataset

from .arguments import VCPPOScriptArguments

REASONING_GYM_PREFIX = "reasoning_gym:"
REASONING_GYM_SIZES = (1000, 100)  # train and eval problems when --max_train_samples / --max_eval_samples are unset


def _to_chat(example: dict, column: str, system_prompt: str | None) -> dict:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": example[column]})
    return {"prompt": messages}


def prepare_dataset(dataset: Dataset, script_args: VCPPOScriptArguments, limit: int | None) -> Dataset:
    """Rename the configured columns to `prompt`/`solution` and optionally wrap prompts as chat messages."""
    columns = dataset.column_names
    if script_args.prompt_column not in columns:
        raise ValueError(
            f"The dataset has no column {script_args.prompt_column!r} (columns: {columns}). Set --prompt_column."
        )
    if script_args.solution_column and script_args.solution_column not in columns:
        raise ValueError(
            f"The dataset has no column {script_args.solution_column!r} (columns: {columns}). Set --solution_column "
            "to the gold-answer column, or to an empty value if your reward functions need none."
        )
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    if script_args.solution_column and script_args.solution_column != "solution":
        if "solution" in columns:
            dataset = dataset.remove_columns("solution")
        dataset = dataset.rename_column(script_args.solution_column, "solution")
    if script_args.conversational:
        dataset = dataset.map(lambda ex: _to_chat(ex, script_args.prompt_column, script_args.system_prompt))
    elif script_args.prompt_column != "prompt":
        dataset = dataset.rename_column(script_args.prompt_column, "prompt")
    return dataset


def load_datasets(script_args: VCPPOScriptArguments) -> tuple[Dataset, Dataset | None]:
    """Load the train (and test, when the split exists) datasets named by the script arguments."""
    if script_args.dataset_name.startswith(REASONING_GYM_PREFIX):
        return reasoning_gym_splits(script_args)
    data = load_dataset(script_args.dataset_name, name=script_args.dataset_config)
    if not isinstance(data, DatasetDict) or script_args.dataset_train_split not in data:
        raise ValueError(f"The dataset has no split {script_args.dataset_train_split!r}: set --dataset_train_split.")
    train = prepare_dataset(data[script_args.dataset_train_split], script_args, script_args.max_train_samples)
    test = None
    if script_args.dataset_test_split in data:
        test = prepare_dataset(data[script_args.dataset_test_split], script_args, script_args.max_eval_samples)
    return train, test


def reasoning_gym_splits(script_args: VCPPOScriptArguments) -> tuple[Dataset, Dataset]:
    """`--dataset_name reasoning_gym:<task>`: the task's problems, train from its generator's seed 0 and eval from
    seed 1 (a task with few distinct problems may repeat some), sized by `--max_train_samples` and
    `--max_eval_samples` (default 1000 and 100), with the task's settings from `--dataset_config` (a JSON object, e.g.
    '{"max_terms": 2}') and `--system_prompt` instead of reasoning-gym's own when set; score them with
    `--reward_funcs reasoning_gym` (or `math_verify` against the `solution` column, on numeric tasks)."""
    from ..rewards import reasoning_gym_dataset

    task = script_args.dataset_name[len(REASONING_GYM_PREFIX) :]
    settings = reasoning_gym_settings(script_args.dataset_config)
    train_size = script_args.max_train_samples or REASONING_GYM_SIZES[0]
    eval_size = script_args.max_eval_samples or REASONING_GYM_SIZES[1]
    system = {"system_message": script_args.system_prompt}
    return (
        reasoning_gym_dataset(task, train_size, seed=0, **system, **settings),
        reasoning_gym_dataset(task, eval_size, seed=1, **system, **settings),
    )


def reasoning_gym_settings(dataset_config: str | dict | None) -> dict[str, Any]:
    """A reasoning-gym task's settings from `--dataset_config`: a JSON object (a mapping in a --config YAML), or
    nothing."""
    if not dataset_config:
        return {}
    if isinstance(dataset_config, dict):
        return dataset_config
    try:
        settings = json.loads(dataset_config)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"With --dataset_name reasoning_gym:<task>, --dataset_config holds the task's settings as a JSON object "
            f"(e.g. '{{\"max_terms\": 2}}'); {dataset_config!r} is not JSON: {err}."
        ) from err
    if not isinstance(settings, dict):
        raise ValueError(f"--dataset_config must be a JSON object of the task's settings, got {dataset_config!r}.")
    return settings

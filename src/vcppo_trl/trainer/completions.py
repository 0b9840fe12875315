"""Completions in the logs: the sample printout (`num_sample_generations`) and TRL GRPO's `log_completions`.

With `log_completions`, every logging step writes the update's completions, gathered from every process, as a table:
always to `output_dir/completions/completions_<step>.parquet`, printed to the console (`num_completions_to_print` rows;
all when `None`), and to the trackers of `report_to` that take tables: Weights & Biases and trackio (`Table`), and
tensorboard (a markdown text table under the tag `completions`). Columns: step, prompt, completion, score (the reward
trained on, penalties included), one column per reward function, advantage (mean over the response's tokens), value at
the first response token, length (tokens), and under `generation_window` whether the response finished in the update
(an unfinished one has no score yet: NaN).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import torch
from accelerate.utils import gather_object
from transformers.utils import logging
from trl.trainer.utils import print_prompt_completions_sample

from ..config.ppo import PPOConfig
from .metrics import UpdateRecord

logger = logging.get_logger(__name__)

COMPLETIONS_DIR = "completions"


@dataclasses.dataclass(frozen=True)
class CompletionLogSettings:
    """What logging completions reads of the config."""

    log_completions: bool
    num_completions_to_print: int | None
    num_sample_generations: int
    report_to: tuple[str, ...]
    output_dir: str

    @classmethod
    def from_args(cls, args: PPOConfig) -> CompletionLogSettings:
        report_to = args.report_to if isinstance(args.report_to, list) else [args.report_to]
        return cls(
            log_completions=args.log_completions,
            num_completions_to_print=args.num_completions_to_print,
            num_sample_generations=args.num_sample_generations,
            report_to=tuple(r for r in report_to if r and r != "none"),
            output_dir=args.output_dir,
        )


def completion_text(completion: Any) -> str:
    """A completion as the logs show it: text as it is; chat messages as their turns, one per line, with tool calls
    and tool results marked (`[call add({"a": 2})]`, `[tool add -> 5]`)."""
    if not isinstance(completion, list):
        return str(completion)
    turns = []
    for message in completion:
        if not isinstance(message, dict):
            turns.append(str(message))
        elif message.get("role") == "tool":
            turns.append(f"[tool {message.get('name', '')} -> {message.get('content', '')}]")
        else:
            calls = [
                f"[call {call['function'].get('name')}({json.dumps(call['function'].get('arguments'))})]"
                for call in message.get("tool_calls") or []
                if isinstance(call, dict) and "function" in call
            ]
            turns.append(" ".join([str(message.get("content") or ""), *calls]).strip())
    return "\n".join(turns)


def completion_table(update: UpdateRecord, reward_func_names: list[str], step: int) -> dict[str, list[Any]]:
    """This process's completions of an update as columns (see the module's docstring); `length` and `advantage`
    over the policy's own tokens (a tool's result is not the policy's)."""
    rollout = update.rollout
    mask = rollout.action_tokens
    lengths = mask.sum(1)
    advantage = (update.advantages * mask).sum(1) / lengths.clamp(min=1)
    finished = rollout.finished_rows
    score = torch.where(finished, rollout.scores.float(), torch.full_like(rollout.scores.float(), float("nan")))
    table: dict[str, list[Any]] = {
        "step": [step] * len(rollout.prompts),
        "prompt": [str(p) for p in rollout.prompts],
        "completion": [completion_text(c) for c in rollout.completions],
        "score": score.tolist(),
    }
    for i, name in enumerate(reward_func_names):
        table[name] = rollout.rewards_per_func[:, i].float().tolist()
    table.update(rollout.reward_columns)  # TRL's `log_extra` columns
    table["advantage"] = advantage.float().tolist()
    table["value"] = (
        rollout.values[:, 0].float().tolist() if rollout.values is not None else [float("nan")] * len(lengths)
    )
    table["length"] = lengths.tolist()
    if not rollout.responses_are_whole:
        table["finished"] = finished.tolist()
    return table


def gathered_table(accelerator, table: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Every process's rows (process order), on every process."""
    if accelerator.num_processes == 1:
        return table
    return {name: gather_object(column) for name, column in table.items()}


def sample_steps(samples: int, max_steps: int) -> set[int]:
    """The updates after which `num_sample_generations` printouts are due: `samples` of them spread evenly over the
    run's `max_steps` updates, the last at the last update (every update when there are fewer updates than samples)."""
    if samples <= 0 or max_steps <= 0:
        return set()
    return (
        {math.ceil(i * max_steps / samples) for i in range(1, min(samples, max_steps) + 1)}
        if samples < max_steps
        else set(range(1, max_steps + 1))
    )


class CompletionLog:
    """
    The trainer's completion logging, called after every update.

    Args:
        settings: What it reads of the config.
        accelerator: The trainer's accelerator (gathers rows; the main process writes).
        reward_func_names: Names of the reward functions (one column each).
        max_steps: The run's updates (spaces the `num_sample_generations` printouts).
        callbacks: The trainer's callbacks (tensorboard's writer is taken from its callback).
    """

    def __init__(self, settings: CompletionLogSettings, accelerator, *, reward_func_names, max_steps, callbacks):
        self.settings = settings
        self.accelerator = accelerator
        self.reward_func_names = list(reward_func_names)
        self.sample_steps = sample_steps(settings.num_sample_generations, max_steps)
        self.callbacks = callbacks

    @classmethod
    def from_trainer(cls, trainer) -> CompletionLog:
        """The log of a trainer that starts training: its config, accelerator, reward functions' names, planned
        updates and callbacks."""
        return cls(
            CompletionLogSettings.from_args(trainer.args),
            trainer.accelerator,
            reward_func_names=trainer.reward_func_names,
            max_steps=trainer.state.max_steps,
            callbacks=trainer.callback_handler.callbacks,
        )

    def after_update(self, update: UpdateRecord, step: int, *, logged: bool) -> None:
        """The printout when it is due, and with `log_completions` the tables at a logging step (`logged`). Every
        process calls it (the rows are gathered)."""
        if self.settings.log_completions and logged:
            table = gathered_table(self.accelerator, completion_table(update, self.reward_func_names, step))
            if self.accelerator.is_main_process:
                self.write(table, step)
        elif step in self.sample_steps and self.accelerator.is_main_process:
            table = completion_table(update, self.reward_func_names, step)
            print_table(table, self.reward_func_names, step, num_rows=4)

    def write(self, table: dict[str, list[Any]], step: int) -> None:
        """The parquet file, the console and the trackers (main process)."""
        import pandas as pd

        frame = pd.DataFrame(table)
        folder = os.path.join(self.settings.output_dir, COMPLETIONS_DIR)
        os.makedirs(folder, exist_ok=True)
        frame.to_parquet(os.path.join(folder, f"completions_{step:05d}.parquet"))
        print_table(table, self.reward_func_names, step, num_rows=self.settings.num_completions_to_print)
        report_to = self.settings.report_to
        if "wandb" in report_to:
            import wandb

            if wandb.run is not None:
                wandb.log({"completions": wandb.Table(dataframe=frame)})
        if "trackio" in report_to:
            import trackio

            trackio.log({"completions": trackio.Table(dataframe=frame)})
        if "tensorboard" in report_to:
            writer = tensorboard_writer(self.callbacks)
            if writer is None:
                logger.warning("log_completions: no tensorboard writer found; the completions are not in tensorboard.")
            else:
                writer.add_text("completions", markdown_table(table), global_step=step)
                writer.flush()


def print_table(table: dict[str, list[Any]], reward_func_names: list[str], step: int, num_rows: int | None) -> None:
    """TRL's rich printout of prompts, completions, rewards and advantages (the first `num_rows`; all when `None`)."""
    rows = len(table["prompt"])
    try:
        print_prompt_completions_sample(
            table["prompt"],
            table["completion"],
            {name: table[name] for name in reward_func_names},
            table["advantage"],
            step,
            num_samples=rows if num_rows is None else min(num_rows, rows),
        )
    except ImportError:
        logger.info("Install `rich` to see sample completions as a table.")


def markdown_table(table: dict[str, list[Any]]) -> str:
    """The columns as a markdown table (tensorboard's text plugin renders it), cells on one line each."""

    def cell(value: Any) -> str:
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", "<br>")

    names = list(table)
    lines = ["| " + " | ".join(names) + " |", "|" + " --- |" * len(names)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in zip(*table.values())]
    return "\n".join(lines)


def tensorboard_writer(callbacks) -> Any | None:
    """The `SummaryWriter` of transformers' tensorboard callback (created at train begin), if there is one."""
    from transformers.integrations import TensorBoardCallback

    for callback in callbacks:
        if isinstance(callback, TensorBoardCallback):
            return callback.tb_writer
    return None

"""TRL's `log_extra` and `log_metric`: what a reward function logs besides its rewards.

TRL's `GRPOTrainer` passes every reward function two callables: `log_extra(column, values)` adds a column to the
logged completions (one value per sample of the batch the function scored) and `log_metric(name, value)` a scalar
logged beside the trainer's metrics under `name`, averaged over the values logged in an update and over processes.
Here one [`RewardLogs`] collects them while a batch is scored; what it collected travels with the scored samples into
the rollout (so a rollout made in an overlap worker or finished over several generation windows keeps its own), and
the trainer logs it with the update.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import torch
from accelerate.utils import gather_object


class RewardLogs:
    """Collects what reward functions log while one batch is scored (thread-safe: sync functions run in threads)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.columns: dict[str, list[Any]] = {}
        self.metrics: dict[str, list[float]] = {}

    def log_extra(self, column: str, values: list) -> None:
        """Add `values` (one per sample, in the order of the `completions` the function received) to `column` of
        the logged completions."""
        if not isinstance(column, str):
            raise TypeError(f"log_extra: the column name must be a string, got {type(column).__name__}.")
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise TypeError(f"log_extra({column!r}, ...): values must be a list with one value per completion.")
        with self._lock:
            self.columns.setdefault(column, []).extend(list(values))

    def log_metric(self, name: str, value: float) -> None:
        """Log a scalar under `name` (averaged over an update's values and over processes)."""
        if not isinstance(name, str):
            raise TypeError(f"log_metric: the metric name must be a string, got {type(name).__name__}.")
        try:
            value = float(value)
        except (TypeError, ValueError) as err:
            raise TypeError(f"log_metric({name!r}, ...): the value must be a number, got {value!r}.") from err
        with self._lock:
            self.metrics.setdefault(name, []).append(value)

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments TRL passes reward functions."""
        return {"log_extra": self.log_extra, "log_metric": self.log_metric}

    def columns_for(self, num_samples: int) -> dict[str, list[Any]]:
        """The logged columns, each exactly `num_samples` long: a column logged with fewer values is filled with
        None, one with more keeps its last `num_samples` (as a function that logs per sample after a failed batch
        call does)."""
        return {
            name: (
                values[-num_samples:] if len(values) >= num_samples else values + [None] * (num_samples - len(values))
            )
            for name, values in self.columns.items()
        }


def scattered_columns(columns: dict[str, list[Any]], rows: list[int], num_samples: int) -> dict[str, list[Any]]:
    """Columns logged for the samples `rows` of a batch of `num_samples`, placed at those rows (None elsewhere)."""
    out = {}
    for name, values in columns.items():
        column: list[Any] = [None] * num_samples
        for row, value in zip(rows, values):
            column[row] = value
        out[name] = column
    return out


def merged_columns(parts: list[dict[str, list[Any]]], sizes: list[int]) -> dict[str, list[Any]]:
    """Columns of batches put end to end (a column one batch lacks is None on its samples)."""
    names = sorted({name for part in parts for name in part})
    return {name: [v for part, n in zip(parts, sizes) for v in part.get(name, [None] * n)] for name in names}


def merged_metrics(parts: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for part in parts:
        for name, values in part.items():
            out.setdefault(name, []).extend(values)
    return out


def reward_log_metrics(accelerator, metrics: dict[str, list[float]]) -> dict[str, float]:
    """Each logged metric's mean over its values on every process (names in sorted order on every process, so the
    collectives line up; a process that logged none of a name contributes nothing to it)."""
    names = sorted(set(name for names in gather_object([sorted(metrics)]) for name in names))
    out = {}
    for name in names:
        values = metrics.get(name, [])
        local = torch.tensor([sum(values), len(values)], dtype=torch.float64, device=accelerator.device)
        total, count = accelerator.reduce(local, "sum").tolist() if accelerator.num_processes > 1 else local.tolist()
        out[name] = total / count if count else math.nan
    return out

"""What the experiment modules share: the default results and cache directories, the JSON files a run or an asset
build writes (atomically) and reads back, the budget as a run's file records it, and the commit a run ran at."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from task_addition import Budget

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_RESULTS = os.path.join(HERE, "results")
DEFAULT_CACHE = os.path.join(HERE, ".cache")


def budget_dict(budget: Budget) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(budget).items()}


# Budget fields added after runs were saved, with the default that keeps those runs' behaviour: a saved budget without
# one of them counts as made at its default (`same_budget`), so adding the field does not make the saved runs stale.
# `eval_every`: `Budget`'s (None: no evaluation along the run); `toy_num_heads`: the running-sum budgets' (4, the toy
# model's default head count the runs before it were built with; its asset key leaves 4 out for the same reason).
ADDED_FIELDS = {"eval_every": None, "toy_num_heads": 4}


def same_budget(saved: dict | None, budget: Budget) -> bool:
    """Whether a saved run used this budget; the seed list is not part of it (`--seeds` picks which runs to do), and a
    field of `ADDED_FIELDS` missing from the saved budget reads as its default."""
    if saved is None:
        return False
    current = budget_dict(budget)
    saved = {k: v for k, v in ADDED_FIELDS.items() if k in current} | saved
    return {k: v for k, v in saved.items() if k != "seeds"} == {k: v for k, v in current.items() if k != "seeds"}


def git_commit() -> str | None:
    """The commit this code runs at (`<sha>`, with `-dirty` when tracked files differ from it); `None` outside git."""
    import subprocess

    try:
        sha = subprocess.run(
            ["git", "-C", HERE, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", HERE, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{sha}-dirty" if dirty else sha


def read_json(path: str) -> dict | None:
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError:
        return None  # a run killed while writing: redo it


def write_json(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=json_default)
    os.replace(tmp, path)


def json_default(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    if hasattr(x, "item"):
        return x.item()
    return str(x)

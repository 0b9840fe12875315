"""When a logging, evaluation or saving event falls due, by transformers' `*_steps` / `*_strategy` settings."""

from __future__ import annotations


def is_due(interval: float | int, strategy, step: int, max_steps: int) -> bool:
    """Whether an event with transformers' `*_steps` / `*_strategy` settings (logging, evaluation, saving) happens at
    update `step` of `max_steps` (an interval below 1 is a fraction of the run)."""
    if strategy not in ("steps",) or not interval:
        return False
    every = interval if interval >= 1 else max(1, int(interval * max_steps))
    return step % int(every) == 0

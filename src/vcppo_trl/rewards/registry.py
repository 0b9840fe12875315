"""Reward functions by name for scripts: the built-ins (`math_verify`, `think_format`, `accuracy`, `reasoning_gym`)
and dotted paths."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Sequence
from typing import Any

from trl.rewards import accuracy_reward, think_format_reward

from .math_verify import math_verify_reward
from .reasoning_gym import reasoning_gym_reward

# ----------------------------------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------------------------------

BUILTIN_REWARDS: dict[str, Callable[..., list[float | None]]] = {
    "math_verify": math_verify_reward,
    "think_format": think_format_reward,
    "accuracy": accuracy_reward,
    "reasoning_gym": reasoning_gym_reward,  # the task's own scoring, with --dataset_name reasoning_gym:<task>
}


def import_dotted(spec: str) -> Any:
    """Imports `pkg.module:attr` or `pkg.module.attr` (attributes may be nested: `pkg.module.Class.method`)."""
    if ":" in spec:
        module_name, _, attr_path = spec.partition(":")
        obj = importlib.import_module(module_name)
        for attr in attr_path.split("."):
            obj = getattr(obj, attr)
        return obj
    parts = spec.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            # Only swallow "this prefix is not a module"; a missing dependency inside the module is a real error.
            if error.name is not None and (module_name == error.name or module_name.startswith(error.name + ".")):
                continue
            raise
        for attr in parts[split:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(f"No module found in {spec!r}")


def resolve_reward_funcs(specs: str | Callable | Sequence[str | Callable]) -> list[Callable]:
    """
    Turns reward specifications (e.g. from a command line) into reward functions.

    Args:
        specs (`str`, `Callable` or a sequence of them):
            Each spec is a name from [`BUILTIN_REWARDS`], a dotted import path (`my_pkg.module.func` or
            `my_pkg.module:func`), or an already callable reward. A single string may hold several comma-separated
            specs.

    Returns:
        `list[Callable]`: The reward functions, in order.

    Raises:
        `ValueError`: if a spec is neither a built-in name nor an importable callable.

    Example:
    ```python
    >>> [f.__name__ for f in resolve_reward_funcs("math_verify,think_format")]
    ['math_verify_reward', 'think_format_reward']
    ```
    """
    if isinstance(specs, str) or callable(specs):
        specs = [specs]
    items: list[str | Callable] = []
    for spec in specs:
        if isinstance(spec, str):
            items.extend(part.strip() for part in spec.split(",") if part.strip())
        else:
            items.append(spec)

    funcs: list[Callable] = []
    for spec in items:
        if callable(spec):
            funcs.append(spec)
            continue
        if spec in BUILTIN_REWARDS:
            funcs.append(BUILTIN_REWARDS[spec])
            continue
        hint = (
            f"Built-in rewards are: {', '.join(sorted(BUILTIN_REWARDS))}. Any other reward must be given as a dotted "
            "import path to a callable, `my_pkg.module.func` or `my_pkg.module:func`."
        )
        if "." not in spec and ":" not in spec:
            close = difflib.get_close_matches(spec, list(BUILTIN_REWARDS), n=1)
            guess = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"Unknown reward {spec!r}.{guess} {hint}")
        try:
            func = import_dotted(spec)
        except (ImportError, AttributeError) as error:
            raise ValueError(f"Cannot import reward {spec!r} ({error}). {hint}") from error
        if not callable(func):
            raise ValueError(f"Reward {spec!r} resolved to a non-callable {type(func).__name__}. {hint}")
        funcs.append(func)
    return funcs

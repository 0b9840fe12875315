"""TRL's `environment_factory`: one environment instance per episode, whose public methods are the episode's tools.

As in TRL's `GRPOTrainer`: the factory is a callable returning an environment, or a dict of them chosen per row by an
`environment` column. An environment defines `reset(**row)`, which returns `None` or text appended to the prompt's
last user message; every public method but `reset` and `get_reward` is a tool (its name, type hints and docstring its
schema); an optional `get_reward()` scores the finished episode from the environment's state and is an extra reward
source (weight 1, logged under the class's name), called on the environments of the batch it owns. Instances are
reused across batches ("construct once, reset often"), more made only when a batch needs more at once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

RESERVED = ("reset", "get_reward")


def _public_methods(instance: Any) -> list[str]:
    """The names of the instance's tools: public functions of its class (not properties), but `reset`/`get_reward`."""
    return [
        name
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if not name.startswith("_") and name not in RESERVED
    ]


class Environments:
    """The environments of a run: their factories, a pool of instances per name, their tools and reward sources."""

    def __init__(self, factory: Callable[[], Any] | dict[str, Callable[[], Any]], standalone_tools: list[Callable]):
        self.multi = isinstance(factory, dict)
        self.factories = dict(factory) if self.multi else {None: factory}
        if not self.factories or not all(callable(f) for f in self.factories.values()):
            raise TypeError("`environment_factory` must be a callable returning an environment, or a dict of them.")
        self.standalone = list(standalone_tools)
        self.pool: dict[Any, list[Any]] = {}
        self.reward_classes: list[type] = []
        for name, make in self.factories.items():
            instance = make()
            where = "environment_factory" + (f"[{name!r}]" if self.multi else "")
            if not callable(getattr(instance, "reset", None)):
                raise ValueError(f"The environment made by `{where}` must define a callable `reset(**row)`.")
            tool_names = [getattr(t, "__name__", "") for t in self.standalone] + _public_methods(instance)
            if len(set(tool_names)) != len(tool_names):
                raise ValueError(f"`{where}`: its methods and `tools` share a name ({sorted(tool_names)}).")
            if callable(getattr(instance, "get_reward", None)) and type(instance) not in self.reward_classes:
                self.reward_classes.append(type(instance))
            self.pool[name] = [instance]

    def all_tools(self) -> list[Callable]:
        """Every tool any episode may show (the standalone ones, then each environment's, bound to its probe)."""
        tools = list(self.standalone)
        for instances in self.pool.values():
            tools += [getattr(instances[0], name) for name in _public_methods(instances[0])]
        return tools

    def tools_of(self, instance: Any) -> list[Callable]:
        """An episode's tools: the standalone ones and its environment's methods, bound to it."""
        return self.standalone + [getattr(instance, name) for name in _public_methods(instance)]

    def reward_functions(self) -> list[Callable]:
        """One reward function per environment class with `get_reward` (TRL's extra reward sources): it scores the
        episodes of its class (`None` for the others), named after the class."""
        functions = []
        for cls in self.reward_classes:
            if inspect.iscoroutinefunction(cls.get_reward):

                async def reward(environments, _cls=cls, **kwargs):
                    return [await e.get_reward() if type(e) is _cls else None for e in environments]

            else:

                def reward(environments, _cls=cls, **kwargs):
                    return [e.get_reward() if type(e) is _cls else None for e in environments]

            reward.__name__ = cls.__name__
            functions.append(reward)
        return functions

    def name_of(self, row: dict[str, Any]) -> Any:
        """The key of `row`'s factory (its `environment` column with a dict of factories, else `None`)."""
        return row.get("environment") if self.multi else None

    def adopt(self, instance: Any, row: dict[str, Any]) -> None:
        """Put an instance made elsewhere (a checkpoint's episode in flight, unpickled) in the pool of `row`'s
        factory, to be reused once its episode is over."""
        pool = self.pool.setdefault(self.name_of(row), [])
        if not any(held is instance for held in pool):
            pool.append(instance)

    def start(self, rows: list[dict[str, Any]], in_use: list[Any] = ()) -> tuple[list[Any], list[Any]]:
        """An environment for each row (from the pool, less the instances `in_use`: those of episodes still in flight
        under a generation window), reset with the row: `(instances, prompts)`, each prompt with the text `reset`
        returned appended to its last message (the row itself untouched)."""
        held = {id(instance) for instance in in_use}
        free: dict[Any, list[Any]] = {}
        taken: dict[Any, int] = {}
        instances, prompts = [], []
        for index, row in enumerate(rows):
            name = self.name_of(row)
            if name not in self.factories:
                raise ValueError(
                    f"Row {index} has environment={name!r}, which is not a key of `environment_factory` "
                    f"({sorted(map(str, self.factories))}); a dict of factories picks each row's by its `environment`."
                )
            if name not in free:
                free[name] = [instance for instance in self.pool[name] if id(instance) not in held]
            available = free[name]
            if taken.get(name, 0) == len(available):
                available.append(self.factories[name]())
                self.pool[name].append(available[-1])
            instance = available[taken.get(name, 0)]
            taken[name] = taken.get(name, 0) + 1
            kwargs = {k: v for k, v in row.items() if not (self.multi and k == "environment")}
            try:
                observation = instance.reset(**kwargs)
            except Exception as err:
                raise RuntimeError(
                    f"The environment {type(instance).__name__} failed to reset for row {index} "
                    f"(prompt {str(row.get('prompt'))[:120]!r}): {type(err).__name__}: {err}"
                ) from err
            prompt = row["prompt"]
            if observation is not None:
                last = prompt[-1]
                prompt = prompt[:-1] + [{**last, "content": f"{last.get('content') or ''}{observation}"}]
            instances.append(instance)
            prompts.append(prompt)
        return instances, prompts

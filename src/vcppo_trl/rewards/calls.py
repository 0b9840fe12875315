"""Calling reward functions so that a faulty verifier costs a few samples, not the run.

A reward function is first called on the whole batch, under a wall-clock timeout. When that call raises or hangs past
the timeout, it is called again once per sample (all samples concurrently, under one shared deadline) so that only the
samples it really fails on are lost. A batch call that returns the wrong number of values is a bug in the function, not
a fault of some samples: [`RewardFunctionError`] stops the run at the first batch. A sample fails when its call raises or
times out, or when the value is not a finite number; it then gets `failure_value` and is counted. `None` keeps its
meaning in TRL's protocol: the function does not apply to that sample, which is skipped. When every sample of the batch
fails, [`RewardFunctionError`] stops the run rather than training on made-up rewards.

Timeouts use daemon threads (except for functions with a true `has_own_timeout` attribute, called inline), so they work off the main thread and inside worker processes (unlike `signal.alarm`).
An `async def` function (TRL accepts them) is awaited on the trainer's background event loop
([`~rewards.async_calls.run_awaitables`]) under the same timeout (the coroutine is cancelled when it passes), its
per-sample retry at most `max_concurrency` calls at a time; this works inside a running event loop (a notebook).
Python cannot kill a thread: a call that never returns keeps its thread until the process exits. Verifiers that can
spin forever in CPU-bound code should isolate themselves in a process, as [`~rewards.math_verify.math_verify_reward`] does.
"""

from __future__ import annotations

import inspect
import math
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transformers.utils import logging

from .async_calls import run_awaitables
from .reward_models import reward_func_name

logger = logging.get_logger(__name__)


class RewardFunctionError(RuntimeError):
    """A reward function failed on every sample of a batch, or returned the wrong number of values."""


@dataclass
class RewardCallResult:
    """Values of one reward function for a batch: `None` where skipped, `failure_value` where `failed`."""

    values: list[float | None]
    failures: int = 0
    errors: list[str] = field(default_factory=list)
    failed: list[bool] = field(default_factory=list)


class _Call:
    """One call of `fn` in a daemon thread; `outcome` is ("ok", value), ("error", text) or ("timeout", None)."""

    def __init__(self, fn: Callable[[], Any]):
        self.outcome: tuple[str, Any] = ("timeout", None)
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True, name="vcppo-reward-call")

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.outcome = ("ok", fn())
        except Exception as exc:  # any failure of user code is a failed sample, reported below
            self.outcome = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}")


def run_in_threads(fns: list[Callable[[], Any]], timeout: float | None) -> list[tuple[str, Any]]:
    """Run the calls concurrently; those not finished `timeout` seconds after the start count as timed out."""
    if timeout is None:
        outcomes = []
        for fn in fns:
            call = _Call(fn)
            call._run(fn)
            outcomes.append(call.outcome)
        return outcomes
    calls = [_Call(fn) for fn in fns]
    for call in calls:
        call.thread.start()
    deadline = time.monotonic() + timeout
    for call in calls:
        call.thread.join(max(0.0, deadline - time.monotonic()))
    hung = sum(call.thread.is_alive() for call in calls)
    if hung:
        logger.warning(f"{hung} reward-function call(s) still running after {timeout} s; they are abandoned.")
    return [call.outcome if not call.thread.is_alive() else ("timeout", None) for call in calls]


def _as_reward(value: Any) -> tuple[str, float | None]:
    """("ok", float), ("skip", None) for `None`, or ("bad", None) for anything that is not a finite number."""
    if value is None:
        return "skip", None
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        return "bad", None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "bad", None
    return ("ok", value) if math.isfinite(value) else ("bad", None)


def is_async_callable(func: Any) -> bool:
    """An `async def` function, or an object whose `__call__` is one."""
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)


def call_reward_function(
    func: Callable,
    prompts: list[Any],
    completions: list[Any],
    completion_ids: list[list[int]],
    extra_columns: dict[str, list[Any]],
    timeout: float | None = None,
    failure_value: float = -1.0,
    max_concurrency: int = 32,
    **kwargs,
) -> RewardCallResult:
    """
    Call a reward function with TRL's protocol (`f(prompts, completions, completion_ids, **columns, **kwargs)`),
    isolating the samples it fails on.

    Args:
        timeout: Seconds for the batch call, and again for the per-sample retry; `None` waits forever.
        failure_value: Reward of a sample the function failed on (raised, timed out, NaN/inf/non-numeric value).
        max_concurrency: Most per-sample calls of an async function awaited at once (`reward_max_concurrency`).

    Raises:
        [`RewardFunctionError`]: when the function failed on every sample of a non-empty batch, or its batch call
            returned a number of values other than the number of completions.
    """
    name = reward_func_name(func)
    n = len(completions)
    if n == 0:
        return RewardCallResult([])
    if getattr(func, "has_own_timeout", False):
        timeout = None  # it bounds each sample itself (math_verify_reward does, in a worker process); call it inline

    def batch_call():
        return func(prompts=prompts, completions=completions, completion_ids=completion_ids, **extra_columns, **kwargs)

    is_async = is_async_callable(func)
    if is_async:
        status, result = run_awaitables([batch_call], timeout, max_concurrency)[0]
    else:
        status, result = run_in_threads([batch_call], timeout)[0]
    if status == "ok" and inspect.isawaitable(result):  # a plain callable that returned a coroutine
        is_async, awaitable = True, result
        status, result = run_awaitables([lambda: awaitable], timeout, max_concurrency)[0]
    if status == "ok":
        try:
            result = list(result)
        except TypeError:
            status, result = "error", f"TypeError: returned {type(result).__name__}, not a list"
    if status == "ok" and len(result) == n:
        return _checked(name, _collect([("ok", v) for v in result], failure_value), "")
    if status == "ok":
        # A bug in the function, not a verifier fault on some samples: retrying per sample would hide it on every batch.
        raise RewardFunctionError(
            f"Reward function {name!r} returned {len(result)} values for {n} completions: it must return exactly one "
            "value per completion, in order (a float, or None to skip that sample). Check that it iterates over "
            "`completions` (not over `prompts` or a fixed-length list) and does not drop or add items."
        )
    if status == "timeout":
        batch_problem = f"did not return within reward_timeout={timeout} s"
    else:
        batch_problem = f"raised {result.splitlines()[0]}"
    logger.warning(f"Reward function {name!r} {batch_problem}; scoring the {n} samples one by one.")

    def sample_call(i: int):
        def one_sample():
            return func(
                prompts=[prompts[i]],
                completions=[completions[i]],
                completion_ids=[completion_ids[i]],
                **{k: [v[i]] for k, v in extra_columns.items()},
                **kwargs,
            )

        def call():
            return _the_one_value(one_sample())

        async def call_async():
            out = one_sample()
            return _the_one_value(await out if inspect.isawaitable(out) else out)

        return call_async if is_async else call

    calls = [sample_call(i) for i in range(n)]
    outcomes = run_awaitables(calls, timeout, max_concurrency) if is_async else run_in_threads(calls, timeout)
    return _checked(name, _collect(outcomes, failure_value), f" (the batch call {batch_problem})")


def _the_one_value(out: Any) -> Any:
    out = list(out)
    if len(out) != 1:
        raise ValueError(f"returned {len(out)} values for 1 completion")
    return out[0]


def _checked(name: str, result: RewardCallResult, context: str) -> RewardCallResult:
    """Stop when the function failed on every sample: there is nothing to learn from made-up rewards."""
    n = len(result.values)
    if result.failures == n:
        raise RewardFunctionError(
            f"Reward function {name!r} failed on all {n} samples of this batch{context}; stopping rather than "
            f"training on made-up rewards. Fix the function (or its inputs). First failure: {result.errors[0]}"
        )
    if result.failures:
        logger.warning(
            f"Reward function {name!r} failed on {result.failures}/{n} sample(s), given the failure reward: "
            f"{result.errors[0]}"
        )
    return result


def _collect(outcomes: list[tuple[str, Any]], failure_value: float) -> RewardCallResult:
    values: list[float | None] = []
    failed: list[bool] = []
    errors: list[str] = []
    for status, payload in outcomes:
        if status == "ok":
            kind, value = _as_reward(payload)
            if kind in ("ok", "skip"):
                values.append(value)
                failed.append(False)
                continue
            errors.append(f"returned {payload!r}, not a finite number")
        else:
            errors.append("timed out" if status == "timeout" else payload)
        values.append(failure_value)
        failed.append(True)
    return RewardCallResult(values, sum(failed), errors, failed=failed)

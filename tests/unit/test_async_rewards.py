"""Async reward functions (issue 48): TRL's semantics (`async def`, awaited per batch, `None` skips a sample) within
this package's bounds (the timeout, the failure value, the per-sample retry, a cap on concurrent calls), also from
inside a running event loop (a notebook)."""

from __future__ import annotations

import asyncio
import functools
import threading
import time

import pytest

from vcppo_trl.rewards import async_calls
from vcppo_trl.rewards.async_calls import run_awaitables, run_coroutine
from vcppo_trl.rewards.calls import RewardFunctionError, call_reward_function

COMPLETIONS = ["a", "bb", "ccc", "dddd"]


def _call(func, **kwargs):
    return call_reward_function(
        func,
        prompts=["p"] * len(COMPLETIONS),
        completions=COMPLETIONS,
        completion_ids=[[1]] * len(COMPLETIONS),
        extra_columns={"solution": ["x"] * len(COMPLETIONS)},
        **kwargs,
    )


def sync_length(completions, **kwargs):
    return [float(len(c)) for c in completions]


async def async_length(completions, **kwargs):
    await asyncio.sleep(0.01)
    return [float(len(c)) for c in completions]


def test_an_async_function_scores_as_its_sync_twin_and_none_skips():
    assert _call(async_length).values == _call(sync_length).values == [1.0, 2.0, 3.0, 4.0]

    async def skips_long(completions, **kwargs):
        return [None if len(c) > 2 else 1.0 for c in completions]

    result = _call(skips_long)
    assert result.values == [1.0, 1.0, None, None] and result.failures == 0


def test_async_callables_of_every_kind_are_awaited():
    class Scorer:
        async def __call__(self, completions, **kwargs):
            return [2.0] * len(completions)

    def returns_a_coroutine(completions, **kwargs):  # a plain function handing back an awaitable
        return async_length(completions)

    assert _call(Scorer()).values == [2.0] * 4
    assert _call(functools.partial(async_length)).values == [1.0, 2.0, 3.0, 4.0]
    assert _call(returns_a_coroutine).values == [1.0, 2.0, 3.0, 4.0]


def test_a_hanging_coroutine_is_cancelled_at_the_timeout_and_given_the_failure_value():
    cancelled = []

    async def hangs_on_the_long_ones(completions, **kwargs):
        if any(len(c) > 3 for c in completions):
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
        return [1.0] * len(completions)

    result = _call(hangs_on_the_long_ones, timeout=0.5, failure_value=-5.0)
    assert result.values == [1.0, 1.0, 1.0, -5.0] and result.failed == [False, False, False, True]
    assert result.failures == 1 and "timed out" in result.errors[0]
    assert len(cancelled) == 2  # the batch call, then the long sample's own call


def test_a_raising_batch_falls_back_to_per_sample_calls_and_only_the_bad_samples_fail():
    async def fails_on_c(completions, **kwargs):
        if any("c" in c for c in completions):
            raise RuntimeError("cannot parse")
        return [1.0] * len(completions)

    result = _call(fails_on_c, failure_value=-1.0)
    assert result.values == [1.0, 1.0, -1.0, 1.0] and "RuntimeError: cannot parse" in result.errors[0]

    async def always_fails(completions, **kwargs):
        raise RuntimeError("down")

    with pytest.raises(RewardFunctionError, match="failed on all 4 samples"):
        _call(always_fails)


def test_per_sample_calls_respect_the_concurrency_cap():
    running, peak = 0, 0

    async def counted(completions, **kwargs):
        nonlocal running, peak
        if len(completions) > 1:
            raise RuntimeError("batch refused: score one by one")
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        return [1.0]

    assert _call(counted, max_concurrency=2).values == [1.0] * 4 and peak == 2
    peak = 0
    _call(counted, max_concurrency=8)
    assert peak == 4  # all at once when the cap allows


def test_it_works_from_inside_a_running_event_loop():
    """As in a notebook: the trainer is called from code whose thread already runs an event loop."""

    async def notebook_cell():
        assert asyncio.get_running_loop().is_running()
        return _call(async_length).values

    assert asyncio.run(notebook_cell()) == [1.0, 2.0, 3.0, 4.0]


def test_sync_functions_still_run_in_threads_and_mixed_lists_work():
    seen_threads = []

    def sync_in_thread(completions, **kwargs):
        seen_threads.append(threading.current_thread().name)
        return [0.5] * len(completions)

    assert _call(sync_in_thread, timeout=5.0).values == [0.5] * 4 and seen_threads == ["vcppo-reward-call"]
    assert [_call(f).values for f in (sync_length, async_length)] == [[1.0, 2.0, 3.0, 4.0]] * 2


def test_run_awaitables_reports_each_outcome_and_refuses_a_cap_below_one():
    async def ok():
        return 3

    async def boom():
        raise ValueError("bad")

    async def slow():
        await asyncio.sleep(10)

    outcomes = run_awaitables([ok, boom, slow], timeout=0.2)
    assert outcomes[0] == ("ok", 3) and outcomes[1][0] == "error" and "ValueError: bad" in outcomes[1][1]
    assert outcomes[2] == ("timeout", None)
    with pytest.raises(ValueError, match="max_concurrency must be at least 1"):
        run_awaitables([ok], timeout=None, max_concurrency=0)


def test_a_coroutine_that_blocks_the_loop_is_abandoned_and_a_fresh_loop_serves_the_next_calls(monkeypatch):
    """Blocking code inside `async def` cannot be cancelled: the caller stops waiting and the next call gets a new loop."""
    monkeypatch.setattr(async_calls, "GRACE_SECONDS", 0.1)

    async def blocks_on_the_batch(completions, **kwargs):
        if len(completions) > 1:
            time.sleep(3.0)  # a synchronous call inside async def: the loop cannot run anything else meanwhile
        return [float(len(c)) for c in completions]

    started = time.monotonic()
    result = _call(blocks_on_the_batch, timeout=0.3)
    assert result.values == [1.0, 2.0, 3.0, 4.0] and result.failures == 0  # the per-sample retry ran on a new loop
    assert time.monotonic() - started < 2.5

    async def ignores_its_cancellation():
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await asyncio.sleep(3.0)  # does not let go when cancelled
        return 1

    async def ok():
        return 2

    started = time.monotonic()
    assert run_awaitables([ignores_its_cancellation, ok], timeout=0.2) == [("timeout", None), ("ok", 2)]
    assert time.monotonic() - started < 2.0


def test_run_coroutine_returns_raises_and_cancels_at_the_timeout_also_inside_a_running_loop():
    cancelled = threading.Event()

    async def value(x):
        await asyncio.sleep(0)
        return x

    async def raises():
        raise KeyError("missing")

    async def times_out_itself():
        raise TimeoutError("its own")

    async def hangs():
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    assert run_coroutine(value(7)) == 7
    with pytest.raises(KeyError, match="missing"):
        run_coroutine(raises(), timeout=5.0)
    with pytest.raises(TimeoutError, match="its own"):
        run_coroutine(times_out_itself(), timeout=5.0)
    with pytest.raises(TimeoutError, match="did not finish within 0.2 s"):
        run_coroutine(hangs(), timeout=0.2)
    assert cancelled.wait(2.0)

    async def notebook_cell():
        return run_coroutine(value("from a running loop"), timeout=5.0)

    assert asyncio.run(notebook_cell()) == "from a running loop"


def test_waiting_on_the_loop_from_its_own_coroutines_is_refused_not_a_deadlock():
    async def nested():
        return run_coroutine(asyncio.sleep(0), timeout=1.0)

    with pytest.raises(RuntimeError, match="would wait on itself"):
        run_coroutine(nested(), timeout=5.0)
    assert run_awaitables([nested], timeout=5.0)[0][0] == "error"

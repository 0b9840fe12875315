"""Running coroutines (async reward functions, and later async tools) from the trainer's synchronous code.

The coroutines run on one private event loop per process, in a daemon thread started at first use, and the caller
waits on the result. So they also run when the caller's own thread has a running event loop (a Jupyter notebook's),
where `asyncio.run` would refuse. A call is bounded by a timeout (the coroutine is cancelled when it passes) and calls
run at most `max_concurrency` at a time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

_LOOP: asyncio.AbstractEventLoop | None = None
_LOCK = threading.Lock()


def background_loop() -> asyncio.AbstractEventLoop:
    """This process's event loop for the trainer's coroutines, running in a daemon thread (started on first use)."""
    global _LOOP
    with _LOCK:
        if _LOOP is None or _LOOP.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, daemon=True, name="vcppo-async-calls").start()
            _LOOP = loop
        return _LOOP


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}\n{''.join(traceback.format_exception(exc, limit=4))}"


async def _bounded(
    make: Callable[[], Awaitable[Any]], semaphore: asyncio.Semaphore, deadline: float | None
) -> tuple[str, Any]:
    loop = asyncio.get_running_loop()
    async with semaphore:
        remaining = None if deadline is None else max(0.0, deadline - loop.time())
        try:
            return "ok", await asyncio.wait_for(make(), remaining)
        except asyncio.TimeoutError:
            return "timeout", None
        except Exception as exc:  # any failure of user code is a failed sample, reported by the caller
            return "error", _error_text(exc)


async def _all(makers: list[Callable[[], Awaitable[Any]]], timeout: float | None, max_concurrency: int):
    semaphore = asyncio.Semaphore(max_concurrency)
    deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
    tasks = [asyncio.ensure_future(_bounded(make, semaphore, deadline)) for make in makers]  # all scheduled now
    return [await task for task in tasks]


def run_awaitables(
    makers: list[Callable[[], Awaitable[Any]]], timeout: float | None, max_concurrency: int = 32
) -> list[tuple[str, Any]]:
    """
    Await `make()` for each of `makers` on the background loop, at most `max_concurrency` at a time, under one shared
    deadline `timeout` seconds from now (`None`: none), and return each outcome: `("ok", value)`, `("error", text)`
    or `("timeout", None)` (cancelled). A maker is called on the loop, so the coroutine is created where it runs.
    """
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}.")
    future = asyncio.run_coroutine_threadsafe(_all(makers, timeout, max_concurrency), background_loop())
    try:
        return future.result()
    except concurrent.futures.CancelledError:  # the loop was stopped under it (interpreter shutdown)
        return [("error", "CancelledError: the trainer's event loop stopped")] * len(makers)

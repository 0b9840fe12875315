"""Running coroutines (async reward functions, and later async tools) from the trainer's synchronous code.

The coroutines run on one private event loop per process, in a daemon thread started at first use, and the caller
waits on the result. So they also run when the caller's own thread has a running event loop (a Jupyter notebook's),
where `asyncio.run` would refuse. A call is bounded by a timeout (the coroutine is cancelled when it passes) and calls
run at most `max_concurrency` at a time.

The caller also waits with the timeout (plus [`GRACE_SECONDS`]), so a coroutine that cannot be cancelled does not hang
the trainer: one that blocks the loop (blocking code inside `async def`, e.g. `time.sleep` or a synchronous HTTP call)
or that swallows its cancellation counts as timed out, and when the loop is still busy the next call gets a fresh loop
(the old thread, like a hung synchronous call's, is left until its code returns).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from transformers.utils import logging

logger = logging.get_logger(__name__)

GRACE_SECONDS = 2.0
"""How long past the timeout the caller waits for the loop to report before it gives up on the calls."""

_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_THREAD: threading.Thread | None = None
_LOCK = threading.Lock()


def background_loop() -> asyncio.AbstractEventLoop:
    """This process's event loop for the trainer's coroutines, running in a daemon thread (started on first use)."""
    global _LOOP, _LOOP_THREAD
    with _LOCK:
        if _LOOP is None or _LOOP.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=_serve, args=(loop,), daemon=True, name="vcppo-async-calls")
            thread.start()
            _LOOP, _LOOP_THREAD = loop, thread
        return _LOOP


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    try:
        loop.run_forever()
    finally:
        loop.close()


def _abandon(loop: asyncio.AbstractEventLoop) -> None:
    """A coroutine blocks the loop: later calls get a new loop; this one lets its tasks end, then stops, when free."""
    global _LOOP, _LOOP_THREAD
    with _LOCK:
        if _LOOP is loop:
            _LOOP, _LOOP_THREAD = None, None

    async def drain_and_stop():
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        asyncio.get_running_loop().stop()

    asyncio.run_coroutine_threadsafe(drain_and_stop(), loop)


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}\n{''.join(traceback.format_exception(exc, limit=4))}"


class _Expired(Exception):
    """The call passed its deadline (told apart from a `TimeoutError` that the awaited code raises itself)."""


async def _within(awaitable: Awaitable[Any], timeout: float | None) -> Any:
    """Await it for at most `timeout` seconds; past that, cancel it, wait for it to stop, and raise `_Expired`."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:  # the whole call was cancelled (the caller stopped waiting)
        task.cancel()
        raise
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.wait({task})
    raise _Expired


async def _bounded(
    make: Callable[[], Awaitable[Any]], semaphore: asyncio.Semaphore, deadline: float | None
) -> tuple[str, Any]:
    loop = asyncio.get_running_loop()
    async with semaphore:
        remaining = None if deadline is None else max(0.0, deadline - loop.time())
        try:
            return "ok", await _within(make(), remaining)
        except _Expired:
            return "timeout", None
        except Exception as exc:  # any failure of user code is a failed sample, reported by the caller
            return "error", _error_text(exc)


async def _all(
    makers: list[Callable[[], Awaitable[Any]]],
    timeout: float | None,
    max_concurrency: int,
    outcomes: list[tuple[str, Any]],
) -> None:
    """Fill `outcomes[i]` as call `i` ends (the caller reads those that ended if it stops waiting)."""
    semaphore = asyncio.Semaphore(max_concurrency)
    deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout

    async def one(i: int, make: Callable[[], Awaitable[Any]]) -> None:
        outcomes[i] = await _bounded(make, semaphore, deadline)

    tasks = [asyncio.ensure_future(one(i, make)) for i, make in enumerate(makers)]  # all scheduled now
    try:
        await asyncio.wait(tasks)
    except asyncio.CancelledError:  # the caller stopped waiting: cancel every call still running
        for task in tasks:
            task.cancel()
        raise


def run_awaitables(
    makers: list[Callable[[], Awaitable[Any]]], timeout: float | None, max_concurrency: int = 32
) -> list[tuple[str, Any]]:
    """
    Await `make()` for each of `makers` on the background loop, at most `max_concurrency` at a time, under one shared
    deadline `timeout` seconds from now (`None`: none), and return each outcome: `("ok", value)`, `("error", text)`
    or `("timeout", None)` (cancelled). A maker is called on the loop, so the coroutine is created where it runs.

    Raises:
        `RuntimeError`: when called from a coroutine running on the background loop itself (it would wait on itself).
    """
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}.")
    if not makers:
        return []
    _refuse_on_the_loop()
    outcomes: list[tuple[str, Any]] = [("timeout", None)] * len(makers)
    try:
        _submit_and_wait(_all(makers, timeout, max_concurrency, outcomes=outcomes), timeout)
    except _Expired:
        pass  # the calls that ended have their outcome; the others stay timed out
    except concurrent.futures.CancelledError:  # the loop was stopped under it (interpreter shutdown)
        return [("error", "CancelledError: the trainer's event loop stopped")] * len(makers)
    return list(outcomes)


def run_coroutine(coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
    """
    Run one coroutine on the background loop (also from a thread whose event loop is running) and return its value.

    Raises:
        `TimeoutError`: when it did not finish within `timeout` seconds (it is cancelled). Whatever it raised otherwise.
    """
    try:
        _refuse_on_the_loop()
    except RuntimeError:
        coro.close()
        raise

    async def bounded():
        try:
            return await _within(coro, timeout)
        except _Expired:
            raise TimeoutError(f"the coroutine did not finish within {timeout} s") from None

    try:
        return _submit_and_wait(bounded(), timeout)
    except _Expired:
        raise TimeoutError(f"the coroutine did not finish within {timeout} s") from None


def _refuse_on_the_loop() -> None:
    if threading.current_thread() is _LOOP_THREAD:
        raise RuntimeError(
            "A coroutine on the trainer's event loop asked that loop to run coroutines and wait for them, which would "
            "wait on itself; await them there instead."
        )


def _submit_and_wait(coro: Coroutine[Any, Any, Any], timeout: float | None) -> Any:
    """
    Run `coro` on the background loop and wait for it, at most `timeout` + [`GRACE_SECONDS`]; past that, cancel it,
    replace the loop if a coroutine blocks it, and raise `_Expired`.
    """
    loop = background_loop()
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    concurrent.futures.wait([future], None if timeout is None else timeout + GRACE_SECONDS)
    if future.done():
        return future.result()  # its value, or what it raised (a TimeoutError of its own included)
    future.cancel()  # cancels what still runs, as soon as the loop gets control back
    if _responds(loop):
        logger.warning(f"A coroutine ignored its cancellation at the timeout ({timeout} s); it is abandoned.")
    else:
        logger.warning(
            f"A coroutine blocks the trainer's event loop past the timeout ({timeout} s): blocking code inside "
            "`async def` (time.sleep, a synchronous request)? It is abandoned and a new loop is used."
        )
        _abandon(loop)
    raise _Expired


def _responds(loop: asyncio.AbstractEventLoop, within: float = 0.2) -> bool:
    """Whether the loop runs a callback within `within` seconds (no coroutine blocks it)."""
    answered = threading.Event()
    loop.call_soon_threadsafe(answered.set)
    return answered.wait(within)

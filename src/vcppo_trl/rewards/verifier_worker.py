"""A worker process that runs one function call at a time under a wall-clock timeout, and is killed when it overruns.

math-verify guards its parsing/comparison with `signal.alarm`, which only works in the main thread. Off the main
thread (e.g. in a thread pool of the trainer), [`~rewards.math_verify.MathVerifyReward`] runs each sample in this worker instead,
so that a pathological expression can never hang training.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from math_verify.errors import TimeoutException

logger = logging.getLogger(__name__)

WORKER_STARTUP_TIMEOUT_SECONDS: float = 120.0
"""How long to wait for the verifier worker process to start (imports included) before giving up."""


class WorkerTimeout(Exception):
    """The worker did not answer within the allotted time and was killed."""


class WorkerError(RuntimeError):
    """The request failed in the worker (an exception, or the worker died while running it)."""


class WorkerStartError(RuntimeError):
    """The worker process could not be started."""


# Run by `python -c` in the worker: it takes the parent's `sys.path` (so that functions pickled by reference resolve to
# the same modules), then serves requests. Unlike multiprocessing's spawn/forkserver, this never re-imports the
# parent's `__main__` script, so training scripts need no `if __name__ == "__main__":` guard.
_WORKER_BOOTSTRAP = (
    "import importlib, sys\n"
    "from multiprocessing.connection import Connection\n"
    "conn = Connection(int(sys.argv[1]))\n"
    "sys.path[:] = conn.recv()\n"
    "importlib.import_module(sys.argv[2])._serve(conn)\n"
)


def _serve(conn: Any) -> None:
    """Worker loop: replies `(ok, result)` to each `(fn, args)` request; returns when the parent goes away."""
    conn.send("ready")
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = (True, fn(*args))
        except (Exception, TimeoutException) as error:  # TimeoutException is a BaseException
            reply = (False, f"{type(error).__name__}: {error}")
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return


class VerifierWorker:
    """
    A single lazily started worker process that runs functions under a wall-clock timeout.

    The worker is a fresh interpreter (`sys.executable`) in its own session (so that Ctrl-C goes to the parent only),
    connected by a socket pair; it exits when the parent closes the connection. Requests are serialised with a lock,
    so a timeout measures only the request's own run time. On a timeout or a crash the process is killed, and the next
    request starts a fresh one.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._conn: Connection | None = None

    def _start(self) -> None:
        parent_sock, child_sock = socket.socketpair()
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", _WORKER_BOOTSTRAP, str(child_sock.fileno()), __name__],
                pass_fds=(child_sock.fileno(),),
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as error:
            parent_sock.close()
            raise WorkerStartError(f"Cannot start the math-verify worker process: {error}") from error
        finally:
            child_sock.close()
        self._process, self._conn = process, Connection(parent_sock.detach())
        try:
            self._conn.send(list(sys.path))
            ready = self._conn.poll(WORKER_STARTUP_TIMEOUT_SECONDS) and self._conn.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            self._kill()
            raise WorkerStartError(
                f"The math-verify worker process did not start within {WORKER_STARTUP_TIMEOUT_SECONDS} s "
                f"(it must be able to import {__name__!r}; see its stderr above)."
            )

    def _kill(self) -> None:
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if conn is not None:
            conn.close()
        if process is not None:
            if process.poll() is None:
                process.kill()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                logger.warning("math-verify worker process %s did not exit after SIGKILL.", process.pid)

    def run(self, fn: Callable[..., Any], args: tuple, timeout: float) -> Any:
        """
        Runs `fn(*args)` in the worker process.

        Args:
            fn (`Callable`):
                Function importable by the worker (module-level, pickled by reference).
            args (`tuple`):
                Picklable positional arguments.
            timeout (`float`):
                Wall-clock limit in seconds, not counting the start of a new worker.

        Returns:
            The result of `fn(*args)`.

        Raises:
            `WorkerTimeout`: if the call took longer than `timeout` (the worker is killed).
            `WorkerError`: if the call raised in the worker, or the worker died while running it.
            `WorkerStartError`: if no worker could be started.
        """
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._kill()
                self._start()
            conn = self._conn
            try:
                conn.send((fn, args))
                if not conn.poll(timeout):
                    self._kill()
                    raise WorkerTimeout(f"no answer within {timeout} s")
                ok, value = conn.recv()
            except (EOFError, OSError) as error:
                self._kill()
                raise WorkerError(f"math-verify worker process died: {error!r}") from error
        if not ok:
            raise WorkerError(value)
        return value

    def shutdown(self) -> None:
        """Stops the worker process, if any."""
        with self._lock:
            self._kill()

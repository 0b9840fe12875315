"""Graceful stop on SIGTERM/SIGINT: finish the running update, save a checkpoint, then stop with an error.

Clusters announce preemption with SIGTERM (SLURM, Kubernetes), people with Ctrl-C (SIGINT). The handler only records
the signal; the training loop checks it between updates, so the checkpoint holds a consistent state. A second SIGINT
interrupts at once (KeyboardInterrupt). Handlers can only be installed from the main thread; elsewhere (e.g. a
training thread) the run simply keeps the process's existing handlers.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import torch
from accelerate import Accelerator
from transformers.utils import logging

logger = logging.get_logger(__name__)

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TrainingInterrupted(RuntimeError):
    """Training stopped on a signal after saving `checkpoint`; resume with `train(resume_from_checkpoint=...)`."""

    def __init__(self, message: str, signum: int, checkpoint: str | None):
        super().__init__(message)
        self.signum = signum
        self.checkpoint = checkpoint

    @property
    def exit_code(self) -> int:
        """The shell convention for a process ended by a signal: 128 + its number."""
        return 128 + self.signum


class SignalWatcher:
    """Context manager that records SIGTERM/SIGINT instead of dying, and restores the old handlers on exit."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C means "stop now"
        self.signum = signum
        logger.warning(
            f"Received {signal.Signals(signum).name}: finishing the current update, then saving a checkpoint and "
            "stopping (press Ctrl-C again to stop at once)."
        )

    def __enter__(self) -> SignalWatcher:
        if threading.current_thread() is threading.main_thread():
            for sig in HANDLED_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def agreed_signal(accelerator: Accelerator, signum: int | None) -> int | None:
    """The stop signal if any process received one (all processes must stop at the same update)."""
    if accelerator.num_processes == 1:
        return signum
    flag = torch.tensor([signum or 0], device=accelerator.device)
    agreed = int(accelerator.reduce(flag, "max"))
    return agreed or None


def interruption(signum: int, checkpoint: str, step: int) -> TrainingInterrupted:
    """The error a run stops with after saving `checkpoint` at update `step` on signal `signum`."""
    return TrainingInterrupted(
        f"Training stopped by {signal.Signals(signum).name} after update {step}; checkpoint saved to {checkpoint}. "
        f"Resume with trainer.train(resume_from_checkpoint={checkpoint!r}) (or --resume_from_checkpoint with "
        "train.py).",
        signum,
        checkpoint,
    )

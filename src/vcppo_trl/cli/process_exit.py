"""How a process of `train.py` ends once its job is done: a multi-process run leaves its process group as accelerate
prescribes ([`leave_process_group`]), then exits without the interpreter's teardown ([`exit_process`], called by
`train.py` when [`left_process_group`])."""

from __future__ import annotations

import os
import sys

from ..trainer import VCPPOTrainer


def leave_process_group(trainer: VCPPOTrainer) -> None:
    """End a multi-process run as accelerate prescribes: all ranks meet, then `accelerator.end_training()` destroys
    the process group. See [`exit_process`] for why that is not the last step."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        trainer.accelerator.wait_for_everyone()
        global _LEFT_PROCESS_GROUP
        _LEFT_PROCESS_GROUP = True
    # A colocated vLLM engine tears down its own process groups: before the default group goes, not at exit.
    if trainer.sampler is not None:  # a critic job has none
        trainer.sampler.close()
    trainer.accelerator.end_training()


_LEFT_PROCESS_GROUP = False


def left_process_group() -> bool:
    """Whether this process ended a multi-process run with [`leave_process_group`] (then see [`exit_process`])."""
    return _LEFT_PROCESS_GROUP


def exit_process(code: int = 0) -> None:
    """Exit a process of a multi-process run without the interpreter's teardown, once its work is done and saved:
    flush the output, run the `atexit` handlers (loggers, trackers), then `os._exit(code)`.

    A gloo rank sometimes aborts in teardown, after training and saving, even with the process group destroyed
    ("terminate called without an active exception", SIGABRT, from a C++ thread still alive while the interpreter
    finalizes): seen on node 1's rank in 2 of about 30 runs of the 2-node SLURM test under CPU load, once after
    `destroy_process_group`. Its launcher then fails the node, and the other node's launcher waited 300 s at torchrun's
    exit barrier for it. tests/integration/distributed/worker.py ends its ranks the same way.
    """
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)

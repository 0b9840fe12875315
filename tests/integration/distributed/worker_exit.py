"""How a 2-process test worker ends (every worker beside this file, started as a script)."""

from __future__ import annotations

import os
import sys

import torch


def exit_worker(accelerator) -> None:
    """Wait for every process, leave the process group (a rank leaving while its peer still talks aborts gloo) and
    exit at once: under DeepSpeed or gloo on CPU a rank sometimes aborts in interpreter teardown ("terminate called
    without an active exception") after all work is done, so the teardown is skipped once everything is written."""
    accelerator.wait_for_everyone()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

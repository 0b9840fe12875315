"""Sequence parallelism in the PPO epochs: the processes of a group share their rows, so that each micro-batch of any of
them can be split along the sequence across all of them.

Every process still draws its own mini-batch order (as without sequence parallelism); at each epoch the group's
processes send each other their rows in that order (one all-to-all per tensor, copies rather than moves), and the
group's `k`-th mini-batch is the union of its processes' `k`-th mini-batches. Every process of the group then holds
the same rows, plans the same micro-batches and computes the same loss, each over its own columns; the loss is
normalised by the count of the global mini-batch as before, so the gradients summed over the group, and averaged over
all processes by DDP, DeepSpeed or FSDP2, are the unsplit gradient. What the epoch computes per row comes back without
communication: every process of the group holds all of it, its own rows included.
"""

from __future__ import annotations

import torch
from accelerate import Accelerator

from ..algo.objective import PPOBatch
from ..models.group_rows import group_row_shapes
from ..models.packing import TokenBatch
from ..parallel.sequence import SequenceGroup
from .balancing import EpochRows, exchange_epoch_rows


class SequenceGroupRows:
    """
    The rows each process of a sequence-parallel group runs in an epoch: the whole group's (see the module docstring).
    Every process must call [`epoch`] the same number of times.

    Args:
        accelerator: The trainer's accelerator.
        mini_batch_size: Rows of one process per mini-batch.
        group: This process's sequence-parallel group.
    """

    def __init__(self, accelerator: Accelerator, mini_batch_size: int, group: SequenceGroup):
        self.accelerator = accelerator
        self.mini_batch_size = mini_batch_size
        self.group = group

    def epoch(self, order: torch.Tensor, *, batch: PPOBatch, tokens: TokenBatch) -> EpochRows:
        """The group's rows for the epoch whose mini-batch order (of this process's rows) is `order`: one all-gather
        of the row counts and widths, one all-to-all per tensor."""
        group, world = self.group, self.accelerator.num_processes
        device = order.device
        rows = order.numel()
        row_counts, widths = group_row_shapes(self.accelerator, group, tokens)
        if any(count != rows for count in row_counts):
            raise RuntimeError(
                f"The processes of a sequence-parallel group hold different numbers of rows ({row_counts}): "
                "every process must roll out the same number of sequences per update."
            )
        counts = [rows if process in group.processes else 0 for process in range(world)]
        shared_batch, shared_tokens = exchange_epoch_rows(
            batch, tokens, order.repeat(group.size), widths=widths, send_counts=counts, recv_counts=counts
        )
        # The group's k-th mini-batch: the k-th mini-batch of each of its processes (their rows arrive in order).
        per_process = [
            torch.arange(m * rows, (m + 1) * rows, device=device).split(self.mini_batch_size)
            for m in range(group.size)
        ]
        mini_batches = [torch.cat(parts) for parts in zip(*per_process)]
        own = slice(group.rank * rows, (group.rank + 1) * rows)
        return EpochRows(
            batch=shared_batch, tokens=shared_tokens, mini_batches=mini_batches, order=order, own_rows=own
        )

    def restore(self, rows: EpochRows, computed: torch.Tensor, into: torch.Tensor) -> None:
        """Write what the epoch computed for this process's own rows (`computed`, `[group rows, w]`) into `into`
        (`[B, w']`, cut to its width). No communication: the group computed every row alike."""
        into[rows.order] = computed[rows.own_rows][:, : into.shape[1]].to(into.dtype)

    def metrics(self) -> dict[str, float]:
        return {}

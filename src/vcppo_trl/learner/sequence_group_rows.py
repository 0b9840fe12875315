"""Sequence parallelism in the PPO epochs: the processes of a group share their rows, so that each micro-batch of any of
them can be split along the sequence across all of them.

At the update's first epoch the group's processes send each other their rows (one all-to-all per tensor, copies rather
than moves), so that every process of the group holds them all, process by process. Every process still draws its own
mini-batch order each epoch (as without sequence parallelism), and the orders travel in one small all-gather: the
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
from ..algo.rank_assignment import rank_token_imbalance
from ..models.packing import TokenBatch
from ..parallel.row_sharing import group_row_shapes
from ..parallel.sequence import SequenceGroup
from .epoch_rows import EpochRows, exchange_epoch_rows


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
        self.shared: tuple[PPOBatch, TokenBatch] | None = None  # the group's rows, shared at the first epoch
        self.loads: list[torch.Tensor] = []  # [mini-batches, groups] tokens of each epoch

    def epoch(self, order: torch.Tensor, *, batch: PPOBatch, tokens: TokenBatch) -> EpochRows:
        """The group's rows for the epoch whose mini-batch order (of this process's rows) is `order`: one all-gather
        of the orders and token counts, and at the first epoch one of the row counts and widths and one all-to-all
        per tensor. `batch` and `tokens` must be the same at every epoch of an update (one instance per update)."""
        group, world, size = self.group, self.accelerator.num_processes, self.mini_batch_size
        device = order.device
        rows = order.numel()
        if self.shared is None:
            self.shared = self.share(batch, tokens, rows)
        row_tokens = tokens.attention_mask.sum(dim=1)
        gathered = self.accelerator.gather(torch.cat([order, row_tokens]).long().to(self.accelerator.device))
        orders, counts = gathered.view(world, 2, rows).cpu().unbind(dim=1)
        # Shared rows are process-major: process `m` of the group's row `r` sits at `m * rows + r`.
        mini_batches = [
            torch.cat([m * rows + orders[p, start : start + size] for m, p in enumerate(group.processes)]).to(device)
            for start in range(0, rows, size)
        ]
        self.loads.append(group_loads(orders, counts, mini_batch_size=size, group_size=group.size))
        own = slice(group.rank * rows, (group.rank + 1) * rows)
        natural = torch.arange(rows, device=device)  # this process's rows sit in their own order among the shared
        return EpochRows(
            batch=self.shared[0], tokens=self.shared[1], mini_batches=mini_batches, order=natural, own_rows=own
        )

    def share(self, batch: PPOBatch, tokens: TokenBatch, rows: int) -> tuple[PPOBatch, TokenBatch]:
        """Every row of the group on every process of it, process-major (each process's rows in their own order)."""
        group, world = self.group, self.accelerator.num_processes
        row_counts, widths = group_row_shapes(self.accelerator, group, tokens)
        if any(count != rows for count in row_counts):
            raise RuntimeError(
                f"The processes of a sequence-parallel group hold different numbers of rows ({row_counts}): "
                "every process must roll out the same number of sequences per update."
            )
        counts = [rows if process in group.processes else 0 for process in range(world)]
        natural = torch.arange(rows, device=tokens.response_ids.device).repeat(group.size)
        return exchange_epoch_rows(batch, tokens, natural, widths=widths, send_counts=counts, recv_counts=counts)

    def restore(self, rows: EpochRows, computed: torch.Tensor, into: torch.Tensor) -> None:
        """Write what the epoch computed for this process's own rows (`computed`, `[group rows, w]`) into `into`
        (`[B, w']`, cut to its width). No communication: the group computed every row alike."""
        into[rows.order] = computed[rows.own_rows][:, : into.shape[1]].to(into.dtype)

    def metrics(self) -> dict[str, float]:
        """`perf/rank_token_imbalance` across the groups (a group runs as one: its processes wait for each other at
        every split forward): the slowest group's tokens at each optimizer step, summed, over the mean group's."""
        return {"perf/rank_token_imbalance": rank_token_imbalance(torch.cat(self.loads))} if self.loads else {}


def group_loads(orders: torch.Tensor, counts: torch.Tensor, *, mini_batch_size: int, group_size: int) -> torch.Tensor:
    """`[M, G]` tokens each group of `group_size` consecutive processes runs in each of the epoch's `M` mini-batches,
    from every process's order (`orders[p]`, `[W, B]`) and its rows' token counts (`counts[p]`, `[W, B]`)."""
    world, rows = orders.shape
    picked = counts.gather(1, orders).double()  # [W, B]: each process's rows in its mini-batch order
    per_process = picked.view(world, rows // mini_batch_size, mini_batch_size).sum(dim=2)  # [W, M]
    return per_process.view(world // group_size, group_size, -1).sum(dim=1).t()

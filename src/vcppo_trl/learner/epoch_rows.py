"""Balanced ranks (`balance_ranks`) in the PPO epochs: each epoch's mini-batches are drawn as without balancing (every
process shuffles its own rows), then each global mini-batch's sequences are handed out again so that every process
holds about the same number of tokens, the same number of rows as before ([`~algo.rank_assignment`]); the rows' tensors
(tokens, masks, values, returns, advantages, old and sampler log-probabilities) move with them in one all-to-all per
tensor, and what the epoch computes per row (old log-probabilities under the on-policy shortcut, the sampler-mismatch
weights) goes back to the process that owns the row.

The loss of a mini-batch is normalised by the count of the whole mini-batch across processes, so the optimizer step
sees the same sequences and the same loss: only the order of the sums changes. With more than one process and
balancing off, the token counts are still gathered (one small all-gather per epoch) for `perf/rank_token_imbalance`.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch
from accelerate import Accelerator

from ..algo.objective import PPOBatch
from ..algo.rank_assignment import (
    ExchangePlan,
    exchange_plan,
    mini_batch_assignments,
    pad_columns,
    process_loads,
    rank_token_imbalance,
)
from ..models.packing import TokenBatch
from ..parallel.collectives import exchange_rows
from ..parallel.row_sharing import TOKEN_FIELDS, padded_token_rows


@dataclasses.dataclass
class EpochRows:
    """The rows one process runs in one PPO epoch: its own (`plan` None) or its balanced share (`plan` set)."""

    batch: PPOBatch
    tokens: TokenBatch
    mini_batches: list[torch.Tensor]  # row indices into `batch` and `tokens`, one tensor per mini-batch
    order: torch.Tensor  # this process's mini-batch order of its own rows
    plan: ExchangePlan | None = None
    # Sequence parallelism: the rows of `batch` that are this process's own, in `order` (the group's rows are shared)
    own_rows: slice | None = None

    @property
    def moved(self) -> bool:
        """Whether the epoch runs rows other than this process's own (what it computes per row goes back after it)."""
        return self.plan is not None or self.own_rows is not None


class EpochRowSource(Protocol):
    """What hands each PPO epoch of one update its rows ([`OwnRows`], [`RankBalancer`],
    [`~learner.sequence_group_rows.SequenceGroupRows`]); one instance per update, [`epoch`] called by every process alike."""

    def epoch(self, order: torch.Tensor, *, batch: PPOBatch, tokens: TokenBatch) -> EpochRows:
        """The rows of the epoch whose mini-batch order (of this process's own rows) is `order`."""

    def restore(self, rows: EpochRows, computed: torch.Tensor, into: torch.Tensor) -> None:
        """Write what the epoch computed per row back into this process's own rows of `into` (when `rows.moved`)."""

    def metrics(self) -> dict[str, float]:
        """The update's balance metrics (`perf/rank_token_imbalance`, ...), or none."""


class OwnRows:
    """
    One process: every epoch runs this process's own rows in its mini-batch order, nothing moves.

    Args:
        mini_batch_size: Rows per mini-batch.
    """

    def __init__(self, mini_batch_size: int):
        self.mini_batch_size = mini_batch_size

    def epoch(self, order: torch.Tensor, *, batch: PPOBatch, tokens: TokenBatch) -> EpochRows:
        """The epoch's mini-batches: `order` cut into mini-batches of this process's own rows."""
        return EpochRows(batch=batch, tokens=tokens, mini_batches=list(order.split(self.mini_batch_size)), order=order)

    def restore(self, rows: EpochRows, computed: torch.Tensor, into: torch.Tensor) -> None:
        """Nothing to restore: the epoch ran this process's own rows in place."""

    def metrics(self) -> dict[str, float]:
        """No balance metrics with one process."""
        return {}


class RankBalancer:
    """
    Hands each epoch's global mini-batches out to processes by token count (`balance=True`), or only measures how
    uneven they are (`balance=False`). Every process must call [`epoch`] (and [`restore`]) the same number of times.

    Args:
        accelerator: The trainer's accelerator (more than one process).
        mini_batch_size: Rows of one process per mini-batch.
        balance: Move the rows (`balance_ranks`), or keep them and measure only.
    """

    def __init__(self, accelerator: Accelerator, mini_batch_size: int, balance: bool):
        self.accelerator = accelerator
        self.mini_batch_size = mini_batch_size
        self.balance = balance
        self.loads_before: list[torch.Tensor] = []
        self.loads_after: list[torch.Tensor] = []

    def epoch(self, order: torch.Tensor, *, batch: PPOBatch, tokens: TokenBatch) -> EpochRows:
        """This process's rows for the epoch whose mini-batch order is `order` (one all-gather of token counts, and
        with balancing one all-to-all per tensor)."""
        size = self.mini_batch_size
        world = self.accelerator.num_processes
        device = order.device
        per_row = tokens.attention_mask.sum(dim=1)[order]
        widths = torch.tensor([tokens.context_length, tokens.response_ids.shape[1]], device=per_row.device)
        gathered = self.accelerator.gather(torch.cat([per_row.long(), widths.long()]).to(self.accelerator.device))
        gathered = gathered.view(world, -1).cpu()
        counts, widest = gathered[:, :-2], gathered[:, -2:].amax(dim=0).tolist()
        own = mini_batch_assignments(counts, size, balance=False)
        self.loads_before.append(process_loads(counts, own))
        if not self.balance:
            self.loads_after.append(self.loads_before[-1])
            return EpochRows(batch=batch, tokens=tokens, mini_batches=list(order.split(size)), order=order)
        assignments = mini_batch_assignments(counts, size)
        self.loads_after.append(process_loads(counts, assignments))
        plan = exchange_plan(assignments, size, self.accelerator.process_index)
        moved_batch, balanced_tokens = exchange_epoch_rows(
            batch,
            tokens,
            order[plan.send.to(device)],
            widths=widest,
            send_counts=plan.send_counts,
            recv_counts=plan.recv_counts,
            arrange=plan.arrange.to(device),
        )
        mini_batches = list(torch.arange(order.numel(), device=device).split(size))
        return EpochRows(batch=moved_batch, tokens=balanced_tokens, mini_batches=mini_batches, order=order, plan=plan)

    def restore(self, rows: EpochRows, balanced: torch.Tensor, into: torch.Tensor) -> None:
        """Write what the epoch computed per balanced row (`balanced`, `[B, w]`) into the owners' rows of `into`
        (`[B, w']`, cut to its width): the reverse all-to-all. A no-op for an epoch that kept its own rows."""
        if rows.plan is None:
            return
        plan = rows.plan
        buffer = torch.empty_like(balanced)
        buffer[plan.arrange.to(balanced.device)] = balanced
        back = exchange_rows({"rows": buffer}, send_counts=plan.recv_counts, recv_counts=plan.send_counts)["rows"]
        owners = rows.order[plan.send.to(rows.order.device)]
        into[owners] = back[:, : into.shape[1]].to(into.dtype)

    def metrics(self) -> dict[str, float]:
        """`perf/rank_token_imbalance` of the update as it ran and, with balancing, `perf/rank_token_imbalance_before`
        (as it would have run without): see [`~algo.rank_assignment.rank_token_imbalance`]."""
        if not self.loads_after:
            return {}
        metrics = {"perf/rank_token_imbalance": rank_token_imbalance(torch.cat(self.loads_after))}
        if self.balance:
            metrics["perf/rank_token_imbalance_before"] = rank_token_imbalance(torch.cat(self.loads_before))
        return metrics


def exchange_epoch_rows(
    batch: PPOBatch,
    tokens: TokenBatch,
    rows: torch.Tensor,
    *,
    widths: list[int],
    send_counts: list[int],
    recv_counts: list[int],
    arrange: torch.Tensor | None = None,
) -> tuple[PPOBatch, TokenBatch]:
    """
    The rows `rows` of `batch` and `tokens` (grouped by destination: `send_counts[d]` to process `d`; a row may go to
    several) sent with one all-to-all per tensor ([`~parallel.collectives.exchange_rows`]), and the rows received
    (`recv_counts[q]` from process `q`, in process order, then put in `arrange` order), every tensor padded to the
    common `widths` (prompt, response) first.
    """
    response_width = widths[1]
    sources = padded_token_rows(tokens, rows, widths)
    names = [f.name for f in dataclasses.fields(PPOBatch)]
    first: dict[int, str] = {}  # a tensor the batch holds under two names (masks) moves once
    for name in names:
        tensor = getattr(batch, name)
        if tensor is None or id(tensor) in first:
            continue
        first[id(tensor)] = name
        sources[name] = pad_columns(tensor[rows], response_width)
    moved = exchange_rows(sources, send_counts=send_counts, recv_counts=recv_counts)
    arranged = moved if arrange is None else {name: tensor[arrange] for name, tensor in moved.items()}
    fields = {}
    for name in names:
        tensor = getattr(batch, name)
        fields[name] = None if tensor is None else arranged[first[id(tensor)]]
    return PPOBatch(**fields), TokenBatch(**{name: arranged[name] for name in TOKEN_FIELDS})

"""The rows of a sequence-parallel group (`sequence_parallel_size`): before a split forward, the processes of a group
send each other their rows, so that every process of the group holds them all and plans the same micro-batches.

Used by the rollout maker's no-grad forwards ([`share_group_rows`]: all rows of the group, in process order) and by the
PPO epochs (`learner.sequence_group_rows`, which also moves each row's training tensors: the row counts and widths of
[`group_row_shapes`], the padded token tensors of [`padded_token_rows`], and `learner.epoch_rows.exchange_epoch_rows`).
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import torch
from accelerate import Accelerator

from ..algo.rank_assignment import pad_columns
from .collectives import exchange_rows
from .sequence import SequenceGroup

TOKEN_FIELDS = ("query_ids", "query_mask", "response_ids", "response_mask")  # the arguments of `TokenBatch`


class TokenRows(Protocol):
    """What these functions read of a batch of tokens: [`~models.packing.TokenBatch`] (built from [`TOKEN_FIELDS`]),
    which this folder, below `models/`, does not import."""

    query_ids: torch.Tensor
    response_ids: torch.Tensor
    attention_mask: torch.Tensor
    context_length: int


Tokens = TypeVar("Tokens", bound=TokenRows)


def padded_token_rows(tokens: TokenRows, rows: torch.Tensor, widths: list[int]) -> dict[str, torch.Tensor]:
    """The rows `rows` of `tokens` as the four tensors that build a [`~models.packing.TokenBatch`] ([`TOKEN_FIELDS`]),
    padded to `widths` (prompt, response): prompts on the left, responses on the right."""
    prompt_width, response_width = widths
    prompt_mask = tokens.attention_mask[:, : tokens.context_length]
    response_mask = tokens.attention_mask[:, tokens.context_length :].bool()
    return {
        "query_ids": pad_columns(tokens.query_ids[rows], prompt_width, left=True),
        "query_mask": pad_columns(prompt_mask[rows], prompt_width, left=True),
        "response_ids": pad_columns(tokens.response_ids[rows], response_width),
        "response_mask": pad_columns(response_mask[rows], response_width),
    }


def group_row_shapes(accelerator: Accelerator, group: SequenceGroup, tokens: TokenRows) -> tuple[list[int], list[int]]:
    """The number of rows each process of the group holds (in group order), and the group's widest prompt and
    response: one all-gather (every process calls it)."""
    world = accelerator.num_processes
    shape = torch.tensor([tokens.response_ids.shape[0], tokens.context_length, tokens.response_ids.shape[1]])
    shapes = accelerator.gather(shape.to(accelerator.device)).view(world, 3).cpu()[group.processes]
    return shapes[:, 0].tolist(), shapes[:, 1:].amax(dim=0).tolist()


def share_group_rows(tokens: Tokens, accelerator: Accelerator, group: SequenceGroup) -> tuple[Tokens, slice]:
    """
    Every row of the group's processes, in process order, on every process of the group (one all-gather of the
    shapes, one all-to-all per tensor; the processes may hold different numbers of rows and widths), and where this
    process's own rows sit among them, as a batch of `tokens`' type. Every process must call it.
    """
    counts, widths = group_row_shapes(accelerator, group, tokens)
    rows = tokens.response_ids.shape[0]
    send, recv = [0] * accelerator.num_processes, [0] * accelerator.num_processes
    for process, count in zip(group.processes, counts):
        send[process], recv[process] = rows, count
    index = torch.arange(rows, device=tokens.response_ids.device).repeat(group.size)
    shared = exchange_rows(padded_token_rows(tokens, index, widths), send_counts=send, recv_counts=recv)
    start = sum(counts[: group.rank])
    return type(tokens)(**shared), slice(start, start + rows)

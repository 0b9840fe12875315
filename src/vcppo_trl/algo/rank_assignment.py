"""Balanced ranks (`balance_ranks`): which process runs which sequences of a global mini-batch, so that every process
holds about the same number of tokens for the update (the idea of verl's `balance_batch`), and the plan of the
exchange that moves the sequences there and back.

A global mini-batch is the union of every process's `L` rows of that mini-batch (each process draws its own rows, as
without balancing); it is written here in canonical order: process 0's rows in its order, then process 1's, ... so
that canonical position `j` is row `j % L` of process `j // L`'s mini-batch. Balancing hands every process `L` of the
mini-batch's rows again (DDP and DeepSpeed step in lockstep, and each process's micro-batch plan expects `L` rows), so
the optimizer step sees the same sequences: only the sum's order changes.

Pure functions of token counts: no model, no process group. Every process computes the same plan from the same
gathered counts.
"""

from __future__ import annotations

import dataclasses

import torch


def balanced_assignment(tokens: list[int], parts: int) -> list[list[int]]:
    """
    Split rows into `parts` groups of `len(tokens) / parts` rows each, with about the same token sum per group.

    Greedy, longest first: each row (by decreasing tokens; ties: the lower index first) goes to the group with the
    fewest tokens among those not yet full (ties: the lower group). Deterministic, so every process computes the same
    groups. The largest group exceeds the mean by at most the longest row (the usual bound of the greedy).

    Returns:
        The groups, each a sorted list of row indices; together they hold every row once.
    """
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}.")
    if len(tokens) % parts:
        raise ValueError(f"{len(tokens)} rows cannot be split into {parts} groups of equal size.")
    size = len(tokens) // parts
    groups: list[list[int]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for row in sorted(range(len(tokens)), key=lambda i: (-tokens[i], i)):
        group = min((g for g in range(parts) if len(groups[g]) < size), key=lambda g: (loads[g], g))
        groups[group].append(row)
        loads[group] += tokens[row]
    return [sorted(group) for group in groups]


def keep_in_place(groups: list[list[int]], owners: list[int]) -> list[list[int]]:
    """
    Hand the (interchangeable) groups to processes so that as many rows as possible stay where they are: `owners[j]`
    is the process that holds row `j`. Greedy on overlap (the largest first; ties: the lower group, then the lower
    process). Returns `groups` reordered: entry `p` is process `p`'s.
    """
    parts = len(groups)
    overlap = [[sum(owners[j] == p for j in group) for p in range(parts)] for group in groups]
    pairs = sorted(((g, p) for g in range(parts) for p in range(parts)), key=lambda gp: (-overlap[gp[0]][gp[1]], gp))
    taken: list[list[int] | None] = [None] * parts
    used_groups: set[int] = set()
    for g, p in pairs:
        if g not in used_groups and taken[p] is None:
            taken[p] = groups[g]
            used_groups.add(g)
    return [group for group in taken if group is not None]


def mini_batch_assignments(tokens: torch.Tensor, mini_batch_size: int, balance: bool = True) -> list[list[list[int]]]:
    """
    The rows each process runs in each mini-batch.

    Args:
        tokens: `[W, B]` tokens of each process's rows in that process's mini-batch order (its first `L` rows are its
            share of mini-batch 0, the next `L` of mini-batch 1, ...).
        mini_batch_size: `L`, rows of one process per mini-batch.
        balance: `False`: every process keeps its own rows (the plan of an unbalanced update). With `True` too
            where the greedy split's slowest process would not be faster than it is without moving a row.

    Returns:
        `[M][W]` lists of canonical positions (see the module docstring), each of `L` ascending positions.
    """
    world, rows = tokens.shape
    if rows % mini_batch_size:
        raise ValueError(f"{rows} rows per process do not split into mini-batches of {mini_batch_size}.")
    owners = [j // mini_batch_size for j in range(world * mini_batch_size)]
    plans = []
    for start in range(0, rows, mini_batch_size):
        if not balance:
            plans.append([list(range(p * mini_batch_size, (p + 1) * mini_batch_size)) for p in range(world)])
            continue
        counts = [int(c) for c in tokens[:, start : start + mini_batch_size].reshape(-1).tolist()]
        own = [list(range(p * mini_batch_size, (p + 1) * mini_batch_size)) for p in range(world)]
        balanced = keep_in_place(balanced_assignment(counts, world), owners)
        # Never worse than no move: the greedy can miss a split the processes already had.
        if max(sum(counts[j] for j in g) for g in balanced) >= max(sum(counts[j] for j in g) for g in own):
            balanced = own
        plans.append(balanced)
    return plans


def process_loads(tokens: torch.Tensor, assignments: list[list[list[int]]]) -> torch.Tensor:
    """`[M, W]` tokens each process runs in each mini-batch under `assignments` ([`mini_batch_assignments`])."""
    world, rows = tokens.shape
    size = rows // len(assignments)
    loads = torch.zeros(len(assignments), world, dtype=torch.float64)
    for m, plan in enumerate(assignments):
        share = tokens[:, m * size : (m + 1) * size].reshape(-1).double()
        for p, positions in enumerate(plan):
            loads[m, p] = share[positions].sum()
    return loads


def rank_token_imbalance(loads: torch.Tensor) -> float:
    """
    `perf/rank_token_imbalance` of `[M, W]` per-process loads: the slowest process's tokens at every optimizer step,
    summed over the steps, over the mean process's (1: balanced; the update's time over the ideal when time follows
    tokens). 1 for an empty update.
    """
    mean = float(loads.mean(dim=1).sum())
    return float(loads.max(dim=1).values.sum()) / mean if mean > 0 else 1.0


@dataclasses.dataclass(frozen=True)
class ExchangePlan:
    """
    One process's side of the exchange of one PPO epoch's rows (an all-to-all, rows grouped by destination).

    `send` are positions in this process's mini-batch order, grouped by destination process (0 first) and within one
    by (mini-batch, canonical position); `arrange[r]` is the row of the received buffer that becomes balanced row `r`
    (mini-batch major, each mini-batch's rows in canonical order). The way back swaps the counts: the balanced rows,
    put back in received order, return to `send`.
    """

    send: torch.Tensor  # [B] long
    send_counts: list[int]  # [W]
    recv_counts: list[int]  # [W]
    arrange: torch.Tensor  # [B] long


def exchange_plan(assignments: list[list[list[int]]], mini_batch_size: int, process: int) -> ExchangePlan:
    """This process's [`ExchangePlan`] for `assignments` ([`mini_batch_assignments`])."""
    world = len(assignments[0])
    size = mini_batch_size
    send: list[int] = []
    send_counts = []
    for destination in range(world):
        before = len(send)
        for m, plan in enumerate(assignments):
            send += [m * size + j % size for j in plan[destination] if j // size == process]
        send_counts.append(len(send) - before)
    received: dict[tuple[int, int], int] = {}  # (mini-batch, canonical position) -> row of the received buffer
    recv_counts = []
    for source in range(world):
        before = len(received)
        for m, plan in enumerate(assignments):
            for j in plan[process]:
                if j // size == source:
                    received[m, j] = len(received)
        recv_counts.append(len(received) - before)
    arrange = [received[m, j] for m, plan in enumerate(assignments) for j in plan[process]]
    return ExchangePlan(
        send=torch.tensor(send, dtype=torch.long),
        send_counts=send_counts,
        recv_counts=recv_counts,
        arrange=torch.tensor(arrange, dtype=torch.long),
    )


def pad_columns(tensor: torch.Tensor, width: int, left: bool = False) -> torch.Tensor:
    """`[B, w]` → `[B, width]` with zeros (False) added on the right, or on the `left` (left-padded prompts)."""
    missing = width - tensor.shape[1]
    if missing <= 0:
        return tensor
    pad = tensor.new_zeros(tensor.shape[0], missing, *tensor.shape[2:])
    return torch.cat([pad, tensor] if left else [tensor, pad], dim=1)

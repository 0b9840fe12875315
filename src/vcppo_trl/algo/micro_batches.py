"""Micro-batches by token budget: which sequences of a batch run together in one forward, and how wide it is.

A rollout is left-padded to its longest prompt and right-padded to its longest response. With a token budget, the
sequences are sorted by length and cut into contiguous groups (neighbours in length, so little padding) whose
padded size — count × (longest prompt + longest response of the group) — stays within the budget; the groups are
then balanced (the largest group cost is made as small as the count allows), and each group's forward keeps only
its own columns: [`MicroBatch.columns`]. A sequence longer than the budget runs alone.

Pure functions of lengths: no model, no process group. The caller takes the maximum micro-batch count over processes
(ZeRO-3 runs a collective in every forward, so all processes must run the same number) and passes it as `count`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator

import torch


@dataclasses.dataclass(frozen=True)
class MicroBatch:
    """Rows of a batch that run in one forward, and the columns they need."""

    indices: torch.Tensor  # [b] row indices into the batch
    prompt_width: int  # the longest real prompt among the rows (prompts are left-padded)
    response_width: int  # the longest real response among the rows (responses are right-padded), at least 1

    @property
    def tokens(self) -> int:
        """Tokens a padded forward computes: rows × (prompt width + response width)."""
        return int(self.indices.numel()) * (self.prompt_width + self.response_width)

    def columns(self, context_length: int) -> slice:
        """The columns of a `[B, P + T]` row (`P = context_length`) that this micro-batch's forward needs."""
        return slice(context_length - self.prompt_width, context_length + self.response_width)


def sequence_lengths(query_mask: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """
    `(prompt_lengths, response_lengths)`, each `[B]` on CPU: real prompt tokens (left-padded `query_mask`) and the
    response's extent (one past its last valid token in the right-padded `response_mask`; 0 for an empty response).
    """
    prompt = query_mask.bool().sum(dim=1)
    mask = response_mask.bool()
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    response = (mask * positions).amax(dim=1) if mask.shape[1] else torch.zeros_like(prompt)
    return prompt.cpu(), response.cpu()


def padded_cost(prompt_lengths: list[int], response_lengths: list[int]) -> int:
    """Tokens of a padded forward over these sequences (response width at least 1: a forward needs a column)."""
    return len(prompt_lengths) * (max(prompt_lengths) + max(1, max(response_lengths)))


def _groups_under(
    prompt: list[int], response: list[int], order: list[int], cap: int, packed: bool = False
) -> list[list[int]]:
    """Contiguous groups of `order` (sorted longest first), each as long as it can be with a size ≤ cap (padded:
    rows × widest prompt + widest response; packed: the sum of lengths); a sequence over the cap forms a group alone."""
    groups: list[list[int]] = []
    current: list[int] = []
    widest_prompt = widest_response = total = 0
    for i in order:
        p, r = max(widest_prompt, prompt[i]), max(widest_response, response[i], 1)
        size = total + prompt[i] + response[i] if packed else (len(current) + 1) * (p + r)
        if current and size > cap:
            groups.append(current)
            current, p, r, total = [], prompt[i], max(1, response[i]), 0
        current.append(i)
        widest_prompt, widest_response, total = p, r, total + prompt[i] + response[i]
    if current:
        groups.append(current)
    return groups


def micro_batch_count(
    prompt_lengths: torch.Tensor, response_lengths: torch.Tensor, max_tokens: int, packed: bool = False
) -> int:
    """The fewest micro-batches whose size stays within `max_tokens` (a longer sequence alone)."""
    return len(plan_micro_batches(prompt_lengths, response_lengths, max_tokens, packed=packed))


def plan_micro_batches(
    prompt_lengths: torch.Tensor,
    response_lengths: torch.Tensor,
    max_tokens: int,
    count: int | None = None,
    packed: bool = False,
) -> list[MicroBatch]:
    """
    Partition sequences into micro-batches of size at most `max_tokens`, balanced: the padded size (rows × widest
    prompt + widest response), or with `packed` (padding-free forwards) the sum of the sequences' lengths.

    Args:
        prompt_lengths, response_lengths: `[B]` real prompt and response lengths ([`sequence_lengths`]).
        max_tokens: The token budget of one forward (count × padded width).
        count: The number of micro-batches to make (at least the fewest the budget needs, at most B); `None`: the
            fewest. More micro-batches than needed are balanced over the same sorted order, so they stay within budget.

    Returns:
        The micro-batches, longest first; together they hold every row exactly once.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}.")
    prompt = [int(x) for x in prompt_lengths.tolist()]
    response = [int(x) for x in response_lengths.tolist()]
    size = len(prompt)
    if size == 0:
        return []
    # Longest first; ties keep batch order, so the plan is a function of the lengths alone (same on every process).
    order = sorted(range(size), key=lambda i: (-(prompt[i] + max(1, response[i])), i))

    def cost(group: list[int]) -> int:
        if packed:
            return sum(prompt[i] + response[i] for i in group)
        return padded_cost([prompt[i] for i in group], [response[i] for i in group])

    fewest = _groups_under(prompt, response, order, cap=max_tokens, packed=packed)
    if count is None:
        count = len(fewest)
    if not len(fewest) <= count <= size:
        raise ValueError(
            f"Cannot make {count} micro-batches of {size} sequences within {max_tokens} tokens: between "
            f"{len(fewest)} and {size} are possible."
        )
    # Balance: the smallest cap (≤ the budget) whose greedy grouping needs at most `count` groups, by bisection.
    low, high = 1, max_tokens
    while low < high:
        middle = (low + high) // 2
        if len(_groups_under(prompt, response, order, cap=middle, packed=packed)) <= count:
            high = middle
        else:
            low = middle + 1
    groups = _groups_under(prompt, response, order, cap=high, packed=packed)
    # Too few groups (the cap allows fewer): split the costliest group that has two rows or more, until `count`.
    while len(groups) < count:
        at = max((g for g in range(len(groups)) if len(groups[g]) > 1), key=lambda g: cost(groups[g]))
        group = groups[at]
        half = math.ceil(len(group) / 2)
        groups[at : at + 1] = [group[:half], group[half:]]
    return [
        MicroBatch(
            indices=torch.tensor(group, dtype=torch.long),
            prompt_width=max(prompt[i] for i in group),
            response_width=max(1, max(response[i] for i in group)),
        )
        for group in groups
    ]


def over_budget(micro_batches: list[MicroBatch], max_tokens: int) -> list[MicroBatch]:
    """The micro-batches over the budget: single sequences longer than it (a group of several never is)."""
    return [mb for mb in micro_batches if mb.indices.numel() == 1 and mb.tokens > max_tokens]


def split_by_tokens(
    indices: torch.Tensor,
    prompt_lengths: torch.Tensor,
    response_lengths: torch.Tensor,
    max_tokens: int,
    count: int | None = None,
    packed: bool = False,
) -> list[MicroBatch]:
    """[`plan_micro_batches`] over the rows `indices` of a batch (lengths are the whole batch's); the micro-batches
    hold batch row indices, on the device of `indices`."""
    rows = indices.cpu()
    plan = plan_micro_batches(prompt_lengths[rows], response_lengths[rows], max_tokens, count=count, packed=packed)
    return [dataclasses.replace(mb, indices=indices[mb.indices.to(indices.device)]) for mb in plan]


def real_tokens(micro_batch: MicroBatch, prompt_lengths: torch.Tensor, response_lengths: torch.Tensor) -> int:
    """Tokens of the micro-batch's sequences without padding (prompts and responses up to their last valid token)."""
    rows = micro_batch.indices.cpu()
    return int(prompt_lengths[rows].sum() + response_lengths[rows].sum())


@dataclasses.dataclass
class ForwardWork:
    """Tokens and time of a set of forwards (this process): real tokens, tokens computed (padding included)."""

    real_tokens: int = 0
    computed_tokens: int = 0
    micro_batches: int = 0
    seconds: float = 0.0
    peak_memory_bytes: int | None = None  # CUDA's peak allocated memory during them; `None` off CUDA

    def add(self, micro_batch: MicroBatch, real_tokens: int, packed: bool = False) -> None:
        """Count one forward: a padded one computes the micro-batch's padded size, a packed one its real tokens."""
        self.add_counts(real_tokens, real_tokens if packed else micro_batch.tokens)

    def add_counts(self, real_tokens: int, computed_tokens: int) -> None:
        """Count one forward of `computed_tokens` positions, `real_tokens` of them real."""
        self.real_tokens += real_tokens
        self.computed_tokens += computed_tokens
        self.micro_batches += 1


@contextlib.contextmanager
def measured(work: ForwardWork, device: torch.device) -> Iterator[ForwardWork]:
    """Time the block into `work.seconds` and, on CUDA, its peak allocated memory into `work.peak_memory_bytes`."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    yield work
    work.seconds = time.perf_counter() - started
    if cuda:
        work.peak_memory_bytes = int(torch.cuda.max_memory_allocated(device))


def full_width(indices: torch.Tensor, context_length: int, response_length: int) -> MicroBatch:
    """A micro-batch over the batch's whole width (no budget: today's padded forward)."""
    return MicroBatch(indices=indices, prompt_width=context_length, response_width=response_length)


def warn_once_over_budget(micro_batches: list[MicroBatch], max_tokens: int, knob: str, warned: set, warn) -> None:
    """Warn once per knob when a sequence longer than the budget runs alone."""
    if knob in warned:
        return
    over = over_budget(micro_batches, max_tokens)
    if over:
        warned.add(knob)
        warn(
            f"A sequence of {over[0].tokens} tokens is longer than {knob}={max_tokens}: it runs alone in its "
            f"micro-batch, so memory is set by it, not by the budget. Raise {knob} to at least the longest prompt + "
            "response_length to keep memory within the budget. (Warned once.)"
        )


def plan_forwards(
    groups: list[torch.Tensor],
    prompt_lengths: torch.Tensor,
    response_lengths: torch.Tensor,
    max_tokens: int | None,
    rows_per_micro_batch: int,
    context_length: int,
    response_length: int,
    max_across: Callable[[list[int]], list[int]] | None = None,
    packed: bool = False,
) -> list[list[MicroBatch]]:
    """
    The micro-batches of each group of rows (a mini-batch of the PPO epochs, or the whole rollout for its no-grad
    forwards).

    Without a budget (`max_tokens=None`): `rows_per_micro_batch` rows at a time in the group's order, over the whole
    padded width — the forwards of earlier versions, bit for bit. With a budget: [`split_by_tokens`], each group into
    the largest count any process needs (`max_across` takes the maximum over processes; `None`: one process).
    """
    if max_tokens is None:
        return [
            [full_width(rows, context_length, response_length) for rows in group.split(rows_per_micro_batch)]
            for group in groups
        ]
    counts = [
        micro_batch_count(prompt_lengths[g.cpu()], response_lengths[g.cpu()], max_tokens, packed=packed)
        for g in groups
    ]
    if max_across is not None:
        counts = max_across(counts)
    return [
        split_by_tokens(group, prompt_lengths, response_lengths, max_tokens=max_tokens, count=count, packed=packed)
        for group, count in zip(groups, counts)
    ]

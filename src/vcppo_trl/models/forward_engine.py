"""The forward engine: how the package runs a model over a rollout's sequences, for the rollout's no-grad forwards (the
policy's old log-probs, the critic's values, the reference's log-probs) and for the learner's training forwards.

Four steps, one implementation: **plan** the micro-batches by tokens (or by a fixed number of sequences at full
width; the same count on every process, see [`~algo.micro_batches.plan_forwards`]), **pad or pack** each one (its
own widths, or one padding-free row), **run** the model on it, and **gather** the `[b, w]` outputs back into `[B, T]`
tensors. The learner runs its own loss between the forward and the backward, so it takes the plan and the inputs and
runs the micro-batches itself; the rollout maker takes all four.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import torch
from accelerate import Accelerator
from transformers.utils import logging

from ..algo.micro_batches import ForwardWork, MicroBatch, plan_forwards, warn_once_over_budget
from ..parallel.collectives import max_across_processes
from ..parallel.row_sharing import share_group_rows
from ..parallel.sequence import SequenceGroup, ulysses_attention
from .packing import TokenBatch, check_packing

logger = logging.get_logger(__name__)


@dataclasses.dataclass(frozen=True)
class ForwardSettings:
    """
    How one part's forwards are cut: by a token budget (`max_tokens`, and the config field that sets it, named in its
    warning), else `sequences` at a time over the whole padded width; padded or packed (`padding_free`).
    """

    max_tokens: int | None
    budget_field: str
    sequences: int
    padding_free: bool


@dataclasses.dataclass(frozen=True)
class ForwardPlan:
    """
    The micro-batches of forwards over every row of a batch (the rollout's no-grad forwards), and the rows they run:
    this process's, or with sequence parallelism its group's ([`~parallel.row_sharing.share_group_rows`]), this process's
    own at `own`, its outputs `width` wide.
    """

    tokens: TokenBatch
    micro_batches: list[MicroBatch]
    own: slice | None = None  # None: `tokens` are this process's rows
    width: int | None = None  # this process's response width, when `own` is set

    def __len__(self) -> int:
        return len(self.micro_batches)


class ForwardEngine:
    """
    Plans, pads or packs, runs and gathers one part's forwards (see the module docstring).

    Args:
        settings ([`ForwardSettings`]): How the forwards are cut.
        accelerator (`Accelerator`): For the micro-batch count every process must share (ZeRO-3 runs every forward
            as a collective).
        sequence_group ([`~parallel.sequence.SequenceGroup`], *optional*): Split every micro-batch along the
            sequence across this group (`sequence_parallel_size`); its processes hold the same rows and plan alike.
    """

    def __init__(
        self, settings: ForwardSettings, accelerator: Accelerator, sequence_group: SequenceGroup | None = None
    ):
        self.settings = settings
        self.accelerator = accelerator
        self.sequence_group = sequence_group
        self.warned: set[str] = set()
        self.packing_checked: set[int] = set()

    def plan(self, tokens: TokenBatch, groups: list[torch.Tensor], response_width: int) -> list[list[MicroBatch]]:
        """The micro-batches of each group of rows (the PPO epochs' mini-batches, or all rows of the rollout)."""
        settings = self.settings
        plans = plan_forwards(
            groups,
            tokens.prompt_lengths,
            tokens.response_lengths,
            max_tokens=self.max_tokens,
            rows_per_micro_batch=settings.sequences,
            context_length=tokens.context_length,
            response_length=response_width,
            max_across=max_across_processes(self.accelerator),
            packed=settings.padding_free,
        )
        return plans

    def plan_all(self, tokens: TokenBatch) -> ForwardPlan:
        """The micro-batches of all rows of `tokens`, warned about once when over budget. Split across a
        sequence-parallel group: over the group's rows, shared first, the same plan on every process of the group."""
        own = width = None
        if self.sequence_group is not None:
            width = tokens.response_ids.shape[1]
            tokens, own = share_group_rows(tokens, self.accelerator, self.sequence_group)
        rows = torch.arange(tokens.response_ids.shape[0], device=tokens.response_ids.device)
        (micro_batches,) = self.plan(tokens, [rows], tokens.response_ids.shape[1])
        self.warn_over_budget(micro_batches)
        return ForwardPlan(tokens, micro_batches, own=own, width=width)

    @property
    def row_holders(self) -> int:
        """How many processes hold each row: the sequence-parallel group's size (its processes share their rows and
        each runs its own columns), else 1."""
        return 1 if self.sequence_group is None else self.sequence_group.size

    def attention(self) -> contextlib.AbstractContextManager:
        """The context of a forward and its backward: the attention split along the sequence across the group
        (Ulysses; gradient checkpointing recomputes inside the backward), or unchanged without a group."""
        return ulysses_attention(self.sequence_group is not None)

    @property
    def max_tokens(self) -> int | None:
        """The token budget of one micro-batch: the setting's, times the group's size when split (the budget is per
        process)."""
        budget = self.settings.max_tokens
        return None if budget is None else budget * self.row_holders

    def warn_over_budget(self, plan: list[MicroBatch]) -> None:
        """Warn once when a sequence longer than the budget runs alone in its micro-batch."""
        if self.max_tokens is not None:
            warn_once_over_budget(
                plan, self.max_tokens, self.settings.budget_field, warned=self.warned, warn=logger.warning
            )

    def check_packing(self, models: dict[str, torch.nn.Module], vocab_size: int) -> None:
        """Before a model's first padding-free forward: refuse one that lets packed sequences attend to each other
        ([`~models.packing.check_packing`]); `models` maps the names its error gives to the models. A no-op when
        padded."""
        if not self.settings.padding_free:
            return
        for name, model in models.items():
            if id(model) not in self.packing_checked:
                check_packing(model, vocab_size, name)
                self.packing_checked.add(id(model))

    def inputs(self, tokens: TokenBatch, micro_batch: MicroBatch) -> dict:
        """The micro-batch padded to its own widths or packed into one row: the keyword arguments of
        [`~models.policy_and_value.PolicyAndValueModel.forward`] and [`~models.policy_and_value.response_logprobs_of`]."""
        return tokens.model_inputs(micro_batch, self.settings.padding_free, self.sequence_group)

    def count(self, work: ForwardWork | None, tokens: TokenBatch, micro_batch: MicroBatch) -> None:
        """Count one forward's tokens into `work` (computed ones: its padded size, or its real tokens packed; split,
        this process's columns and its share of the real tokens)."""
        if work is None:
            return
        real = tokens.real_tokens(micro_batch)
        group = self.sequence_group
        if group is None:
            work.add(micro_batch, real, self.settings.padding_free)
            return
        rows = micro_batch.indices.cpu()
        lengths = tokens.prompt_lengths[rows] + tokens.response_lengths[rows].clamp(max=micro_batch.response_width)
        columns = -(-int(lengths.max()) // group.size)
        work.add_counts(real // group.size, len(rows) * columns)

    def gather(
        self,
        plan: ForwardPlan,
        run: Callable[[dict], tuple[torch.Tensor | None, ...]],
        work: ForwardWork | None = None,
    ) -> tuple[torch.Tensor | None, ...]:
        """
        Run `run(inputs)` on every micro-batch of `plan` and gather its `[b, w]` outputs into `[B, T]` tensors of this
        process's rows, zero after each micro-batch's longest response (split: after each response); an output `run`
        gives as `None` stays `None`.
        """
        tokens = plan.tokens
        gathered: list[torch.Tensor | None] | None = None
        for micro in plan.micro_batches:
            outputs = run(self.inputs(tokens, micro))
            if gathered is None:
                gathered = [None if out is None else out.new_zeros(tokens.response_ids.shape) for out in outputs]
            for full, out in zip(gathered, outputs):
                if out is not None:
                    full[micro.indices, : micro.response_width] = out
            self.count(work, tokens, micro)
        if gathered is None:
            return ()
        if plan.own is not None:  # split: every process of the group computed the group's rows; keep its own
            gathered = [None if full is None else full[plan.own, : plan.width].contiguous() for full in gathered]
        return tuple(gathered)

    def micro_batches(
        self, tokens: TokenBatch, plan: list[MicroBatch], work: ForwardWork | None = None
    ) -> Iterator[tuple[MicroBatch, dict]]:
        """Each micro-batch of `plan` with its model inputs, counted into `work`: for a caller that runs the forward
        itself (the learner: its loss and backward come between micro-batches)."""
        for micro in plan:
            self.count(work, tokens, micro)
            yield micro, self.inputs(tokens, micro)

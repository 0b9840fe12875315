"""Layouts of a micro-batch's sequences: padding-free (concatenated into one row, outputs brought back to `[b, w]`),
and split along the sequence across a sequence-parallel group ([`SplitRows`]).

Padding-free: each sequence (its real prompt tokens, then its response up to its last valid token) follows the previous one in a
single `[1, N]` row, with `position_ids` restarting at 0. transformers recognises packed rows from `position_ids` when
no attention mask is passed (`masking_utils.find_packed_sequence_indices`): varlen kernels under flash/flex attention,
an exact block-diagonal mask under sdpa and eager. A model that does not do this would let the sequences of a row
attend to each other silently, so [`check_packing`] runs a probe before the first packed forward and refuses such a
model with the reason and the fix.
"""

from __future__ import annotations

import dataclasses

import torch

from ..algo.micro_batches import MicroBatch, real_tokens, sequence_lengths
from ..parallel.sequence import SequenceGroup, sum_over_group


class PackingError(ValueError):
    """The model cannot keep packed sequences apart (`padding_free=True` is refused)."""


@dataclasses.dataclass(frozen=True)
class PackedRow:
    """A micro-batch as one row, and where each response token's prediction sits in it."""

    input_ids: torch.Tensor  # [1, N]: the sequences back to back, no pad
    position_ids: torch.Tensor  # [1, N]: 0, 1, ... within each sequence
    predicting: torch.Tensor  # [b, w] long: the row position whose output predicts response token t (0 past the end)
    targets: torch.Tensor  # [b, w]: the response tokens (the micro-batch's first w columns)
    # [b, P + w]: each row's prompt (left-padded with -1) then its response: what the repetition penalty has seen
    history: torch.Tensor

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[1])


def pack_micro_batch(
    query_ids: torch.Tensor,
    response_ids: torch.Tensor,
    prompt_lengths: torch.Tensor,
    response_lengths: torch.Tensor,
    micro_batch: MicroBatch,
) -> PackedRow:
    """
    The micro-batch's rows of a left-padded `[B, P]` prompt batch and a right-padded `[B, T]` response batch as one
    [`PackedRow`]. Every prompt must hold at least one token (the first response token is predicted from it).
    """
    context = query_ids.shape[1]
    width = micro_batch.response_width
    rows = micro_batch.indices
    pieces, positions, predicting = [], [], []
    start = 0
    for row, prompt, response in zip(
        rows.tolist(), prompt_lengths[rows.cpu()].tolist(), response_lengths[rows.cpu()].tolist()
    ):
        if prompt < 1:
            raise ValueError(
                f"Row {row} has an empty prompt: a padding-free forward predicts a response's first token from its "
                "prompt's last one. Give every prompt at least one token (e.g. a BOS token or a chat template)."
            )
        pieces += [query_ids[row, context - prompt :], response_ids[row, :response]]
        length = prompt + response
        positions.append(torch.arange(length, device=query_ids.device))
        # Response token t is predicted at the sequence's position prompt − 1 + t; none past the response's end.
        steps = torch.arange(width, device=query_ids.device)
        predicting.append(torch.where(steps < response, start + prompt - 1 + steps, torch.zeros_like(steps)))
        start += length
    return PackedRow(
        input_ids=torch.cat(pieces).unsqueeze(0),
        position_ids=torch.cat(positions).unsqueeze(0),
        predicting=torch.stack(predicting),
        targets=response_ids[rows, :width],
        history=row_history(query_ids, response_ids, prompt_lengths=prompt_lengths, rows=rows, width=width),
    )


def row_history(
    query_ids: torch.Tensor, response_ids: torch.Tensor, prompt_lengths: torch.Tensor, rows: torch.Tensor, width: int
) -> torch.Tensor:
    """`[b, P + w]`: the prompts of `rows` (their left padding at -1) then their first `width` response tokens, the
    tokens a sampler's repetition penalty sees ([`~models.logprobs.TokenHistory`])."""
    prompts = query_ids[rows]
    padding = torch.arange(prompts.shape[1], device=prompts.device) < (
        prompts.shape[1] - prompt_lengths[rows.cpu()].to(prompts.device)[:, None]
    )
    return torch.cat([prompts.masked_fill(padding, -1), response_ids[rows, :width]], dim=1)


@dataclasses.dataclass(frozen=True)
class SplitRows:
    """This process's columns of a split micro-batch, and where its response tokens' predictions sit in them."""

    input_ids: torch.Tensor  # [b, n]: this process's columns of the right-padded rows
    position_ids: torch.Tensor  # [b, n]
    rows: torch.Tensor  # [k] the micro-batch row of each response token predicted in these columns
    steps: torch.Tensor  # [k] its response position t
    columns: torch.Tensor  # [k] the local column whose output predicts it
    targets: torch.Tensor  # [k] the token
    shape: tuple[int, int]  # (b, w): the micro-batch's outputs
    group: SequenceGroup
    # [b, P + w]: each row's prompt (left-padded with -1) then its response: what the repetition penalty has seen
    history: torch.Tensor

    def scatter(self, values: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """`[k]` outputs of this process's tokens → `[b, w]` (zeros elsewhere), summed over the group. `output` is
        the model's output these were read from: a process that reads none of it (its columns all prompt) still
        puts it in the graph, so that its backward runs the attention's collectives the others wait for."""
        full = values.new_zeros(self.shape)
        if values.numel():
            full = full.index_put((self.rows, self.steps), values)
        else:
            full = full + output.sum().float() * 0
        return sum_over_group(full, self.group)


def split_micro_batch(
    query_ids: torch.Tensor,
    response_ids: torch.Tensor,
    prompt_lengths: torch.Tensor,
    response_lengths: torch.Tensor,
    micro_batch: MicroBatch,
    group: SequenceGroup,
) -> SplitRows:
    """
    The micro-batch's rows of a left-padded `[B, P]` prompt batch and a right-padded `[B, T]` response batch, laid out
    as the module docstring says, cut to this process's columns. Every prompt must hold at least one token.
    """
    context = query_ids.shape[1]
    rows = micro_batch.indices
    width = micro_batch.response_width
    prompts = prompt_lengths[rows.cpu()].tolist()
    responses = [min(r, width) for r in response_lengths[rows.cpu()].tolist()]
    if min(prompts) < 1:
        raise ValueError(
            "A row has an empty prompt: a split forward predicts a response's first token from its prompt's last one. "
            "Give every prompt at least one token (e.g. a BOS token or a chat template)."
        )
    longest = max(p + r for p, r in zip(prompts, responses))
    total = -(-longest // group.size) * group.size
    ids = query_ids.new_zeros(len(prompts), total)  # the padding is never attended (causal), any id does
    for i, (row, prompt, response) in enumerate(zip(rows.tolist(), prompts, responses)):
        ids[i, :prompt] = query_ids[row, context - prompt :]
        ids[i, prompt : prompt + response] = response_ids[row, :response]
    local = total // group.size
    start = group.rank * local
    device = query_ids.device
    # Response token t of row i is predicted at column prompt_i − 1 + t.
    steps = torch.arange(width, device=device)
    prompt_t = torch.tensor(prompts, device=device)[:, None]
    predicting = prompt_t - 1 + steps
    valid = steps < torch.tensor(responses, device=device)[:, None]
    mine = valid & (predicting >= start) & (predicting < start + local)
    row_of, step_of = mine.nonzero(as_tuple=True)
    return SplitRows(
        input_ids=ids[:, start : start + local],
        position_ids=torch.arange(start, start + local, device=device).expand(len(prompts), -1),
        rows=row_of,
        steps=step_of,
        columns=predicting[row_of, step_of] - start,
        targets=response_ids[rows[row_of], step_of],
        shape=(len(prompts), width),
        group=group,
        history=row_history(query_ids, response_ids, prompt_lengths=prompt_lengths, rows=rows, width=width),
    )


@torch.no_grad()
def check_packing(model: torch.nn.Module, vocab_size: int, name: str) -> None:
    """
    Refuse a model that lets packed sequences attend to each other: two short sequences packed in one row must give
    the second sequence the outputs it gets alone — up to rounding, judged against how far the outputs move when the
    second sequence does see the first (the same row with a 2-D mask of ones), so that the test holds in bf16 too.

    Every process must call it (under ZeRO-3 a forward is a collective).

    Raises:
        `PackingError`: with the attention implementation, the differences measured and the fix.
    """
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(0)
    first = torch.randint(0, vocab_size, (5,), generator=generator)
    second = torch.randint(0, vocab_size, (7,), generator=generator)
    row = torch.cat([first, second]).unsqueeze(0).to(device)
    positions = torch.cat([torch.arange(5), torch.arange(7)]).unsqueeze(0).to(device)
    was_training = model.training
    model.eval()
    try:
        alone = _outputs(model, second.unsqueeze(0).to(device), torch.arange(7, device=device).unsqueeze(0))[0].float()
        packed = _outputs(model, row, positions)[0, 5:].float()
        seeing = _outputs(model, row, positions, attention_mask=torch.ones_like(row))[0, 5:].float()
    finally:
        model.train(was_training)
    apart, together = float((packed - alone).abs().max()), float((seeing - alone).abs().max())
    if together > 0 and not apart <= 0.1 * together:
        implementation = getattr(getattr(model, "config", None), "_attn_implementation", "unknown")
        raise PackingError(
            f"padding_free=True needs a {name} that keeps packed sequences apart, but {type(model).__name__} "
            f"(attention: {implementation}) gave a packed sequence outputs that differ from its outputs alone by "
            f"{apart:.3g} (a sequence that sees the one before it: {together:.3g}): its sequences would attend to "
            "each other. transformers recognises packed rows from position_ids in models that build their mask with "
            "masking_utils (sdpa, eager, flex_attention, flash_attention_2). Use such a model or attention "
            "implementation, or set padding_free=False (max_tokens_per_micro_batch still removes most of the padding)."
        )


def _outputs(model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask=None):
    kwargs = {} if attention_mask is None else {"attention_mask": attention_mask}
    output = model(input_ids=input_ids, position_ids=position_ids, use_cache=False, **kwargs)
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


class TokenBatch:
    """
    A rollout's tokens, joined once, and the model inputs of any of its micro-batches: cut to the micro-batch's widths
    (`[b, p + w]` with its attention mask), or packed into one row ([`PackedRow`]) with `padding_free`.
    """

    def __init__(self, query_ids: torch.Tensor, query_mask: torch.Tensor, response_ids: torch.Tensor, response_mask):
        self.query_ids, self.response_ids = query_ids, response_ids
        self.input_ids = torch.cat([query_ids, response_ids], dim=1)
        self.attention_mask = torch.cat([query_mask.bool(), response_mask.bool()], dim=1).long()
        self.context_length = query_ids.shape[1]
        self.prompt_lengths, self.response_lengths = sequence_lengths(query_mask, response_mask)

    @classmethod
    def of(cls, rollout) -> TokenBatch:
        return cls(rollout.query_ids, rollout.query_mask, rollout.response_ids, rollout.response_mask)

    def real_tokens(self, micro_batch: MicroBatch) -> int:
        return real_tokens(micro_batch, self.prompt_lengths, self.response_lengths)

    def packed(self, micro_batch: MicroBatch) -> PackedRow:
        return pack_micro_batch(
            self.query_ids,
            self.response_ids,
            self.prompt_lengths,
            response_lengths=self.response_lengths,
            micro_batch=micro_batch,
        )

    def padded(self, micro_batch: MicroBatch) -> tuple[torch.Tensor, torch.Tensor, int]:
        """`(input_ids, attention_mask, context_length)` of the micro-batch, cut to its own widths."""
        rows, columns = micro_batch.indices, micro_batch.columns(self.context_length)
        return self.input_ids[rows][:, columns], self.attention_mask[rows][:, columns], micro_batch.prompt_width

    def split(self, micro_batch: MicroBatch, group: SequenceGroup) -> SplitRows:
        return split_micro_batch(
            self.query_ids,
            self.response_ids,
            self.prompt_lengths,
            response_lengths=self.response_lengths,
            micro_batch=micro_batch,
            group=group,
        )

    def model_inputs(self, micro_batch: MicroBatch, padding_free: bool, group: SequenceGroup | None = None) -> dict:
        """Keyword arguments of [`~models.policy_and_value.PolicyAndValueModel.forward`] for the micro-batch: split
        across `group` when given ([`SplitRows`]), else packed or padded."""
        if group is not None:
            return {
                "input_ids": None,
                "attention_mask": None,
                "context_length": 0,
                "split": self.split(micro_batch, group),
            }
        if padding_free:
            return {"input_ids": None, "attention_mask": None, "context_length": 0, "packed": self.packed(micro_batch)}
        input_ids, attention_mask, context_length = self.padded(micro_batch)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "context_length": context_length}

"""The policy's log-probabilities and the critic's values over a micro-batch split along the sequence across a
sequence-parallel group (`sequence_parallel_size`; its layout, [`~models.packing.SplitRows`], is built by
[`~models.packing.split_micro_batch`]).

The layout: each sequence of the micro-batch (its real prompt tokens, then its response) starts at column 0 of its
row; rows are right-padded to a common width, a multiple of the group size, and positions are `0, 1, ...`. Under
causal attention a token never sees the padding after it, so no attention mask is needed — the one thing Ulysses'
attention cannot take. Process `r` of the group runs the model on columns `[r·n, (r+1)·n)`; the response tokens whose
predicting position falls in its columns are read there, and one sum over the group ([`~parallel.sequence.sum_over_group`])
brings every `[b, w]` output to every process of the group, exact (each entry comes from one process, zeros from the
others).
"""

from __future__ import annotations

import torch
from torch import nn

from ..algo.logits_processing import NO_KNOBS, SamplingKnobs
from ..parallel.sequence import ulysses_attention
from .logprobs import TokenHistory, causal_lm_parts, chunked_token_logprobs, logits_logprobs
from .packing import SplitRows


def split_response_logprobs(
    policy: nn.Module,
    split: SplitRows,
    temperature: float,
    compute_entropy: bool = False,
    knobs: SamplingKnobs = NO_KNOBS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """
    [`~models.logprobs.response_logprobs`] of a split micro-batch: this process's columns through the backbone (its
    attention split by Ulysses), the LM head in vocabulary tiles over the positions that predict a response token
    (under the sampler's other `knobs`: the processed distribution, each row's whole prompt and response before the
    token as the repetition penalty's history).

    Returns:
        `(logprobs, entropy)`: float32 `[b, w]`, the same on every process of the group (zero past each response's
        end, which the losses mask).
    """
    parts = causal_lm_parts(policy)
    history = None
    if knobs.penalises:
        context = split.history.shape[1] - split.shape[1]
        history = TokenHistory(split.history, context, rows=split.rows, steps=split.steps)
    with ulysses_attention(split.group.size > 1):
        if parts is None:
            output = policy(input_ids=split.input_ids, position_ids=split.position_ids, use_cache=False)
            everything = output.logits
            logits = everything[split.rows, split.columns]
            if split.targets.numel():
                logprobs, entropy = logits_logprobs(
                    logits,
                    split.targets,
                    temperature=temperature,
                    compute_entropy=compute_entropy,
                    knobs=knobs,
                    history=history,
                )
            else:  # TRL's log-softmax refuses no rows; `scatter` still puts the output in the graph
                logprobs = logits.float().new_zeros(0)
                entropy = logits.float().new_zeros(0) if compute_entropy else None
        else:
            everything = parts.last_hidden_state(input_ids=split.input_ids, position_ids=split.position_ids)
            # Run on every process, tokens or none: under ZeRO-3 it gathers the LM head (a collective).
            logprobs, entropy = chunked_token_logprobs(
                everything[split.rows, split.columns],
                parts,
                split.targets,
                temperature=temperature,
                compute_entropy=compute_entropy,
                knobs=knobs,
                history=history,
            )
    entropy = split.scatter(entropy, everything) if entropy is not None else None
    return split.scatter(logprobs, everything), entropy


def split_value_forward(critic: nn.Module, split: SplitRows) -> torch.Tensor:
    """[`~models.value_model.value_forward`] of a split micro-batch: `[b, w]` values, the same on every process of
    the group."""
    with ulysses_attention(split.group.size > 1):
        output = critic(input_ids=split.input_ids, position_ids=split.position_ids, use_cache=False)
    return split.scatter(output.logits[split.rows, split.columns, 0].float(), output.logits)

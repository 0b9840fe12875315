"""Collectives across processes: the gradient-accumulation context of a micro-batch, the all-reduces of whitening and
of micro-batch counts, a state dict gathered from ZeRO-3 partitions, and the all-to-all of rows that balances ranks.

DDP: gradients are all-reduced on the last micro-batch of a minibatch only (`no_sync` on the others).

DeepSpeed: `accelerator.backward` runs `engine.backward` and, at a gradient-accumulation boundary, `engine.step`
(clipping, optimizer step, zero_grad). The boundary is set here from the micro-batch index, so the engine steps once
per minibatch, after `gradient_accumulation_steps` micro-batches, exactly like the plain loop; the engine divides the
loss by its own `gradient_accumulation_steps`, which must equal ours.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from accelerate import Accelerator

from .fsdp import fsdp2_full_state_dict, fsdp2_roots, is_fsdp2_sharded


@contextlib.contextmanager
def micro_batch_context(
    accelerator: Accelerator, is_deepspeed: bool, model: torch.nn.Module, is_last: bool
) -> Iterator[None]:
    """Forward and backward of one micro-batch: gradients are synchronised (and DeepSpeed steps) on the last one; under
    FSDP2 the earlier ones accumulate unsharded gradients, reduce-scattered with the last."""
    roots = [] if is_deepspeed or is_last else fsdp2_roots(model)
    if is_deepspeed:
        accelerator.gradient_state._set_sync_gradients(is_last)
        try:
            yield
        finally:
            accelerator.gradient_state._set_sync_gradients(True)
    elif is_last:
        yield
    elif roots:
        for root in roots:
            root.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            for root in roots:
                root.set_requires_gradient_sync(True)
    else:
        with accelerator.no_sync(model):
            yield


def whitening_all_reduce(accelerator: Accelerator, scope: str) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The sum over processes that whitening statistics need under `advantage_whitening="global"` (`None`: this
    process's statistics alone, with `"local"` or a single process)."""
    if scope == "global" and accelerator.num_processes > 1:
        return lambda t: accelerator.reduce(t, "sum")
    return None


def gathered_state_dict(model: torch.nn.Module, every_rank: bool = False) -> dict[str, torch.Tensor] | None:
    """
    The full state dict of a ZeRO-3-partitioned model (gathered on every rank, copied to CPU) or of an FSDP2-sharded
    one (on the first process only, which saves it; with `every_rank` on every process), or `None` when the model
    holds no partitioned parameter (then `save_pretrained` reads the weights itself).

    Every rank must call it (the gathering is a collective).
    """
    if is_fsdp2_sharded(model):
        return fsdp2_full_state_dict(model, every_rank=every_rank)
    params = [p for p in model.parameters() if hasattr(p, "ds_id")]
    if not params:
        return None
    import deepspeed

    with deepspeed.zero.GatheredParameters(params):
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def max_across_processes(accelerator: Accelerator) -> Callable[[list[int]], list[int]] | None:
    """Element-wise maximum of a list of ints over processes (every process must call it with a list of the same
    length), or `None` with one process. Used to give every process the same number of micro-batches."""
    if accelerator.num_processes == 1:
        return None

    def max_across(values: list[int]) -> list[int]:
        tensor = torch.tensor(values, dtype=torch.long, device=accelerator.device)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return [int(v) for v in tensor.tolist()]

    return max_across


def exchange_rows(
    tensors: dict[str, torch.Tensor | None], *, send_counts: list[int], recv_counts: list[int]
) -> dict[str, torch.Tensor | None]:
    """
    All-to-all of rows (balanced ranks): each tensor's rows, already grouped by destination, go `send_counts[d]` to
    process `d`, and `recv_counts[q]` rows come from process `q`, in process order. Every process calls it with the
    same names, and tensors whose shapes agree after the first dimension. One collective per tensor (bools travel
    as bytes); a tensor given under two names moves once; `None` stays `None`.
    """
    moved: dict[int, torch.Tensor] = {}
    out: dict[str, torch.Tensor | None] = {}
    for name, tensor in tensors.items():
        if tensor is None:
            out[name] = None
            continue
        if id(tensor) not in moved:
            data = tensor.to(torch.uint8) if tensor.dtype == torch.bool else tensor
            received = data.new_empty(sum(recv_counts), *data.shape[1:])
            torch.distributed.all_to_all_single(
                received, data.contiguous(), output_split_sizes=recv_counts, input_split_sizes=send_counts
            )
            moved[id(tensor)] = received.bool() if tensor.dtype == torch.bool else received
        out[name] = moved[id(tensor)]
    return out

"""Collectives across processes: the gradient-accumulation context of a micro-batch, the all-reduces of whitening and
of micro-batch counts, and a state dict gathered from ZeRO-3 partitions.

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


def gathered_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """
    The full state dict of a ZeRO-3-partitioned model (gathered on every rank, copied to CPU) or of an FSDP2-sharded
    one (on the first process only, which saves it), or `None` when the model holds no partitioned parameter (then
    `save_pretrained` reads the weights itself).

    Every rank must call it (the gathering is a collective).
    """
    if is_fsdp2_sharded(model):
        return fsdp2_full_state_dict(model)
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

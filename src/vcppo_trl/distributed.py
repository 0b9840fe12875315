"""Multi-process pieces of the trainer: DeepSpeed checks and the gradient-accumulation context of a micro-batch.

DDP: gradients are all-reduced on the last micro-batch of a minibatch only (`no_sync` on the others).

DeepSpeed: `accelerator.backward` runs `engine.backward` and, at a gradient-accumulation boundary, `engine.step`
(clipping, optimizer step, zero_grad). The boundary is set here from the micro-batch index, so the engine steps once
per minibatch, after `gradient_accumulation_steps` micro-batches, exactly like the plain loop; the engine divides the
loss by its own `gradient_accumulation_steps`, which must equal ours.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .trainer import PPOTrainer


def check_deepspeed_setup(trainer: PPOTrainer) -> None:
    """
    Fail early, with the fix, when DeepSpeed and accelerate disagree on the world or on gradient accumulation.

    Raises:
        `RuntimeError`: accelerate counts fewer processes than torch.distributed (DeepSpeed on CPU without a
            `ddp_backend`: accelerate's state then reports 1 process and every rank would train on the same prompts).
        `ValueError`: the DeepSpeed config's `gradient_accumulation_steps` differs from the trainer's.
    """
    accelerator = trainer.accelerator
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
        if world != accelerator.num_processes:
            raise RuntimeError(
                f"DeepSpeed runs {world} processes but accelerate counts {accelerator.num_processes}: prompts would not "
                "be sharded. This happens on CPU, where accelerate finds no device backend: pass `--ddp_backend gloo` "
                "(PPOConfig(ddp_backend='gloo')) so that accelerate initialises the process group itself."
            )
    config = accelerator.state.deepspeed_plugin.deepspeed_config
    ga = config.get("gradient_accumulation_steps")
    if ga not in (None, "auto") and int(ga) != trainer.args.gradient_accumulation_steps:
        raise ValueError(
            f"The DeepSpeed config has gradient_accumulation_steps={ga} but the trainer uses "
            f"{trainer.args.gradient_accumulation_steps} micro-batches per optimizer step: set both to the same value "
            "(or 'auto' in the DeepSpeed config)."
        )


@contextlib.contextmanager
def micro_batch_context(trainer: PPOTrainer, model: torch.nn.Module, is_last: bool) -> Iterator[None]:
    """Forward and backward of one micro-batch: gradients are synchronised (and DeepSpeed steps) on the last one."""
    accelerator = trainer.accelerator
    if trainer.is_deepspeed_enabled:
        accelerator.gradient_state._set_sync_gradients(is_last)
        try:
            yield
        finally:
            accelerator.gradient_state._set_sync_gradients(True)
    elif is_last:
        yield
    else:
        with accelerator.no_sync(model):
            yield


def gathered_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """
    The full state dict of a ZeRO-3-partitioned model (gathered on every rank, copied to CPU), or `None` when the
    model holds no partitioned parameter (then `save_pretrained` reads the weights itself).

    Every rank must call it (the gathering is a collective).
    """
    params = [p for p in model.parameters() if hasattr(p, "ds_id")]
    if not params:
        return None
    import deepspeed

    with deepspeed.zero.GatheredParameters(params):
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

"""Multi-process pieces of the trainer: DeepSpeed checks and the gradient-accumulation context of a micro-batch.

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


def check_launch_environment() -> None:
    """
    Refuse `ACCELERATE_USE_CPU=1` under a DeepSpeed launch config, before any model is built.

    The variable makes accelerate run plain CPU DDP, while the DeepSpeed config that `accelerate launch` exports still
    tells transformers and TRL that ZeRO-3 is on: the two disagree and the first forward crashes (`'Parameter' object
    has no attribute 'ds_status'`, or `'weight' must be 2-D` in generation).

    Raises:
        `ValueError`: saying what to change.
    """
    from accelerate.utils import parse_flag_from_env

    if parse_flag_from_env("ACCELERATE_USE_CPU") and parse_flag_from_env("ACCELERATE_USE_DEEPSPEED"):
        raise ValueError(
            "ACCELERATE_USE_CPU=1 is set under a DeepSpeed launch config: accelerate would then run plain CPU DDP while "
            "transformers still applies the DeepSpeed (ZeRO-3) config, and training would crash. DeepSpeed runs on a "
            "CPU without that variable: unset ACCELERATE_USE_CPU and pass --ddp_backend gloo "
            "(configs/accelerate/zero3_cpu.yaml), or drop the DeepSpeed config to run CPU DDP "
            "(configs/accelerate/multi_gpu.yaml with ACCELERATE_USE_CPU=1)."
        )


def check_distributed_setup(accelerator: Accelerator, args, is_fsdp: bool, is_deepspeed: bool) -> None:
    """Refuse FSDP (not supported yet) and check a DeepSpeed launch ([`check_deepspeed_setup`])."""
    if is_fsdp:
        raise ValueError(
            "FSDP is not supported by this version of vcppo-trl yet: launch with DeepSpeed ZeRO-3 "
            "(configs/accelerate/zero3.yaml), DDP (multi_gpu.yaml) or a single device."
        )
    if is_deepspeed:
        check_deepspeed_setup(accelerator, args.gradient_accumulation_steps)


def check_deepspeed_setup(accelerator: Accelerator, gradient_accumulation_steps: int) -> None:
    """
    Fail early, with the fix, when DeepSpeed and accelerate disagree on the world or on gradient accumulation.

    Raises:
        `RuntimeError`: accelerate counts fewer processes than torch.distributed (DeepSpeed on CPU without a
            `ddp_backend`: accelerate's state then reports 1 process and every rank would train on the same prompts).
        `ValueError`: the DeepSpeed config's `gradient_accumulation_steps` differs from the trainer's.
    """
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
    if ga not in (None, "auto") and int(ga) != gradient_accumulation_steps:
        raise ValueError(
            f"The DeepSpeed config has gradient_accumulation_steps={ga} but the trainer uses "
            f"{gradient_accumulation_steps} micro-batches per optimizer step: set both to the same value "
            "(or 'auto' in the DeepSpeed config)."
        )


@contextlib.contextmanager
def micro_batch_context(
    accelerator: Accelerator, is_deepspeed: bool, model: torch.nn.Module, is_last: bool
) -> Iterator[None]:
    """Forward and backward of one micro-batch: gradients are synchronised (and DeepSpeed steps) on the last one."""
    if is_deepspeed:
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


def whitening_all_reduce(accelerator: Accelerator, scope: str) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The sum over processes that whitening statistics need under `advantage_whitening="global"` (`None`: this
    process's statistics alone, with `"local"` or a single process)."""
    if scope == "global" and accelerator.num_processes > 1:
        return lambda t: accelerator.reduce(t, "sum")
    return None


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


def _role_optimizer_states(optimizer: torch.optim.Optimizer, role: str) -> tuple[torch.optim.Optimizer, list]:
    """
    The optimizer that holds the per-tensor states (Adam's step and moments) and the state keys of `role`'s
    parameter groups: the parameters themselves for a torch optimizer, the flat fp32 partitions under DeepSpeed ZeRO
    (one per group and rank with ZeRO-1/2, one per sub-group with ZeRO-3).
    """
    from accelerate.optimizer import AcceleratedOptimizer

    while isinstance(optimizer, AcceleratedOptimizer):
        optimizer = optimizer.optimizer
    if hasattr(optimizer, "fp32_partitioned_groups_flat") and hasattr(optimizer, "sub_group_to_group_id"):  # ZeRO-3
        inner = optimizer.optimizer
        groups = {i for i, group in enumerate(inner.param_groups) if group.get("role") == role}
        keys = [
            optimizer.fp32_partitioned_groups_flat[sub]
            for sub, group in optimizer.sub_group_to_group_id.items()
            if group in groups
        ]
        return inner, keys
    if hasattr(optimizer, "single_partition_of_fp32_groups"):  # ZeRO-1/2
        inner = optimizer.optimizer
        keys = [
            optimizer.single_partition_of_fp32_groups[i]
            for i, group in enumerate(inner.param_groups)
            if group.get("role") == role
        ]
        return inner, keys
    keys = [p for group in optimizer.param_groups if group.get("role") == role for p in group["params"]]
    return optimizer, keys


def optimizer_state_summary(optimizer: torch.optim.Optimizer, role: str) -> dict[str, float]:
    """
    How far `role`'s optimizer state has advanced on this process: the largest step count, and the summed absolute
    values of the other state tensors (Adam's moments). All zero for a fresh optimizer.
    """
    inner, keys = _role_optimizer_states(optimizer, role)
    steps, moments, tensors = 0.0, 0.0, 0
    for key in keys:
        for name, value in inner.state.get(key, {}).items():
            tensors += 1
            if name == "step":
                steps = max(steps, float(value))
            elif torch.is_tensor(value):
                moments += float(value.detach().float().abs().sum())
    for group in inner.param_groups:  # optimizers that count steps per group (e.g. FusedAdam)
        if group.get("role") == role and "step" in group:
            steps = max(steps, float(group["step"]))
    return {"steps": steps, "moments": moments, "state_tensors": float(tensors)}


def reset_optimizer_state(optimizer: torch.optim.Optimizer, role: str) -> None:
    """
    Forget `role`'s optimizer state (step counts and moments), so that its next step is the first of a fresh optimizer.

    Value pretraining needs it under DeepSpeed: ZeRO hands the frozen policy's partitions zero gradients, so Adam's
    step count advances (and its moments decay to zero) through pretraining, and the first PPO step would use the bias
    correction of step N + 1 with moments built from one gradient (up to ≈ 3× Adam's usual first step). Without
    DeepSpeed the frozen policy gets no gradient and no state; after this both paths start PPO alike.
    """
    inner, keys = _role_optimizer_states(optimizer, role)
    for key in keys:
        inner.state.pop(key, None)
    for group in inner.param_groups:
        if group.get("role") == role:
            group.pop("step", None)


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

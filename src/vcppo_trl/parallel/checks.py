"""Checks of the launch and of the distributed setup that run before any training time is spent."""

from __future__ import annotations

import os

import torch
from accelerate import Accelerator
from transformers.utils import logging

from .fsdp import check_fsdp2_options, check_fsdp_launch

logger = logging.get_logger(__name__)


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


def check_distributed_setup(
    accelerator: Accelerator,
    *,
    is_deepspeed: bool,
    gradient_accumulation_steps: int,
    activation_checkpointing: bool,
    sequence_parallel_size: int,
) -> bool:
    """Check an FSDP launch ([`~parallel.fsdp.check_fsdp_launch`]) or a DeepSpeed one ([`check_deepspeed_setup`]),
    and log the backend that runs; returns whether the models are sharded with FSDP2. The keywords are the config's
    fields of those names."""
    if is_deepspeed:
        check_deepspeed_setup(accelerator, gradient_accumulation_steps)
        fsdp2 = False
    else:
        fsdp2 = check_fsdp_launch(accelerator)
        if fsdp2:
            check_fsdp2_options(accelerator, activation_checkpointing=activation_checkpointing)
    if accelerator.is_main_process:
        backend = describe_backend(
            accelerator, is_deepspeed=is_deepspeed, fsdp2=fsdp2, sequence_parallel_size=sequence_parallel_size
        )
        logger.warning(f"Training on {backend}.")
        fewer = fewer_processes_than_asked(accelerator.num_processes)
        if fewer:
            logger.warning(fewer)
    return fsdp2


# What MPI launchers set: accelerate's multi-CPU launch through `mpirun` starts its processes that way.
_MPI_WORLD_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")


def fewer_processes_than_asked(num_processes: int, environ: dict[str, str] | None = None) -> str | None:
    """
    The warning to give when `accelerate launch` was asked for several processes and started one, else `None`.

    accelerate's single-process launcher (a launch config with `use_cpu: true` or `distributed_type: NO`, or `--cpu`,
    without an MPI hostfile) ignores `--num_processes`; it then exports the rendezvous address (`MASTER_ADDR`), which
    only a launch of several processes needs, and no `WORLD_SIZE` (torchrun's).
    """
    env = os.environ if environ is None else environ
    launched_by_accelerate = "ACCELERATE_DYNAMO_BACKEND" in env
    asked_for_several = "MASTER_ADDR" in env and "WORLD_SIZE" not in env
    if num_processes > 1 or not (launched_by_accelerate and asked_for_several):
        return None
    if any(name in env for name in _MPI_WORLD_VARIABLES):
        return None
    return (
        "accelerate launch was asked for several processes but started one: its single-process launcher (a config "
        "with use_cpu: true or distributed_type NO, e.g. configs/accelerate/cpu.yaml, or --cpu) ignores "
        "--num_processes. For several CPU processes run `accelerate launch --config_file "
        "configs/accelerate/cpu_ddp.yaml --num_processes 2 train.py ... --use_cpu true`, or `ACCELERATE_USE_CPU=1 "
        "torchrun --standalone --nproc_per_node 2 train.py ...`."
    )


def describe_backend(accelerator: Accelerator, *, is_deepspeed: bool, fsdp2: bool, sequence_parallel_size: int) -> str:
    """The backend that runs, in words: processes, device, DDP / ZeRO stage / FSDP2, sequence-parallel groups."""
    processes = accelerator.num_processes
    if is_deepspeed:
        stage = accelerator.state.deepspeed_plugin.deepspeed_config.get("zero_optimization", {}).get("stage", "?")
        backend = f"DeepSpeed ZeRO-{stage}"
    elif fsdp2:
        backend = "FSDP2"
    else:
        backend = "DDP" if processes > 1 else "one process"
    text = f"{processes} process{'es' if processes > 1 else ''} ({accelerator.device.type}), {backend}"
    if sequence_parallel_size > 1:
        text += f", sequence parallelism in groups of {sequence_parallel_size} (Ulysses)"
    return text


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

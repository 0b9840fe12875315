"""Resuming a [`PPOTrainer`] from a checkpoint: [`resolve_checkpoint`] checks it against this run (converting a
ZeRO-3 checkpoint to a universal one when the number of processes changed) into a [`ResumePoint`];
[`load_checkpoint_weights`] loads the models' weights before they are prepared, and [`restore_training_state`]
everything else: DeepSpeed's or FSDP2's states, optimizer and scheduler, trainer and callback states, the rollouts in
flight ([`load_rollout_pool`]) and the RNG states. Writing checkpoints is `trainer/saving.py`'s.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from transformers import TrainerState
from transformers.integrations.deepspeed import deepspeed_load_checkpoint
from transformers.trainer import SCHEDULER_NAME
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import logging

from ..checkpoint.files import (
    TRAINING_STATE_NAME,
    VALUE_MODEL_DIRNAME,
    CheckpointError,
    check_checkpoint_backend,
    load_weights_into,
    missing_checkpoint_files,
    read_training_state,
    saved_world_size,
)
from ..checkpoint.universal import convert_to_universal, is_converted, load_universal, universal_dir
from ..config.batch_plan import BatchPlan
from ..config.ppo import PPOConfig
from ..parallel import FSDP2_STATES_DIRNAME, load_fsdp2_states, requested_fsdp_version
from ..rollout import RolloutSource
from .saving import rollout_pool_file

logger = logging.get_logger(__name__)

# Restored from a checkpoint's `trainer_state.json` into the running trainer's state.
RESTORED_STATE_FIELDS = (
    "global_step",
    "epoch",
    "log_history",
    "best_metric",
    "best_global_step",
    "best_model_checkpoint",
)


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """A checkpoint checked for resuming this run."""

    path: str
    saved: dict[str, Any]  # its training state (`vcppo_state.json`)
    saved_world: int  # processes that wrote it
    universal: str | None  # ZeRO-3 on another number of processes: the universal checkpoint to load


def resolve_checkpoint(
    resume_from_checkpoint: str | bool | None,
    args: PPOConfig,
    *,
    accelerator: Accelerator,
    is_deepspeed: bool,
    batches: BatchPlan,
    train_rows: int,
) -> ResumePoint | None:
    """
    The checkpoint to resume from (`True`: the latest in `output_dir`), checked against this run: complete, same
    global batch and `num_generations`; a ZeRO-3 checkpoint written by another number of processes is converted to a
    universal one first.
    """
    if not resume_from_checkpoint:
        return None
    batch_size = batches.batch_size
    if resume_from_checkpoint is True:
        found = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
        if found is None:
            raise CheckpointError(
                f"resume_from_checkpoint=True but there is no checkpoint-<step> directory in {args.output_dir}."
            )
        resume_from_checkpoint = found
    checkpoint = str(resume_from_checkpoint)
    if not os.path.isdir(checkpoint):
        raise CheckpointError(f"Cannot resume: {checkpoint} is not a directory.")
    world = accelerator.num_processes
    state_file = os.path.join(checkpoint, TRAINING_STATE_NAME)
    saved = read_training_state(checkpoint) if os.path.isfile(state_file) else None
    saved_world = saved_world_size(checkpoint, saved)
    fsdp2 = requested_fsdp_version(accelerator) == 2
    check_checkpoint_backend(checkpoint, "deepspeed" if is_deepspeed else "fsdp2" if fsdp2 else "ddp")
    missing = missing_checkpoint_files(
        checkpoint,
        saved_world,
        is_deepspeed,
        with_policy=not args.is_critic_job,
        fsdp2=fsdp2,
        with_critic=args.uses_critic,
    )
    if missing:
        raise CheckpointError(
            f"Cannot resume from {checkpoint}: it lacks {', '.join(missing)}. It is incomplete (a save that was "
            "interrupted, or one made with save_only_model=True); resume from an earlier checkpoint."
        )
    if saved["batch_size"] != batch_size:
        local = args.per_device_train_batch_size * args.gradient_accumulation_steps
        raise CheckpointError(
            f"{checkpoint} was saved with {saved['batch_size']} prompts per update (by {saved_world} processes), "
            f"this run has {batch_size} (per_device_train_batch_size × gradient_accumulation_steps × "
            f"num_mini_batches × processes = {args.per_device_train_batch_size} × "
            f"{args.gradient_accumulation_steps} × {args.num_mini_batches} × {world}). Resume with the "
            f"same global batch: with {world} processes, per_device_train_batch_size × gradient_accumulation_steps "
            f"must be {saved['batch_size'] / (args.num_mini_batches * world):g} (now {local})."
        )
    if saved.get("num_generations", 1) != args.num_generations:
        raise CheckpointError(
            f"{checkpoint} was saved with num_generations={saved.get('num_generations', 1)}, this run has "
            f"{args.num_generations}: resume with the same num_generations (the prompt order depends on it)."
        )
    universal = None
    if saved_world != world and is_deepspeed:
        universal = prepare_universal_checkpoint(checkpoint, saved_world, accelerator)
    if saved_world != world:
        logger.warning(
            f"{checkpoint} was saved by {saved_world} processes, this run has {world}: resuming with the same "
            f"global batch of {batch_size} prompts, so the prompt order is that of the saved run; responses "
            "are sampled from other random streams than an uninterrupted run would use."
        )
    if saved["train_rows"] != train_rows:
        logger.warning(
            f"{checkpoint} was saved with {saved['train_rows']} training rows, this run has "
            f"{train_rows}: the data order after resuming differs from an uninterrupted run."
        )
    return ResumePoint(checkpoint, saved, saved_world, universal=universal)


def prepare_universal_checkpoint(checkpoint: str, saved_world: int, accelerator: Accelerator) -> str:
    """
    A ZeRO-3 checkpoint resumed on another number of processes: the main process converts its DeepSpeed states with
    DeepSpeed's `ds_to_universal` into `checkpoint/universal/` (once; atomically, the checkpoint's own files
    untouched), every process learns whether that worked, and the engine is set to load universal checkpoints.
    """
    from accelerate.utils import broadcast_object_list

    world = accelerator.num_processes
    plugin = accelerator.state.deepspeed_plugin
    stage = plugin.zero_stage
    if stage != 3:
        raise CheckpointError(
            f"{checkpoint} was saved by {saved_world} processes and this run has {world}: under DeepSpeed ZeRO-"
            f"{stage} that is not supported (only ZeRO-3 checkpoints resume on another number of processes, through "
            "DeepSpeed's universal checkpoints); resume with the same number of processes."
        )
    error = [None]
    if accelerator.is_main_process:
        try:
            logger.warning(
                f"{checkpoint} was saved by {saved_world} ZeRO-3 processes and this run has {world}: converting "
                f"its DeepSpeed states to a universal checkpoint in {universal_dir(checkpoint)} (DeepSpeed's "
                "ds_to_universal; for a large model run `python -m vcppo_trl.universal_checkpoint` beforehand)."
            )
            convert_to_universal(checkpoint)
        except Exception as exc:  # every process stops with the same message rather than waiting
            error = [f"{type(exc).__name__}: {exc}"]
    if world > 1:
        broadcast_object_list(error, from_process=0)
    if error[0] is not None:
        raise CheckpointError(error[0])
    if not is_converted(checkpoint):
        raise CheckpointError(
            f"Process {accelerator.process_index} does not see the universal checkpoint the main process "
            f"wrote in {universal_dir(checkpoint)}: resuming a ZeRO-3 checkpoint on another number of processes "
            "needs output_dir on a filesystem every node sees, at the same path."
        )
    plugin.deepspeed_config.setdefault("checkpoint", {})["load_universal"] = True
    return checkpoint


def load_engine_states(engine, resume: ResumePoint) -> None:
    """A DeepSpeed engine's partitioned weights and optimizer states, saved by `engine.save_checkpoint` on every
    rank, or the universal checkpoint made for another number of processes (ZeRO-3)."""
    if resume.universal:
        load_universal(engine, resume.universal)
    else:
        deepspeed_load_checkpoint(engine, resume.path)


def load_checkpoint_weights(wrapper: torch.nn.Module, checkpoint: str) -> None:
    """The policy's and the critic's weights, into the models before they are prepared (not under DeepSpeed, whose
    engine loads its own states later)."""
    if wrapper.policy is not None:  # a critic job's checkpoints hold the critic only
        load_weights_into(wrapper.policy, checkpoint)
    if wrapper.critic is not None:  # a group advantage estimator's run has none
        load_weights_into(wrapper.critic, os.path.join(checkpoint, VALUE_MODEL_DIRNAME))


def restore_training_state(trainer, resume: ResumePoint) -> int:
    """
    Everything of a checkpoint but the weights, into a trainer set up for training (`_setup_training` ran): the
    optimizer and scheduler (under DeepSpeed its engine's states), the trainer state and callbacks' states, the
    learner's non-finite count, the subclass's phase, the rollout source's rollouts in flight, and last the RNG
    states. Returns the prompt batches the run had drawn (where its prompt stream continues).
    """
    if trainer.is_deepspeed_enabled:
        load_engine_states(trainer.model_wrapped, resume)
    if trainer.is_fsdp2:  # the shards of the models and of their optimizer, resharded if the world changed
        load_fsdp2_states(trainer.model_wrapped, trainer.optimizer, os.path.join(resume.path, FSDP2_STATES_DIRNAME))
        scheduler = torch.load(os.path.join(resume.path, SCHEDULER_NAME), weights_only=True)
        trainer.lr_scheduler.load_state_dict(scheduler)
    else:
        trainer._load_optimizer_and_scheduler(resume.path)  # under DeepSpeed: the scheduler only
    saved, state, accelerator = resume.saved, trainer.state, trainer.accelerator
    restore_state(state, trainer.callback_handler.callbacks, resume.path, saved=saved)
    trainer.learner.steps.nonfinite_steps_in_a_row = saved["nonfinite_steps_in_a_row"]
    trainer.restore_phase_state(saved)
    pool_batches = load_rollout_pool(
        trainer.rollouts,
        resume.path,
        rank=accelerator.process_index,
        world=accelerator.num_processes,
    )
    state.max_steps = trainer.num_training_updates()  # this run's PPO budget (total_episodes may have changed)
    load_rng_state_elastic(
        trainer._load_rng_state, resume, accelerator=accelerator, seed=trainer.args.seed, global_step=state.global_step
    )
    logger.warning(f"Resumed from {resume.path} at update {state.global_step} of {state.max_steps}.")
    if pool_batches is not None:  # a windowed run: each process drew as many batches as its own pool needed
        return pool_batches
    return saved.get("batches_consumed", state.global_step)


def load_rollout_pool(source: RolloutSource, checkpoint: str, rank: int, world: int = 1) -> int | None:
    """Restore this process's rollouts in flight into the run's rollout source (the in-flight responses of a
    `generation_window` run, the generations a rollout worker ran ahead), so that the run continues them; return the
    prompt batches this process had drawn (a pool refills at its own pace, so the count differs per process; `None`
    when nothing is restored). None saved: the source starts empty; saved but this run's source holds nothing in
    flight: they are dropped, and their prompts are not drawn again. Both say so."""
    path = rollout_pool_file(checkpoint, rank)
    if not source.holds_rollouts_in_flight:
        if os.path.exists(path):
            logger.warning(
                f"{checkpoint} holds rollouts in flight (generation_window or max_staleness); this run has neither, so "
                "they are dropped."
            )
        return None
    saved_ranks = len([name for name in os.listdir(checkpoint) if name.startswith("rollout_pool_")])
    if saved_ranks and saved_ranks != world:
        raise ValueError(
            f"{checkpoint} holds the rollouts in flight of {saved_ranks} processes, and this run "
            f"has {world}: each process continues its own responses, so resume it on {saved_ranks} processes (or "
            "delete the rollout_pool_*.pt files to start the pool empty, dropping those responses)."
        )
    if not os.path.exists(path):
        logger.warning(f"{checkpoint} holds no rollouts in flight: the pool (or the worker's queue) starts empty.")
        return None
    state = torch.load(path, weights_only=False)  # this package's own file: rows are Python objects
    source.load_state_dict(state)
    return state.get("batches_consumed")


def restore_state(state: TrainerState, callbacks: list, checkpoint: str, saved: dict[str, Any]) -> None:
    """The trainer state's counters and log history, and the callbacks' states, from a checkpoint."""
    previous = TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json"))
    for name in RESTORED_STATE_FIELDS:
        setattr(state, name, getattr(previous, name))
    by_name = {type(cb).__name__: cb for cb in callbacks}
    for name, cb_state in saved["callbacks"].items():
        if name in by_name and hasattr(by_name[name], "load_state_dict"):
            by_name[name].load_state_dict(cb_state)
        else:
            logger.warning(f"{checkpoint} holds the state of a {name} that this trainer does not have; ignored.")


def load_rng_state_elastic(
    load_rng_state: Callable[[str], None],
    resume: ResumePoint,
    *,
    accelerator: Accelerator,
    seed: int,
    global_step: int,
) -> None:
    """
    The RNG states of this process. With as many processes as the saved run, process `r` takes the state saved by
    process `r` (transformers' `_load_rng_state`, given as `load_rng_state`). With another number (DDP, or ZeRO-3),
    process `r` takes the state saved by process `r` when there was one, read under the name `_load_rng_state`
    expects for this run's world size; a process the saved run did not have is seeded from `seed`, the update count
    and its rank.
    """
    checkpoint, saved_world = resume.path, resume.saved_world
    world, rank = accelerator.num_processes, accelerator.process_index
    if saved_world == world:
        load_rng_state(checkpoint)
        return
    source = os.path.join(checkpoint, "rng_state.pth" if saved_world == 1 else f"rng_state_{rank}.pth")
    if rank >= saved_world or not os.path.isfile(source):
        set_seed(seed + 1_000_003 * global_step + rank)
        return
    with tempfile.TemporaryDirectory() as view:  # the saved file under this run's expected name
        os.symlink(source, os.path.join(view, "rng_state.pth" if world == 1 else f"rng_state_{rank}.pth"))
        load_rng_state(view)

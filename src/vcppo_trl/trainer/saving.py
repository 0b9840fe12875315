"""Saving, checkpointing and resuming a [`PPOTrainer`]: functions of explicit inputs that the trainer's thin
overrides of transformers' hooks (`_save`, `_save_checkpoint`, `push_to_hub`, ...) call. The file formats themselves
live in `checkpoint/files.py`, the Hub in `checkpoint/hub.py`.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerState
from transformers.integrations.deepspeed import deepspeed_load_checkpoint
from transformers.trainer import SCHEDULER_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint, rotate_checkpoints
from transformers.utils import logging

from ..checkpoint import hub
from ..checkpoint.files import (
    TEMP_PREFIX,
    TRAINING_STATE_NAME,
    VALUE_MODEL_DIRNAME,
    CheckpointError,
    check_checkpoint_backend,
    check_free_space,
    estimate_checkpoint_bytes,
    load_weights_into,
    missing_checkpoint_files,
    publish,
    read_training_state,
    remove_stale_temp_checkpoints,
    saved_world_size,
    write_training_state,
)
from ..checkpoint.universal import convert_to_universal, is_converted, load_universal, universal_dir
from ..config.batch_plan import BatchPlan
from ..config.ppo import PPOConfig
from ..learner.optimizers import split_by_role
from ..models.value_model import save_value_model as write_value_model
from ..parallel import (
    FSDP2_STATES_DIRNAME,
    gathered_state_dict,
    load_fsdp2_states,
    requested_fsdp_version,
    save_fsdp2_states,
)
from ..rollout.sources import RolloutSource
from .console import no_nested_progress_bars

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


# ------------------------------------------------------------------ models


def save_models(
    policy: PreTrainedModel | None,
    critic: PreTrainedModel,
    *,
    tokenizer: PreTrainedTokenizerBase,
    args: PPOConfig,
    output_dir: str,
    state_dict: dict | None,
    write_cards: Callable[[str], None],
) -> None:
    """
    Save the policy (or its adapter) and tokenizer in `output_dir`, the critic in `output_dir/value_model`, the
    training arguments and the model cards. Call on every process: a ZeRO-3 critic is gathered first. Without a
    policy (a critic job) only the critic, the arguments and its card are written.

    Args:
        state_dict: The joint model's full state dict when the caller gathered it (DeepSpeed), else `None`.
        write_cards: Writes the model cards into a saved directory.
    """
    with no_nested_progress_bars():
        policy_sd = split_by_role(state_dict, "policy") if state_dict else None
        critic_sd = split_by_role(state_dict, "value") if state_dict else None
        if state_dict is None:  # FSDP2 shards gathered here, on every process; None: save_pretrained reads them
            policy_sd = None if policy is None else gathered_state_dict(policy)
            critic_sd = gathered_state_dict(critic)
        if not args.should_save:
            return
        os.makedirs(output_dir, exist_ok=True)
        if policy is not None:
            policy.save_pretrained(output_dir, state_dict=policy_sd)
            tokenizer.save_pretrained(output_dir)
        save_critic(
            critic, tokenizer, args, output_dir=os.path.join(output_dir, VALUE_MODEL_DIRNAME), state_dict=critic_sd
        )
        torch.save(args, os.path.join(output_dir, "training_args.bin"))
        write_cards(output_dir)


def save_critic(
    critic: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    args: PPOConfig,
    output_dir: str,
    state_dict: dict | None = None,
) -> None:
    """Save the critic as a standard token-classification checkpoint (with the tokenizer). Call on every process."""
    if state_dict is None:
        state_dict = gathered_state_dict(critic)  # ZeRO-3: a collective; None when nothing is partitioned
    if not args.should_save:
        return
    kwargs = {"state_dict": state_dict} if state_dict else {}
    with no_nested_progress_bars():
        write_value_model(critic, tokenizer, output_dir, **kwargs)


def push_checkpoint(args: PPOConfig, step: int, checkpoint_folder: str) -> None:
    """`hub_strategy` pushes at each save: the policy and the critic of the latest checkpoint, blocking; a failed push
    is logged and training goes on (the checkpoint is on disk). Call on the main process."""
    from transformers.trainer_utils import HubStrategy

    if args.hub_strategy == HubStrategy.END:
        return
    push = {"token": args.hub_token, "private": args.hub_private_repo, "revision": args.hub_revision}
    message = f"Training in progress, step {step}"
    # Training state stays local: optimizer, scheduler, RNG, trainer and resume state, DeepSpeed's own states.
    training_state = [
        "optimizer.*",
        "scheduler.*",
        "rng_state*",
        "trainer_state*",
        "vcppo_state.json",
        "rollout_pool*",
    ]
    training_state += ["global_step*", "latest", "zero_to_fp32.py", "fsdp2_states/*"]
    ignore = hub.POLICY_IGNORE_PATTERNS + training_state
    value_dir = os.path.join(checkpoint_folder, VALUE_MODEL_DIRNAME)
    try:
        hub.push_folder(
            checkpoint_folder,
            hub.policy_repo_id(args),
            what="policy",
            commit_message=message,
            ignore_patterns=ignore,
            **push,
        )
        if os.path.isdir(value_dir):
            hub.push_folder(value_dir, hub.value_repo_id(args), what="critic", commit_message=message, **push)
    except hub.HubPushError as err:
        logger.error(str(err))


# ------------------------------------------------------------- checkpoints


def training_state(
    state: TrainerState,
    *,
    batches: BatchPlan,
    args: PPOConfig,
    train_rows: int,
    phase_state: dict[str, Any],
    nonfinite_steps_in_a_row: int,
    callbacks: list,
    batches_consumed: int | None = None,
) -> dict[str, Any]:
    """What a checkpoint needs beyond weights, optimizer and RNG to resume exactly (`vcppo_state.json`).
    `phase_state`: the trainer's phases as [`~trainer.ppo.PPOTrainer.phase_state`] gives them (VC-PPO's value
    pretraining); `batches_consumed`: prompt batches drawn so far (default one per update; more under dynamic
    sampling)."""
    return {
        "global_step": state.global_step,
        "batches_consumed": state.global_step if batches_consumed is None else batches_consumed,
        "batch_size": batches.batch_size,
        "num_generations": args.num_generations,
        "num_processes": batches.world_size,
        "train_rows": train_rows,
        "num_ppo_updates": batches.num_ppo_updates,
        "nonfinite_steps_in_a_row": nonfinite_steps_in_a_row,
        "callbacks": {type(cb).__name__: cb.state_dict() for cb in callbacks if hasattr(cb, "state_dict")},
    } | phase_state


def rollout_pool_file(checkpoint: str, rank: int) -> str:
    """Where process `rank` keeps its rollouts in flight (its rollout source's `state_dict`) in a checkpoint."""
    return os.path.join(checkpoint, f"rollout_pool_{rank}.pt")


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
    trainer.learner.nonfinite_steps_in_a_row = saved["nonfinite_steps_in_a_row"]
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


def save_trainer_checkpoint(trainer, run_dir: str) -> str:
    """The trainer's `checkpoint-<step>` in `run_dir` ([`write_checkpoint`]): its resume state, and this process's
    rollouts in flight (its rollout source's `state_dict`) with its own prompt-stream position."""
    resume_state = training_state(
        trainer.state,
        batches=trainer.batches,
        args=trainer.args,
        train_rows=len(trainer.train_dataset),
        phase_state=trainer.phase_state(),
        nonfinite_steps_in_a_row=trainer.learner.nonfinite_steps_in_a_row,
        callbacks=trainer.callback_handler.callbacks,
        batches_consumed=trainer.batches_consumed,
    )
    pool, source = None, trainer.rollouts
    if source is not None and source.holds_rollouts_in_flight:
        pool = {"batches_consumed": trainer.batches_consumed} | source.state_dict()
    return write_checkpoint(trainer, run_dir, resume_state, rollout_pool=pool)


def write_checkpoint(
    trainer, run_dir: str, resume_state: dict[str, Any], rollout_pool: dict[str, Any] | None = None
) -> str:
    """
    Write `checkpoint-<step>` atomically: everything goes to `tmp-checkpoint-<step>` first (after a free-space check),
    which is renamed once complete; then old checkpoints are rotated (`save_total_limit`). Call on every process.

    `trainer` gives transformers' writers (`save_model`, `_save_optimizer_and_scheduler`, `_save_rng_state`) and is
    only read; `resume_state` is [`training_state`]'s; `rollout_pool` this process's in-flight responses
    (its rollout source's `state_dict`), written by every process. Returns the checkpoint's path.
    """
    args, accelerator = trainer.args, trainer.accelerator
    name = f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}"
    final_dir, temp_dir = os.path.join(run_dir, name), os.path.join(run_dir, TEMP_PREFIX + name)
    if args.should_save:
        remove_stale_temp_checkpoints(run_dir)
    # Every process checks, so that all of them stop together rather than some waiting at the barrier below.
    check_free_space(run_dir, estimate_checkpoint_bytes(trainer.model, trainer.optimizer))
    accelerator.wait_for_everyone()
    try:
        trainer.save_model(temp_dir, _internal_call=True)
        if not args.save_only_model:
            if trainer.is_fsdp2:  # each process writes its shards; the scheduler is the same on every process
                states = os.path.join(temp_dir, FSDP2_STATES_DIRNAME)
                save_fsdp2_states(trainer.model_wrapped, trainer.optimizer, states)
                if args.should_save:
                    torch.save(trainer.lr_scheduler.state_dict(), os.path.join(temp_dir, SCHEDULER_NAME))
            else:
                trainer._save_optimizer_and_scheduler(temp_dir)
            trainer._save_rng_state(temp_dir)
        if rollout_pool is not None:
            os.makedirs(temp_dir, exist_ok=True)
            torch.save(rollout_pool, rollout_pool_file(temp_dir, accelerator.process_index))
            accelerator.wait_for_everyone()  # every process's pool is in before the marker below
        if args.should_save:
            trainer.state.save_to_json(os.path.join(temp_dir, "trainer_state.json"))
            write_training_state(temp_dir, resume_state)  # written last: marks a whole checkpoint
        accelerator.wait_for_everyone()
        if args.should_save:
            publish(temp_dir, final_dir)
            if args.push_to_hub:
                push_checkpoint(args, trainer.state.global_step, final_dir)
    except BaseException:
        if args.should_save:
            shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    accelerator.wait_for_everyone()
    if args.should_save:
        rotate_checkpoints(
            output_dir=run_dir,
            save_total_limit=args.save_total_limit,
            best_model_checkpoint=trainer.state.best_model_checkpoint,
        )
    return final_dir


def sampler_failure_note(args: PPOConfig, step: int, num_processes: int, save_checkpoint: Callable[[], object]) -> str:
    """
    What to tell the user when the sampler fails mid-run, after saving a checkpoint where that is safe.

    The failure happens before the update's policy step, so the models and optimizer are those of the last finished
    update: a single process (or a server failure, which every process learns of) saves them as `checkpoint-<step>`
    (with `save_checkpoint`) unless that exists. A colocated engine failing on one of several processes saves nothing
    (the others could not join the save); the last complete checkpoint stays as it was.
    """
    path = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
    if os.path.isdir(path):
        return f"The last complete checkpoint, {path}, is intact."
    if step > 0 and (num_processes == 1 or args.vllm_mode == "server"):
        save_checkpoint()
        return f"Saved {path} (after update {step}); resume from it once the sampler works."
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    return f"The last complete checkpoint is {last}." if last else "No checkpoint was saved."


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
        checkpoint, saved_world, is_deepspeed, with_policy=not args.is_critic_job, fsdp2=fsdp2
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
    load_weights_into(wrapper.critic, os.path.join(checkpoint, VALUE_MODEL_DIRNAME))


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

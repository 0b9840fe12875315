"""The batch arithmetic of a run: prompts per process and update, mini-batches, updates, and what is rounded."""

from __future__ import annotations

import dataclasses
import math

from transformers.utils import logging

from .ppo import PPOConfig

logger = logging.get_logger(__name__)


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """TRL's PPO batch arithmetic: sequences and prompts per update, per process and in all, and the run's length."""

    world_size: int
    local_batch_size: int  # sequences this process rolls out per update
    local_mini_batch_size: int  # sequences of this process per optimizer step (the pool's share under windows)
    batch_size: int  # sequences per update, all processes
    local_prompts_per_update: int
    prompts_per_update: int
    num_ppo_updates: int
    total_episodes: int


def plan_batches(args: PPOConfig, world_size: int, train_rows: int, warn: bool = True) -> BatchPlan:
    """The batch arithmetic, checked against the dataset before any training time is spent."""
    local_batch_size = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.num_mini_batches
    batch_size = local_batch_size * world_size
    k = args.num_generations
    if local_batch_size % k:
        raise ValueError(
            f"num_generations={k} must divide the {local_batch_size} sequences each process rolls out per "
            f"update (per_device_train_batch_size × gradient_accumulation_steps × num_mini_batches = "
            f"{args.per_device_train_batch_size} × {args.gradient_accumulation_steps} × {args.num_mini_batches})."
        )
    prompts_per_update = batch_size // k
    if train_rows < prompts_per_update:
        raise ValueError(
            f"One update needs batch_size = per_device_train_batch_size ({args.per_device_train_batch_size}) × "
            f"gradient_accumulation_steps ({args.gradient_accumulation_steps}) × num_mini_batches "
            f"({args.num_mini_batches}) × processes ({world_size}) / num_generations ({k}) = "
            f"{prompts_per_update} prompts, but the train dataset has only {train_rows} rows. "
            "Lower those settings or add data."
        )
    if args.max_steps > 0:  # as in transformers: the number of updates, over num_train_epochs and total_episodes
        num_ppo_updates = args.max_steps
        total_episodes = num_ppo_updates * batch_size
        if args.total_episodes is not None and warn:
            logger.warning(
                f"max_steps={args.max_steps} sets the run's length: total_episodes={args.total_episodes} is not used."
            )
    else:
        total_episodes = args.total_episodes or int(args.num_train_epochs * train_rows * k)
        num_ppo_updates = max(1, math.ceil(total_episodes / batch_size))
        if total_episodes % batch_size and warn:
            logger.warning(
                f"total_episodes={total_episodes} is not a multiple of the {batch_size} "
                f"{'prompts' if k == 1 else 'responses'} per update: "
                f"rounded up to {num_ppo_updates} updates = {num_ppo_updates * batch_size} episodes."
            )
    return BatchPlan(
        world_size=world_size,
        local_batch_size=local_batch_size,
        # Under generation windows an update trains every in-flight response: the pool's rows, in as many steps.
        local_mini_batch_size=(args.rollout_pool_size or local_batch_size) // args.num_mini_batches,
        batch_size=batch_size,
        local_prompts_per_update=local_batch_size // k,
        prompts_per_update=prompts_per_update,
        num_ppo_updates=num_ppo_updates,
        total_episodes=total_episodes,
    )

"""Saving a [`PPOTrainer`]: the policy and the critic ([`save_models`], [`save_critic`]), checkpoints written
atomically with the rollouts in flight of the trainer's rollout source ([`save_trainer_checkpoint`]), the model cards
and what they say of the run ([`run_card`]), the Hub pushes of each checkpoint, of the end of training and of the
value-pretrained critic, and the checkpoint saved when the sampler fails. Functions of explicit
inputs that the trainer's thin overrides of transformers' hooks (`_save`, `_save_checkpoint`, `push_to_hub`, ...)
call. Reading a checkpoint back is `trainer/resuming.py`'s; the file formats live in `checkpoint/files.py`, the Hub in
`checkpoint/hub.py`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import torch
from huggingface_hub import CommitInfo
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerState
from transformers.trainer import SCHEDULER_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint, rotate_checkpoints
from transformers.utils import logging

from ..checkpoint import RunCard, hub
from ..checkpoint.files import (
    TEMP_PREFIX,
    VALUE_MODEL_DIRNAME,
    check_free_space,
    estimate_checkpoint_bytes,
    publish,
    remove_stale_temp_checkpoints,
    write_training_state,
)
from ..config.batch_plan import BatchPlan
from ..config.ppo import PPOConfig
from ..learner.optimizers import split_by_role
from ..models.value_model import save_value_model as write_value_model
from ..parallel import FSDP2_STATES_DIRNAME, gathered_state_dict, save_fsdp2_states
from .console import no_nested_progress_bars

logger = logging.get_logger(__name__)


# ------------------------------------------------------- models, the Hub


def save_models(
    policy: PreTrainedModel | None,
    critic: PreTrainedModel | None,
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
    policy (a critic job) only the critic, the arguments and its card are written; without a critic (a group
    advantage estimator) no `value_model` folder.

    Args:
        state_dict: The joint model's full state dict when the caller gathered it (DeepSpeed), else `None`.
        write_cards: Writes the model cards into a saved directory.
    """
    with no_nested_progress_bars():
        policy_sd = split_by_role(state_dict, "policy") if state_dict else None
        critic_sd = split_by_role(state_dict, "value") if state_dict else None
        if state_dict is None:  # FSDP2 shards gathered here, on every process; None: save_pretrained reads them
            policy_sd = None if policy is None else gathered_state_dict(policy)
            critic_sd = None if critic is None else gathered_state_dict(critic)
        if not args.should_save:
            return
        os.makedirs(output_dir, exist_ok=True)
        if policy is not None:
            policy.save_pretrained(output_dir, state_dict=policy_sd)
            tokenizer.save_pretrained(output_dir)
        if critic is not None:
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
    repos = hub.HubSettings.from_args(args)
    push = {"token": repos.token, "private": repos.private, "revision": repos.revision}
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
            repos.policy_repo,
            what="policy",
            commit_message=message,
            ignore_patterns=ignore,
            **push,
        )
        if os.path.isdir(value_dir):
            hub.push_folder(value_dir, repos.value_repo, what="critic", commit_message=message, **push)
    except hub.HubPushError as err:
        logger.error(str(err))


def push_trainer(
    trainer,
    commit_message: str = "End of training",
    token: str | None = None,
    revision: str | None = None,
    private: bool | None = None,
    dataset_name: str | list[str] | None = None,
    tags: list[str] | None = None,
    **kwargs,
) -> dict[str, CommitInfo] | None:
    """
    The trainer's `push_to_hub`: save the policy and the critic locally (every process), write their model cards, and
    push them to their two repos ([`~checkpoint.hub.push_models`]); `token`, `private` and `revision` default to the
    arguments' `hub_*`.

    Returns:
        `{"policy": CommitInfo, "value": CommitInfo}` on the main process, `None` on the others.
    """
    args = trainer.args
    if args.is_critic_job:
        raise ValueError(
            "A critic job (value_pretrain_only with value_pretrain_dataset) holds no policy to push: "
            "value_pretrain_push=True pushes the pretrained critic when the phase ends."
        )
    token = token if token is not None else args.hub_token
    private = private if private is not None else args.hub_private_repo
    revision = revision if revision is not None else args.hub_revision
    trainer.callback_handler.on_push_begin(args, trainer.state, trainer.control)
    trainer.save_model(_internal_call=True)  # every process (sharded states are gathered)
    if not trainer.is_world_process_zero():
        return None
    write_run_cards(trainer, args.output_dir, dataset_name=dataset_name, tags=tags, pushed=True)
    repos = hub.HubSettings.from_args(args)
    return hub.push_models(
        args.output_dir,
        os.path.join(args.output_dir, VALUE_MODEL_DIRNAME) if args.uses_critic else None,
        policy_repo=repos.policy_repo,
        value_repo=repos.value_repo,
        commit_message=commit_message,
        token=token,
        private=private,
        revision=revision,
    )


def push_pretrained_critic(trainer, folder: str, steps: int) -> CommitInfo | None:
    """`value_pretrain_push`: the critic value-pretrained for `steps` updates (saved in `folder`), with its card, to
    its repo ([`~checkpoint.hub.push_pretrained_critic`]) from the main process; `None` elsewhere or on failure."""
    if not trainer.is_world_process_zero():
        return None
    run = run_card(trainer, pretrain_steps=steps)
    return hub.push_pretrained_critic(folder, run, hub.HubSettings.from_args(trainer.args), steps=steps)


# ------------------------------------------------------------- model cards


def write_run_cards(
    trainer,
    output_dir: str,
    dataset_name: str | list[str] | None = None,
    tags: list[str] | None = None,
    pushed: bool | None = None,
) -> None:
    """The model cards of the run saved in `output_dir` ([`~checkpoint.hub.write_cards`]): the policy's (none in a
    critic job, which saves no policy) and the critic's, linking each other's repo when both are pushed (`pushed`:
    by default when the run pushes, `push_to_hub`)."""
    repos = hub.HubSettings.from_args(trainer.args)
    hub.write_cards(
        output_dir,
        run_card(trainer),
        policy_repo=repos.policy_repo,
        value_repo=repos.value_repo,
        with_policy=not trainer.args.is_critic_job,
        with_critic=trainer.args.uses_critic,
        pushed=trainer.args.push_to_hub if pushed is None else pushed,
        dataset_name=dataset_name,
        tags=tags,
    )


def create_model_card(trainer, dataset_name: str | list[str] | None, tags: str | list[str] | None) -> None:
    """The trainer's `create_model_card`: the run's cards in `output_dir` (the policy's, and the critic's in
    `value_model/` when there is one), from the main process; a `dataset_name` given here is kept for later saves."""
    if not trainer.is_world_process_zero():
        return
    if dataset_name is not None:
        trainer.model_card_dataset_name = dataset_name
    tags = [tags] if isinstance(tags, str) else tags
    os.makedirs(trainer.args.output_dir, exist_ok=True)
    trainer._write_cards(trainer.args.output_dir, tags)


def run_card(trainer, pretrain_steps: int | None = None) -> RunCard:
    """What the trainer's model cards say of its run: where the policy came from, the method and its settings
    ([`training_facts`]), its tags."""
    return RunCard(
        policy_source=policy_source(trainer),
        facts=training_facts(trainer, pretrain_steps=pretrain_steps),
        tags=list(trainer._tag_names),
    )


def policy_source(trainer) -> str | None:
    """The name or path the policy came from (the adapter's base under PEFT); in a critic job, which keeps no policy,
    the one the critic was built beside."""
    policy, _ = trainer.unwrapped_policy_and_critic()
    if policy is None:
        return trainer.initial_policy["name_or_path"] or None
    peft_config = getattr(policy, "peft_config", None)
    if peft_config:
        return getattr(next(iter(peft_config.values())), "base_model_name_or_path", None)
    return getattr(policy.config, "_name_or_path", None)


def training_facts(trainer, pretrain_steps: int | None = None) -> dict[str, Any]:
    """The method and its settings, as the cards state them: one row of their table each."""
    args = trainer.args
    vc = hasattr(args, "lam_actor")
    facts: dict[str, Any] = {"algorithm": getattr(trainer, "_name", "VC-PPO") if vc else "PPO"}
    if not args.uses_critic:
        facts["advantage estimator"] = GROUP_BASELINE_NAMES.get(args.advantage_estimator, args.advantage_estimator)
    elif vc:
        facts["λ_actor (policy advantages)"] = (
            f"1 − 1/({args.lam_actor_length_alpha}·length) per response (VAPO)"
            if args.lam_actor_length_alpha is not None
            else args.lam_actor
        )
        facts["λ_critic (value targets)"] = args.lam_critic
        phase = getattr(
            trainer, "value_pretraining", None
        )  # VCPPOTrainer's; a PPOTrainer given a VCPPOConfig has none
        if pretrain_steps is None and phase is not None:
            pretrain_steps = phase.ended_after  # None until the phase has ended
        if args.value_model_path is not None:
            facts["value pretraining"] = f"critic loaded from {args.value_model_path} (pretrained before this run)"
        elif pretrain_steps is not None:
            facts["value-pretraining steps"] = pretrain_steps
        else:
            facts["value-pretraining steps"] = f"{args.value_pretrain_steps} (configured)"
    else:
        facts["λ (GAE)"] = args.lam
    facts.update(
        {
            "γ": args.gamma,
            "KL coefficient": args.kl_coef,
            "policy learning rate": args.learning_rate,
            "critic learning rate": args.value_learning_rate if args.uses_critic else None,
            "training updates run (value pretraining included)": trainer.state.global_step
            if trainer.state is not None
            else 0,
            "prompts per update": trainer.batches.prompts_per_update,
            "responses per prompt": args.num_generations,
            "sampler": "vLLM" if args.use_vllm else "transformers generate",
            "response length": args.response_length,
        }
    )
    # The policy-loss terms of VAPO and DAPO, stated when they are on.
    if args.cliprange_high is not None and args.cliprange_high != args.cliprange:
        facts["policy clip range (ε_low, ε_high)"] = (args.cliprange, args.cliprange_high)
    optional = {
        "dual-clip c": args.dual_clip_c,
        "positive-example LM loss μ": args.positive_example_lm_coef or None,
        "entropy coefficient": args.entropy_coef or None,
        "overlong buffer (tokens, penalty factor)": (args.overlong_buffer_length, args.overlong_penalty_factor)
        if args.overlong_buffer_length is not None
        else None,
        "truncated responses left out of the policy loss": True if args.mask_truncated_completions else None,
    }
    facts.update({name: value for name, value in optional.items() if value is not None})
    return {name: value for name, value in facts.items() if value is not None}


# How a card names a group baseline (the policy of such a run "was trained without a critic: its advantages are ...").
GROUP_BASELINE_NAMES = {
    "grpo": "TRL GRPO's group-relative baseline (advantage_estimator='grpo')",
    "rloo": "TRL RLOO's leave-one-out baseline (advantage_estimator='rloo')",
}


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


def save_trainer_checkpoint(trainer, run_dir: str) -> str:
    """The trainer's `checkpoint-<step>` in `run_dir` ([`write_checkpoint`]): its resume state, and this process's
    rollouts in flight (its rollout source's `state_dict`) with its own prompt-stream position."""
    resume_state = training_state(
        trainer.state,
        batches=trainer.batches,
        args=trainer.args,
        train_rows=len(trainer.train_dataset),
        phase_state=trainer.phase_state(),
        nonfinite_steps_in_a_row=trainer.learner.steps.nonfinite_steps_in_a_row,
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

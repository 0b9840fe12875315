"""Saving, checkpointing, resuming and pushing: the part of [`PPOTrainer`] that writes and reads runs on disk.

A mixin so that the trainer file keeps the training loop; the file formats themselves live in `checkpointing.py`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import torch
from accelerate.utils import set_seed
from transformers import PreTrainedModel, TrainerState
from transformers.integrations.deepspeed import deepspeed_load_checkpoint
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint, rotate_checkpoints
from transformers.utils import logging

from . import hub
from .checkpointing import (
    TEMP_PREFIX,
    TRAINING_STATE_NAME,
    VALUE_MODEL_DIRNAME,
    CheckpointError,
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
from .distributed import gathered_state_dict
from .generation import SamplerError
from .output import no_nested_progress_bars
from .universal_checkpoint import convert_to_universal, is_converted, load_universal, universal_dir
from .value_model import save_value_model

logger = logging.get_logger(__name__)


def saved_phase(saved: dict[str, Any]) -> tuple[bool, int | None]:
    """
    The value-pretraining phase of a checkpoint's training state: whether it was running, and the updates it ran once
    ended (`None`: it has not ended, or never ran). Checkpoints written before the trainer saved it have
    `policy_frozen`, and a `max_steps` that counted those updates once the phase had ended.
    """
    if "value_pretraining" in saved:
        return saved["value_pretraining"], saved["value_pretrain_updates"]
    if saved["policy_frozen"]:
        return True, None
    return False, (saved["max_steps"] - saved["num_ppo_updates"]) or None


class SavingMixin:
    """Model saving, atomic checkpoints with the state to resume exactly, resuming, and Hub pushes."""

    # ------------------------------------------------------------------ models

    def unwrapped_policy_and_critic(self) -> tuple[PreTrainedModel, PreTrainedModel]:
        wrapper = self.accelerator.unwrap_model(self.model_wrapped)
        return wrapper.policy, wrapper.critic

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Save the policy (or its adapter) and tokenizer in `output_dir`, the critic in `output_dir/value_model`."""
        with no_nested_progress_bars():
            self._save_models(output_dir, state_dict)

    def _save_models(self, output_dir: str | None, state_dict: dict | None) -> None:
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        policy, critic = self.unwrapped_policy_and_critic()
        if state_dict:
            policy_sd = {k[len("policy.") :]: v for k, v in state_dict.items() if k.startswith("policy.")}
            critic_sd = {k[len("critic.") :]: v for k, v in state_dict.items() if k.startswith("critic.")}
        else:
            policy_sd = critic_sd = None
        if not self.args.should_save:
            return
        os.makedirs(output_dir, exist_ok=True)
        policy.save_pretrained(output_dir, state_dict=policy_sd)
        self.processing_class.save_pretrained(output_dir)
        self.save_value_model(os.path.join(output_dir, VALUE_MODEL_DIRNAME), state_dict=critic_sd)
        torch.save(self.args, os.path.join(output_dir, "training_args.bin"))
        hub.write_cards(self, output_dir, dataset_name=getattr(self, "model_card_dataset_name", None))

    def create_model_card(
        self,
        model_name: str | None = None,
        dataset_name: str | list[str] | None = None,
        tags: str | list[str] | None = None,
        **kwargs,
    ) -> None:
        """
        Write this package's model cards in `output_dir`: the policy's `README.md`, and the critic's in `value_model/`.

        The same cards `save_model()` and `push_to_hub()` write (TRL's generic card is not used): role, real base
        model, method and its settings, dataset, framework versions, citations.
        """
        if not self.is_world_process_zero():
            return
        if dataset_name is not None:
            self.model_card_dataset_name = dataset_name
        tags = [tags] if isinstance(tags, str) else tags
        os.makedirs(self.args.output_dir, exist_ok=True)
        hub.write_cards(
            self, self.args.output_dir, dataset_name=getattr(self, "model_card_dataset_name", None), tags=tags
        )

    def save_value_model(self, output_dir: str, state_dict: dict | None = None) -> None:
        """Save the critic as a standard token-classification checkpoint (with the tokenizer). Call on every rank."""
        _, critic = self.unwrapped_policy_and_critic()
        if state_dict is None:
            state_dict = gathered_state_dict(critic)  # ZeRO-3: a collective; None when nothing is partitioned
        if not self.args.should_save:
            return
        kwargs = {"state_dict": state_dict} if state_dict else {}
        with no_nested_progress_bars():
            save_value_model(critic, self.processing_class, output_dir, **kwargs)

    # ------------------------------------------------------------------- Hub

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """Name the policy's repo; repos are created at the first push, so building the trainer needs no network."""
        self.hub_model_id = hub.policy_repo_id(self.args)
        self.push_in_progress = None

    def push_to_hub(
        self,
        commit_message: str | None = "End of training",
        blocking: bool = True,
        token: str | None = None,
        revision: str | None = None,
        private: bool | None = None,
        **kwargs,
    ):
        """
        Save, then push the policy (or its adapter) to `hub_model_id` and the critic to `value_hub_model_id` (default
        `<hub_model_id>-value`), each with a model card. Pushes are blocking.

        Args:
            token, revision, private: Override `hub_token`, `hub_revision` and `hub_private_repo`.
            kwargs: `dataset_name` and `tags` for the model cards.

        Returns:
            `{"policy": CommitInfo, "value": CommitInfo}` on the main process, `None` on the others.

        Raises:
            [`~hub.HubPushError`]: the Hub could not be reached; the local checkpoint in `output_dir` is complete.
        """
        kwargs.pop("model_name", None)
        return hub.push_trainer(
            self, commit_message=commit_message or "Upload", token=token, revision=revision, private=private, **kwargs
        )

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """`hub_strategy` pushes at each save: the policy and the critic of the latest checkpoint, blocking."""
        from transformers.trainer_utils import HubStrategy

        if not self.is_world_process_zero() or self.args.hub_strategy == HubStrategy.END:
            return
        args, step = self.args, self.state.global_step
        push = {"token": args.hub_token, "private": args.hub_private_repo, "revision": args.hub_revision}
        message = f"Training in progress, step {step}"
        # Training state stays local: optimizer, scheduler, RNG, trainer and resume state, DeepSpeed's own states.
        training_state = ["optimizer.*", "scheduler.*", "rng_state*", "trainer_state*", "vcppo_state.json"]
        training_state += ["global_step*", "latest", "zero_to_fp32.py"]
        ignore = hub.POLICY_IGNORE_PATTERNS + training_state
        value_dir = os.path.join(checkpoint_folder, VALUE_MODEL_DIRNAME)
        try:  # a failed periodic push does not stop training: the checkpoint is on disk
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

    def _training_state(self) -> dict[str, Any]:
        """What a checkpoint needs beyond weights, optimizer and RNG to resume exactly (see `vcppo_state.json`)."""
        callbacks = {
            type(cb).__name__: cb.state_dict() for cb in self.callback_handler.callbacks if hasattr(cb, "state_dict")
        }
        return {
            "global_step": self.state.global_step,
            "batches_consumed": self.state.global_step,  # one prompt batch per update
            "batch_size": self.batch_size,
            "num_generations": self.args.num_generations,
            "num_processes": self.accelerator.num_processes,
            "train_rows": len(self.train_dataset),
            "num_ppo_updates": self.num_ppo_updates,
            "value_pretraining": self._value_pretraining,
            "value_pretrain_updates": self._value_pretrain_updates,
            "nonfinite_steps_in_a_row": self.nonfinite_steps_in_a_row,
            "callbacks": callbacks,
        }

    def _save_checkpoint(self, model, trial=None) -> None:
        """
        Write `checkpoint-<step>` atomically: everything goes to `tmp-checkpoint-<step>` first (after a free-space
        check), which is renamed once complete; then old checkpoints are rotated (`save_total_limit`).
        """
        args = self.args
        run_dir = self._get_output_dir(trial=trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        final_dir, temp_dir = os.path.join(run_dir, name), os.path.join(run_dir, TEMP_PREFIX + name)
        if args.should_save:
            remove_stale_temp_checkpoints(run_dir)
        # Every process checks, so that all of them stop together rather than some waiting at the barrier below.
        check_free_space(run_dir, estimate_checkpoint_bytes(self.model, self.optimizer))
        self.accelerator.wait_for_everyone()
        try:
            self.save_model(temp_dir, _internal_call=True)
            if not args.save_only_model:
                self._save_optimizer_and_scheduler(temp_dir)
                self._save_rng_state(temp_dir)
            if args.should_save:
                self.state.save_to_json(os.path.join(temp_dir, "trainer_state.json"))
                write_training_state(temp_dir, self._training_state())  # written last: marks a whole checkpoint
            self.accelerator.wait_for_everyone()
            if args.should_save:
                publish(temp_dir, final_dir)
                if args.push_to_hub:
                    self._push_from_checkpoint(final_dir)
        except BaseException:
            if args.should_save:
                shutil.rmtree(temp_dir, ignore_errors=True)
            raise
        self.accelerator.wait_for_everyone()
        if args.should_save:
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
            )

    def _sampler_failed(self, err: SamplerError) -> SamplerError:
        """
        The error to stop with when the sampler fails mid-run, after saving a checkpoint where that is safe.

        The failure happens before the update's policy step, so the models and optimizer are those of the last
        finished update: a single process (or a server failure, which every process learns of) saves them as
        `checkpoint-<step>` unless that exists. A colocated engine failing on one of several processes saves nothing
        (the others could not join the save); the last complete checkpoint stays as it was.
        """
        step = self.state.global_step
        path = os.path.join(self.args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
        if os.path.isdir(path):
            note = f"The last complete checkpoint, {path}, is intact."
        elif step > 0 and (self.accelerator.num_processes == 1 or self.args.vllm_mode == "server"):
            self._save_checkpoint(self.model, trial=None)
            note = f"Saved {path} (after update {step}); resume from it once the sampler works."
        else:
            last = get_last_checkpoint(self.args.output_dir) if os.path.isdir(self.args.output_dir) else None
            note = f"The last complete checkpoint is {last}." if last else "No checkpoint was saved."
        return SamplerError(f"Sampling failed at update {step + 1}: {err} {note}")

    def _resolve_checkpoint(self, resume_from_checkpoint: str | bool | None) -> str | None:
        if not resume_from_checkpoint:
            return None
        if resume_from_checkpoint is True:
            found = get_last_checkpoint(self.args.output_dir) if os.path.isdir(self.args.output_dir) else None
            if found is None:
                raise CheckpointError(
                    f"resume_from_checkpoint=True but there is no checkpoint-<step> directory in {self.args.output_dir}."
                )
            resume_from_checkpoint = found
        checkpoint = str(resume_from_checkpoint)
        if not os.path.isdir(checkpoint):
            raise CheckpointError(f"Cannot resume: {checkpoint} is not a directory.")
        world = self.accelerator.num_processes
        state_file = os.path.join(checkpoint, TRAINING_STATE_NAME)
        saved = read_training_state(checkpoint) if os.path.isfile(state_file) else None
        saved_world = saved_world_size(checkpoint, saved)
        missing = missing_checkpoint_files(checkpoint, saved_world, self.is_deepspeed_enabled)
        if missing:
            raise CheckpointError(
                f"Cannot resume from {checkpoint}: it lacks {', '.join(missing)}. It is incomplete (a save that was "
                "interrupted, or one made with save_only_model=True); resume from an earlier checkpoint."
            )
        if saved["batch_size"] != self.batch_size:
            local = self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps
            raise CheckpointError(
                f"{checkpoint} was saved with {saved['batch_size']} prompts per update (by {saved_world} processes), "
                f"this run has {self.batch_size} (per_device_train_batch_size × gradient_accumulation_steps × "
                f"num_mini_batches × processes = {self.args.per_device_train_batch_size} × "
                f"{self.args.gradient_accumulation_steps} × {self.args.num_mini_batches} × {world}). Resume with the "
                f"same global batch: with {world} processes, per_device_train_batch_size × gradient_accumulation_steps "
                f"must be {saved['batch_size'] / (self.args.num_mini_batches * world):g} (now {local})."
            )
        if saved.get("num_generations", 1) != self.args.num_generations:
            raise CheckpointError(
                f"{checkpoint} was saved with num_generations={saved.get('num_generations', 1)}, this run has "
                f"{self.args.num_generations}: resume with the same num_generations (the prompt order depends on it)."
            )
        self._universal_checkpoint = None
        if saved_world != world and self.is_deepspeed_enabled:
            self._universal_checkpoint = self._prepare_universal_checkpoint(checkpoint, saved_world)
        if saved_world != world:
            logger.warning(
                f"{checkpoint} was saved by {saved_world} processes, this run has {world}: resuming with the same "
                f"global batch of {self.batch_size} prompts, so the prompt order is that of the saved run; responses "
                "are sampled from other random streams than an uninterrupted run would use."
            )
        self._saved_world_size = saved_world
        if saved["train_rows"] != len(self.train_dataset):
            logger.warning(
                f"{checkpoint} was saved with {saved['train_rows']} training rows, this run has "
                f"{len(self.train_dataset)}: the data order after resuming differs from an uninterrupted run."
            )
        return checkpoint

    def _prepare_universal_checkpoint(self, checkpoint: str, saved_world: int) -> str:
        """
        A ZeRO-3 checkpoint resumed on another number of processes: the main process converts its DeepSpeed states
        with DeepSpeed's `ds_to_universal` into `checkpoint/universal/` (once; atomically, the checkpoint's own files
        untouched), every process learns whether that worked, and the engine is built to load universal checkpoints.
        """
        from accelerate.utils import broadcast_object_list

        world = self.accelerator.num_processes
        plugin = self.accelerator.state.deepspeed_plugin
        stage = plugin.zero_stage
        if stage != 3:
            raise CheckpointError(
                f"{checkpoint} was saved by {saved_world} processes and this run has {world}: under DeepSpeed ZeRO-"
                f"{stage} that is not supported (only ZeRO-3 checkpoints resume on another number of processes, through "
                "DeepSpeed's universal checkpoints); resume with the same number of processes."
            )
        error = [None]
        if self.accelerator.is_main_process:
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
                f"Process {self.accelerator.process_index} does not see the universal checkpoint the main process "
                f"wrote in {universal_dir(checkpoint)}: resuming a ZeRO-3 checkpoint on another number of processes "
                "needs output_dir on a filesystem every node sees, at the same path."
            )
        plugin.deepspeed_config.setdefault("checkpoint", {})["load_universal"] = True
        return checkpoint

    def _load_checkpoint_weights(self, checkpoint: str) -> None:
        """Weights before the models are prepared; under DeepSpeed the engine loads them later (its own states)."""
        if self.is_deepspeed_enabled:
            return
        wrapper = self.model
        load_weights_into(wrapper.policy, checkpoint)
        load_weights_into(wrapper.critic, os.path.join(checkpoint, VALUE_MODEL_DIRNAME))

    def _restore_training_state(self, checkpoint: str) -> None:
        """Optimizer, scheduler, trainer state, callbacks' state, and last the RNG states (nothing draws after)."""
        if self.is_deepspeed_enabled:
            if getattr(self, "_universal_checkpoint", None):  # ZeRO-3 on another number of processes
                load_universal(self.model_wrapped, self._universal_checkpoint)
            else:
                # The engine's partitioned weights and optimizer states, saved by `engine.save_checkpoint` (all ranks).
                deepspeed_load_checkpoint(self.model_wrapped, checkpoint)
        self._load_optimizer_and_scheduler(checkpoint)  # under DeepSpeed: the scheduler only
        saved = read_training_state(checkpoint)
        previous = TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json"))
        for name in (
            "global_step",
            "epoch",
            "log_history",
            "best_metric",
            "best_global_step",
            "best_model_checkpoint",
        ):
            setattr(self.state, name, getattr(previous, name))
        self.nonfinite_steps_in_a_row = saved["nonfinite_steps_in_a_row"]
        by_name = {type(cb).__name__: cb for cb in self.callback_handler.callbacks}
        for name, cb_state in saved["callbacks"].items():
            if name in by_name and hasattr(by_name[name], "load_state_dict"):
                by_name[name].load_state_dict(cb_state)
            else:
                logger.warning(f"{checkpoint} holds the state of a {name} that this trainer does not have; ignored.")
        self._value_pretraining, self._value_pretrain_updates = saved_phase(saved)
        self.state.max_steps = self.num_training_updates()  # this run's PPO budget (total_episodes may have changed)
        self._load_rng_state_elastic(checkpoint)
        logger.warning(f"Resumed from {checkpoint} at update {self.state.global_step} of {self.state.max_steps}.")

    def _load_rng_state_elastic(self, checkpoint: str) -> None:
        """
        The RNG states of this process. With as many processes as the saved run, process `r` takes the state saved
        by process `r` (transformers' `_load_rng_state`). With another number (DDP, or ZeRO-3), process `r` takes the state
        saved by process `r` when there was one, read under the name `_load_rng_state` expects for this run's
        world size; a process the saved run did not have is seeded from `seed`, the update count and its rank.
        """
        saved_world = getattr(self, "_saved_world_size", self.accelerator.num_processes)
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        if saved_world == world:
            self._load_rng_state(checkpoint)
            return
        source = os.path.join(checkpoint, "rng_state.pth" if saved_world == 1 else f"rng_state_{rank}.pth")
        if rank >= saved_world or not os.path.isfile(source):
            set_seed(self.args.seed + 1_000_003 * self.state.global_step + rank)
            return
        with tempfile.TemporaryDirectory() as view:  # the saved file under this run's expected name
            os.symlink(source, os.path.join(view, "rng_state.pth" if world == 1 else f"rng_state_{rank}.pth"))
            self._load_rng_state(view)

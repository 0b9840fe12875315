"""The run: start or resume, then the update loop and its cadence: after each update the callbacks, the logs at
`logging_steps`, the completion printouts, evaluations at `eval_steps`, checkpoints at `save_steps`, and a checkpoint
and a clean stop on SIGTERM or SIGINT. What one update does is `PPOTrainer.training_update`."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any, Protocol

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..sampling.seam import SamplerError
from . import resuming
from . import saving as trainer_saving
from .cadence import is_due
from .completions import CompletionLog
from .preemption import SignalWatcher, agreed_signal, interruption
from .prompts import PromptStream


class LoopTrainer(Protocol):
    """
    What the run reads and calls of its trainer ([`PPOTrainer`] and its subclasses), and nothing else
    (`tests/unit/test_training_loop_seam.py` checks every `trainer.<name>` here against this list).
    """

    # transformers' Trainer: the run's configuration, its state and callbacks, the model, the launch
    args: Any
    state: Any  # TrainerState: global_step, max_steps, epoch, total_flos
    control: Any  # TrainerControl: should_log, should_training_stop
    callback_handler: Any
    model: Any
    accelerator: Any
    is_deepspeed_enabled: bool
    train_dataset: Any
    eval_dataset: Any
    _setup_training: Callable[[], None]  # optimizer, scheduler, state and callbacks for a run
    _save_checkpoint: Callable[..., None]
    log: Callable[[dict[str, float]], None]
    evaluate: Callable[..., Any]
    # The PPO trainer: the prompt plan and stream, the rollout source and its sampler, one update and its hooks
    batches: Any  # BatchPlan
    prompts: Any  # PromptStream, set here
    rollouts: Any  # RolloutSource, set here
    sampler: Any  # the maker's sampler (start time logged)
    data_reports: dict[str, Any]  # the datasets' reports, logged once at a fresh start
    batches_consumed: int
    latest_metrics: dict[str, float]
    last_update: Any  # UpdateRecord, for the completions log
    _update_start: float  # when the running update started (`time/update_s`)
    build_rollout_source: Callable[..., Any]
    training_update: Callable[[], dict[str, float]]
    before_training: Callable[[], None]
    after_update: Callable[[dict[str, float]], None]
    _learning_rate: Callable[[str], float]


def run(trainer: LoopTrainer, resume_from_checkpoint: str | bool | None):
    """`trainer.train()`: see [`PPOTrainer.train`]. Returns the trainer's state."""
    args = trainer.args
    resume = resuming.resolve_checkpoint(
        resume_from_checkpoint,
        args,
        accelerator=trainer.accelerator,
        is_deepspeed=trainer.is_deepspeed_enabled,
        batches=trainer.batches,
        train_rows=len(trainer.train_dataset),
    )
    if resume is not None and not trainer.is_deepspeed_enabled:
        resuming.load_checkpoint_weights(trainer.model, resume.path)
    trainer._setup_training()
    trainer.prompts = PromptStream(  # a fresh state draws from the first batch; a resumed one moves it below
        trainer.train_dataset,
        trainer.batches,
        trainer.accelerator.process_index,
        seed=args.seed,
        num_generations=args.num_generations,
        shuffle=args.shuffle_dataset,
    )
    trainer.rollouts = trainer.build_rollout_source(trainer.prompts.draw)
    if resume is not None:  # optimizer, scheduler, state, callbacks, phase, rollouts in flight, RNG
        trainer.prompts.seek(resuming.restore_training_state(trainer, resume))
    if trainer.sampler is not None:  # it starts from the weights training starts from (resumed ones included)
        trainer.sampler.mark_stale()
    trainer.before_training()
    trainer.control = trainer.callback_handler.on_train_begin(args, trainer.state, trainer.control)
    if trainer.args.use_vllm and trainer.sampler is not None:  # 0: an engine an earlier trainer started, reused
        trainer.log({"time/sampler_start_s": trainer.sampler.start_seconds})
    if resume is None:
        data_metrics = {k: v for name, r in trainer.data_reports.items() for k, v in r.metrics(name).items()}
        if data_metrics:
            trainer.log(data_metrics)
        if args.eval_on_start and trainer.eval_dataset is not None:
            trainer.evaluate()
    start_time = time.time()
    completion_log = CompletionLog.from_trainer(trainer)
    last_phase = None  # whether the last update was value pretraining (VC-PPO's phase): its first PPO update is logged
    with SignalWatcher() as signals, contextlib.ExitStack() as stack:
        stack.callback(lambda: trainer.rollouts.close())  # a worker process stops with training, however it ends
        while trainer.state.global_step < trainer.state.max_steps:
            trainer.control = trainer.callback_handler.on_step_begin(args, trainer.state, trainer.control)
            try:
                metrics = trainer.training_update()
            except SamplerError as err:
                raise sampler_failed(trainer, err) from err
            trainer.state.global_step += 1
            trainer.state.epoch = (
                trainer.batches_consumed * trainer.batches.prompts_per_update / len(trainer.train_dataset)
            )
            metrics["episode"] = trainer.state.global_step * trainer.batches.batch_size
            metrics["lr"] = trainer._learning_rate("policy")
            if trainer.args.uses_critic:
                metrics["value_lr"] = trainer._learning_rate("value")
            metrics["time/update_s"] = time.time() - trainer._update_start
            trainer.latest_metrics = metrics
            trainer.after_update(metrics)
            trainer.control = trainer.callback_handler.call_event(
                "on_step_end", args, trainer.state, trainer.control, metrics=metrics
            )
            phase = any(key.startswith("value_pretrain/") for key in metrics)
            new_phase = last_phase is not None and phase != last_phase
            last_phase = phase
            logged = due(trainer, args.logging_steps, args.logging_strategy) or trainer.control.should_log or new_phase
            if logged:
                trainer.log(dict(metrics))
                trainer.control.should_log = False
            completion_log.after_update(trainer.last_update, trainer.state.global_step, logged=logged)
            if trainer.eval_dataset is not None and due(trainer, args.eval_steps, args.eval_strategy):
                trainer.evaluate()
            saved = due(trainer, args.save_steps, args.save_strategy)
            if saved:
                trainer._save_checkpoint(trainer.model, trial=None)
            signum = agreed_signal(trainer.accelerator, signals.signum)
            if signum is not None:
                if not saved:
                    trainer._save_checkpoint(trainer.model, trial=None)
                path = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}")
                raise interruption(signum, path, trainer.state.global_step)
            if trainer.control.should_training_stop:
                break
    trainer.state.total_flos = 0
    trainer.log({"train_runtime": time.time() - start_time})
    trainer.control = trainer.callback_handler.on_train_end(args, trainer.state, trainer.control)
    return trainer.state


def sampler_failed(trainer: LoopTrainer, err: SamplerError) -> SamplerError:
    """The error to stop with when the sampler fails mid-run (see [`~trainer.saving.sampler_failure_note`])."""
    step, save = trainer.state.global_step, lambda: trainer._save_checkpoint(trainer.model, trial=None)
    note = trainer_saving.sampler_failure_note(
        trainer.args, step, trainer.accelerator.num_processes, save_checkpoint=save
    )
    return SamplerError(f"Sampling failed at update {step + 1}: {err} {note}")


def due(trainer: LoopTrainer, interval: float | int, strategy) -> bool:
    """Whether a cadence (`logging_steps`, `eval_steps`, `save_steps` and their strategy) falls on this update."""
    return is_due(interval, strategy, trainer.state.global_step, max_steps=trainer.state.max_steps)

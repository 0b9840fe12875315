"""Cold-start supervised fine-tuning of the toy policy with TRL's `SFTTrainer` (CPU only, no Hub access)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from datasets import Dataset
from datasets.utils import logging as datasets_logging
from tqdm.auto import tqdm
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    ProgressCallback,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from trl import SFTConfig, SFTTrainer

from .defaults import (
    TOY_SFT_BATCH_SIZE,
    TOY_SFT_EVAL_SIZE,
    TOY_SFT_EVAL_STEPS,
    TOY_SFT_LEARNING_RATE,
    TOY_SFT_STEPS,
    TOY_SFT_TARGET_ACCURACY,
    TOY_SFT_WARMUP_STEPS,
)
from .evaluate import teacher_forced_exact_match

logger = logging.getLogger(__name__)


class TargetAccuracyCallback(TrainerCallback):
    """Stops training once the teacher-forced exact match on a held-out set reaches a target.

    The cold start is meant to leave room for RL: it should stop once the policy solves a fair share of the prompts,
    not when it solves them all. When the accuracy rises suddenly (as it does on the toy task, once the model learns
    to copy digits) that moment varies from run to run, and stopping on a measured accuracy rather than after a fixed
    number of steps makes the starting policy much more reproducible.

    Args:
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]):
            Tokenizer of the model.
        eval_dataset ([`~datasets.Dataset`]):
            Held-out dataset with `prompt` and `completion` columns.
        target_accuracy (`float`):
            Training stops at the first evaluation whose exact match is at least this value.
        eval_steps (`int`):
            Evaluation interval in optimisation steps.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        eval_dataset: Dataset,
        target_accuracy: float,
        eval_steps: int,
    ) -> None:
        self.tokenizer = tokenizer
        self.eval_dataset = eval_dataset
        self.target_accuracy = target_accuracy
        self.eval_steps = eval_steps
        self.history: list[tuple[int, float]] = []
        self.stopped_at_step: int | None = None

    def on_step_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: PreTrainedModel | None = None,
        **kwargs: Any,
    ) -> TrainerControl:
        if model is None or state.global_step % self.eval_steps != 0:
            return control
        exact_match = teacher_forced_exact_match(model, self.tokenizer, self.eval_dataset)["exact_match"]
        self.history.append((state.global_step, exact_match))
        logger.debug(f"Cold start: step {state.global_step}, held-out exact match {exact_match:.3f}")
        if exact_match >= self.target_accuracy:
            logger.info(
                f"Cold start: exact match {exact_match:.3f} >= {self.target_accuracy} at step {state.global_step}, "
                "stopping."
            )
            self.stopped_at_step = state.global_step
            control.should_training_stop = True
        return control

    def on_train_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: PreTrainedModel | None = None,
        **kwargs: Any,
    ) -> TrainerControl:
        # Ended without reaching the target: measure the last step too (unless just measured), so that the accuracy
        # reported (and warned about) is the one the policy starts RL with.
        if self.stopped_at_step is None and model is not None:
            if not self.history or self.history[-1][0] != state.global_step:
                exact_match = teacher_forced_exact_match(model, self.tokenizer, self.eval_dataset)["exact_match"]
                self.history.append((state.global_step, exact_match))
        return control


class ColdStartProgressCallback(ProgressCallback):
    """A progress bar for the cold start with the loss (and held-out exact match) as postfix: no raw log dicts."""

    def __init__(self, target: TargetAccuracyCallback | None = None):
        super().__init__()
        self.target = target
        self.last_loss: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        if self.training_bar is not None:
            self.training_bar.set_description("cold-start SFT")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.training_bar is None or not logs:
            return
        if "loss" in logs:
            self.last_loss = float(logs["loss"])
        postfix = {"loss": f"{self.last_loss:.3g}"} if self.last_loss is not None else {}
        if self.target is not None and self.target.history:
            postfix["exact_match"] = f"{self.target.history[-1][1]:.2f}"
        self.training_bar.set_postfix(postfix)

    def on_train_end(self, args, state, control, **kwargs):
        bar = self.training_bar
        super().on_train_end(args, state, control, **kwargs)
        if bar is not None:
            reached = ""
            if self.target is not None and self.target.history:
                reached = f", held-out exact match {self.target.history[-1][1]:.2f}"
            loss = f", loss {self.last_loss:.3g}" if self.last_loss is not None else ""
            tqdm.write(f"cold-start SFT: {state.global_step} steps{loss}{reached}")


def cold_start_sft(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train_dataset: Dataset,
    output_dir: str,
    max_steps: int = TOY_SFT_STEPS,
    learning_rate: float = TOY_SFT_LEARNING_RATE,
    per_device_train_batch_size: int = TOY_SFT_BATCH_SIZE,
    seed: int = 0,
    report_to: str | list[str] = "none",
    warmup_steps: int = TOY_SFT_WARMUP_STEPS,
    target_accuracy: float | None = TOY_SFT_TARGET_ACCURACY,
    eval_dataset: Dataset | None = None,
    eval_steps: int = TOY_SFT_EVAL_STEPS,
    logging_steps: int = 10,
    callbacks: list[TrainerCallback] | None = None,
    **sft_kwargs: Any,
) -> PreTrainedModel:
    """Fine-tunes `model` on the worked solutions of the toy task (cold start before RL).

    The loss is computed on the completion only. For prompt-completion data that is not conversational,
    [`~trl.SFTTrainer`] appends `tokenizer.eos_token` to every completion that does not already end with it (and the
    character-level toy tokenizer encodes the `"<eos>"` string as the single eos token), so the model learns to stop
    after the boxed answer. Training runs on CPU in float32, without gradient checkpointing and without saving any
    checkpoint to `output_dir`.

    When `target_accuracy` is set, training stops early as soon as the teacher-forced exact match (the fraction of
    held-out prompts for which greedy decoding would reproduce the whole gold completion, a lower bound of the greedy
    accuracy) reaches it, so that the starting policy solves a fair share of the prompts but not all of them.

    Args:
        model ([`~transformers.PreTrainedModel`]):
            Causal language model to fine-tune (trained in place).
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]):
            Tokenizer of the model; must define `eos_token` and `pad_token`.
        train_dataset ([`~datasets.Dataset`]):
            Dataset with `prompt` and `completion` text columns (other columns are ignored).
        output_dir (`str`):
            Output directory of the trainer (logs only; no checkpoint is written).
        max_steps (`int`, *optional*, defaults to `TOY_SFT_STEPS`):
            Number of optimisation steps (upper bound when `target_accuracy` is set).
        learning_rate (`float`, *optional*, defaults to `TOY_SFT_LEARNING_RATE`):
            Peak learning rate (linear warmup then cosine decay over `max_steps`).
        per_device_train_batch_size (`int`, *optional*, defaults to `TOY_SFT_BATCH_SIZE`):
            Batch size.
        seed (`int`, *optional*, defaults to `0`):
            Seed of the data order (and of the held-out split).
        report_to (`str` or `list[str]`, *optional*, defaults to `"none"`):
            Logging integrations (e.g. `"tensorboard"`).
        warmup_steps (`int`, *optional*, defaults to `TOY_SFT_WARMUP_STEPS`):
            Number of linear warmup steps.
        target_accuracy (`float` or `None`, *optional*, defaults to `TOY_SFT_TARGET_ACCURACY`):
            Teacher-forced exact match at which training stops early. `None` trains for `max_steps`.
        eval_dataset ([`~datasets.Dataset`] or `None`, *optional*):
            Held-out dataset (with `prompt` and `completion` columns) for `target_accuracy`. If `None`,
            `TOY_SFT_EVAL_SIZE` examples (at most a quarter of the dataset) are held out of `train_dataset`.
        eval_steps (`int`, *optional*, defaults to `TOY_SFT_EVAL_STEPS`):
            Interval, in steps, of the `target_accuracy` checks.
        logging_steps (`int`, *optional*, defaults to `10`):
            Logging interval in steps.
        callbacks (`list[~transformers.TrainerCallback]` or `None`, *optional*):
            Extra trainer callbacks.
        **sft_kwargs:
            Extra arguments for [`~trl.SFTConfig`], overriding the ones set here.

    Returns:
        [`~transformers.PreTrainedModel`]: The fine-tuned model (the same object as `model`), in eval mode.
    """
    if tokenizer.eos_token is None or tokenizer.pad_token is None:
        raise ValueError("The tokenizer must define both `eos_token` and `pad_token`.")
    callbacks = list(callbacks or [])
    # The target is only checked every `eval_steps` steps: skip it (and keep all the data) for shorter runs.
    if target_accuracy is not None and max_steps >= eval_steps:
        if eval_dataset is None:
            eval_size = min(TOY_SFT_EVAL_SIZE, len(train_dataset) // 4)
            if eval_size > 0:
                split = train_dataset.train_test_split(test_size=eval_size, seed=seed)
                train_dataset, eval_dataset = split["train"], split["test"]
            else:
                logger.warning("Cold start: too few examples to hold some out, ignoring `target_accuracy`.")
        if eval_dataset is not None:
            callbacks.append(TargetAccuracyCallback(tokenizer, eval_dataset, target_accuracy, eval_steps=eval_steps))
    target = next((cb for cb in callbacks if isinstance(cb, TargetAccuracyCallback)), None)
    train_dataset = train_dataset.select_columns(["prompt", "completion"])
    config_kwargs: dict[str, Any] = {
        "output_dir": output_dir,
        "max_steps": max_steps,
        "learning_rate": learning_rate,
        "per_device_train_batch_size": per_device_train_batch_size,
        "seed": seed,
        "report_to": report_to,
        "warmup_steps": warmup_steps,
        "logging_steps": logging_steps,
        "lr_scheduler_type": "cosine",
        "weight_decay": 0.0,
        "completion_only_loss": True,
        "max_length": None,
        "use_cpu": True,
        "bf16": False,
        "fp16": False,
        "save_strategy": "no",
        "dataloader_num_workers": 0,
        "disable_tqdm": False,  # a progress bar (ColdStartProgressCallback), not a dict per logging step
    }
    # Newer transformers renamed `gradient_checkpointing` (which TRL turns on by default) to `activation_checkpointing`.
    checkpointing_field = (
        "activation_checkpointing"
        if "activation_checkpointing" in {f.name for f in dataclasses.fields(SFTConfig)}
        else "gradient_checkpointing"
    )
    config_kwargs[checkpointing_field] = False
    config_kwargs.update(sft_kwargs)
    bars_were_enabled = datasets_logging.is_progress_bar_enabled()
    datasets_logging.disable_progress_bar()  # SFTTrainer's three map() bars over a few hundred rows say nothing
    try:
        trainer = SFTTrainer(
            model=model,
            args=SFTConfig(**config_kwargs),
            train_dataset=train_dataset,
            processing_class=tokenizer,
            callbacks=callbacks,
        )
    finally:
        if bars_were_enabled:
            datasets_logging.enable_progress_bar()
    if not trainer.args.disable_tqdm:
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(ColdStartProgressCallback(target))
    trainer.train()
    if target is not None and target.stopped_at_step is None and target.history:
        _warn_target_missed(target, trainer.state.global_step, trainer.args.max_steps)
    model = trainer.model
    model.config.use_cache = True
    model.eval()
    return model


def _warn_target_missed(target: TargetAccuracyCallback, steps: int, max_steps: int) -> None:
    """Says, loudly, that the cold start ended below its target: RL then starts from a policy that solves too little."""
    step, exact_match = target.history[-1]
    best_step, best = max(target.history, key=lambda item: item[1])
    best_note = f" (best {best:.3f} at step {best_step})" if best > exact_match else ""
    logger.warning(
        f"Cold start ended at step {steps} (step cap {max_steps}) with held-out exact match {exact_match:.3f}"
        f"{best_note}, below its target {target.target_accuracy:.2f}: RL starts from a policy that solves few prompts "
        "and may learn nothing. Give the cold start more steps (train.py: --toy_cold_start_steps; cold_start_sft: "
        "max_steps), another learning rate (--toy_cold_start_learning_rate) or another model shape (--toy_num_heads)."
    )

"""Cold-start supervised fine-tuning of the toy policy with TRL's `SFTTrainer` (CPU only, no Hub access)."""

from __future__ import annotations

from typing import Any

from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from trl import SFTConfig, SFTTrainer

from .defaults import TOY_SFT_BATCH_SIZE, TOY_SFT_LEARNING_RATE, TOY_SFT_STEPS, TOY_SFT_WARMUP_STEPS


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
    logging_steps: int = 10,
    **sft_kwargs: Any,
) -> PreTrainedModel:
    """Fine-tunes `model` on the worked solutions of the toy task (cold start before RL).

    The loss is computed on the completion only. For prompt-completion data that is not conversational,
    [`~trl.SFTTrainer`] appends `tokenizer.eos_token` to every completion that does not already end with it (and the
    character-level toy tokenizer encodes the `"<eos>"` string as the single eos token), so the model learns to stop
    after the boxed answer. Training runs on CPU in float32, without gradient checkpointing and without saving any
    checkpoint to `output_dir`.

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
            Number of optimisation steps.
        learning_rate (`float`, *optional*, defaults to `TOY_SFT_LEARNING_RATE`):
            Peak learning rate (linear warmup then cosine decay).
        per_device_train_batch_size (`int`, *optional*, defaults to `TOY_SFT_BATCH_SIZE`):
            Batch size.
        seed (`int`, *optional*, defaults to `0`):
            Seed of the data order.
        report_to (`str` or `list[str]`, *optional*, defaults to `"none"`):
            Logging integrations (e.g. `"tensorboard"`).
        warmup_steps (`int`, *optional*, defaults to `TOY_SFT_WARMUP_STEPS`):
            Number of linear warmup steps.
        logging_steps (`int`, *optional*, defaults to `10`):
            Logging interval in steps.
        **sft_kwargs:
            Extra arguments for [`~trl.SFTConfig`], overriding the ones set here.

    Returns:
        [`~transformers.PreTrainedModel`]: The fine-tuned model (the same object as `model`), in eval mode.
    """
    if tokenizer.eos_token is None or tokenizer.pad_token is None:
        raise ValueError("The tokenizer must define both `eos_token` and `pad_token`.")
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
        "gradient_checkpointing": False,
        "save_strategy": "no",
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }
    config_kwargs.update(sft_kwargs)
    trainer = SFTTrainer(
        model=model,
        args=SFTConfig(**config_kwargs),
        train_dataset=train_dataset,
        processing_class=tokenizer,
    )
    trainer.train()
    model = trainer.model
    model.config.use_cache = True
    model.eval()
    return model

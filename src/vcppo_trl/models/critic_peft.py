"""PEFT for the critic: LoRA on the backbone with the scalar head trained fully, and loading saved critic adapters.

A LoRA critic is saved as a PEFT adapter directory (`adapter_config.json`, `adapter_model.safetensors` holding the
LoRA weights and the full `score` head, plus the tokenizer). It loads with
`AutoPeftModelForTokenClassification.from_pretrained(path, num_labels=1)` or `PeftModel.from_pretrained(base, path)`
where `base = AutoModelForTokenClassification.from_pretrained(<policy base>, num_labels=1)`, and `value_model_path`
accepts it.
"""

from __future__ import annotations

import os

from transformers import PreTrainedModel
from transformers.utils import is_peft_available

# The heads a token-classification model may use; whichever exists is trained fully (not through LoRA).
VALUE_HEAD_NAMES = ("score", "classifier")


def is_adapter_dir(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "adapter_config.json"))


def value_lora_config(config):
    """
    A `PeftConfig` for the critic from a `PeftConfig` or a dict of `LoraConfig` keyword arguments.

    The task type is token classification and the scalar head (`score` / `classifier`) is added to
    `modules_to_save`, so it is trained and saved in full.
    """
    if not is_peft_available():
        raise ImportError("A LoRA critic needs the `peft` package: pip install peft")
    from peft import LoraConfig, PeftConfig

    if isinstance(config, dict):
        config = LoraConfig(**{"task_type": "TOKEN_CLS", **config})
    if not isinstance(config, PeftConfig):
        raise TypeError(f"`value_peft_config` must be a PeftConfig or a dict, got {type(config).__name__}.")
    if str(getattr(config, "task_type", None) or "") not in ("TOKEN_CLS", "TaskType.TOKEN_CLS"):
        config.task_type = "TOKEN_CLS"
    modules = list(getattr(config, "modules_to_save", None) or [])
    config.modules_to_save = modules + [name for name in VALUE_HEAD_NAMES if name not in modules]
    return config


def wrap_value_model(critic: PreTrainedModel, config) -> PreTrainedModel:
    """Wrap the critic with LoRA (`get_peft_model`); the scalar head stays fully trainable."""
    from peft import get_peft_model

    return get_peft_model(critic, value_lora_config(config))


def load_value_adapter(path: str, **model_init_kwargs) -> PreTrainedModel:
    """Load a saved LoRA critic (trainable) from an adapter directory or Hub repo."""
    if not is_peft_available():
        raise ImportError(f"{path} holds a PEFT adapter: pip install peft to load it.")
    from peft import AutoPeftModelForTokenClassification

    return AutoPeftModelForTokenClassification.from_pretrained(
        path, is_trainable=True, num_labels=1, **model_init_kwargs
    )

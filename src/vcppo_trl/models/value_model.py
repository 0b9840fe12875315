"""The critic: create it from the policy, load it from a checkpoint or a reward model, check it, save it.

A value checkpoint is a standard transformers directory that `AutoModelForTokenClassification.from_pretrained(path)`
loads with `num_labels == 1`: one scalar V(s_t) for every token.
"""

from __future__ import annotations

import os

import torch
from transformers import (
    AutoConfig,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from .packing import PackedRow


def _token_classification_config(config):
    config = config.__class__.from_dict(config.to_dict())
    config.num_labels = 1
    config.architectures = None
    config.id2label = {0: "value"}
    config.label2id = {"value": 0}
    return config


def create_value_model_from_policy(policy: PreTrainedModel, trust_remote_code: bool = False) -> PreTrainedModel:
    """
    Build a critic that shares the policy's architecture and backbone weights, with a fresh scalar head.

    Args:
        policy (`PreTrainedModel`): A causal LM (not wrapped by PEFT).
        trust_remote_code (`bool`): Whether the token-classification class may come from the policy's own code (a
            config whose `auto_map` names `AutoModelForTokenClassification`).

    Returns:
        `PreTrainedModel`: an `AutoModelForTokenClassification` model with `num_labels == 1`, on the policy's device
        and dtype.
    """
    config = _token_classification_config(policy.config)
    try:
        critic = AutoModelForTokenClassification.from_config(config, trust_remote_code=trust_remote_code)
    except ValueError as err:
        raise ValueError(
            f"The policy's architecture ({type(policy).__name__}) has no token-classification variant in transformers, "
            "so a critic cannot be built from it automatically. Pass `value_model=` a token-classification model "
            "(or its path) instead."
        ) from err
    backbone_prefix = critic.base_model_prefix
    policy_backbone = getattr(policy, policy.base_model_prefix, None)
    critic_backbone = getattr(critic, backbone_prefix, None)
    if policy_backbone is None or critic_backbone is None:
        raise ValueError(f"Could not find the backbone ('{backbone_prefix}') of {type(policy).__name__}.")
    from transformers.integrations import is_deepspeed_zero3_enabled

    if is_deepspeed_zero3_enabled() and any(hasattr(p, "ds_id") for p in critic.parameters()):
        # Built under zero.Init, the critic is partitioned: gather both backbones to copy, then re-partition.
        import deepspeed

        params = [p for m in (policy_backbone, critic_backbone) for p in m.parameters() if hasattr(p, "ds_id")]
        with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
            critic_backbone.load_state_dict(policy_backbone.state_dict())
        return critic
    critic_backbone.load_state_dict(policy_backbone.state_dict())
    param = next(policy.parameters())
    return critic.to(device=param.device, dtype=param.dtype)


def as_value_model(model: PreTrainedModel) -> PreTrainedModel:
    """
    Return `model` as a token-classification critic with one output.

    A token-classification model with `num_labels == 1` is returned as is. A sequence-classification model (a reward
    model, to reproduce the paper's PPO baseline whose critic starts from the reward model) is converted: same
    backbone and same scalar `score` head, applied at every token.
    """
    num_labels = getattr(model.config, "num_labels", None)
    if num_labels != 1:
        raise ValueError(
            f"A critic must output one value per token, but the given value model has num_labels={num_labels}. "
            "Use a model with num_labels=1 (e.g. AutoModelForTokenClassification.from_pretrained(path, num_labels=1))."
        )
    if type(model).__name__.endswith("ForTokenClassification"):
        return model
    config = _token_classification_config(model.config)
    critic = AutoModelForTokenClassification.from_config(config)
    missing, unexpected = critic.load_state_dict(model.state_dict(), strict=False)
    if unexpected or [k for k in missing if not k.startswith(("classifier", "score"))]:
        raise ValueError(
            f"Could not convert {type(model).__name__} into a token-classification critic "
            f"(missing weights: {missing[:5]}, unexpected: {unexpected[:5]}). Pass a token-classification model."
        )
    param = next(model.parameters())
    return critic.to(device=param.device, dtype=param.dtype)


def _looks_like_hub_id(name: str) -> bool:
    """`org/name` that is a valid Hub repo id and whose `org` is not a local directory (then it is a local path)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if name.count("/") != 1 or name.startswith((".", "~", "/")) or os.path.isdir(name.split("/")[0]):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def check_value_model_source(name_or_path: str) -> None:
    """
    Fail at once, with the path, when a critic is asked for at a local path that does not exist.

    A string that exists locally is a local checkpoint; one shaped like a Hub repo id (`org/name`, whose `org` is not a
    local directory) is left to the Hub; anything else is a local path that is missing.

    Raises:
        `FileNotFoundError`: "no such directory: <absolute path>", with what to pass instead.
    """
    if os.path.isdir(name_or_path):
        return
    if os.path.exists(name_or_path):
        raise NotADirectoryError(
            f"The value model path {name_or_path!r} is a file: give the directory of a saved critic (with "
            "config.json and model.safetensors), e.g. <output_dir>/value_pretrained."
        )
    if _looks_like_hub_id(name_or_path):
        return
    raise FileNotFoundError(
        f"Value model: no such directory: {os.path.abspath(os.path.expanduser(name_or_path))}. Give the directory a "
        "value-pretraining run wrote (<output_dir>/value_pretrained, or <output_dir>/value_model after training), or a "
        "Hub repo id (org/name)."
    )


def load_value_model(name_or_path: str, **model_init_kwargs) -> PreTrainedModel:
    """
    Load a critic from a value checkpoint, a reward-model checkpoint, or a saved LoRA critic (PEFT adapter directory
    or repo, loaded trainable), by local path or Hub id.

    Raises:
        `FileNotFoundError`: "no such directory: ..." for a local path that does not exist.
        `ValueError`: when the checkpoint has more than one output.
    """
    from .critic_peft import is_adapter_dir, load_value_adapter

    check_value_model_source(name_or_path)
    if is_adapter_dir(name_or_path):
        return load_value_adapter(name_or_path, **model_init_kwargs)
    try:
        config = AutoConfig.from_pretrained(
            name_or_path, trust_remote_code=model_init_kwargs.get("trust_remote_code", False)
        )
    except OSError as err:
        if not _is_adapter_repo(name_or_path):
            if os.path.isdir(name_or_path):
                raise
            raise OSError(
                f"Value model {name_or_path!r}: no such directory: {os.path.abspath(name_or_path)}, and it could not "
                f"be loaded as a Hub repo id either ({str(err).splitlines()[0]})."
            ) from err
        return load_value_adapter(name_or_path, **model_init_kwargs)
    if getattr(config, "num_labels", 1) != 1:
        raise ValueError(
            f"The value checkpoint {name_or_path!r} has num_labels={config.num_labels}; a critic needs exactly one "
            "output per token."
        )
    return AutoModelForTokenClassification.from_pretrained(name_or_path, num_labels=1, **model_init_kwargs)


def _is_adapter_repo(name_or_path: str) -> bool:
    """Whether a Hub repo holds a PEFT adapter (a LoRA critic) rather than a full model."""
    try:
        from peft import PeftConfig

        PeftConfig.from_pretrained(name_or_path)
    except Exception:
        return False
    return True


def check_value_model_matches_policy(
    critic: PreTrainedModel,
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    source: str | None = None,
) -> None:
    """
    Check that the critic reads the same token ids as the policy.

    Raises:
        `ValueError`: naming the mismatch (embedding size, or the tokenizer saved with the checkpoint) and the fix.
    """
    where = f" ({source})" if source else ""
    critic_vocab = critic.get_input_embeddings().num_embeddings
    policy_vocab = policy.get_input_embeddings().num_embeddings
    if critic_vocab != policy_vocab or critic_vocab < len(tokenizer):
        raise ValueError(
            f"The value model{where} has a vocabulary of {critic_vocab} embeddings but the policy has {policy_vocab} "
            f"and its tokenizer {len(tokenizer)} tokens: the critic would read different tokens than the policy "
            "generates. Use a critic trained with the policy's tokenizer (or let the trainer build one from the "
            "policy by passing value_model=None)."
        )
    if source is not None and os.path.isdir(source):
        try:
            saved = AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError):
            return
        if saved.get_vocab() != tokenizer.get_vocab():
            raise ValueError(
                f"The tokenizer saved with the value model{where} differs from the policy's tokenizer. Pretrain the "
                "critic with the policy's tokenizer, or pass value_model=None to build a critic from the policy."
            )


def save_value_model(critic: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, output_dir: str, **kwargs):
    """Save a critic as a standard transformers checkpoint (safetensors) with the tokenizer."""
    os.makedirs(output_dir, exist_ok=True)
    critic.save_pretrained(output_dir, **kwargs)
    if tokenizer is not None:
        tokenizer.save_pretrained(output_dir)


def value_forward(
    critic: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    context_length: int,
) -> torch.Tensor:
    """
    Critic values for the response tokens of `input_ids = [prompt | response]`.

    Returns:
        `torch.Tensor` of shape `[B, T]`: V(s_t) for response token `t`, read at the position just before it (the
        state in which token `t` is chosen).
    """
    output = critic(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    return output.logits[:, context_length - 1 : -1, 0].float()


def packed_value_forward(critic: torch.nn.Module, packed: PackedRow) -> torch.Tensor:
    """[`value_forward`] of a padding-free micro-batch: `[b, w]` values read at the positions that predict each
    response token ([`~models.packing.PackedRow`])."""
    output = critic(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False)
    return output.logits[0, :, 0][packed.predicting].float()

"""Loading what a trainer is built from: policy, tokenizer, stop tokens, critic, reward functions and models.

I/O at the edge of [`PPOTrainer`]: names and paths become models here, and what does not fit raises a clear error.
"""

from __future__ import annotations

from contextlib import contextmanager

from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging

from .value_model import (
    as_value_model,
    check_value_model_matches_policy,
    create_value_model_from_policy,
    load_value_model,
)

logger = logging.get_logger(__name__)


# `model_init_kwargs`' key naming the policy's GGUF file in its folder (transformers' `from_pretrained(gguf_file=)`).
GGUF_FILE = "gguf_file"


def init_kwargs(model_init_kwargs: dict | None, trust_remote_code: bool, *, policy: bool = False) -> dict:
    """Keyword arguments for loading a model by name: `model_init_kwargs` (the config's), with `trust_remote_code`
    (the config's) unless they set it themselves (TRL's precedence). A `gguf_file` names the policy's file: it is
    kept for the policy (`policy=True`) and left out for a critic or reward model loaded from a folder of its own."""
    kwargs = dict(model_init_kwargs or {})
    if not policy:
        kwargs.pop(GGUF_FILE, None)
    if trust_remote_code:
        kwargs.setdefault("trust_remote_code", True)
    return kwargs


def load_policy(
    model: str | PreTrainedModel, *, model_init_kwargs: dict | None, trust_remote_code: bool = False
) -> PreTrainedModel:
    """The policy: `model` itself, or loaded from its name/path with `model_init_kwargs` (the config's); from a GGUF
    file (`model_init_kwargs={"gguf_file": ...}`) as a plain trainable model ([`detach_gguf_quantizer`])."""
    if isinstance(model, str):
        kwargs = init_kwargs(model_init_kwargs, trust_remote_code, policy=True)
        policy = AutoModelForCausalLM.from_pretrained(model, **kwargs)
        if kwargs.get(GGUF_FILE):
            detach_gguf_quantizer(policy, source=f"{model}/{kwargs[GGUF_FILE]}")
        return policy
    if model_init_kwargs:
        logger.warning("`model_init_kwargs` is ignored because `model` is already instantiated.")
    return model


def detach_gguf_quantizer(model: PreTrainedModel, source: str) -> None:
    """
    Make a model transformers loaded from a GGUF file a plain one. transformers dequantizes the GGUF weights to
    floating point but keeps its GGUF quantizer attached, which makes `save_pretrained` refuse the model ("quantized
    with gguf and is not serializable"): the weights are the model, so the quantizer is dropped, and the model trains,
    saves and reloads as any transformers checkpoint (policy and critic alike).

    Raises:
        `ValueError`: a weight is not floating point (blocks kept packed, which transformers may do with the `kernels`
            package installed): such a model cannot train.
    """
    packed = [name for name, p in model.named_parameters() if not p.is_floating_point()]
    if packed:
        raise ValueError(
            f"{source}: {len(packed)} weights were loaded as packed {model.get_parameter(packed[0]).dtype} blocks "
            f"(e.g. {packed[0]}), which cannot be trained. Load the GGUF file dequantized: uninstall the `kernels` "
            "package, or convert the file to a transformers folder first (scripts/fetch_smollm2.py does)."
        )
    model.hf_quantizer = None
    model.is_quantized = False
    model.quantization_method = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def load_tokenizer(
    processing_class, policy: PreTrainedModel, *, trust_remote_code: bool = False, gguf_file: str | None = None
) -> PreTrainedTokenizerBase:
    """The policy's tokenizer (loaded from the policy when not given, from its GGUF file with `gguf_file`), with a pad
    token."""
    tokenizer = processing_class
    if tokenizer is None:
        extra = {GGUF_FILE: gguf_file} if gguf_file else {}
        tokenizer = AutoTokenizer.from_pretrained(
            policy.config._name_or_path, trust_remote_code=trust_remote_code, **extra
        )
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a multimodal processor wraps its tokenizer
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError("The tokenizer has neither a pad nor an EOS token: set `tokenizer.pad_token`.")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def resolve_stop_token_ids(tokenizer: PreTrainedTokenizerBase, *, stop_token_id: int | None) -> list[int]:
    """Token ids that end a response: `stop_token_id` (the config's), else the tokenizer's EOS."""
    if stop_token_id is not None:
        if not 0 <= stop_token_id < len(tokenizer):
            eos = (
                f" (its EOS token {tokenizer.eos_token!r} is id {tokenizer.eos_token_id})"
                if tokenizer.eos_token
                else ""
            )
            raise ValueError(
                f"`stop_token_id` {stop_token_id} is out of range: the tokenizer has a vocabulary of "
                f"{len(tokenizer)} tokens (ids 0 to {len(tokenizer) - 1}){eos}. Set an id inside it, or "
                "`stop_token='eos'`."
            )
        return [stop_token_id]
    if tokenizer.eos_token_id is None:
        raise ValueError("The tokenizer has no EOS token: set `stop_token_id` to the id that ends a response.")
    return [tokenizer.eos_token_id]


def build_critic(
    value_model: str | PreTrainedModel | None,
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    model_init_kwargs: dict | None,
    deepspeed_config,
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """
    The critic: built from the policy, loaded from a path (with `model_init_kwargs`), or converted from a given model;
    checked against the policy. `deepspeed_config`: the DeepSpeed config transformers has registered for the run
    (see [`zero3_init_like`]), or `None`.
    """
    if value_model is None:
        with zero3_init_like(policy, deepspeed_config):
            critic = create_value_model_from_policy(policy, trust_remote_code=trust_remote_code)
    elif isinstance(value_model, str):
        with zero3_init_like(policy, deepspeed_config):
            critic = load_value_model(value_model, **init_kwargs(model_init_kwargs, trust_remote_code))
        check_value_model_matches_policy(critic, policy, tokenizer, source=value_model)
        if not is_zero3_partitioned(critic):
            critic = critic.to(next(policy.parameters()).device)
    else:
        critic = as_value_model(value_model)
        check_value_model_matches_policy(critic, policy, tokenizer)
    if is_zero3_partitioned(critic) != is_zero3_partitioned(policy):
        built, given = ("critic", "policy") if is_zero3_partitioned(critic) else ("policy", "critic")
        raise ValueError(
            f"Under DeepSpeed ZeRO-3 the {built} is partitioned (built under `zero.Init`) and the {given} is not: "
            "DeepSpeed casts only unpartitioned models to its mixed-precision dtype, so the two would train in "
            "different dtypes and its optimizer refuses them. Build both models the same way: pass both as names "
            "or paths (loaded under ZeRO-3), or both as models created before the trainer."
        )
    return critic


def is_zero3_partitioned(model: PreTrainedModel) -> bool:
    """Whether DeepSpeed ZeRO-3 has partitioned the model's parameters (it was built under `zero.Init`)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


@contextmanager
def zero3_init_like(policy: PreTrainedModel, deepspeed_config):
    """
    Build the critic the way the policy was built: under `zero.Init` (partitioned at construction) only if the policy
    was. transformers partitions every model built while a ZeRO-3 config is registered, but a policy created before the
    trainer is not partitioned; DeepSpeed then casts it to bf16/fp16 at `prepare` and leaves a partitioned critic as
    built, and its ZeRO-3 optimizer stops on the mix of dtypes.

    `deepspeed_config` is the run's registered `HfDeepSpeedConfig` (the trainer's `registered_deepspeed_config`),
    set back after the critic is built unpartitioned; `None` leaves transformers' registration as it is.
    """
    from transformers.integrations import (
        is_deepspeed_zero3_enabled,
        set_hf_deepspeed_config,
        unset_hf_deepspeed_config,
    )

    if is_zero3_partitioned(policy) or not is_deepspeed_zero3_enabled() or deepspeed_config is None:
        yield
        return
    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        set_hf_deepspeed_config(deepspeed_config)


def load_reward_funcs(
    reward_funcs, reward_processing_classes, *, model_init_kwargs: dict | None, trust_remote_code: bool = False
):
    """Reward functions and models (loaded by name with `model_init_kwargs`, frozen), each with its tokenizer (`None`
    for functions)."""
    if reward_funcs is None:
        raise ValueError("`reward_funcs` is required: a reward function, a reward model, or a list of them.")
    funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    if not funcs:
        raise ValueError("`reward_funcs` is empty: give at least one reward function or reward model.")
    if reward_processing_classes is None:
        processing = [None] * len(funcs)
    elif isinstance(reward_processing_classes, list):
        processing = list(reward_processing_classes)
    else:
        processing = [reward_processing_classes]
    if len(processing) != len(funcs):
        raise ValueError("`reward_processing_classes` must have one entry per reward function.")
    loaded, tokenizers = [], []
    for func, proc in zip(funcs, processing):
        if isinstance(func, str):
            func = AutoModelForSequenceClassification.from_pretrained(
                func, num_labels=1, **init_kwargs(model_init_kwargs, trust_remote_code)
            )
        if isinstance(func, PreTrainedModel):
            if proc is None:
                proc = AutoTokenizer.from_pretrained(func.config._name_or_path, trust_remote_code=trust_remote_code)
            if proc.pad_token_id is None:
                proc.pad_token = proc.eos_token
            func.eval().requires_grad_(False)
        elif not callable(func):
            raise TypeError(f"Reward function {func!r} is neither callable, a model, nor a model name.")
        loaded.append(func)
        tokenizers.append(proc)
    return loaded, tokenizers

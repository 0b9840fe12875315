"""TRL `GRPOConfig`'s field names here: each one is ours under another name, ours under its own, or refused with why.

A GRPO script that wants a critic changes its import and keeps its config. What `GRPOConfig` adds to
`TrainingArguments` falls in four kinds, each a table below, and a test walks the installed TRL's `GRPOConfig` so that
a field a new TRL release adds is classified before it ships (tests/unit/test_trl_names.py):

- the same name and meaning as ours (`temperature`, `num_generations`, the vLLM fields, ...): `SAME_NAME`;
- another name for one of ours (`max_completion_length` is `response_length`): `ALIASES`, each a field of
  [`PPOConfig`] that `resolve_aliases` moves onto ours (both given with different values: an error naming both);
- the same name with other values (`loss_type="dapo"`): `LOSS_TYPE_ALIASES`, TRL's loss names mapped to the
  aggregation they denote, or refused (`REFUSED_LOSS_TYPES`);
- no meaning here, or not built yet: `REFUSED` (every value refused, with the reason) and `ONLY_VALUE` (accepted only
  at the value that is what this trainer does, a no-op; any other refused with the reason). Neither is a field of the
  config: [`refusal`] says why when the config is built (`PPOConfig.__new__`), as it refuses a misspelt name with the
  closest ones (ours or TRL's).
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
from typing import Any

# The functions of `dataclasses.replace` that read a config's fields to rebuild it (3.13 moved the reads to `_replace`).
_REBUILDERS = frozenset(f.__code__ for f in (dataclasses.replace, getattr(dataclasses, "_replace", None)) if f)

# TRL's name -> ours. Each is a field of PPOConfig (default None) resolved in `_resolve_defaults`, then a live view of
# ours ([`TrlAlias`]).
ALIASES: dict[str, str] = {
    "max_completion_length": "response_length",
    "beta": "kl_coef",
    "epsilon": "cliprange",
    "epsilon_high": "cliprange_high",
    "delta": "dual_clip_c",
    "num_iterations": "num_ppo_epochs",
    "num_generations_eval": "eval_num_generations",
    "vllm_importance_sampling_cap": "vllm_importance_sampling_clip_max",
}

# TRL's fields that are ours under the same name and with the same meaning.
SAME_NAME: frozenset[str] = frozenset(
    {
        "model_init_kwargs",
        "trust_remote_code",
        "shuffle_dataset",
        "chat_template_kwargs",
        "pad_to_multiple_of",
        "max_tool_calling_iterations",
        "disable_dropout",
        "cast_lm_head_to_fp32",
        "num_generations",
        "scale_rewards",  # with advantage_estimator="grpo" (config/ppo.py)
        "ds3_gather_for_generation",
        "temperature",
        "top_p",  # the sampling knobs: sampled and scored alike (docs/trainer.md, "Sampling")
        "top_k",
        "min_p",
        "repetition_penalty",
        "generation_kwargs",  # only the knobs and temperature: GENERATION_KWARGS
        "use_vllm",
        "vllm_mode",
        "vllm_model_impl",
        "vllm_enable_sleep_mode",
        "vllm_server_base_url",
        "vllm_server_host",
        "vllm_server_port",
        "vllm_server_timeout",
        "vllm_group_port",
        "vllm_gpu_memory_utilization",
        "vllm_max_model_length",
        "vllm_tensor_parallel_size",
        "vllm_importance_sampling_correction",
        "vllm_importance_sampling_mode",
        "vllm_importance_sampling_clip_max",
        "vllm_importance_sampling_clip_min",
        "reward_weights",
        "mask_truncated_completions",
        "entropy_coef",
        "log_completions",
        "num_completions_to_print",
        "loss_type",  # with TRL's values mapped: LOSS_TYPE_ALIASES
        "generation_batch_size",  # mapped onto num_mini_batches: PPOConfig._resolve_generation_batches
        "steps_per_generation",
    }
)

# TRL's `loss_type` values -> the aggregation they denote here (config/ppo.py's `loss_type` help).
LOSS_TYPE_ALIASES: dict[str, str] = {
    "dapo": "token_mean",  # tokens of the whole accumulated batch, one weight each
    "bnpo": "token_mean",  # TRL: per local batch; here over the whole mini-batch (all processes), DAPO's count
    "grpo": "seq_mean_token_mean",  # each response's token mean, then the mean over responses
    "dr_grpo": "seq_mean_token_sum_norm",  # token sum / (responses × max_completion_length)
}
REFUSED_LOSS_TYPES: dict[str, str] = {
    name: f"loss_type={name!r} is TRL GRPO's {what}, which this trainer does not implement; use one of "
    "'token_mean' (TRL's 'dapo'), 'seq_mean_token_mean' ('grpo'), 'seq_mean_token_sum', 'seq_mean_token_sum_norm' "
    "('dr_grpo')."
    for name, what in (
        ("cispo", "clipped importance-sampling-weight policy optimisation (MiniMax-M1)"),
        ("sapo", "soft adaptive policy optimisation (a smooth gate in place of the clip)"),
        ("luspo", "length-unbiased sequence policy optimisation"),
        ("vespo", "variance-reduced sequence policy optimisation"),
    )
}

# TRL's fields refused whatever their value, with the reason (and what to use instead).
REFUSED: dict[str, str] = {
    "sapo_temperature_neg": "loss_type='sapo' is not implemented here.",
    "sapo_temperature_pos": "loss_type='sapo' is not implemented here.",
    "vespo_k_pos": "loss_type='vespo' is not implemented here.",
    "vespo_lambda_pos": "loss_type='vespo' is not implemented here.",
    "vespo_k_neg": "loss_type='vespo' is not implemented here.",
    "vespo_lambda_neg": "loss_type='vespo' is not implemented here.",
    "ref_model_mixup_alpha": "syncing the reference with the policy (TR-DPO) is not implemented here.",
    "ref_model_sync_steps": "syncing the reference with the policy (TR-DPO) is not implemented here.",
    "entropy_coef_min": "adaptive entropy control (Skywork-OR1) is not implemented here; entropy_coef is a fixed bonus.",
    "entropy_coef_max": "adaptive entropy control (Skywork-OR1) is not implemented here; entropy_coef is a fixed bonus.",
    "entropy_coef_delta": "adaptive entropy control (Skywork-OR1) is not implemented here; entropy_coef is a fixed "
    "bonus.",
    "entropy_target": "adaptive entropy control (Skywork-OR1) is not implemented here; entropy_coef is a fixed bonus.",
    "log_completions_hub_repo": "completions are logged to the console and the trackers (log_completions); pushing "
    "them to a Hub dataset is not implemented.",
    "transformers_continuous_batching_config": "generation runs through HF `generate` or vLLM "
    "(use_vllm); transformers' continuous batching is not wired in.",
}

# TRL's fields accepted only at the value that is what this trainer does (a no-op); any other value is refused.
ONLY_VALUE: dict[str, tuple[Any, str]] = {
    "cache_implementation": (None, "HF `generate` runs with its default cache here; another is not wired in."),
    "router_aux_loss_coef": (None, "the Mixture-of-Experts load-balancing loss is not added here."),
    "vllm_structured_outputs_regex": (None, "structured outputs are not supported."),
    "importance_sampling_level": (
        "token",
        "the policy ratio is per token here; the sequence-level ratio (GSPO) is not implemented.",
    ),
    "sync_ref_model": (False, "syncing the reference with the policy (TR-DPO) is not implemented here."),
    "top_entropy_quantile": (1.0, "keeping only the highest-entropy tokens in the loss is not implemented here."),
    "use_adaptive_entropy": (False, "adaptive entropy control (Skywork-OR1) is not implemented here."),
    "off_policy_mask_threshold": (None, "off-policy sequence masking is not implemented here."),
    "multi_objective_aggregation": (
        "sum_then_normalize",
        "rewards are summed with reward_weights, then (advantage_estimator='grpo') normalised within the group, as "
        "TRL's default does; 'normalize_then_sum' (GDPO) is not implemented.",
    ),
    "use_bias_correction_kl": (
        True,
        "with advantage_estimator='grpo' the KL loss term is weighted by the policy ratio, as TRL's default does "
        "(with 'gae' and 'rloo' the KL is in the rewards, with no ratio to put on it); False is not implemented.",
    ),
    "log_multimodal": (True, "there is no multimodal content to log (True, TRL's default, changes nothing)."),
    "log_unique_prompts": (False, "every logged completion is logged with its prompt."),
    "use_transformers_continuous_batching": (
        False,
        "generation runs through HF `generate` or vLLM (use_vllm); transformers' continuous batching is not wired in.",
    ),
    "use_transformers_paged": (False, "deprecated in TRL; generation runs through HF `generate` or vLLM."),
}


# The keys `generation_kwargs` may hold: the knobs that shape the sampled distribution and that the trainer scores
# alike (each sets its field of PPOConfig). Any other key would change what is sampled (or how long) unscored.
GENERATION_KWARGS: tuple[str, ...] = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# What to use instead of a few generation keys a GRPO config may carry.
# The fields (TRL's name) whose default here differs from a default `GRPOConfig`'s on a CPU, and why: a GRPO script that
# leaves one unset gets ours. The migration page lists them; tests/unit/test_trl_names.py fails on a difference not
# named here, so a new TRL default is classified before it ships.
DIFFERENT_DEFAULTS: dict[str, str] = {
    "max_completion_length": "53 here (TRL: 512): the embedded toy's length. Set it for your task.",
    "num_generations": (
        "1 here (TRL: 8): a critic needs no group per prompt. Set it to compare at equal prompts, and to at least 2 "
        "with `advantage_estimator='grpo'` or `'rloo'`."
    ),
    "num_generations_eval": "1 here (TRL: None, i.e. `num_generations`): one sample per evaluation prompt.",
    "learning_rate": (
        "3e-6 for the policy here (TRL's GRPO: 1e-6), TRL <= 1.12 PPOConfig's; `value_learning_rate` follows it "
        "unless set."
    ),
    "temperature": (
        "0.7 here (TRL's GRPO: 1.0), TRL <= 1.12 PPOConfig's, so that a PPO script keeps its meaning. Set 1.0 to "
        "sample as GRPO does; every log-probability is of the distribution sampled, whichever."
    ),
    "num_iterations": (
        "`num_ppo_epochs` is 4 here (TRL's GRPO: `num_iterations=1`), TRL <= 1.12 PPOConfig's: PPO reuses each "
        "rollout for several epochs under its clip. Set 1 for GRPO's single pass."
    ),
    "disable_dropout": (
        "True here (TRL's GRPO: False), as TRL <= 1.12's PPO always did: with dropout on, the rollout's log-probs "
        "and values and the update's come from different networks and the first ratio is not 1."
    ),
    "gradient_checkpointing": (
        "follows the hardware here (on with an accelerator, off on a CPU, where it only costs time); TRL's GRPO: "
        "True. `activation_checkpointing`, transformers' newer name, is the same."
    ),
    "activation_checkpointing": "follows the hardware here, as `gradient_checkpointing` (TRL's GRPO: True).",
    "bf16": "follows the hardware here (TRL's GRPO: True, which fails on a CPU without bf16).",
    "loss_type": "'token_mean' here, TRL's 'dapo' under its PPO name: the same aggregation.",
    "steps_per_generation": (
        "None here: `num_mini_batches` (1) decides, which is TRL's default of one rollout per optimizer step's "
        "worth of micro-batches (TRL resolves None to `gradient_accumulation_steps`)."
    ),
    "generation_batch_size": (
        "None here: `per_device_train_batch_size` x processes x `gradient_accumulation_steps` x `num_mini_batches` "
        "sequences per rollout (TRL resolves it to the same product with its steps_per_generation)."
    ),
    "remove_unused_columns": (
        "True here, transformers' default (TRL's GRPO: False); not read by this trainer, which passes every dataset "
        "column to the reward functions as TRL does."
    ),
    "vllm_importance_sampling_cap": (
        "TRL's deprecated name (None) of `vllm_importance_sampling_clip_max`, 3.0 in both."
    ),
}

_GENERATION_KWARG_INSTEAD = {
    "max_new_tokens": "set response_length (TRL's max_completion_length)",
    "max_tokens": "set response_length (TRL's max_completion_length)",
    "max_length": "set max_prompt_length and response_length",
    "eos_token_id": "set stop_token_id",
    "stop_token_ids": "set stop_token_id",
    "do_sample": "rollouts always sample; greedy decoding is evaluation's (eval_num_generations=1)",
    "num_return_sequences": "set num_generations",
    "n": "set num_generations",
}


def generation_kwarg_refusal(key: str) -> str:
    """Why `generation_kwargs` may not hold `key` here."""
    reason = (
        "the trainer's log-probabilities (old, learner's, reference's, the vLLM correction's) would not score what it "
        "changes, so the policy-gradient ratio would no longer be that of the sampled distribution"
    )
    instead = _GENERATION_KWARG_INSTEAD.get(key)
    return f"{reason}; {instead}" if instead else reason


class TrlAlias:
    """
    A TRL name of one of our fields, on the config class (a data descriptor over the dataclass field of that name).
    Before the config resolves TRL's names it holds what was given (None by default), for `_resolve_trl_names` to
    move onto ours; after, it is a live view of ours: `args.max_completion_length` reads `args.response_length` and
    setting it sets ours, so that user code written for `GRPOConfig` reads and writes what it expects.
    `dataclasses.replace` changes ours' name (`replace(args, response_length=64)`); given TRL's name, it also passes
    ours' old value, and the two are refused as a conflict.
    """

    RESOLVED = "_trl_names_resolved"  # the instance's flag, set once its TRL names are moved onto ours

    def __init__(self, ours: str):
        self.ours = ours

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return None  # the field's default, as the dataclass and argument parsers read it
        if obj.__dict__.get(self.RESOLVED):
            if sys._getframe(1).f_code in _REBUILDERS:
                # `dataclasses.replace(config, response_length=...)` reads every field to rebuild the config: the TRL
                # name must not carry ours' old value beside the new one (a conflict); ours carries the setting.
                return None
            return getattr(obj, self.ours)
        return obj.__dict__.get("_trl_given", {}).get(self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        if obj.__dict__.get(self.RESOLVED):
            setattr(obj, self.ours, value)
        else:
            obj.__dict__.setdefault("_trl_given", {})[self.name] = value


def install_aliases(config_class: type) -> None:
    """Put a [`TrlAlias`] on `config_class` for each TRL name of `ALIASES` (after the dataclass is built: the fields
    keep their default None)."""
    for trl_name, ours in ALIASES.items():
        alias = TrlAlias(ours)
        alias.__set_name__(config_class, trl_name)
        setattr(config_class, trl_name, alias)


def answer(name: str) -> str:
    """How a TRL `GRPOConfig` field is answered here, in words (the migration page and the tests read it)."""
    if name in ALIASES:
        return f"ours under the name `{ALIASES[name]}`"
    if name in SAME_NAME:
        return "the same name and meaning"
    if name in REFUSED:
        return f"refused: {REFUSED[name]}"
    if name in ONLY_VALUE:
        value, reason = ONLY_VALUE[name]
        return f"only {value!r}, which changes nothing here; other values refused: {reason}"
    raise KeyError(name)


def refusal(config_class: type, name: str, value: Any) -> str | None:
    """
    Why the keyword `name=value` cannot build `config_class` (None: it can): a TRL field with no meaning here, by name
    and with the reason; a value of an `ONLY_VALUE` field other than its one value; any other unknown name, with the
    closest names (ours or TRL's).
    """

    fields = {f.name for f in dataclasses.fields(config_class) if f.init}
    if name in fields:
        return None
    if name in REFUSED:
        return f"`{name}` (a TRL GRPOConfig field) has no meaning in {config_class.__name__}: {REFUSED[name]}"
    if name in ONLY_VALUE:
        accepted, reason = ONLY_VALUE[name]
        if value == accepted:
            return None
        return (
            f"`{name}={value!r}` (a TRL GRPOConfig field) is refused by {config_class.__name__}: {reason} "
            f"Remove it, or set it to {accepted!r}."
        )
    known = sorted(fields | set(ALIASES) | set(REFUSED) | set(ONLY_VALUE))
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.75)
    hint = f" Did you mean {' or '.join(f'`{c}`' for c in close)}?" if close else ""
    return f"{config_class.__name__} has no field `{name}`.{hint} (docs/migrating_from_grpo.md lists TRL's names.)"

"""The sections of [`~config.ppo.PPOConfig`], as its source declares them (one comment header each), by the first field
of each: `--help` groups the options by them and a test checks that every field falls in one. A field added to a
section needs nothing here; a new section needs its title and first field below."""

from __future__ import annotations

from dataclasses import fields

# (title shown in --help, the section's first field in PPOConfig's declaration order)
SECTIONS: tuple[tuple[str, str], ...] = (
    ("Models (policy, critic and reference)", "model_init_kwargs"),
    ("Data preprocessing", "dataset_num_proc"),
    ("Rollouts (batch sizes and sampling)", "num_generations"),
    ("Micro-batches and parallelism", "max_tokens_per_micro_batch"),
    ("Asynchrony (generation windows, a rollout worker running ahead)", "generation_window"),
    ("Generation with vLLM (TRL GRPO's names)", "use_vllm"),
    ("The vLLM server (vllm_mode='server')", "vllm_server_base_url"),
    ("The colocated vLLM engine (vllm_mode='colocate')", "vllm_gpu_memory_utilization"),
    ("Rewards", "reward_weights"),
    ("Tools and environments", "max_tool_calling_iterations"),
    ("Training (advantages and the policy loss)", "advantage_estimator"),
    ("Critic (value model)", "value_learning_rate"),
    ("Evaluation", "eval_num_generations"),
    ("Logging and diagnostics", "exp_name"),
    ("Pushing to the Hub", "value_hub_model_id"),
    ("TRL GRPOConfig's names (each a live view of the field it names)", "max_completion_length"),
)


LEADING_TITLE = "TrainingArguments' fields with other defaults"

# VCPPOConfig's own fields, after PPOConfig's
VCPPO_SECTIONS: tuple[tuple[str, str], ...] = (
    ("dual-λ GAE", "lam_actor"),
    ("value pretraining", "value_pretrain_steps"),
)


def config_sections(
    config_class: type, skip: set[str], sections: tuple[tuple[str, str], ...] = SECTIONS
) -> list[tuple[str, list[str]]]:
    """`config_class`'s fields by section (`sections`: titles and first fields), in declaration order, leaving out
    `skip` (e.g. the fields it shares with TrainingArguments, which keep their place there). Fields declared before the
    first section (TrainingArguments' fields given other defaults, e.g. `activation_checkpointing`, which older
    transformers do not declare, so that `skip` misses it) lead, under `LEADING_TITLE`."""
    names = [f.name for f in fields(config_class) if f.name not in skip]
    starts = {first: title for title, first in sections}
    missing = [first for first in starts if first not in names]
    if missing:
        raise ValueError(f"config/sections.py names fields that {config_class.__name__} does not have: {missing}")
    grouped: list[tuple[str, list[str]]] = []
    for name in names:
        if name in starts:
            grouped.append((starts[name], []))
        elif not grouped:
            grouped.append((LEADING_TITLE, []))
        grouped[-1][1].append(name)
    return grouped

"""`train.py`'s own options, parsed beside the trainer's config and TRL's `ModelConfig`: the dataset and its columns,
the reward functions, the embedded toy's settings, the store-rollouts job and the tools ([`VCPPOScriptArguments`]);
and the trainer they choose (`--trainer`), read before parsing."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from trl import ScriptArguments

from ..config import VAPOConfig, VCPPOConfig
from ..trainer import VAPOTrainer, VCPPOTrainer

# `--trainer` (or `trainer:` in the --config YAML): the trainer and the config whose defaults the options start from.
TRAINERS: dict[str, tuple[type[VCPPOTrainer], type[VCPPOConfig]]] = {
    "vcppo": (VCPPOTrainer, VCPPOConfig),
    "vapo": (VAPOTrainer, VAPOConfig),
}


@dataclass
class VCPPOScriptArguments(ScriptArguments):
    """Script arguments: the dataset, its columns, the reward functions, and the embedded toy's settings."""

    trainer: str = field(
        default="vcppo",
        metadata={
            "help": "Trainer: 'vcppo' (VCPPOTrainer, VCPPOConfig's defaults) or 'vapo' (VAPOTrainer: VAPOConfig's "
            "defaults, arXiv 2504.05118). Options and the --config YAML override the chosen defaults.",
            "choices": list(TRAINERS),
        },
    )
    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Dataset name or path, or reasoning_gym:<task> (a reasoning-gym task, built here; with "
            "--reward_funcs reasoning_gym; its settings as JSON in --dataset_config). Leave unset (with no model) "
            "for the embedded toy task."
        },
    )
    prompt_column: str = field(default="prompt", metadata={"help": "Column holding the prompt."})
    solution_column: str | None = field(
        default="solution", metadata={"help": "Column holding the gold answer, passed to rewards as `solution`."}
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["math_verify"],
        metadata={"help": "Reward functions: built-in names (math_verify, think_format, accuracy) or dotted paths."},
    )
    conversational: bool = field(
        default=False, metadata={"help": "Wrap text prompts as a user message (uses the tokenizer's chat template)."}
    )
    system_prompt: str | None = field(default=None, metadata={"help": "System message added to chat prompts."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep at most this many train rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep at most this many eval rows."})
    toy_num_train: int | None = field(default=None, metadata={"help": "Toy task: training prompts (default 4000)."})
    toy_num_eval: int | None = field(default=None, metadata={"help": "Toy task: held-out prompts (default 300)."})
    toy_min_digits: int | None = field(default=None, metadata={"help": "Toy task: fewest digits per operand (1)."})
    toy_max_digits: int | None = field(default=None, metadata={"help": "Toy task: most digits per operand (6)."})
    toy_cold_start_steps: int | None = field(
        default=None, metadata={"help": "Toy task: cold-start SFT steps (default: the tuned toy default)."}
    )
    toy_cold_start_learning_rate: float | None = field(
        default=None, metadata={"help": "Toy task: cold-start SFT learning rate (default: the tuned toy default)."}
    )
    store_rollouts: str | None = field(
        default=None,
        metadata={
            "help": "Store-rollouts job instead of training: sample the initial policy on the prompt batches value "
            "pretraining would draw, score them, and write them as a dataset to this folder (rerun the same command "
            "to complete an interrupted job). See docs/critic_pretraining.md."
        },
    )
    store_rollouts_batches: int | None = field(
        default=None,
        metadata={"help": "Store-rollouts job: prompt batches to store (default: value_pretrain_steps)."},
    )
    store_rollouts_push_to_hub: str | None = field(
        default=None,
        metadata={"help": "Store-rollouts job: also upload the folder to this Hub dataset repo (e.g. user/name)."},
    )
    toy_num_heads: int | None = field(
        default=None,
        metadata={
            "help": "Toy model: attention heads (default 4, heads 24 wide). vLLM's CPU backend needs heads at least 32 "
            "wide: 3 heads (configs/recipes/tiny_cpu_vllm.yaml)."
        },
    )
    toy_task: str = field(
        default="arithmetic",
        metadata={
            "help": "Toy task: 'arithmetic' (text prompts), 'tool_use' (an `add` tool to call) or 'pointer_chase'.",
            "choices": ["arithmetic", "tool_use", "pointer_chase"],
        },
    )
    toy_hops: int | None = field(default=None, metadata={"help": "Pointer-chase toy: hops per response, K (8)."})
    toy_filler: int | None = field(default=None, metadata={"help": "Pointer-chase toy: dots after each hop (0)."})
    toy_tables: int | None = field(default=None, metadata={"help": "Pointer-chase toy: a pool of M tables (fresh)."})
    tools: list[str] = field(
        default_factory=list,
        metadata={"help": "Tools for the policy: import paths `package.module:name` of functions, sync or async."},
    )
    python_tool: bool = field(default=False, metadata={"help": "Add vcppo_trl.python_tool(): a code interpreter."})
    python_tool_timeout: float = field(default=10.0, metadata={"help": "python_tool: seconds per call."})
    python_tool_memory_mb: int = field(default=512, metadata={"help": "python_tool: memory per call (0: no limit)."})


def chosen_trainer(argv: list[str] | None) -> str:
    """The `--trainer` of the command line, else the `trainer:` of the --config YAML, else "vcppo" (read before
    parsing: the trainer decides which config's defaults the parser starts from)."""
    import yaml

    argv = list(sys.argv[1:] if argv is None else argv)
    name, config = None, None
    for i, arg in enumerate(argv):
        for flag in ("--trainer", "--config"):
            if arg == flag and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
            else:
                continue
            if flag == "--trainer":
                name = value
            else:
                config = value
    if name is None and config is not None and os.path.isfile(config):
        with open(config) as f:
            name = (yaml.safe_load(f) or {}).get("trainer")
    name = name or "vcppo"
    if name not in TRAINERS:
        raise ValueError(f"--trainer must be one of {', '.join(TRAINERS)}; got {name!r}.")
    return name

"""The training script behind `train.py`: TRL-style arguments, data and model loading, then VCPPOTrainer.

`accelerate launch train.py --config configs/recipes/<recipe>.yaml` for a real model; with no model the embedded toy
task runs end to end on a CPU (tiny model built in-process, cold-start SFT, value pretraining, VC-PPO) and prints a
before/after table.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field

from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import ModelConfig, ScriptArguments, TrlParser
from trl.trainer.utils import get_peft_config, get_quantization_config

from .config.trl_names import ALIASES
from .config.vapo import VAPOConfig
from .config.vcppo import VCPPOConfig
from .models.value_model import check_value_model_source
from .parallel.checks import check_launch_environment
from .rewards.registry import resolve_reward_funcs
from .script_datasets import load_datasets
from .trainer.preemption import TrainingInterrupted
from .trainer.store_job import store_rollouts
from .trainer.vapo import VAPOTrainer
from .trainer.vcppo import VCPPOTrainer

logger = logging.getLogger(__name__)

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


def resolve_tools(script_args: VCPPOScriptArguments, toy: bool) -> list:
    """`--tools` as functions, then `python_tool()` with `--python_tool`; on the toy, its tools ([`~toy.toy_tools`]).
    Stops here if wrong."""
    from .rewards.registry import _import_dotted
    from .rollout import python_tool
    from .toy import toy_tools

    tools = []
    for spec in script_args.tools:
        try:
            tool = _import_dotted(spec)
        except (ImportError, AttributeError) as error:
            raise ValueError(f"--tools {spec!r} does not import ({error}): give `package.module:name`.") from error
        if isinstance(tool, type) or not callable(tool):
            kind = "a class" if isinstance(tool, type) else f"an object of type {type(tool).__name__}"
            raise ValueError(f"--tools {spec!r} is {kind}, not a function (sync or async).")
        tools.append(tool)
    if script_args.python_tool:
        memory_mb = script_args.python_tool_memory_mb or None
        tools.append(python_tool(timeout=script_args.python_tool_timeout, memory_mb=memory_mb))
    return toy_tools(tools, script_args.toy_task) if toy else tools


def load_model_and_tokenizer(model_args: ModelConfig, trust_remote_code: bool = False):
    # `trust_remote_code` is the trainer config's (TRL 1.16's ModelConfig no longer has it).
    kwargs = {
        "revision": model_args.model_revision,
        "trust_remote_code": trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
    }
    quantization_config = get_quantization_config(model_args)
    if quantization_config is not None:
        kwargs["quantization_config"] = quantization_config
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path,
        revision=model_args.model_revision,
        trust_remote_code=trust_remote_code,
    )
    return model, tokenizer


def format_results_table(rows: list[tuple[str, dict]]) -> str:
    """A plain-text table of held-out accuracy and response length at each stage."""
    lines = [f"{'stage':<22}{'held-out accuracy':>20}{'mean response length':>24}"]
    for stage, metrics in rows:
        acc = metrics.get("eval_accuracy", float("nan"))
        length = metrics.get("eval_response_length_mean", float("nan"))
        lines.append(f"{stage:<22}{acc:>20.3f}{length:>24.1f}")
    return "\n".join(lines)


HELP_USAGE = (
    "python train.py [--config configs/recipes/<recipe>.yaml] [--<option> VALUE ...]\n"
    "       accelerate launch --config_file configs/accelerate/<setup>.yaml train.py --config ... (GPUs)"
)
HELP_DESCRIPTION = (
    "Train a policy with VC-PPO (arXiv 2503.01491), or VAPO (arXiv 2504.05118) with --trainer vapo. With neither "
    "--config nor --model_name_or_path the embedded toy recipe (configs/recipes/tiny_cpu.yaml) runs on a CPU. Every "
    "option below can also be set in the --config YAML; the defaults shown are the trainer's config's own "
    "(VCPPOConfig, or VAPOConfig with --trainer vapo; a recipe overrides them). VC-PPO and PPO options come first."
)


def _help_groups() -> list[tuple[str, list[str]]]:
    """Option groups of `--help`, in the order shown: what this package adds first, by the config's sections
    ([`~config.sections`]), transformers' arguments last."""
    from dataclasses import fields

    from trl.trainer.base_config import _BaseConfig

    from .config.ppo import PPOConfig
    from .config.sections import VCPPO_SECTIONS, config_sections

    ppo_names = {f.name for f in fields(PPOConfig)}
    base_names = {f.name for f in fields(_BaseConfig)}
    script = [f.name for f in fields(VCPPOScriptArguments)]
    sections = config_sections(PPOConfig, skip=base_names)
    ppo = [name for _, names in sections for name in names]
    tools = [name for name in script + ppo if "tool" in name] + ["action_mask_mode"]  # --tools, --python_tool...
    optimizer = ["learning_rate", "lr_scheduler_type", "warmup_steps"]  # TrainingArguments' that most runs set
    groups = [
        (f"VC-PPO (VCPPOConfig): {title}", names)
        for title, names in config_sections(VCPPOConfig, skip=ppo_names, sections=VCPPO_SECTIONS)
    ]
    for title, names in sections:
        names = optimizer + names if title.startswith("Training") else names
        if not title.startswith("Tools"):  # the tools' group comes with the script's --tools, below
            groups.append((f"PPO (PPOConfig): {title}", [name for name in names if name not in tools]))
    groups += [
        ("Data, reward functions and the embedded toy", [name for name in script if name not in tools]),
        ("Tools (TRL's tools=, docs/tools_and_environments.md)", tools),
        (
            "Model (TRL ModelConfig: --model_name_or_path, LoRA with --use_peft, quantization)",
            [f.name for f in fields(ModelConfig)],
        ),
    ]
    return groups


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


def build_parser(config_class: type[VCPPOConfig] = VCPPOConfig) -> TrlParser:
    """TRL's parser for (script arguments, the trainer's config, ModelConfig), with a short usage and grouped `--help`."""
    parser = TrlParser(
        (VCPPOScriptArguments, config_class, ModelConfig),
        usage=HELP_USAGE,
        description=HELP_DESCRIPTION,
        allow_abbrev=False,  # `--value_pretrain_step 3` must not silently set value_pretrain_steps
    )
    # argparse lists options group by group: move each option (and its --no_ twin) into its group, then order the
    # groups so that VC-PPO/PPO come first and the ~200 transformers TrainingArguments last.
    default_group = next(g for g in parser._action_groups if g._group_actions and g.title != "positional arguments")
    order = []
    for title, names in _help_groups():
        group = parser.add_argument_group(title)
        wanted = set(names)
        moving = [a for a in default_group._group_actions if a.dest in wanted]
        moving.sort(key=lambda a: names.index(a.dest))
        for action in moving:
            default_group._group_actions.remove(action)
            group._group_actions.append(action)
        order.append(group)
    rest = parser.add_argument_group("Training (transformers TrainingArguments)")
    rest._group_actions.extend(a for a in default_group._group_actions if a.dest != "help")
    default_group._group_actions[:] = [a for a in default_group._group_actions if a.dest == "help"]
    parser._action_groups = [g for g in parser._action_groups if g not in order and g is not rest]
    parser._action_groups += order + [rest]
    actions = {action.dest: action for action in parser._actions}
    for trl_name, ours in ALIASES.items():  # TRL's name beside ours, where a GRPO user looks for it
        if actions[ours].help:
            actions[ours].help += f" (TRL GRPOConfig's name: --{trl_name})"
    return parser


def main(argv: list[str] | None = None) -> VCPPOTrainer:
    trainer_class, config_class = TRAINERS[chosen_trainer(argv)]
    parser = build_parser(config_class)
    script_args, training_args, model_args = parser.parse_args_and_config(argv)

    # Checks that need no model, before any minutes are spent loading models or on the toy's cold-start SFT.
    check_launch_environment()
    reward_funcs = resolve_reward_funcs(script_args.reward_funcs)
    if training_args.value_model_path is not None:
        check_value_model_source(training_args.value_model_path)

    toy = model_args.model_name_or_path is None
    tools = resolve_tools(script_args, toy)
    if toy:
        if script_args.dataset_name is not None:
            raise ValueError("--dataset_name needs --model_name_or_path (the embedded toy builds its own data).")
        from .toy import build_toy

        model, tokenizer, train_dataset, eval_dataset = build_toy(
            script_args,
            output_dir=training_args.output_dir,
            seed=training_args.seed,
            stop_token_id=training_args.stop_token_id,
        )
    else:
        if script_args.dataset_name is None:
            raise ValueError("Set --dataset_name (a dataset with a prompt and a solution column).")
        train_dataset, eval_dataset = load_datasets(script_args)
        if tools and isinstance(train_dataset[0]["prompt"], str):
            raise ValueError("Tools need chat prompts and the dataset's are text: set --conversational true.")
        model, tokenizer = load_model_and_tokenizer(model_args, training_args.trust_remote_code)

    trainer = trainer_class(
        model=model,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        tools=tools or None,
    )

    if script_args.store_rollouts is not None:
        report = store_rollouts(
            trainer,
            script_args.store_rollouts,
            num_batches=script_args.store_rollouts_batches,
            push_to_hub=script_args.store_rollouts_push_to_hub,
        )
        if trainer.is_world_process_zero():
            print(
                f"\nStored rollouts in {report.path}: {report.complete_batches} complete batches "
                f"({report.batches_written} written now, {report.batches_found} found written) in {report.seconds:.0f} s"
                + (f"; pushed to {report.hub_url}" if report.hub_url else "")
            )
        leave_process_group(trainer)
        return trainer

    resume = training_args.resume_from_checkpoint
    if isinstance(resume, str) and resume.lower() in ("true", "latest"):
        resume = True  # the latest checkpoint-<step> in output_dir
    if training_args.value_pretrain_only:  # a critic job: no evaluation, no policy saved
        try:
            trainer.train(resume_from_checkpoint=resume)
        except TrainingInterrupted as stop:
            logger.error(str(stop))
            leave_process_group(trainer)
            raise SystemExit(stop.exit_code) from None
        if trainer.is_world_process_zero():
            print(
                f"\nPretrained critic: {trainer.value_pretrain_callback.saved_paths[-1]} (load it with --value_model_path)"
            )
        leave_process_group(trainer)
        return trainer
    results = []
    if eval_dataset is not None and not resume:
        results.append(("before RL", trainer.evaluate()))
    try:
        trainer.train(resume_from_checkpoint=resume)
    except TrainingInterrupted as stop:
        logger.error(str(stop))
        leave_process_group(trainer)  # every rank agreed on the stop and saved the checkpoint together
        raise SystemExit(stop.exit_code) from None
    if eval_dataset is not None:
        results.append((f"after {trainer._name}", trainer.evaluate()))
    if training_args.push_to_hub:  # saves locally first, then pushes the policy and the critic with their cards
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    else:
        trainer.save_model(training_args.output_dir)
    if results and trainer.is_world_process_zero():
        if not resume:
            results[0] = ("after cold start" if toy else "initial policy", results[0][1])
        print("\n" + format_results_table(results) + "\n")
    leave_process_group(trainer)
    return trainer


def leave_process_group(trainer: VCPPOTrainer) -> None:
    """End a multi-process run as accelerate prescribes: all ranks meet, then `accelerator.end_training()` destroys
    the process group. See [`exit_process`] for why that is not the last step."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        trainer.accelerator.wait_for_everyone()
        global _LEFT_PROCESS_GROUP
        _LEFT_PROCESS_GROUP = True
    # A colocated vLLM engine tears down its own process groups: before the default group goes, not at exit.
    if trainer.sampler is not None:  # a critic job has none
        trainer.sampler.close()
    trainer.accelerator.end_training()


_LEFT_PROCESS_GROUP = False


def left_process_group() -> bool:
    """Whether this process ended a multi-process run with [`leave_process_group`] (then see [`exit_process`])."""
    return _LEFT_PROCESS_GROUP


def exit_process(code: int = 0) -> None:
    """Exit a process of a multi-process run without the interpreter's teardown, once its work is done and saved:
    flush the output, run the `atexit` handlers (loggers, trackers), then `os._exit(code)`.

    A gloo rank sometimes aborts in teardown, after training and saving, even with the process group destroyed
    ("terminate called without an active exception", SIGABRT, from a C++ thread still alive while the interpreter
    finalizes): seen on node 1's rank in 2 of about 30 runs of the 2-node SLURM test under CPU load, once after
    `destroy_process_group`. Its launcher then fails the node, and the other node's launcher waited 300 s at torchrun's
    exit barrier for it. tests/integration/distributed/worker.py ends its ranks the same way.
    """
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)

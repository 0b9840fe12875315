"""`train.py`'s parser: TRL's, over the script's options ([`~cli.arguments.VCPPOScriptArguments`]), the trainer's
config and `ModelConfig`; and the layout of its `--help`: a short usage, then the options in groups, this package's
first by the config's sections ([`~config.sections`]), transformers' `TrainingArguments` last."""

from __future__ import annotations

from trl import ModelConfig, TrlParser

from ..config import ALIASES, VCPPOConfig
from .arguments import VCPPOScriptArguments

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

    from ..config import VCPPO_SECTIONS, PPOConfig, config_sections

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

"""`train.py`'s embedded toy (no `--model_name_or_path`), built from the script's `toy_*` options (`None`: the toy's
default) and the run's `output_dir`, `seed` and `stop_token_id`: the arithmetic default, `--toy_task tool_use` or
`--toy_task pointer_chase`, each with its cold start; and the one tool the toys take."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

# `script_args` below: train.py's script arguments (`cli.arguments.VCPPOScriptArguments`); read by attribute, not
# imported: the command line sits above this folder.


def build_toy(script_args, *, output_dir: str, seed: int, stop_token_id: int | None):
    """The embedded default: toy task, tiny policy and tokenizer built in-process, and a cold-start SFT. Returns
    `(policy, tokenizer, train, test)`."""
    from ..models import resolve_stop_token_ids
    from . import defaults as toy_defaults
    from .cold_start import cold_start_sft
    from .model import build_tiny_model
    from .task import make_splits
    from .tokenizer import build_tokenizer

    chase_options = (script_args.toy_hops, script_args.toy_filler, script_args.toy_tables)
    if script_args.toy_task != "arithmetic" or chase_options != (None, None, None):
        return build_tool_or_pointer_chase_toy(
            script_args, output_dir=output_dir, seed=seed, stop_token_id=stop_token_id
        )

    def pick(value, default):
        return default if value is None else value

    splits = make_splits(
        pick(script_args.toy_num_train, toy_defaults.TOY_NUM_TRAIN),
        pick(script_args.toy_num_eval, toy_defaults.TOY_NUM_EVAL),
        seed=seed,
        min_digits=pick(script_args.toy_min_digits, toy_defaults.TOY_MIN_DIGITS),
        max_digits=pick(script_args.toy_max_digits, toy_defaults.TOY_MAX_DIGITS),
    )
    tokenizer = build_tokenizer()
    # A bad stop_token_id stops here, not after the cold start.
    resolve_stop_token_ids(tokenizer, stop_token_id=stop_token_id)
    model = build_tiny_model(
        tokenizer, num_heads=pick(script_args.toy_num_heads, toy_defaults.TOY_NUM_HEADS), seed=seed
    )
    steps = pick(script_args.toy_cold_start_steps, toy_defaults.TOY_SFT_STEPS)
    lr = pick(script_args.toy_cold_start_learning_rate, toy_defaults.TOY_SFT_LEARNING_RATE)
    logger.warning(
        f"Embedded toy run: cold-start SFT on {len(splits['train'])} worked solutions, until a held-out check reaches "
        f"{toy_defaults.TOY_SFT_TARGET_ACCURACY:.0%} exact match (at most {steps} steps)."
    )
    model = cold_start_sft(
        model,
        tokenizer,
        splits["train"],
        output_dir=os.path.join(output_dir, "cold_start"),
        max_steps=steps,
        learning_rate=lr,
        seed=seed,
    )
    columns = ["prompt", "solution", "difficulty"]
    train = splits["train"].select_columns(columns)
    test = splits["test"].select_columns(columns)
    return model, tokenizer, train, test


def build_tool_or_pointer_chase_toy(script_args, *, output_dir: str, seed: int, stop_token_id: int | None):
    """The toys other than the arithmetic default: `--toy_task tool_use` ([`~toy.tool_use.build_tool_toy`]) or
    `--toy_task pointer_chase` ([`~toy.pointer_chase_cold_start.build_pointer_chase_toy`]). Refuses, before any model
    is built, an option the chosen toy does not take: `--toy_hops` and `--toy_filler` off the pointer chase (the
    arithmetic default included), the digit counts on it. Returns `(policy, tokenizer, train, test)`."""
    task = script_args.toy_task
    unused = ("min_digits", "max_digits") if task == "pointer_chase" else ("hops", "filler", "tables")
    if given := [f"--toy_{name}" for name in unused if getattr(script_args, f"toy_{name}") is not None]:
        raise ValueError(f"{' and '.join(given)}: not an option of --toy_task {task}.")
    shared = ("num_train", "num_eval", "num_heads", "cold_start_steps", "cold_start_learning_rate")
    if task == "tool_use":
        from .tool_use import build_tool_toy

        options = {name: getattr(script_args, f"toy_{name}") for name in (*shared, "min_digits", "max_digits")}
        return build_tool_toy(output_dir=output_dir, seed=seed, **options)
    from ..models import resolve_stop_token_ids
    from .pointer_chase_cold_start import build_pointer_chase_toy
    from .tokenizer import build_tokenizer

    resolve_stop_token_ids(build_tokenizer(), stop_token_id=stop_token_id)  # a bad one stops here
    options = {name: getattr(script_args, f"toy_{name}") for name in (*shared, "hops", "filler", "tables")}
    return build_pointer_chase_toy(output_dir=output_dir, seed=seed, **options)


def toy_tools(tools: list, toy_task: str) -> list:
    """The tools of a toy run: `[add]` on the tool toy, none on the others. `tools` (the command line's) may be empty
    or `add` itself; any other tool, or `add` off the tool toy, is refused."""
    from .tool_use import add

    if tools and (tools != [add] or toy_task != "tool_use"):
        raise ValueError(
            "Tools need chat prompts, and the embedded toy takes one tool: `add`, with --toy_task tool_use (its cold "
            "start learned it; the arithmetic toy's prompts are text). Leave --tools and --python_tool unset."
        )
    return [add] if toy_task == "tool_use" else tools

"""The training script behind `train.py`: TRL-style arguments, data and model loading, then VCPPOTrainer.

`accelerate launch train.py --config configs/recipes/<recipe>.yaml` for a real model; with no model the embedded toy
task runs end to end on a CPU (tiny model built in-process, cold-start SFT, value pretraining, VC-PPO) and prints a
before/after table.

[`main`] is the script; its parts: the options and the trainer they choose (`arguments.py`), the parser and its
`--help` (`parser.py`), the datasets (`datasets.py`), the model and the tools (`inputs.py`), the three jobs
(`jobs.py`), and the end of a process (`process_exit.py`).
"""

from __future__ import annotations

from trl.trainer.utils import get_peft_config

from ..models import check_value_model_source
from ..parallel import check_launch_environment
from ..rewards import resolve_reward_funcs
from ..trainer import VCPPOTrainer
from .arguments import TRAINERS, VCPPOScriptArguments, chosen_trainer
from .datasets import load_datasets
from .inputs import load_model_and_tokenizer, resolve_tools
from .jobs import critic_job, store_rollouts_job, training_job
from .parser import build_parser
from .process_exit import exit_process, leave_process_group, left_process_group

__all__ = [
    "TRAINERS",
    "VCPPOScriptArguments",
    "build_parser",
    "chosen_trainer",
    "exit_process",
    "leave_process_group",
    "left_process_group",
    "load_model_and_tokenizer",
    "main",
    "resolve_tools",
]


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
        from ..toy import build_toy

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
        store_rollouts_job(trainer, script_args)
    elif training_args.value_pretrain_only:  # a critic job: no evaluation, no policy saved
        critic_job(trainer, training_args)
    else:
        training_job(
            trainer,
            training_args,
            evaluate=eval_dataset is not None,
            toy=toy,
            dataset_name=script_args.dataset_name,
        )
    leave_process_group(trainer)
    return trainer

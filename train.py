"""Train a policy with VC-PPO.

    accelerate launch train.py --config configs/recipes/<recipe>.yaml     # a real model (see configs/recipes/)
    python train.py                                                       # the embedded toy task, on a CPU

With neither `--config` nor `--model_name_or_path`, the tiny CPU recipe (configs/recipes/tiny_cpu.yaml) is used: a toy
long-CoT arithmetic task, a tiny model and tokenizer built in-process, cold-start SFT, value pretraining, then VC-PPO.
"""

import os
import sys

from vcppo_trl.cli import exit_process, left_process_group, main

DEFAULT_RECIPE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "recipes", "tiny_cpu.yaml")


if __name__ == "__main__":
    argv = sys.argv[1:]
    asks_help = any(a in ("-h", "--help") for a in argv)  # --help shows the real defaults, not the toy recipe's
    if not asks_help and not any(
        a == "--config" or a.startswith("--config=") or a.startswith("--model_name_or_path") for a in argv
    ):
        print(f"No --config or --model_name_or_path given: running the embedded default ({DEFAULT_RECIPE}).")
        argv = ["--config", DEFAULT_RECIPE, *argv]
    try:
        main(argv)
    except SystemExit as stop:  # stopped by a signal after saving a checkpoint (exit status 128 + signal)
        if left_process_group():
            exit_process(stop.code if isinstance(stop.code, int) else 1)
        raise
    if left_process_group():  # a multi-process run, finished and saved: skip the interpreter's teardown
        exit_process(0)

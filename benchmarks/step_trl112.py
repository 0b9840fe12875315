"""Runner for the TRL 1.12 side of `benchmarks/step.py`: run by that script with the python of its TRL 1.12 venv.

Trains `trl.experimental.ppo.PPOTrainer` (TRL 1.12) on the shared tiny setup (`step_setup.py`) for `--warmup +
--updates` updates and prints one JSON line: the wall time of each update, the time spent in generation during each
update, and the peak RSS of the process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import step_setup  # noqa: E402
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from step_setup import UpdateClock  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--response-length", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--updates", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--kl-coef", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from trl.experimental.ppo import PPOConfig, PPOTrainer
    from trl.experimental.ppo import ppo_trainer as trl_ppo

    generation_seconds = []
    trl_ppo.batch_generation = step_setup.timed(trl_ppo.batch_generation, generation_seconds)

    tokenizer = step_setup.build_tokenizer()
    policy, reward_model, value_model = step_setup.build_models(args.response_length, args.seed)
    num_updates = args.warmup + args.updates
    dataset = Dataset.from_dict({"input_ids": step_setup.prompt_ids(args.batch_size * num_updates, args.seed)})
    with tempfile.TemporaryDirectory() as output_dir:
        config = PPOConfig(
            output_dir=output_dir,
            per_device_train_batch_size=args.batch_size,
            gradient_accumulation_steps=1,
            num_mini_batches=1,
            num_ppo_epochs=1,
            local_rollout_forward_batch_size=args.batch_size,
            total_episodes=args.batch_size * num_updates,
            response_length=args.response_length,
            temperature=0.7,
            kl_coef=args.kl_coef,
            learning_rate=1e-5,
            stop_token=None,
            stop_token_id=None,
            missing_eos_penalty=None,
            num_sample_generations=0,
            bf16=False,
            gradient_checkpointing=False,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            use_cpu=True,
            seed=args.seed,
        )
        clock = UpdateClock()
        trainer = PPOTrainer(
            args=config,
            processing_class=tokenizer,
            model=policy,
            ref_model=None,
            reward_model=reward_model,
            train_dataset=dataset,
            value_model=value_model,
            callbacks=[clock],
        )
        trainer.log = lambda *a, **k: None  # no printing of metrics: same on both sides
        clock.marks = [time.perf_counter()]
        trainer.train()
    result = step_setup.bench_result("trl112", args.response_length, clock, generation_seconds, args.warmup)
    print("BENCH_JSON " + json.dumps(result))


if __name__ == "__main__":
    main()

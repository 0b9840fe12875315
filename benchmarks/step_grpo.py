"""Runner for the GRPO side of `benchmarks/step.py`: TRL's own `GRPOTrainer` (the TRL installed with vcppo_trl), one
configuration per process.

The same work per step as our VC-PPO paper-setting update: `--batch-size` completions of exactly `--response-length`
tokens (`--batch-size / --num-generations` prompts, each sampled `--num-generations` times), the same tiny policy and
prompts (`step_setup.py`), the same rule-based ±1 reward, temperature 0.7, no KL term (`beta=0`, no reference model),
one optimizer step per generation (`num_iterations=1`, `steps_per_generation=1`), float32 on CPU. Prints one JSON line
like `step_ours.py`: the wall time of each step, the time spent in generation during each step (`_generate`), and the
peak RSS of the process.
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
from step_ours import first_letter_reward  # noqa: E402
from step_setup import UpdateClock  # noqa: E402


def run(
    response_length: int,
    batch_size: int = 8,
    updates: int = 5,
    warmup: int = 1,
    num_generations: int = 4,
    seed: int = 0,
    drawn_lengths: bool = False,
):
    from trl import GRPOConfig, GRPOTrainer

    if batch_size % num_generations:
        raise ValueError(f"--batch-size ({batch_size}) must be a multiple of --num-generations ({num_generations}).")
    tokenizer = step_setup.build_tokenizer()
    policy, _, _ = step_setup.build_models(response_length, seed, stop_token_in_vocab=drawn_lengths)
    if drawn_lengths:
        step_setup.stop_at_drawn_lengths(policy, seed)
    num_steps = warmup + updates
    dataset = Dataset.from_dict({"prompt": step_setup.prompt_texts(batch_size // num_generations * num_steps, seed)})
    with tempfile.TemporaryDirectory() as output_dir:
        config = GRPOConfig(
            output_dir=output_dir,
            per_device_train_batch_size=batch_size,  # completions per step
            num_generations=num_generations,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_iterations=1,
            max_completion_length=response_length,
            temperature=0.7,
            beta=0.0,
            learning_rate=1e-5,
            max_steps=num_steps,
            shuffle_dataset=False,
            log_completions=False,
            bf16=False,
            activation_checkpointing=False,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            use_cpu=True,
            seed=seed,
        )
        clock = UpdateClock()
        trainer = GRPOTrainer(
            model=policy,
            reward_funcs=first_letter_reward,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[clock],
        )
        trainer.log = lambda *a, **k: None  # no printing of metrics: same on both sides
        generation_seconds = []
        trainer._generate = step_setup.timed(trainer._generate, generation_seconds)
        clock.marks = [time.perf_counter()]
        trainer.train()
        # Every completion must run to full length, as on our side (the stop token lies outside the vocabulary).
        lengths = trainer._metrics["train"]["completions/mean_length"]
        if drawn_lengths:
            if not all(length < response_length for length in lengths):
                raise RuntimeError(f"GRPO completions were not cut at the drawn lengths: mean lengths {lengths}")
        elif any(length != response_length for length in lengths):
            raise RuntimeError(f"GRPO completions were not all {response_length} tokens long: {lengths}")
    return step_setup.bench_result("grpo", response_length, clock, generation_seconds, warmup)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--response-length", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=8, help="completions per step")
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--updates", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drawn-lengths", action="store_true", help="stop each sample at a drawn length")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = run(
        args.response_length,
        args.batch_size,
        args.updates,
        args.warmup,
        args.num_generations,
        args.seed,
        args.drawn_lengths,
    )
    print("BENCH_JSON " + json.dumps(result))


if __name__ == "__main__":
    main()

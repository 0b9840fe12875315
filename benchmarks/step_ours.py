"""Runner for our side of `benchmarks/step.py` (vcppo_trl's `PPOTrainer` / `VCPPOTrainer`), one configuration per process.

Trains on the shared tiny setup (`step_setup.py`) for `--warmup + --updates` updates and prints one JSON line: the
wall time of each update, the time spent in generation during each update, and the peak RSS of the process.

    python benchmarks/step_ours.py --response-length 64                # TRL 1.12's work: KL 0.05, reward model
    python benchmarks/step_ours.py --response-length 64 --paper        # VC-PPO paper setting: KL 0, rule reward
    python benchmarks/step_ours.py --response-length 64 --paper --no-shortcut   # ... with the rollout policy forward
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


def first_letter_reward(completions, **kwargs):
    """A rule-based ±1 reward (stands in for the math verifier): +1 when the completion starts in the first half of
    the alphabet."""
    return [1.0 if c and c[0] < step_setup.ALPHABET[len(step_setup.ALPHABET) // 2] else -1.0 for c in completions]


def vcppo_update_config(
    output_dir: str, *, batch: int, response_length: int, updates: int, seed: int = 0, **overrides
):
    """The VC-PPO update that windows.py, overlap.py and gpu_check.py's windows row time: `batch` responses in one
    mini-batch and epoch, `updates` updates, KL 0, λ_actor 0.95 / λ_critic 1, no value pretraining, the on-policy
    shortcut, no logging or saving, on the CPU; `overrides` on top (a window, a token budget, the device, ...)."""
    from vcppo_trl import VCPPOConfig

    settings = dict(
        output_dir=output_dir,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        num_mini_batches=1,
        num_ppo_epochs=1,
        local_rollout_forward_batch_size=batch,
        total_episodes=batch * updates,
        response_length=response_length,
        temperature=0.7,
        learning_rate=1e-5,
        kl_coef=0.0,
        lam_actor=0.95,
        lam_critic=1.0,
        value_pretrain_steps=0,
        on_policy_shortcut=True,
        num_sample_generations=0,
        bf16=False,
        activation_checkpointing=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
        seed=seed,
    )
    return VCPPOConfig(**(settings | overrides))


def run(
    response_length: int,
    batch_size: int = 8,
    updates: int = 5,
    warmup: int = 1,
    paper: bool = False,
    seed: int = 0,
    shortcut: bool = True,
    drawn_lengths: bool = False,
    max_tokens: int | None = None,
):
    from vcppo_trl import PPOConfig, PPOTrainer, VCPPOConfig, VCPPOTrainer

    tokenizer = step_setup.build_tokenizer()
    policy, reward_model, _ = step_setup.build_models(response_length, seed, stop_token_in_vocab=drawn_lengths)
    if drawn_lengths:
        step_setup.stop_at_drawn_lengths(policy, seed)
    num_updates = warmup + updates
    dataset = Dataset.from_dict({"prompt": step_setup.prompt_texts(batch_size * num_updates, seed)})
    common = dict(
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=1,
        num_mini_batches=1,
        num_ppo_epochs=1,
        local_rollout_forward_batch_size=batch_size,
        total_episodes=batch_size * num_updates,
        response_length=response_length,
        temperature=0.7,
        learning_rate=1e-5,
        missing_eos_penalty=None,
        num_sample_generations=0,
        bf16=False,
        activation_checkpointing=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
        seed=seed,
        on_policy_shortcut=shortcut,  # only the paper setting (KL 0) can take it
        max_tokens_per_micro_batch=max_tokens,
        max_tokens_per_forward=max_tokens,
    )
    with tempfile.TemporaryDirectory() as output_dir:
        clock = UpdateClock()
        if paper:
            # No value pretraining (VCPPOConfig's default is 100 updates): the timed updates are VC-PPO updates.
            config = VCPPOConfig(
                output_dir=output_dir, kl_coef=0.0, lam_actor=0.95, lam_critic=1.0, value_pretrain_steps=0, **common
            )
            trainer_cls, reward_funcs, reward_tokenizers = VCPPOTrainer, first_letter_reward, None
        else:
            config = PPOConfig(output_dir=output_dir, kl_coef=0.05, lam=0.95, **common)
            trainer_cls, reward_funcs, reward_tokenizers = PPOTrainer, reward_model, tokenizer
        trainer = trainer_cls(
            model=policy,
            reward_funcs=reward_funcs,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            reward_processing_classes=reward_tokenizers,
            callbacks=[clock],
        )
        trainer.log = lambda *a, **k: None  # no printing of metrics: same on both sides
        generation_seconds = []
        maker = trainer.rollout_maker
        maker.generate = step_setup.timed(maker.generate, generation_seconds)
        clock.marks = [time.perf_counter()]
        trainer.train()
    side = (
        ("ours-paper" if paper else "ours") + ("" if shortcut else "-no-shortcut") + ("-budget" if max_tokens else "")
    )
    return step_setup.bench_result(side, response_length, clock, generation_seconds, warmup)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--response-length", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--updates", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--paper", action="store_true", help="KL 0, rule-based reward, no reference model (VC-PPO)")
    parser.add_argument(
        "--no-shortcut", action="store_true", help="on_policy_shortcut=False: old log-probs from a rollout forward"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drawn-lengths", action="store_true", help="stop each sample at a drawn length")
    parser.add_argument("--max-tokens", type=int, help="max_tokens_per_micro_batch and max_tokens_per_forward")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = run(
        args.response_length,
        args.batch_size,
        args.updates,
        args.warmup,
        args.paper,
        args.seed,
        not args.no_shortcut,
        args.drawn_lengths,
        args.max_tokens,
    )
    print("BENCH_JSON " + json.dumps(result))


if __name__ == "__main__":
    main()

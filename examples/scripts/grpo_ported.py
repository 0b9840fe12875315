"""A TRL GRPO script that gets a critic by changing one import: the config keeps TRL `GRPOConfig`'s names
(`max_completion_length`, `beta`, `epsilon`, `epsilon_high`, `num_iterations`, `loss_type="dapo"`, `max_steps`, ...),
which `VCPPOConfig` takes with their meaning (docs/migrating_from_grpo.md), and the reward function keeps TRL's protocol.

    accelerate launch examples/scripts/grpo_ported.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct
    python examples/scripts/grpo_ported.py --tiny --output_dir /tmp/grpo-ported-tiny   # tiny, in-process, CPU

`--tiny` builds a tiny random model, the toy's tokenizer and its addition prompts in the process (no download); CI runs
it (tests/integration/scripts/test_examples.py). The Hub model and dataset are the defaults of a real run and are not
run by the tests (no network there).
"""

from __future__ import annotations

import argparse
import re

# from trl import GRPOConfig, GRPOTrainer
from vcppo_trl import VCPPOConfig as GRPOConfig
from vcppo_trl import VCPPOTrainer as GRPOTrainer


def boxed_answer_reward(completions, solution, **kwargs):
    """+1 when the last \\boxed{...} of the completion equals the solution's, -1 otherwise (TRL's reward protocol)."""

    def boxed(text: str) -> str | None:
        found = re.findall(r"\\boxed\{([^}]*)\}", text)
        return found[-1].strip() if found else None

    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [1.0 if boxed(t) is not None and boxed(t) == boxed(s) else -1.0 for t, s in zip(texts, solution)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_name_or_path", default="Qwen/Qwen2.5-0.5B-Instruct")
    parser.add_argument("--dataset_name", default="trl-lib/DeepMath-103K")
    parser.add_argument("--output_dir", default="grpo-ported-out")
    parser.add_argument("--tiny", action="store_true", help="a tiny in-process model and the toy's prompts")
    args = parser.parse_args(argv)
    if args.tiny:
        from vcppo_trl.toy import build_tiny_model, build_tokenizer, make_splits

        tokenizer = build_tokenizer()
        model, dataset = build_tiny_model(tokenizer, num_layers=1), make_splits(64, 16)["train"]
    else:
        from datasets import load_dataset

        tokenizer, model, dataset = None, args.model_name_or_path, load_dataset(args.dataset_name, split="train")

    training_args = GRPOConfig(
        output_dir=args.output_dir,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_generations=4,
        max_completion_length=16 if args.tiny else 1024,
        temperature=1.0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        num_iterations=1,
        loss_type="dapo",
        learning_rate=1e-6,
        max_steps=2 if args.tiny else 500,  # updates here (rollout + its PPO epochs), value pretraining on top
        logging_steps=1,
        save_strategy="no",
        report_to="none",
    )
    if args.tiny:
        training_args.value_pretrain_steps = 2  # the critic's phase before the policy moves (default 100)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=boxed_answer_reward,
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.train()


if __name__ == "__main__":
    main()

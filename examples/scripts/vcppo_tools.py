"""VC-PPO with a tool, on TRL's API: `tools=[...]` as TRL's GRPOTrainer takes them. The policy may call `multiply`
between its turns; the tool's answers are context for the policy and the critic, never actions (out of the losses,
the KL and GAE's credit: docs/tools_and_environments.md).

    accelerate launch examples/scripts/vcppo_tools.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct
    python examples/scripts/vcppo_tools.py --tiny --output_dir /tmp/vcppo-tools-tiny   # tiny, in-process, CPU

`--tiny` builds a tiny random model and the toy's character tokenizer with TRL's Qwen2.5 chat template in the process
(no download); CI runs it (tests/integration/scripts/test_examples.py). A tiny random model does not call the tool:
that run checks the plumbing, not learning. The Hub model is the default of a real run and is not run by the tests.

The tool does arithmetic on the two numbers it is given; it runs no model-written code. A tool that does (a code
interpreter) runs with the trainer's rights: isolate it in a subprocess with a time and memory limit.
"""

from __future__ import annotations

import argparse
import random
import re

from datasets import Dataset

from vcppo_trl import VCPPOConfig, VCPPOTrainer


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a * b


def products(n: int, seed: int = 0) -> Dataset:
    """Multiplication questions of two 2- to 4-digit numbers, each answer in `solution`."""
    rng = random.Random(seed)
    pairs = [(rng.randint(10, 9999), rng.randint(10, 9999)) for _ in range(n)]
    prompts = [
        [{"role": "user", "content": f"What is {a} * {b}? Put the final answer in \\boxed{{}}."}] for a, b in pairs
    ]
    return Dataset.from_dict({"prompt": prompts, "solution": [str(a * b) for a, b in pairs]})


def boxed_product_reward(completions, solution, **kwargs):
    """+1 when the episode's last turn boxes the right product, -1 otherwise (an episode is its list of messages)."""
    rewards = []
    for episode, answer in zip(completions, solution):
        found = re.findall(r"\\boxed\{([^}]*)\}", str(episode[-1].get("content") or ""))
        rewards.append(1.0 if found and found[-1].strip() == answer else -1.0)
    return rewards


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_name_or_path", default="Qwen/Qwen2.5-0.5B-Instruct")
    parser.add_argument("--output_dir", default="vcppo-tools-out")
    parser.add_argument("--tiny", action="store_true", help="a tiny in-process model and tokenizer")
    args = parser.parse_args(argv)
    if args.tiny:
        from vcppo_trl.toy import build_chat_tokenizer, build_tiny_model

        tokenizer = build_chat_tokenizer()
        model = build_tiny_model(tokenizer, num_layers=1)
    else:
        tokenizer, model = None, args.model_name_or_path

    training_args = VCPPOConfig(
        output_dir=args.output_dir,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        response_length=384 if args.tiny else 1024,  # every completion token, tool results included
        max_tool_calling_iterations=2,
        learning_rate=1e-6,
        value_pretrain_steps=2 if args.tiny else 100,  # the critic learns on the same tool episodes first
        max_steps=2 if args.tiny else 500,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
    )
    trainer = VCPPOTrainer(
        model=model,
        reward_funcs=boxed_product_reward,
        args=training_args,
        train_dataset=products(64 if args.tiny else 20_000),
        processing_class=tokenizer,
        tools=[multiply],
    )
    trainer.train()
    trainer.save_model()


if __name__ == "__main__":
    main()

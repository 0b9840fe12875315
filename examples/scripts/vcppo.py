"""VC-PPO on math prompts rewarded by math-verify (+1 right, -1 wrong, the `<think>` part ignored).

    accelerate launch examples/scripts/vcppo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \
        --dataset_name trl-lib/DeepMath-103K --output_dir vcppo-qwen
    python examples/scripts/vcppo.py --tiny --output_dir /tmp/vcppo-tiny   # a tiny in-process model, CPU, seconds

`--tiny` builds a tiny random model, the toy's tokenizer and its addition prompts in the process (no download); CI runs
it (tests/integration/scripts/test_examples.py). The Hub model and dataset are the defaults of a real run and are not
run by the tests (no network there): the dataset needs a `prompt` column and a `solution` column for math-verify.
The value model is built from the policy; value pretraining runs first (`value_pretrain_steps`, the paper's 100).
"""

from __future__ import annotations

import argparse

from vcppo_trl import VCPPOConfig, VCPPOTrainer, math_verify_reward


def load_inputs(args):
    """(policy, tokenizer, train split, eval split): tiny and in-process with `--tiny`, else from the Hub."""
    if args.tiny:
        from vcppo_trl.toy import build_tiny_model, build_tokenizer, make_splits

        tokenizer = build_tokenizer()
        splits = make_splits(64, 16)
        return build_tiny_model(tokenizer, num_layers=1), tokenizer, splits["train"], splits["test"]
    from datasets import load_dataset

    dataset = load_dataset(args.dataset_name, split="train").train_test_split(test_size=64, seed=0)
    return args.model_name_or_path, None, dataset["train"], dataset["test"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_name_or_path", default="Qwen/Qwen2.5-0.5B-Instruct")
    parser.add_argument("--dataset_name", default="trl-lib/DeepMath-103K")
    parser.add_argument("--output_dir", default="vcppo-out")
    parser.add_argument("--max_steps", type=int, default=None, help="PPO updates (default: tiny 2, else 500)")
    parser.add_argument("--tiny", action="store_true", help="a tiny in-process model and the toy's prompts")
    args = parser.parse_args(argv)
    model, tokenizer, train, test = load_inputs(args)
    sizes = dict(per_device_train_batch_size=4, num_generations=4, response_length=16, value_pretrain_steps=2)
    if not args.tiny:
        sizes = dict(per_device_train_batch_size=8, num_generations=8, response_length=4096, value_pretrain_steps=100)
    config = VCPPOConfig(
        output_dir=args.output_dir,
        max_steps=args.max_steps or (2 if args.tiny else 500),
        gradient_accumulation_steps=2,
        num_ppo_epochs=1,
        learning_rate=1e-6,
        lam_actor=0.95,  # the policy's advantages
        lam_critic=1.0,  # the critic's targets: the end-of-sequence reward undecayed
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        **sizes,
    )
    trainer = VCPPOTrainer(
        model=model,
        reward_funcs=math_verify_reward,
        args=config,
        train_dataset=train,
        eval_dataset=test,
        processing_class=tokenizer,
    )
    trainer.train()
    trainer.save_model()  # the policy in output_dir, the critic in output_dir/value_model


if __name__ == "__main__":
    main()

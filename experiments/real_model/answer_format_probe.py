"""Does SmolLM2-135M-Instruct answer in the form a reward reads? Samples it on reasoning-gym's one-digit additions
under a system prompt and scores each response twice: with reasoning-gym's own scoring (the last `<answer>` block,
`reasoning_gym_reward`) and with math-verify against the gold answer (`math_verify_reward`: `\\boxed{}` or an anchored
"the answer is ..."). Why the SmolLM2 recipe (configs/recipes/smollm2_cpu.yaml) uses math-verify.

    python experiments/real_model/answer_format_probe.py direct
    python experiments/real_model/answer_format_probe.py DeepSeekZero --response-length 48
    python experiments/real_model/answer_format_probe.py "Answer in one short sentence that ends with: The answer is <number>."

The system prompt: one of reasoning-gym's by name, or any other text as the system message. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from smollm2 import smollm2_folder  # this folder's: the scripts run from it
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ONE_DIGIT_SUMS = dict(
    min_terms=2,
    max_terms=2,
    min_digits=1,
    max_digits=1,
    operators=["+"],
    allow_negation=False,
    allow_parentheses=False,
)


def main() -> None:
    from reasoning_gym.utils import SYSTEM_PROMPTS

    from vcppo_trl.rewards.math_verify import math_verify_reward
    from vcppo_trl.rewards.reasoning_gym import reasoning_gym_dataset, reasoning_gym_reward

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("system_prompt")
    parser.add_argument("--problems", type=int, default=6)
    parser.add_argument("--samples", type=int, default=8, help="responses per problem")
    parser.add_argument("--response-length", type=int, default=32)
    args = parser.parse_args()
    folder = smollm2_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    torch.manual_seed(0)
    named = args.system_prompt in SYSTEM_PROMPTS
    system = {"system_prompt": args.system_prompt} if named else {"system_message": args.system_prompt}
    dataset = reasoning_gym_dataset("basic_arithmetic", args.problems, seed=0, **system, **ONE_DIGIT_SUMS)
    own, verified, examples, tagged = [], [], [], 0
    for row in dataset:
        text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        enc = tokenizer([text] * args.samples, return_tensors="pt")
        out = model.generate(
            **enc, max_new_tokens=args.response_length, do_sample=True, temperature=0.7,
            pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
        completions = tokenizer.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
        own += reasoning_gym_reward(completions, [row["reasoning_gym_entry"]] * args.samples)
        verified += math_verify_reward(completions, solution=[row["solution"]] * args.samples)
        examples.append(completions[0])
        tagged += sum("<answer>" in c for c in completions)
    print(
        json.dumps(
            {
                "system_prompt": args.system_prompt,
                "responses": len(own),
                "response_length": args.response_length,
                "with_answer_tags": tagged,
                "reasoning_gym_correct": sum(r > 0 for r in own),
                "math_verify_correct": sum(r > 0 for r in verified),
                "first_responses": examples,
            }
        )
    )


if __name__ == "__main__":
    main()

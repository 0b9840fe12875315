"""Measure a candidate task for the accuracy-link toy after its cold start, before any RL (rules: results/accuracy_link/plan.md).

    python experiments/accuracy_link_shape.py --candidate majority-changes

Cold-starts the toy policy for the candidate (cached under `experiments/.cache/accuracy_link/<candidate>/` in
`toy_assets.py`'s format) and writes `experiments/results/accuracy_link/shape/<candidate>.json` with what the plan's
rules R1–R3 read:

- `no_reasoning`: accuracy of the answer given right after the think-open marker (the response forced to
  `<think></think> \\boxed{`, greedy answer), against the chance level;
- `forced_stop`: per q in 1/8, 3/8, 5/8, 7/8, the reference solution's first ⌈q·n⌉ lines (an exact running state),
  then `</think> \\boxed{` and the model's greedy answer; beside it the exact state's own accuracy there;
- `greedy`, `sampled` (temperature 1, one sample per prompt, with the natural stop lines) and `pass_at` (pass@1 and
  pass@8 over 8 samples per prompt on the first 100 held-out prompts).

Only these measurements choose the task; nothing here looks at RL.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics as st
import sys
import time
from collections.abc import Callable
from typing import Any

from run_files import git_commit
from task_majority import MajorityBudget
from task_running_sum import RunningSumBudget
from toy_assets import build_cold_start

HERE = os.path.dirname(os.path.abspath(__file__))
QUARTERS = (1 / 8, 3 / 8, 5 / 8, 7 / 8)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A candidate task: its budget (data, cold start, model), its chance level, and what the measurements read of a
    problem (its prompt): the lines of its complete solution, the exact running state's answer after k lines (k = all:
    the problem's answer), the reference solution stopped after k lines, the verifier and the reasoning-line count."""

    budget: Any
    chance: float
    answers: tuple[str, ...]
    num_lines: Callable[[str], int]
    answer_after: Callable[[str, int], str]
    reference: Callable[[str, int], str]
    is_correct: Callable[[str, str], bool]
    reasoning_lines: Callable[[str], int]


def majority_candidate(budget: MajorityBudget) -> Candidate:
    """The majority task (`vcppo_trl.toy.majority`) in the budget's variant."""
    from vcppo_trl.toy import majority

    def solution(prompt: str, k: int) -> str:
        return majority.format_solution(majority.parse_prompt(prompt), k, budget.tally, budget.encoding)

    return Candidate(
        budget,
        chance=0.5,
        answers=("0", "1"),
        num_lines=lambda p: len(majority.parse_prompt(p)),
        answer_after=lambda p, k: str(majority.leader_after(majority.parse_prompt(p), k)),
        reference=solution,
        is_correct=majority.is_correct,
        reasoning_lines=majority.reasoning_lines,
    )


def running_sum_candidate(budget: RunningSumBudget) -> Candidate:
    """The running-sum task (`vcppo_trl.toy.running_sum`) modulo the budget's modulus."""
    from vcppo_trl.toy import running_sum

    def answer_after(prompt: str, k: int) -> str:
        digits, modulus = running_sum.parse_prompt(prompt)
        return str(running_sum.running_sum_after(digits, k, modulus))

    def solution(prompt: str, k: int) -> str:
        digits, modulus = running_sum.parse_prompt(prompt)
        return running_sum.format_solution(digits, k, modulus, budget.tally)

    return Candidate(
        budget,
        chance=1 / budget.modulus,
        answers=tuple(str(r) for r in range(budget.modulus)),
        num_lines=lambda p: len(running_sum.parse_prompt(p)[0]),
        answer_after=answer_after,
        reference=solution,
        is_correct=running_sum.is_correct,
        reasoning_lines=running_sum.reasoning_lines,
    )


CANDIDATES = {
    # C1 of the plan: the majority task with the `changes` encoding, fair strings, 2,200 cold-start steps.
    "majority-changes": majority_candidate(
        dataclasses.replace(MajorityBudget(), encoding="changes", tally="counts", bias=0.5, cold_start_steps=2200)
    ),
    # C2: the sum of 15-31 digits mod 5, one running sum per line; the same cold-start mix, steps and model.
    "sum-mod-5": running_sum_candidate(RunningSumBudget(modulus=5)),
    # C3: the parity of 15-31 bits, one running parity per line; the same settings.
    "parity": running_sum_candidate(RunningSumBudget(modulus=2)),
    # C4 (plan.md's amendment of 2026-12-02, measured only if C3 is dropped): the sum mod 3.
    "sum-mod-3": running_sum_candidate(RunningSumBudget(modulus=3)),
    # C5 (the second amendment, measured only if C3 and C4 are dropped): fair bits on the majority task's counts
    # lines, the answer the number of ones mod 5.
    "count-mod-5": running_sum_candidate(
        RunningSumBudget(modulus=5, values=2, tally="counts", response_length=320)  # the majority task's lengths
    ),
}


def no_reasoning_text(prompt: str) -> str:
    """The prompt with the reasoning closed right after it opens, up to the answer's opening brace."""
    from vcppo_trl.toy.task import THINK_END, THINK_START

    return prompt + f"{THINK_START}{THINK_END} \\boxed{{"


def forced_stop_text(prompt: str, reference: str) -> str:
    """The prompt and a reference solution's reasoning (its first k lines: an exact running state), closed, up to the
    answer."""
    from vcppo_trl.toy.task import THINK_END

    return prompt + reference.split(THINK_END)[0] + f"{THINK_END} \\boxed{{"


def forced_answers(model, tokenizer, texts: list[str], batch_size: int = 64) -> list[str | None]:
    """The model's greedy answer after each text (which ends with `\\boxed{`): the characters before `}`."""
    import torch

    padding_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    answers: list[str | None] = []
    try:
        with torch.no_grad():
            for start in range(0, len(texts), batch_size):
                batch = tokenizer(texts[start : start + batch_size], return_tensors="pt", padding=True)
                out = model.generate(**batch, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
                for ids in out[:, batch["input_ids"].shape[1] :].tolist():
                    text = tokenizer.decode(ids, skip_special_tokens=True)
                    answers.append(text.split("}")[0].strip() if "}" in text else None)
    finally:
        tokenizer.padding_side = padding_side
    return answers


def mean_and_se(values: list[bool]) -> dict[str, float]:
    p = st.mean(values) if values else float("nan")
    return {"accuracy": p, "se": math.sqrt(p * (1 - p) / len(values)) if values else float("nan"), "n": len(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidate", required=True, choices=sorted(CANDIDATES))
    parser.add_argument("--steps", type=int, default=None, help="Cold-start steps (the plan's one adjustment).")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache-dir", default=os.path.join(HERE, ".cache", "accuracy_link"))
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results", "accuracy_link", "shape"))
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vcppo_trl.toy.reward_model import sample_responses
    from vcppo_trl.toy.task import extract_boxed_answer

    torch.set_num_threads(args.threads)
    candidate = CANDIDATES[args.candidate]
    budget = candidate.budget
    if args.steps is not None:
        budget = dataclasses.replace(budget, cold_start_steps=args.steps)
    name = args.candidate + ("" if args.steps is None else f"_{args.steps}")
    manifest = build_cold_start(budget, os.path.join(args.cache_dir, name))
    tokenizer = AutoTokenizer.from_pretrained(manifest["policy"])
    model = AutoModelForCausalLM.from_pretrained(manifest["policy"]).eval()
    splits = budget.splits()
    test, train = splits["test"], splits["train"]
    prompts, solutions = list(test["prompt"]), list(test["solution"])
    lengths = [candidate.num_lines(p) for p in prompts]
    gold = [candidate.answer_after(p, n) for p, n in zip(prompts, lengths)]
    t0 = time.time()

    # R1: the answer right after the think-open marker.
    no_reasoning = forced_answers(model, tokenizer, [no_reasoning_text(p) for p in prompts])
    r1 = mean_and_se([a == g for a, g in zip(no_reasoning, gold)])
    r1["chance"] = candidate.chance
    r1["answered"] = st.mean(a in candidate.answers for a in no_reasoning)

    # R2: forced stops on the exact running state.
    forced = {}
    for q in QUARTERS:
        texts, exact = [], []
        for p, n, g in zip(prompts, lengths, gold):
            k = max(1, math.ceil(q * n))
            texts.append(forced_stop_text(p, candidate.reference(p, k)))
            exact.append(candidate.answer_after(p, k) == g)
        answers = forced_answers(model, tokenizer, texts)
        forced[f"{q:.3f}"] = mean_and_se([a == g for a, g in zip(answers, gold)]) | {
            "exact_state_accuracy": st.mean(exact)
        }

    # R3: greedy (from the cold start's evaluation), sampled, pass@k.
    torch.manual_seed(1)
    responses = sample_responses(model, tokenizer, prompts, max_new_tokens=budget.response_length)
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    correct = [candidate.is_correct(t, s) for t, s in zip(texts, solutions)]
    lines = [candidate.reasoning_lines(t) for t in texts]
    complete = [c for c, k, n in zip(correct, lines, lengths) if k == n]
    sampled = mean_and_se(correct) | {
        "complete": mean_and_se(complete),
        "stop_line_fraction_mean": st.mean(min(k / n, 1.0) for k, n in zip(lines, lengths)),
        "response_tokens_mean": st.mean(len(r) for r in responses),
        "answered": st.mean(extract_boxed_answer(t) in candidate.answers for t in texts),
    }
    first = 100
    many = sample_responses(
        model, tokenizer, [p for p in prompts[:first] for _ in range(8)], max_new_tokens=budget.response_length
    )
    many_texts = tokenizer.batch_decode(many, skip_special_tokens=True)
    hits = [candidate.is_correct(t, s) for t, s in zip(many_texts, [s for s in solutions[:first] for _ in range(8)])]
    per_prompt = [hits[i * 8 : (i + 1) * 8] for i in range(first)]
    pass_at = {"pass@1": st.mean(hits), "pass@8": st.mean(any(h) for h in per_prompt), "prompts": first}
    # The cold start's mean sampled length on training prompts: VAPO's α on the toy (plan §2).
    train_responses = sample_responses(
        model, tokenizer, list(train["prompt"][:256]), max_new_tokens=budget.response_length
    )
    train_length = st.mean(len(r) for r in train_responses)

    greedy = manifest["cold_start_eval"]
    r2_gap = sampled["complete"]["accuracy"] - forced[f"{QUARTERS[0]:.3f}"]["accuracy"]
    rules = {
        "R1": r1["accuracy"] <= candidate.chance + 0.10,
        "R2": r2_gap >= 0.25
        and all(
            forced[f"{b:.3f}"]["accuracy"] >= forced[f"{a:.3f}"]["accuracy"] - forced[f"{a:.3f}"]["se"]
            for a, b in zip(QUARTERS, QUARTERS[1:])
        ),
        "R3": greedy["accuracy"] <= 0.80
        and sampled["accuracy"] <= 0.80
        and sampled["accuracy"] >= 0.30
        and pass_at["pass@8"] - pass_at["pass@1"] >= 0.15,
        "cold_start_within_15_min": manifest["cold_start_seconds"] <= 15 * 60,
    }
    record = {
        "candidate": args.candidate,
        "command": "python experiments/accuracy_link_shape.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": git_commit(),
        "asset_key": manifest["key"],
        "cold_start_seconds": manifest["cold_start_seconds"],
        "greedy": {k: v for k, v in greedy.items() if not k.endswith("by_difficulty")},
        "no_reasoning": r1,
        "forced_stop": forced,
        "complete_minus_first_eighth": r2_gap,
        "sampled": sampled,
        "pass_at": pass_at,
        "train_sampled_length_mean": train_length,
        "vapo_alpha_toy": 1 / (0.05 * train_length),
        "rules": rules,
        "measure_seconds": time.time() - t0,
        "example": texts[0],
    }
    os.makedirs(args.results_dir, exist_ok=True)
    with open(os.path.join(args.results_dir, f"{name}.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps({k: v for k, v in record.items() if k != "example"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

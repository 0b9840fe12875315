"""Measure the stop-anytime task's shape after the cold start, before any RL (`--task majority`'s first check).

    python experiments/majority_shape.py --name counts_600 --steps 600
    python experiments/majority_shape.py --name diff_changes_1500 --tally diff --encoding changes --steps 1500

The experiment needs a cold-started policy whose *sampled* accuracy (temperature 1, the rollouts' distribution) rises
clearly and monotonically with the line at which a response stops, complete responses the most accurate, early stops
right less often but not never. This script cold-starts a toy policy for one task variant and model size (cached under
`experiments/.cache/majority/shape/<name>/` in `toy_assets.py`'s format, reused when its settings match), samples one response per held-out prompt,
and writes `experiments/results/majority/shape/<name>.json`:

- `by_stop_bin`: per bin of the stop line relative to the string's length (k/n in [0, ¼), [¼, ½), [½, ¾), [¾, 1),
  complete), the number of responses, their accuracy, and the accuracy the leader after k lines would have
  (`leader_acc`: what an exact tally gives at that stop line);
- `tally_errors`: responses with a line that differs from the reference solution's line, and the median first wrong
  line;
- `shortcut`: among early stops whose leader after k lines is *not* the majority, the share that still answered the
  majority (an answer read off the prompt rather than the tally; ≈ 0 when only the tally decides);
- the stop-line distribution, response length in tokens, and the cold start's wall time.

Only these shape measurements choose the task variant; nothing here looks at RL.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics as st
import sys
import time

from run_files import git_commit
from task_majority import MajorityBudget
from toy_assets import build_cold_start

HERE = os.path.dirname(os.path.abspath(__file__))
BINS = ((0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.0))


def shape_of(prompts, solutions, texts, tally, encoding) -> dict:
    """The shape measurements of sampled responses (see the module docstring)."""
    from vcppo_trl.toy.majority import (
        format_solution,
        leader_after,
        majority_answer,
        majority_reward,
        parse_prompt,
        reasoning_lines,
    )
    from vcppo_trl.toy.task import THINK_START, extract_boxed_answer

    rewards = majority_reward(texts, solutions)
    rows = []
    for prompt, text, reward in zip(prompts, texts, rewards):
        bits = parse_prompt(prompt)
        k = reasoning_lines(text)
        gold = format_solution(bits, tally=tally, encoding=encoding).replace(THINK_START, "").split("\n")[:-1]
        got = text.replace(THINK_START, "").split("\n")[:k]
        first_error = next((i + 1 for i, (g, h) in enumerate(zip(gold, got)) if g != h), None)
        answer = extract_boxed_answer(text)
        rows.append(
            {
                "n": len(bits),
                "k": k,
                "correct": reward > 0,
                "answered": answer in ("0", "1"),
                "answer": answer,
                "majority": majority_answer(bits),
                "leader": leader_after(bits, min(max(k, 1), len(bits))),
                "first_error": first_error,
                "closed": "</think>" in text,
            }
        )
    by_bin = {}
    for lo, hi in (*BINS, (1.0, 1.01)):
        sel = [r for r in rows if r["k"] >= 1 and lo <= r["k"] / r["n"] < hi]
        name = "complete" if lo == 1.0 else f"[{lo:g},{hi:g})"
        by_bin[name] = {
            "count": len(sel),
            "accuracy": st.mean(r["correct"] for r in sel) if sel else None,
            "leader_acc": st.mean(r["leader"] == r["majority"] for r in sel) if sel else None,
        }
    early = [r for r in rows if r["answered"] and 1 <= r["k"] < r["n"]]
    misled = [r for r in early if r["leader"] != r["majority"]]
    errors = [r["first_error"] for r in rows if r["first_error"] is not None]
    accs = [b["accuracy"] for b in by_bin.values() if b["accuracy"] is not None]
    return {
        "num_responses": len(rows),
        "accuracy": st.mean(r["correct"] for r in rows),
        "closed": st.mean(r["closed"] for r in rows),
        "stop_line_mean": st.mean(r["k"] for r in rows),
        "complete_share": st.mean(r["k"] == r["n"] for r in rows),
        "by_stop_bin": by_bin,
        "monotone": all(a < b for a, b in zip(accs, accs[1:])),
        "tally_errors": {
            "responses": len(errors),
            "median_first_error_line": st.median(errors) if errors else None,
        },
        "shortcut": {
            "early_stops": len(early),
            "leader_not_majority": len(misled),
            "answered_majority_anyway": st.mean(r["answer"] == str(r["majority"]) for r in misled) if misled else None,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True)
    parser.add_argument("--tally", default="counts", choices=("counts", "diff"))
    parser.add_argument("--encoding", default="plain", choices=("plain", "changes"))
    parser.add_argument("--steps", type=int, default=600, help="Cold-start steps.")
    parser.add_argument("--hidden", type=int, default=96)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--bias", type=float, default=None, help="The task's bias (cold start data and test prompts).")
    parser.add_argument(
        "--eval-bias", type=float, default=None, help="Measure on test prompts of this bias instead (same cold start)."
    )
    parser.add_argument("--threads", type=int, default=1, help="1: the numerics of reproduce.py's asset build.")
    parser.add_argument("--cache-dir", default=os.path.join(HERE, ".cache", "majority", "shape"))
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results", "majority", "shape"))
    args = parser.parse_args(argv)

    import dataclasses

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vcppo_trl.toy.reward_model import sample_responses

    torch.set_num_threads(args.threads)
    budget = dataclasses.replace(
        MajorityBudget(),
        cold_start_steps=args.steps,
        tally=args.tally,
        encoding=args.encoding,
        toy_hidden_size=args.hidden,
        toy_num_layers=args.layers,
        **({} if args.bias is None else {"bias": args.bias}),
    )
    # The same cold start (code, data, seed) as `reproduce.py --task majority` with this budget: adopting it means
    # copying this directory's `assets.json` and `cold_start/` into `experiments/.cache/majority/`.
    cache_name = args.name.split("@")[0]  # "<attempt>@<measurement>": another measurement of the same cold start
    manifest = build_cold_start(budget, os.path.join(args.cache_dir, cache_name))
    tokenizer = AutoTokenizer.from_pretrained(manifest["policy"])
    model = AutoModelForCausalLM.from_pretrained(manifest["policy"])
    eval_budget = budget if args.eval_bias is None else dataclasses.replace(budget, bias=args.eval_bias)
    test = eval_budget.splits()["test"]
    t0 = time.time()
    torch.manual_seed(1)
    responses = sample_responses(model, tokenizer, test["prompt"], max_new_tokens=budget.response_length)
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    shape = shape_of(test["prompt"], test["solution"], texts, args.tally, args.encoding)
    shape["response_tokens_mean"] = st.mean(len(r) for r in responses)
    record = {
        "name": args.name,
        "command": "python experiments/majority_shape.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": git_commit(),
        "asset_key": manifest["key"],
        "eval_bias": eval_budget.bias,
        "cold_start_seconds": manifest["cold_start_seconds"],
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "greedy_eval": {k: v for k, v in manifest["cold_start_eval"].items() if not k.endswith("by_difficulty")},
        "sampling_seconds": time.time() - t0,
        "sampled_temperature_1": shape,
        "example": texts[0],
    }
    os.makedirs(args.results_dir, exist_ok=True)
    with open(os.path.join(args.results_dir, f"{args.name}.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps({k: v for k, v in record.items() if k != "example"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

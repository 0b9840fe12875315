"""Benchmark: table 2 of `step.py` (our VC-PPO update against TRL's GRPO step) at a long-tailed length mix.

    python benchmarks/step_lengths.py                     # T = 2048 (minutes)
    python benchmarks/step_lengths.py --smoke             # CI smoke: T = 32, one update per side, in this process

Both sides stop each sample at a length drawn from the same stream (`step_setup.stop_at_drawn_lengths`: EOS is
suppressed while sampling, then written at the drawn length; about 7 % — one in each batch of 8 — stay at the cap, the
rest lognormal with median 0.14 × T, mean ≈ 0.25 × T), on `step.py`'s tiny policy and prompts, batch 8 (2 prompts × 4
samples), KL 0, a rule-based ±1 reward, one optimizer step per update. Sides, each in fresh processes, rotated:
- `grpo`: TRL's `GRPOTrainer` (the installed TRL), one forward over the 8 completions padded to the longest;
- `ours`: `VCPPOTrainer` with the on-policy shortcut, one micro-batch of the 8 sequences at full width (today's
  padded path at `per_device_train_batch_size=8`);
- `ours-budget`: the same with `max_tokens_per_micro_batch` = `max_tokens_per_forward` = 2 × (prompt + T): memory of
  two full-length sequences per forward, the short ones grouped.
Printed: median seconds per update or step, outside generation (the update minus its sampling), ratios to GRPO.
Our update trains a critic of the policy's size as well: it can aim at no less than one GRPO step's time, not below.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import step_setup  # noqa: E402
from step import run_process  # noqa: E402

SIDES = ("grpo", "ours", "ours-budget")


def cell(args: argparse.Namespace, side: str) -> dict:
    budget = 2 * (step_setup.PROMPT_LENGTH + args.length)
    if args.smoke:  # in this process: the code paths, not the timings
        import torch

        torch.set_num_threads(1)
        if side == "grpo":
            import step_grpo

            return step_grpo.run(args.length, 8, args.updates, args.warmup, 4, 0, drawn_lengths=True)
        import step_ours

        max_tokens = budget if side == "ours-budget" else None
        return step_ours.run(
            args.length, 8, args.updates, args.warmup, paper=True, drawn_lengths=True, max_tokens=max_tokens
        )
    script = "step_grpo.py" if side == "grpo" else "step_ours.py"
    command = [sys.executable, os.path.join(HERE, script), "--response-length", str(args.length), "--drawn-lengths"]
    command += ["--updates", str(args.updates), "--warmup", str(args.warmup), "--threads", str(args.threads)]
    if side != "grpo":
        command += ["--paper", *(["--max-tokens", str(budget)] if side == "ours-budget" else [])]
    return run_process(command, dict(os.environ))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.length, args.repeats, args.updates, args.warmup = 32, 1, 1, 0
    print(
        f"Long-tailed lengths up to T={args.length}, batch 8, {args.repeats} process(es) × {args.updates} timed "
        f"update(s) after {args.warmup} warm-up per side, torch threads {args.threads}; medians.",
        flush=True,
    )
    runs = {side: [] for side in SIDES}
    for repeat in range(args.repeats):
        for side in SIDES[repeat % 3 :] + SIDES[: repeat % 3]:
            runs[side].append(cell(args, side))
        print(f"  done: repeat {repeat + 1}/{args.repeats}", flush=True)
    rows = {}
    for side, results in runs.items():
        update = [t for r in results for t in r["update_s"]]
        outside = [t - g for r in results for t, g in zip(r["update_s"], r["generation_s"])]
        rows[side] = (statistics.median(update), statistics.median(outside), update, outside)
    grpo_update, grpo_outside = rows["grpo"][:2]
    header = f"{'side':>12} {'s/update':>9} {'ratio':>6} {'outside gen s':>14} {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for side, (update, outside, _, _) in rows.items():
        print(
            f"{side:>12} {update:>9.3f} {update / grpo_update:>6.2f} {outside:>14.3f} {outside / grpo_outside:>6.2f}"
        )
    print("raw seconds per update or step, and outside generation:")
    for side, (_, _, update, outside) in rows.items():
        print(f"  {side}: " + " ".join(f"{x:.3f}" for x in update))
        print(f"  {side} outside generation: " + " ".join(f"{x:.3f}" for x in outside))


if __name__ == "__main__":
    main()

"""Benchmark: our PPO update time at two checkouts of this repository (before and after a change), interleaved.

    git worktree add /tmp/base <commit>
    python benchmarks/step_versions.py --base /tmp/base                 # table 1's work (KL 0.05, reward model)
    python benchmarks/step_versions.py --base /tmp/base --paper         # the VC-PPO setting (KL 0, rule reward)

Each checkout runs its own `benchmarks/step_ours.py` against its own `src/` (through PYTHONPATH) with this
interpreter, so the libraries are the same on both sides and only our code differs. For every repeat and response
length the two sides run one after the other in fresh processes, the order alternating between repeats, so a machine
that slows down or speeds up during the run weighs on both sides alike. Printed: the median seconds per update and
outside generation, head/base ratios, and every timed update. Timing figures need a quiet machine: run nothing else.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from step import run_process  # noqa: E402


def side_command(checkout: str, args: argparse.Namespace, length: int) -> tuple[list[str], dict[str, str]]:
    command = [
        sys.executable,
        os.path.join(checkout, "benchmarks", "step_ours.py"),
        "--response-length",
        str(length),
        "--batch-size",
        str(args.batch_size),
        "--updates",
        str(args.updates),
        "--warmup",
        str(args.warmup),
        "--threads",
        str(args.threads),
        *(["--paper"] if args.paper else []),
    ]
    env = dict(os.environ, PYTHONPATH=os.path.join(checkout, "src"))
    return command, env


def commit_of(checkout: str) -> str:
    done = subprocess.run(["git", "-C", checkout, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", checkout, "status", "--porcelain", "src"], capture_output=True, text=True)
    return done.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="checkout of the reference commit (e.g. a git worktree)")
    parser.add_argument("--head", default=os.path.dirname(HERE), help="checkout to compare (default: this one)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--paper", action="store_true", help="VCPPOTrainer, KL 0, rule reward (table 2's setting)")
    args = parser.parse_args()

    sides = {"base": args.base, "head": args.head}
    print(
        f"base {commit_of(args.base)} ({args.base}) vs head {commit_of(args.head)} ({args.head}); "
        f"{'VC-PPO setting' if args.paper else 'KL 0.05 + reward model'}, batch {args.batch_size}, "
        f"{args.repeats} repeat(s) x {args.updates} timed update(s) after {args.warmup} warm-up, "
        f"torch threads {args.threads}",
        flush=True,
    )
    update = {(s, t): [] for s in sides for t in args.lengths}
    outside = {(s, t): [] for s in sides for t in args.lengths}
    for repeat in range(args.repeats):
        for length in args.lengths:
            order = ["base", "head"] if repeat % 2 == 0 else ["head", "base"]
            for side in order:
                result = run_process(*side_command(sides[side], args, length))
                update[side, length] += result["update_s"]
                outside[side, length] += [t - g for t, g in zip(result["update_s"], result["generation_s"])]
            print(f"  done: repeat {repeat + 1}/{args.repeats}, T={length}", flush=True)

    header = f"{'T':>5} | {'s/update base':>13} {'head':>7} {'ratio':>6} | {'outside gen base':>16} {'head':>7} {'ratio':>6}"
    print("\nmedians over every timed update of every process; ratio = head / base")
    print(header)
    print("-" * len(header))
    for length in args.lengths:
        ub, uh = (statistics.median(update[s, length]) for s in sides)
        ob, oh = (statistics.median(outside[s, length]) for s in sides)
        print(f"{length:>5} | {ub:>13.3f} {uh:>7.3f} {uh / ub:>6.2f} | {ob:>16.3f} {oh:>7.3f} {oh / ob:>6.2f}")
    print("raw seconds per update:")
    for length in args.lengths:
        for side in sides:
            print(f"  T={length} {side}: " + " ".join(f"{x:.3f}" for x in update[side, length]))


if __name__ == "__main__":
    main()

"""Benchmark: bounded staleness (`max_staleness` 1, 2 and 4) against synchronous updates (`max_staleness=0`).

    python benchmarks/overlap.py                  # T = 512 (minutes)
    python benchmarks/overlap.py --staleness 1    # one-step-off only
    python benchmarks/overlap.py --smoke          # CI smoke: T = 16, staleness 1 and 2, the code paths, not the timings

Generation and learning in separate processes of one thread each (the trainer's torch threads and
`rollout_worker_threads` both 1) on the same machine; `step_setup`'s tiny policy and critic, batch 8, every response
at the cap (the stop token is outside the policy's vocabulary, so both sides decode exactly T steps per batch), KL 0, a
rule-based ±1 reward, one optimizer step per update, the on-policy shortcut. Sides, rotated per repeat, in this
process: `sync` (`max_staleness=0`: sample, then learn) and `s1`, `s2`, `s4` (`max_staleness` s: a worker process
samples up to s batches ahead while the updates train).

Printed (medians over repeats of the medians over timed updates): seconds per update, the synchronous run's
generation G and the rest of its update T, each side's weight push S, the trainer's wait for samples and the largest
staleness, the speed-up (updates per second against sync), the bound (G + T) / max(G, T + S) that perfect overlap
would give, and the share of it reached.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import step_setup  # noqa: E402
import torch  # noqa: E402
from windows import timed_training  # noqa: E402

BATCH = 8


def run_side(response_length: int, max_staleness: int, updates: int, warmup: int, seed: int = 0) -> dict:
    from datasets import Dataset
    from step_ours import vcppo_update_config

    tokenizer = step_setup.build_tokenizer()
    policy, _, _ = step_setup.build_models(response_length, seed)  # no stop token in the vocabulary: full length
    num_prompts = BATCH * (warmup + updates + max_staleness)
    dataset = Dataset.from_dict({"prompt": step_setup.prompt_texts(num_prompts, seed)})
    with tempfile.TemporaryDirectory() as output_dir:
        config = vcppo_update_config(
            output_dir,
            batch=BATCH,
            response_length=response_length,
            updates=warmup + updates,
            seed=seed,
            max_staleness=max_staleness,
            rollout_worker_threads=1,
        )
        seconds, timed = timed_training(policy, tokenizer, dataset, config, warmup)
    generation = statistics.median(m["time/generation_s"] for m in timed)
    update = statistics.median(seconds)
    result = {"update_s": update, "generation_s": generation, "rest_s": update - generation}
    if max_staleness:
        result["rest_s"] = None  # generation runs in the worker: the update's time is not generation + the rest
        result["push_s"] = statistics.median(m["time/weight_push_s"] for m in timed)
        result["wait_s"] = statistics.median(m["time/sampler_wait_s"] for m in timed)
        result["staleness"] = max(m["sampling/staleness_max"] for m in timed)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--updates", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--staleness", type=int, nargs="+", default=[1, 2, 4], help="max_staleness of each side")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.length, args.repeats, args.updates, args.warmup, args.staleness = 16, 1, 2, 1, [1, 2]
    torch.set_num_threads(1)
    print(
        f"Every response at T={args.length}, batch {BATCH}, {args.repeats} repeat(s) × {args.updates} timed update(s) "
        f"after {args.warmup} warm-up per side; trainer and worker 1 torch thread each; medians.",
        flush=True,
    )
    sides = {"sync": 0, **{f"s{bound}": bound for bound in args.staleness}}
    runs = {side: [] for side in sides}
    order = list(sides)
    for repeat in range(args.repeats):  # the order rotates, so no side always runs first or last
        shift = repeat % len(order)
        for side in order[shift:] + order[:shift]:
            runs[side].append(run_side(args.length, sides[side], args.updates, args.warmup))
        print(f"  done: repeat {repeat + 1}/{args.repeats}", flush=True)
    median = {side: {k: statistics.median(r[k] for r in rs) for k in rs[0] if rs[0][k] is not None}
              for side, rs in runs.items()}  # fmt: skip
    sync = median["sync"]
    g, t = sync["generation_s"], sync["rest_s"]
    print(
        f"{'side':<8} {'upd s':>7} {'gen s':>7} {'rest s':>7} {'push s':>7} {'wait s':>7} {'staleness':>9} "
        f"{'speed-up':>8} {'bound':>6} {'share':>6}"
    )
    print(f"{'sync':<8} {sync['update_s']:7.3f} {g:7.3f} {t:7.3f} {'-':>7} {'-':>7} {0:9d} {1:8.2f} {'-':>6} {'-':>6}")
    for side in order[1:]:
        ahead = median[side]
        s = ahead["push_s"]
        # Perfect overlap: each update costs the longer of generation and the rest of the update with its push; more
        # batches ahead smooth the waits but do not raise this bound.
        bound = (g + t) / max(g, t + s)
        speedup = sync["update_s"] / ahead["update_s"]
        print(
            f"{side:<8} {ahead['update_s']:7.3f} {ahead['generation_s']:7.3f} {'-':>7} {s:7.4f} {ahead['wait_s']:7.3f} "
            f"{int(ahead['staleness']):9d} {speedup:8.2f} {bound:6.2f} {speedup / bound:6.2f}"
        )
    print(
        "speed-up: updates/s against sync; bound: (G + T) / max(G, T + S) with G and T the sync run's generation and "
        "rest, S the side's weight push; share: speed-up / bound."
    )


if __name__ == "__main__":
    main()

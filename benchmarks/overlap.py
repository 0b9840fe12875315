"""Benchmark: one-step-off overlap (`max_staleness=1`) against synchronous updates (`max_staleness=0`).

    python benchmarks/overlap.py                  # T = 512 (minutes)
    python benchmarks/overlap.py --smoke          # CI smoke: T = 16, the code paths, not the timings

Generation and learning in separate processes of one thread each (the trainer's torch threads and
`rollout_worker_threads` both 1) on the same machine; `step_setup`'s tiny policy and critic, batch 8, every response
at the cap (the stop token is outside the policy's vocabulary, so both sides decode exactly T steps per batch), KL 0, a
rule-based ±1 reward, one optimizer step per update, the on-policy shortcut. Sides, rotated per repeat, in this
process: `sync` (`max_staleness=0`: sample, then learn) and `overlap` (`max_staleness=1`: a worker process samples
batch k+1 while update k trains).

Printed (medians over repeats of the medians over timed updates): seconds per update, the synchronous run's
generation G and the rest of its update T, the overlap's weight push S and the trainer's wait for samples, the
speed-up (updates per second, overlap / sync) and the bound (G + T) / max(G, T + S) that perfect overlap would give
(with G the synchronous run's generation, and with G the worker's), and the share of each bound reached.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import step_setup  # noqa: E402
import torch  # noqa: E402
from windows import Collect  # noqa: E402

BATCH = 8


def run_side(response_length: int, max_staleness: int, updates: int, warmup: int, seed: int = 0) -> dict:
    from datasets import Dataset
    from step_ours import first_letter_reward, vcppo_update_config

    from vcppo_trl import VCPPOTrainer

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
        collect = Collect()
        trainer = VCPPOTrainer(
            model=policy,
            reward_funcs=first_letter_reward,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[collect],
        )
        trainer.log = lambda *a, **k: None
        collect.marks = [time.perf_counter()]
        trainer.train()
    seconds = [b - a for a, b in zip(collect.marks, collect.marks[1:])][warmup:]
    timed = collect.metrics[warmup:]
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
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.length, args.repeats, args.updates, args.warmup = 16, 1, 2, 1
    torch.set_num_threads(1)
    print(
        f"Every response at T={args.length}, batch {BATCH}, {args.repeats} repeat(s) × {args.updates} timed update(s) "
        f"after {args.warmup} warm-up per side; trainer and worker 1 torch thread each; medians.",
        flush=True,
    )
    sides = {"sync": 0, "overlap": 1}
    runs = {side: [] for side in sides}
    order = list(sides)
    for repeat in range(args.repeats):
        for side in order[repeat % 2 :] + order[: repeat % 2]:
            runs[side].append(run_side(args.length, sides[side], args.updates, args.warmup))
        print(f"  done: repeat {repeat + 1}/{args.repeats}", flush=True)
    median = {side: {k: statistics.median(r[k] for r in rs) for k in rs[0] if rs[0][k] is not None}
              for side, rs in runs.items()}  # fmt: skip
    sync, overlap = median["sync"], median["overlap"]
    g, t, s = sync["generation_s"], sync["rest_s"], overlap["push_s"]
    bound = (g + t) / max(g, t + s)
    speedup = sync["update_s"] / overlap["update_s"]
    print(f"{'side':<8} {'upd s':>7} {'gen s':>7} {'rest s':>7} {'push s':>7} {'wait s':>7} {'staleness':>9}")
    print(f"{'sync':<8} {sync['update_s']:7.3f} {g:7.3f} {t:7.3f} {'-':>7} {'-':>7} {0:9d}")
    print(
        f"{'overlap':<8} {overlap['update_s']:7.3f} {overlap['generation_s']:7.3f} {'-':>7} {s:7.4f} "
        f"{overlap['wait_s']:7.3f} {int(overlap['staleness']):9d}"
    )
    # The worker's own generation time can differ from the in-process sampler's (another process, another cache):
    # the bound with the worker's G says how much of what the worker allows the overlap reached.
    g_worker = overlap["generation_s"]
    bound_worker = (g + t) / max(g_worker, t + s)
    print(f"speed-up (updates/s, overlap / sync): {speedup:.2f}")
    print(
        f"bound (G + T) / max(G, T + S), G the sync run's generation: {bound:.2f} (share reached {speedup / bound:.2f})"
    )
    print(
        f"bound with G the worker's generation ({g_worker:.3f} s): {bound_worker:.2f} "
        f"(share reached {speedup / bound_worker:.2f})"
    )


if __name__ == "__main__":
    main()

"""Benchmark: generation windows (`generation_window`) at a long-tailed length mix, against whole responses and against
TRL's GRPO step.

    python benchmarks/windows.py                  # T = 1024 (minutes)
    python benchmarks/windows.py --smoke          # CI smoke: T = 32, the code paths, not the timings

The stop is applied while sampling (a logits processor, [`DrawnLengthStop`]): each prompt has a length drawn from
`step_setup.long_tailed_lengths` (about 7 % at the cap, the rest lognormal, mean ≈ 0.25 × T; drawn per batch of 8
prompts), the stop token is suppressed before it and forced at it, across windows, so a window sees where a response
really ends. `step_setup`'s tiny policy, batch 8 (8 prompts, one sample each), KL 0, a rule-based ±1 reward, one
optimizer step per update, the on-policy shortcut. Sides, in this process, rotated per repeat:
- `whole`: `VCPPOTrainer`, whole responses every update (`generation_window=None`);
- `window-T/2`, `window-T/4`: the same with `generation_window` = T/2, T/4 (the pool fills during the warm-up);
- `whole-budget`, `win-T/4-budget`: `whole` and `window-T/4` with `step_lengths.py`'s token budget
  (`max_tokens_per_micro_batch` = 2 × (prompt + T): two full-length sequences per forward, the short ones grouped);
- `win-T/4-pool`, `win-T/8-pool` (and `-budget`): windows of T/4 and T/8 with a larger pool (`rollout_pool_size` =
  batch × E⌈l/W⌉ over the length mix, rounded up to whole batches: [`pool_size`]), so that an update finishes about a
  batch of responses, as a whole-response update does;
- `grpo`: TRL's `GRPOTrainer` step (`step_grpo.py` in a fresh process, its lengths cut after sampling: GRPO decodes
  to the longest response either way), 2 prompts × 4 samples; its finished responses per second are 8 per step.
Printed per side (medians over repeats): finished responses per second of update time, generation seconds per update,
the policy's and the critic's tokens trained per update, and finished responses per second against `whole` and GRPO.
"""

from __future__ import annotations

import argparse
import math
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
from transformers import LogitsProcessor, LogitsProcessorList, TrainerCallback  # noqa: E402

BATCH = 8


class DrawnLengthStop(LogitsProcessor):
    """Force the stop token at each prompt's drawn response length, and forbid it before (`lengths`: prompt ids ->
    length; at the cap, never). Reads the response so far from the context, so it holds across windows."""

    def __init__(self, lengths: dict[tuple[int, ...], int], response_length: int):
        self.lengths = lengths
        self.response_length = response_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        eos = step_setup.EOS_ID
        for row, ids in enumerate(input_ids.tolist()):
            pads = next((i for i, t in enumerate(ids) if t != eos), len(ids))  # left padding (pad = EOS)
            prompt = tuple(ids[pads : pads + step_setup.PROMPT_LENGTH])
            if prompt not in self.lengths:  # a row that already stopped (padded with EOS after it)
                continue
            generated = len(ids) - pads - step_setup.PROMPT_LENGTH
            length = self.lengths[prompt]
            if length < self.response_length and generated == length:
                scores[row] = torch.where(torch.arange(scores.shape[1]) == eos, 0.0, float("-inf"))
            else:
                scores[row, eos] = float("-inf")
        return scores


def drawn_lengths(prompts: list[list[int]], response_length: int, seed: int) -> dict[tuple[int, ...], int]:
    generator = torch.Generator().manual_seed(seed + 4)
    lengths = {}
    for first in range(0, len(prompts), BATCH):
        chunk = prompts[first : first + BATCH]
        for ids, length in zip(chunk, step_setup.long_tailed_lengths(len(chunk), response_length, generator)):
            lengths[tuple(ids)] = length
    return lengths


class Collect(TrainerCallback):
    def __init__(self):
        self.metrics = []
        self.marks = [time.perf_counter()]

    def on_step_end(self, args, state, control, metrics=None, **kwargs):
        self.marks.append(time.perf_counter())
        self.metrics.append(dict(metrics or {}))


def timed_training(policy, tokenizer, dataset, config, warmup: int) -> tuple[list[float], list[dict]]:
    """Train `step_ours`' update (`first_letter_reward`) with `config`, logging off; the seconds and the metrics of
    each update after the first `warmup`."""
    from step_ours import first_letter_reward

    from vcppo_trl import VCPPOTrainer

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
    seconds = [b - a for a, b in zip(collect.marks, collect.marks[1:])]
    return seconds[warmup:], collect.metrics[warmup:]


def pool_size(response_length: int, window: int) -> int:
    """`rollout_pool_size` for a window: the batch × E⌈l/W⌉ (windows a response of the long-tailed mix takes), rounded
    up to whole batches (the micro-batch is the batch here)."""
    lengths = step_setup.long_tailed_lengths(10_000, response_length, torch.Generator().manual_seed(1234))
    windows = sum(-(-length // window) for length in lengths) / len(lengths)
    return BATCH * max(1, math.ceil(windows))


def run_ours(
    response_length: int,
    window: int | None,
    updates: int,
    warmup: int,
    budget: bool = False,
    seed: int = 0,
    pool: int | None = None,
) -> dict:
    from datasets import Dataset
    from step_ours import vcppo_update_config

    tokenizer = step_setup.build_tokenizer()
    policy, _, _ = step_setup.build_models(response_length, seed, stop_token_in_vocab=True)
    # Windows draw fresh prompts only as responses finish; a larger pool holds more at once.
    num_prompts = BATCH * (warmup + updates) * 2 + 2 * (pool or 0)
    prompt_ids = step_setup.prompt_ids(num_prompts, seed)
    stop = DrawnLengthStop(drawn_lengths(prompt_ids, response_length, seed), response_length)
    original = policy.generate

    def generate(*args, **kwargs):
        return original(*args, logits_processor=LogitsProcessorList([stop]), **kwargs)

    policy.generate = generate
    dataset = Dataset.from_dict({"prompt": step_setup.prompt_texts(num_prompts, seed)})
    with tempfile.TemporaryDirectory() as output_dir:
        budget_tokens = 2 * (step_setup.PROMPT_LENGTH + response_length)  # step_lengths.py's token budget
        config = vcppo_update_config(
            output_dir,
            batch=BATCH,
            response_length=response_length,
            updates=warmup + updates,
            seed=seed,
            generation_window=window,
            rollout_pool_size=pool,
            # Two full-length sequences per forward, the short ones grouped.
            max_tokens_per_micro_batch=budget_tokens if budget else None,
        )
        seconds, timed = timed_training(policy, tokenizer, dataset, config, warmup)
    finished = [m.get("rollout/finished_responses", float(BATCH)) for m in timed]
    # The critic trains on finished responses' tokens; the policy on the window's (all tokens without a window).
    critic = [m.get("diagnostics/response_length_mean", 0.0) * n for m, n in zip(timed, finished)]
    policy = [m.get("rollout/window_tokens", c) for m, c in zip(timed, critic)]
    return {
        "finished_per_s": sum(finished) / sum(seconds),
        "generation_s": statistics.median(m["time/generation_s"] for m in timed),
        "update_s": statistics.median(seconds),
        "policy_tokens": statistics.median(policy),
        "critic_tokens": statistics.median(critic),
        "finished_per_update": statistics.median(finished),
    }


def run_grpo(response_length: int, updates: int, warmup: int, threads: int, smoke: bool = False) -> dict:
    if smoke:  # in this process: the code path
        import step_grpo

        result = step_grpo.run(response_length, BATCH, updates, warmup, 4, 0, drawn_lengths=True)
    else:
        from step import run_process

        command = [sys.executable, os.path.join(HERE, "step_grpo.py"), "--response-length", str(response_length)]
        command += ["--drawn-lengths", "--updates", str(updates), "--warmup", str(warmup), "--threads", str(threads)]
        result = run_process(command, dict(os.environ))
    update = statistics.median(result["update_s"])
    return {
        "finished_per_s": BATCH / update,
        "update_s": update,
        "generation_s": statistics.median(result["generation_s"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--updates", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument(
        "--sides", nargs="+", help="Only these sides (names as printed), e.g. whole win-T/4-pool grpo."
    )
    args = parser.parse_args()
    if args.smoke:
        args.length, args.repeats, args.updates, args.warmup = 32, 1, 2, 1
    torch.set_num_threads(args.threads)
    length = args.length
    pools = {w: pool_size(length, length // w) for w in (4, 8)}
    sides = {  # name -> (generation_window, token budget, rollout_pool_size)
        "whole": (None, False, None),
        "window-T/2": (length // 2, False, None),
        "window-T/4": (length // 4, False, None),
        "whole-budget": (None, True, None),
        "win-T/4-budget": (length // 4, True, None),
        "win-T/4-pool": (length // 4, False, pools[4]),
        "win-T/4-pool-budget": (length // 4, True, pools[4]),
        "win-T/8-pool": (length // 8, False, pools[8]),
        "win-T/8-pool-budget": (length // 8, True, pools[8]),
    }
    known = [*sides, "grpo"]
    if args.sides:
        unknown = sorted(set(args.sides) - set(known))
        if unknown or "whole" not in args.sides:
            parser.error(f"--sides: choose from {known}, with 'whole' (the reference); unknown: {unknown}")
        sides = {name: sides[name] for name in sides if name in args.sides}
    print(
        f"Long-tailed lengths up to T={length}, stop applied while sampling, batch {BATCH}, {args.repeats} repeat(s) × "
        f"{args.updates} timed update(s) after {args.warmup} warm-up per side, torch threads {args.threads}; medians. "
        f"Larger pools: {pools[4]} responses in flight at T/4, {pools[8]} at T/8 (batch × E⌈l/W⌉).",
        flush=True,
    )
    runs = {side: [] for side in [*sides, "grpo"] if not args.sides or side in args.sides}
    order = list(runs)
    for repeat in range(args.repeats):
        for side in order[repeat % len(order) :] + order[: repeat % len(order)]:
            if side == "grpo":  # TRL's GRPO in a fresh process (in this one for the smoke run)
                runs[side].append(run_grpo(length, args.updates, args.warmup, args.threads, smoke=args.smoke))
            else:
                window, budget, pool = sides[side]
                runs[side].append(run_ours(length, window, args.updates, args.warmup, budget=budget, pool=pool))
        print(f"  done: repeat {repeat + 1}/{args.repeats}", flush=True)
    median = {side: {k: statistics.median(r[k] for r in rs) for k in rs[0] if rs[0][k] is not None}
              for side, rs in runs.items() if rs}  # fmt: skip
    whole, grpo = median["whole"]["finished_per_s"], median.get("grpo", {}).get("finished_per_s")
    header = (
        f"{'side':<19} {'finished/s':>10} {'gen s/upd':>9} {'upd s':>7} {'done/upd':>8} {'pol tok':>8} {'crit tok':>8}"
    )
    print(header + f" {'vs whole':>8} {'vs GRPO':>8}")
    for side, m in median.items():
        vs_grpo = f"{m['finished_per_s'] / grpo:8.2f}" if grpo else f"{'-':>8}"
        print(
            f"{side:<19} {m['finished_per_s']:10.2f} {m['generation_s']:9.3f} {m['update_s']:7.3f} "
            f"{m.get('finished_per_update', BATCH):8.1f} {m.get('policy_tokens', float('nan')):8.0f} "
            f"{m.get('critic_tokens', float('nan')):8.0f} "
            f"{m['finished_per_s'] / whole:8.2f} {vs_grpo}"
        )


if __name__ == "__main__":
    main()

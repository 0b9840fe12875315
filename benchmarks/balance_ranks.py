"""Benchmark: balanced ranks (`balance_ranks`) — the PPO update of 2 CPU processes when one drew the long responses.

    python benchmarks/balance_ranks.py                # 2 processes, responses up to 1024 tokens, 3 repeats (minutes)
    python benchmarks/balance_ranks.py --smoke        # tiny sizes, 1 repeat, seconds (checks that it runs)

The rollout is built directly, not sampled: 2 × 16 response lengths are drawn long-tailed once from a seed
(`step_setup.long_tailed_lengths`: ~7 % at the cap, the rest lognormal, mean ≈ 0.25 × max), sorted, and the longer
half is forced onto rank 1 (prompts 24–64 tokens on both). One update = `PPOLearner.update` only (one PPO epoch, 2
mini-batches of 8 sequences per process, policy and critic forward and backward, DDP's all-reduce, an AdamW step),
under `max_tokens_per_micro_batch` = 4 × (longest prompt + max); the rollout's forwards and generation are left out.

Each repeat launches the two processes (`torch.distributed.run`, gloo, `ACCELERATE_USE_CPU=1`, as
tests/integration/distributed does) once with `balance_ranks` off and once on, in alternating order; each launch runs
a warm-up update and `--updates` timed ones, each timed from a barrier to the slower rank's end. Printed: the median
update seconds off and on, the speed-up, and the ideal — the slower rank's tokens over the mean rank's
(`perf/rank_token_imbalance` without balancing, over the update's mini-batches) — and what balancing left (whole rows
cannot split). Target (issue 36): the speed-up within 15 % of the ideal. Timing needs a quiet machine.

The ideal counts tokens only; an update also has costs that do not grow with its tokens (the optimizer steps, the
gradient all-reduce, launching micro-batches), which no balancing removes. Two more variants, fixed before their first
run, measure them: `short` and `long` give both ranks the same rows (rank 0's draw, or rank 1's; balancing off, nothing
to balance). A line through them, seconds = fixed + per-token × tokens of the slower rank, predicts the "off" time (a
check of the line: "off" is not used to fit it) and the balanced time at the tokens balancing left, and so the speed-up
balancing can reach on this machine, printed beside the measured one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_setup  # noqa: E402
import token_budget  # noqa: E402

PER_RANK = 16
MINI_BATCHES = 2
ROWS_PER_MICRO_BATCH = 4
VARIANTS = ("off", "on", "short", "long")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def draw_lengths(max_length: int, rank: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """`(prompt_lengths, response_lengths)` of one rank: the shorter half of a long-tailed draw (rank 0) or the longer."""
    generator = torch.Generator().manual_seed(seed)
    responses = sorted(step_setup.long_tailed_lengths(2 * PER_RANK, max_length, generator))
    prompts = torch.randint(24, 65, (2 * PER_RANK,), generator=generator).tolist()
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    shuffled = torch.randperm(PER_RANK, generator=torch.Generator().manual_seed(seed + 1 + rank)).tolist()
    return [prompts[mine][i] for i in shuffled], [responses[mine][i] for i in shuffled]


def run_worker(args: argparse.Namespace) -> None:
    """One rank: build the pair and the rollout, one warm-up and `args.updates` timed updates; rank 0 writes JSON."""
    from accelerate import Accelerator

    from vcppo_trl import PPOConfig
    from vcppo_trl.learner.optimizers import parameter_groups
    from vcppo_trl.learner.ppo_learner import PPOLearner
    from vcppo_trl.learner.settings import LearnerSettings

    torch.set_num_threads(args.threads)
    rank = int(os.environ["RANK"])
    # Both ranks' widths: the budget and the model's positions must be the same on both.
    widest_prompt = max(max(draw_lengths(args.max_length, r)[0]) for r in range(2))
    # `short`/`long`: both ranks hold the same rows (rank 0's or rank 1's draw), the equal loads of the fitted line.
    drawn_for = {"short": 0, "long": 1}.get(args.worker, rank)
    prompt_lengths, response_lengths = draw_lengths(args.max_length, drawn_for)
    rollout = token_budget.build_rollout(prompt_lengths, response_lengths)
    pair = token_budget.build_pair(widest_prompt + args.max_length + 8, args.hidden, args.layers, args.heads)
    config = PPOConfig(
        output_dir=os.path.join(tempfile.gettempdir(), "balance_ranks_benchmark"),
        per_device_train_batch_size=ROWS_PER_MICRO_BATCH,
        gradient_accumulation_steps=PER_RANK // MINI_BATCHES // ROWS_PER_MICRO_BATCH,
        num_mini_batches=MINI_BATCHES,
        num_ppo_epochs=1,
        max_tokens_per_micro_batch=ROWS_PER_MICRO_BATCH * (widest_prompt + args.max_length),
        balance_ranks=args.worker == "on",
        response_length=args.max_length,
        lam=0.95,
        kl_coef=0.0,
        learning_rate=1e-5,
        bf16=False,
        use_cpu=True,
        report_to="none",
    )
    accelerator = Accelerator(cpu=True)  # after the config, whose construction resets accelerate's state
    rates = dict(learning_rate=config.learning_rate, value_learning_rate=config.value_learning_rate)
    groups = parameter_groups(pair.named_parameters(), set(), **rates, weight_decay=config.weight_decay)
    optimizer = torch.optim.AdamW(groups, lr=config.learning_rate)
    model, optimizer = accelerator.prepare(pair, optimizer)
    learner = PPOLearner(
        model,
        optimizer,
        lr_scheduler=None,
        accelerator=accelerator,
        settings=LearnerSettings.from_args(config),
        is_deepspeed=False,
        local_mini_batch_size=PER_RANK // MINI_BATCHES,
    )
    mask = rollout.response_mask
    rollout.values = torch.zeros(mask.shape)
    rollout.logprobs = torch.full(mask.shape, -1.0) * mask
    returns = (rollout.scores[:, None] * mask).float()
    seconds, balance = [], {}
    for i in range(1 + args.updates):
        torch.distributed.barrier()
        started = time.perf_counter()
        result = learner.update(rollout, returns, returns, value_cliprange=0.2, update_index=i + 1)
        elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
        torch.distributed.all_reduce(elapsed, op=torch.distributed.ReduceOp.MAX)  # the slower rank's
        if i:
            seconds.append(float(elapsed))
        balance = result.balance
    tokens = torch.tensor([float(rollout.attention_mask.sum())])
    both = accelerator.gather(tokens).tolist()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"seconds": seconds, "balance": balance, "rank_tokens": both, "lengths": response_lengths}, f)
    accelerator.wait_for_everyone()
    torch.distributed.destroy_process_group()


def launch(args: argparse.Namespace, variant: str, out: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.update(
        ACCELERATE_USE_CPU="1",
        OMP_NUM_THREADS=str(args.threads),
        PYTHONPATH=os.pathsep.join([os.path.join(REPO, "src"), env.get("PYTHONPATH", "")]),
    )
    cmd = [
        sys.executable,
        *("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"),
        os.path.abspath(__file__),
        *("--worker", variant, "--out", out, "--max-length", str(args.max_length), "--updates", str(args.updates)),
        *("--threads", str(args.threads), "--hidden", str(args.hidden), "--layers", str(args.layers)),
        *("--heads", str(args.heads)),
    ]
    for attempt in (1, 2):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
        if not done.returncode:
            break
        if os.path.exists(out):  # rank 0 wrote every timing before the processes' teardown failed
            print(f"  ({variant}: exit {done.returncode} after its timings were written, kept)", flush=True)
            break
        print(f"  ({variant}: failed with exit {done.returncode}, attempt {attempt} of 2)", flush=True)
    else:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    with open(out) as f:
        result = json.load(f)
    # Every launch's raw seconds as it finishes: a later failure loses none of them.
    print(f"  {variant}: " + " ".join(f"{t:.3f}" for t in result["seconds"]), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat, one timed update")
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.max_length, args.repeats, args.updates, args.hidden, args.layers = 128, 1, 1, 64, 1
    if args.worker:
        run_worker(args)
        return

    print(
        f"PPOLearner.update of 2 CPU processes (gloo), {PER_RANK} sequences each, {MINI_BATCHES} mini-batches, one "
        f"epoch, responses up to {args.max_length} tokens (the longer half of a long-tailed draw on rank 1); Qwen2 "
        f"hidden {args.hidden}, {args.layers} layers, {args.heads} heads, float32, {args.threads} torch thread(s) per "
        f"process; {args.repeats} repeat(s) × {args.updates} timed update(s) after 1 warm-up, off/on interleaved.",
        flush=True,
    )
    runs: dict[str, list[dict]] = {variant: [] for variant in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for variant in VARIANTS if repeat % 2 == 0 else VARIANTS[::-1]:
                runs[variant].append(launch(args, variant, os.path.join(tmp, f"{variant}{repeat}.json")))
            print(f"  done: repeat {repeat + 1}/{args.repeats}", flush=True)
    off = statistics.median(t for r in runs["off"] for t in r["seconds"])
    on = statistics.median(t for r in runs["on"] for t in r["seconds"])
    ideal = runs["on"][0]["balance"]["perf/rank_token_imbalance_before"]
    left = runs["on"][0]["balance"]["perf/rank_token_imbalance"]
    rank_tokens = runs["off"][0]["rank_tokens"]
    print(f"\nreal tokens per rank (prompt + response): {rank_tokens[0]:.0f} / {rank_tokens[1]:.0f}")
    print(f"token imbalance (slower rank over the mean, per step, summed): {ideal:.3f} off, {left:.3f} on")
    header = f"{'off s/update':>13} {'on s/update':>12} {'speed-up':>9} {'ideal':>6} {'speed-up / ideal':>17}"
    print(header)
    print("-" * len(header))
    print(f"{off:>13.3f} {on:>12.3f} {off / on:>9.2f} {ideal:>6.2f} {off / on / ideal:>17.2f}")
    print(
        f"(ideal with whole rows: {ideal / left:.2f}; target: speed-up within 15 % of the ideal, ≥ {0.85 * ideal:.2f})"
    )
    print_fixed_cost_line(runs, off=off, on=on, ideal=ideal, left=left)
    print("\nraw seconds per update (slower rank):")
    for variant in VARIANTS:
        print(f"  {variant}: " + " ".join(f"{t:.3f}" for r in runs[variant] for t in r["seconds"]))


def print_fixed_cost_line(runs: dict[str, list[dict]], *, off: float, on: float, ideal: float, left: float) -> None:
    """The line through the equal-load variants (see the module docstring) and what it predicts for "off" and "on"."""
    short_tokens, long_tokens = runs["short"][0]["rank_tokens"][0], runs["long"][0]["rank_tokens"][0]
    short = statistics.median(t for r in runs["short"] for t in r["seconds"])
    long = statistics.median(t for r in runs["long"] for t in r["seconds"])
    per_token = (long - short) / (long_tokens - short_tokens)
    fixed = short - per_token * short_tokens
    mean_tokens = sum(runs["off"][0]["rank_tokens"]) / 2
    # The slower rank's tokens summed over the mini-batches: the imbalance times the mean rank's
    predicted_off, predicted_on = fixed + per_token * ideal * mean_tokens, fixed + per_token * left * mean_tokens
    print(
        f"\nequal loads on both ranks: {short:.3f} s at {short_tokens:.0f} tokens, {long:.3f} s at {long_tokens:.0f}: "
        f"fixed {fixed:.3f} s per update + {per_token * 1e3:.3f} ms per token of the slower rank"
    )
    print(
        f"the line predicts off {predicted_off:.3f} s (measured {off:.3f}), on {predicted_on:.3f} s (measured {on:.3f})"
    )
    reachable = predicted_off / predicted_on
    print(
        f"speed-up the line allows with the rows balancing left: {reachable:.2f}; measured {off / on:.2f} "
        f"({off / on / reachable:.2f} of it)"
    )


if __name__ == "__main__":
    main()

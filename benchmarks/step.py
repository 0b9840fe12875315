"""Benchmark: one PPO update, TRL 1.12's `trl.experimental.ppo.PPOTrainer` against vcppo_trl, and log-prob memory.

    python benchmarks/step.py                        # all three tables (installs TRL 1.12 into its own venv first)
    python benchmarks/step.py --ours-only --skip-memory   # tables 1 (ours only) and 2 (ours vs GRPO): no install
    python benchmarks/step.py --ours-only --smoke    # CI smoke: our side only, one short update each, seconds

Table 1, the same work on both sides: a tiny Qwen2 policy (2 layers, hidden 64, 99-token vocabulary) built from the
same seed, a reward model and a value model of the same size, the same prompts (16 tokens, no padding), batch 8, one
PPO epoch, one minibatch, KL coefficient 0.05 with a reference model, temperature 0.7, float32 on CPU, no gradient
checkpointing. Responses are forced to full length on both sides: the tokenizer's EOS/pad is id 99, outside the
models' 99-token vocabulary, so it is never sampled and nothing is truncated (see `step_setup.py`). TRL 1.12 runs in
`benchmarks/.venv-trl112` (created on first use: `torch==2.13.0`, `trl==1.12.0`, and our transformers, accelerate and
datasets versions) through `step_trl112.py`; ours through `step_ours.py`. Each (side, length) runs in a fresh process,
the two sides interleaved, `--repeats` times; each process does `--warmup` updates, then `--updates` timed ones.
Printed: the median wall time per update (between consecutive `on_step_end` callbacks), the median time outside
generation (update minus the generation call: TRL's `batch_generation`, our `generate`), response tokens per second,
the largest peak RSS of the processes (`resource.getrusage`), and ours/theirs ratios.

Table 2, the VC-PPO paper's setting against TRL's `GRPOTrainer` (the TRL installed with vcppo_trl, `step_grpo.py`):
our `VCPPOTrainer` update (KL 0, no reference model, a rule-based ±1 reward; it trains the policy and a critic of the
policy's size) against a GRPO step (`beta=0`, one optimizer step per generation) on the same number of completions of
the same length, the same policy and prompts and the same reward (GRPO: `--batch-size / --num-generations` prompts ×
`--num-generations` samples). Ours twice: with the on-policy shortcut (the default: one PPO epoch and one mini-batch,
so the old log-probs are the training forward's, as in GRPO) and without it (`on_policy_shortcut=False`: an extra
policy forward in the rollout). The three run interleaved, in fresh processes, `--repeats` times.

Table 3, memory of the log-prob pass for B = 2, T = 2048 with vocabularies of 1k, 32k and 152k (hidden 16): the peak
RSS increase of one pass, chunked (ours) against full logits, each cell in a fresh process (`logprob_memory.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from importlib import metadata

HERE = os.path.dirname(os.path.abspath(__file__))
TRL_VENV = os.path.join(HERE, ".venv-trl112")
TRL_PYTHON = os.path.join(TRL_VENV, "bin", "python")
sys.path.insert(0, HERE)


def ensure_trl112_venv() -> str:
    """Create `benchmarks/.venv-trl112` with TRL 1.12 and our versions of torch, transformers, accelerate, datasets."""
    if os.path.exists(TRL_PYTHON):
        probe = subprocess.run(
            [TRL_PYTHON, "-c", "import trl; print(trl.__version__)"], capture_output=True, text=True
        )
        if probe.stdout.strip() == "1.12.0":
            return TRL_PYTHON
    print(f"Creating {TRL_VENV} with trl==1.12.0 (once) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", TRL_VENV], check=True)
    pip = [TRL_PYTHON, "-m", "pip", "install", "-q"]
    # The exact torch pin takes the CPU build on our machines; an unpinned torch could pull a CUDA one.
    subprocess.run([*pip, f"torch=={metadata.version('torch').split('+')[0]}"], check=True)
    same = [f"{name}=={metadata.version(name)}" for name in ("transformers", "accelerate", "datasets")]
    subprocess.run([*pip, "trl==1.12.0", *same], check=True)
    return TRL_PYTHON


def run_process(command: list[str], env: dict[str, str]) -> dict:
    """Run one benchmark cell in a fresh process and return its `BENCH_JSON` line."""
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    for line in done.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            return json.loads(line[len("BENCH_JSON ") :])
    raise RuntimeError(f"{' '.join(command)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


def cell_command(python: str, script: str, args: argparse.Namespace, length: int, *extra: str) -> list[str]:
    return [
        python,
        os.path.join(HERE, script),
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
        *extra,
    ]


def run_ours_cell(args: argparse.Namespace, length: int) -> dict:
    """One cell of table 1 (TRL 1.12's work: KL 0.05 with a reference model, a reward model)."""
    if args.in_process:
        import step_ours

        return step_ours.run(length, args.batch_size, args.updates, args.warmup)
    return run_process(cell_command(sys.executable, "step_ours.py", args, length), dict(os.environ))


def run_paper_cell(args: argparse.Namespace, length: int, side: str) -> dict:
    """One cell of table 2: `side` is "grpo", "shortcut" (ours, default) or "no-shortcut" (ours)."""
    if side == "grpo":
        if args.in_process:
            import step_grpo

            return step_grpo.run(length, args.batch_size, args.updates, args.warmup, args.num_generations)
        extra = ("--num-generations", str(args.num_generations))
        return run_process(cell_command(sys.executable, "step_grpo.py", args, length, *extra), dict(os.environ))
    shortcut = side == "shortcut"
    if args.in_process:
        import step_ours

        return step_ours.run(length, args.batch_size, args.updates, args.warmup, paper=True, shortcut=shortcut)
    extra = ("--paper",) if shortcut else ("--paper", "--no-shortcut")
    return run_process(cell_command(sys.executable, "step_ours.py", args, length, *extra), dict(os.environ))


def run_trl_cell(args: argparse.Namespace, length: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return run_process(cell_command(TRL_PYTHON, "step_trl112.py", args, length), env)


def summarise(results: list[dict], batch_size: int) -> dict:
    """Medians over every timed update of every process of one (side, length)."""
    update = [t for r in results for t in r["update_s"]]
    outside = [t - g for r in results for t, g in zip(r["update_s"], r["generation_s"])]
    length = results[0]["response_length"]
    median_update = statistics.median(update)
    return {
        "update_s": median_update,
        "outside_s": statistics.median(outside),
        "tokens_per_s": batch_size * length / median_update,
        "peak_rss_mib": max(r["peak_rss_mib"] for r in results),
        "raw_update_s": update,
        "raw_outside_s": outside,
    }


def print_comparison(lengths: list[int], ours: dict, theirs: dict | None) -> None:
    print(
        "\nTable 1 — the same work (KL 0.05 + reference model, reward model, value model), per PPO update; peak RSS is "
        "resource.getrusage's ru_maxrss, the largest over the processes:"
    )
    if theirs is None:
        header = (
            f"{'T':>5} {'ours s/update':>14} {'ours outside gen s':>19} {'ours tok/s':>11} {'ours peak RSS MiB':>18}"
        )
        print(header)
        print("-" * len(header))
        for length in lengths:
            o = ours[length]
            print(
                f"{length:>5} {o['update_s']:>14.3f} {o['outside_s']:>19.3f} {o['tokens_per_s']:>11.0f} "
                f"{o['peak_rss_mib']:>18.0f}"
            )
        return
    header = (
        f"{'T':>5} | {'s/update TRL1.12':>16} {'ours':>7} {'ratio':>6} | {'outside gen TRL1.12':>19} {'ours':>7} "
        f"{'ratio':>6} | {'tok/s TRL1.12':>13} {'ours':>6} | {'peak RSS MiB TRL1.12':>20} {'ours':>6}"
    )
    print(header)
    print("-" * len(header))
    for length in lengths:
        o, t = ours[length], theirs[length]
        print(
            f"{length:>5} | {t['update_s']:>16.3f} {o['update_s']:>7.3f} {o['update_s'] / t['update_s']:>6.2f} | "
            f"{t['outside_s']:>19.3f} {o['outside_s']:>7.3f} {o['outside_s'] / t['outside_s']:>6.2f} | "
            f"{t['tokens_per_s']:>13.0f} {o['tokens_per_s']:>6.0f} | {t['peak_rss_mib']:>20.0f} "
            f"{o['peak_rss_mib']:>6.0f}"
        )
    print("raw seconds per update (every timed update, all processes):")
    for length in lengths:
        fmt = lambda xs: " ".join(f"{x:.3f}" for x in xs)  # noqa: E731
        print(f"  T={length} TRL 1.12: {fmt(theirs[length]['raw_update_s'])}")
        print(f"  T={length} ours:     {fmt(ours[length]['raw_update_s'])}")
        print(f"  T={length} TRL 1.12 outside generation: {fmt(theirs[length]['raw_outside_s'])}")
        print(f"  T={length} ours outside generation:     {fmt(ours[length]['raw_outside_s'])}")


def print_paper(lengths: list[int], paper: dict, num_generations: int) -> None:
    from trl import __version__ as trl_version

    print(
        f"\nTable 2 — VC-PPO paper setting (VCPPOTrainer: KL 0, rule-based reward, policy + critic) per update, "
        f"against TRL {trl_version} GRPOTrainer (beta 0, {num_generations} samples per prompt, policy only) per step, "
        "the same completions; 'shortcut' = ours with the on-policy shortcut (default), 'no-sc' = without it:"
    )
    header = (
        f"{'T':>5} | {'s/step GRPO':>11} {'shortcut':>8} {'ratio':>6} {'no-sc':>7} {'ratio':>6} | "
        f"{'outside gen GRPO':>16} {'shortcut':>8} {'ratio':>6} {'no-sc':>7} {'ratio':>6} | "
        f"{'peak RSS MiB GRPO':>17} {'shortcut':>8}"
    )
    print(header)
    print("-" * len(header))
    for length in lengths:
        g, o, n = (paper[side][length] for side in ("grpo", "shortcut", "no-shortcut"))
        print(
            f"{length:>5} | {g['update_s']:>11.3f} {o['update_s']:>8.3f} {o['update_s'] / g['update_s']:>6.2f} "
            f"{n['update_s']:>7.3f} {n['update_s'] / g['update_s']:>6.2f} | {g['outside_s']:>16.3f} "
            f"{o['outside_s']:>8.3f} {o['outside_s'] / g['outside_s']:>6.2f} {n['outside_s']:>7.3f} "
            f"{n['outside_s'] / g['outside_s']:>6.2f} | {g['peak_rss_mib']:>17.0f} {o['peak_rss_mib']:>8.0f}"
        )
    print("raw seconds per update or step (every timed one, all processes):")
    fmt = lambda xs: " ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    for length in lengths:
        for side in ("grpo", "shortcut", "no-shortcut"):
            print(f"  T={length} {side}: {fmt(paper[side][length]['raw_update_s'])}")
            print(f"  T={length} {side} outside generation: {fmt(paper[side][length]['raw_outside_s'])}")


def run_memory_table(args: argparse.Namespace) -> None:
    import logprob_memory

    where = "in this process (smoke: figures not meaningful)" if args.in_process else "fresh process per cell"
    print(
        f"\nTable 3 — log-prob pass memory, B={args.memory_batch}, T={args.memory_length}, hidden "
        f"{logprob_memory.HIDDEN_SIZE}: peak RSS increase in MiB (ru_maxrss − RSS before the pass), {where}; "
        "rollout = no-grad log-probs, train = log-probs + entropy, forward and backward:"
    )
    header = f"{'vocab':>7} {'mode':>8} {'full logits':>12} {'chunked (ours)':>15} {'ratio':>6} {'[B,T,V] fp32':>13}"
    print(header)
    print("-" * len(header))
    for mode in args.memory_modes:
        for vocab in args.memory_vocabs:
            cells = {}
            for method in ("full", "chunked"):
                if args.in_process:
                    cells[method] = logprob_memory.run_cell(vocab, method, mode, args.memory_batch, args.memory_length)
                    continue
                command = [
                    sys.executable,
                    os.path.join(HERE, "logprob_memory.py"),
                    *("--vocab", str(vocab), "--method", method, "--mode", mode),
                    *("--batch-size", str(args.memory_batch), "--response-length", str(args.memory_length)),
                    *("--threads", str(args.threads)),
                ]
                cells[method] = run_process(command, dict(os.environ))
            full, chunked = cells["full"]["peak_increase_mib"], cells["chunked"]["peak_increase_mib"]
            ratio = f"{chunked / full:>6.3f}" if full > 0 else f"{'n/a':>6}"
            print(
                f"{vocab:>7} {mode:>8} {full:>12.0f} {chunked:>15.0f} {ratio} {cells['full']['logits_mib']:>13.0f}",
                flush=True,
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024], help="response lengths")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--updates", type=int, default=4, help="timed updates per process")
    parser.add_argument("--warmup", type=int, default=1, help="untimed updates per process first")
    parser.add_argument("--repeats", type=int, default=3, help="processes per (side, length), interleaved")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per process (1: stable timings on a shared machine)"
    )
    parser.add_argument("--num-generations", type=int, default=4, help="GRPO samples per prompt (table 2)")
    parser.add_argument("--ours-only", action="store_true", help="skip TRL 1.12 (no venv, no install)")
    parser.add_argument("--smoke", action="store_true", help="one short update per table, in this process (CI)")
    parser.add_argument("--skip-memory", action="store_true", help="skip the log-prob memory table")
    parser.add_argument("--memory-vocabs", type=int, nargs="+", default=[1000, 32000, 152000])
    parser.add_argument("--memory-modes", nargs="+", default=["rollout", "train"], choices=["rollout", "train"])
    parser.add_argument("--memory-batch", type=int, default=2)
    parser.add_argument("--memory-length", type=int, default=2048)
    args = parser.parse_args()
    args.in_process = False
    if args.smoke:
        args.lengths, args.updates, args.warmup, args.repeats, args.batch_size = [16], 1, 0, 1, 4
        args.memory_vocabs, args.memory_modes, args.memory_length = [1000], ["rollout", "train"], 32
        args.in_process = True

    import torch

    torch.set_num_threads(args.threads)
    if not args.ours_only:
        ensure_trl112_venv()
    print(
        f"PPO update benchmark: batch {args.batch_size}, 1 PPO epoch, 1 minibatch, responses forced to full length, "
        f"torch threads per process {args.threads}, {args.repeats} process(es) × {args.updates} timed update(s) after "
        f"{args.warmup} warm-up per (side, length); medians.",
        flush=True,
    )
    ours_runs = {length: [] for length in args.lengths}
    trl_runs = {length: [] for length in args.lengths}
    for repeat in range(args.repeats):
        for length in args.lengths:
            # Alternate who goes first, so that slow phases of the shared machine hit both sides alike.
            order = ("ours", "trl") if repeat % 2 else ("trl", "ours")
            for side in order:
                if side == "ours":
                    ours_runs[length].append(run_ours_cell(args, length))
                elif not args.ours_only:
                    trl_runs[length].append(run_trl_cell(args, length))
            print(f"  done: repeat {repeat + 1}/{args.repeats}, T={length}", flush=True)
    ours = {length: summarise(runs, args.batch_size) for length, runs in ours_runs.items()}
    theirs = None if args.ours_only else {length: summarise(r, args.batch_size) for length, r in trl_runs.items()}
    print_comparison(args.lengths, ours, theirs)

    sides = ("grpo", "shortcut", "no-shortcut")
    paper_runs = {side: {length: [] for length in args.lengths} for side in sides}
    for repeat in range(args.repeats):
        for length in args.lengths:
            for side in sides[repeat % 3 :] + sides[: repeat % 3]:  # rotate who goes first
                paper_runs[side][length].append(run_paper_cell(args, length, side))
            print(f"  done (table 2): repeat {repeat + 1}/{args.repeats}, T={length}", flush=True)
    paper = {
        side: {length: summarise(runs, args.batch_size) for length, runs in by_length.items()}
        for side, by_length in paper_runs.items()
    }
    print_paper(args.lengths, paper, args.num_generations)
    if not args.skip_memory:
        run_memory_table(args)


if __name__ == "__main__":
    main()

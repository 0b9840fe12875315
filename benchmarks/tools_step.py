"""Benchmark: one update with tools, vcppo_trl's `VCPPOTrainer` (and `PPOTrainer`) against TRL's `GRPOTrainer` with
the same tool, policy, prompts and batch, and where each side's time goes: tools, generation, learning.

    python benchmarks/tools_step.py                          # cold start (~1 min), then 2 processes per side
    python benchmarks/tools_step.py --policy-dir /tmp/tp     # keep the cold-start policy there, reuse it next time
    python benchmarks/tools_step.py --smoke                  # CI: tiny, in this process, figures not meaningful

The setting is the tool toy `vcppo_trl.toy.tool_use`: "Add A and B." answered either by the worked column-by-column
sum or by calling the `add` tool and boxing its answer. The policy is the toy's tiny Llama (305k parameters) after a
short cold-start SFT (`cold_start_sft`) on the toy's cold-start examples, `--tool-fraction` of them tool episodes, so
that it calls the tool in a good share of its sampled episodes; it is built once, saved to `--policy-dir` (a temporary
folder, removed at the end, when none is given) and loaded from there by every side.

Every side gets the same policy weights, the same prompts in the same order (`--batch-size / --num-generations`
prompts per update, each sampled `--num-generations` times; no shuffling), `--response-length` completion tokens at
most (tool results included: TRL's `max_completion_length`), `max_tool_calling_iterations` 2, temperature 1, no KL
term and no reference model, one optimizer step per batch, float32 on the CPU, the toy's ±1 reward:

- grpo: TRL's `GRPOTrainer` (beta 0, num_iterations 1, steps_per_generation 1; it trains the policy only);
- vcppo: our `VCPPOTrainer` (no value pretraining, 1 PPO epoch, 1 mini-batch: it trains the policy and a critic);
- ppo: our `PPOTrainer` with the same settings (kl_coef 0, single λ 0.95).

Each side runs in its own process (`--repeats` processes per side, the order rotated between repeats): `--warmup`
updates, then `--updates` timed ones. Per update: the wall time between consecutive `on_step_end` callbacks; the time
in generation (the whole multi-turn sampling of the batch, tool calls included: GRPO's `_generate`, our
`ToolLoopEpisodes.sample`); the time inside the tool itself (the `add` function wrapped with a timer that keeps its name,
signature and docstring, so both trainers show the policy the same schema and call the same function); generation
net of tools; and learning = the rest (rewards, the forwards and backwards, the optimizer step). Printed: the median
seconds per update, the ratio to GRPO, each side's shares (of the summed timed updates), and each side's measured
tool-call rate (episodes with at least one tool result), calls per episode and completion tokens per episode, so
that the reader can check both sides sampled alike. Timings need an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SIDES = ("grpo", "vcppo", "ppo")
POLICY_RECORD = "tools_step_policy.json"
SEED = 0


# ------------------------------------------------------------------------------------------------ what is measured


class Meter:
    """Running totals one process's side adds to: the tool's calls and seconds (from the tool's threads too), the
    generation seconds, and what the reward function saw of the episodes."""

    def __init__(self):
        self.lock = threading.Lock()
        self.tool_calls = 0
        self.tool_seconds = 0.0
        self.generation_seconds = 0.0
        self.episodes = 0
        self.episodes_with_call = 0
        self.completion_tokens = 0

    def snapshot(self) -> dict[str, float]:
        with self.lock:
            return {
                "tool_calls": self.tool_calls,
                "tool_s": self.tool_seconds,
                "generation_s": self.generation_seconds,
                "episodes": self.episodes,
                "episodes_with_call": self.episodes_with_call,
                "completion_tokens": self.completion_tokens,
            }


METER = Meter()


def timed_tool(function):
    """`function`, timed into `METER` at each call; `functools.wraps` keeps its `__name__`, docstring, annotations
    and (through `__wrapped__`) its signature, so the tool schema both trainers build is unchanged."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds = time.perf_counter() - start
            with METER.lock:
                METER.tool_calls += 1
                METER.tool_seconds += seconds

    return wrapper


def timed_generation(function):
    """`function` (one batch's whole multi-turn sampling), its wall time added to `METER.generation_seconds`."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds = time.perf_counter() - start
            with METER.lock:
                METER.generation_seconds += seconds

    return wrapper


def counting_reward(completions, solution, completion_ids=None, **kwargs):
    """The toy's ±1 reward (`tool_reward`), counting on the way the episodes that called the tool and their
    completion tokens (tool results included, as both trainers count them)."""
    from vcppo_trl.toy.tool_use import tool_call_rate, tool_reward

    called = tool_call_rate(completions)
    with METER.lock:
        METER.episodes += len(completions)
        METER.episodes_with_call += int(sum(called))
        if completion_ids is not None:
            METER.completion_tokens += sum(len(ids) for ids in completion_ids)
    return tool_reward(completions, solution)


def step_marks():
    """A callback snapshotting `METER` and the clock at every `on_step_end` (one per update on every side)."""
    from transformers import TrainerCallback

    class StepMarks(TrainerCallback):
        def __init__(self):
            self.marks = []
            self.mark()

        def mark(self):
            self.marks.append({"t": time.perf_counter(), **METER.snapshot()})

        def on_step_end(self, args, state, control, **kwargs):
            self.mark()

    return StepMarks()


def per_update(marks: list[dict], warmup: int) -> dict[str, list[float]]:
    """Differences between consecutive marks, the warm-up updates dropped."""
    keys = [k for k in marks[0] if k != "t"]
    out = {"update_s": [b["t"] - a["t"] for a, b in zip(marks, marks[1:])]}
    for key in keys:
        out[key] = [b[key] - a[key] for a, b in zip(marks, marks[1:])]
    return {key: values[warmup:] for key, values in out.items()}


# ------------------------------------------------------------------------------------------------ the policy


def build_policy(policy_dir: str, steps: int, tool_fraction: float, num_examples: int) -> dict:
    """Cold-start the toy policy (a fresh tiny Llama, `steps` SFT steps on `num_examples` of the toy's cold-start
    examples, `tool_fraction` of them tool episodes) and save it with its tokenizer to `policy_dir`; reuse what is
    there when it holds a policy already."""
    record_path = os.path.join(policy_dir, POLICY_RECORD)
    if os.path.exists(os.path.join(policy_dir, "config.json")):
        if os.path.exists(record_path):
            with open(record_path) as f:
                return {**json.load(f), "reused": True}
        return {"reused": True}
    from vcppo_trl.toy import build_tiny_model, cold_start_sft
    from vcppo_trl.toy.tool_use import build_tool_tokenizer, cold_start_examples, make_tool_splits

    tokenizer = build_tool_tokenizer()
    # Seed 1: pairs other than the benchmark's prompts (seed 0).
    splits = make_tool_splits(num_examples, 1, seed=1)
    examples = cold_start_examples(tokenizer, splits["train"], tool_fraction=tool_fraction, seed=SEED)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as logs:
        policy = cold_start_sft(
            build_tiny_model(tokenizer, seed=SEED),
            tokenizer,
            examples,
            output_dir=logs,
            max_steps=steps,
            target_accuracy=None,
            seed=SEED,
            disable_tqdm=True,
            logging_steps=max(steps, 1),
        )
    os.makedirs(policy_dir, exist_ok=True)
    policy.save_pretrained(policy_dir)
    tokenizer.save_pretrained(policy_dir)
    record = {
        "sft_steps": steps,
        "tool_fraction": tool_fraction,
        "tool_examples": examples["form"].count("tool"),
        "examples": len(examples),
        "sft_s": time.perf_counter() - start,
    }
    with open(record_path, "w") as f:
        json.dump(record, f)
    return {**record, "reused": False}


def prompts(args: argparse.Namespace):
    """The prompts both sides read, in order: `batch / num_generations` per update."""
    from vcppo_trl.toy.tool_use import make_tool_splits

    count = args.batch_size // args.num_generations * (args.warmup + args.updates)
    return make_tool_splits(count, 1, seed=SEED)["train"].select_columns(["prompt", "solution"])


# ------------------------------------------------------------------------------------------------ one side


def common_settings(output_dir: str) -> dict:
    return dict(
        output_dir=output_dir,
        seed=SEED,
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        learning_rate=1e-5,  # small: the policy calls the tool as often in the last update as in the first
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        shuffle_dataset=False,
        temperature=1.0,
    )


def run_side(side: str, args: argparse.Namespace) -> dict:
    """One side's `warmup + updates` updates in this process; per-update figures after the warm-up."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vcppo_trl.toy.tool_use import add

    torch.manual_seed(SEED)
    tool = timed_tool(add)
    dataset = prompts(args)
    num_updates = args.warmup + args.updates
    policy = AutoModelForCausalLM.from_pretrained(args.policy_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.policy_dir)
    marks = step_marks()
    logged: list[dict] = []
    with tempfile.TemporaryDirectory() as output_dir:
        if side == "grpo":
            from trl import GRPOConfig, GRPOTrainer

            config = GRPOConfig(
                **common_settings(output_dir),
                per_device_train_batch_size=args.batch_size,  # completions per step
                num_generations=args.num_generations,
                gradient_accumulation_steps=1,
                steps_per_generation=1,
                num_iterations=1,
                max_completion_length=args.response_length,
                max_tool_calling_iterations=args.max_tool_calling_iterations,
                beta=0.0,
                max_steps=num_updates,
                log_completions=False,
            )
            trainer = GRPOTrainer(
                model=policy,
                reward_funcs=counting_reward,
                args=config,
                train_dataset=dataset,
                processing_class=tokenizer,
                tools=[tool],
                callbacks=[marks],
            )
            trainer._generate = timed_generation(trainer._generate)
            trainer.log = lambda *a, **k: None  # no printing of metrics: same on every side
        else:
            from vcppo_trl import PPOConfig, PPOTrainer, VCPPOConfig, VCPPOTrainer
            from vcppo_trl.episodes import ToolLoopEpisodes

            ours = dict(
                **common_settings(output_dir),
                per_device_train_batch_size=args.batch_size,
                num_generations=args.num_generations,
                gradient_accumulation_steps=1,
                num_mini_batches=1,
                num_ppo_epochs=1,
                local_rollout_forward_batch_size=args.batch_size,
                total_episodes=args.batch_size * num_updates,
                response_length=args.response_length,
                max_tool_calling_iterations=args.max_tool_calling_iterations,
                kl_coef=0.0,
                missing_eos_penalty=None,
                num_sample_generations=0,
            )
            if side == "vcppo":
                config = VCPPOConfig(**ours, lam_actor=0.95, lam_critic=1.0, value_pretrain_steps=0)
                trainer_class = VCPPOTrainer
            else:
                config, trainer_class = PPOConfig(**ours, lam=0.95), PPOTrainer
            trainer = trainer_class(
                model=policy,
                reward_funcs=counting_reward,
                args=config,
                train_dataset=dataset,
                processing_class=tokenizer,
                tools=[tool],
                callbacks=[marks],
            )
            # The whole multi-turn sampling of a batch (tokenization, turns, tool calls), as GRPO's `_generate`.
            ToolLoopEpisodes.sample = timed_generation(ToolLoopEpisodes.sample)
            trainer.log = lambda logs, *a, **k: logged.append(dict(logs))  # kept, not printed
        marks.marks = []
        marks.mark()
        try:
            trainer.train()
        finally:
            if side != "grpo":  # unwrapped again, for the next side of an in-process run
                ToolLoopEpisodes.sample = ToolLoopEpisodes.sample.__wrapped__
    result = {"side": side, "threads": torch.get_num_threads(), **per_update(marks.marks, args.warmup)}
    if logged:  # our trainer's own generation timer, for reference
        result["logged_generation_s"] = [e["time/generation_s"] for e in logged if "time/generation_s" in e][
            args.warmup :
        ]
    if len(result["update_s"]) != args.updates:
        raise RuntimeError(f"{side}: {len(result['update_s'])} timed updates, expected {args.updates}")
    return result


def side_command(side: str, args: argparse.Namespace) -> list[str]:
    return [
        sys.executable,
        os.path.abspath(__file__),
        *("--side", side, "--policy-dir", args.policy_dir),
        *("--batch-size", str(args.batch_size), "--num-generations", str(args.num_generations)),
        *("--response-length", str(args.response_length)),
        *("--max-tool-calling-iterations", str(args.max_tool_calling_iterations)),
        *("--updates", str(args.updates), "--warmup", str(args.warmup), "--threads", str(args.threads)),
    ]


def run_cell(side: str, args: argparse.Namespace) -> dict:
    if args.in_process:
        return run_side(side, args)
    done = subprocess.run(side_command(side, args), capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            return json.loads(line[len("BENCH_JSON ") :])
    raise RuntimeError(f"side {side} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


# ------------------------------------------------------------------------------------------------ the table


def summarise(results: list[dict]) -> dict:
    def every(key):
        return [x for r in results for x in r[key]]

    update, tool, generation = every("update_s"), every("tool_s"), every("generation_s")
    total = sum(update)
    episodes = sum(every("episodes"))
    return {
        "update_s": statistics.median(update),
        "tools": sum(tool) / total,
        "generation": (sum(generation) - sum(tool)) / total,
        "learning": (total - sum(generation)) / total,
        "tool_ms": 1000 * sum(tool) / len(update),
        "call_rate": sum(every("episodes_with_call")) / max(episodes, 1),
        "calls_per_episode": sum(every("tool_calls")) / max(episodes, 1),
        "tokens_per_episode": sum(every("completion_tokens")) / max(episodes, 1),
        "episodes_per_update": episodes / len(update),
        "raw_update_s": update,
        "raw_generation_s": generation,
        "logged_generation_s": every("logged_generation_s") if "logged_generation_s" in results[0] else None,
    }


def print_table(rows: dict[str, dict], threads: int) -> None:
    grpo = rows["grpo"]["update_s"]
    header = (
        f"{'side':<6} {'s/update':>9} {'ratio/GRPO':>10} | {'tools':>7} {'generation':>10} {'learning':>9} | "
        f"{'tool ms/update':>14} {'tool-call rate':>14} {'calls/episode':>13} {'tokens/episode':>14} "
        f"{'episodes/update':>15}"
    )
    print(header)
    print("-" * len(header))
    for side, r in rows.items():
        print(
            f"{side:<6} {r['update_s']:>9.3f} {r['update_s'] / grpo:>10.2f} | {100 * r['tools']:>6.2f}% "
            f"{100 * r['generation']:>9.1f}% {100 * r['learning']:>8.1f}% | {r['tool_ms']:>14.3f} "
            f"{r['call_rate']:>14.3f} {r['calls_per_episode']:>13.3f} {r['tokens_per_episode']:>14.1f} "
            f"{r['episodes_per_update']:>15.0f}"
        )
    print(
        f"torch threads per process: {threads}. Timings need an otherwise idle machine: on a shared CPU the figures "
        "measure the other load as much as the trainers."
    )
    print(
        "shares: of the summed timed updates; tools = inside the add function; generation = the batch's multi-turn "
        "sampling net of tools; learning = the rest (rewards, forwards, backwards, optimizer)."
    )
    print("raw seconds per update, and generation (tools included) per update:")
    fmt = lambda xs: " ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    for side, r in rows.items():
        print(f"  {side}: {fmt(r['raw_update_s'])}")
        print(f"  {side} generation: {fmt(r['raw_generation_s'])}")
        if r["logged_generation_s"] is not None:
            print(
                f"  {side} the trainer's own time/generation_s (its sampler's generate calls only, no tool loop): "
                f"{fmt(r['logged_generation_s'])}"
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy-dir", help="cold-start policy: reused when it holds one, else built there and kept")
    parser.add_argument("--sft-steps", type=int, default=300, help="cold-start SFT steps")
    parser.add_argument("--tool-fraction", type=float, default=0.5, help="share of tool episodes in the cold start")
    parser.add_argument("--sft-examples", type=int, default=2000, help="cold-start examples")
    parser.add_argument("--batch-size", type=int, default=32, help="episodes per update")
    parser.add_argument("--num-generations", type=int, default=4, help="episodes per prompt")
    parser.add_argument("--response-length", type=int, default=256, help="completion tokens, tool results included")
    parser.add_argument("--max-tool-calling-iterations", type=int, default=2)
    parser.add_argument("--updates", type=int, default=3, help="timed updates per process")
    parser.add_argument("--warmup", type=int, default=1, help="untimed updates per process first")
    parser.add_argument("--repeats", type=int, default=2, help="processes per side, the order rotated")
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--in-process", action="store_true", help="every side in this process (no fresh processes)")
    parser.add_argument("--smoke", action="store_true", help="tiny and in this process (CI); figures not meaningful")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # one side's process: prints BENCH_JSON
    args = parser.parse_args()
    if args.batch_size % args.num_generations:
        parser.error(f"--batch-size ({args.batch_size}) must be a multiple of --num-generations")

    import torch

    torch.set_num_threads(args.threads)
    if args.side:
        print("BENCH_JSON " + json.dumps(run_side(args.side, args)), flush=True)
        return
    if args.smoke:
        # A tool-only cold start learns the call's form in ~100 steps; responses long enough for a tool episode.
        args.sft_steps, args.tool_fraction, args.sft_examples = 100, 1.0, 1600
        args.batch_size, args.num_generations, args.response_length = 8, 4, 64
        args.updates, args.warmup, args.repeats, args.in_process = 1, 1, 1, True
    if "grpo" not in args.sides:
        args.sides = ["grpo", *args.sides]  # the ratios' reference
    temporary = args.policy_dir is None
    if temporary:
        args.policy_dir = tempfile.mkdtemp(prefix="tools_step_policy_")
    try:
        record = build_policy(args.policy_dir, args.sft_steps, args.tool_fraction, args.sft_examples)
        if record.get("reused"):
            what = {k: record[k] for k in ("sft_steps", "tool_fraction") if k in record}
            print(f"Cold-start policy reused from {args.policy_dir} {what}", flush=True)
        else:
            print(
                f"Cold-start policy: {record['sft_steps']} SFT steps on {record['examples']} examples, "
                f"{record['tool_examples']} of them tool episodes, in {record['sft_s']:.0f} s -> {args.policy_dir}",
                flush=True,
            )
        from trl import __version__ as trl_version

        print(
            f"Tool-use update benchmark: {args.batch_size} episodes per update ({args.batch_size // args.num_generations} "
            f"prompts x {args.num_generations}), at most {args.response_length} completion tokens (tool results "
            f"included), max_tool_calling_iterations {args.max_tool_calling_iterations}, temperature 1, no KL, "
            f"float32 CPU, torch threads {args.threads}; TRL {trl_version} GRPOTrainer (beta 0, one step per "
            f"generation) vs our VCPPOTrainer / PPOTrainer (1 epoch, 1 mini-batch, no value pretraining); "
            f"{args.repeats} process(es) x {args.updates} timed update(s) after {args.warmup} warm-up per side"
            f"{' (smoke: in this process, figures not meaningful)' if args.smoke else ''}.",
            flush=True,
        )
        runs = {side: [] for side in args.sides}
        for repeat in range(args.repeats):
            order = args.sides[repeat % len(args.sides) :] + args.sides[: repeat % len(args.sides)]
            for side in order:
                runs[side].append(run_cell(side, args))
            print(f"  done: repeat {repeat + 1}/{args.repeats}", flush=True)
        rows = {side: summarise(results) for side, results in runs.items()}
        threads = runs["grpo"][0]["threads"]
        print()
        print_table(rows, threads)
    finally:
        if temporary:
            shutil.rmtree(args.policy_dir, ignore_errors=True)


if __name__ == "__main__":
    main()

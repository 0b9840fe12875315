"""Benchmark: one update on long, uneven responses — today's padded micro-batches against a token budget.

    python benchmarks/token_budget.py                 # max 2048 tokens, long-tailed and uniform lengths (minutes)
    python benchmarks/token_budget.py --smoke         # CI smoke: tiny sizes, one timed update, seconds

One update = the rollout's no-grad forwards (old log-probabilities and values: `RolloutForwards.forward`) and the PPO
epoch (`PPOLearner.update`: forward and backward of policy and critic, an AdamW step); generation and rewards are
left out. The responses are fixed, drawn once from a seed:
- `long-tailed`: 93 % lognormal (σ = 0.8, median 0.14 × max, clipped to [32, max] at max ≥ 512) and 7 % at the cap,
  mean ≈ 0.25 × max, like a long chain-of-thought run's batch;
- `uniform`: every response at the cap (nothing to gain; the budget must lose nothing).
Prompts: 24–64 tokens, left-padded. 16 sequences per update, one mini-batch, one epoch, KL 0, old log-probabilities
from a rollout forward (`on_policy_shortcut=False`).

Variants, each run in its own process (peak RSS only grows), the processes interleaved `--repeats` times:
- `padded`: 4 sequences per micro-batch (`per_device_train_batch_size=4`, `gradient_accumulation_steps=4`) and per
  no-grad forward (`local_rollout_forward_batch_size=4`), every forward at the rollout's full width;
- `budget`: `max_tokens_per_micro_batch` = `max_tokens_per_forward` = 4 × (longest prompt + max) — the padded
  variant's worst case, so memory is bounded by the same figure;
- `packed`: the same budgets with `padding_free=True` (each micro-batch one row of at most that many tokens). On this
  CPU sdpa builds a dense block-diagonal mask over the whole row (attention ∝ N² for the row's N tokens instead of
  Σ L² for its sequences), so this variant measures exactness and memory here, not the speed a GPU's varlen kernels
  give.

The model: a Qwen2 decoder, hidden 512, 2 layers, 8 heads, MLP 1,408, vocabulary 512, sdpa attention, float32 — wide
enough that at 2,048 tokens the linear layers are about half of the FLOPs. The critic is the same network with a value
head. Printed per distribution: the median update seconds of each variant and the speed-up, the real-token fraction
of each variant's forwards, the ideal speed-ups (computed tokens, and FLOPs with attention counted: 2·N per token
and 4·L·h per token per layer for attention over a width L), and the peak RSS. Timing needs a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_setup  # noqa: E402

SEQUENCES = 16
ROWS_PER_MICRO_BATCH = 4
VARIANTS = ("padded", "budget", "packed")
DISTRIBUTIONS = ("long-tailed", "uniform")


def draw_lengths(
    distribution: str, max_length: int, seed: int = 0, sequences: int = SEQUENCES
) -> tuple[list[int], list[int]]:
    """`(prompt_lengths, response_lengths)` of the benchmark's sequences (`step_setup.long_tailed_lengths`)."""
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(24, 65, (sequences,), generator=generator).tolist()
    if distribution == "uniform":
        return prompts, [max_length] * sequences
    return prompts, step_setup.long_tailed_lengths(sequences, max_length, generator)


def build_pair(max_positions: int, hidden: int, layers: int, heads: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from vcppo_trl.models.policy_and_value import PolicyAndValueModel
    from vcppo_trl.models.value_model import create_value_model_from_policy

    config = Qwen2Config(
        vocab_size=512,
        hidden_size=hidden,
        intermediate_size=int(2.75 * hidden),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    policy = Qwen2ForCausalLM(config)
    return PolicyAndValueModel(policy, create_value_model_from_policy(policy))


def build_rollout(prompt_lengths: list[int], response_lengths: list[int]):
    from vcppo_trl.rollout.types import Rollout

    generator = torch.Generator().manual_seed(1)
    batch, width, length = len(prompt_lengths), max(prompt_lengths), max(response_lengths)
    query_mask = torch.arange(width)[None, :] >= (width - torch.tensor(prompt_lengths))[:, None]
    response_mask = torch.arange(length)[None, :] < torch.tensor(response_lengths)[:, None]
    scores = (torch.arange(batch) % 2 * 2 - 1).float()
    return Rollout(
        prompts=[""] * batch,
        completions=[""] * batch,
        extra_columns={},
        query_ids=torch.randint(1, 512, (batch, width), generator=generator).masked_fill(~query_mask, 0),
        query_mask=query_mask.long(),
        response_ids=torch.randint(1, 512, (batch, length), generator=generator).masked_fill(~response_mask, 0),
        response_mask=response_mask,
        has_stop=torch.ones(batch, dtype=torch.bool),
        scores=scores,
        raw_scores=scores,
        rewards_per_func=scores[:, None],
        reward_failed=torch.zeros(batch, dtype=torch.bool),
    )


def run_cell(args: argparse.Namespace) -> dict:
    """One (distribution, variant) in this process: warm-up then timed updates."""
    from accelerate import Accelerator

    from vcppo_trl import PPOConfig
    from vcppo_trl.algo.micro_batches import ForwardWork
    from vcppo_trl.learner.optimizers import parameter_groups
    from vcppo_trl.learner.ppo_learner import PPOLearner
    from vcppo_trl.learner.settings import LearnerSettings
    from vcppo_trl.rollout.forwards import RolloutForwards
    from vcppo_trl.rollout.settings import RolloutSettings
    from vcppo_trl.rollout.shaping import token_rewards

    torch.set_num_threads(args.threads)
    prompt_lengths, response_lengths = draw_lengths(args.cell_distribution, args.max_length)
    rollout = build_rollout(prompt_lengths, response_lengths)
    pair = build_pair(max(prompt_lengths) + args.max_length + 8, args.hidden, args.layers, args.heads)
    budget = ROWS_PER_MICRO_BATCH * (max(prompt_lengths) + args.max_length) if args.cell_variant != "padded" else None
    config = PPOConfig(
        output_dir="/tmp/token_budget_benchmark",
        per_device_train_batch_size=ROWS_PER_MICRO_BATCH,
        gradient_accumulation_steps=SEQUENCES // ROWS_PER_MICRO_BATCH,
        num_mini_batches=1,
        num_ppo_epochs=1,
        local_rollout_forward_batch_size=ROWS_PER_MICRO_BATCH,
        max_tokens_per_micro_batch=budget,
        max_tokens_per_forward=budget,
        padding_free=args.cell_variant == "packed",
        response_length=args.max_length,
        lam=0.95,
        kl_coef=0.0,
        on_policy_shortcut=False,
        learning_rate=1e-5,
        bf16=False,
        use_cpu=True,
        report_to="none",
    )
    accelerator = Accelerator(cpu=True)
    rates = dict(learning_rate=config.learning_rate, value_learning_rate=config.value_learning_rate)
    groups = parameter_groups(pair.named_parameters(), set(), **rates, weight_decay=config.weight_decay)
    optimizer = torch.optim.AdamW(groups, lr=config.learning_rate)
    learner = PPOLearner(
        pair,
        optimizer,
        lr_scheduler=None,
        accelerator=accelerator,
        settings=LearnerSettings.from_args(config),
        is_deepspeed=False,
        local_mini_batch_size=SEQUENCES,
    )
    rollout_forwards = RolloutForwards(  # the rollout's no-grad forwards, as a rollout maker runs them
        RolloutSettings.from_args(config),
        accelerator,
        current_model=lambda: pair,
        ref_model=None,
        pad_token_id=0,
    )
    rollout.kl = torch.zeros(rollout.response_mask.shape)
    rollout.rewards = token_rewards(rollout.scores, rollout.kl, rollout.response_mask, 0.0)
    seconds, forwards, update = [], None, None
    for i in range(args.warmup + args.updates):
        started = time.perf_counter()
        plan = rollout_forwards.forward_plan(rollout)
        forwards = ForwardWork()
        rollout.logprobs, rollout.values = rollout_forwards.forward(rollout, True, plan, forwards)
        returns = rollout.rewards.flip(1).cumsum(1).flip(1) * rollout.response_mask
        update = learner.update(rollout, returns - rollout.values, returns, value_cliprange=0.2).work
        if i >= args.warmup:
            seconds.append(time.perf_counter() - started)
    return {
        "distribution": args.cell_distribution,
        "variant": args.cell_variant,
        "seconds": seconds,
        "forward_tokens": [forwards.real_tokens, forwards.computed_tokens],
        "update_tokens": [update.real_tokens, update.computed_tokens],
        "micro_batches": update.micro_batches,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "prompt_lengths": prompt_lengths,
        "response_lengths": response_lengths,
    }


def plan_flops(args: argparse.Namespace, distribution: str, variant: str) -> float:
    """FLOPs of one update as planned: 2·N per token per forward (×3 with the backward) for each model, plus
    attention 4·L·h per token per layer over each forward's width L (×3 with the backward); a packed row counts its
    whole length as L (the dense mask of sdpa on CPU; a varlen kernel would count each sequence's own)."""
    from vcppo_trl.algo.micro_batches import plan_forwards

    prompt, response = (torch.tensor(x) for x in draw_lengths(distribution, args.max_length))
    width = int(prompt.max()) + args.max_length
    budget = ROWS_PER_MICRO_BATCH * width if variant != "padded" else None
    rows, packed = torch.arange(SEQUENCES), variant == "packed"
    (plan,) = plan_forwards(
        [rows], prompt, response, budget, ROWS_PER_MICRO_BATCH, int(prompt.max()), args.max_length, None, packed
    )
    h, layers = args.hidden, args.layers
    params = layers * (4 * h * h + 3 * h * int(2.75 * h))  # attention projections and the gated MLP
    total = 0.0
    for mb in plan:
        tokens, length = mb.tokens, mb.prompt_width + mb.response_width
        if packed:  # one row of the real tokens; sdpa on CPU attends over the whole row (a dense mask)
            tokens = length = int(prompt[mb.indices].sum() + response[mb.indices].sum())
        per_model = 2 * params * tokens + 4 * length * h * layers * tokens
        total += per_model * 2 * 4  # two models; the rollout's forward, the update's forward and backward (2×)
    return total


def real_flops(args: argparse.Namespace, distribution: str) -> float:
    """The same count with no padding at all: each sequence at its own length."""
    prompt, response = draw_lengths(distribution, args.max_length)
    h, layers = args.hidden, args.layers
    params = layers * (4 * h * h + 3 * h * int(2.75 * h))
    total = 0.0
    for p, r in zip(prompt, response):
        tokens = p + r
        total += (2 * params * tokens + 4 * tokens * h * layers * tokens) * 2 * 4
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one timed update, one repeat (CI)")
    parser.add_argument("--cell-distribution", help=argparse.SUPPRESS)
    parser.add_argument("--cell-variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.max_length, args.repeats, args.updates, args.warmup = 128, 1, 1, 0
        args.hidden, args.layers, args.heads = 64, 1, 4
    if args.cell_variant:
        print("BENCH_JSON " + json.dumps(run_cell(args)), flush=True)
        return

    print(
        f"One update (rollout forwards + one PPO epoch, policy and critic) of {SEQUENCES} sequences, responses up to "
        f"{args.max_length} tokens; Qwen2 hidden {args.hidden}, {args.layers} layers, {args.heads} heads, float32, "
        f"torch threads {args.threads}; {args.repeats} process(es) × {args.updates} timed update(s) after "
        f"{args.warmup} warm-up per variant, interleaved; medians.",
        flush=True,
    )
    results: dict[tuple[str, str], list[dict]] = {}
    for repeat in range(args.repeats):
        for distribution in DISTRIBUTIONS:
            for variant in VARIANTS if repeat % 2 == 0 else VARIANTS[::-1]:
                cell = [
                    sys.executable,
                    os.path.abspath(__file__),
                    *("--max-length", str(args.max_length), "--updates", str(args.updates)),
                    *("--warmup", str(args.warmup), "--threads", str(args.threads), "--hidden", str(args.hidden)),
                    *("--layers", str(args.layers), "--heads", str(args.heads)),
                    *("--cell-distribution", distribution, "--cell-variant", variant),
                ]
                done = subprocess.run(cell, capture_output=True, text=True)
                lines = [x for x in done.stdout.splitlines() if x.startswith("BENCH_JSON ")]
                if not lines:
                    raise RuntimeError(f"{' '.join(cell)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
                results.setdefault((distribution, variant), []).append(json.loads(lines[0][len("BENCH_JSON ") :]))
            print(f"  done: repeat {repeat + 1}/{args.repeats}, {distribution}", flush=True)

    for distribution in DISTRIBUTIONS:
        first = results[distribution, "padded"][0]
        responses = first["response_lengths"]
        at_cap = sum(r == args.max_length for r in responses)
        print(
            f"\n{distribution}: response lengths mean {statistics.mean(responses):.0f} "
            f"({statistics.mean(responses) / args.max_length:.2f} × max), median {statistics.median(responses):.0f}, "
            f"{at_cap}/{len(responses)} at the cap; prompts {min(first['prompt_lengths'])}–"
            f"{max(first['prompt_lengths'])}"
        )
        header = (
            f"{'variant':>8} {'s/update':>9} {'speed-up':>9} {'real tok (update)':>18} {'real tok (fwd)':>15} "
            f"{'micro-batches':>14} {'ideal tok':>10} {'ideal FLOPs':>12} {'peak RSS MiB':>13}"
        )
        print(header)
        print("-" * len(header))
        base = statistics.median(t for r in results[distribution, "padded"] for t in r["seconds"])
        base_flops = plan_flops(args, distribution, "padded")
        for variant in VARIANTS:
            runs = results[distribution, variant]
            median = statistics.median(t for r in runs for t in r["seconds"])
            real, computed = runs[0]["update_tokens"]
            forward_real, forward_computed = runs[0]["forward_tokens"]
            padded_tokens = results[distribution, "padded"][0]["update_tokens"][1]
            print(
                f"{variant:>8} {median:>9.2f} {base / median:>9.2f} {real / computed:>18.3f} "
                f"{forward_real / forward_computed:>15.3f} {runs[0]['micro_batches']:>14} "
                f"{padded_tokens / computed:>10.2f} {base_flops / plan_flops(args, distribution, variant):>12.2f} "
                f"{max(r['peak_rss_mib'] for r in runs):>13.0f}"
            )
        print(
            f"{'no pad':>8} {'':>9} {'':>9} {'':>18} {'':>15} {'':>14} "
            f"{padded_tokens / real:>10.2f} {base_flops / real_flops(args, distribution):>12.2f}   (padding-free ideal)"
        )
    print("\nraw seconds per update:")
    for (distribution, variant), runs in results.items():
        print(f"  {distribution} {variant}: " + " ".join(f"{t:.2f}" for r in runs for t in r["seconds"]))


if __name__ == "__main__":
    main()

"""A toy where a tool matters (issue 48): VC-PPO, PPO and TRL's GRPOTrainer with the same `add` tool, VC-PPO's GAE over
the policy's tokens against plain masking, and VC-PPO without value pretraining. Rules in
`results/tool_use/plan.md`, written before any run.

    python experiments/tool_use.py                 # the table: 5 variants x 5 seeds, 2 worker processes
    python experiments/tool_use.py --report        # rebuild results/tool_use/results.md from the saved runs
    python experiments/tool_use.py --seeds 900 --updates 2 --results-dir /tmp/tool_pilot   # a pilot

The task, tokenizer, cold-start data, reward and the held-out evaluation with tools are `vcppo_trl.toy.tool_use`. The
cold start is built once under `experiments/.cache/tool_use/`; each run writes `runs/<variant>/seed<k>.json` (its metric
history, the held-out evaluations, its seed, budget and commit) and a run whose file exists with the same budget is
skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import runner
from report_stats import fmt, welch_interval
from run_files import DEFAULT_CACHE, DEFAULT_RESULTS, git_commit, read_json, write_json

SEEDS = (500, 501, 502, 503, 504)  # never used by another table (those used 0-7, 31-33, 100-101, 200-207, 400-402)
TOOL_FRACTION = 0.3


@dataclass(frozen=True)
class ToolBudget:
    """Everything a run's outcome depends on, fixed before the table (plan.md §2)."""

    num_train: int = 4000
    num_eval: int = 300
    tool_fraction: float = TOOL_FRACTION
    cold_start_steps: int = 1000
    ppo_updates: int = 20
    pretrain_updates: int = 10
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 2
    num_mini_batches: int = 2
    num_ppo_epochs: int = 2
    learning_rate: float = 1e-4
    value_learning_rate: float = 2e-4
    vf_coef: float = 0.5
    response_length: int = 256
    max_tool_calling_iterations: int = 2
    grpo_generations: int = 4
    eval_samples: int = 2
    seeds: tuple[int, ...] = SEEDS

    @property
    def episodes_per_update(self) -> int:
        return self.per_device_train_batch_size * self.gradient_accumulation_steps * self.num_mini_batches

    def asset_key(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("num_train", "num_eval", "tool_fraction", "cold_start_steps")}

    def run_key(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "seeds"}


SMOKE_BUDGET = ToolBudget(
    num_train=64,
    num_eval=8,
    cold_start_steps=4,
    ppo_updates=1,
    pretrain_updates=1,
    per_device_train_batch_size=2,
    gradient_accumulation_steps=1,
    num_ppo_epochs=1,
    response_length=48,
    grpo_generations=2,
    eval_samples=1,
    seeds=(0,),
)


@dataclass(frozen=True)
class ToolVariant:
    name: str
    label: str
    trainer: str = "vcppo"  # "vcppo", "ppo" (PPOTrainer, single λ) or "grpo" (TRL's GRPOTrainer)
    pretrain: bool = True
    action_mask_mode: str = "skip"


VARIANTS = (
    ToolVariant("vcppo", "VC-PPO (pretrain on tool episodes, λ .95/1.0, GAE over policy tokens)"),
    ToolVariant("vcppo_plain", "VC-PPO, plain masking (OpenRLHF's GAE through tool tokens)", action_mask_mode="plain"),
    ToolVariant("vcppo_no_pretrain", "VC-PPO w/o value pretraining", pretrain=False),
    ToolVariant(
        "ppo", "PPO (PPOTrainer, λ .95, critic from the policy, no pretraining)", trainer="ppo", pretrain=False
    ),
    ToolVariant("grpo", "GRPO (TRL GRPOTrainer, same tools)", trainer="grpo", pretrain=False),
)

# Written before any run (plan.md §4); the report prints it. Not to be edited after the runs.
PREDICTION = """\
1. The tool matters: in every variant the sampled tool-call rate and the sampled held-out accuracy end above the
   cold start's (the change's 95 % interval above 0).
2. Plain masking hurts the tool: at the last token of a tool call it bootstraps from V = 0 instead of the value after
   the tool block, and the next turn's credit reaches the call decayed by (γλ)^L over the L tool tokens, so the call's
   tokens get a negative bias of about V·(1 − (γλ)^L). vcppo_plain ends with a lower sampled tool-call rate and a lower
   sampled accuracy than vcppo (Welch interval of vcppo − vcppo_plain above 0).
3. Value pretraining on tool episodes: vcppo ≥ vcppo_no_pretrain; at 5 seeds the difference is expected to be
   unresolved (an interval across 0), as on the text toys.
4. VC-PPO against GRPO and PPO: no difference resolved in sampled held-out accuracy at equal episodes (our earlier
   toys could not tell them apart); reported with intervals either way.
"""
# The comparisons the report makes: (a, b, what it tests).
PAIRS = (
    ("vcppo", "vcppo_plain", "GAE over policy tokens vs plain masking (prediction 2)"),
    ("vcppo", "vcppo_no_pretrain", "value pretraining on tool episodes (prediction 3)"),
    ("vcppo", "grpo", "VC-PPO vs TRL GRPO (prediction 4)"),
    ("vcppo", "ppo", "VC-PPO vs PPO (prediction 4)"),
)
EQUIVALENCE_MARGIN = 0.05


# ------------------------------------------------------------------------------------------------------ assets


def build_cold_start(budget: ToolBudget, cache_dir: str) -> dict[str, Any]:
    """The cold-start policy (cached, keyed by `budget.asset_key()`) and its held-out evaluations."""
    from vcppo_trl.toy import build_tiny_model, cold_start_sft
    from vcppo_trl.toy.tool_use import build_tool_tokenizer, cold_start_examples, make_tool_splits

    manifest_path = os.path.join(cache_dir, "assets.json")
    policy_dir = os.path.join(cache_dir, "cold_start")
    manifest = read_json(manifest_path)
    if manifest is None or manifest.get("key") != budget.asset_key():
        os.makedirs(cache_dir, exist_ok=True)
        tokenizer = build_tool_tokenizer()
        splits = make_tool_splits(budget.num_train, budget.num_eval)
        examples = cold_start_examples(tokenizer, splits["train"], tool_fraction=budget.tool_fraction)
        t0 = time.time()
        policy = cold_start_sft(
            build_tiny_model(tokenizer, seed=0),
            tokenizer,
            examples,
            output_dir=os.path.join(cache_dir, "sft_logs"),
            max_steps=budget.cold_start_steps,
            target_accuracy=None,
            seed=0,
            disable_tqdm=True,
        )
        seconds = time.time() - t0
        policy.save_pretrained(policy_dir)
        tokenizer.save_pretrained(policy_dir)
        manifest = {
            "key": budget.asset_key(),
            "cold_start_seconds": seconds,
            "cold_start_tool_examples": examples["form"].count("tool"),
            **held_out(policy, tokenizer, splits["test"], budget, seed=0),
        }
        write_json(manifest_path, manifest)
    manifest["policy"] = policy_dir
    return manifest


def held_out(policy, tokenizer, test, budget: ToolBudget, seed: int) -> dict[str, Any]:
    """Greedy and sampled (`eval_samples` per prompt, temperature 1) held-out episodes, with the tool."""
    from vcppo_trl.toy.tool_use import evaluate_with_tools

    length = budget.response_length
    return {
        "eval_greedy": evaluate_with_tools(policy, tokenizer, test, max_new_tokens=length),
        "eval_sampled": evaluate_with_tools(
            policy, tokenizer, test, max_new_tokens=length, samples_per_prompt=budget.eval_samples, seed=seed
        ),
    }


# ------------------------------------------------------------------------------------------------------ one run


def train_ppo_family(variant: ToolVariant, seed: int, budget: ToolBudget, policy_dir: str, out_dir: str, train):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vcppo_trl import PPOConfig, PPOTrainer, VCPPOConfig, VCPPOTrainer
    from vcppo_trl.toy.tool_use import add, tool_call_rate, tool_reward

    shared = {
        **runner.common_args(out_dir, seed),
        "num_sample_generations": 0,
        "per_device_train_batch_size": budget.per_device_train_batch_size,
        "gradient_accumulation_steps": budget.gradient_accumulation_steps,
        "num_mini_batches": budget.num_mini_batches,
        "num_ppo_epochs": budget.num_ppo_epochs,
        "total_episodes": budget.ppo_updates * budget.episodes_per_update,
        "response_length": budget.response_length,
        "temperature": 1.0,
        "kl_coef": 0.0,
        "learning_rate": budget.learning_rate,
        "value_learning_rate": budget.value_learning_rate,
        "vf_coef": budget.vf_coef,
        "missing_eos_penalty": 1.0,
        "reward_weights": [1.0, 0.0],
        "max_tool_calling_iterations": budget.max_tool_calling_iterations,
        "action_mask_mode": variant.action_mask_mode,
    }
    if variant.trainer == "ppo":
        args, trainer_class = PPOConfig(**shared, lam=0.95), PPOTrainer
    else:
        pretrain = budget.pretrain_updates if variant.pretrain else 0
        args = VCPPOConfig(
            **shared,
            lam_actor=0.95,
            lam_critic=1.0,
            value_pretrain_steps=pretrain,
            value_pretrain_min_steps=max(pretrain, 1),  # a fixed number of updates, no early stop
            value_pretrain_patience=None,
            value_pretrain_stop_explained_variance=None,
        )
        trainer_class = VCPPOTrainer
    trainer = trainer_class(
        model=AutoModelForCausalLM.from_pretrained(policy_dir),
        processing_class=AutoTokenizer.from_pretrained(policy_dir),
        reward_funcs=[tool_reward, tool_call_rate],
        args=args,
        train_dataset=train,
        tools=[add],
    )
    trainer.train()
    return trainer.state.log_history, trainer.model.policy


def train_grpo(variant: ToolVariant, seed: int, budget: ToolBudget, policy_dir: str, out_dir: str, train):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from vcppo_trl.toy.tool_use import add, tool_call_rate, tool_reward

    # Same episodes and optimizer steps per batch as the PPO family (runner.run_grpo's mapping).
    args = GRPOConfig(
        **runner.grpo_args(budget, completions=budget.episodes_per_update, out_dir=out_dir, seed=seed),
        max_tool_calling_iterations=budget.max_tool_calling_iterations,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(policy_dir),
        reward_funcs=[tool_reward, tool_call_rate],
        args=args,
        train_dataset=train,
        processing_class=AutoTokenizer.from_pretrained(policy_dir),
        tools=[add],
    )
    trainer.train()
    return trainer.state.log_history, trainer.model


def run_one(variant: ToolVariant, seed: int, budget: ToolBudget, assets: dict, path: str) -> None:
    """Train one variant with one seed in this process (one torch thread), evaluate it, write its JSON."""
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import AutoTokenizer

    from vcppo_trl.toy.tool_use import make_tool_splits

    splits = make_tool_splits(budget.num_train, budget.num_eval)
    train = splits["train"].select_columns(["prompt", "solution", "difficulty"])
    scratch = os.path.join(os.path.dirname(path), f".scratch-seed{seed}")
    t0 = time.time()
    trainer = train_grpo if variant.trainer == "grpo" else train_ppo_family
    history, policy = trainer(variant, seed, budget, assets["policy"], scratch, train)
    train_seconds = time.time() - t0
    tokenizer = AutoTokenizer.from_pretrained(assets["policy"])
    record = {
        "variant": dataclasses.asdict(variant),
        "seed": seed,
        "commit": git_commit(),
        "budget": budget.run_key(),
        "train_seconds": train_seconds,
        **held_out(policy, tokenizer, splits["test"], budget, seed=seed),
        "cold_start": {k: assets[k] for k in ("eval_greedy", "eval_sampled")},
        "wall_seconds": time.time() - t0,
        "log_history": history,
    }
    write_json(path, record)


def run_all(variants, budget: ToolBudget, assets: dict, results_dir: str, workers: int) -> list:
    tasks = []
    for seed in budget.seeds:
        for variant in variants:
            path = os.path.join(results_dir, "runs", variant.name, f"seed{seed}.json")
            saved = read_json(path)
            if saved is not None and saved.get("budget") == budget.run_key():
                continue
            tasks.append((variant, seed, budget, assets, path))
    print(f"{len(tasks)} runs to do.", flush=True)
    failures, t0 = [], time.time()
    for done, (path, error) in enumerate(runner._run_processes(tasks, workers, target=_run_task), start=1):
        print(f"[{done}/{len(tasks)}] {'failed' if error else 'done'}: {path} ({time.time() - t0:.0f} s)", flush=True)
        if error:
            failures.append((path, error))
            print(error, file=sys.stderr)
    return failures


def _run_task(task: tuple, result) -> None:
    """What each spawned process runs (runner._run_processes's `target`): this module's run, logged as runner's."""
    result.send(runner._worker(task, run=run_one))
    result.close()


# ------------------------------------------------------------------------------------------------------ report


def _series(record: dict, key: str) -> list[float]:
    """`key` over the run's policy updates (value-pretraining updates, which log `value_pretrain/` keys, left out)."""
    return [e[key] for e in record["log_history"] if key in e and not any(k.startswith("value_pretrain/") for k in e)]


def report(results_dir: str, budget: ToolBudget, cache_dir: str) -> str:
    """results.md from the saved runs: per variant the held-out figures (greedy and sampled) with 95 % intervals, the
    changes from the cold start, the pairs' Welch intervals, the prediction and the wall times."""
    runs = {v.name: [] for v in VARIANTS}
    for v in VARIANTS:
        for seed in budget.seeds:
            record = read_json(os.path.join(results_dir, "runs", v.name, f"seed{seed}.json"))
            if record is not None:
                runs[v.name].append(record)
    assets = read_json(os.path.join(cache_dir, "assets.json")) or {}
    lines = [
        "# A toy where a tool matters: results",
        "",
        "Built by `python experiments/tool_use.py --report` from `runs/` (raw runs: every update's metrics, the held-out",
        "evaluations, the commit). Rules and prediction: `plan.md`, committed before any run. Intervals: 95 % t over seeds;",
        "differences: Welch 95 %; 'equivalent' when the interval lies within ±0.05.",
        "",
        f"Seeds: {list(budget.seeds)}. Cold start (greedy / sampled): accuracy "
        f"{assets.get('eval_greedy', {}).get('accuracy', float('nan')):.3f} / "
        f"{assets.get('eval_sampled', {}).get('accuracy', float('nan')):.3f}, tool-call rate "
        f"{assets.get('eval_greedy', {}).get('tool_call_rate', float('nan')):.3f} / "
        f"{assets.get('eval_sampled', {}).get('tool_call_rate', float('nan')):.3f}.",
        "",
        "## Held-out at the end (300 prompts; sampled: 2 episodes per prompt at temperature 1)",
        "",
        "| variant | runs | greedy acc | sampled acc | sampled tool-call rate | greedy tool-call rate | policy tokens "
        "(sampled) | train s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for v in VARIANTS:
        rs = runs[v.name]
        if not rs:
            lines.append(f"| {v.label} | 0 | | | | | | |")
            continue
        lines.append(
            f"| {v.label} | {len(rs)} | {fmt([r['eval_greedy']['accuracy'] for r in rs])} "
            f"| {fmt([r['eval_sampled']['accuracy'] for r in rs])} "
            f"| {fmt([r['eval_sampled']['tool_call_rate'] for r in rs])} "
            f"| {fmt([r['eval_greedy']['tool_call_rate'] for r in rs])} "
            f"| {fmt([r['eval_sampled']['length_mean'] for r in rs], 1)} "
            f"| {fmt([r['train_seconds'] for r in rs], 0)} |"
        )
    lines += ["", "Sampled accuracy of the episodes that called the tool and of those that did not:", ""]
    lines += ["| variant | with the tool | without |", "| --- | --- | --- |"]
    for v in VARIANTS:
        rs = runs[v.name]
        if rs:
            cells = [fmt([r["eval_sampled"].get(f"accuracy_{k}_tool") for r in rs]) for k in ("with", "without")]
            lines.append(f"| {v.name} | {cells[0]} | {cells[1]} |")
    lines += ["", "## Change from the cold start (prediction 1: both intervals above 0)", ""]
    lines += ["| variant | Δ sampled acc | Δ sampled tool-call rate |", "| --- | --- | --- |"]
    for v in VARIANTS:
        rs = runs[v.name]
        if rs:
            acc = [r["eval_sampled"]["accuracy"] - r["cold_start"]["eval_sampled"]["accuracy"] for r in rs]
            rate = [
                r["eval_sampled"]["tool_call_rate"] - r["cold_start"]["eval_sampled"]["tool_call_rate"] for r in rs
            ]
            lines.append(f"| {v.name} | {fmt(acc)} | {fmt(rate)} |")
    lines += ["", "## Pairs (a − b, Welch 95 %)", ""]
    lines += [
        "| a − b | tests | sampled acc | sampled tool-call rate | greedy acc |",
        "| --- | --- | --- | --- | --- |",
    ]
    for a, b, what in PAIRS:
        cells = []
        for split, key in (
            ("eval_sampled", "accuracy"),
            ("eval_sampled", "tool_call_rate"),
            ("eval_greedy", "accuracy"),
        ):
            diff, low, high = welch_interval([r[split][key] for r in runs[a]], [r[split][key] for r in runs[b]])
            cells.append(f"{diff:+.3f} [{low:+.3f}, {high:+.3f}] {_read(low, high)}")
        lines.append(f"| {a} − {b} | {what} | " + " | ".join(cells) + " |")
    lines += ["", "## Along training (mean over seeds of the logged batch means)", ""]
    lines += [
        "First and last quarter of each run's logged policy updates (value-pretraining updates left out; GRPO logs",
        "each optimizer step, 4 per batch).",
        "",
    ]
    lines += ["| variant | tool calls, first ¼ | tool calls, last ¼ | reward, first ¼ | reward, last ¼ |"]
    lines += ["| --- | --- | --- | --- | --- |"]
    for v in VARIANTS:
        rs = runs[v.name]
        if not rs:
            continue
        cells = []
        for key in ("tools/call_frequency", "rewards/tool_reward/mean"):  # the same names in both trainers
            for first in (True, False):
                cells.append(fmt([_mean(_quarter(_series(r, key), first)) for r in rs]))
        lines.append(f"| {v.name} | " + " | ".join(cells) + " |")
    lines += ["", "## The prediction (written before any run)", "", "```", PREDICTION.rstrip(), "```", ""]
    return "\n".join(lines)


def _quarter(xs: list[float], first: bool) -> list[float]:
    n = max(1, len(xs) // 4)
    return xs[:n] if first else xs[-n:]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _read(low: float, high: float) -> str:
    if low != low:
        return ""
    if -EQUIVALENCE_MARGIN <= low and high <= EQUIVALENCE_MARGIN:
        return "(equivalent)"
    if low > 0:
        return "(a higher)"
    if high < 0:
        return "(b higher)"
    return "(not resolved)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--report", action="store_true", help="Only rebuild results.md from the saved runs.")
    parser.add_argument("--smoke", action="store_true", help="Tiny budget (tests): 1 seed, 1 update.")
    parser.add_argument("--variants", nargs="*", choices=[v.name for v in VARIANTS])
    parser.add_argument("--seeds", nargs="+", type=int)
    parser.add_argument("--updates", type=int, help="Policy updates per run instead of the budget's (a pilot).")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--results-dir", default=os.path.join(DEFAULT_RESULTS, "tool_use"))
    parser.add_argument("--cache-dir", default=os.path.join(DEFAULT_CACHE, "tool_use"))
    args = parser.parse_args(argv)
    budget = SMOKE_BUDGET if args.smoke else ToolBudget()
    if args.seeds:
        budget = dataclasses.replace(budget, seeds=tuple(args.seeds))
    if args.updates:
        budget = dataclasses.replace(budget, ppo_updates=args.updates)
    variants = tuple(v for v in VARIANTS if not args.variants or v.name in args.variants)
    failures = []
    if not args.report:
        import torch

        torch.set_num_threads(1)
        t0 = time.time()
        assets = build_cold_start(budget, args.cache_dir)
        print(f"Cold start ready in {time.time() - t0:.0f} s: {args.cache_dir}", flush=True)
        failures = run_all(variants, budget, assets, args.results_dir, args.workers)
    os.makedirs(args.results_dir, exist_ok=True)
    with open(os.path.join(args.results_dir, "results.md"), "w") as f:
        f.write(report(args.results_dir, budget, args.cache_dir))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

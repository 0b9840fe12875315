"""Show the critic doing its job (issue 58): VC-PPO against group baselines on a pointer chase whose per-hop credit is
visible in the text, as the horizon K grows. Rules: `results/credit/plan.md`, committed before any run of the table.

    python experiments/credit.py --arms vcppo group_mean --hops 8 --seeds 900 901 902 \\
        --results-dir experiments/results/credit/pilot_b            # pilot (b): does RL work here?
    python experiments/credit.py --hops 2 8 32 --seeds 600 ... 607  # the table (plan.md)
    python experiments/credit.py --report --results-dir D           # rebuild D/results.md from the saved runs

Arms, at equal responses per update and equal policy updates:
- `vcppo`: `VCPPOTrainer` (value pretraining, then decoupled GAE λ_actor 0.95, λ_critic 1);
- `group_mean`: the same trainer with `advantage_estimator="grpo"` (TRL GRPO's group-relative advantage, no critic);
- `rloo`: the same trainer with `advantage_estimator="rloo"` (TRL RLOO's leave-one-out baseline, no critic);
- `grpo_trl`: TRL's `GRPOTrainer` with the same samples and optimizer steps (`runner.grpo_args`);
- `ppo`: `VCPPOTrainer` without value pretraining (its critic built from the policy, then decoupled GAE);
- `oracle`: `VCPPOTrainer` with the oracle critic in place of the learned one (`toy.pointer_chase_credit`: the value of
  each state under the cold start's error model, never trained), decoupled GAE.

The cold start of a (seed, K) is built once and cached under `experiments/.cache/credit/` by its recipe's hash
(`toy.pointer_chase_cold_start.build_cold_start`), with its held-out evaluation. Each run writes
`D/runs/<arm>_K<k>/seed<s>.json`: its metric history, `cold_start_eval_sampled` and `final_eval_sampled` (held-out,
`eval_samples` responses per prompt at temperature 1: `accuracy`, `pass_at_k`, ...), greedy at both ends, evaluations
along the run, the seed, budget, cold start's weights hash and commit. A run whose file exists with the same budget
is skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import types
from dataclasses import dataclass
from typing import Any

import runner
from report_stats import contrast_interval, fmt, welch_interval
from run_files import DEFAULT_CACHE, DEFAULT_RESULTS, git_commit, read_json, write_json

ARMS = ("vcppo", "group_mean", "rloo", "grpo_trl", "ppo", "oracle")
ARM_LABELS = {
    "vcppo": "VC-PPO (value pretraining, λ 0.95/1.0)",
    "group_mean": "same trainer, advantage_estimator='grpo' (no critic)",
    "rloo": "same trainer, advantage_estimator='rloo' (no critic)",
    "grpo_trl": "TRL GRPOTrainer",
    "ppo": "VC-PPO without value pretraining (critic from the policy)",
    "oracle": "oracle critic (never trained), λ 0.95",
}


@dataclass(frozen=True)
class CreditBudget:
    """Everything a run's outcome depends on besides its arm, K and seed (plan.md fixes it before the table)."""

    num_train: int = 4000
    num_eval: int = 200
    num_generations: int = 4  # every arm: G responses per prompt (the group arms' group)
    per_device_train_batch_size: int = 16
    gradient_accumulation_steps: int = 4
    num_mini_batches: int = 1  # 64 responses (16 prompts × 4) per update and per optimizer step (plan amendment 8)
    num_ppo_epochs: int = 2
    ppo_updates: int = 30
    pretrain_updates: int | None = None  # vcppo's value pretraining, fixed (no early stop); None: pretrain_updates_at
    learning_rate: float = 1e-4
    value_learning_rate: float = 1e-3
    vf_coef: float = 0.5
    lam_actor: float = 0.95
    eval_samples: int = 4
    eval_every: int = 10
    cold_start_steps: int | None = None  # None: the recipe's default
    num_tables: int | None = 1  # the task's pool of tables (None: a fresh table per problem; plan amendment 8)

    def pretrain_updates_at(self, hops: int) -> int:
        """vcppo's value-pretraining updates at K: `pretrain_updates`, else max(50, 800 // K) (400 / 100 / 50 at K = 2
        / 8 / 32): the critic learns from hop decisions, K per response, and pilot (c) saw it converge after about 150
        updates at K = 2, 60 at K = 8 and 10 at K = 32 (plan amendment 8)."""
        return self.pretrain_updates if self.pretrain_updates is not None else max(50, 800 // hops)

    @property
    def episodes_per_update(self) -> int:
        return self.per_device_train_batch_size * self.gradient_accumulation_steps * self.num_mini_batches

    def run_key(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SMOKE_BUDGET = CreditBudget(
    num_train=64,
    num_eval=8,
    num_generations=2,
    per_device_train_batch_size=4,
    gradient_accumulation_steps=1,
    num_mini_batches=1,
    num_ppo_epochs=1,
    ppo_updates=1,
    pretrain_updates=1,
    eval_samples=1,
    eval_every=1,
    cold_start_steps=2,
)


# ------------------------------------------------------------------------------------------------------ assets


def recipe_of(seed: int, hops: int, budget: CreditBudget):
    from vcppo_trl.toy.pointer_chase_cold_start import ColdStartRecipe

    # Both stages (the shared lookup stage and the task's own) at `cold_start_steps` when the budget sets it.
    steps = budget.cold_start_steps
    return ColdStartRecipe(
        seed=seed,
        num_hops=hops,
        num_tables=budget.num_tables,
        **({} if steps is None else {"steps": steps, "lookup_steps": steps}),
    )


def cold_start_assets(seed: int, hops: int, budget: CreditBudget, cache_dir: str) -> dict[str, Any]:
    """The cold start of (seed, K), built or read from the cache, and its held-out evaluation (cached beside it)."""
    from vcppo_trl.toy.pointer_chase_cold_start import build_cold_start

    recipe = recipe_of(seed, hops, budget)
    policy, tokenizer, manifest = build_cold_start(recipe, cache_dir=cache_dir)
    folder = manifest["folder"]
    eval_path = os.path.join(folder, f"held_out-{budget.num_eval}x{budget.eval_samples}.json")
    evaluation = read_json(eval_path)
    if evaluation is None:
        evaluation = held_out(policy, tokenizer, test_split(seed, hops, budget), budget, hops, seed=seed)
        write_json(eval_path, evaluation)
    return {"policy": folder, "manifest": manifest, **evaluation}


def splits(seed: int, hops: int, budget: CreditBudget):
    from vcppo_trl.toy.pointer_chase import make_pointer_chase_splits

    return make_pointer_chase_splits(
        budget.num_train, budget.num_eval, seed=seed, **recipe_of(seed, hops, budget).task()
    )


def test_split(seed: int, hops: int, budget: CreditBudget):
    return splits(seed, hops, budget)["test"]


def held_out(policy, tokenizer, test, budget: CreditBudget, hops: int, seed: int) -> dict[str, Any]:
    """Greedy and sampled (`eval_samples` per prompt, temperature 1) held-out accuracy."""
    from vcppo_trl.toy import greedy_accuracy, sampled_accuracy

    length = response_length(hops, budget)
    return {
        "eval_greedy": greedy_accuracy(policy, tokenizer, test, max_new_tokens=length),
        "eval_sampled": sampled_accuracy(policy, tokenizer, test, budget.eval_samples, length, seed=seed),
    }


def response_length(hops: int, budget: CreditBudget) -> int:
    return recipe_of(0, hops, budget).max_response_tokens()


# ------------------------------------------------------------------------------------------------------ one run


def train_ours(
    arm: str,
    hops: int,
    seed: int,
    budget: CreditBudget,
    policy_dir: str,
    out_dir: str,
    train,
    callbacks,
    overrides: dict[str, Any] | None = None,
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vcppo_trl import VCPPOConfig, VCPPOTrainer
    from vcppo_trl.toy.pointer_chase import pointer_chase_reward

    pretrain = budget.pretrain_updates_at(hops) if arm == "vcppo" else 0
    estimator = {"group_mean": "grpo", "rloo": "rloo"}.get(arm, "gae")
    fields = {
        **runner.common_args(out_dir, seed),
        "num_sample_generations": 0,
        "advantage_estimator": estimator,
        "num_generations": budget.num_generations,
        "per_device_train_batch_size": budget.per_device_train_batch_size,
        "gradient_accumulation_steps": budget.gradient_accumulation_steps,
        "num_mini_batches": budget.num_mini_batches,
        "num_ppo_epochs": budget.num_ppo_epochs,
        "total_episodes": budget.ppo_updates * budget.episodes_per_update,
        "response_length": response_length(hops, budget),
        "local_rollout_forward_batch_size": 64,
        "temperature": 1.0,
        "kl_coef": 0.0,
        "learning_rate": budget.learning_rate,
        "value_pretrain_steps": pretrain,
    }
    if estimator == "gae":
        fields |= {
            "lam_actor": budget.lam_actor,
            "lam_critic": 1.0,
            "vf_coef": budget.vf_coef,
            "value_learning_rate": 0.0 if arm == "oracle" else budget.value_learning_rate,
        }
    if pretrain:  # a fixed number of pretraining updates, no early stop: every seed gets the same budget
        fields |= {
            "value_pretrain_min_steps": pretrain,
            "value_pretrain_patience": None,
            "value_pretrain_stop_explained_variance": None,
        }
    fields |= overrides or {}  # another experiment's one change (experiments/staleness.py)
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    value_model = None
    if arm == "oracle":
        from vcppo_trl.toy.pointer_chase_credit import PointerChaseOracleForTokenClassification

        # ε of the cold start's traces: the oracle's values are those of the cold start's policy, not the current one.
        value_model = PointerChaseOracleForTokenClassification.from_tokenizer(tokenizer, num_hops=hops)
    trainer = VCPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(policy_dir),
        processing_class=tokenizer,
        reward_funcs=pointer_chase_reward,
        args=VCPPOConfig(**fields),
        train_dataset=train,
        value_model=value_model,
        callbacks=list(callbacks),
    )
    runner._attach(callbacks, trainer)
    trainer.train()
    return trainer.state.log_history, trainer.model.policy


def train_grpo(arm: str, hops: int, seed: int, budget: CreditBudget, policy_dir: str, out_dir: str, train, callbacks):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from vcppo_trl.toy.pointer_chase import pointer_chase_reward

    # runner.grpo_args' mapping (same responses and optimizer steps per batch) of this K's response length.
    mapped = types.SimpleNamespace(
        **dataclasses.asdict(budget),
        grpo_generations=budget.num_generations,
        response_length=response_length(hops, budget),
    )
    fields = runner.grpo_args(mapped, completions=budget.episodes_per_update, out_dir=out_dir, seed=seed)
    fields["reward_weights"] = None  # one reward function
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(policy_dir),
        reward_funcs=pointer_chase_reward,
        args=GRPOConfig(**fields),
        train_dataset=train,
        processing_class=AutoTokenizer.from_pretrained(policy_dir),
        callbacks=list(callbacks),
    )
    runner._attach(callbacks, trainer)
    trainer.train()
    return trainer.state.log_history, trainer.model


@dataclass(frozen=True)
class ArmAtK:
    """One arm at one K: what `runner._worker` runs (its `name` names the run's log, `logs/<arm>_K<k>-seed<s>.log`)."""

    arm: str
    hops: int

    @property
    def name(self) -> str:
        return f"{self.arm}_K{self.hops}"


def run_one(which: ArmAtK, seed: int, budget: CreditBudget, cache_dir: str, path: str) -> None:
    """Train one arm at one K with one seed in this process (one torch thread), evaluate it, write its JSON."""
    train_and_record(which.arm, hops=which.hops, seed=seed, budget=budget, cache_dir=cache_dir, path=path)


def train_and_record(
    arm: str,
    *,
    hops: int,
    seed: int,
    budget: CreditBudget,
    cache_dir: str,
    path: str,
    overrides: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """One run in this process (one torch thread): the (seed, K) cold start, `arm` trained on it (with `overrides` of
    its config: another experiment's one change), held-out evaluations along the run and at its end, and the run's JSON
    at `path` (with `extra` keys besides the record's own)."""
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import AutoTokenizer

    t0 = time.time()
    assets = cold_start_assets(seed, hops, budget, cache_dir)
    data = splits(seed, hops, budget)
    train = data["train"].select_columns(["prompt", "solution", "difficulty"])
    tokenizer = AutoTokenizer.from_pretrained(assets["policy"])
    along = runner.held_out_callback(
        budget.eval_every,
        lambda policy: held_out(policy, tokenizer, data["test"], budget, hops, seed=seed),
        steps_per_update=budget.num_mini_batches * budget.num_ppo_epochs if arm == "grpo_trl" else 1,
        last_update=budget.ppo_updates,
    )
    scratch = os.path.join(os.path.dirname(path), f".scratch-seed{seed}")
    start = time.time()
    if arm == "grpo_trl":
        history, policy = train_grpo(arm, hops, seed, budget, assets["policy"], scratch, train, (along,))
    else:
        history, policy = train_ours(
            arm, hops, seed, budget, assets["policy"], scratch, train, (along,), overrides=overrides
        )
    train_seconds = time.time() - start
    end = held_out(policy, tokenizer, data["test"], budget, hops, seed=seed)
    record = {
        "arm": arm,
        **(extra or {}),
        "hops": hops,
        "seed": seed,
        "commit": git_commit(),
        "budget": budget.run_key(),
        "cold_start": assets["manifest"],
        "cold_start_eval_sampled": assets["eval_sampled"],
        "cold_start_eval_greedy": assets["eval_greedy"],
        "final_eval_sampled": end["eval_sampled"],
        "final_eval_greedy": end["eval_greedy"],
        "held_out_along_run": along.entries,
        "train_seconds": train_seconds,
        "wall_seconds": time.time() - t0,
        "log_history": history,
    }
    write_json(path, record)


def run_path(results_dir: str, arm: str, hops: int, seed: int) -> str:
    return os.path.join(results_dir, "runs", f"{arm}_K{hops}", f"seed{seed}.json")


def run_all(
    arms, hops_list, seeds, budget: CreditBudget, results_dir: str, cache_dir: str, workers: int
) -> list[tuple[str, str]]:
    """Every (seed, K, arm) whose JSON is missing, seed-major, `workers` at a time; the cold starts of the runs'
    (seed, K) are built first, one at a time (each trains for minutes; two runs must not build the same one)."""
    tasks = []
    for seed in seeds:
        for hops in hops_list:
            for arm in arms:
                path = run_path(results_dir, arm, hops, seed)
                saved = read_json(path)
                if saved is not None and saved.get("budget") == budget.run_key():
                    continue
                tasks.append((ArmAtK(arm, hops), seed, budget, cache_dir, path))
    print(f"{len(tasks)} runs to do.", flush=True)
    for seed, hops in sorted({(seed, which.hops) for which, seed, *_ in tasks}):
        t0 = time.time()
        cold_start_assets(seed, hops, budget, cache_dir)
        print(f"cold start seed {seed} K={hops}: ready in {time.time() - t0:.0f} s", flush=True)
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


def load(results_dir: str) -> dict[tuple[str, int], list[dict]]:
    """Every saved run under `results_dir/runs/`, by (arm, K), in seed order."""
    runs: dict[tuple[str, int], list[dict]] = {}
    root = os.path.join(results_dir, "runs")
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        arm, _, k = name.rpartition("_K")
        for file in sorted(os.listdir(os.path.join(root, name))):
            record = read_json(os.path.join(root, name, file))
            if record is not None:
                runs.setdefault((arm, int(k)), []).append(record)
    return runs


def change(record: dict, split: str, key: str) -> float:
    return record[f"final_eval_{split}"][key] - record[f"cold_start_eval_{split}"][key]


def report(results_dir: str) -> str:
    """results.md from the saved runs: per (arm, K) the held-out figures and their change from the cold start, with 95 %
    t-intervals over seeds; the group-vs-critic differences by K (Welch 95 %)."""
    runs = load(results_dir)
    lines = [
        "# Credit by horizon: results",
        "",
        "Built by `python experiments/credit.py --report` from `runs/` (raw runs: every update's metrics, the held-out",
        "evaluations along the run, the cold start's hash, the commit). Intervals: 95 % t over seeds; differences: Welch",
        "95 %.",
        "",
        "| arm | K | runs | sampled acc: cold start | end | Δ | Δ greedy | Δ pass@k | Δ length | train s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (arm, hops), rs in sorted(runs.items(), key=lambda item: (item[0][1], ARMS.index(item[0][0]))):
        lines.append(
            f"| {arm} | {hops} | {len(rs)} | {fmt([r['cold_start_eval_sampled']['accuracy'] for r in rs])} "
            f"| {fmt([r['final_eval_sampled']['accuracy'] for r in rs])} "
            f"| {fmt([change(r, 'sampled', 'accuracy') for r in rs])} "
            f"| {fmt([change(r, 'greedy', 'accuracy') for r in rs])} "
            f"| {fmt([change(r, 'sampled', 'pass_at_k') for r in rs])} "
            f"| {fmt([change(r, 'sampled', 'response_length_mean') for r in rs], 1)} "
            f"| {fmt([r['train_seconds'] for r in rs], 0)} |"
        )
    pairs = [(a, "group_mean") for a in ("vcppo", "oracle", "ppo")] + [("vcppo", "grpo_trl"), ("group_mean", "rloo")]
    lines += ["", "## Differences in final sampled accuracy (a − b, Welch 95 %)", ""]
    lines += ["| a − b | K | difference |", "| --- | --- | --- |"]
    for a, b in pairs:
        for hops in sorted({k for _, k in runs}):
            if (a, hops) in runs and (b, hops) in runs:
                diff, low, high = welch_interval(
                    [r["final_eval_sampled"]["accuracy"] for r in runs[(a, hops)]],
                    [r["final_eval_sampled"]["accuracy"] for r in runs[(b, hops)]],
                )
                lines.append(f"| {a} − {b} | {hops} | {diff:+.3f} [{low:+.3f}, {high:+.3f}] |")
    lines += ["", *falsification_rules(runs)]
    return "\n".join(lines) + "\n"


def falsification_rules(runs: dict[tuple[str, int], list[dict]]) -> list[str]:
    """The figures plan.md §4's rules read, computed as written there (final held-out sampled accuracy, Welch 95 %):
    rule 1 the VC-PPO − group_mean gap at the longest K and its growth from the shortest K; rule 2 the oracle's gap at
    the longest K; rule 3 group_mean − grpo_trl at every K. The verdicts are read from these by a person."""
    final = {key: [r["final_eval_sampled"]["accuracy"] for r in rs] for key, rs in runs.items()}
    hops = sorted({k for _, k in runs})
    if not hops:
        return []
    short, long_ = hops[0], hops[-1]
    out = ["## What plan.md §4's falsification rules read", ""]

    def gap(a: str, b: str, k: int) -> str:
        if (a, k) not in final or (b, k) not in final:
            return "not run"
        diff, low, high = welch_interval(final[(a, k)], final[(b, k)])
        return f"{diff:+.3f} [{low:+.3f}, {high:+.3f}]"

    keys = [("vcppo", short), ("group_mean", short), ("vcppo", long_), ("group_mean", long_)]
    growth = "not run"
    if all(key in final for key in keys):
        (v2, g2, v32, g32) = (final[key] for key in keys)
        est, low, high = contrast_interval([(v32, 1.0), (g32, -1.0), (v2, -1.0), (g2, 1.0)])
        growth = f"{est:+.3f} [{low:+.3f}, {high:+.3f}]"
    out += [
        f"- Rule 1: vcppo − group_mean at K = {long_}: {gap('vcppo', 'group_mean', long_)} (fails if the interval lies "
        "entirely below +0.03); its growth from K = "
        f"{short} to K = {long_}, (vcppo − group_mean)@{long_} − (vcppo − group_mean)@{short}: {growth} (fails if the "
        "interval includes 0).",
        f"- Rule 2: oracle − group_mean at K = {long_}: {gap('oracle', 'group_mean', long_)}; vcppo − oracle: "
        f"{gap('vcppo', 'oracle', long_)}.",
        "- Rule 3 (expected unresolved): group_mean − grpo_trl: "
        + "; ".join(f"K = {k}: {gap('group_mean', 'grpo_trl', k)}" for k in hops)
        + ".",
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--hops", nargs="+", type=int, default=[2, 8, 32])
    parser.add_argument("--seeds", nargs="+", type=int, default=[600])
    parser.add_argument("--results-dir", default=os.path.join(DEFAULT_RESULTS, "credit"))
    parser.add_argument("--cache-dir", default=os.path.join(DEFAULT_CACHE, "credit"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--report", action="store_true", help="Only rebuild results.md from the saved runs.")
    parser.add_argument("--smoke", action="store_true", help="A tiny budget (tests): 1 update, 2 SFT steps.")
    parser.add_argument("--updates", type=int, help="Policy updates per run instead of the budget's (a pilot).")
    parser.add_argument("--learning-rate", type=float, help="The policy's learning rate instead of the budget's.")
    parser.add_argument(
        "--tables", type=int, help="A pool of this many tables instead of the budget's (0: a fresh one each)."
    )
    args = parser.parse_args(argv)
    budget = SMOKE_BUDGET if args.smoke else CreditBudget()
    if args.tables is not None:
        budget = dataclasses.replace(budget, num_tables=args.tables or None)
    if args.updates:
        budget = dataclasses.replace(budget, ppo_updates=args.updates)
    if args.learning_rate:
        budget = dataclasses.replace(budget, learning_rate=args.learning_rate)
    failures = []
    if not args.report:
        import torch

        torch.set_num_threads(1)
        failures = run_all(args.arms, args.hops, args.seeds, budget, args.results_dir, args.cache_dir, args.workers)
    os.makedirs(args.results_dir, exist_ok=True)
    with open(os.path.join(args.results_dir, "results.md"), "w") as f:
        f.write(report(args.results_dir))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

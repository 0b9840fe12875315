"""Issue 49's experiment (rules in `results/windows_remedy/plan.md`, written before any run): on count-mod-5, is the
accuracy a generation window of L/4 cost VC-PPO caused by the update's step noise or by the bootstrap at the cut, and
does a larger pool of responses in flight (`rollout_pool_size`) keep the whole-response run's accuracy?

    python experiments/windows_remedy.py             # arms A-E x seeds 208-215, 2 workers (resumable, seed-major)
    python experiments/windows_remedy.py --arms F    # one arm only (F: E with window_whitening="finished")
    python experiments/windows_remedy.py --arms G    # follow-up 1: A with the advantages cut every W tokens
    python experiments/windows_remedy.py --arms H    # follow-up 2: E with each response trained when it finishes
    python experiments/windows_remedy.py --arms J    # follow-up 3: A with max_staleness=1 (one-step-off)
    python experiments/windows_remedy.py --arms K    # follow-up 4: J without the sampler correction
    python experiments/windows_remedy.py --pilot     # seed 900, 3 whole-response updates' worth per arm: the cost
    python experiments/windows_remedy.py --report    # rebuild results.md from the saved runs only

Each seed's critic is pretrained once (VC-PPO's value pretraining on the frozen cold start: whole responses, the
budget's 20 updates at λ = 1, no early stop; `value_pretrain_only`) and loaded by every arm of that seed, so the arms
differ only in the policy phase. Its weights are cached under `.cache/count_mod_5/windows_remedy_critics/seed<k>/`, its
pretraining history (and the weights' SHA-256, which every arm's run records) in `runs/critic/seed<k>.json`. The toy's
assets (cold start, reward model) are the count-mod-5 table's (`toy_assets.build_assets`)."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import sys
import time

from run_files import DEFAULT_CACHE, DEFAULT_RESULTS, budget_dict, git_commit, read_json, same_budget, write_json
from task_addition import Variant, scaled_updates
from task_running_sum import COUNT_MOD_5_BUDGET, COUNT_MOD_5_SMOKE_BUDGET
from task_windows import COUNT_MOD_5_WINDOW_FACTORS, WINDOW_DIVISOR

SEEDS = tuple(range(208, 216))  # never used (earlier: 0-7, 31-33, 100-101, 200-207, 400-402, 500-504)
PILOT_SEED = 900
PILOT_UPDATES = 3
BUDGET = dataclasses.replace(COUNT_MOD_5_BUDGET, seeds=SEEDS)
SMOKE_BUDGET = dataclasses.replace(COUNT_MOD_5_SMOKE_BUDGET, seeds=(0,))
RESULTS = os.path.join(DEFAULT_RESULTS, "windows_remedy")
CACHE = os.path.join(DEFAULT_CACHE, "count_mod_5")

# Equal finished responses (plan.md §2): a windowed run with the pool the size of the batch finishes about
# 32 / E⌈l/W⌉ responses per update, so it takes E⌈l/W⌉ = 2.556 times the updates (20 -> 52; task_windows.py).
WINDOW_FACTOR = COUNT_MOD_5_WINDOW_FACTORS["vcppo"]
# The remedy's pool: 32 x 2.556 = 81.8 responses in flight, rounded to a multiple of 8 x 2 (whole micro-batches).
POOL = 80


def _low_lr(budget) -> float:
    """D's learning rate: the budget's × 20 / 52, so that Σ lr·steps equals A's (plan.md §4)."""
    return budget.learning_rate * budget.ppo_updates / scaled_updates(budget.ppo_updates, WINDOW_FACTOR)


_A = Variant(
    "A_whole",
    "A: whole responses, 20 updates × 32",
    critic="pretrained",
    lam_critic=1.0,
    group="windows_remedy",
    eval_every=5,
)
_B = dataclasses.replace(
    _A,
    name="B_window",
    label="B: window L/4, pool 32 (today's default), 52 updates",
    window_divisor=WINDOW_DIVISOR,
    update_factor=WINDOW_FACTOR,
    eval_every=13,
)
ARMS = (
    _A,
    _B,
    dataclasses.replace(
        _A,
        name="C_whole_batch12",
        label="C: whole responses, batch 12 (6 × 1 × 2), 52 updates",
        update_factor=WINDOW_FACTOR,
        options=(("per_device_train_batch_size", 6), ("gradient_accumulation_steps", 1)),
        eval_every=13,
    ),
    dataclasses.replace(
        _B,
        name="D_window_low_lr",
        label="D: window L/4, pool 32, 52 updates, lr × 20/52",
        options=(("learning_rate", _low_lr(BUDGET)),),
    ),
    dataclasses.replace(
        _A,
        name="E_window_pool80",
        label=f"E: window L/4, rollout_pool_size {POOL}, 20 updates",
        window_divisor=WINDOW_DIVISOR,
        options=(("rollout_pool_size", POOL),),
    ),
    dataclasses.replace(
        _A,
        name="F_pool80_finished_whitening",
        label='F: E with window_whitening="finished"',
        window_divisor=WINDOW_DIVISOR,
        options=(("rollout_pool_size", POOL), ("window_whitening", "finished")),
    ),
    # Follow-up 1 (plan.md, after the table): A with the policy's advantages cut every W tokens as a window's are.
    dataclasses.replace(
        _A,
        name="G_whole_cut_advantages",
        label="G: A with the advantages cut every W = L/4 tokens (follow-up 1)",
        advantage_cut_divisor=WINDOW_DIVISOR,
    ),
    # Follow-up 2 (plan.md): E sampled in windows, but each response trained once when it finishes.
    dataclasses.replace(
        _A,
        name="H_window_train_finished",
        label="H: E with each response trained when it finishes (follow-up 2)",
        window_divisor=WINDOW_DIVISOR,
        options=(("rollout_pool_size", POOL),),
        train_when_finished=True,
    ),
    # Follow-up 3 (plan.md): A with one update of staleness (one-step-off overlap, the package's feature).
    dataclasses.replace(
        _A,
        name="J_whole_one_step_off",
        label="J: A with max_staleness=1 (one-step-off; follow-up 3)",
        options=(("max_staleness", 1), ("rollout_worker_threads", 1)),
    ),
    # Follow-up 4 (plan.md): J without the sampler correction (the ratio against the trainer's weights alone).
    dataclasses.replace(
        _A,
        name="K_whole_one_step_off_uncorrected",
        label="K: J without the sampler correction (follow-up 4)",
        options=(("max_staleness", 1), ("rollout_worker_threads", 1), ("vllm_importance_sampling_correction", False)),
    ),
)
MAIN_ARMS = 5  # A-E; F is cut first (plan.md §4)
SMOKE_POOL = 8  # the smoke budget's batch is 2 × 1 × 2: a pool of twice that
# The seed's critic: value pretraining alone, as the count-mod-5 table's VC-PPO starts (from the reward model).
CRITIC = Variant(
    "critic",
    "the seed's critic (value pretraining alone: whole responses, λ 1)",
    pretrain=True,
    lam_critic=1.0,
    group="windows_remedy",
    options=(("value_pretrain_only", True),),
)


def smoke_arms() -> tuple[Variant, ...]:
    """The arms at the smoke budget's scale (its batch is 4: C's batch and E's pool scaled to it)."""
    small = {"C_whole_batch12": (("per_device_train_batch_size", 1),), "E_window_pool80": (("rollout_pool_size", 8),)}
    small["F_pool80_finished_whitening"] = (("rollout_pool_size", SMOKE_POOL), ("window_whitening", "finished"))
    small["H_window_train_finished"] = (("rollout_pool_size", SMOKE_POOL),)
    return tuple(
        dataclasses.replace(a, options=small.get(a.name, a.options), eval_every=1 if a.eval_every else None)
        for a in ARMS
    )


# ------------------------------------------------------------------------------------------- the seed's critic


def critic_dir(cache_dir: str, seed: int) -> str:
    """Where the seed's pretrained critic is saved (`value_pretrain_only` writes `<output_dir>/value_pretrained`)."""
    return os.path.join(cache_dir, "windows_remedy_critics", f"seed{seed}", "value_pretrained")


def weights_sha256(directory: str) -> str:
    """SHA-256 over the directory's weight files, in name order (which critic a run loaded)."""
    digest = hashlib.sha256()
    for name in sorted(os.listdir(directory)):
        if name.endswith((".safetensors", ".bin")):
            with open(os.path.join(directory, name), "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def _splits(budget):
    columns = ["prompt", "solution", "difficulty"]
    splits = budget.splits()
    return splits["train"].select_columns(columns), splits["test"].select_columns(columns)


def pretrain_critic(variant: Variant, seed: int, budget, assets: dict, path: str) -> None:
    """Pretrain the seed's critic in this process (one torch thread) and write its record at `path`."""
    import runner
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    out_dir = os.path.dirname(critic_dir(assets["critic_cache"], seed))
    train, test = _splits(budget)
    t0 = time.time()
    history, _ = runner.run_vcppo(variant, seed, budget, assets, out_dir, train, test)
    saved = critic_dir(assets["critic_cache"], seed)
    if not os.path.isdir(saved):
        raise RuntimeError(f"value pretraining did not save the critic at {saved}")
    record = {
        "variant": dataclasses.asdict(variant),
        "seed": seed,
        "commit": git_commit(),
        "budget": budget_dict(budget),
        "critic_sha256": weights_sha256(saved),
        "wall_seconds": time.time() - t0,
        "log_history": history,
    }
    write_json(path, record)


def critic_ready(record: dict | None, budget, cache_dir: str, seed: int) -> bool:
    """Whether the seed's critic is saved with this budget and its weights are the ones its record names."""
    saved = critic_dir(cache_dir, seed)
    return (
        record is not None
        and same_budget(record.get("budget"), budget)
        and os.path.isdir(saved)
        and weights_sha256(saved) == record["critic_sha256"]
    )


# ------------------------------------------------------------------------------------------------------ the arms


def run_arm(variant: Variant, seed: int, budget, assets: dict, path: str) -> None:
    """One arm with one seed (`runner.run_one`, from the seed's critic), its record naming the critic it loaded."""
    import runner

    saved = assets["pretrained_critics"][seed]
    sha = weights_sha256(saved)
    runner.run_one(variant, seed, budget, assets, path)
    record = read_json(path)
    record["pretrained_critic"] = {"sha256": sha, "record": f"runs/critic/seed{seed}.json"}
    write_json(path, record)


def _run_critic_task(task: tuple, result) -> None:
    import runner

    result.send(runner._worker(task, run=pretrain_critic))
    result.close()


def _run_arm_task(task: tuple, result) -> None:
    import runner

    result.send(runner._worker(task, run=run_arm))
    result.close()


def _run(tasks: list, workers: int, target, what: str) -> list:
    import runner

    print(f"{len(tasks)} {what} to do.", flush=True)
    failures, t0 = [], time.time()
    for done, (path, error) in enumerate(runner._run_processes(tasks, workers, target=target), start=1):
        print(f"[{done}/{len(tasks)}] {'failed' if error else 'done'}: {path} ({time.time() - t0:.0f} s)", flush=True)
        if error:
            failures.append((path, error))
            print(error, file=sys.stderr)
    return failures


def sweep(arms, budget, assets: dict, results_dir: str, cache_dir: str, workers: int) -> list:
    """The seeds' critics first (those not saved), then every (seed, arm) whose run is not saved, seed-major."""
    assets = {**assets, "critic_cache": cache_dir}
    critic_tasks = []
    for seed in budget.seeds:
        path = os.path.join(results_dir, "runs", CRITIC.name, f"seed{seed}.json")
        if not critic_ready(read_json(path), budget, cache_dir, seed):
            critic_tasks.append((CRITIC, seed, budget, assets, path))
    failures = _run(critic_tasks, workers, _run_critic_task, "critics")
    if failures:
        return failures
    assets["pretrained_critics"] = {seed: critic_dir(cache_dir, seed) for seed in budget.seeds}
    tasks = []
    for seed in budget.seeds:
        for arm in arms:
            path = os.path.join(results_dir, "runs", arm.name, f"seed{seed}.json")
            saved = read_json(path)
            if saved is None or not same_budget(saved.get("budget"), budget):
                tasks.append((arm, seed, budget, assets, path))
    return _run(tasks, workers, _run_arm_task, "runs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", help="Only these arms, by letter (A-H, J, K); default A-E.")
    parser.add_argument("--seeds", nargs="+", type=int, help="Other seeds than 208-215.")
    parser.add_argument("--pilot", action="store_true", help=f"Seed {PILOT_SEED}, {PILOT_UPDATES} updates' worth.")
    parser.add_argument("--report", action="store_true", help="Only rebuild results.md from the saved runs.")
    parser.add_argument("--smoke", action="store_true", help="The smoke budget (tests).")
    parser.add_argument("--workers", type=int, default=2, help="Parallel worker processes (one torch thread each).")
    parser.add_argument("--results-dir", default=RESULTS)
    parser.add_argument("--cache-dir", default=CACHE)
    args = parser.parse_args(argv)
    budget, arms = (SMOKE_BUDGET, smoke_arms()) if args.smoke else (BUDGET, ARMS)
    if args.arms:
        by_letter = {a.name[0]: a for a in arms}
        unknown = [x for x in args.arms if x not in by_letter]
        if unknown:
            parser.error(f"unknown arm(s) {unknown}; choose from {sorted(by_letter)}")
        arms = tuple(by_letter[x] for x in args.arms)
    elif not args.smoke:
        arms = arms[:MAIN_ARMS]
    results_dir = args.results_dir
    if args.pilot:
        budget = dataclasses.replace(budget, seeds=(PILOT_SEED,), ppo_updates=PILOT_UPDATES)
        results_dir = os.path.join(results_dir, "pilot")
    elif args.seeds:
        budget = dataclasses.replace(budget, seeds=tuple(args.seeds))
    failures = []
    if not args.report:
        import torch
        from toy_assets import build_assets

        torch.set_num_threads(1)
        t0 = time.time()
        assets = build_assets(budget, args.cache_dir, controlled_bias_critic=False)
        print(f"Assets ready in {time.time() - t0:.0f} s: {args.cache_dir}", flush=True)
        failures = sweep(arms, budget, assets, results_dir, args.cache_dir, args.workers)
        print(f"All runs finished in {time.time() - t0:.0f} s.", flush=True)
    import report_windows_remedy

    text = report_windows_remedy.build_report(results_dir, ARMS if not args.smoke else arms, budget.seeds)
    print(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

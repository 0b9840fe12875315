"""Reproduce VC-PPO's claim at toy scale: plain PPO with a reward-model critic vs VC-PPO and its ablations, and GRPO.

    python experiments/reproduce.py              # main table: 7 variants x 3 seeds, 2 worker processes
    python experiments/reproduce.py --full       # + the sweeps (lambda_actor, pretraining steps, lambda_critic)
    python experiments/reproduce.py --report     # rebuild the table and plots from the saved runs only
    python experiments/reproduce.py --task majority  # the stop-anytime task (results/majority/, .cache/majority/)
    python experiments/reproduce.py --seeds 3 4 5    # other seeds than the budget's (a rerun with unused seeds)
    python experiments/reproduce.py --task count-mod-5   # the accuracy-link toy: VC-PPO, VAPO, GRPO (results/count_mod_5/)
    python experiments/reproduce.py --task count-mod-5 --grid windows  # VC-PPO with windows L/4 and max_staleness 1
                                                 # (results/windows_overlap/count_mod_5/; --task majority likewise)
    python experiments/reproduce.py ... --eval-every 5   # also the held-out evaluation every 5 policy updates

Everything is cached and resumable: the cold start, the reward model and (when a variant to run starts from it) the
controlled-bias critic are built once under `experiments/.cache/`, and every run writes
`experiments/results/runs/<variant>/seed<k>.json` when it ends (its whole metric history, the held-out evaluation, its
seed and the commit it ran at; its console output goes to `results/logs/`, not kept in git); a run whose file exists
(with the same budget, whatever the seed list) is skipped. The table and plots are then rebuilt from those files by
`experiments/report.py`.

The toy (fixed before any run, see `Budget` in `task_addition.py`): additions of 1- to 6-digit numbers, with a cold
start on a 50/50 mix of worked solutions and compressed ones (about half as long, worse on long numbers), so a policy
can drift toward shorter reasoning. The paper's PPO baseline starts its critic from a reward model trained on complete
responses only. Because that reward model's values do not rise along the response on this toy (see the README), two
variants start instead from a *controlled-bias* critic: the reward model's values plus a known ramp, low at the start
of each response (`vcppo_trl.toy.reward_model.position_ramp`). They are labelled as such everywhere.

This file is the command line. Each task's budget, variants and task assets are in `task_addition.py`,
`task_majority.py` and `task_running_sum.py` (the windows/overlap grid of two of them in `task_windows.py`), the cached assets are built by `toy_assets.py`, the runs made by `runner.py`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

from run_files import DEFAULT_CACHE, DEFAULT_RESULTS
from runner import run_all
from task_addition import (
    MAIN_VARIANTS,
    PILOT_KNOBS,
    PILOT_VARIANTS,
    SMOKE_BUDGET,
    SWEEP_TABLES,
    SWEEP_VARIANTS,
    Budget,
)
from task_majority import (
    MAJORITY_EXTRA,
    MAJORITY_GRID,
    MAJORITY_MAIN,
    MAJORITY_SMOKE_BUDGET,
    PREDICTION,
    MajorityBudget,
)
from task_running_sum import (
    ACCURACY_LINK_GRID,
    ACCURACY_LINK_MAIN,
    ACCURACY_LINK_PAIRS,
    ACCURACY_LINK_PREDICTION,
    COUNT_MOD_5_BUDGET,
    COUNT_MOD_5_SMOKE_BUDGET,
)
from task_windows import (
    WINDOWS_BUDGETS,
    WINDOWS_CONTRAST,
    WINDOWS_GRIDS,
    WINDOWS_MAIN,
    WINDOWS_PAIRS,
    WINDOWS_PREDICTION,
)
from toy_assets import build_assets

# `--task`: (budget, smoke budget, results sub-directory); the first toy keeps the top-level directories.
TASKS = {
    "addition": (Budget(), SMOKE_BUDGET, ""),
    "majority": (MajorityBudget(), MAJORITY_SMOKE_BUDGET, "majority"),
    "count-mod-5": (COUNT_MOD_5_BUDGET, COUNT_MOD_5_SMOKE_BUDGET, "count_mod_5"),
}
TASK_VARIANTS = {
    "addition": MAIN_VARIANTS,
    "majority": MAJORITY_MAIN + MAJORITY_GRID,
    "count-mod-5": ACCURACY_LINK_MAIN,
}
ACCURACY_LINK_TASKS = ("count-mod-5",)
# `--grid`: the task's own table ("main"), or the windows/overlap grid (task_windows.py) in this sub-directory of the
# results directory (each task's sub-directory inside it; the task's cache is shared with its own table).
GRID_DIRS = {"main": "", "windows": "windows_overlap"}


def needs_controlled_bias_critic(variants) -> bool:
    """Whether any of these variants starts from the controlled-bias critic (else its build is skipped)."""
    return any(v.critic == "controlled_bias" for v in variants)


def report_command(task: str, results_root: str, seeds, default_seeds, grid: str = "main") -> str:
    """The command line that rebuilds this table's report from its saved runs (named in its header)."""
    command = f"python experiments/reproduce.py --task {task}{'' if grid == 'main' else f' --grid {grid}'} --report"
    if os.path.abspath(results_root) != os.path.abspath(DEFAULT_RESULTS):
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        inside = os.path.abspath(results_root).startswith(repo + os.sep)
        command += f" --results-dir {os.path.relpath(results_root, repo) if inside else os.path.abspath(results_root)}"
    if tuple(seeds) != tuple(default_seeds):
        command += " --seeds " + " ".join(str(s) for s in seeds)
    return command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--task",
        choices=sorted(TASKS),
        default="addition",
        help="addition: the first toy (fixed-length reasoning). majority: the stop-anytime task. count-mod-5: the "
        "accuracy-link task (an answer before the end of the reasoning is right by chance only), with VC-PPO, VAPO "
        "and GRPO. The other tasks' results and cache go to a sub-directory of --results-dir and --cache-dir "
        "('majority', 'count_mod_5').",
    )
    parser.add_argument(
        "--grid",
        choices=sorted(GRID_DIRS),
        default="main",
        help="main: the task's own table. windows: VC-PPO with generation windows of L/4 and with max_staleness 1 "
        "against VC-PPO, and PPO under a window against PPO, at equal finished responses (count-mod-5 and majority; "
        "results/windows_overlap/plan.md), into the 'windows_overlap' sub-directory of --results-dir.",
    )
    parser.add_argument("--full", action="store_true", help="Also run the sweeps (λ_actor, pretraining, λ_critic).")
    parser.add_argument("--report", action="store_true", help="Only rebuild the table and plots from saved runs.")
    parser.add_argument("--smoke", action="store_true", help="Tiny budget (tests): 1 seed, 2 updates.")
    parser.add_argument("--pilot", action="store_true", help="The knob exploration (PILOT_KNOBS) into results/pilot/.")
    parser.add_argument("--variants", nargs="*", help="Only these variants (names), e.g. ppo vcppo.")
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        help="Run (and report) these seeds instead of the budget's, e.g. --seeds 3 4 5 to rerun the table with seeds "
        "not used before. Saved runs of other seeds are kept; a run's file records its seed and commit.",
    )
    parser.add_argument(
        "--updates",
        type=int,
        help="Policy updates per run instead of the budget's (a pilot: the cost per update and the first updates' "
        "diagnostics, into its own --results-dir).",
    )
    parser.add_argument(
        "--eval-every",
        type=int,
        help="Also evaluate on the held-out split every N policy updates (greedy, and sampled where the task asks), "
        "recorded as each run's `held_out_along_run` (Budget.eval_every; without it only at the end, as the saved "
        "runs were made, and a run saved with another setting is redone).",
    )
    parser.add_argument("--workers", type=int, default=2, help="Parallel worker processes (one torch thread each).")
    parser.add_argument("--results-dir", default=DEFAULT_RESULTS)
    parser.add_argument("--cache-dir", default=DEFAULT_CACHE)
    args = parser.parse_args(argv)

    # Imported here, not at the top: the spawned workers re-import this script, and need no matplotlib.
    import report

    full_budget, smoke_budget, subdir = TASKS[args.task]
    windows = args.grid == "windows"
    if windows:
        if args.task not in WINDOWS_BUDGETS:
            parser.error(f"--grid windows runs on {sorted(WINDOWS_BUDGETS)}, not {args.task}")
        if args.full or args.pilot:
            parser.error("--grid windows has no sweeps or knob pilot (time it with --seeds 300 --updates 5)")
        full_budget, smoke_budget = WINDOWS_BUDGETS[args.task]
    budget = smoke_budget if args.smoke else full_budget
    if args.seeds:
        if len(set(args.seeds)) != len(args.seeds) or min(args.seeds) < 0:
            parser.error(f"--seeds must be distinct non-negative integers, got {args.seeds}")
        budget = dataclasses.replace(budget, seeds=tuple(args.seeds))
    if args.updates is not None:
        if args.updates < 1:
            parser.error(f"--updates must be at least 1, got {args.updates}")
        budget = dataclasses.replace(budget, ppo_updates=args.updates)
    if args.eval_every is not None:
        if args.eval_every < 1:
            parser.error(f"--eval-every must be at least 1, got {args.eval_every}")
        budget = dataclasses.replace(budget, eval_every=args.eval_every)
    rebuild_command = report_command(args.task, args.results_dir, budget.seeds, full_budget.seeds, args.grid)
    if subdir or windows:
        args.results_dir = os.path.join(args.results_dir, GRID_DIRS[args.grid], subdir)
        args.cache_dir = os.path.join(args.cache_dir, subdir)  # a grid shares its task's assets
    variants = TASK_VARIANTS[args.task] + (SWEEP_VARIANTS if args.full else ())
    all_variants = MAIN_VARIANTS + SWEEP_VARIANTS + (MAJORITY_GRID + MAJORITY_EXTRA if args.task == "majority" else ())
    if args.task in ACCURACY_LINK_TASKS:
        all_variants = ACCURACY_LINK_GRID
    if windows:
        all_variants = WINDOWS_GRIDS[args.task]
        variants = all_variants[:WINDOWS_MAIN]
    if args.variants:
        known = {v.name: v for v in all_variants}
        unknown = [n for n in args.variants if n not in known]
        if unknown:
            parser.error(f"unknown variant(s) {unknown}; choose from {sorted(known)}")
        variants = tuple(known[n] for n in args.variants)
    failures = []
    if args.pilot:
        import torch

        torch.set_num_threads(1)
        known = {v.name: v for v in MAIN_VARIANTS}
        pilot_variants = tuple(known[n] for n in PILOT_VARIANTS)
        assets = build_assets(budget, args.cache_dir, needs_controlled_bias_critic(pilot_variants))
        for knob, settings in PILOT_KNOBS.items():
            pilot_budget = dataclasses.replace(budget, ppo_updates=30, seeds=(100,), **settings)
            pilot_dir = os.path.join(args.results_dir, "pilot", knob)
            failures += run_all(pilot_variants, pilot_budget, assets, pilot_dir, args.workers)
            report.build_report(pilot_dir, pilot_variants, (100,), cache_dir=args.cache_dir)
        return 1 if failures else 0
    if not args.report:
        import torch

        torch.set_num_threads(1)  # the same numerics as the one-thread workers, and no oversubscription
        t0 = time.time()
        assets = build_assets(budget, args.cache_dir, needs_controlled_bias_critic(variants))
        print(f"Assets ready in {time.time() - t0:.0f} s: {args.cache_dir}")
        failures = run_all(variants, budget, assets, args.results_dir, args.workers)
        print(f"All runs finished in {time.time() - t0:.0f} s.")
    if windows:
        import report_windows

        report_windows.build_windows_report(
            args.results_dir,
            all_variants,
            budget.seeds,
            args.cache_dir,
            WINDOWS_PREDICTION,
            WINDOWS_PAIRS,
            args.task,
            rebuild_command,
            WINDOWS_CONTRAST,
        )
    elif args.task in ACCURACY_LINK_TASKS:
        import report_accuracy_link

        report_accuracy_link.build_accuracy_link_report(
            args.results_dir,
            all_variants,
            budget.seeds,
            args.cache_dir,
            ACCURACY_LINK_PREDICTION,
            ACCURACY_LINK_PAIRS,
            args.task,
            rebuild_command,
        )
    else:
        report.build_report(
            args.results_dir,
            all_variants,
            budget.seeds,
            cache_dir=args.cache_dir,
            sweeps=SWEEP_TABLES,
            prediction=PREDICTION if args.task == "majority" else None,
            rebuild_command=rebuild_command,
        )
    if failures:
        print(f"{len(failures)} run(s) failed: {[os.path.relpath(p, args.results_dir) for p, _ in failures]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

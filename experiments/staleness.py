"""Does staleness cost accuracy, or does the budget's noise? (issue 61) A dose–response of VC-PPO on the pointer chase
at K = 32 and the credit table's budget, every rule fixed in `results/staleness/plan.md` before any run.

    python experiments/staleness.py --cells s0_lr1 s1_lr1 --seeds 700 701   # some cells and seeds
    python experiments/staleness.py                                        # every cell, its plan's seeds
    python experiments/staleness.py --report                               # rebuild results.md from the runs

Every cell is `VCPPOTrainer` as the credit table's `vcppo` arm (`credit.train_ours`: value pretraining, then
decoupled GAE λ 0.95 / 1.0) with one thing changed: `max_staleness` (a rollout worker sampling ahead), the policy's
learning rate, the sampler correction, V-trace critic targets, or a generation window. Each run writes
`D/runs/<cell>/seed<s>.json` (credit.py's record: metric history, held-out evaluations at start, along the run and at
the end, the cold start's hash, the commit), skipped when it exists with the same budget and cell.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import credit
import runner
from report_stats import fmt, t95, welch_interval
from run_files import DEFAULT_CACHE, DEFAULT_RESULTS, read_json

HOPS = 32  # the plan's K; `--hops` only for tests
MAIN_SEEDS = (700, 701, 702, 703, 704, 705)
NULL_SEEDS = (710, 711, 712, 713, 714, 715)  # the null cell's, disjoint from every other cell's


@dataclass(frozen=True)
class Cell:
    """One configuration of the dose–response: what it changes from the credit table's `vcppo` arm."""

    name: str
    staleness: int = 0  # `max_staleness`
    lr_scale: float = 1.0  # × the budget's policy learning rate
    sampler_correction: bool = True  # `vllm_importance_sampling_correction` (the default, sequence_mask, C_max 3)
    vtrace: bool = False  # `critic_target_correction="vtrace"`
    window_fraction: int | None = None  # `generation_window` = response_length // window_fraction
    seeds: tuple[int, ...] = MAIN_SEEDS

    def overrides(self, budget: credit.CreditBudget, response_length: int) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "max_staleness": self.staleness,
            "learning_rate": budget.learning_rate * self.lr_scale,
            "vllm_importance_sampling_correction": self.sampler_correction,
        }
        if self.vtrace:
            fields["critic_target_correction"] = "vtrace"
        if self.window_fraction:
            fields["generation_window"] = response_length // self.window_fraction
        return fields


CELLS = {
    cell.name: cell
    for cell in [
        *(Cell(f"s{s}_lr1", staleness=s) for s in (0, 1, 2, 4)),
        *(Cell(f"s{s}_lrhalf", staleness=s, lr_scale=0.5) for s in (0, 1, 2, 4)),
        Cell("s2_lr1_nocorrection", staleness=2, sampler_correction=False),
        Cell("s2_lr1_vtrace", staleness=2, vtrace=True),
        Cell("window4_s0_lr1", window_fraction=4),
        Cell("null_s0_lr1", seeds=NULL_SEEDS),
    ]
}
DOSES = (0, 1, 2, 4)
SMOKE_BUDGET = dataclasses.replace(credit.SMOKE_BUDGET, ppo_updates=2)


def run_one(task: tuple, budget: credit.CreditBudget, cache_dir: str, path: str) -> None:
    """One cell with one seed at K hops (`task`) in this process: the credit table's `vcppo` run with the cell's
    overrides ([`credit.train_and_record`]), its record with the cell and the overrides."""
    cell, seed, hops = task
    overrides = cell.overrides(budget, credit.response_length(hops, budget))
    credit.train_and_record(
        "vcppo",
        hops=hops,
        seed=seed,
        budget=budget,
        cache_dir=cache_dir,
        path=path,
        overrides=overrides,
        extra={"cell": dataclasses.asdict(cell), "overrides": overrides},
    )


@dataclass(frozen=True)
class CellSeed:
    """What `runner._worker` runs: its `name` names the run's log (`logs/<cell>-seed<s>.log`)."""

    cell: Cell
    hops: int

    @property
    def name(self) -> str:
        return self.cell.name


def _run(which: CellSeed, seed: int, budget, cache_dir: str, path: str) -> None:
    run_one((which.cell, seed, which.hops), budget, cache_dir, path)


def _run_task(task: tuple, result) -> None:
    result.send(runner._worker(task, run=_run))
    result.close()


def cell_record(cell: Cell) -> dict[str, Any]:
    """The cell as its run file records it (JSON: the seeds a list), to compare a saved run's with."""
    return json.loads(json.dumps(dataclasses.asdict(cell)))


def run_path(results_dir: str, cell: str, seed: int) -> str:
    return os.path.join(results_dir, "runs", cell, f"seed{seed}.json")


def run_all(cells, seeds, budget, *, hops: int, results_dir: str, cache_dir: str, workers: int) -> list:
    """Every (cell, seed) whose JSON is missing (a cell's own seeds unless `seeds` is given), seed-major, `workers` at
    a time; the seeds' cold starts are built first, one at a time."""
    tasks = []
    for cell in cells:
        for seed in seeds or cell.seeds:
            path = run_path(results_dir, cell.name, seed)
            saved = read_json(path)
            if saved is not None and saved.get("budget") == budget.run_key() and saved["cell"] == cell_record(cell):
                continue
            tasks.append((CellSeed(cell, hops), seed, budget, cache_dir, path))
    tasks.sort(key=lambda task: task[1])
    print(f"{len(tasks)} runs to do.", flush=True)
    for seed in sorted({task[1] for task in tasks}):
        t0 = time.time()
        credit.cold_start_assets(seed, hops, budget, cache_dir)
        print(f"cold start seed {seed} K={hops}: ready in {time.time() - t0:.0f} s", flush=True)
    failures, t0 = [], time.time()
    for done, (path, error) in enumerate(runner._run_processes(tasks, workers, target=_run_task), start=1):
        print(f"[{done}/{len(tasks)}] {'failed' if error else 'done'}: {path} ({time.time() - t0:.0f} s)", flush=True)
        if error:
            failures.append((path, error))
            print(error, file=sys.stderr)
    return failures


# ------------------------------------------------------------------------------------------------------ report


def load(results_dir: str) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {}
    root = os.path.join(results_dir, "runs")
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        for file in sorted(os.listdir(os.path.join(root, name))):
            record = read_json(os.path.join(root, name, file))
            if record is not None:
                runs.setdefault(name, []).append(record)
    return runs


def final(record: dict) -> float:
    return record["final_eval_sampled"]["accuracy"]


def curve_mean(record: dict) -> float:
    """plan.md §4's primary measure: the mean of the held-out sampled accuracy at PPO updates 10, 20 and the last (the
    evaluations along the run every `eval_every` updates, and the final one)."""
    along = [e["eval_sampled"]["accuracy"] for e in record["held_out_along_run"] if e.get("update") in (10, 20)]
    return sum([*along, final(record)]) / (len(along) + 1)


def dose_slope(runs: dict[str, list[dict]], suffix: str) -> tuple[float, float, float, float, int] | None:
    """Least-squares slope of the primary measure on staleness over every run of the cells `s<d>_<suffix>`:
    `(slope, low, high, standard error, degrees of freedom)`, a 95 % t interval on n − 2 degrees of freedom; None until
    at least two doses have runs."""
    points = [(d, curve_mean(r)) for d in DOSES for r in runs.get(f"s{d}_{suffix}", [])]
    if len({d for d, _ in points}) < 2 or len(points) < 3:
        return None
    n = len(points)
    mean_x = sum(d for d, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((d - mean_x) ** 2 for d, _ in points)
    slope = sum((d - mean_x) * (y - mean_y) for d, y in points) / sxx
    residual = sum((y - mean_y - slope * (d - mean_x)) ** 2 for d, y in points) / (n - 2)
    error = math.sqrt(residual / sxx)
    half = t95(n - 2) * error
    return slope, slope - half, slope + half, error, n - 2


def minimum_detectable_effect(runs: dict[str, list[dict]]) -> float | None:
    """plan.md §4: 2.8 × the pooled SD of the primary measure over the staleness-0 cells × √(2 / n), n the seeds a
    cell has (80 % power at α = 0.05, two-sided, normal approximation)."""
    groups = [[curve_mean(r) for r in runs[name]] for name in ("s0_lr1", "s0_lrhalf") if len(runs.get(name, [])) >= 2]
    if not groups:
        return None
    pooled = sum(sum((x - sum(g) / len(g)) ** 2 for x in g) for g in groups) / sum(len(g) - 1 for g in groups)
    n = min(len(g) for g in groups)
    return 2.8 * math.sqrt(pooled) * math.sqrt(2 / n)


def report(results_dir: str) -> str:
    runs = load(results_dir)
    lines = [
        "# Staleness dose–response: results",
        "",
        "Built by `python experiments/staleness.py --report` from `runs/` (raw runs: every update's metrics, held-out",
        "evaluations along the run, the cold start's hash, the commit). Intervals: 95 % t over seeds; differences:",
        "Welch 95 %. Read with plan.md §4.",
        "",
        "| cell | runs | sampled acc: cold start | curve mean (primary) | end | Δ end | end greedy | staleness max "
        "(mean over updates) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in CELLS:
        rs = runs.get(name, [])
        if not rs:
            continue
        stale = [
            sum(e["sampling/staleness_max"] for e in r["log_history"] if "sampling/staleness_max" in e)
            / max(1, sum(1 for e in r["log_history"] if "sampling/staleness_max" in e))
            for r in rs
        ]
        lines.append(
            f"| {name} | {len(rs)} | {fmt([r['cold_start_eval_sampled']['accuracy'] for r in rs])} "
            f"| {fmt([curve_mean(r) for r in rs])} | {fmt([final(r) for r in rs])} "
            f"| {fmt([final(r) - r['cold_start_eval_sampled']['accuracy'] for r in rs])} "
            f"| {fmt([r['final_eval_greedy']['accuracy'] for r in rs])} | {fmt(stale, 2)} |"
        )
    lines += ["", "## Differences in the primary measure (a − b, Welch 95 %)", ""]
    lines += ["| a − b | difference |", "| --- | --- |"]
    pairs = [(f"s{d}_{lr}", f"s0_{lr}") for lr in ("lr1", "lrhalf") for d in DOSES[1:]]
    pairs += [("s2_lr1_nocorrection", "s2_lr1"), ("s2_lr1_vtrace", "s2_lr1"), ("window4_s0_lr1", "s0_lr1")]
    pairs += [("null_s0_lr1", "s0_lr1"), ("s0_lrhalf", "s0_lr1")]
    for a, b in pairs:
        if len(runs.get(a, [])) >= 2 and len(runs.get(b, [])) >= 2:
            diff, low, high = welch_interval([curve_mean(r) for r in runs[a]], [curve_mean(r) for r in runs[b]])
            lines.append(f"| {a} − {b} | {diff:+.3f} [{low:+.3f}, {high:+.3f}] |")
    lines += ["", "## Each run's primary measure (seed: curve mean / end sampled / end greedy)", ""]
    for name in CELLS:
        per_seed = [
            f"{r['seed']}: {curve_mean(r):.3f} / {final(r):.3f} / {r['final_eval_greedy']['accuracy']:.2f}"
            for r in runs.get(name, [])
        ]
        if per_seed:
            lines.append(f"- {name}: " + "; ".join(per_seed))
    lines += ["", "## What plan.md §4's rules read", ""]
    mde = minimum_detectable_effect(runs)
    lines.append(f"- Minimum detectable effect: {'not yet' if mde is None else f'{mde:.3f}'}.")
    slopes = {suffix: dose_slope(runs, suffix) for suffix in ("lr1", "lrhalf")}
    for suffix, slope in slopes.items():
        text = "not yet" if slope is None else f"{slope[0]:+.4f} [{slope[1]:+.4f}, {slope[2]:+.4f}] per update"
        lines.append(f"- Rule 1 (a): dose slope at {suffix}: {text}.")
    if all(slopes.values()):
        (a, _, _, se_a, df_a), (b, _, _, se_b, df_b) = slopes["lr1"], slopes["lrhalf"]
        half = t95(df_a + df_b) * math.sqrt(se_a**2 + se_b**2)
        lines.append(
            f"- Rule 2: slope at lr1 − slope at lrhalf: {a - b:+.4f} [{a - b - half:+.4f}, {a - b + half:+.4f}]."
        )
    if len(runs.get("null_s0_lr1", [])) >= 2 and len(runs.get("s0_lr1", [])) >= 2:
        # On the primary measure, as the MDE is (plan.md §4).
        null, s0 = ([curve_mean(r) for r in runs[name]] for name in ("null_s0_lr1", "s0_lr1"))
        diff, low, high = welch_interval(null, s0)
        inside = "inside" if mde is not None and abs(diff) < mde else "outside (or no MDE yet)"
        lines.append(f"- Rule 1 (c): null − s0_lr1: {diff:+.3f} [{low:+.3f}, {high:+.3f}], {inside} the MDE.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", nargs="+", choices=list(CELLS), default=list(CELLS))
    parser.add_argument("--seeds", nargs="+", type=int, help="These seeds instead of each cell's own (pilots, tests).")
    parser.add_argument("--results-dir", default=os.path.join(DEFAULT_RESULTS, "staleness"))
    parser.add_argument("--cache-dir", default=os.path.join(DEFAULT_CACHE, "credit"))  # the credit table's cold starts
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--report", action="store_true", help="Only rebuild results.md from the saved runs.")
    parser.add_argument("--smoke", action="store_true", help="A tiny budget (tests): 2 updates, 2 SFT steps.")
    parser.add_argument("--hops", type=int, default=HOPS, help="K (the plan's is 32; another only for tests).")
    args = parser.parse_args(argv)
    budget = SMOKE_BUDGET if args.smoke else credit.CreditBudget()
    failures = []
    if not args.report:
        import torch

        torch.set_num_threads(1)
        cells = [CELLS[name] for name in args.cells]
        failures = run_all(
            cells,
            args.seeds,
            budget,
            hops=args.hops,
            results_dir=args.results_dir,
            cache_dir=args.cache_dir,
            workers=args.workers,
        )
    os.makedirs(args.results_dir, exist_ok=True)
    with open(os.path.join(args.results_dir, "results.md"), "w") as f:
        f.write(report(args.results_dir))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

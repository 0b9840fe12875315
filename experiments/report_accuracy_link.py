"""The accuracy-link toy's report (`reproduce.py --task <running-sum task>`): the prediction written before the runs,
the grid with its verdicts on held-out accuracy and length (greedy, and sampled at temperature 1), the pairwise
comparisons by the 95 % Welch rule, the assets, and the plots (length, accuracy and stop gap over updates; the first
updates' stop gap and advantage by position). Rules: `results/accuracy_link/plan.md`; nothing here trains."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from report_plots import plot_advantage_by_position, plot_stop_gap_by_position, plot_training_curves
from report_stats import (
    WINDOW,
    assets_section,
    buckets,
    fmt,
    load_runs,
    pretrain_entries,
    series,
    training_entries,
    verdict,
    welch_interval,
    window_mean,
)

# The end values each run records: (column, key in the run's file, metric).
_END = {
    "acc": ("final_eval", "accuracy"),
    "acc_sampled": ("final_eval_sampled", "accuracy"),
    "len": ("final_eval", "response_length_mean"),
    "len_sampled": ("final_eval_sampled", "response_length_mean"),
}
_COLD = {"final_eval": "cold_start_eval", "final_eval_sampled": "cold_start_eval_sampled"}


def accuracy_link_rows(runs: dict[str, list[dict]], variants) -> list[dict[str, Any]]:
    """Per variant with runs, the per-seed end values and changes (end − cold start) of held-out accuracy and length,
    greedy and sampled, the training rollouts' length change, the stop gap and the wall time."""
    rows = []
    for v in variants:
        records = runs.get(v.name, [])
        if not records:
            continue
        row: dict[str, Any] = {"name": v.name, "label": v.label, "seeds": len(records)}
        for column, (section, key) in _END.items():
            row[column] = [r[section][key] if section in r else math.nan for r in records]
            row["d_" + column] = [
                r[section][key] - r[_COLD[section]][key] if section in r else math.nan for r in records
            ]
        row["d_train_len"] = [
            window_mean(series(r, "length"), False) - window_mean(series(r, "length"), True) for r in records
        ]
        row["gap_start"] = [window_mean(series(r, "gap"), True) for r in records]
        row["gap_end"] = [window_mean(series(r, "gap"), False) for r in records]
        row["minutes"] = [r["wall_seconds"] / 60.0 for r in records]
        rows.append(row)
    return rows


def accuracy_link_table(rows: list[dict[str, Any]], cold_start: dict | None, cold_start_sampled: dict | None) -> str:
    intro = ""
    if cold_start and cold_start_sampled:
        intro = (
            f"Cold start (shared by every run): held-out accuracy {cold_start['accuracy']:.3f} greedy, "
            f"{cold_start_sampled['accuracy']:.3f} sampled ({cold_start_sampled['num_samples']} samples per prompt, "
            f"temperature 1); length {cold_start['response_length_mean']:.1f} tokens greedy, "
            f"{cold_start_sampled['response_length_mean']:.1f} sampled. Δ = end − cold start per seed; means ± the "
            'half-width of a 95 % t-interval; verdicts by the prediction\'s rule ("loses": the interval of Δ lies below '
            '0; "keeps": it contains 0; "gains": above 0). Training length: mean of the last 5 policy updates\' '
            "rollouts minus the first 5. Stop gap: `diagnostics/stop_advantage_gap`, first and last 5 policy updates "
            "(no critic in GRPO).\n\n"
        )
    header = (
        "| variant | seeds | accuracy, greedy | Δ greedy | accuracy, sampled | Δ sampled | length, greedy | Δ length "
        "greedy | Δ length sampled | Δ training length | stop gap, first → last 5 | minutes/run |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )

    def judged(values: list[float], digits: int = 3) -> str:
        return f"{fmt(values, digits)} ({verdict(values)})"

    lines = [
        f"| {r['label']} | {r['seeds']} | {fmt(r['acc'])} | {judged(r['d_acc'])} | {fmt(r['acc_sampled'])} "
        f"| {judged(r['d_acc_sampled'])} | {fmt(r['len'], 1)} | {judged(r['d_len'], 1)} "
        f"| {judged(r['d_len_sampled'], 1)} | {judged(r['d_train_len'], 1)} "
        f"| {fmt(r['gap_start'], 2)} → {fmt(r['gap_end'], 2)} | {fmt(r['minutes'], 1)} |"
        for r in rows
    ]
    return intro + header + "\n".join(lines) + "\n"


# The comparison table's columns: (row key, header, digits).
COMPARED = (
    ("acc", "accuracy, greedy", 3),
    ("acc_sampled", "accuracy, sampled", 3),
    ("len", "length, greedy", 1),
    ("len_sampled", "length, sampled", 1),
)


def comparison_table(
    rows: list[dict[str, Any]], pairs: Sequence[tuple[str, str]], columns: Sequence[tuple[str, str, int]] = COMPARED
) -> str:
    """Each pair's difference of end values (first − second) with its 95 % Welch interval, by default greedy and
    sampled accuracy and length (`columns`: other per-seed row values); "differs" when the interval excludes 0."""
    by_name = {r["name"]: r for r in rows}
    lines = []
    for first, second in pairs:
        if first not in by_name or second not in by_name:
            continue
        a, b = by_name[first], by_name[second]
        cells = []
        for column, _, digits in columns:
            diff, lo, hi = welch_interval(a[column], b[column])
            if math.isnan(lo):
                cells.append("–")
                continue
            differs = "differs" if lo > 0 or hi < 0 else "no difference shown"
            cells.append(f"{diff:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}] ({differs})")
        lines.append(f"| {a['label']} − {b['label']} | " + " | ".join(cells) + " |")
    if not lines:
        return ""
    header = (
        "| end values, first − second | "
        + " | ".join(title for _, title, _ in columns)
        + " |\n| --- |"
        + " --- |" * len(columns)
        + "\n"
    )
    return header + "\n".join(lines) + "\n"


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def critic_fit_table(runs: dict[str, list[dict]], variants) -> str:
    """How much of the returns each variant's critic explains (plan.md's critic amendment): the value pretraining's
    explained variance (mean of its last 5 updates), the policy phase's explained variance of the critic's own targets
    and of Monte-Carlo returns (mean over the 8 position buckets), first and last 5 policy updates. GRPO has none."""
    lines = []
    for v in variants:
        records = [r for r in runs.get(v.name, []) if r["variant"]["trainer"] != "grpo"]
        if not records:
            continue
        pretrain = [
            window_mean([float(e["value_pretrain/explained_variance"]) for e in pretrain_entries(r)], False)
            for r in records
        ]
        ev = [series(r, "ev") for r in records]
        prefix = "diagnostics/mc_explained_variance_bucket_"
        mc_first = [_mean(buckets(training_entries(r)[:WINDOW], prefix)) for r in records]
        mc_last = [_mean(buckets(training_entries(r)[-WINDOW:], prefix)) for r in records]
        lines.append(
            f"| {v.label} | {fmt(pretrain)} | {fmt([window_mean(x, True) for x in ev])} → "
            f"{fmt([window_mean(x, False) for x in ev])} | {fmt(mc_first)} → {fmt(mc_last)} |"
        )
    if not lines:
        return ""
    header = (
        "| variant | value pretraining, last 5 | critic's targets, first → last 5 | Monte-Carlo returns, first → last 5 |\n"
        "| --- | --- | --- | --- |\n"
    )
    return header + "\n".join(lines) + "\n"


def build_accuracy_link_report(
    results_dir: str,
    variants,
    seeds: Sequence[int],
    cache_dir: str | None,
    prediction: str,
    pairs: Sequence[tuple[str, str]],
    task: str,
    rebuild_command: str | None = None,
) -> str:
    """Write `results.md` and the PNGs into `results_dir` from whatever runs are saved; returns the markdown.
    `rebuild_command` is the command line the header names (default: the task's own `--report`)."""
    runs = load_runs(results_dir, [v.name for v in variants], seeds)
    first = next((records[0] for records in runs.values()), {})
    rows = accuracy_link_rows(runs, variants)
    commits = sorted({r.get("commit") or "?" for records in runs.values() for r in records})
    parts = [
        f"# The accuracy-link toy (`--task {task}`): results\n\n",
        f"Generated by `{rebuild_command or f'python experiments/reproduce.py --task {task} --report'}` from `runs/` "
        f"(seeds {list(seeds)}; "
        f"runs made at commit(s) {', '.join(commits)}). Rules: `experiments/results/accuracy_link/plan.md`.\n\n",
        "## The prediction (written before the runs)\n\n```\n" + prediction + "```\n\n",
        "## The grid\n\n"
        + accuracy_link_table(rows, first.get("cold_start_eval"), first.get("cold_start_eval_sampled")),
        "\n## Comparisons (95 % Welch interval of the difference of end values)\n\n" + comparison_table(rows, pairs),
        "\n## How much the critics explain (explained variance, means ± 95 % t-interval over seeds)\n\n"
        + critic_fit_table(runs, variants),
    ]
    parts.append(
        assets_section(
            cache_dir,
            [
                ("Reward model with truncated prefixes (our device)", "reward_model_stats"),
                ("EOS-only reward model (the paper's)", "reward_model_eos_stats"),
            ],
        )
    )
    markdown = "".join(parts)
    os.makedirs(results_dir, exist_ok=True)
    with open(os.path.join(results_dir, "results.md"), "w") as f:
        f.write(markdown)
    plot_training_curves(
        runs, variants, os.path.join(results_dir, "training_curves.png"), ("length", "accuracy", "gap")
    )
    critics = [
        ("ppo", "PPO, RM critic with truncated prefixes"),
        ("ppo_rm_eos", "PPO, EOS-only RM critic (the paper's)"),
        ("vcppo", "VC-PPO, pretrained critic"),
        ("vapo", "VAPO, pretrained critic"),
    ]
    plot_stop_gap_by_position(runs, critics, os.path.join(results_dir, "stop_gap_by_position.png"))
    plot_advantage_by_position(runs, critics, os.path.join(results_dir, "advantage_by_position.png"))
    print(markdown)
    return markdown

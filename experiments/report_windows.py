"""The windows/overlap grid's report (`reproduce.py --task <toy> --grid windows`): the prediction written before the
runs, the grid with held-out accuracy and length (greedy and sampled) and the stop gap (the accuracy-link report's
table), each run's length in updates and finished responses against the reference's (the equal-finished-responses
rule) with its time, the pairwise comparisons by the 95 % Welch rule (end values, the first updates' stop gap, the
wall time), the contrast of contrasts (does value pretraining matter more under a window?), the held-out evaluation
along the run (runs made with `--eval-every`), the critics' fit, and the plots (training curves against finished
responses; the first updates' stop gap and advantages by position). Rules: `results/windows_overlap/plan.md`; nothing
here trains."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure
from report_accuracy_link import COMPARED, accuracy_link_rows, accuracy_link_table, comparison_table, critic_fit_table
from report_plots import PANEL_TITLES, plot_advantage_by_position, plot_stop_gap_by_position
from report_stats import along_run_table, assets_section, contrast_interval, fmt, load_runs

# The windows report compares these too: the stop gap of the first and last 5 policy updates, and the wall time.
WINDOWS_COMPARED = (
    *COMPARED,
    ("gap_start", "stop gap, first 5 updates", 2),
    ("gap_end", "stop gap, last 5 updates", 2),
    ("minutes", "minutes/run", 1),
)
_CURVE_KEYS = {
    "length": "diagnostics/response_length_mean",
    "accuracy": "diagnostics/accuracy",
    "gap": "diagnostics/stop_advantage_gap",
}


def batch_size(record: dict) -> int:
    """Responses per update of the run's budget (the pool's size under generation windows)."""
    b = record["budget"]
    return b["per_device_train_batch_size"] * b["gradient_accumulation_steps"] * b["num_mini_batches"]


def phase_entries(record: dict) -> tuple[list[dict], list[dict]]:
    """The run's updates, `(value pretraining, policy)`, in order: every update logs `time/update_s`, and a
    value-pretraining update its `value_pretrain/` metrics (its loss even when no response finished). Unlike
    `report_stats.training_entries`, an update in which no response finished (its score and explained-variance keys
    left out under generation windows) is kept."""
    updates = [e for e in record["log_history"] if "time/update_s" in e]
    in_pretraining = [any(k.startswith("value_pretrain/") for k in e) for e in updates]
    return (
        [e for e, pre in zip(updates, in_pretraining) if pre],
        [e for e, pre in zip(updates, in_pretraining) if not pre],
    )


def finished_responses(entries: list[dict], batch: int) -> float:
    """Responses finished over `entries`: `rollout/finished_responses` under generation windows, else the batch."""
    return float(sum(e.get("rollout/finished_responses", batch) for e in entries))


def reference_updates(record: dict) -> tuple[int, int]:
    """`(value-pretraining, policy)` updates of the run's budget before the variant's equal-finished factors: what a
    whole-response run of the same budget makes."""
    variant, budget = record["variant"], record["budget"]
    pretrain = 0
    if variant.get("pretrain"):
        field = variant.get("pretrain_field", "pretrain_updates")
        pretrain = budget[field] if variant.get("pretrain_updates") is None else variant["pretrain_updates"]
    return pretrain, budget["ppo_updates"]


def run_length_rows(runs: dict[str, list[dict]], variants) -> list[dict[str, Any]]:
    """Per variant with runs, per seed: updates and finished responses of each phase against the reference's (the
    budget's updates × batch), windows per finished response, seconds per policy update, the worker's staleness and
    the trainer's wait for samples (`max_staleness`), and the wall time."""
    rows = []
    for v in variants:
        records = runs.get(v.name, [])
        if not records:
            continue
        row: dict[str, Any] = {"name": v.name, "label": v.label, "seeds": len(records)}
        for key in (
            "pretrain_updates",
            "policy_updates",
            "pretrain_ratio",
            "policy_ratio",
            "finished_pretrain",
            "finished_policy",
            "windows",
            "update_s",
            "staleness",
            "wait_s",
            "minutes",
        ):
            row[key] = []
        for r in records:
            pretrain, policy = phase_entries(r)
            batch = batch_size(r)
            ref_pretrain, ref_policy = reference_updates(r)
            row["pretrain_updates"].append(len(pretrain))
            row["policy_updates"].append(len(policy))
            row["finished_pretrain"].append(finished_responses(pretrain, batch))
            row["finished_policy"].append(finished_responses(policy, batch))
            row["pretrain_ratio"].append(
                row["finished_pretrain"][-1] / (ref_pretrain * batch) if ref_pretrain else math.nan
            )
            row["policy_ratio"].append(row["finished_policy"][-1] / (ref_policy * batch))
            counted = [e for e in policy if "rollout/windows_per_finished_mean" in e]
            finished = sum(e["rollout/finished_responses"] for e in counted)
            row["windows"].append(
                sum(e["rollout/windows_per_finished_mean"] * e["rollout/finished_responses"] for e in counted)
                / finished
                if finished
                else math.nan
            )
            row["update_s"].append(sum(e["time/update_s"] for e in policy) / len(policy) if policy else math.nan)
            stale = [e["sampling/staleness_max"] for e in policy if "sampling/staleness_max" in e]
            row["staleness"].append(max(stale) if stale else math.nan)
            waits = [e["time/sampler_wait_s"] for e in policy if "time/sampler_wait_s" in e]
            row["wait_s"].append(sum(waits) / len(waits) if waits else math.nan)
            row["minutes"].append(r["wall_seconds"] / 60.0)
        rows.append(row)
    return rows


def run_length_table(rows: list[dict[str, Any]]) -> str:
    intro = (
        "Per run (means ± the half-width of a 95 % t-interval over seeds): updates, and responses finished in each "
        "phase ÷ the reference's (the budget's updates × the batch: what the run without a window finishes); "
        "windows per finished response (`rollout/windows_per_finished_mean`); seconds per policy update; wall minutes "
        "per run (two runs share the two cores: plan.md §5); for `max_staleness`, the most policy updates between "
        "the weights that sampled a batch and those that trained on it, and the trainer's wait for samples.\n\n"
    )
    header = (
        "| variant | seeds | updates, pretraining / policy | finished ÷ reference, pretraining | finished ÷ "
        "reference, policy | windows per finished response | s per policy update | minutes/run | staleness, max "
        "| wait for samples, s/update |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    lines = [
        f"| {r['label']} | {r['seeds']} | {fmt(r['pretrain_updates'], 0)} / {fmt(r['policy_updates'], 0)} "
        f"| {fmt(r['pretrain_ratio'], 3)} | {fmt(r['policy_ratio'], 3)} | {fmt(r['windows'], 2)} "
        f"| {fmt(r['update_s'], 2)} | {fmt(r['minutes'], 1)} | {fmt(r['staleness'], 0)} | {fmt(r['wait_s'], 2)} |"
        for r in rows
    ]
    return intro + header + "\n".join(lines) + "\n"


def contrast_table(rows: list[dict[str, Any]], contrast: tuple[tuple[str, str], tuple[str, str]]) -> str:
    """(a − b) − (c − d) for `contrast = ((a, b), (c, d))` on the compared end values, by the Welch–Satterthwaite
    rule."""
    by_name = {r["name"]: r for r in rows}
    (a, b), (c, d) = contrast
    if not all(n in by_name for n in (a, b, c, d)):
        return ""
    cells = []
    for column, _, digits in (*COMPARED, ("gap_start", "", 2)):
        groups = [(by_name[a][column], 1.0), (by_name[b][column], -1.0), (by_name[c][column], -1.0)]
        est, lo, hi = contrast_interval([*groups, (by_name[d][column], 1.0)])
        if math.isnan(lo):
            cells.append("–")
            continue
        differs = "differs" if lo > 0 or hi < 0 else "no difference shown"
        cells.append(f"{est:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}] ({differs})")
    label = f"({by_name[a]['label']} − {by_name[b]['label']}) − ({by_name[c]['label']} − {by_name[d]['label']})"
    header = (
        "| contrast | "
        + " | ".join(title for _, title, _ in COMPARED)
        + " | stop gap, first 5 updates |\n| --- |"
        + " --- |" * (len(COMPARED) + 1)
        + "\n"
    )
    return header + f"| {label} | " + " | ".join(cells) + " |\n"


def finished_by_update(record: dict, update: int) -> float:
    """Responses the run's policy updates finished up to `update` (inclusive) ÷ the batch: a whole-response update's
    worth each, so that a windowed run's update lines up with the reference's."""
    batch = batch_size(record)
    return finished_responses(phase_entries(record)[1][:update], batch) / batch


def along_run_section(runs: dict[str, list[dict]], variants) -> str:
    """Per variant whose runs were made with `--eval-every`: held-out accuracy and length along the run, with the
    responses finished by each update ÷ the batch. Empty when no run has `held_out_along_run`."""
    parts = []
    for v in variants:
        table = along_run_table(runs.get(v.name, []), [("finished ÷ batch", finished_by_update, 1)])
        if table:
            parts.append(f"### {v.label}\n\n{table}")
    if not parts:
        return ""
    intro = (
        "\n## Held-out evaluation along the run (`--eval-every`; means ± the half-width of a 95 % t-interval over "
        "seeds)\n\nUpdate 0 is the cold start; the last update is the final evaluation. A windowed run's updates "
        "finish fewer responses each: the last column gives the responses its policy updates finished by then ÷ the "
        "batch, the whole-response updates they match.\n\n"
    )
    return intro + "\n".join(parts)


def plot_curves_by_finished(runs, variants, path: str, panels: Sequence[str] = ("length", "accuracy", "gap")) -> None:
    """Training curves (mean over seeds by policy update) against the responses finished so far ÷ the batch, so that
    a windowed run's many short updates line up with the reference's whole-response ones."""
    fig = Figure(figsize=(16, 4.2))
    axes = fig.subplots(1, len(panels))
    for v in variants:
        records = runs.get(v.name)
        if not records:
            continue
        per_seed = []
        for r in records:
            batch, done, xs = batch_size(r), 0.0, []
            policy = phase_entries(r)[1]
            for e in policy:
                done += e.get("rollout/finished_responses", batch)
                xs.append(done / batch)
            per_seed.append((xs, policy))
        n = min(len(xs) for xs, _ in per_seed)
        if n == 0:
            continue
        x = [sum(xs[i] for xs, _ in per_seed) / len(per_seed) for i in range(n)]
        for ax, what in zip(axes, panels):
            y = []
            for i in range(n):
                vals = [policy[i].get(_CURVE_KEYS[what]) for _, policy in per_seed]
                vals = [float(u) for u in vals if u is not None and not math.isnan(float(u))]
                y.append(sum(vals) / len(vals) if vals else math.nan)
            style = "--" if "window" in v.name else (":" if "stale" in v.name else "-")
            ax.plot(x, y, label=v.label, linestyle=style, marker=".", markersize=3)  # points: nan gaps
    for ax, what in zip(axes, panels):
        ax.set_title(PANEL_TITLES[what])
        ax.set_xlabel("responses finished ÷ the batch (a whole-response update's worth)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Training curves, mean over seeds, against finished responses")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def build_windows_report(
    results_dir: str,
    variants,
    seeds: Sequence[int],
    cache_dir: str | None,
    prediction: str,
    pairs: Sequence[tuple[str, str]],
    task: str,
    rebuild_command: str | None = None,
    contrast: tuple[tuple[str, str], tuple[str, str]] | None = None,
) -> str:
    """Write `results.md` and the PNGs into `results_dir` from whatever runs are saved; returns the markdown.
    `contrast`: `((a, b), (c, d))`, reported as (a − b) − (c − d) (none: no such section)."""
    runs = load_runs(results_dir, [v.name for v in variants], seeds)
    first = next((records[0] for records in runs.values()), {})
    rows = accuracy_link_rows(runs, variants)
    commits = sorted({r.get("commit") or "?" for records in runs.values() for r in records})
    command = rebuild_command or f"python experiments/reproduce.py --task {task} --grid windows --report"
    parts = [
        f"# Generation windows and one-step-off overlap (`--task {task} --grid windows`): results\n\n",
        f"Generated by `{command}` from `runs/` (seeds {list(seeds)}; runs made at commit(s) {', '.join(commits)}). "
        "Rules: `experiments/results/windows_overlap/plan.md`.\n\n",
        "## The prediction (written before the runs)\n\n```\n" + prediction + "```\n\n",
        "## The grid\n\n"
        + accuracy_link_table(rows, first.get("cold_start_eval"), first.get("cold_start_eval_sampled")),
        "\n## Run length and time (equal finished responses)\n\n" + run_length_table(run_length_rows(runs, variants)),
        "\n## Comparisons (95 % Welch interval of the difference of end values)\n\n"
        + comparison_table(rows, pairs, WINDOWS_COMPARED),
        "\n## Does value pretraining matter more under a window? (contrast of contrasts, Welch–Satterthwaite 95 %)\n\n"
        + (contrast_table(rows, contrast) if contrast else ""),
        along_run_section(runs, variants),
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
    plot_curves_by_finished(runs, variants, os.path.join(results_dir, "training_curves.png"))
    critics = [(v.name, v.label) for v in variants if v.trainer != "grpo"]
    plot_stop_gap_by_position(runs, critics, os.path.join(results_dir, "stop_gap_by_position.png"))
    plot_advantage_by_position(runs, critics, os.path.join(results_dir, "advantage_by_position.png"))
    print(markdown)
    return markdown

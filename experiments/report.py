"""Table and plots of the toy reproduction, rebuilt from the saved runs (`results/runs/<variant>/seed<k>.json`).

    python experiments/reproduce.py --report                  # the first toy
    python experiments/reproduce.py --task majority --report  # the stop-anytime toy

It imports nothing from `reproduce.py` (which imports it): the variants, seeds and prediction come in as arguments.

Nothing here trains: every figure is read from the runs' metric histories, so the report can be rebuilt at any time
and an interrupted sweep reports what it has.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure  # figures drawn straight to files: no pyplot backend to switch

NUM_BUCKETS = 8
WINDOW = 5  # updates averaged for "start" and "end" of training
# Two-sided 95 % Student-t quantiles by degrees of freedom.
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t-interval (nan with fewer than two finite values)."""
    xs = [x for x in values if x is not None and not math.isnan(x)]
    if not xs:
        return math.nan, math.nan
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return mean, math.nan
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    return mean, _T95.get(len(xs) - 1, 1.96) * sd / math.sqrt(len(xs))


def fmt(values: Sequence[float], digits: int = 3) -> str:
    mean, half = mean_ci(values)
    if math.isnan(mean):
        return "–"
    return f"{mean:.{digits}f}" if math.isnan(half) else f"{mean:.{digits}f} ± {half:.{digits}f}"


# ------------------------------------------------------------------------------------------ series from histories


def training_entries(record: dict) -> list[dict]:
    """The policy-training updates of a run, in order (value-pretraining updates and summaries left out)."""
    history = record["log_history"]
    if record["variant"]["trainer"] == "grpo":
        return [e for e in history if "reward" in e]
    return [e for e in history if "objective/scores" in e and "value_pretrain/explained_variance" not in e]


def pretrain_entries(record: dict) -> list[dict]:
    return [e for e in record["log_history"] if "value_pretrain/explained_variance" in e]


def series(record: dict, what: str) -> list[float]:
    """Per-update `accuracy`, `length`, `short` (share of compressed responses), `corr`, `ev` of a run."""
    grpo = record["variant"]["trainer"] == "grpo"
    entries = training_entries(record)
    if grpo and what in ("corr", "ev", "gap"):
        return []
    keys = {
        "accuracy": "rewards/math_verify_reward/mean" if grpo else "diagnostics/accuracy",
        "length": "completions/mean_length" if grpo else "diagnostics/response_length_mean",
        "short": "rewards/short_form/mean",
        "corr": "diagnostics/advantage_position_corr",
        "ev": "value/explained_variance",
        "gap": "diagnostics/stop_advantage_gap",
    }
    out = []
    for e in entries:
        x = e.get(keys[what])
        x = math.nan if x is None else float(x)
        if grpo and what == "accuracy":
            x = (x + 1.0) / 2.0  # ±1 rewards: share of +1
        out.append(x)
    return out


def window_mean(xs: list[float], start: bool) -> float:
    xs = xs[:WINDOW] if start else xs[-WINDOW:]
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def mc_ev_end(record: dict, bucket: int) -> float:
    """Mean over the last `WINDOW` updates of the critic's explained variance of Monte-Carlo returns in `bucket`."""
    entries = training_entries(record)[-WINDOW:]
    return buckets(entries, "diagnostics/mc_explained_variance_bucket_")[bucket] if entries else math.nan


def buckets(entries: list[dict], prefix: str) -> list[float]:
    """Mean over `entries` of the position-bucket metric `<prefix><k>`, for k in 0..7."""
    out = []
    for k in range(NUM_BUCKETS):
        xs = [e.get(f"{prefix}{k}") for e in entries]
        xs = [float(x) for x in xs if x is not None and not math.isnan(float(x))]
        out.append(sum(xs) / len(xs) if xs else math.nan)
    return out


# ------------------------------------------------------------------------------------------------------- loading


def load_runs(results_dir: str, variant_names: Sequence[str], seeds: Sequence[int]) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {}
    for name in variant_names:
        for seed in seeds:
            path = os.path.join(results_dir, "runs", name, f"seed{seed}.json")
            if os.path.isfile(path):
                with open(path) as f:
                    runs.setdefault(name, []).append(json.load(f))
    return runs


# --------------------------------------------------------------------------------------------------------- table


def table_rows(runs: dict[str, list[dict]], variants) -> list[dict[str, Any]]:
    rows = []
    for v in variants:
        records = runs.get(v.name, [])
        if not records:
            continue

        def per_seed(fn, records=records):
            return [fn(r) for r in records]

        rows.append(
            {
                "name": v.name,
                "label": v.label,
                "group": v.group,
                "seeds": len(records),
                "acc_start": per_seed(lambda r: r["cold_start_eval"]["accuracy"]),
                "acc_end": per_seed(lambda r: r["final_eval"]["accuracy"]),
                "eval_len_end": per_seed(lambda r: r["final_eval"]["response_length_mean"]),
                "eval_short_end": per_seed(lambda r: r["final_eval"].get("short_rate", math.nan)),
                "len_start": per_seed(lambda r: window_mean(series(r, "length"), True)),
                "len_end": per_seed(lambda r: window_mean(series(r, "length"), False)),
                "short_start": per_seed(lambda r: window_mean(series(r, "short"), True)),
                "short_end": per_seed(lambda r: window_mean(series(r, "short"), False)),
                "corr_start": per_seed(lambda r: window_mean(series(r, "corr"), True)),
                "corr_end": per_seed(lambda r: window_mean(series(r, "corr"), False)),
                "ev_end": per_seed(lambda r: window_mean(series(r, "ev"), False)),
                "mc_ev_first": per_seed(lambda r: mc_ev_end(r, 0)),
                "mc_ev_last": per_seed(lambda r: mc_ev_end(r, NUM_BUCKETS - 1)),
                "minutes": per_seed(lambda r: r["wall_seconds"] / 60.0),
            }
        )
    return rows


def markdown_table(rows: list[dict[str, Any]], cold_start: dict | None) -> str:
    header = (
        "| variant | seeds | held-out accuracy, end | held-out length, end | held-out short share, end "
        "| training length, first → last 5 updates | short share, first → last 5 | adv–position corr, first → last 5 "
        "| critic EV (own targets), last 5 | critic EV vs Monte-Carlo returns, first / last eighth, last 5 "
        "| minutes/run |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    lines = []
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['seeds']} | {fmt(r['acc_end'])} | {fmt(r['eval_len_end'], 1)} "
            f"| {fmt(r['eval_short_end'], 2)} | {fmt(r['len_start'], 1)} → {fmt(r['len_end'], 1)} "
            f"| {fmt(r['short_start'], 2)} → {fmt(r['short_end'], 2)} "
            f"| {fmt(r['corr_start'], 2)} → {fmt(r['corr_end'], 2)} | {fmt(r['ev_end'], 2)} "
            f"| {fmt(r['mc_ev_first'], 2)} / {fmt(r['mc_ev_last'], 2)} | {fmt(r['minutes'], 1)} |"
        )
    intro = ""
    if cold_start:
        intro = (
            f"Cold start (shared by every run): held-out greedy accuracy {cold_start['accuracy']:.3f}, "
            f"length {cold_start['response_length_mean']:.1f}, short share {cold_start.get('short_rate', math.nan):.2f}."
            "\n\nMeans over seeds ± the half-width of a 95 % t-interval. Held-out: greedy decoding on the 300 test "
            "prompts after training. Training columns: means over the first and last 5 policy updates' rollouts. "
            "Critic EV (own targets) is against the critic's λ_critic returns, which λ < 1 makes easy to fit; the "
            "Monte-Carlo column is against the true returns.\n\n"
        )
    return intro + header + "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------- the prediction check (majority)


def critic_ratio(record: dict) -> float | None:
    """The run's critic/policy learning-rate ratio (None for GRPO, which has no critic)."""
    if record["variant"]["trainer"] == "grpo":
        return None
    budget, ratio = record["budget"], record["variant"].get("value_lr_ratio")
    return ratio if ratio is not None else budget["value_learning_rate"] / budget["learning_rate"]


def verdict(values: Sequence[float]) -> str:
    """The prediction's rule on a change (end − cold start): "loses" when its 95 % interval lies below 0."""
    mean, half = mean_ci(values)
    if math.isnan(mean) or math.isnan(half):
        return "–"
    if mean + half < 0:
        return "loses"
    return "gains" if mean - half > 0 else "keeps"


def interval(values: Sequence[float]) -> tuple[float, float]:
    mean, half = mean_ci(values)
    return mean - half, mean + half


def prediction_rows(runs: dict[str, list[dict]], variants) -> list[dict[str, Any]]:
    rows = []
    for v in variants:
        records = runs.get(v.name, [])
        if not records:
            continue

        def per_seed(fn, records=records):
            return [fn(r) for r in records]

        ratios = {critic_ratio(r) for r in records}
        rows.append(
            {
                "name": v.name,
                "label": v.label,
                "ratio": ratios.pop() if len(ratios) == 1 else None,
                "seeds": len(records),
                "acc_end": per_seed(lambda r: r["final_eval"]["accuracy"]),
                "d_acc": per_seed(lambda r: r["final_eval"]["accuracy"] - r["cold_start_eval"]["accuracy"]),
                "len_end": per_seed(lambda r: r["final_eval"]["response_length_mean"]),
                "d_len": per_seed(
                    lambda r: r["final_eval"]["response_length_mean"] - r["cold_start_eval"]["response_length_mean"]
                ),
                "d_train_len": per_seed(
                    lambda r: window_mean(series(r, "length"), False) - window_mean(series(r, "length"), True)
                ),
                "gap_start": per_seed(lambda r: window_mean(series(r, "gap"), True)),
                "gap_end": per_seed(lambda r: window_mean(series(r, "gap"), False)),
                "minutes": per_seed(lambda r: r["wall_seconds"] / 60.0),
            }
        )
    return rows


def prediction_table(rows: list[dict[str, Any]], cold_start: dict | None) -> str:
    intro = ""
    if cold_start:
        intro = (
            f"Cold start (shared by every run): held-out greedy accuracy {cold_start['accuracy']:.3f}, length "
            f"{cold_start['response_length_mean']:.1f} tokens. Δ = end − cold start per seed; means ± the half-width "
            'of a 95 % t-interval; verdicts by the prediction\'s rule ("loses": the interval of Δ lies below 0; '
            '"keeps": it contains 0; "gains": above 0). Training length: mean of the last 5 policy updates\' '
            "rollouts minus the first 5 (temperature 1). Stop gap: `diagnostics/stop_advantage_gap`, mean of the first "
            "and of the last 5 policy updates.\n\n"
        )
    header = (
        "| variant | critic/policy lr | seeds | held-out accuracy, end | Δ accuracy | held-out length, end | Δ length "
        "| Δ training length | stop gap, first → last 5 | minutes/run |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    lines = []
    for r in rows:
        ratio = "–" if r["ratio"] is None else f"{r['ratio']:g}"
        lines.append(
            f"| {r['label']} | {ratio} | {r['seeds']} | {fmt(r['acc_end'])} | {fmt(r['d_acc'])} ({verdict(r['d_acc'])}) "
            f"| {fmt(r['len_end'], 1)} | {fmt(r['d_len'], 1)} ({verdict(r['d_len'])}) "
            f"| {fmt(r['d_train_len'], 1)} ({verdict(r['d_train_len'])}) "
            f"| {fmt(r['gap_start'], 2)} → {fmt(r['gap_end'], 2)} | {fmt(r['minutes'], 1)} |"
        )
    return intro + header + "\n".join(lines) + "\n"


def claim_check(rows: list[dict[str, Any]], pairs: Sequence[tuple[str, str]]) -> str:
    """The prediction's claim for each (PPO, VC-PPO) pair at one critic speed, from the rows' per-seed values."""
    by_name = {r["name"]: r for r in rows}
    out = []
    for ppo, vcppo in pairs:
        if ppo not in by_name or vcppo not in by_name:
            continue
        p, v = by_name[ppo], by_name[vcppo]
        ppo_loses = verdict(p["d_acc"]) == "loses" and verdict(p["d_len"]) == "loses"
        vc_holds = verdict(v["d_acc"]) != "loses" and verdict(v["d_len"]) != "loses"
        apart = []
        for key in ("acc_end", "len_end"):
            (plo, phi), (vlo, vhi) = interval(p[key]), interval(v[key])
            apart.append(not (math.isnan(plo) or math.isnan(vlo)) and (phi < vlo or vhi < plo))
        holds = ppo_loses and vc_holds and all(apart)
        ratio = "–" if p["ratio"] is None else f"{p['ratio']:g}"
        out.append(
            f"- critic/policy lr {ratio} ({p['label']} vs {v['label']}): PPO loses both: {ppo_loses}; VC-PPO keeps or "
            f"gains both: {vc_holds}; end intervals apart (accuracy, length): {apart[0]}, {apart[1]} → "
            f"**claim {'holds' if holds else 'does not hold'}**."
        )
    return "\n".join(out) + ("\n" if out else "")


# --------------------------------------------------------------------------------------------------------- plots


def _mean_curve(records: list[dict], what: str) -> list[float]:
    curves = [series(r, what) for r in records]
    curves = [c for c in curves if c]
    if not curves:
        return []
    n = min(len(c) for c in curves)
    return [sum(c[i] for c in curves) / len(curves) for i in range(n)]


PANEL_TITLES = {
    "length": "response length (training rollouts)",
    "accuracy": "accuracy (training rollouts)",
    "short": "share of short-form responses",
    "gap": "stop-advantage gap (diagnostics/stop_advantage_gap)",
}


def plot_training_curves(runs, variants, path: str, panels: Sequence[str] = ("length", "accuracy", "short")) -> None:
    fig = Figure(figsize=(16, 4.2))
    axes = fig.subplots(1, len(panels))
    for v in variants:
        records = runs.get(v.name)
        if not records:
            continue
        for ax, what in zip(axes, panels):
            curve = _mean_curve(records, what)
            if curve:
                style = "--" if "bias" in v.name else (":" if v.name.endswith("_slow") else "-")
                ax.plot(range(1, len(curve) + 1), curve, label=v.label, linestyle=style)
    for ax, title in zip(axes, (PANEL_TITLES[p] for p in panels)):
        ax.set_title(title)
        ax.set_xlabel("policy update")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Training curves, mean over seeds (cf. the paper's Figures 1 and 5)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_advantage_by_position(runs, names_labels, path: str, first_updates: int = 3) -> None:
    fig = Figure(figsize=(12, 4.2))
    axes = fig.subplots(1, 2)
    x = [(k + 0.5) / NUM_BUCKETS for k in range(NUM_BUCKETS)]
    for name, label in names_labels:
        records = runs.get(name)
        if not records:
            continue
        entries = [e for r in records for e in training_entries(r)[:first_updates]]
        axes[0].plot(x, buckets(entries, "diagnostics/advantage_bucket_"), marker="o", label=label)
        axes[1].plot(x, buckets(entries, "diagnostics/value_error_bucket_"), marker="o", label=label)
    axes[0].set_title(f"mean advantage (unwhitened) by position, first {first_updates} updates")
    axes[1].set_title("critic value − its target, by position")
    for ax in axes:
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xlabel("relative position in the response")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Figure 2 analogue: advantages by token position for each starting critic")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_stop_gap_by_position(runs, names_labels, path: str, first_updates: int = 3) -> None:
    """The stop-vs-continue advantage gap by absolute position bucket, over the first policy updates (new)."""
    fig = Figure(figsize=(7, 4.2))
    ax = fig.subplots(1, 1)
    x = list(range(NUM_BUCKETS))
    for name, label in names_labels:
        records = runs.get(name)
        if not records:
            continue
        entries = [e for r in records for e in training_entries(r)[:first_updates]]
        ax.plot(x, buckets(entries, "diagnostics/stop_advantage_gap_bucket_"), marker="o", label=label)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xlabel("position bucket (eighths of the response length limit)")
    ax.set_title(f"stop-minus-continue advantage by position, first {first_updates} updates")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_lambda_critic(runs, pairs, path: str, length: int = 160) -> None:
    fig = Figure(figsize=(12, 4.2))
    axes = fig.subplots(1, 2)
    t = list(range(length))
    for lam in (0.9, 0.95, 0.99, 1.0):
        axes[0].plot(t, [lam ** (length - 1 - i) for i in t], label=f"λ = {lam}")
    axes[0].set_title(f"weight λ^(T−t) of the end reward in token t's target (T = {length})")
    axes[0].set_xlabel("token t")
    axes[0].legend(fontsize=8)
    x = [(k + 0.5) / NUM_BUCKETS for k in range(NUM_BUCKETS)]
    for name, label in pairs:
        records = runs.get(name)
        if not records:
            continue
        entries = [e for r in records for e in training_entries(r)[-10:]]
        axes[1].plot(x, buckets(entries, "diagnostics/mc_explained_variance_bucket_"), marker="o", label=label)
    axes[1].set_title("critic explained variance vs Monte-Carlo returns, last 10 updates")
    axes[1].set_xlabel("relative position in the response")
    axes[1].legend(fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle("Figure 3 analogue: the end reward's weight, and per-position explained variance by λ_critic")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_value_pretraining(runs, names_labels, path: str) -> None:
    fig = Figure(figsize=(12, 4.2))
    axes = fig.subplots(1, 2)
    for name, label in names_labels:
        for r in runs.get(name, []):
            entries = pretrain_entries(r)
            if not entries:
                continue
            steps = range(1, len(entries) + 1)
            kw = {"label": f"{label}, seed {r['seed']}", "alpha": 0.8}
            axes[0].plot(steps, [e.get("value_pretrain/loss_avg", math.nan) for e in entries], **kw)
            axes[1].plot(steps, [e.get("value_pretrain/explained_variance", math.nan) for e in entries], **kw)
    axes[0].set_title("value loss during value pretraining")
    axes[1].set_title("explained variance during value pretraining")
    for ax in axes:
        ax.set_xlabel("pretraining update")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Figure 6 analogue: value pretraining")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def build_report(
    results_dir: str,
    variants,
    seeds: Sequence[int],
    cache_dir: str | None = None,
    sweeps: Sequence = (),
    prediction: str | None = None,
) -> str:
    """Write `results.md` and the PNGs into `results_dir` from whatever runs are saved; returns the markdown.

    `sweeps`: `(title, [(variant name, row label), ...])` tables, whose rows may reuse main runs. `prediction`: the
    stop-anytime task's prediction, written before its runs; with it the report checks it (`prediction_table`).
    """
    if prediction is not None:
        return build_prediction_report(results_dir, variants, seeds, cache_dir, prediction)
    runs = load_runs(results_dir, [v.name for v in variants], seeds)
    cold_start = None
    for records in runs.values():
        cold_start = records[0]["cold_start_eval"]
        break
    main = [v for v in variants if v.group == "main"]
    parts = ["# Toy reproduction: results\n", "Generated by `experiments/report.py` from `runs/`.\n"]
    rows = table_rows(runs, main)
    if rows:
        parts.append("\n## Main table\n\n" + markdown_table(rows, cold_start))
    by_name = {v.name: v for v in variants}
    for title, members in sweeps:
        relabelled = [dataclasses.replace(by_name[name], label=label) for name, label in members if name in by_name]
        rows = table_rows(runs, relabelled)
        if any(r["name"] != "vcppo" and r["name"] != "vcppo_no_pretrain" for r in rows):
            parts.append(f"\n## {title}\n\n" + markdown_table(rows, None))
    if cache_dir and os.path.isfile(os.path.join(cache_dir, "assets.json")):
        with open(os.path.join(cache_dir, "assets.json")) as f:
            assets = json.load(f)
        parts.append(
            "\n## Assets\n\n"
            f"- Reward model: {json.dumps(assets.get('reward_model_stats'))}\n"
            f"- Controlled-bias critic: {json.dumps(assets.get('controlled_bias_stats'))}\n"
            f"- Cold start {assets.get('cold_start_seconds', math.nan):.0f} s, critics "
            f"{assets.get('critic_build_seconds', math.nan):.0f} s\n"
        )
    markdown = "".join(parts)
    os.makedirs(results_dir, exist_ok=True)
    with open(os.path.join(results_dir, "results.md"), "w") as f:
        f.write(markdown)
    plot_training_curves(runs, main, os.path.join(results_dir, "training_curves.png"))
    plot_advantage_by_position(
        runs,
        [
            ("ppo", "reward-model critic (PPO)"),
            ("ppo_biased", "controlled-bias critic (PPO)"),
            ("vcppo", "pretrained critic (VC-PPO)"),
        ],
        os.path.join(results_dir, "advantage_by_position.png"),
    )
    plot_lambda_critic(
        runs,
        [("vcppo_no_dgae", "λ_critic 0.95 (VC-PPO w/o decoupled GAE)"), ("vcppo", "λ_critic 1.0 (VC-PPO)")],
        os.path.join(results_dir, "lambda_critic.png"),
    )
    plot_value_pretraining(runs, [("vcppo", "VC-PPO")], os.path.join(results_dir, "value_pretraining.png"))
    print(markdown)
    return markdown


def build_prediction_report(results_dir: str, variants, seeds: Sequence[int], cache_dir: str | None, prediction: str):
    """The stop-anytime task's report: the prediction, the grid with its verdicts, the claim per critic speed, plots."""
    runs = load_runs(results_dir, [v.name for v in variants], seeds)
    cold_start = next((records[0]["cold_start_eval"] for records in runs.values()), None)
    rows = prediction_rows(runs, variants)
    commits = sorted({r.get("commit") or "?" for records in runs.values() for r in records})
    parts = [
        "# The stop-anytime toy (`--task majority`): results\n\n",
        f"Generated by `python experiments/reproduce.py --task majority --report` from `runs/` (seeds {list(seeds)}; "
        f"runs made at commit(s) {', '.join(commits)}).\n\n",
        "## The prediction (written before the runs)\n\n```\n" + prediction + "```\n\n",
        "## The grid\n\n" + prediction_table(rows, cold_start),
        "\n## The claim, per critic speed\n\n" + claim_check(rows, [("ppo", "vcppo"), ("ppo_slow", "vcppo_slow")]),
    ]
    if cache_dir and os.path.isfile(os.path.join(cache_dir, "assets.json")):
        with open(os.path.join(cache_dir, "assets.json")) as f:
            assets = json.load(f)
        parts.append(
            "\n## Assets\n\n"
            f"- Reward model with truncated prefixes (our device): {json.dumps(assets.get('reward_model_stats'))}\n"
            f"- EOS-only reward model (the paper's): {json.dumps(assets.get('reward_model_eos_stats'))}\n"
            f"- Controlled-bias critic (our device): {json.dumps(assets.get('controlled_bias_stats'))}\n"
            f"- Cold start {assets.get('cold_start_seconds', math.nan):.0f} s, critics "
            f"{assets.get('critic_build_seconds', math.nan):.0f} s\n"
        )
    markdown = "".join(parts)
    os.makedirs(results_dir, exist_ok=True)
    with open(os.path.join(results_dir, "results.md"), "w") as f:
        f.write(markdown)
    plot_training_curves(
        runs, variants, os.path.join(results_dir, "training_curves.png"), ("length", "accuracy", "gap")
    )
    first = [
        ("ppo", "PPO, RM critic (ratio 2)"),
        ("ppo_slow", "PPO, RM critic (ratio ½)"),
        ("vcppo", "VC-PPO, pretrained (ratio 2)"),
        ("vcppo_slow", "VC-PPO, pretrained (ratio ½)"),
        ("ppo_lam_actor1", "λ_actor 1.0, RM critic"),
        ("ppo_biased", "PPO, controlled-bias critic"),
    ]
    plot_stop_gap_by_position(runs, first, os.path.join(results_dir, "stop_gap_by_position.png"))
    plot_advantage_by_position(runs, first, os.path.join(results_dir, "advantage_by_position.png"))
    print(markdown)
    return markdown

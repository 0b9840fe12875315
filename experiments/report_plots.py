"""The report's plots, drawn straight to PNG files from the runs' metric histories (matplotlib's `Figure`, no pyplot
backend to switch): training curves, advantages, stop gap and critic explained variance by position, the end reward's
weight by λ_critic, and value pretraining."""

from __future__ import annotations

import math
from collections.abc import Sequence

from matplotlib.figure import Figure  # figures drawn straight to files: no pyplot backend to switch
from report_stats import NUM_BUCKETS, buckets, pretrain_entries, series, training_entries

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

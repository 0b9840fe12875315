"""The report's statistics, read from the saved runs: the 95 % t-interval and the prediction's verdict rule, the
per-update series of a run's metric history (training and value-pretraining updates, position buckets), the means
over the first and last updates, and the loading of the raw runs (`runs/<variant>/seed<k>.json`)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence

NUM_BUCKETS = 8
WINDOW = 5  # updates averaged for "start" and "end" of training
# Two-sided 95 % Student-t quantiles by degrees of freedom (1.96 above 30).
_T95 = {
    **{1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228},
    **{11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086},
    **{21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042},
}


def t95(df: float) -> float:
    """The two-sided 95 % t quantile at `df` degrees of freedom, rounded down (a conservative quantile)."""
    return _T95.get(max(int(df), 1), 1.96)


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t-interval (nan with fewer than two finite values)."""
    xs = [x for x in values if x is not None and not math.isnan(x)]
    if not xs:
        return math.nan, math.nan
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return mean, math.nan
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    return mean, t95(len(xs) - 1) * sd / math.sqrt(len(xs))


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


def assets_section(cache_dir: str | None, critics: Sequence[tuple[str, str]]) -> str:
    """The report's "Assets" section from the cache's `assets.json`: one line per `(label, manifest key)` of a critic
    that was built (absent keys are left out), then the cold start's and the critics' build seconds. Empty when
    there is no cache."""
    path = os.path.join(cache_dir, "assets.json") if cache_dir else None
    if not path or not os.path.isfile(path):
        return ""
    with open(path) as f:
        assets = json.load(f)
    lines = "".join(f"- {label}: {json.dumps(assets[key])}\n" for label, key in critics if key in assets)
    return (
        f"\n## Assets\n\n{lines}- Cold start {assets.get('cold_start_seconds', math.nan):.0f} s, critics "
        f"{assets.get('critic_build_seconds', math.nan):.0f} s\n"
    )


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


def welch_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """The difference of the means of `a` and `b` and its 95 % Welch interval `(difference, low, high)`: the
    Welch–Satterthwaite degrees of freedom, rounded down (a conservative t quantile); nan with fewer than two finite
    values on a side."""
    xs = [x for x in a if x is not None and not math.isnan(x)]
    ys = [y for y in b if y is not None and not math.isnan(y)]
    if len(xs) < 2 or len(ys) < 2:
        return math.nan, math.nan, math.nan
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    vx = sum((x - mx) ** 2 for x in xs) / (len(xs) - 1) / len(xs)
    vy = sum((y - my) ** 2 for y in ys) / (len(ys) - 1) / len(ys)
    diff = mx - my
    if vx + vy == 0:
        return diff, diff, diff
    df = (vx + vy) ** 2 / (vx**2 / (len(xs) - 1) + vy**2 / (len(ys) - 1))
    half = t95(df) * math.sqrt(vx + vy)
    return diff, diff - half, diff + half


def contrast_interval(groups: Sequence[tuple[Sequence[float], float]]) -> tuple[float, float, float]:
    """A contrast Σ c_i·mean_i of independent groups `(values, c_i)` and its 95 % interval with Welch–Satterthwaite
    degrees of freedom, rounded down (for two groups with c = +1, −1: `report_stats.welch_interval`); nan when a group
    has fewer than two finite values."""
    estimate, variance, df_denominator = 0.0, 0.0, 0.0
    for values, c in groups:
        xs = [x for x in values if x is not None and not math.isnan(x)]
        if len(xs) < 2:
            return math.nan, math.nan, math.nan
        mean = sum(xs) / len(xs)
        v = c * c * sum((x - mean) ** 2 for x in xs) / (len(xs) - 1) / len(xs)
        estimate += c * mean
        variance += v
        df_denominator += v * v / (len(xs) - 1)
    if variance == 0:
        return estimate, estimate, estimate
    half = t95(variance * variance / df_denominator) * math.sqrt(variance)
    return estimate, estimate - half, estimate + half


def interval(values: Sequence[float]) -> tuple[float, float]:
    mean, half = mean_ci(values)
    return mean - half, mean + half


# ------------------------------------------------------------------------------- held-out evaluation along the run


def held_out_value(entry: dict | None, kind: str, key: str) -> float:
    """`entry[kind][key]` of a held-out evaluation entry (`kind` "greedy" or "sampled"), nan where it is missing."""
    x = ((entry or {}).get(kind) or {}).get(key)
    return math.nan if x is None else float(x)


# The along-run table's columns: (title, evaluation, key, digits).
ALONG_RUN_COLUMNS = (
    ("greedy accuracy", "greedy", "accuracy", 3),
    ("sampled accuracy", "sampled", "accuracy", 3),
    ("greedy length", "greedy", "response_length_mean", 1),
    ("sampled length", "sampled", "response_length_mean", 1),
)


def along_run_table(records: Sequence[dict], extra_columns: Sequence[tuple] = ()) -> str:
    """One variant's held-out evaluation along the run (`held_out_along_run`, `reproduce.py --eval-every`) as a
    markdown table: per policy update, the mean over the runs that have it ± the half-width of its 95 % t-interval,
    from the cold start (update 0: the runs' `cold_start_eval` and `cold_start_eval_sampled`) to the last update (the
    final evaluation). The sampled columns only when some run has a sampled evaluation. `extra_columns`: more
    `(title, value(record, update) -> float, digits)` columns (e.g. responses finished by then). Empty when no run has
    the field (runs saved without it)."""
    records = [r for r in records if r.get("held_out_along_run")]
    if not records:
        return ""
    by_update: dict[int, list[tuple[dict, dict]]] = {}
    for r in records:
        start = {"greedy": r.get("cold_start_eval"), "sampled": r.get("cold_start_eval_sampled")}
        for entry in [{"update": 0, **start}, *r["held_out_along_run"]]:
            by_update.setdefault(int(entry["update"]), []).append((r, entry))
    sampled = any(e.get("sampled") for r in records for e in r["held_out_along_run"])
    columns = [c for c in ALONG_RUN_COLUMNS if sampled or c[1] != "sampled"]
    titles = ["update", "runs", *(c[0] for c in columns), *(c[0] for c in extra_columns)]
    lines = ["| " + " | ".join(titles) + " |", "|" + " --- |" * len(titles)]
    for update in sorted(by_update):
        pairs = by_update[update]
        cells = [str(update) + (" (cold start)" if update == 0 else ""), str(len(pairs))]
        cells += [fmt([held_out_value(e, kind, key) for _, e in pairs], digits) for _, kind, key, digits in columns]
        cells += [fmt([value(r, update) for r, _ in pairs], digits) for _, value, digits in extra_columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"

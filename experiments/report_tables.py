"""The report's markdown tables, from the runs' per-seed values: the first toy's main and sweep tables, and the
stop-anytime task's grid with its verdicts and the claim per critic speed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from report_stats import NUM_BUCKETS, critic_ratio, fmt, interval, mc_ev_end, series, verdict, window_mean

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

"""The windows-remedy report (`windows_remedy.py`; rules in `results/windows_remedy/plan.md` §5 and §7): per arm, the
held-out accuracy at the end and along the run, how far and how noisily the policy moved, and the windows'
diagnostics; the plan's comparisons by Welch intervals with the ±0.05 equivalence margin, which hypothesis they
support, and what the plan's rule makes the default. Written to `results.md` beside the runs."""

from __future__ import annotations

import math
import os

from report_stats import along_run_table, fmt, load_runs, welch_interval
from report_windows import phase_entries

# The plan's comparisons (first minus second), in its order (§7).
PAIRS = (
    ("B_window", "C_whole_batch12"),
    ("C_whole_batch12", "A_whole"),
    ("B_window", "A_whole"),
    ("D_window_low_lr", "A_whole"),
    ("E_window_pool80", "A_whole"),
    ("F_pool80_finished_whitening", "E_window_pool80"),
)
# Follow-up 1 (plan.md, written after the table and before its arm ran): is the window's own cost the cut?
FOLLOWUP_PAIRS = (("G_whole_cut_advantages", "A_whole"), ("G_whole_cut_advantages", "E_window_pool80"))
# Follow-up 2 (plan.md, written before its code and arm): sampling in windows, or training in windows?
FOLLOWUP2_PAIRS = (("H_window_train_finished", "A_whole"), ("H_window_train_finished", "E_window_pool80"))
# Follow-up 3 (plan.md, written before its arm ran): does one update of staleness alone cost what the window costs?
FOLLOWUP3_PAIRS = (("J_whole_one_step_off", "A_whole"), ("J_whole_one_step_off", "E_window_pool80"))
# Follow-up 4 (plan.md, written before its arm ran): J's cost, staleness or its sequence-level correction?
FOLLOWUP4_PAIRS = (
    ("K_whole_one_step_off_uncorrected", "A_whole"),
    ("K_whole_one_step_off_uncorrected", "J_whole_one_step_off"),
)
# Read after the runs, not in the plan: no hypothesis or default rests on these.
EXPLORATORY_PAIRS = (
    ("E_window_pool80", "B_window"),
    ("D_window_low_lr", "B_window"),
    ("F_pool80_finished_whitening", "A_whole"),
    ("D_window_low_lr", "E_window_pool80"),
)
WHOLE_RESPONSE_ARMS = ("A_whole", "C_whole_batch12")
MARGIN = 0.05  # accuracy: "equivalent" when the whole 95 % interval lies inside ±MARGIN
ACCURACIES = (
    ("greedy", "final_eval", "cold_start_eval"),
    ("sampled", "final_eval_sampled", "cold_start_eval_sampled"),
)
REFERENCE_BATCH = 32  # a whole-response update of the budget (A's): the unit of "finished ÷ batch"


def run_batch(record: dict) -> int:
    """Responses per update of the run: the budget's, or the arm's own (C's smaller batch)."""
    fields = {**record["budget"], **dict(record["variant"].get("options") or ())}
    return fields["per_device_train_batch_size"] * fields["gradient_accumulation_steps"] * fields["num_mini_batches"]


def finished(entries: list[dict], batch: int) -> float:
    """Responses finished over `entries`: `rollout/finished_responses` under windows, else the batch per update."""
    return float(sum(e.get("rollout/finished_responses", batch) for e in entries))


def _mean(xs) -> float:
    xs = [float(x) for x in xs if x is not None and not math.isnan(float(x))]
    return sum(xs) / len(xs) if xs else math.nan


def run_measures(record: dict) -> dict[str, float]:
    """One run's measures (plan.md §5)."""
    _, policy = phase_entries(record)
    key = lambda k: [e.get(k) for e in policy]  # noqa: E731
    out = {
        "updates": float(len(policy)),
        "finished": finished(policy, run_batch(record)),
        "outcomes_per_step": _mean(key("rollout/outcomes_per_step")),
        "kl_sum": float(sum(x for x in key("policy/approxkl_avg") if x is not None)),
        "entropy_start": _mean(key("policy/entropy_avg")[:5]),
        "entropy_end": _mean(key("policy/entropy_avg")[-5:]),
        "grad_norm": _mean(key("grad_norm/policy_avg")),
        "clipfrac": _mean(key("policy/clipfrac_avg")),
        "gap_start": _mean(key("diagnostics/stop_advantage_gap")[:5]),
        "gap_end": _mean(key("diagnostics/stop_advantage_gap")[-5:]),
        "adv_finished": _mean(key("diagnostics/advantage_finished_mean")),
        "adv_unfinished": _mean(key("diagnostics/advantage_unfinished_mean")),
        "update_s": _mean(key("time/update_s")),
        "minutes": record["wall_seconds"] / 60.0,
    }
    for kind, end, start in ACCURACIES:
        if record.get(end):
            out[f"{kind}_acc"] = float(record[end]["accuracy"])
            out[f"{kind}_delta"] = out[f"{kind}_acc"] - float(record[start]["accuracy"])
            out[f"{kind}_len"] = float(record[end].get("response_length_mean", math.nan))
    return out


# (title, measure, digits) of the two per-arm tables.
OUTCOME_COLUMNS = (
    ("greedy acc", "greedy_acc", 3),
    ("Δ greedy", "greedy_delta", 3),
    ("sampled acc", "sampled_acc", 3),
    ("Δ sampled", "sampled_delta", 3),
    ("greedy length", "greedy_len", 1),
    ("sampled length", "sampled_len", 1),
)
MOVEMENT_COLUMNS = (
    ("policy updates", "updates", 0),
    ("finished", "finished", 0),
    ("outcomes/step", "outcomes_per_step", 1),
    ("Σ approx-KL", "kl_sum", 4),
    ("entropy, first 5", "entropy_start", 4),
    ("entropy, last 5", "entropy_end", 4),
    ("grad norm", "grad_norm", 3),
    ("clip fraction", "clipfrac", 4),
    ("stop gap, first 5", "gap_start", 3),
    ("stop gap, last 5", "gap_end", 3),
    ("adv. finished", "adv_finished", 3),
    ("adv. unfinished", "adv_unfinished", 3),
    ("s/update", "update_s", 1),
    ("minutes/run", "minutes", 1),
)


def arm_table(measures: dict[str, list[dict]], labels: dict[str, str], columns) -> str:
    titles = ["arm", "runs", *(c[0] for c in columns)]
    lines = ["| " + " | ".join(titles) + " |", "|" + " --- |" * len(titles)]
    for name, runs in measures.items():
        cells = [labels[name], str(len(runs))]
        cells += [fmt([m.get(key, math.nan) for m in runs], digits) for _, key, digits in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def reading(low: float, high: float) -> str:
    """The plan's rule (§7) on a difference's 95 % interval."""
    if math.isnan(low):
        return "–"
    if low > 0:
        return "first higher"
    if high < 0:
        return "second higher"
    return "equivalent" if -MARGIN <= low and high <= MARGIN else "not resolved"


def compare(measures: dict[str, list[dict]], first: str, second: str, key: str) -> tuple[float, float, float]:
    return welch_interval(
        [m.get(key, math.nan) for m in measures.get(first, [])],
        [m.get(key, math.nan) for m in measures.get(second, [])],
    )


def _difference(d: float, low: float, high: float, digits: int) -> str:
    return "–" if math.isnan(low) else f"{d:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def comparison_table(measures: dict[str, list[dict]], pairs=PAIRS) -> tuple[str, dict[tuple[str, str, str], str]]:
    """`pairs`' comparisons on greedy and sampled accuracy at the end (and Σ approx-KL, not read by the rule)."""
    readings = {}
    lines = [
        "| first − second | greedy accuracy [95 %] | reading | sampled accuracy [95 %] | reading | Σ approx-KL [95 %] |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for first, second in pairs:
        if not measures.get(first) or not measures.get(second):
            continue
        cells = [f"{first[0]} − {second[0]}"]
        for kind in ("greedy", "sampled"):
            d, lo, hi = compare(measures, first, second, f"{kind}_acc")
            readings[(first, second, kind)] = reading(lo, hi)
            cells += [_difference(d, lo, hi, 3), readings[(first, second, kind)]]
        cells.append(_difference(*compare(measures, first, second, "kl_sum"), 4))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n", readings


def verdicts(readings: dict[tuple[str, str, str], str]) -> list[str]:
    """Which hypothesis the readings support, per accuracy (plan.md §7), and what the rule makes the default."""
    below = lambda a, b, kind: readings.get((a, b, kind)) == "second higher"  # noqa: E731
    out = []
    if any((a, b, "greedy") not in readings for a, b in PAIRS[:5]):
        return ["Not every comparison of A-E has runs on both sides yet: no verdict."]
    A, B, C, D, E = "A_whole", "B_window", "C_whole_batch12", "D_window_low_lr", "E_window_pool80"
    recommend = False
    for kind in ("greedy", "sampled"):
        step_noise = (
            below(C, A, kind)
            and below(B, A, kind)
            and not below(B, C, kind)
            and not below(D, A, kind)
            and not below(E, A, kind)
        )
        bootstrap = below(B, A, kind) and below(D, A, kind) and below(E, A, kind) and not below(C, A, kind)
        which = "step noise" if step_noise else "the bootstrap" if bootstrap else "neither hypothesis"
        out.append(f"- {kind} accuracy: the readings support {which}.")
        if below(B, A, kind) and not below(E, A, kind):
            recommend = True
    e_below = any(below(E, A, kind) for kind in ("greedy", "sampled"))
    if recommend and not e_below:
        out.append(
            "- The rule (§7): E − A is not below 0 while B − A is: recommend rollout_pool_size ≈ batch × E⌈l/W⌉ for "
            "windowed runs."
        )
    elif e_below:
        out.append(
            "- The rule (§7): E − A is below 0: the window's cost is not the step noise alone; the default stays."
        )
    else:
        out.append("- The rule (§7): B − A is not below 0 on either accuracy: nothing to remedy on this evidence.")
    return out


def followup_verdict(readings: dict[tuple[str, str, str], str]) -> str:
    """Follow-up 1's rule on greedy accuracy: the cut is supported when G − A is below 0 and G − E is not; not
    supported when G − A is equivalent or not resolved while E − A is below 0."""
    (g_a, g_e), e_a = FOLLOWUP_PAIRS, ("E_window_pool80", "A_whole", "greedy")
    if (*g_a, "greedy") not in readings or (*g_e, "greedy") not in readings or e_a not in readings:
        return "- Follow-up 1: not every comparison has runs on both sides yet: no verdict."
    below = lambda pair: readings[(*pair, "greedy")] == "second higher"  # noqa: E731
    if below(g_a) and not below(g_e):
        return "- Follow-up 1 (greedy accuracy): the cut in the advantages is supported as the window's own cost."
    if not below(g_a) and readings[(*g_a, "greedy")] != "first higher" and readings[e_a] == "second higher":
        return (
            "- Follow-up 1 (greedy accuracy): the cut is not supported; the window's cost lies in what G does not "
            "change."
        )
    return "- Follow-up 1 (greedy accuracy): neither reading of the rule; reported as it falls."


def followup2_verdict(readings: dict[tuple[str, str, str], str]) -> str:
    """Follow-up 2's rule on greedy accuracy: the training side when H − A is equivalent or not resolved and H − E is
    above 0; the sampling side when H − A is below 0 and H − E is not above 0; else both or neither, no verdict."""
    h_a, h_e = ((*pair, "greedy") for pair in FOLLOWUP2_PAIRS)
    if h_a not in readings or h_e not in readings:
        return "- Follow-up 2: not every comparison has runs on both sides yet: no verdict."
    if readings[h_a] in ("equivalent", "not resolved") and readings[h_e] == "first higher":
        return (
            "- Follow-up 2 (greedy accuracy): the window's cost is on the training side (a response trained window "
            "by window); training a response when it finishes is a candidate remedy, to be built and measured."
        )
    if readings[h_a] == "second higher" and readings[h_e] != "first higher":
        return (
            "- Follow-up 2 (greedy accuracy): the cost comes with sampling a response in windows; no change of the "
            "update alone removes it."
        )
    return "- Follow-up 2 (greedy accuracy): both or neither side by the rule; reported as it falls, no verdict."


def followup3_verdict(readings: dict[tuple[str, str, str], str]) -> str:
    """Follow-up 3's rule on greedy accuracy: stale data explains the window's cost when J − A is below 0 and J − E is
    not above 0; it does not when J − A is equivalent or not resolved and J − E is above 0; else no verdict."""
    j_a, j_e = ((*pair, "greedy") for pair in FOLLOWUP3_PAIRS)
    if j_a not in readings or j_e not in readings:
        return "- Follow-up 3: not every comparison has runs on both sides yet: no verdict."
    if readings[j_a] == "second higher" and readings[j_e] != "first higher":
        return (
            "- Follow-up 3 (greedy accuracy): one update of staleness alone costs about what the window costs: the "
            "window's cost is read as training on text older policies wrote."
        )
    if readings[j_a] in ("equivalent", "not resolved") and readings[j_e] == "first higher":
        return (
            "- Follow-up 3 (greedy accuracy): one update of staleness does not explain the window's cost; left: a "
            "response composed by successive policies, and the pool's finishing order."
        )
    return "- Follow-up 3 (greedy accuracy): neither reading of the rule; reported as it falls, no verdict."


def followup4_verdict(readings: dict[tuple[str, str, str], str]) -> str:
    """Follow-up 4's rule on greedy accuracy: the correction was J's cost when K − A is equivalent or not resolved and
    K − J is above 0; staleness itself when K − A is below 0 and K − J is not above 0; else no verdict."""
    k_a, k_j = ((*pair, "greedy") for pair in FOLLOWUP4_PAIRS)
    if k_a not in readings or k_j not in readings:
        return "- Follow-up 4: not every comparison has runs on both sides yet: no verdict."
    if readings[k_a] in ("equivalent", "not resolved") and readings[k_j] == "first higher":
        return (
            "- Follow-up 4 (greedy accuracy): J's cost came from the sequence-level sampler correction, not from "
            "staleness; follow-up 3's reading is withdrawn."
        )
    if readings[k_a] == "second higher" and readings[k_j] != "first higher":
        return "- Follow-up 4 (greedy accuracy): staleness itself costs accuracy here, corrected or not."
    return "- Follow-up 4 (greedy accuracy): neither reading of the rule; reported as it falls, no verdict."


def followups() -> tuple:
    """The follow-ups' sections in plan order: (title, pairs, verdict)."""
    return (
        (
            "Follow-up 1: the cut in the advantages (plan.md, written before its arm ran)",
            FOLLOWUP_PAIRS,
            followup_verdict,
        ),
        (
            "Follow-up 2: sampling or training in windows (plan.md, written before its code and arm)",
            FOLLOWUP2_PAIRS,
            followup2_verdict,
        ),
        (
            "Follow-up 3: one update of staleness (plan.md, written before its arm ran)",
            FOLLOWUP3_PAIRS,
            followup3_verdict,
        ),
        (
            "Follow-up 4: staleness or its correction (plan.md, written before its arm ran)",
            FOLLOWUP4_PAIRS,
            followup4_verdict,
        ),
    )


def _pearson(xs: list[float], ys: list[float]) -> float:
    mx, my = _mean(xs), _mean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def entropy_section(measures: dict[str, list[dict]]) -> str:
    """Does end greedy accuracy follow the entropy rise (last 5 − first 5 updates) whatever the arm? The correlation
    over every run, and each windowed arm's mean residual from a line fitted on the whole-response arms alone."""
    rise = lambda m: m["entropy_end"] - m["entropy_start"]  # noqa: E731
    every = [m for ms in measures.values() for m in ms if "greedy_acc" in m]
    whole = [m for arm in WHOLE_RESPONSE_ARMS for m in measures.get(arm, []) if "greedy_acc" in m]
    if len(every) < 3 or len(whole) < 3:
        return ""
    xs, ys = [rise(m) for m in whole], [m["greedy_acc"] for m in whole]
    mx, my = _mean(xs), _mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    lines = [
        "| arm | runs | mean residual, greedy accuracy |",
        "| --- | --- | --- |",
    ]
    for arm, ms in measures.items():
        if arm in WHOLE_RESPONSE_ARMS or not ms:
            continue
        residuals = [m["greedy_acc"] - (my + slope * (rise(m) - mx)) for m in ms if "greedy_acc" in m]
        lines.append(f"| {arm[0]} | {len(residuals)} | {fmt(residuals, 3)} |")
    if len(lines) == 2:
        return ""  # no windowed arm to read against the line
    r_all = _pearson([rise(m) for m in every], [m["greedy_acc"] for m in every])
    r_kl = _pearson([m["kl_sum"] for m in every], [m["greedy_acc"] for m in every])
    return (
        "\n## Accuracy and the entropy rise (after the runs, not in the plan)\n\n"
        f"Over all {len(every)} runs, end greedy accuracy against the entropy rise (last 5 − first 5 updates): "
        f"r = {r_all:.2f} (against Σ approx-KL: r = {r_kl:.2f}). A line fitted on the whole-response arms "
        f"({', '.join(a[0] for a in WHOLE_RESPONSE_ARMS)}: {slope:+.1f} accuracy per unit of entropy rise) and each "
        "other arm's mean residual from it (0: the arm lost what its entropy rise predicts, no more):\n\n"
        + "\n".join(lines)
        + "\n"
    )


def _finished_by_update(record: dict, update: int) -> float:
    _, policy = phase_entries(record)
    return finished(policy[:update], run_batch(record)) / REFERENCE_BATCH


def critic_section(results_dir: str, seeds) -> str:
    records = load_runs(results_dir, ["critic"], seeds).get("critic", [])
    if not records:
        return ""
    ev = []
    for r in records:
        pre = [
            e["value_pretrain/explained_variance"]
            for e in r["log_history"]
            if "value_pretrain/explained_variance" in e
        ]
        ev.append(_mean(pre[-5:]))
    minutes = [r["wall_seconds"] / 60.0 for r in records]
    return (
        f"\n## The seeds' critics\n\n{len(records)} critics (one per seed, loaded by every arm): value-pretraining "
        f"explained variance, mean of the last 5 updates, {fmt(ev, 3)}; {fmt(minutes, 1)} minutes each.\n"
    )


def build_report(results_dir: str, arms, seeds) -> str:
    """results.md from the saved runs of `arms` with `seeds`; returns its text."""
    runs = load_runs(results_dir, [a.name for a in arms], seeds)
    labels = {a.name: a.label for a in arms}
    measures = {a.name: [run_measures(r) for r in runs[a.name]] for a in arms if runs.get(a.name)}
    commits = sorted({r.get("commit") or "?" for rs in runs.values() for r in rs})
    parts = [
        "# Windows that keep accuracy: the table (count-mod-5, window L/4)\n",
        f"Rebuilt by `python experiments/windows_remedy.py --report` from the saved runs in `{os.path.basename(results_dir)}/runs/` "
        f"(seeds {', '.join(map(str, seeds))}; commits {', '.join(c[:7] for c in commits)}; the rules in plan.md). "
        "Means ± the half-width of a 95 % t-interval over seeds.\n",
        "## Held-out accuracy at the end (Δ: from the cold start)\n",
        arm_table(measures, labels, OUTCOME_COLUMNS),
        "\n## How the policy moved, and the windows' diagnostics (trained tokens)\n",
        arm_table(measures, labels, MOVEMENT_COLUMNS),
    ]
    table, readings = comparison_table(measures)
    parts += [
        f"\n## The plan's comparisons (95 % Welch intervals; equivalent: inside ±{MARGIN})\n",
        table,
        "\n" + "\n".join(verdicts(readings)) + "\n",
    ]
    for title, pairs, verdict in followups():
        followup, followup_readings = comparison_table(measures, pairs)
        if followup_readings:  # each verdict reads its own pairs (follow-up 1 also E − A from the plan's)
            parts += [f"\n## {title}\n", followup, "\n" + verdict({**readings, **followup_readings}) + "\n"]
    parts += [
        "\n## Other differences (after the runs, not in the plan; no hypothesis or default rests on them)\n",
        comparison_table(measures, EXPLORATORY_PAIRS)[0],
        entropy_section(measures),
        critic_section(results_dir, seeds),
    ]
    along = []
    for a in arms:
        t = along_run_table(runs.get(a.name, []), [("finished ÷ 32", _finished_by_update, 1)])
        if t:
            along.append(f"### {a.label}\n\n{t}")
    if along:
        parts.append("\n## Held-out evaluation along the run (update 0: the cold start)\n\n" + "\n".join(along))
    text = "\n".join(parts)
    os.makedirs(results_dir, exist_ok=True)
    with open(os.path.join(results_dir, "results.md"), "w") as f:
        f.write(text)
    return text

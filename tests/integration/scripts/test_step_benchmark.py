"""Smoke run of `benchmarks/step.py` without the TRL 1.12 side (CI cannot afford installing it): ours, and TRL's
`GRPOTrainer` from the installed TRL, must run end to end and print the three tables. No timing is asserted."""

import os
import subprocess
import sys

from ...paths import REPO


def test_step_benchmark_smoke_ours_only():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(REPO, "src"), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "step.py"), "--ours-only", "--smoke"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "Table 1" in out and "Table 2" in out and "Table 3" in out
    assert "TRL1.12" not in out  # --ours-only: the TRL 1.12 side is neither installed nor run
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("16 ")]
    assert len(rows) == 2  # one row (T=16) in each timing table
    ours = rows[0]  # table 1, ours only: T, s/update, outside generation, tok/s, peak RSS
    assert 0 < float(ours[2]) < float(ours[1])
    # Table 2: T | GRPO, shortcut, ratio, no-shortcut, ratio | the same outside generation | peak RSS GRPO, shortcut
    paper = rows[1]
    assert paper[1] == "|" and paper[7] == "|" and paper[13] == "|", paper
    grpo, shortcut, no_shortcut = float(paper[2]), float(paper[3]), float(paper[5])
    assert _printed_ratio_matches(paper[4], paper[3], paper[2])
    assert _printed_ratio_matches(paper[6], paper[5], paper[2])
    for update_s, outside_s in ((grpo, paper[8]), (shortcut, paper[9]), (no_shortcut, paper[11])):
        assert 0 < float(outside_s) < update_s
    assert "GRPOTrainer" in out
    memory_rows = [line.split() for line in out.splitlines() if line.strip().startswith("1000 ")]
    assert [row[1] for row in memory_rows] == ["rollout", "train"]


def _printed_ratio_matches(ratio: str, numerator: str, denominator: str) -> bool:
    """The ratio is computed from unrounded seconds and printed to 2 decimals, the seconds to 3: recomputing it from the
    printed seconds is exact only up to both roundings, so check it lies in the interval they allow."""
    half_second, half_ratio = 0.0005, 0.005
    num, den = float(numerator), float(denominator)
    low = max(num - half_second, 0.0) / (den + half_second)
    high = (num + half_second) / max(den - half_second, 1e-12)
    return low - half_ratio - 1e-9 <= float(ratio) <= high + half_ratio + 1e-9


def test_printed_ratio_check_allows_rounding_and_rejects_wrong_ratios():
    assert _printed_ratio_matches("0.30", "0.047", "0.160")  # the case that failed a fixed 0.006 tolerance
    assert not _printed_ratio_matches("0.35", "0.047", "0.160")
    assert not _printed_ratio_matches("3.40", "0.047", "0.160")


def _run_benchmark(script, *args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(REPO, "src"), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_step_lengths_smoke_stops_both_sides_at_drawn_lengths():
    """GRPO and ours, each sample stopped at a drawn length (GRPO's runner checks its completions were cut), ours
    padded and with a token budget: one row per side with its ratio to GRPO. No timing is asserted."""
    out = _run_benchmark("step_lengths.py", "--smoke")
    table = out.split("raw seconds")[0].splitlines()
    rows = {line.split()[0]: line.split() for line in table if line.strip().startswith(("grpo", "ours"))}
    assert set(rows) == {"grpo", "ours", "ours-budget"}, out
    assert float(rows["grpo"][2]) == 1.0
    for side in ("ours", "ours-budget"):
        assert _printed_ratio_matches(rows[side][2], rows[side][1], rows["grpo"][1]), rows


def test_token_budget_benchmark_smoke_prints_every_variant():
    out = _run_benchmark("token_budget.py", "--smoke")
    for distribution in ("long-tailed", "uniform"):
        assert f"\n{distribution}: response lengths" in out
    variants = [
        line.split()[0] for line in out.splitlines() if line.strip().startswith(("padded", "budget", "packed"))
    ]
    assert variants == ["padded", "budget", "packed"] * 2
    packed = [line.split() for line in out.splitlines() if line.strip().startswith("packed")]
    assert all(float(row[3]) == 1.0 and float(row[4]) == 1.0 for row in packed)  # no padding computed


def test_windows_benchmark_smoke_prints_every_side_and_stops_at_the_drawn_lengths():
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import step_setup
    import torch
    from windows import DrawnLengthStop

    prompt = list(range(step_setup.PROMPT_LENGTH))
    stop = DrawnLengthStop({tuple(prompt): 3}, response_length=8)
    eos = step_setup.EOS_ID
    # Left-padded (pad = EOS), 3 tokens generated so far (over earlier windows): the stop is forced now, not before.
    scores = stop(torch.tensor([[eos, eos, *prompt, 5, 6, 7], [eos, eos, *prompt, 5, 6, 7]]), torch.zeros(2, 100))
    assert all(int(row.argmax()) == eos and int(row.isinf().sum()) == 99 for row in scores)
    early = stop(torch.tensor([[eos, eos, eos, *prompt, 5, 6]]), torch.zeros(1, 100))
    assert bool(early[0, eos].isinf()) and int(early[0].isinf().sum()) == 1
    out = _run_benchmark("windows.py", "--smoke")
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("whole", "win", "grpo"))}
    pools = {"win-T/4-pool", "win-T/4-pool-budget", "win-T/8-pool", "win-T/8-pool-budget"}
    assert set(rows) == {"whole", "window-T/2", "window-T/4", "whole-budget", "win-T/4-budget", "grpo", *pools}, out
    # A larger pool finishes more responses per update than a pool of the batch
    assert all(float(rows[side][4]) > float(rows["window-T/4"][4]) for side in pools)
    assert float(rows["whole"][7]) == 1.0 and float(rows["grpo"][8]) == 1.0
    assert float(rows["window-T/4"][4]) < 8  # responses cut by the window stay in flight


def test_overlap_benchmark_smoke():
    """benchmarks/overlap.py's code paths at T = 16: the sync side and staleness 1 and 2 run, each side's batches are
    at most its bound stale, and the printed speed-ups are consistent with the printed seconds. No timing is
    asserted."""
    out = _run_benchmark("overlap.py", "--smoke")
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("sync ", "s1 ", "s2 "))}
    assert set(rows) == {"sync", "s1", "s2"}, out
    assert rows["sync"][6] == "0" and rows["s1"][6] == "1" and rows["s2"][6] == "2"
    for side in ("s1", "s2"):
        assert _printed_ratio_matches(rows[side][7], rows["sync"][1], rows[side][1])
    assert "bound: (G + T) / max(G, T + S)" in out

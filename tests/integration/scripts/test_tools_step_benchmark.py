"""Smoke run of `benchmarks/tools_step.py`: a tiny cold start that calls the `add` tool, then one warm-up and one timed
update each of TRL's `GRPOTrainer`, our `VCPPOTrainer` and our `PPOTrainer` with the same tool, in one process. Checks
that the table prints one row per side with its ratio and shares; no timing is asserted."""

import os
import subprocess
import sys

from ...paths import REPO
from .test_step_benchmark import _printed_ratio_matches


def test_tools_step_benchmark_smoke_prints_every_side():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(REPO, "src"), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "tools_step.py"), "--smoke"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "GRPOTrainer" in out and "torch threads per process: 1" in out and "idle machine" in out
    table = out.split("raw seconds")[0].splitlines()
    rows = {line.split()[0]: line.split() for line in table if line.startswith(("grpo ", "vcppo ", "ppo "))}
    assert set(rows) == {"grpo", "vcppo", "ppo"}, out
    # side, s/update, ratio, |, tools %, generation %, learning %, |, tool ms, call rate, calls, tokens, episodes
    for row in rows.values():
        assert row[3] == "|" and row[7] == "|", row
        assert float(row[1]) > 0 and _printed_ratio_matches(row[2], row[1], rows["grpo"][1]), row
        shares = [float(cell.rstrip("%")) for cell in row[4:7]]
        assert all(share >= 0 for share in shares) and abs(sum(shares) - 100) < 0.3, row
        assert 0 <= float(row[9]) <= 1 and int(row[12]) == 8, row  # the call rate, 8 episodes per update
    assert float(rows["grpo"][2]) == 1.0

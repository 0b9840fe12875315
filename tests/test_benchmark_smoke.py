"""Smoke run of `benchmarks/step.py` for our side only (CI cannot afford installing TRL 1.12): it must run end to end
and print its three tables. No timing is asserted."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    for row in rows:
        update_s, outside_s = float(row[1]), float(row[2])
        assert 0 < outside_s < update_s
    memory_rows = [line.split() for line in out.splitlines() if line.strip().startswith("1000 ")]
    assert [row[1] for row in memory_rows] == ["rollout", "train"]

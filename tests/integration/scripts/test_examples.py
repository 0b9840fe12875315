"""examples/scripts/: each runs with `--tiny` (a tiny in-process model, no download) and trains what it asks for."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ...paths import REPO

SCRIPTS = {  # script: the updates it runs with --tiny (value pretraining, then PPO)
    "vcppo.py": "update 4/4",
    "vapo.py": "update 4/4",
    "grpo_ported.py": "update 4/4",
    "vcppo_tools.py": "update 4/4",
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_example_runs_tiny(script, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    path = os.path.join(REPO, "examples", "scripts", script)
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, path, "--tiny", "--output_dir", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert SCRIPTS[script] in output and "update 5/" not in output
    assert "Value pretraining finished after 2 updates" in output
    if script != "grpo_ported.py":
        assert (out / "value_model" / "config.json").exists()  # the critic saved beside the policy
    assert "FutureWarning" not in output and "Traceback" not in output

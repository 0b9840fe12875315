"""`accelerate launch` on a CPU with two processes as the README says (issue 59): configs/accelerate/cpu_ddp.yaml starts
two, and a launch that asked for two and got one (cpu.yaml's single-process launcher) says so at start-up, naming the
command that works."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ...paths import REPO
from .test_distributed import _clean_env

TRAIN = [
    "train.py",
    "--config",
    "configs/recipes/tiny_cpu.yaml",
    "--toy_cold_start_steps",
    "2",
    "--max_steps",
    "1",
    "--value_pretrain_steps",
    "1",
    "--total_episodes",
    "64",
    "--num_sample_generations",
    "0",
]


def _accelerate_launch(config: str, output_dir, *launch_args: str) -> str:
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.accelerate_cli",
        "launch",
        "--config_file",
        os.path.join(REPO, "configs", "accelerate", config),
        "--main_process_port",
        "0",
        *launch_args,
        *TRAIN,
        "--output_dir",
        str(output_dir),
    ]
    proc = subprocess.run(cmd, env=_clean_env(), capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stdout + proc.stderr


def test_cpu_ddp_config_trains_on_two_processes(tmp_path):
    out = _accelerate_launch("cpu_ddp.yaml", tmp_path / "ddp")
    assert "Training on 2 processes (cpu), DDP." in out
    assert "started one" not in out


@pytest.mark.parametrize("launch_args", [("--num_processes", "2"), ("--cpu", "--num_processes", "2")])
def test_a_single_process_launcher_asked_for_two_says_so(tmp_path, launch_args):
    out = _accelerate_launch("cpu.yaml", tmp_path / "one", *launch_args)
    assert "Training on 1 process (cpu), one process." in out
    assert "asked for several processes but started one" in out and "configs/accelerate/cpu_ddp.yaml" in out


def test_one_process_as_asked_is_not_warned_about(tmp_path):
    out = _accelerate_launch("cpu.yaml", tmp_path / "one")
    assert "Training on 1 process (cpu), one process." in out and "started one" not in out

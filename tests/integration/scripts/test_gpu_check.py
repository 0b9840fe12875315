"""benchmarks/gpu_check.py: its code paths on CPU at tiny sizes (`--cpu-smoke`), and its refusal without a GPU.
The GPU sizes themselves have not been run (no GPU here). No timing is asserted."""

import os
import subprocess
import sys

import pytest
import torch

from ...paths import REPO

SCRIPT = os.path.join(REPO, "benchmarks", "gpu_check.py")


def _run(*args, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(REPO, "src"), env.get("PYTHONPATH")) if p)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env, timeout=400)


def test_cpu_smoke_runs_every_row():
    pytest.importorskip("deepspeed")
    done = _run("--cpu-smoke")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("check ")))
    rows = {line.split()[0]: line for line in lines[start + 1 :] if line.strip()}
    expected = ["gae", "update", "logprob-chunked", "logprob-full", "logprob-chunked-bwd", "logprob-full-bwd"]
    long = ["long-padded", "long-budget", "long-packed-sdpa", "long-packed-flex"]
    tail = ["windows", "zero3-1proc", "fsdp2-1proc", "rollout", "fp32-head", "server"]
    assert list(rows) == expected + long + tail
    assert not any("FAILED" in row for row in rows.values())
    # The rollout row needs vLLM: here it says why it did not run (tests/integration/test_vllm.py runs it where vLLM
    # is installed).
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        assert "not run: vLLM is not installed" in rows["rollout"]
        assert "not run: vLLM is not installed" in rows["server"]
    # The fast GAE equals the per-token loop.
    diff = float(rows["gae"].split("max diff ")[1])
    assert diff < 1e-5
    assert "tok/s update" in rows["update"]
    # FSDP2 beside ZeRO-3, the toy worker through `accelerate launch`: ZeRO-3 with one process; FSDP2 with 2 CPU
    # processes (on a CPU one is refused), each holding a shard of the policy. The same report, no GPU memory on CPU.
    assert "toy, 1 process " in rows["zero3-1proc"] and "5 updates, policy moved; " in rows["zero3-1proc"]
    fsdp2 = rows["fsdp2-1proc"]
    assert "toy, 2 CPU processes " in fsdp2 and "3 updates, policy moved; sharded (" in fsdp2
    assert "s with launch" in fsdp2 and "peak" not in fsdp2 and "peak" not in rows["zero3-1proc"]
    # Long responses: the trainer's parts padded, with a budget and packed; flex attention is a GPU row.
    assert "real tok/s" in rows["long-padded"] and "1.00 real" in rows["long-packed-sdpa"]
    assert "not run: torch's flex attention has no CPU backward" in rows["long-packed-flex"]
    # Generation windows through the trainer: whole responses, then windows of T/2, T/4 and T/4 with a larger pool as
    # ratios to them (no GPU memory on CPU).
    windows = rows["windows"]
    assert "whole " in windows and "done/s" in windows and "peak" not in windows
    assert "; T/2 " in windows and "; T/4 " in windows and "; T/4 pool " in windows
    assert windows.count("done/upd") == 3
    # The sampler/trainer log-prob gap with a bf16 and an fp32 head (benchmarks/fp32_head.py's measurement).
    assert "3 seeds" in rows["fp32-head"] and "bf16 head mean " in rows["fp32-head"]
    assert "fp32 head mean " in rows["fp32-head"]


def test_without_a_gpu_it_says_so_and_fails():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    done = _run()
    assert done.returncode == 2
    assert "no CUDA device" in done.stdout

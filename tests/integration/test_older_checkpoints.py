"""Checkpoints written by older code resume with the current code onto the older code's own uninterrupted run: the
trainer in one file (before `trainer.py` became `ppo_trainer.py`), and the trainer of mixins (before the rollout maker,
the learner and the value-pretraining phase became objects)."""

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest
import torch
from safetensors.torch import load_file

from vcppo_trl import VCPPOConfig
from vcppo_trl.learner import ppo_learner
from vcppo_trl.trainer import grpo_metrics

from ..builders import step_logs
from ..paths import REPO

GRPO_ROLLOUT_KEYS = {"reward", "reward_std", "frac_reward_zero_std", "kl"}

# Commits of main (they stay reachable however a branch is merged): the whole trainer still in
# src/vcppo_trl/trainer.py, and the trainer made of mixins sharing one `self`.
OLDER_CODE = {
    "one-file trainer": "d7f8841dcf85fcdb92e967c0517eadc4505cd01f",
    "mixin trainer": "07d77ef98850a89c121da07cd7490324829f4307",
}
# 1 value-pretraining update and 2 PPO updates on the toy task, a checkpoint after each (the settings of
# tests/builders.py's `tiny_config`, spelled out: the older code must accept each of them).
SETTINGS = dict(
    per_device_train_batch_size=4,
    gradient_accumulation_steps=2,
    num_mini_batches=2,
    num_ppo_epochs=1,
    total_episodes=32,
    response_length=16,
    bf16=False,
    activation_checkpointing=False,
    logging_steps=1,
    report_to="none",
    use_cpu=True,
    learning_rate=1e-3,
    num_sample_generations=0,
    local_rollout_forward_batch_size=16,
    disable_tqdm=True,
    seed=0,
    value_pretrain_steps=1,
    save_strategy="steps",
    save_steps=1,
)
# Run by the older source: trains uninterrupted and writes its per-update logs.
OLD_RUN = """
import json, math, os, pickle, sys

import torch

torch.set_num_threads(1)
source, out_dir, settings = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
import vcppo_trl
from vcppo_trl import VCPPOConfig, VCPPOTrainer
from vcppo_trl.toy.model import build_tiny_model
from vcppo_trl.toy.task import make_splits
from vcppo_trl.toy.tokenizer import build_tokenizer

assert vcppo_trl.__file__.startswith(source), vcppo_trl.__file__


def length_reward(completions, **kwargs):
    return [1.0 if len(c) < 10 else -1.0 for c in completions]


tokenizer = build_tokenizer()
trainer = VCPPOTrainer(
    model=build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0),
    reward_funcs=length_reward,
    args=VCPPOConfig(output_dir=os.path.join(out_dir, "run"), **settings),
    train_dataset=make_splits(64, 16, seed=0, min_digits=1, max_digits=3)["train"],
    processing_class=tokenizer,
)
trainer.train()
logs = {
    e["step"]: {
        k: "nan" if isinstance(v, float) and math.isnan(v) else v
        for k, v in e.items()
        if k != "train_runtime" and not k.startswith("time/")
    }
    for e in trainer.state.log_history
    if "episode" in e
}
json.dump(logs, open(os.path.join(out_dir, "logs.json"), "w"))
"""


def _older_source(commit: str, dest) -> str:
    """`src/` as it was at `commit`, exported from git into `dest`."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: older source cannot be exported")
    known = subprocess.run(["git", "-C", REPO, "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    if known.returncode:
        pytest.skip(
            f"commit {commit[:7]} is not in this checkout: a shallow clone, or no git repository; fetch the full "
            "history to run this test"
        )
    archive = subprocess.run(["git", "-C", REPO, "archive", commit, "src"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return os.path.join(dest, "src")


@pytest.mark.parametrize("code", sorted(OLDER_CODE))
def test_resume_from_a_checkpoint_written_by_older_code(tmp_path, make_trainer, code, monkeypatch):
    source = _older_source(OLDER_CODE[code], tmp_path / "before")
    old = tmp_path / "old"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1", PYTHONPATH=source)
    proc = subprocess.run(
        [sys.executable, "-c", OLD_RUN, source, str(old), json.dumps(SETTINGS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    old_logs = {int(step): entry for step, entry in json.load(open(old / "logs.json")).items()}
    assert sorted(old_logs) == [1, 2, 3]

    # The older code drew the PPO epochs' mini-batch order from torch's global generator; the current code draws it
    # from a generator of its own (44a92ca), which changes the order by design. The older shuffle is patched back in
    # so the resumed update can be compared with the older code's own run bit for bit.
    monkeypatch.setattr(ppo_learner, "mini_batch_order", lambda size, **seeds: torch.randperm(size))
    resumed = make_trainer(args=VCPPOConfig(output_dir=str(tmp_path / "resumed"), **SETTINGS))
    resumed.train(resume_from_checkpoint=str(old / "run" / "checkpoint-2"))  # after pretraining, 1 PPO update left
    assert resumed.state.global_step == 3
    logs = step_logs(resumed)
    assert sorted(logs) == [1, 2, 3]  # the history before the stop is kept
    # Every metric the old code logged is unchanged; metrics added since are only the forwards' work (`perf/`) and
    # the split of the policy's clip fraction into its low and high sides.
    assert "loss/policy_avg" in logs[3] and {k: v for k, v in logs[3].items() if k in old_logs[3]} == old_logs[3]
    added = set(logs[3]) - set(old_logs[3]) - {"policy/clipfrac_low_avg", "policy/clipfrac_high_avg"}
    # ... and the advantage's mean over finished responses and the outcomes per optimizer step (issue 49)
    added -= {"diagnostics/advantage_finished_mean", "rollout/outcomes_per_step"}
    # ... and TRL GRPO's names beside ours, with the per-response clip extremes they read (issue 59)
    added -= set(grpo_metrics.LEARNER_ALIASES) | {"policy/clipfrac_low_min_avg", "policy/clipfrac_high_max_avg"}
    added -= {k for k in added if k in GRPO_ROLLOUT_KEYS or k.startswith("completions/")}
    assert all(key.startswith("perf/") for key in added)
    # The last update lands on the uninterrupted run's weights, bit for bit (CPU).
    policy, critic = resumed.unwrapped_policy_and_critic()
    final = old / "run" / "checkpoint-3"
    for model, saved in (
        (policy, load_file(final / "model.safetensors")),
        (critic, load_file(final / "value_model" / "model.safetensors")),
    ):
        state = model.state_dict()
        assert saved and saved.keys() <= state.keys()
        for name, tensor in saved.items():
            assert torch.equal(state[name], tensor), name

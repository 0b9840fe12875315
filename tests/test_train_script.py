"""train.py from the command line, the recipes, and the script's dataset preparation."""

import glob
import os
import subprocess
import sys

import pytest
from datasets import Dataset
from trl import ModelConfig, TrlParser

from vcppo_trl import VCPPOConfig
from vcppo_trl.cli import VCPPOScriptArguments, prepare_dataset

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def tiny_run_command(out, *extra):
    return [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        "--config",
        os.path.join(ROOT, "configs", "recipes", "tiny_cpu.yaml"),
        "--output_dir",
        str(out),
        "--toy_num_train",
        "256",
        "--toy_num_eval",
        "8",
        "--toy_max_digits",
        "2",
        "--toy_cold_start_steps",
        "2",
        "--total_episodes",
        "32",
        "--value_pretrain_steps",
        "1",
        "--response_length",
        "24",
        "--num_ppo_epochs",
        "1",
        *extra,
    ]


def run(cmd, cwd):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=cwd)


def test_train_py_runs_tiny_recipe(tmp_path):
    out = tmp_path / "run"
    result = run(tiny_run_command(out), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "after cold start" in result.stdout and "after VC-PPO" in result.stdout
    assert os.path.isfile(out / "value_pretrained" / "model.safetensors")
    assert os.path.isfile(out / "model.safetensors")
    assert os.path.isfile(out / "value_model" / "model.safetensors")


def test_train_py_resumes_latest_checkpoint(tmp_path):
    out = tmp_path / "run"
    first = run(tiny_run_command(out, "--save_strategy", "steps", "--save_steps", "1"), tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert os.path.isdir(out / "checkpoint-2")  # 1 pretraining + 1 PPO update
    resumed = run(
        tiny_run_command(out, "--resume_from_checkpoint", "true", "--total_episodes", "64", "--save_strategy", "no"),
        tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resumed from" in resumed.stderr and "checkpoint-2 at update 2 of 3" in resumed.stderr
    assert "after VC-PPO" in resumed.stdout


@pytest.mark.parametrize("recipe", sorted(glob.glob(os.path.join(ROOT, "configs", "recipes", "*.yaml"))))
def test_recipes_parse(recipe, tmp_path):
    parser = TrlParser((VCPPOScriptArguments, VCPPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config(
        # GPU recipes ask for bf16, which this CPU-only check cannot construct: the point is that every key is valid.
        ["--config", recipe, "--output_dir", str(tmp_path), "--bf16", "false", "--use_cpu", "true"]
    )
    assert training_args.lam_critic == 1.0
    assert script_args.reward_funcs == ["math_verify"]


def test_prepare_dataset_renames_and_wraps():
    data = Dataset.from_dict({"problem": ["1+1?"], "answer": ["2"]})
    args = VCPPOScriptArguments(
        prompt_column="problem", solution_column="answer", conversational=True, system_prompt="S"
    )
    out = prepare_dataset(data, args, limit=None)
    assert out[0]["prompt"] == [{"role": "system", "content": "S"}, {"role": "user", "content": "1+1?"}]
    assert out[0]["solution"] == "2"


def test_prepare_dataset_missing_column_message():
    data = Dataset.from_dict({"question": ["1+1?"], "solution": ["2"]})
    with pytest.raises(ValueError, match="--prompt_column"):
        prepare_dataset(data, VCPPOScriptArguments(), limit=None)

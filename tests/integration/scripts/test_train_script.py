"""train.py from the command line, the recipes, and the script's dataset preparation."""

import glob
import os
import subprocess
import sys

import pytest
from datasets import Dataset
from trl import ModelConfig, TrlParser

from vcppo_trl import VAPOConfig
from vcppo_trl.cli import TRAINERS, VCPPOScriptArguments, chosen_trainer
from vcppo_trl.cli.datasets import prepare_dataset

from ...paths import REPO as ROOT


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


def test_train_py_stores_rollouts_instead_of_training(tmp_path):
    out, stored = tmp_path / "run", tmp_path / "rollouts"
    command = tiny_run_command(out, "--store_rollouts", str(stored), "--store_rollouts_batches", "2")
    result = run(command, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 complete batches (2 written now, 0 found written)" in result.stdout
    assert "after VC-PPO" not in result.stdout and not os.path.exists(out / "model.safetensors")  # nothing trained
    from vcppo_trl.rollout import load_stored_rollouts

    info, rows = load_stored_rollouts(str(stored))
    assert sorted(set(rows["batch"])) == [0, 1] and info.rewards["functions"] == ["math_verify_reward"]
    again = run(command, tmp_path)  # a rerun finds every shard written
    assert again.returncode == 0, again.stderr[-3000:]
    assert "(0 written now, 2 found written)" in again.stdout
    critic_job = tiny_run_command(
        tmp_path / "critic", "--value_pretrain_dataset", str(stored), "--value_pretrain_only", "true"
    )
    critic_job += ["--value_pretrain_steps", "4", "--value_pretrain_min_steps", "4"]  # two epochs over two batches
    done = run(critic_job, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Pretrained critic: {tmp_path / 'critic' / 'value_pretrained'}" in done.stdout
    assert "after VC-PPO" not in done.stdout and not os.path.exists(tmp_path / "critic" / "model.safetensors")


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
    # GPU recipes ask for bf16, which this CPU-only check cannot construct: the point is that every key is valid.
    argv = ["--config", recipe, "--output_dir", str(tmp_path), "--bf16", "false", "--use_cpu", "true"]
    trainer_class, config_class = TRAINERS[chosen_trainer(argv)]
    parser = TrlParser((VCPPOScriptArguments, config_class, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config(argv)
    assert training_args.lam_critic == 1.0
    assert script_args.reward_funcs == ["math_verify"]
    assert (config_class is VAPOConfig) == ("vapo" in os.path.basename(recipe))
    # Every process's share of an update holds whole groups of num_generations samples.
    local = (
        training_args.per_device_train_batch_size
        * training_args.gradient_accumulation_steps
        * training_args.num_mini_batches
    )
    assert local % training_args.num_generations == 0


def test_vapo_recipe_keeps_the_papers_settings(tmp_path):
    recipe = os.path.join(ROOT, "configs", "recipes", "vapo_qwen2.5_32b.yaml")
    argv = ["--config", recipe, "--output_dir", str(tmp_path), "--bf16", "false", "--use_cpu", "true"]
    _, args, _ = TrlParser((VCPPOScriptArguments, VAPOConfig, ModelConfig)).parse_args_and_config(argv)
    assert (args.learning_rate, args.value_learning_rate) == (1e-6, 2e-6)
    assert (args.cliprange, args.cliprange_high, args.positive_example_lm_coef) == (0.2, 0.28, 0.1)
    assert (args.lam_actor_length_alpha, args.value_pretrain_steps, args.num_generations) == (0.05, 50, 16)
    # 512 prompts × 16 samples per update and mini-batches of 512 responses on 64 processes.
    local = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.num_mini_batches
    assert local * 64 == 512 * 16 and local * 64 // args.num_mini_batches == 512


def test_train_py_runs_vapo(tmp_path):
    out = tmp_path / "run"
    result = run(tiny_run_command(out, "--trainer", "vapo", "--num_generations", "4"), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "after cold start" in result.stdout and "after VAPO" in result.stdout
    assert os.path.isfile(out / "value_pretrained" / "model.safetensors")
    assert os.path.isfile(out / "model.safetensors")
    bad = run(tiny_run_command(out, "--trainer", "grpo"), tmp_path)
    assert bad.returncode != 0 and "--trainer must be one of vcppo, vapo" in bad.stderr
    # A bad value stops before any model is built, naming the field and the fix.
    bad = run(tiny_run_command(out, "--trainer", "vapo", "--cliprange_high", "0.1"), tmp_path)
    assert bad.returncode != 0 and "`cliprange_high` (0.1) must be >= `cliprange` (0.2)" in bad.stderr
    assert "cold-start SFT" not in bad.stderr


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


def _option_help(text: str, option: str) -> str:
    """The help entry of one option, whitespace-normalised (argparse wraps lines)."""
    start = text.index(f"\n  {option} ")
    end = text.find("\n  --", start + 1)
    return " ".join(text[start:end].split())


def test_help_shows_real_defaults_with_vcppo_options_first(tmp_path):
    result = run([sys.executable, os.path.join(ROOT, "train.py"), "--help"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout
    assert "running the embedded default" not in text  # --help does not load the toy recipe's values
    # VCPPOConfig's own defaults, not tiny_cpu.yaml's (10 pretraining updates, 2 epochs).
    assert "(default: 100)" in _option_help(text, "--value_pretrain_steps")
    assert "(default: 4)" in _option_help(text, "--num_ppo_epochs")
    assert "(default: 0.0)" in _option_help(text, "--kl_coef")
    assert "(default: 0.95)" in _option_help(text, "--lam_actor")
    assert "TRL GRPOConfig's name: --max_completion_length" in _option_help(text, "--response_length")
    assert "TRL GRPOConfig's name: --beta" in _option_help(text, "--kl_coef")
    # VC-PPO first, then PPO, then the script's, the model's and transformers' arguments.
    options = text[text.index("\noptions:") :]
    positions = [
        options.index(s)
        for s in (
            "VC-PPO (VCPPOConfig)",
            "  --lam_actor",
            "PPO (PPOConfig): Models",
            "PPO (PPOConfig): Rollouts",
            "PPO (PPOConfig): Training",
            "  --kl_coef",
            "PPO (PPOConfig): Critic",
            "  --value_learning_rate",
            "  --dataset_name",
            "  --model_name_or_path",
            "Training (transformers",
            "  --per_device_train_batch_size",
        )
    ]
    assert positions == sorted(positions)
    assert text.index("--value_pretrain_steps") < 2000  # within the first screen, not at line ~866
    assert len(text.splitlines()[0]) < 120  # a short usage line, not 150 lines listing every option


def test_default_run_output_is_clean(tmp_path):
    """What a person reads: bars, one compact line per logged update, sample tables, the final table; no noise."""
    out = tmp_path / "run"
    result = run(tiny_run_command(out, "--logging_steps", "1", "--toy_cold_start_steps", "5"), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    stdout, stderr = result.stdout, result.stderr
    lines = stdout.splitlines()
    assert not [line for line in lines if line.lstrip().startswith("{")], "raw metric dicts on stdout"
    for stream in (stdout, stderr):
        assert "\x1b[" not in stream, "terminal escape codes left in the output"
        assert "Setting accelerator to CPU" not in stream  # DeepSpeed's notice, on a run without DeepSpeed
        assert "FutureWarning" not in stream and "gradient_checkpointing" not in stream
        assert "Writing model shards" not in stream
    # The cold start: a progress bar (stderr) and one summary line, not ~70 loss dicts.
    assert "cold-start SFT:" in stderr and "%|" in stderr
    assert any(line.startswith("cold-start SFT: 5 steps") for line in lines)
    # One compact line per logged update (1 pretraining + 1 PPO update), the samples table, the final table.
    updates = [line for line in lines if line.startswith("update ")]
    assert [u.split(":")[0] for u in updates] == ["update 1/2 value-pretrain", "update 2/2"]
    assert all("reward " in u and "len " in u for u in updates)
    assert "Completion" in stdout and "Advantage" in stdout  # rich's samples table
    assert "after cold start" in stdout and "after VC-PPO" in stdout


def test_ddp_run_warns_once_per_job(tmp_path):
    """Two DDP ranks (gloo on CPU): a data warning is printed once, by the first rank, not once per rank."""
    out = tmp_path / "run"
    cmd = tiny_run_command(out, "--max_prompt_length", "5", "--total_episodes", "64")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *cmd[1:]]
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1")
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    both = result.stdout + result.stderr
    assert both.count("train_dataset: ") == 1, both[-3000:]
    assert both.count("Value pretraining: training the critic alone") == 1


@pytest.mark.parametrize("recipe", sorted(glob.glob(os.path.join(ROOT, "configs", "recipes", "*.yaml"))))
def test_recipe_comments_name_files_that_exist(recipe):
    """Every repository file a recipe's comments name (launch configs, recipes, docs) exists."""
    import re

    comments = "\n".join(line for line in open(recipe) if line.lstrip().startswith("#"))
    named = set(re.findall(r"((?:configs|docs|scripts)/[\w./-]+\.(?:yaml|md|sh|json))", comments))
    missing = [path for path in sorted(named) if not os.path.isfile(os.path.join(ROOT, path))]
    assert not missing, f"{os.path.basename(recipe)} names missing files: {missing}"
    assert "not in this version" not in comments


def test_accelerate_use_cpu_under_a_deepspeed_config_is_refused_before_the_cold_start(monkeypatch, tmp_path):
    """`ACCELERATE_USE_CPU=1 accelerate launch --config_file zero3_cpu.yaml ...` crashed in the first forward: accelerate
    ran CPU DDP while transformers applied ZeRO-3. It now stops before any model is built, saying what to change."""
    from vcppo_trl.cli import main

    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ValueError, match="unset ACCELERATE_USE_CPU and pass --ddp_backend gloo"):
        main(["--output_dir", str(tmp_path / "run"), "--toy_cold_start_steps", "2"])
    assert not os.path.exists(tmp_path / "run" / "cold_start")


def test_accelerate_use_cpu_under_a_deepspeed_config_is_refused_by_the_trainer(monkeypatch, make_trainer):
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ValueError, match="ACCELERATE_USE_CPU=1 is set under a DeepSpeed launch config"):
        make_trainer()

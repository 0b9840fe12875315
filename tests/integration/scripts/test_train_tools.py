"""train.py with tools: `--tools` import paths, `--python_tool`, the embedded toy with a tool (`--toy_task tool_use`),
the checks that stop a run before any model is built, `--help`'s tools group, and the two tool recipes."""

import json
import os
import subprocess
import sys

import pytest

from vcppo_trl.cli import build_parser, main, resolve_tools

from ...paths import REPO as ROOT

TOOLS_RECIPE = os.path.join(ROOT, "configs", "recipes", "tools_tiny_cpu.yaml")
GPU_RECIPE = os.path.join(ROOT, "configs", "recipes", "qwen2.5_1.5b_tools_1gpu.yaml")
# The tool toy at a tiny budget: 3 cold-start steps, 1 value-pretraining and 1 PPO update of 32 episodes.
TINY = [
    "--toy_num_train", "64", "--toy_num_eval", "8", "--toy_max_digits", "2", "--toy_cold_start_steps", "3",
    "--total_episodes", "32", "--value_pretrain_steps", "1", "--response_length", "48", "--num_ppo_epochs", "1",
]  # fmt: skip


def test_train_py_runs_the_tool_toy_with_tools(tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, os.path.join(ROOT, "train.py"), "--config", TOOLS_RECIPE, "--output_dir", str(out)]
    command += [*TINY, "--tools", "vcppo_trl.toy.tool_use:add", "--save_strategy", "steps", "--save_steps", "1"]
    command += ["--logging_steps", "1"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Embedded tool toy run: cold-start SFT for 3 steps on 64 examples" in result.stderr
    assert "after cold start" in result.stdout and "after VC-PPO" in result.stdout
    with open(out / "checkpoint-2" / "trainer_state.json") as f:
        history = json.load(f)["log_history"]
    updates = [logs for logs in history if "tools/call_frequency" in logs]
    assert len(updates) == 2, history  # the value-pretraining update and the PPO update
    assert all(0 <= logs["tools/call_frequency"] <= 2 for logs in updates)  # at most 2 tool rounds per episode
    assert os.path.isfile(out / "model.safetensors")


def test_a_bad_tools_path_stops_before_any_model_is_built(tmp_path):
    run = tmp_path / "run"
    base = ["--config", TOOLS_RECIPE, "--output_dir", str(run), *TINY]
    with pytest.raises(ValueError, match=r"--tools 'vcppo_trl\.toy\.tool_use:subtract' does not import .*module:name"):
        main([*base, "--tools", "vcppo_trl.toy.tool_use:subtract"])
    with pytest.raises(ValueError, match=r"--tools 'no_such_package\.tools:add' does not import"):
        main([*base, "--tools", "no_such_package.tools:add"])
    with pytest.raises(
        ValueError, match=r"--tools 'vcppo_trl\.toy\.defaults:TOY_NUM_TRAIN' is an object of type int, not a function"
    ):
        main([*base, "--tools", "vcppo_trl.toy.defaults:TOY_NUM_TRAIN"])
    with pytest.raises(ValueError, match=r"--tools 'vcppo_trl\.episodes:ToolLoop' is a class, not a function"):
        main([*base, "--tools", "vcppo_trl.episodes:ToolLoop"])
    # The arithmetic toy's prompts are text; the tool toy's policy learned `add` alone.
    with pytest.raises(ValueError, match="Tools need chat prompts.*--toy_task tool_use"):
        main([*base, "--toy_task", "arithmetic", "--tools", "vcppo_trl.toy.tool_use:add"])
    with pytest.raises(ValueError, match="Leave --tools and --python_tool unset"):
        main([*base, "--python_tool", "true"])
    assert not os.path.exists(run / "cold_start")


def test_text_prompts_with_tools_need_the_chat_conversion(tmp_path, monkeypatch):
    """A dataset of text prompts: `--conversational true` wraps them as user messages; without it the run stops, saying
    what to set, before the model loads."""
    import vcppo_trl.cli as cli

    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text(json.dumps({"problem": "What is 2 + 3?", "answer": "5"}) + "\n")
    argv = ["--output_dir", str(tmp_path / "run"), "--model_name_or_path", "not/loaded", "--dataset_name", str(data)]
    argv += ["--prompt_column", "problem", "--solution_column", "answer", "--tools", "vcppo_trl.toy.tool_use:add"]

    class ModelLoaded(Exception):
        pass

    def load_model(model_args, trust_remote_code=False):
        raise ModelLoaded

    monkeypatch.setattr(cli, "load_model_and_tokenizer", load_model)
    with pytest.raises(
        ValueError, match="Tools need chat prompts and the dataset's are text: set --conversational true"
    ):
        main(argv)
    from vcppo_trl.cli import datasets as cli_datasets

    prepared, prepare = [], cli_datasets.prepare_dataset

    def record(*args, **kwargs):
        prepared.append(prepare(*args, **kwargs))
        return prepared[-1]

    monkeypatch.setattr(cli_datasets, "prepare_dataset", record)
    with pytest.raises(ModelLoaded):  # past the check: the prompts are chat messages
        main([*argv, "--conversational", "true", "--system_prompt", "Use the tool."])
    assert prepared[0][0]["prompt"] == [
        {"role": "system", "content": "Use the tool."},
        {"role": "user", "content": "What is 2 + 3?"},
    ]


def test_help_groups_the_tool_options():
    text = build_parser().format_help()
    group = text[text.index("\nTools (") : text.index("\nModel (")]
    for option in ("--tools", "--python_tool", "--python_tool_timeout", "--python_tool_memory_mb"):
        assert f"\n  {option} " in group, option
    for option in ("--max_tool_calling_iterations", "--tool_timeout", "--action_mask_mode"):
        assert f"\n  {option} " in group and text.count(f"\n  {option} ") == 1, option
    data = text[text.index("\nData, reward functions") : text.index("\nTools (")]
    assert "\n  --toy_task " in data and "\n  --tools " not in data


def test_the_tool_recipes_parse(tmp_path):
    """Both recipes load with the command line's parser (nothing runs: the GPU one needs a GPU and a download)."""
    toy_args, toy_config, toy_model = build_parser().parse_args_and_config(
        ["--config", TOOLS_RECIPE, "--output_dir", str(tmp_path)]
    )
    assert toy_model.model_name_or_path is None and toy_args.toy_task == "tool_use"
    assert (toy_config.max_tool_calling_iterations, toy_config.response_length) == (2, 256)
    assert toy_config.value_pretrain_steps == 10 and toy_config.use_cpu
    assert [tool.__name__ for tool in resolve_tools(toy_args, toy=True)] == ["add"]
    # GPU recipes ask for bf16, which this CPU-only check cannot construct.
    argv = ["--config", GPU_RECIPE, "--output_dir", str(tmp_path), "--bf16", "false", "--use_cpu", "true"]
    gpu_args, gpu_config, gpu_model = build_parser().parse_args_and_config(argv)
    assert gpu_model.model_name_or_path == "Qwen/Qwen2.5-1.5B-Instruct" and gpu_args.conversational
    assert gpu_args.python_tool and gpu_config.max_tool_calling_iterations == 4
    assert gpu_args.python_tool_timeout < gpu_config.tool_timeout
    (tool,) = resolve_tools(gpu_args, toy=False)
    assert tool.__name__ == "python" and "2048 MB of memory" in tool.__doc__

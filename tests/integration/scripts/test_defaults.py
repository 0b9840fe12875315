"""Defaults a new user meets: precision that follows the hardware, and the README quickstart as written."""

import os
import re
import subprocess
import sys

import pytest

from vcppo_trl import PPOConfig, VCPPOConfig
from vcppo_trl.config import precision

from ...paths import REPO as ROOT


@pytest.mark.parametrize("cls", [PPOConfig, VCPPOConfig])
def test_precision_follows_the_hardware_on_cpu(cls, tmp_path):
    """No GPU here: the bare config builds (TRL's would fail with "Your setup doesn't support bf16/gpu") in fp32."""
    assert not precision.hardware_supports_bf16(False)
    config = cls(output_dir=str(tmp_path), report_to="none")
    assert config.bf16 is False and config.fp16 is False
    assert str(config.device) == "cpu"


def test_precision_follows_the_hardware_with_bf16(monkeypatch, tmp_path):
    """Where the hardware has bf16, an unset bf16 turns it on; an explicit choice is kept."""
    monkeypatch.setattr(precision, "hardware_supports_bf16", lambda use_cpu: True)
    # use_cpu so that transformers' own check lets bf16 through on this CPU-only machine.
    assert VCPPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True).bf16 is True
    assert VCPPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False).bf16 is False


def test_explicit_bf16_without_bf16_device_errors_clearly(tmp_path):
    with pytest.raises(ValueError, match="bf16=True was set, but no device with bf16 support was found.*use_cpu=True"):
        VCPPOConfig(output_dir=str(tmp_path), report_to="none", bf16=True)
    # bf16 on the CPU, asked for explicitly, stays possible.
    assert VCPPOConfig(output_dir=str(tmp_path), report_to="none", bf16=True, use_cpu=True).bf16 is True


QUICKSTART_MODEL = '"HuggingFaceTB/SmolLM2-135M-Instruct"'
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def readme_quickstart() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    section = readme[readme.index("## Quickstart") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_quickstart_runs_as_written(tmp_path):
    """The README's quickstart block, unchanged except for the model id (a tiny local Llama: no network here)."""
    from ...builders import tiny_policy, tiny_tokenizer

    code = readme_quickstart()
    assert code.count(QUICKSTART_MODEL) == 1
    model_dir = tmp_path / "tiny-instruct"
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    tiny_policy(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    code = code.replace(QUICKSTART_MODEL, repr(str(model_dir)))
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TRL_EXPERIMENTAL_SILENCE="1")
    env.pop("ACCELERATE_USE_CPU", None)  # as on a laptop: nothing says "CPU"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = tmp_path / "vcppo-out"
    assert (out / "value_pretrained" / "model.safetensors").is_file()
    assert (out / "model.safetensors").is_file() and (out / "value_model" / "model.safetensors").is_file()

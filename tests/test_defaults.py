"""Defaults a new user meets: precision that follows the hardware, and the README quickstart as written."""

import os

import pytest

from vcppo_trl import PPOConfig, VCPPOConfig
from vcppo_trl import config as config_module

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


@pytest.mark.parametrize("cls", [PPOConfig, VCPPOConfig])
def test_precision_follows_the_hardware_on_cpu(cls, tmp_path):
    """No GPU here: the bare config builds (TRL's would fail with "Your setup doesn't support bf16/gpu") in fp32."""
    assert not config_module.hardware_supports_bf16(False)
    config = cls(output_dir=str(tmp_path), report_to="none")
    assert config.bf16 is False and config.fp16 is False
    assert str(config.device) == "cpu"


def test_precision_follows_the_hardware_with_bf16(monkeypatch, tmp_path):
    """Where the hardware has bf16, an unset bf16 turns it on; an explicit choice is kept."""
    monkeypatch.setattr(config_module, "hardware_supports_bf16", lambda use_cpu: True)
    # use_cpu so that transformers' own check lets bf16 through on this CPU-only machine.
    assert VCPPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True).bf16 is True
    assert VCPPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False).bf16 is False


def test_explicit_bf16_without_bf16_device_errors_clearly(tmp_path):
    with pytest.raises(ValueError, match="bf16=True was set, but no device with bf16 support was found.*use_cpu=True"):
        VCPPOConfig(output_dir=str(tmp_path), report_to="none", bf16=True)
    # bf16 on the CPU, asked for explicitly, stays possible.
    assert VCPPOConfig(output_dir=str(tmp_path), report_to="none", bf16=True, use_cpu=True).bf16 is True

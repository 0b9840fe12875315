"""FSDP2 settings of the launch that would be ignored or doubled are refused (`parallel.fsdp.check_fsdp2_options`)."""

from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import FullyShardedDataParallelPlugin

from vcppo_trl.parallel.fsdp import FSDPError, check_fsdp2_options


def launch(device: str = "cpu", **plugin):
    fsdp = FullyShardedDataParallelPlugin(fsdp_version=2, **plugin)
    return SimpleNamespace(state=SimpleNamespace(fsdp_plugin=fsdp), device=torch.device(device))


def test_cpu_offload_on_a_cpu_launch_is_refused():
    with pytest.raises(FSDPError, match="fsdp_offload_params: false"):
        check_fsdp2_options(launch(cpu_offload=True), SimpleNamespace(activation_checkpointing=False))
    check_fsdp2_options(launch(cpu_offload=False), SimpleNamespace(activation_checkpointing=False))


def test_two_activation_checkpointings_are_refused_and_either_alone_runs():
    with pytest.raises(FSDPError, match="--activation_checkpointing false"):
        check_fsdp2_options(launch(activation_checkpointing=True), SimpleNamespace(activation_checkpointing=True))
    check_fsdp2_options(launch(activation_checkpointing=True), SimpleNamespace(activation_checkpointing=False))
    check_fsdp2_options(launch(activation_checkpointing=False), SimpleNamespace(activation_checkpointing=True))

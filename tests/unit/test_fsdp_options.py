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
        check_fsdp2_options(launch(cpu_offload=True), activation_checkpointing=False)
    check_fsdp2_options(launch(cpu_offload=False), activation_checkpointing=False)


def test_two_activation_checkpointings_are_refused_and_either_alone_runs():
    with pytest.raises(FSDPError, match="--activation_checkpointing false"):
        check_fsdp2_options(launch(activation_checkpointing=True), activation_checkpointing=True)
    check_fsdp2_options(launch(activation_checkpointing=True), activation_checkpointing=False)
    check_fsdp2_options(launch(activation_checkpointing=False), activation_checkpointing=True)


def test_a_cpu_launch_gets_the_runs_mixed_precision_as_accelerate_sets_it():
    """accelerate sets its own plugin's policy from the run's mixed precision; the plugin read from a CPU launch's
    environment gets the same (without it a bf16 run computed in float32 without a word)."""
    from vcppo_trl.parallel.fsdp import fsdp2_plugin

    def cpu_launch(mixed_precision):
        return SimpleNamespace(state=SimpleNamespace(fsdp_plugin=None), mixed_precision=mixed_precision)

    policy = fsdp2_plugin(cpu_launch("bf16")).mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.bfloat16)
    assert fsdp2_plugin(cpu_launch("no")).mixed_precision_policy is None

"""The line that names the backend a run trains on (`parallel.checks.describe_backend`)."""

from types import SimpleNamespace

import torch

from vcppo_trl.parallel.checks import describe_backend


def accelerator(processes: int, stage: int | None = None):
    plugin = None if stage is None else SimpleNamespace(deepspeed_config={"zero_optimization": {"stage": stage}})
    return SimpleNamespace(
        num_processes=processes, device=torch.device("cpu"), state=SimpleNamespace(deepspeed_plugin=plugin)
    )


def test_the_backend_is_named_with_processes_device_and_sequence_groups():
    args = SimpleNamespace(sequence_parallel_size=1)
    assert describe_backend(accelerator(1), args, is_deepspeed=False, fsdp2=False) == "1 process (cpu), one process"
    assert describe_backend(accelerator(2), args, is_deepspeed=False, fsdp2=False) == "2 processes (cpu), DDP"
    assert describe_backend(accelerator(2, 3), args, is_deepspeed=True, fsdp2=False).endswith("DeepSpeed ZeRO-3")
    assert describe_backend(accelerator(8), args, is_deepspeed=False, fsdp2=True) == "8 processes (cpu), FSDP2"
    split = describe_backend(accelerator(8), SimpleNamespace(sequence_parallel_size=4), is_deepspeed=False, fsdp2=True)
    assert split == "8 processes (cpu), FSDP2, sequence parallelism in groups of 4 (Ulysses)"

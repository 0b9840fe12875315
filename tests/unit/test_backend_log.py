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
    def named(accelerator, is_deepspeed=False, fsdp2=False, sequence_parallel_size=1):
        return describe_backend(
            accelerator, is_deepspeed=is_deepspeed, fsdp2=fsdp2, sequence_parallel_size=sequence_parallel_size
        )

    assert named(accelerator(1)) == "1 process (cpu), one process"
    assert named(accelerator(2)) == "2 processes (cpu), DDP"
    assert named(accelerator(2, 3), is_deepspeed=True).endswith("DeepSpeed ZeRO-3")
    assert named(accelerator(8), fsdp2=True) == "8 processes (cpu), FSDP2"
    split = named(accelerator(8), fsdp2=True, sequence_parallel_size=4)
    assert split == "8 processes (cpu), FSDP2, sequence parallelism in groups of 4 (Ulysses)"

"""The precision a run trains in when the config leaves `bf16` unset: what the hardware supports natively.

TRL's configs default to bf16 and fail on a CPU unless `use_cpu=True`; this one follows the hardware instead, so the
same script runs on a laptop and on a GPU host without edits.
"""

from __future__ import annotations

import os


def hardware_supports_bf16(use_cpu: bool) -> bool:
    """
    Whether bf16 mixed precision is the natural choice here: an accelerator with native bf16 (NVIDIA Ampere or newer,
    Intel XPU, Ascend NPU, Gaudi, TPU) that the run will use. CPU runs (`use_cpu`, `ACCELERATE_USE_CPU=1`, or no
    accelerator at all) and Apple MPS (bf16 emulated on most chips) train in fp32.
    """
    import torch
    from transformers.utils import is_torch_bf16_gpu_available, is_torch_mps_available, is_torch_xla_available

    if use_cpu or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        return False
    if is_torch_mps_available() and not torch.cuda.is_available():
        return False
    return is_torch_bf16_gpu_available() or is_torch_xla_available()


def runs_on_an_accelerator(use_cpu: bool) -> bool:
    """Whether the run will train on an accelerator (CUDA, XPU, NPU, MPS, XLA), not on the CPU."""
    import torch
    from transformers.utils import (
        is_torch_mps_available,
        is_torch_npu_available,
        is_torch_xla_available,
        is_torch_xpu_available,
    )

    if use_cpu or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        return False
    return (
        torch.cuda.is_available()
        or is_torch_xpu_available()
        or is_torch_npu_available()
        or is_torch_mps_available()
        or is_torch_xla_available()
    )


def resolve_bf16(bf16: bool | None, fp16: bool, use_cpu: bool) -> bool:
    """`bf16=None` follows the hardware; an explicit `bf16=True` with no bf16 device is refused, with the fix."""
    if bf16 is None:
        return not fp16 and hardware_supports_bf16(use_cpu)
    if bf16 and not use_cpu and not hardware_supports_bf16(False):
        raise ValueError(
            "bf16=True was set, but no device with bf16 support was found (it needs e.g. an NVIDIA Ampere or newer "
            "GPU). Leave bf16 unset to follow the hardware (fp32 on this machine), set bf16=False, or add "
            "use_cpu=True to run bf16 on the CPU."
        )
    return bf16

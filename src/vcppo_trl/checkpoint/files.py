"""Checkpoint files: what a complete checkpoint holds, writing it atomically, and loading its weights back.

A checkpoint `checkpoint-<step>/` holds the policy (or its adapter) and tokenizer, the critic in `value_model/`,
`optimizer.pt`, `scheduler.pt`, `rng_state*.pth`, `trainer_state.json`, and `vcppo_state.json` (the update counter,
the data position, the value-pretraining phase, the count of non-finite steps). It is written under
`tmp-checkpoint-<step>/` and renamed once complete, so a directory named `checkpoint-<step>` is always whole: a full
disk or a kill mid-save leaves only a `tmp-` directory, which the next save removes.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import torch
from safetensors.torch import load_file

TRAINING_STATE_NAME = "vcppo_state.json"
VALUE_MODEL_DIRNAME = "value_model"  # the critic's directory inside a saved model or checkpoint
TEMP_PREFIX = "tmp-"
FORMAT_VERSION = 1
# Headroom over the estimated size before a save is attempted (tokenizer, configs, filesystem overhead).
FREE_SPACE_MARGIN = 1.1
FREE_SPACE_SLACK_BYTES = 64 * 2**20


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete or does not match this run."""


class InsufficientDiskSpaceError(OSError):
    """Not enough free disk space to write a checkpoint; nothing was written."""


def estimate_checkpoint_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
    """Upper estimate of a checkpoint's size: every parameter once, plus the optimizer's state tensors."""
    total = 0
    for p in model.parameters():
        total += getattr(p, "ds_numel", p.numel()) * p.element_size()
    if optimizer is not None:
        for state in optimizer.state.values():
            for value in state.values():
                if torch.is_tensor(value):
                    total += value.numel() * value.element_size()
    return int(total * FREE_SPACE_MARGIN) + FREE_SPACE_SLACK_BYTES


def check_free_space(directory: str, needed_bytes: int) -> None:
    """Raise [`InsufficientDiskSpaceError`] before writing anything when `directory` lacks `needed_bytes`."""
    os.makedirs(directory, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if free < needed_bytes:
        raise InsufficientDiskSpaceError(
            f"Not enough disk space to save a checkpoint in {directory}: about {needed_bytes / 2**30:.2f} GiB needed, "
            f"{free / 2**30:.2f} GiB free. Nothing was written; earlier checkpoints are intact. Free space, lower "
            "save_total_limit, or point output_dir at a larger disk, then resume."
        )


def remove_stale_temp_checkpoints(run_dir: str) -> None:
    """Delete `tmp-checkpoint-*` directories left by a save that was interrupted."""
    if not os.path.isdir(run_dir):
        return
    for name in os.listdir(run_dir):
        if name.startswith(TEMP_PREFIX + "checkpoint-"):
            shutil.rmtree(os.path.join(run_dir, name), ignore_errors=True)


def _fsync_tree(path: str) -> None:
    """Flush every file of a finished checkpoint to disk before it is renamed into place."""
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())


def publish(temp_dir: str, final_dir: str) -> None:
    """Make a fully written checkpoint visible under its final name (atomic on one filesystem)."""
    _fsync_tree(temp_dir)
    if os.path.exists(final_dir):  # e.g. the same step saved again after a resume
        shutil.rmtree(final_dir)
    os.replace(temp_dir, final_dir)


def write_training_state(directory: str, state: dict[str, Any]) -> None:
    with open(os.path.join(directory, TRAINING_STATE_NAME), "w") as f:
        json.dump({"format_version": FORMAT_VERSION, **state}, f, indent=2, sort_keys=True)


def read_training_state(checkpoint: str) -> dict[str, Any]:
    path = os.path.join(checkpoint, TRAINING_STATE_NAME)
    try:
        with open(path) as f:
            state = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"Cannot read {path} ({exc}): the checkpoint is incomplete or damaged.") from exc
    if state.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path} has format version {state.get('format_version')}, expected {FORMAT_VERSION}.")
    return state


def _weight_files(directory: str) -> list[str]:
    """Safetensors files of a `save_pretrained` directory (a single file, a sharded index, or a PEFT adapter)."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(directory, s) for s in shards]
    for name in ("model.safetensors", "adapter_model.safetensors"):
        if os.path.isfile(os.path.join(directory, name)):
            return [os.path.join(directory, name)]
    return []


def saved_world_size(checkpoint: str, state: dict[str, Any] | None = None) -> int:
    """
    Number of processes that wrote `checkpoint`: `num_processes` in its `vcppo_state.json` or, for checkpoints written
    before that field existed, the count of its per-process RNG files (`rng_state.pth` alone means one process).
    """
    if state is not None and "num_processes" in state:
        return int(state["num_processes"])
    ranks = [n for n in os.listdir(checkpoint) if n.startswith("rng_state_") and n.endswith(".pth")]
    return len(ranks) if ranks else 1


def missing_checkpoint_files(
    checkpoint: str,
    world_size: int,
    deepspeed: bool = False,
    with_policy: bool = True,
    fsdp2: bool = False,
    with_critic: bool = True,
) -> list[str]:
    """
    Files a resumable checkpoint must have that `checkpoint` lacks. Under DeepSpeed the weights and optimizer states
    are the engine's own (`latest` and `global_step*/`), not `optimizer.pt` and the safetensors; under FSDP2 the
    optimizer's are torch's distributed checkpoint (`fsdp2_states/.metadata` and its `.distcp` files). A critic job's
    checkpoints (`with_policy=False`) hold no policy weights; a run without a critic (`with_critic=False`, a group
    advantage estimator) no critic weights.
    """
    required = ["trainer_state.json", TRAINING_STATE_NAME, "scheduler.pt"]
    required.append("rng_state.pth" if world_size <= 1 else "rng_state_0.pth")
    required.append("latest" if deepspeed else "fsdp2_states/.metadata" if fsdp2 else "optimizer.pt")
    missing = [name for name in required if not os.path.isfile(os.path.join(checkpoint, name))]
    if deepspeed:
        tag_dirs = [d for d in os.listdir(checkpoint) if d.startswith("global_step")]
        if not tag_dirs:
            missing.append("global_step*/ (DeepSpeed states)")
        return missing
    if with_policy and not _weight_files(checkpoint):
        missing.append("model.safetensors (policy weights)")
    if with_critic and not _weight_files(os.path.join(checkpoint, VALUE_MODEL_DIRNAME)):
        missing.append("value_model/model.safetensors (critic weights)")
    return missing


# What writes a checkpoint's optimizer state, by backend: DeepSpeed's engine, torch's distributed checkpoint, torch.save.
BACKEND_NAMES = {"deepspeed": "DeepSpeed", "fsdp2": "FSDP2", "ddp": "DDP (or one process)"}


def checkpoint_backend(checkpoint: str) -> str | None:
    """The backend whose optimizer state `checkpoint` holds: `"deepspeed"` (`latest`, `global_step*/`), `"fsdp2"`
    (`fsdp2_states/`), `"ddp"` (`optimizer.pt`, also written by one process), or `None` when it holds none."""
    if os.path.isfile(os.path.join(checkpoint, "latest")) or any(
        name.startswith("global_step") for name in os.listdir(checkpoint)
    ):
        return "deepspeed"
    if os.path.isdir(os.path.join(checkpoint, "fsdp2_states")):
        return "fsdp2"
    if os.path.isfile(os.path.join(checkpoint, "optimizer.pt")):
        return "ddp"
    return None


def check_checkpoint_backend(checkpoint: str, backend: str) -> None:
    """
    Refuse to resume a run on `backend` from a checkpoint another backend wrote: their optimizer states (DeepSpeed's
    partitions, torch's distributed checkpoint, one `optimizer.pt`) are not converted into each other. The weights
    need no conversion: the full safetensors of the policy and the critic a checkpoint holds can start a new run.
    """
    saved = checkpoint_backend(checkpoint)
    if saved is None or saved == backend:
        return
    raise CheckpointError(
        f"Cannot resume from {checkpoint}: it was written under {BACKEND_NAMES[saved]} and this run uses "
        f"{BACKEND_NAMES[backend]}. Their optimizer states are not converted into each other (resuming would lose "
        f"the optimizer state silently). Resume with the launch that wrote it, or start a new run from its full "
        f"weights: the policy's safetensors in {checkpoint} (model_name_or_path) and the critic's in "
        f"{os.path.join(checkpoint, VALUE_MODEL_DIRNAME)} (value_model, with value_pretrain_steps=0; under DeepSpeed "
        "they are written with zero3_save_16bit_model: true); that restarts the optimizer, the schedules and the data "
        "order."
    )


def read_weights(directory: str) -> dict[str, torch.Tensor]:
    """All tensors of a saved model directory; a truncated or damaged file raises [`CheckpointError`]."""
    files = _weight_files(directory)
    if not files:
        raise CheckpointError(f"No safetensors weights in {directory}.")
    state: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            state.update(load_file(path))
        except Exception as exc:  # safetensors raises its own error type for truncated files
            raise CheckpointError(f"Cannot read {path} ({exc}): the checkpoint is damaged.") from exc
    return state


def load_weights_into(model: torch.nn.Module, directory: str) -> None:
    """
    Load a `save_pretrained` directory's weights into an existing model (a PEFT model gets its adapter weights).

    Keys the file lacks are accepted only for parameters tied to a loaded one (e.g. `lm_head` tied to the embeddings).
    """
    state = read_weights(directory)
    if hasattr(model, "peft_config") and os.path.isfile(os.path.join(directory, "adapter_model.safetensors")):
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, state)
        unexpected = list(getattr(result, "unexpected_keys", []))
        if unexpected:
            raise CheckpointError(f"Adapter weights in {directory} do not match the model: {unexpected[:5]}")
        return
    params = dict(model.named_parameters(remove_duplicate=False))
    missing, unexpected = model.load_state_dict(state, strict=False)
    loaded = {id(params[k]) for k in state if k in params}
    untied_missing = [k for k in missing if k not in params or id(params[k]) not in loaded]
    if untied_missing or unexpected:
        raise CheckpointError(
            f"Weights in {directory} do not match the model: missing {untied_missing[:5]}, unexpected "
            f"{list(unexpected)[:5]}. Resume with the same model and configuration the checkpoint was saved with."
        )

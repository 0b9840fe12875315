"""Checkpoint files and where they go: the files of a complete checkpoint and their atomic writing, ZeRO-3 universal
checkpoints, Hub pushes and model cards. What a trainer saves when is the trainer's (`trainer/saving.py`).
"""

from .files import (
    TEMP_PREFIX,
    TRAINING_STATE_NAME,
    VALUE_MODEL_DIRNAME,
    CheckpointError,
    InsufficientDiskSpaceError,
    check_checkpoint_backend,
    check_free_space,
    checkpoint_backend,
    estimate_checkpoint_bytes,
    load_weights_into,
    missing_checkpoint_files,
    publish,
    read_training_state,
    remove_stale_temp_checkpoints,
    saved_world_size,
    write_training_state,
)
from .hub import HubPushError, HubSettings
from .model_cards import RunCard
from .universal import convert_to_universal, is_converted, load_universal, universal_dir

__all__ = [
    "CheckpointError",
    "HubPushError",
    "HubSettings",
    "InsufficientDiskSpaceError",
    "RunCard",
    "TEMP_PREFIX",
    "TRAINING_STATE_NAME",
    "VALUE_MODEL_DIRNAME",
    "check_checkpoint_backend",
    "check_free_space",
    "checkpoint_backend",
    "convert_to_universal",
    "estimate_checkpoint_bytes",
    "is_converted",
    "load_universal",
    "load_weights_into",
    "missing_checkpoint_files",
    "publish",
    "read_training_state",
    "remove_stale_temp_checkpoints",
    "saved_world_size",
    "universal_dir",
    "write_training_state",
]

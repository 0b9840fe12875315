"""How processes share the work: collectives (the gradient-accumulation context, all-reduces for whitening and
micro-batch counts, a gathered state dict, the all-to-all of balanced ranks), FSDP2 sharding and its checkpoints,
sequence parallelism (groups, Ulysses attention, the sum over a group, the rows a group's processes send each other),
and checks of the launch and of the DeepSpeed setup.
"""

from .checks import check_deepspeed_setup, check_distributed_setup, check_launch_environment
from .collectives import (
    exchange_rows,
    gathered_state_dict,
    max_across_processes,
    micro_batch_context,
    whitening_all_reduce,
)
from .fsdp import (
    FSDP2_STATES_DIRNAME,
    FSDPError,
    apply_fsdp2_activation_checkpointing,
    fsdp2_full_state_dict,
    full_tensor,
    is_fsdp2_sharded,
    load_fsdp2_states,
    requested_fsdp_version,
    save_fsdp2_states,
    shard_with_fsdp2,
    unsharded_class,
)
from .row_sharing import TOKEN_FIELDS, group_row_shapes, padded_token_rows, share_group_rows
from .sequence import (
    SequenceGroup,
    SequenceParallelError,
    setup_sequence_parallel,
    sum_over_group,
    ulysses_attention,
)

__all__ = [
    "FSDP2_STATES_DIRNAME",
    "FSDPError",
    "TOKEN_FIELDS",
    "apply_fsdp2_activation_checkpointing",
    "SequenceGroup",
    "SequenceParallelError",
    "check_deepspeed_setup",
    "check_distributed_setup",
    "check_launch_environment",
    "exchange_rows",
    "fsdp2_full_state_dict",
    "full_tensor",
    "gathered_state_dict",
    "group_row_shapes",
    "is_fsdp2_sharded",
    "load_fsdp2_states",
    "max_across_processes",
    "micro_batch_context",
    "padded_token_rows",
    "requested_fsdp_version",
    "save_fsdp2_states",
    "setup_sequence_parallel",
    "shard_with_fsdp2",
    "share_group_rows",
    "unsharded_class",
    "sum_over_group",
    "ulysses_attention",
    "whitening_all_reduce",
]

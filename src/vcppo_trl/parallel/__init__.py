"""How processes share the work: collectives (the gradient-accumulation context, all-reduces for whitening and
micro-batch counts, a gathered state dict, the all-to-all of balanced ranks) and checks of the launch and of the
DeepSpeed setup.
"""

from .checks import check_deepspeed_setup, check_distributed_setup, check_launch_environment
from .collectives import (
    exchange_rows,
    gathered_state_dict,
    max_across_processes,
    micro_batch_context,
    whitening_all_reduce,
)

__all__ = [
    "check_deepspeed_setup",
    "check_distributed_setup",
    "check_launch_environment",
    "exchange_rows",
    "gathered_state_dict",
    "max_across_processes",
    "micro_batch_context",
    "whitening_all_reduce",
]

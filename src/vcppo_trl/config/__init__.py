"""Configuration: the flat TRL-style configs of the command line and recipes ([`PPOConfig`] with TRL's names,
[`VCPPOConfig`], [`VAPOConfig`]) and the batch plan derived from them; their sections and TRL's names, which group and
annotate `train.py --help`.
"""

from .batch_plan import BatchPlan, plan_batches
from .ppo import PPOConfig
from .precision import resolve_bf16
from .sections import VCPPO_SECTIONS, config_sections
from .trl_names import ALIASES
from .vapo import VAPOConfig
from .vcppo import VCPPOConfig

__all__ = [
    "ALIASES",
    "BatchPlan",
    "PPOConfig",
    "VAPOConfig",
    "VCPPOConfig",
    "VCPPO_SECTIONS",
    "config_sections",
    "plan_batches",
    "resolve_bf16",
]

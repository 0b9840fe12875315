"""Configuration: the flat TRL-style configs of the command line and recipes ([`PPOConfig`] with TRL's names,
[`VCPPOConfig`], [`VAPOConfig`]) and the batch plan derived from them.
"""

from .batch_plan import BatchPlan, plan_batches
from .ppo import PPOConfig
from .precision import resolve_bf16
from .vapo import VAPOConfig
from .vcppo import VCPPOConfig

__all__ = ["BatchPlan", "PPOConfig", "VAPOConfig", "VCPPOConfig", "plan_batches", "resolve_bf16"]

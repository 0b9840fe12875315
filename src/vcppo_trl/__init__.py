"""vcppo-trl: VC-PPO (Value-Calibrated PPO, arXiv 2503.01491) as a TRL-compatible trainer."""

__version__ = "0.1.0"

from .callbacks import RolloutProgressCallback, ValuePretrainCallback
from .config import PPOConfig, VCPPOConfig
from .gae import dual_lambda_gae, gae
from .rewards import math_verify_reward
from .trainer import PPOTrainer
from .vcppo_trainer import VCPPOTrainer

__all__ = [
    "PPOConfig",
    "PPOTrainer",
    "RolloutProgressCallback",
    "VCPPOConfig",
    "VCPPOTrainer",
    "ValuePretrainCallback",
    "dual_lambda_gae",
    "gae",
    "math_verify_reward",
]

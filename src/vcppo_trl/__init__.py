"""vcppo-trl: VC-PPO (Value-Calibrated PPO, arXiv 2503.01491) as a TRL-compatible trainer."""

__version__ = "0.1.0"


from .callbacks import RolloutProgressCallback, ValuePretrainCallback
from .checkpointing import CheckpointError, InsufficientDiskSpaceError
from .config import PPOConfig, VCPPOConfig
from .gae import dual_lambda_gae, gae
from .output import silence_unused_backend_notices
from .ppo_trainer import NonFiniteTrainingError, PPOTrainer
from .preemption import TrainingInterrupted
from .reward_calls import RewardFunctionError
from .rewards import math_verify_reward
from .vapo import VAPOConfig, VAPOTrainer
from .vcppo_trainer import VCPPOTrainer

silence_unused_backend_notices()  # before accelerate first imports DeepSpeed (it does so lazily)

__all__ = [
    "CheckpointError",
    "InsufficientDiskSpaceError",
    "NonFiniteTrainingError",
    "PPOConfig",
    "PPOTrainer",
    "RewardFunctionError",
    "RolloutProgressCallback",
    "TrainingInterrupted",
    "VAPOConfig",
    "VAPOTrainer",
    "VCPPOConfig",
    "VCPPOTrainer",
    "ValuePretrainCallback",
    "dual_lambda_gae",
    "gae",
    "math_verify_reward",
]

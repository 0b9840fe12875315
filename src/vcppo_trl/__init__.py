"""vcppo-trl: VC-PPO (Value-Calibrated PPO, arXiv 2503.01491) as a TRL-compatible trainer."""

__version__ = "0.1.0"


from .algo.advantages import register_advantage_estimator
from .algo.gae import dual_lambda_gae, gae
from .checkpoint.files import CheckpointError, InsufficientDiskSpaceError
from .config.ppo import PPOConfig
from .config.vapo import VAPOConfig
from .config.vcppo import VCPPOConfig
from .episodes.sandbox import python_tool, run_python
from .learner.optimizers import NonFiniteTrainingError
from .rewards.calls import RewardFunctionError
from .rewards.math_verify import math_verify_reward
from .trainer.console import RolloutProgressCallback, silence_unused_backend_notices
from .trainer.ppo import PPOTrainer
from .trainer.preemption import TrainingInterrupted
from .trainer.store_job import store_rollouts
from .trainer.value_pretraining import ValuePretrainCallback
from .trainer.vapo import VAPOTrainer
from .trainer.vcppo import VCPPOTrainer

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
    "python_tool",
    "register_advantage_estimator",
    "run_python",
    "store_rollouts",
]

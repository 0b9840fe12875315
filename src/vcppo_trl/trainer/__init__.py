"""The trainers and their loop: [`PPOTrainer`] (rollout → advantages → learner → metrics), the presets
([`VCPPOTrainer`], [`VAPOTrainer`]), building their parts, metrics, evaluation, the value-pretraining phase with its
stop rule and callback, prompts, the console, saving, resuming and preemption, and the store-rollouts job.
"""

from .console import CompactPrinterCallback, RolloutProgressCallback, silence_unused_backend_notices
from .ppo import PPOTrainer
from .preemption import TrainingInterrupted
from .store_job import StoreReport, store_rollouts
from .value_pretraining import CriticFit, ValuePretrainCallback, ValuePretrainingPhase, ValuePretrainRule
from .vapo import VAPOTrainer
from .vcppo import VCPPOTrainer

__all__ = [
    "CompactPrinterCallback",
    "CriticFit",
    "PPOTrainer",
    "RolloutProgressCallback",
    "TrainingInterrupted",
    "VAPOTrainer",
    "VCPPOTrainer",
    "ValuePretrainCallback",
    "ValuePretrainRule",
    "ValuePretrainingPhase",
    "StoreReport",
    "silence_unused_backend_notices",
    "store_rollouts",
]

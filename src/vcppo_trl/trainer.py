"""
The old home of [`PPOTrainer`], which now lives in `ppo_trainer.py` (the file name TRL gives its trainers).

This module only re-exports its public names, so that imports and pickles naming `vcppo_trl.trainer` (user code,
objects pickled before the move) keep working. Nothing in the package imports it.
"""

from .ppo_trainer import NonFiniteTrainingError, PPOTrainer, RewardFunc, ScoredSamples, role_prefix

__all__ = ["NonFiniteTrainingError", "PPOTrainer", "RewardFunc", "ScoredSamples", "role_prefix"]

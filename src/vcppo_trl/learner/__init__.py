"""The learner: PPO epochs over one rollout ([`PPOLearner`] → [`UpdateResult`]), the optimizer's parameter groups by
role, and one learning-rate schedule per role.
"""

from .optimizers import (
    NonFiniteTrainingError,
    optimizer_state_summary,
    parameter_groups,
    reset_optimizer_state,
    role_prefix,
    role_scheduler,
    split_by_role,
)
from .ppo_learner import PPOLearner, UpdateResult
from .schedules import RoleLR, ScheduleSettings, schedule_multiplier
from .settings import LearnerSettings

__all__ = [
    "LearnerSettings",
    "NonFiniteTrainingError",
    "PPOLearner",
    "RoleLR",
    "ScheduleSettings",
    "UpdateResult",
    "optimizer_state_summary",
    "parameter_groups",
    "reset_optimizer_state",
    "role_prefix",
    "role_scheduler",
    "schedule_multiplier",
    "split_by_role",
]

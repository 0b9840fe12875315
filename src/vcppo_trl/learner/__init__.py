"""The learner: PPO epochs over one rollout ([`PPOLearner`] → [`UpdateResult`]), the optimizer's parameter groups by
role, one learning-rate schedule per role, and what hands each PPO epoch its rows (one process's own, balanced ranks, a
sequence-parallel group's shared rows).
"""

from .epoch_rows import EpochRowSource, OwnRows, RankBalancer
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
from .sequence_group_rows import SequenceGroupRows
from .settings import LearnerSettings

__all__ = [
    "EpochRowSource",
    "LearnerSettings",
    "NonFiniteTrainingError",
    "OwnRows",
    "PPOLearner",
    "RankBalancer",
    "RoleLR",
    "ScheduleSettings",
    "SequenceGroupRows",
    "UpdateResult",
    "optimizer_state_summary",
    "parameter_groups",
    "reset_optimizer_state",
    "role_prefix",
    "role_scheduler",
    "schedule_multiplier",
    "split_by_role",
]

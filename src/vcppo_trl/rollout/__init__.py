"""The rollout stage: dataset rows in, a typed [`Rollout`] out (the maker), with its stats types, the scored
samples, and the shaping of per-token rewards.
"""

from .maker import GenerationStats, RolloutMaker, RolloutStats
from .scoring import ScoredSamples, concat_scored, decode_completions
from .settings import RolloutSettings, old_logprobs_from_training_forward
from .shaping import overlong_penalty, token_rewards
from .types import Rollout, is_correct

__all__ = [
    "GenerationStats",
    "Rollout",
    "RolloutMaker",
    "RolloutStats",
    "ScoredSamples",
    "concat_scored",
    "decode_completions",
    "is_correct",
    "RolloutSettings",
    "old_logprobs_from_training_forward",
    "overlong_penalty",
    "token_rewards",
]

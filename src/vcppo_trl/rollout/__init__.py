"""The rollout stage: dataset rows in, a typed [`Rollout`] out (the maker), with its stats types, the scored
samples, the shaping of per-token rewards, and generation windows (the pool of in-flight responses).
"""

from .maker import GenerationStats, RolloutMaker, RolloutStats
from .scoring import ScoredSamples, concat_scored, decode_completions
from .settings import RolloutSettings, old_logprobs_from_training_forward
from .shaping import overlong_penalty, token_rewards
from .types import Rollout, is_correct
from .windowed import gae_bootstrap, make_window
from .windows import InFlight, ResponsePool, WindowStep

__all__ = [
    "GenerationStats",
    "InFlight",
    "ResponsePool",
    "WindowStep",
    "gae_bootstrap",
    "make_window",
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

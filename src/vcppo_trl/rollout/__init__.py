"""The rollout stage: dataset rows in, a typed [`Rollout`] out (the maker), with its stats types, the scored
samples and the shaping of per-token rewards; and the sources the trainer asks for rollouts ([`RolloutSource`],
built by [`build_rollout_source`]): whole responses, generation windows (the pool of in-flight responses), the queue
of generations (or tool episodes) a rollout worker runs ahead of training (`max_staleness`), and rollouts stored as a dataset.
How one prompt becomes an episode (one turn, tools, environments, a `rollout_func`) is `vcppo_trl.episodes`.
"""

from .maker import GenerationStats, RolloutMaker, RolloutStats
from .overlap import AheadOfTraining, OverlappedRollouts, WindowAhead, request_seed, rollout_worker
from .response_pool import InFlight, ResponsePool, WindowStep
from .scoring import ScoredSamples, concat_scored, decode_completions, padded_to_multiple, prompt_text
from .settings import RolloutSettings, old_logprobs_from_training_forward
from .shaping import overlong_penalty, penalised_scores, token_rewards
from .sources import (
    CriticFirst,
    RolloutSource,
    SourceSettings,
    StoredSourceSettings,
    WholeResponses,
    build_rollout_source,
    check_custom_sampling,
    check_tools_under_overlap,
    with_stored_pretraining,
)
from .stored_format import (
    RolloutWriter,
    StoredRolloutsError,
    StoredRolloutsInfo,
    complete_batches,
    load_stored_rollouts,
    push_stored_rollouts,
    read_info,
    vocab_sha256,
    weights_sha256,
)
from .stored_source import (
    StoredRolloutSource,
    mismatches,
    open_stored_rollouts,
    resolve_stored_rollouts,
    scored_from_records,
)
from .tool_overlap import EpisodesInWorker, OverlappedToolEpisodes, check_tools_travel
from .types import HeldOutRollouts, OverlapStats, Rollout, gae_bootstrap, is_correct
from .windowed import WindowedRollouts, make_window

__all__ = [
    "EpisodesInWorker",
    "OverlappedToolEpisodes",
    "check_tools_travel",
    "RolloutSource",
    "build_rollout_source",
    "check_custom_sampling",
    "check_tools_under_overlap",
    "SourceSettings",
    "WholeResponses",
    "WindowedRollouts",
    "CriticFirst",
    "StoredSourceSettings",
    "with_stored_pretraining",
    "open_stored_rollouts",
    "rollout_worker",
    "StoredRolloutSource",
    "mismatches",
    "resolve_stored_rollouts",
    "scored_from_records",
    "RolloutWriter",
    "StoredRolloutsError",
    "StoredRolloutsInfo",
    "complete_batches",
    "load_stored_rollouts",
    "push_stored_rollouts",
    "read_info",
    "vocab_sha256",
    "weights_sha256",
    "GenerationStats",
    "InFlight",
    "AheadOfTraining",
    "OverlapStats",
    "WindowAhead",
    "OverlappedRollouts",
    "request_seed",
    "ResponsePool",
    "WindowStep",
    "gae_bootstrap",
    "HeldOutRollouts",
    "make_window",
    "Rollout",
    "RolloutMaker",
    "RolloutStats",
    "ScoredSamples",
    "concat_scored",
    "decode_completions",
    "padded_to_multiple",
    "prompt_text",
    "is_correct",
    "RolloutSettings",
    "old_logprobs_from_training_forward",
    "overlong_penalty",
    "penalised_scores",
    "token_rewards",
]

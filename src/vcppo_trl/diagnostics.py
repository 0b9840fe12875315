"""The critic and advantage diagnostics' import path (`vcppo_trl.diagnostics`); they live in `algo/diagnostics.py`."""

from .algo.diagnostics import (  # noqa: F401
    StopAdvantageGap,
    absolute_position_buckets,
    explained_variance,
    marker_token_ids,
    position_bucket_explained_variance,
    position_bucket_means,
    position_buckets,
    position_correlation,
    stop_advantage_gap,
    stop_positions,
)

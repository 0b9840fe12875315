"""Diagnostics of the critic and the advantage signal: pure tensor functions, no trainer state (they import nothing
from the trainer): explained variance (over the batch and by position), advantage by position (the paper's Figure 2),
and the stop-vs-continue gap.

The stop-vs-continue gap measures the mechanism by which a critic biased low on early prefixes shortens responses:
with V = V* − b(t) and λ < 1, the action that *stops* reasoning at position k collects the whole bias b(k) in its
advantage, while the action that *continues* at the same position only receives a λ-discounted share of it (≈ (β/L)/(1 − λ) for a linear ramp of height β over L tokens). With λ = 1 both receive b(k)
and the gap is exactly 0. [`stop_advantage_gap`] measures that difference on a batch, by absolute position.

Shapes follow `vcppo_trl.gae`: `[B, T]` tensors, right-padded, `response_mask` bool or 0/1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch


def stop_positions(
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    marker_ids: Sequence[int] | None,
    has_stop: torch.Tensor | None = None,
) -> torch.Tensor:
    """
    Position of the token where each response stops reasoning.

    That is the first token of the first occurrence of the end-of-thinking marker (e.g. the ids of `"</think>"`) among
    the response's valid tokens; in a response without the marker, its stop token (the last valid token, when
    `has_stop` says the response produced one); otherwise (no marker, cut at the length limit) `-1`.

    Args:
        response_ids (`torch.Tensor` of shape `[B, T]`): Response token ids.
        response_mask (`torch.Tensor` of shape `[B, T]`): Right-padded mask of valid tokens (stop token included).
        marker_ids (`Sequence[int]` or `None`): Token ids of the marker, matched as a contiguous sequence; `None` or
            empty: stop tokens only.
        has_stop (`torch.Tensor` of shape `[B]`, *optional*): Whether each response ended with a stop token; `None`
            treats every non-empty response as stopped at its last valid token.

    Returns:
        `torch.Tensor` of shape `[B]` (long): the position, or `-1` where a response has none.
    """
    valid = response_mask.bool()
    batch_size, length = response_ids.shape
    lengths = valid.sum(dim=1)
    stopped = lengths > 0 if has_stop is None else (has_stop.bool() & (lengths > 0))
    positions = torch.where(stopped, lengths - 1, torch.full_like(lengths, -1)).long()
    marker = list(marker_ids or [])
    if marker and len(marker) <= length:
        windows = response_ids.unfold(1, len(marker), 1)  # [B, T − m + 1, m]
        target = torch.tensor(marker, dtype=response_ids.dtype, device=response_ids.device)
        # The whole marker must lie inside the valid tokens: with right padding its last token being valid suffices.
        found = (windows == target).all(dim=-1) & valid[:, len(marker) - 1 :]
        has_marker = found.any(dim=1)
        first = found.int().argmax(dim=1)
        positions = torch.where(has_marker, first, positions)
    return positions


class StopAdvantageGap(NamedTuple):
    """Result of [`stop_advantage_gap`].

    Attributes:
        gap (`float`): Mean over stop tokens of (advantage − mean advantage of the continue tokens of its bucket), over
            the buckets that hold both kinds; `nan` when none does.
        bucket_gaps (`torch.Tensor` of shape `[num_buckets]`, float64): Per bucket, mean stop advantage minus mean
            continue advantage; `nan` where a bucket lacks either kind.
        stop_counts (`torch.Tensor` of shape `[num_buckets]`, long): Stop tokens per bucket.
    """

    gap: float
    bucket_gaps: torch.Tensor
    stop_counts: torch.Tensor


def absolute_position_buckets(length: int, num_buckets: int, max_length: int, device=None) -> torch.Tensor:
    """Bucket `floor(t · num_buckets / max_length)` of each position `t < length` (the last bucket takes any overflow)."""
    if num_buckets < 1 or max_length < 1:
        raise ValueError(f"num_buckets and max_length must be >= 1, got {num_buckets} and {max_length}.")
    positions = torch.arange(length, device=device)
    return torch.div(positions * num_buckets, max_length, rounding_mode="floor").clamp(max=num_buckets - 1)


def stop_advantage_gap(
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    stop_positions: torch.Tensor,
    num_buckets: int = 8,
    max_length: int | None = None,
) -> StopAdvantageGap:
    r"""
    The spurious stop-vs-continue advantage gap: the critic-bias signature that drives early stopping.

    Stop tokens are the tokens at `stop_positions` (where the response stops reasoning, see [`stop_positions`]).
    Continue tokens are the valid tokens *before* their response's stop position (all valid tokens of a response that
    never stops): actions that kept reasoning. Tokens after the stop position (the answer, the stop token after a
    marker) are neither. Both kinds are grouped by **absolute** position (token `t` falls in bucket
    `floor(t · num_buckets / max_length)`), so that a stop at position k is compared with continuing at about the same
    position, where a positional critic bias is about the same.

    Under a critic V = V* − b(t) with λ < 1 the gap is ≈ b(k) − (λ-discounted share of b's decrease) > 0 (the push
    toward shorter responses); with λ = 1 the bias telescopes and the stop and continue actions at the same position
    get the same bias (gap = true advantage difference only).

    Args:
        advantages (`torch.Tensor` of shape `[B, T]`): Per-token advantages (raw or whitened; whitening scales the gap).
        response_mask (`torch.Tensor` of shape `[B, T]`): Right-padded mask of valid tokens (bool or 0/1).
        stop_positions (`torch.Tensor` of shape `[B]`): Stop position per response, `-1` for none.
        num_buckets (`int`, defaults to `8`): Number of absolute-position buckets.
        max_length (`int`, *optional*): Span the buckets divide (e.g. the response-length limit, so that bucket edges
            stay the same from batch to batch); defaults to `T`. Later positions fall in the last bucket.

    Returns:
        [`StopAdvantageGap`]: the overall gap, the gap per bucket, and the number of stop tokens per bucket.
    """
    if advantages.dim() != 2 or advantages.shape != response_mask.shape:
        raise ValueError(
            f"advantages and response_mask must have the same [B, T] shape, got {tuple(advantages.shape)} and "
            f"{tuple(response_mask.shape)}."
        )
    if stop_positions.shape != (advantages.shape[0],):
        raise ValueError(
            f"stop_positions must have shape [B] = [{advantages.shape[0]}], got {tuple(stop_positions.shape)}."
        )
    batch_size, length = advantages.shape
    device = advantages.device
    valid = response_mask.bool()
    stops = stop_positions.long().to(device)
    positions = torch.arange(length, device=device).unsqueeze(0)
    is_stop = (positions == stops.unsqueeze(1)) & valid & (stops.unsqueeze(1) >= 0)
    before_stop = torch.where(stops.unsqueeze(1) >= 0, positions < stops.unsqueeze(1), torch.ones_like(is_stop))
    is_continue = valid & before_stop

    buckets = absolute_position_buckets(length, num_buckets, max_length or length, device=device).expand(
        batch_size, length
    )
    values = advantages.double()

    def sums_and_counts(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sums = torch.zeros(num_buckets, dtype=torch.float64, device=device)
        counts = torch.zeros(num_buckets, dtype=torch.long, device=device)
        sums.index_add_(0, buckets[selected], values[selected])
        counts.index_add_(0, buckets[selected], torch.ones_like(buckets[selected]))
        return sums, counts

    stop_sums, stop_counts = sums_and_counts(is_stop)
    cont_sums, cont_counts = sums_and_counts(is_continue)
    both = (stop_counts > 0) & (cont_counts > 0)
    stop_mean = stop_sums / stop_counts.clamp(min=1)
    cont_mean = cont_sums / cont_counts.clamp(min=1)
    nan = torch.full_like(stop_mean, float("nan"))
    bucket_gaps = torch.where(both, stop_mean - cont_mean, nan)
    weights = torch.where(both, stop_counts, torch.zeros_like(stop_counts)).double()
    if weights.sum() > 0:
        gap = float((torch.where(both, bucket_gaps, 0.0) * weights).sum() / weights.sum())
    else:
        gap = float("nan")
    return StopAdvantageGap(gap=gap, bucket_gaps=bucket_gaps, stop_counts=stop_counts)


def marker_token_ids(tokenizer, marker: str | None) -> list[int]:
    """
    Token ids of an end-of-thinking marker as the tokenizer writes it inside a response (no special tokens added).

    Returns `[]` (stop tokens only) when `marker` is `None` or empty, or when the tokenizer does not know it (it encodes
    to the unknown token, which would match any unknown text).
    """
    if not marker:
        return []
    ids = list(tokenizer.encode(marker, add_special_tokens=False))
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None and unk in ids:
        return []
    return ids


def explained_variance(
    values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, min_relative_std: float = 0.05
) -> float:
    """
    `1 − Var(returns − values) / Var(returns)` over every masked token of the whole batch.

    Call it on the full batch (all micro-batches, gathered across ranks): averaging per-micro-batch values is wrong.

    Returns `nan` when the returns carry (almost) nothing to explain: their standard deviation is at most
    `min_relative_std × max(1, RMS(returns))`. That is the case when every response got the same score and the returns
    differ only by float noise, by KL penalties of a few hundredths, or by the bootstrapped values of λ < 1; the ratio
    then divides the critic's error by a near-zero variance and gives numbers like −3e5 that say nothing about the
    critic (and wreck dashboards). The `max(1, ·)` assumes rewards of order 1 (±1 or 0/1 verifiers, reward models);
    pass a smaller `min_relative_std` for rewards on a much smaller scale.

    Args:
        values, returns (`torch.Tensor` of shape `[B, T]`): Predictions and targets.
        mask (`torch.Tensor` of shape `[B, T]`): Valid tokens.
        min_relative_std (`float`, defaults to `0.05`): See above; `0` keeps only the guard against exact constants.
    """
    mask = mask.bool()
    if mask.sum() < 2:
        return float("nan")
    targets = returns[mask].double()
    residual = targets - values[mask].double()
    var_targets = targets.var()
    scale = max(1.0, float(targets.pow(2).mean().sqrt()))
    # Float noise on constant targets (relative 1e-8 in variance), or variation too small to be worth explaining.
    if var_targets <= max(1e-8 * scale**2, (min_relative_std * scale) ** 2):
        return float("nan")
    return float(1.0 - residual.var() / var_targets)


def position_correlation(advantages: torch.Tensor, mask: torch.Tensor) -> float:
    """
    Pearson correlation between a per-token quantity and the token's position in its response.

    VC-PPO's Figure 2 signal: with a biased critic, advantages grow toward early tokens (a negative correlation),
    and the policy learns to stop early. Returns `nan` when either side has no variance.
    """
    mask = mask.bool()
    positions = torch.arange(advantages.shape[1], device=advantages.device).expand_as(advantages)
    x = positions[mask].double()
    y = advantages[mask].double()
    if x.numel() < 2 or x.std() == 0 or y.std() == 0:
        return float("nan")
    x = x - x.mean()
    y = y - y.mean()
    return float((x * y).sum() / torch.sqrt((x * x).sum() * (y * y).sum()))


def position_buckets(mask: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """Relative-position bucket `floor(t · num_buckets / L)` of token `t` in a response of `L` valid tokens, `[B, T]`."""
    mask = mask.bool()
    lengths = mask.sum(dim=1, keepdim=True).clamp(min=1)
    positions = torch.arange(mask.shape[1], device=mask.device).unsqueeze(0)
    return torch.div(positions * num_buckets, lengths, rounding_mode="floor").clamp(max=num_buckets - 1)


def position_bucket_means(
    values: torch.Tensor, mask: torch.Tensor, num_buckets: int = 8, tokens: torch.Tensor | None = None
) -> torch.Tensor:
    """
    Mean of a per-token quantity by relative position in the response (the paper's Figure 2, as numbers).

    Token `t` of a response with `L` valid tokens falls in bucket `floor(t · num_buckets / L)`, so bucket 0 holds the
    first eighth of every response (with 8 buckets) and bucket `num_buckets − 1` its last eighth, whatever the length.

    Args:
        values (`torch.Tensor` of shape `[B, T]`): e.g. advantages, or values minus returns.
        mask (`torch.Tensor` of shape `[B, T]`): right-padded mask of valid response tokens (bool or 0/1): the
            responses whose length places each token.
        num_buckets (`int`): number of position buckets.
        tokens (`torch.Tensor` of shape `[B, T]`, *optional*): the tokens averaged, within `mask` (e.g. a generation
            window's: the last part of each response); their buckets stay those of their place in `mask`'s
            responses. Defaults to every token of `mask`.

    Returns:
        `torch.Tensor` of shape `[num_buckets]` (float64): the mean over every averaged token in each bucket, over the
        whole batch; `nan` for a bucket with no token.
    """
    buckets = position_buckets(mask.bool(), num_buckets)
    mask = mask.bool() if tokens is None else mask.bool() & tokens.bool()
    sums = torch.zeros(num_buckets, dtype=torch.float64, device=values.device)
    counts = torch.zeros(num_buckets, dtype=torch.float64, device=values.device)
    sums.index_add_(0, buckets[mask], values[mask].double())
    counts.index_add_(0, buckets[mask], torch.ones_like(values[mask], dtype=torch.float64))
    return torch.where(counts > 0, sums / counts.clamp(min=1), torch.full_like(sums, float("nan")))


def position_bucket_explained_variance(
    values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, num_buckets: int = 8
) -> list[float]:
    """
    [`explained_variance`] of `values` against `returns` within each relative-position bucket (see
    [`position_bucket_means`]); `nan` for a bucket with fewer than two tokens or constant returns.

    With Monte-Carlo returns as `returns`, it shows the paper's Figure 3 effect: a critic trained with λ < 1 explains
    the end reward poorly at early tokens, which the decayed targets never reach.
    """
    mask = mask.bool()
    buckets = position_buckets(mask, num_buckets)
    return [explained_variance(values, returns, mask & (buckets == k)) for k in range(num_buckets)]

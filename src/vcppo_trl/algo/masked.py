"""Masked reductions over `[B, T]` response tokens (mean, variance, whitening), shared by the advantage math, the
losses and the diagnostics."""

from __future__ import annotations

from collections.abc import Callable

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` over positions where `mask` is set (0 when the mask is empty)."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of `values` over positions where `mask` is set."""
    mask = mask.to(values.dtype)
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    count = mask.sum()
    if unbiased and count > 1:
        var = var * count / (count - 1)
    return var


def masked_whiten(
    values: torch.Tensor,
    mask: torch.Tensor,
    shift_mean: bool = True,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    stats_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """
    Normalise `values` to unit variance (and zero mean when `shift_mean`) over the masked positions.

    Args:
        values (`torch.Tensor` of shape `[B, T]`): Values to whiten.
        mask (`torch.Tensor` of shape `[B, T]`): Positions that count (bool or 0/1).
        shift_mean (`bool`): Subtract the mean (otherwise it is kept).
        all_reduce (`Callable`, *optional*): Sums a tensor over processes (e.g. `lambda t: accelerator.reduce(t,
            "sum")`). When given, the mean and the (unbiased) variance are those of every process's masked values
            together, computed in float64 in two passes; otherwise of this `values` alone.
        stats_mask (`torch.Tensor` of shape `[B, T]`, *optional*): The positions the mean and variance are taken
            over (within `mask`), applied to every position of `mask`; `None`: `mask`'s own.

    Returns:
        `torch.Tensor`: same shape and dtype; positions outside the mask are 0.
    """
    out_mask = mask.bool()
    valid = out_mask if stats_mask is None else out_mask & stats_mask.bool()
    values = torch.where(out_mask, values, torch.zeros((), dtype=values.dtype, device=values.device))  # padding
    mask_f = valid.to(values.dtype)
    if all_reduce is None:
        mean, var = masked_mean(values, mask_f), masked_var(values, mask_f)
    else:
        x = values.double()
        first = all_reduce(torch.stack([x.sum(), valid.sum().double()]))
        count = first[1]
        mean64 = first[0] / count.clamp(min=1)
        squares = all_reduce(torch.where(valid, (x - mean64) ** 2, 0.0).sum().reshape(1))[0]
        var64 = squares / count.clamp(min=1)
        var64 = torch.where(count > 1, var64 * count / (count - 1).clamp(min=1), var64)
        mean, var = mean64.to(values.dtype), var64.to(values.dtype)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * out_mask.to(values.dtype)

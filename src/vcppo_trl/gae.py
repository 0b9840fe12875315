"""Advantage estimation for PPO and VC-PPO: pure tensor functions, no trainer state.

Conventions shared by every function here (see DESIGN.md, "Contracts"):

- Tensors are `[B, T]`: `B` sequences, `T` response tokens, right-padded.
- `values[:, t]` is V(s_t), the critic's estimate before response token `t` is produced.
- The state after the last valid token is terminal: it bootstraps with 0.
- `response_mask` is bool or 0/1, valid tokens first, then padding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _check_shapes(rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor) -> None:
    if rewards.dim() != 2 or rewards.shape != values.shape or rewards.shape != response_mask.shape:
        raise ValueError(
            "rewards, values and response_mask must all have the same [B, T] shape, got "
            f"{tuple(rewards.shape)}, {tuple(values.shape)} and {tuple(response_mask.shape)}."
        )


def _check_unit_interval(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}.")


LambdaLike = float | torch.Tensor

# Chunk length of the scan: a [K, K] decay matrix per chunk, and a recursion over chunk starts.
_SCAN_CHUNK = 64


def _check_lambda(name: str, lam: LambdaLike, batch_size: int) -> None:
    if isinstance(lam, torch.Tensor):
        if lam.shape != (batch_size,):
            raise ValueError(f"A per-sequence {name} must have shape [B] = [{batch_size}], got {tuple(lam.shape)}.")
        if not bool(((lam >= 0) & (lam <= 1)).all()):
            raise ValueError(f"{name} must be in [0, 1], got values from {float(lam.min())} to {float(lam.max())}.")
    else:
        _check_unit_interval(name, lam)


def _decay_per_row(gamma: float, lam: LambdaLike, batch_size: int, device: torch.device) -> torch.Tensor:
    """γ·λ as a float64 `[B]` tensor (float64 so that its powers inside a chunk stay exact)."""
    lam = torch.as_tensor(lam, dtype=torch.float64, device=device)
    return (gamma * lam).expand(batch_size).contiguous()


def reverse_discounted_cumsum(x: torch.Tensor, decay: torch.Tensor, chunk: int = _SCAN_CHUNK) -> torch.Tensor:
    r"""
    `y_t = Σ_{j ≥ t} decay^(j − t) · x_j` along the last axis, without a per-token Python loop.

    Exact chunked scan: inside each chunk of `chunk` tokens a `[K, K]` matrix of powers `decay^(j − i)` (j ≥ i) gives
    the chunk-local sums in one batched matmul; the values at chunk starts are themselves a reverse discounted
    cumsum with decay `decay^K`, solved by the same function, and carried back into each chunk. Only non-negative
    powers of `decay ≤ 1` appear, so nothing overflows; memory is O(B·T + B·K²).

    Args:
        x (`torch.Tensor` of shape `[B, T]`): float32 input.
        decay (`torch.Tensor` of shape `[B]`): per-row decay in [0, 1].
        chunk (`int`): chunk length K.

    Returns:
        `torch.Tensor` of shape `[B, T]`, float32.
    """
    batch_size, length = x.shape
    if length == 0:
        return x.clone()
    if length <= chunk:
        chunk = length
    num_chunks = -(-length // chunk)
    padded = torch.nn.functional.pad(x, (0, num_chunks * chunk - length)).view(batch_size, num_chunks, chunk)
    offsets = torch.arange(chunk, device=x.device)
    exponents = offsets[None, :] - offsets[:, None]  # [K, K]: j − i
    upper = exponents >= 0
    powers = decay[:, None, None] ** exponents.clamp(min=0).to(decay.dtype)  # [B, K, K], float64
    matrix = torch.where(upper, powers, torch.zeros((), dtype=powers.dtype, device=x.device)).to(x.dtype)
    local = torch.einsum("bnj,bij->bni", padded, matrix)  # chunk-local sums
    if num_chunks > 1:
        starts = reverse_discounted_cumsum(local[:, :, 0].contiguous(), decay**chunk, chunk)
        # Value at the start of the next chunk (0 after the last one), carried back with decay^(K − i).
        carry = torch.nn.functional.pad(starts[:, 1:], (0, 1))
        tail_powers = (decay[:, None] ** (chunk - offsets).to(decay.dtype)).to(x.dtype)  # [B, K]
        local = local + carry[:, :, None] * tail_powers[:, None, :]
    return local.reshape(batch_size, num_chunks * chunk)[:, :length]


def dual_lambda_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam_actor: LambdaLike,
    lam_critic: LambdaLike,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""
    Generalised advantage estimation with separate λ for the policy and the critic (VC-PPO, "decoupled GAE").

    δ_t = r_t + γ·V_{t+1} − V_t, with V after the last valid token equal to 0, and A^λ_t = Σ_l (γλ)^l δ_{t+l} over valid
    tokens. The policy's advantages use `lam_actor`; the critic's regression targets are `A^{lam_critic} + V`. With
    `gamma == lam_critic == 1` the returns are exactly the reverse cumulative sum of rewards (Monte-Carlo returns).
    Both λs are computed in one chunked scan ([`reverse_discounted_cumsum`]), with no loop over tokens.

    Args:
        rewards (`torch.Tensor` of shape `[B, T]`):
            Per-token rewards (the verifier score on the last valid token, KL penalties elsewhere).
        values (`torch.Tensor` of shape `[B, T]`):
            Critic values V(s_t) for each response token.
        response_mask (`torch.Tensor` of shape `[B, T]`):
            Right-padded mask of valid response tokens (bool or 0/1).
        gamma (`float`):
            Discount factor in [0, 1].
        lam_actor (`float` or `torch.Tensor` of shape `[B]`):
            GAE λ for the policy's advantages, in [0, 1]; a tensor gives one λ per sequence.
        lam_critic (`float` or `torch.Tensor` of shape `[B]`):
            GAE λ for the critic's targets, in [0, 1].

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: `(advantages, returns)`, both `[B, T]` float32, zero outside the mask.
        Advantages are not whitened.
    """
    _check_shapes(rewards, values, response_mask)
    batch_size, length = rewards.shape
    _check_unit_interval("gamma", gamma)
    _check_lambda("lam_actor", lam_actor, batch_size)
    _check_lambda("lam_critic", lam_critic, batch_size)

    valid = response_mask.bool()
    if length > 1 and bool((valid[:, 1:] & ~valid[:, :-1]).any()):
        raise ValueError("response_mask must be right-padded: valid tokens first, then padding, in every row.")
    # Compute in float32 whatever the input dtype (bf16 sums over thousands of tokens lose the signal); torch.where,
    # not a product, so that NaN or inf in padded positions cannot leak into valid tokens.
    rewards = torch.where(valid, rewards.float(), 0.0)
    values = torch.where(valid, values.float(), 0.0)
    next_values = torch.nn.functional.pad(values[:, 1:], (0, 1))  # 0 after the last valid token (right padding)
    deltas = rewards + gamma * next_values - values  # already 0 on padding

    device = rewards.device
    decay = torch.cat(
        [_decay_per_row(gamma, lam_actor, batch_size, device), _decay_per_row(gamma, lam_critic, batch_size, device)]
    )
    both = reverse_discounted_cumsum(torch.cat([deltas, deltas]), decay)
    mask = valid.float()
    advantages = both[:batch_size] * mask
    returns = (both[batch_size:] + values) * mask
    return advantages, returns


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Standard single-λ GAE: [`dual_lambda_gae`] with `lam_actor == lam_critic == lam`.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: `(advantages, returns)`, both `[B, T]`, zero outside the mask.
    """
    return dual_lambda_gae(rewards, values, response_mask, gamma, lam_actor=lam, lam_critic=lam)


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

    Returns:
        `torch.Tensor`: same shape and dtype; positions outside the mask are 0.
    """
    valid = mask.bool()
    values = torch.where(valid, values, torch.zeros((), dtype=values.dtype, device=values.device))  # padding garbage
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
    return whitened * mask_f


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


def position_bucket_means(values: torch.Tensor, mask: torch.Tensor, num_buckets: int = 8) -> torch.Tensor:
    """
    Mean of a per-token quantity by relative position in the response (the paper's Figure 2, as numbers).

    Token `t` of a response with `L` valid tokens falls in bucket `floor(t · num_buckets / L)`, so bucket 0 holds the
    first eighth of every response (with 8 buckets) and bucket `num_buckets − 1` its last eighth, whatever the length.

    Args:
        values (`torch.Tensor` of shape `[B, T]`): e.g. advantages, or values minus returns.
        mask (`torch.Tensor` of shape `[B, T]`): right-padded mask of valid response tokens (bool or 0/1).
        num_buckets (`int`): number of position buckets.

    Returns:
        `torch.Tensor` of shape `[num_buckets]` (float64): the mean over every valid token in each bucket, over the
        whole batch; `nan` for a bucket with no token.
    """
    mask = mask.bool()
    buckets = position_buckets(mask, num_buckets)
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

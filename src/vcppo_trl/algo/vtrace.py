"""V-trace targets for the critic (IMPALA, Espeholt et al. 2018, arXiv 1802.01561): value targets of the current policy
from tokens an older policy sampled, with truncated importance weights. A pure tensor function, the conventions of
`gae.py` (`[B, T]`, right-padded, `values[:, t]` = V(s_t), 0 after the last token unless a bootstrap value is given).
"""

from __future__ import annotations

import torch


def vtrace_returns(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    log_ratio: torch.Tensor,
    *,
    gamma: float = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    bootstrap_values: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""
    The critic's V-trace targets over the tokens of `mask`:

        v_t = V_t + ρ_t δ_t + γ c_t (v_{t+1} − V_{t+1}),    δ_t = r_t + γ V_{t+1} − V_t,
        ρ_t = min(ρ̄, e^{log_ratio_t}),    c_t = min(c̄, e^{log_ratio_t}),

    where t+1 is the row's next token in `mask` (the others — tool and environment tokens, padding — are skipped, as
    GAE's `action_mask_mode="skip"` does) and the state after a row's last token has V = `bootstrap_values` (0 when
    `None`: the response finished), with v − V = 0 there. With `log_ratio` = 0 and c̄, ρ̄ ≥ 1 the targets are GAE's
    λ = 1 returns; ρ̄ bounds the value function the targets converge to (π itself at ρ̄ = ∞, the behaviour policy at
    ρ̄ → 0), c̄ bounds how far a correction travels back (the trace).

    Args:
        rewards (`torch.Tensor` of shape `[B, T]`): Per-token rewards; read on `mask` only.
        values (`torch.Tensor` of shape `[B, T]`): The critic's V(s_t).
        mask (`torch.Tensor` of shape `[B, T]`): The tokens the targets run over (the policy's own: `action_mask`
            within the response mask), bool or 0/1.
        log_ratio (`torch.Tensor` of shape `[B, T]`): log π_current − log π_behaviour of each token (the policy being
            trained against the one that sampled it); read on `mask` only.
        gamma (`float`): Discount factor in [0, 1].
        rho_bar (`float`): ρ̄ > 0, the truncation of the importance weight on δ.
        c_bar (`float`): c̄ > 0, the truncation of the trace.
        bootstrap_values (`torch.Tensor` of shape `[B]`, *optional*): V after each row's last masked token (a
            generation window's cut); 0 for a finished row.

    Returns:
        `torch.Tensor` of shape `[B, T]`: the targets, 0 outside `mask`; computed in float64, returned in float32 (or
        float64 for float64 values).
    """
    if not (rewards.shape == values.shape == mask.shape == log_ratio.shape) or rewards.dim() != 2:
        raise ValueError(
            "rewards, values, mask and log_ratio must all have the same [B, T] shape, got "
            f"{tuple(rewards.shape)}, {tuple(values.shape)}, {tuple(mask.shape)} and {tuple(log_ratio.shape)}."
        )
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}.")
    if not (rho_bar > 0 and c_bar > 0):
        raise ValueError(f"rho_bar and c_bar must be > 0, got rho_bar={rho_bar}, c_bar={c_bar}.")
    batch_size = rewards.shape[0]
    if bootstrap_values is not None and bootstrap_values.shape != (batch_size,):
        raise ValueError(
            f"bootstrap_values must have shape [B] = [{batch_size}], got {tuple(bootstrap_values.shape)}."
        )
    out_dtype = torch.float64 if values.dtype == torch.float64 else torch.float32
    valid = mask.bool()
    # Each row's masked tokens moved left in order (column from 1; the rest to a spare column 0, dropped), so that the
    # recursion runs over consecutive columns.
    running = valid.cumsum(1)
    column = torch.where(valid, running, 0)
    lengths = running[:, -1] if valid.shape[1] else valid.new_zeros(batch_size, dtype=torch.long)
    width = int(lengths.max()) if batch_size else 0

    def compress(x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros((batch_size, width + 1), dtype=torch.float64, device=x.device)
        return out.scatter_(1, column, torch.where(valid, x.double(), 0.0))[:, 1:]

    r, v, ratio = compress(rewards), compress(values), compress(log_ratio).exp()
    rho, c = ratio.clamp(max=rho_bar), ratio.clamp(max=c_bar)
    next_v = torch.nn.functional.pad(v[:, 1:], (0, 1))
    if bootstrap_values is not None and width:  # V after the last token: the cut's value
        rows = torch.arange(batch_size, device=v.device)
        last = (lengths - 1).clamp(min=0)
        next_v[rows, last] = torch.where(lengths > 0, bootstrap_values.double(), next_v[rows, last])
    weighted_deltas = rho * (r + gamma * next_v - v)  # 0 past each row's length (all inputs 0 there)
    # v_t − V_t = ρ_t δ_t + γ c_t (v_{t+1} − V_{t+1}): one step per column, vectorised over rows (past a row's end
    # every term is 0, so the correction starts from 0 after its last token).
    correction = torch.zeros_like(v)
    following = torch.zeros(batch_size, dtype=torch.float64, device=v.device)
    for t in range(width - 1, -1, -1):
        following = weighted_deltas[:, t] + gamma * c[:, t] * following
        correction[:, t] = following
    targets = torch.nn.functional.pad(v + correction, (1, 0)).gather(1, column)
    return torch.where(valid, targets, 0.0).to(out_dtype)

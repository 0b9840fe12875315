"""Advantage estimation for PPO and VC-PPO: pure tensor functions, no trainer state.

Conventions shared by every function here (the package contract for `dual_lambda_gae`):

- Tensors are `[B, T]`: `B` sequences, `T` response tokens, right-padded.
- `values[:, t]` is V(s_t), the critic's estimate before response token `t` is produced.
- The state after the last valid token is terminal: it bootstraps with 0, unless `bootstrap_values` gives the value
  of the state after a response cut before it finished (a generation window's cut: see [`dual_lambda_gae`]).
- `response_mask` is bool or 0/1, valid tokens first, then padding.
- `action_mask` (optional) is 1 on the policy's own tokens within `response_mask`, 0 on tokens a tool or an
  environment wrote into the response: those are state, not actions (see [`dual_lambda_gae`]).
"""

from __future__ import annotations

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

# How GAE treats tokens outside the action mask: "skip" runs over the policy's tokens as if the others were not there;
# "plain" (OpenRLHF's way, for comparison) zeroes rewards and values there and scans through them.
ACTION_MASK_MODES = ("skip", "plain")

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
    bootstrap_values: torch.Tensor | None = None,
    action_mask: torch.Tensor | None = None,
    action_mask_mode: str = "skip",
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
        bootstrap_values (`torch.Tensor` of shape `[B]`, *optional*):
            V after each row's last valid token, for responses cut before they finished (T-PPO's extended GAE over a
            generation window): δ of the last token becomes r + γ·bootstrap − V. 0 for a finished row (terminal).
            `None`: every row is finished.
        action_mask (`torch.Tensor` of shape `[B, T]`, *optional*):
            1 on the policy's own tokens, 0 on tokens a tool or an environment wrote into the response: those are
            state, not actions. Must lie within `response_mask` (a policy token on padding is refused), and rewards
            must be 0 off it (a reward on a tool token is refused: move it to the policy's next token). Returns and
            advantages are 0 off it. A caller with a length-dependent λ (per-row `lam_actor`) should count the
            policy's tokens. `None` (default): every valid token is the policy's, today's computation unchanged.
        action_mask_mode (`str`):
            How the tokens off `action_mask` are treated:

            - `"skip"` (default): GAE as if they were not there. δ and the bootstrap cross them with no γ or λ decay:
              exactly the ordinary scan over each row's policy tokens alone (moved left, scanned, moved back), as
              verl's multi-turn GAE. A row that ends in tool tokens bootstraps (`bootstrap_values`, else 0) after its
              last policy token.
            - `"plain"` (OpenRLHF's way, for comparison experiments): rewards and values zeroed on them and the
              ordinary scan run through them, so the credit of the next turn decays by γλ per tool token
              (0.95^256 ≈ 2e-6 across a 256-token tool result) and the policy's last token before a tool block
              bootstraps from V = 0. With `gamma == lam_critic == 1` the returns agree with `"skip"`.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: `(advantages, returns)`, both `[B, T]` float32, zero outside the mask.
        Advantages are not whitened.
    """
    _check_shapes(rewards, values, response_mask)
    batch_size, length = rewards.shape
    _check_unit_interval("gamma", gamma)
    _check_lambda("lam_actor", lam_actor, batch_size)
    _check_lambda("lam_critic", lam_critic, batch_size)
    if action_mask_mode not in ACTION_MASK_MODES:
        raise ValueError(f"action_mask_mode must be one of {ACTION_MASK_MODES}, got {action_mask_mode!r}.")

    valid = response_mask.bool()
    if length > 1 and bool((valid[:, 1:] & ~valid[:, :-1]).any()):
        raise ValueError("response_mask must be right-padded: valid tokens first, then padding, in every row.")
    if action_mask is None:
        return _scan(rewards, values, valid, gamma=gamma, lams=(lam_actor, lam_critic), bootstrap=bootstrap_values)
    actions, width = _checked_actions(action_mask, valid, rewards=rewards)
    if action_mask_mode == "skip":
        return _over_actions(
            rewards,
            values,
            actions,
            width=width,
            gamma=gamma,
            lams=(lam_actor, lam_critic),
            bootstrap=bootstrap_values,
        )
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    advantages, returns = _scan(
        rewards,  # already 0 on tool tokens (checked)
        torch.where(actions, values, zero),
        valid,
        gamma=gamma,
        lams=(lam_actor, lam_critic),
        bootstrap=bootstrap_values,
    )
    return advantages * actions, returns * actions


def _scan(
    rewards: torch.Tensor,
    values: torch.Tensor,
    valid: torch.Tensor | None,
    *,
    gamma: float,
    lams: tuple[LambdaLike, LambdaLike],
    bootstrap: torch.Tensor | None,
    zero_padded: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The body of [`dual_lambda_gae`] on checked inputs: `valid` bool and right-padded, `lams` = (actor, critic).
    `zero_padded`: float32 inputs already 0 on padding, and outputs wanted on valid tokens only (the compressed scan
    of [`_over_actions`]): the steps that clean the padding are skipped, the valid tokens' arithmetic is the same, and
    `valid` is read only to place `bootstrap` (`None` without one)."""
    batch_size = rewards.shape[0]
    lam_actor, lam_critic = lams
    if not zero_padded:
        # Compute in float32 whatever the input dtype (bf16 sums over thousands of tokens lose the signal);
        # torch.where, not a product, so that NaN or inf in padded positions cannot leak into valid tokens.
        rewards = torch.where(valid, rewards.float(), 0.0)
        values = torch.where(valid, values.float(), 0.0)
    next_values = torch.nn.functional.pad(values[:, 1:], (0, 1))  # 0 after the last valid token (right padding)
    if bootstrap is not None:
        next_values = next_values + _at_last_valid(valid, bootstrap.float())
    deltas = rewards + gamma * next_values - values  # already 0 on padding

    device = rewards.device
    decay = torch.cat(
        [
            _decay_per_row(gamma, lam_actor, batch_size, device=device),
            _decay_per_row(gamma, lam_critic, batch_size, device=device),
        ]
    )
    both = reverse_discounted_cumsum(torch.cat([deltas, deltas]), decay)
    if zero_padded:
        return both[:batch_size], both[batch_size:] + values
    mask = valid.float()
    advantages = both[:batch_size] * mask
    returns = (both[batch_size:] + values) * mask
    return advantages, returns


def _checked_actions(
    action_mask: torch.Tensor, valid: torch.Tensor, *, rewards: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """`action_mask` as bool, checked against `valid` and `rewards`, and the most policy tokens in a row (one host
    sync for all of it)."""
    if action_mask.shape != valid.shape:
        raise ValueError(
            f"action_mask must have the [B, T] shape {tuple(valid.shape)}, got {tuple(action_mask.shape)}."
        )
    actions = action_mask.bool()
    outside, on_tool, width = torch.stack(
        [
            (actions > valid).any(),
            ((rewards != 0) & (valid > actions)).any(),
            actions.sum(1).max() if actions.numel() else torch.zeros((), dtype=torch.long, device=actions.device),
        ]
    ).tolist()
    if outside:
        raise ValueError(
            "action_mask marks a padded token (outside response_mask) as the policy's: it must be a subset of "
            "response_mask."
        )
    if on_tool:
        raise ValueError(
            "A reward sits on a token outside action_mask (a tool's or environment's token): put it on the policy's "
            "next (or last) token instead; GAE credits actions only."
        )
    return actions, int(width)


def _over_actions(
    rewards: torch.Tensor,
    values: torch.Tensor,
    actions: torch.Tensor,
    *,
    width: int,
    gamma: float,
    lams: tuple[LambdaLike, LambdaLike],
    bootstrap: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[`_scan`] over each row's policy tokens alone: moved left in order (a running count gives each its column),
    scanned as a right-padded sequence `width` long (the most policy tokens in a row), and moved back; 0 on the
    other tokens."""
    batch_size = actions.shape[0]
    width = max(width, 1)
    # Each policy token's column in its row's compressed sequence, from 1 (a running count); the others get column 0,
    # a spare one dropped on the way in (so NaN or inf there cannot leak) and read as 0 on the way back.
    running = actions.cumsum(1)
    column = torch.where(actions, running, 0)
    # The compressed sequence's mask: needed only to place the bootstrap after each row's last policy token.
    compressed_mask = None
    if bootstrap is not None:
        compressed_mask = torch.arange(1, width + 1, device=actions.device) <= running[:, -1:]

    def compress(x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros((batch_size, width + 1), dtype=torch.float32, device=x.device)
        return out.scatter_(1, column, x.float())[:, 1:]

    advantages, returns = _scan(
        compress(rewards),
        compress(values),
        compressed_mask,
        gamma=gamma,
        lams=lams,
        bootstrap=bootstrap,
        zero_padded=True,  # 0 past each row's policy tokens, and only their columns are read back
    )
    # Column 0 back in front, as 0: what the other tokens read.
    return (
        torch.nn.functional.pad(advantages, (1, 0)).gather(1, column),
        torch.nn.functional.pad(returns, (1, 0)).gather(1, column),
    )


def _at_last_valid(valid: torch.Tensor, per_row: torch.Tensor) -> torch.Tensor:
    """`[B, T]`: `per_row[i]` at row i's last valid token, 0 elsewhere (and in rows with no valid token)."""
    if per_row.shape != (valid.shape[0],):
        raise ValueError(f"bootstrap_values must have shape [B] = [{valid.shape[0]}], got {tuple(per_row.shape)}.")
    lengths = valid.sum(1)
    last = (lengths - 1).clamp(min=0)
    out = torch.zeros(valid.shape, dtype=per_row.dtype, device=valid.device)
    out[torch.arange(valid.shape[0], device=valid.device), last] = torch.where(lengths > 0, per_row, 0.0)
    return out


def last_valid_values(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """`[B]`: each row's value at its last valid token, V(s_{l−1}) (0 for an empty row): T-PPO's stand-in for the value
    after a window's cut, `window_bootstrap="last_value"`."""
    valid = response_mask.bool()
    lengths = valid.sum(1)
    last = (lengths - 1).clamp(min=0)
    picked = values.float()[torch.arange(values.shape[0], device=values.device), last]
    return torch.where(lengths > 0, picked, 0.0)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
    bootstrap_values: torch.Tensor | None = None,
    action_mask: torch.Tensor | None = None,
    action_mask_mode: str = "skip",
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Standard single-λ GAE: [`dual_lambda_gae`] with `lam_actor == lam_critic == lam` (and its `bootstrap_values`,
    `action_mask` and `action_mask_mode`).

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: `(advantages, returns)`, both `[B, T]`, zero outside the mask.
    """
    return dual_lambda_gae(
        rewards,
        values,
        response_mask,
        gamma=gamma,
        lam_actor=lam,
        lam_critic=lam,
        bootstrap_values=bootstrap_values,
        action_mask=action_mask,
        action_mask_mode=action_mask_mode,
    )

"""A rollout's rewards: the training score of each response (the raw score less the missing-EOS penalty, plus DAPO's
overlong term), and the per-token rewards (the score on the last response token, the KL penalty)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..algo.masked import masked_whiten


def overlong_penalty(
    lengths: torch.Tensor, has_stop: torch.Tensor, response_length: int, buffer_length: int, factor: float
) -> torch.Tensor:
    """
    DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13; verl's `overlong_buffer`), as a reward term ≤ 0.

    With `L = response_length` and the buffer `L_b`, a response of `|y|` tokens gets `0` up to `L − L_b` tokens, then
    `−factor × (|y| − (L − L_b)) / L_b`, reaching `−factor` at `|y| = L`; a response without a stop token (cut at `L`,
    or earlier by the sampler's context limit) gets `−factor` whatever its length.

    Args:
        lengths (`torch.Tensor` of shape `[B]`): Response lengths `|y|`, the stop token counted (the response mask's
            sum, as verl's `valid_response_length`).
        has_stop (`torch.Tensor` of shape `[B]`): Whether each response ended with a stop token.
        response_length, buffer_length, factor: `L`, `L_b` and the largest penalty.

    Returns:
        `torch.Tensor` of shape `[B]`, float32, in `[−factor, 0]`.
    """
    excess = (lengths.float() - (response_length - buffer_length)) / buffer_length
    penalty = -factor * excess.clamp(min=0.0, max=1.0)
    return torch.where(has_stop, penalty, torch.full_like(penalty, -factor))


def penalised_scores(
    raw_scores: torch.Tensor,
    has_stop: torch.Tensor,
    *,
    lengths: torch.Tensor,
    finished: torch.Tensor | None,
    missing_eos_penalty: float | None,
    response_length: int,
    overlong_buffer_length: int | None,
    overlong_penalty_factor: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """
    The scores training uses: raw scores (0 where unscored) less `missing_eos_penalty` on each finished response
    without a stop token, plus the [`overlong_penalty`] when `overlong_buffer_length` is set (on scored responses).

    Args:
        raw_scores, has_stop (`torch.Tensor` of shape `[B]`): The weighted reward sums (nan where unscored) and
            whether each response ended with a stop token.
        lengths (`torch.Tensor` of shape `[B]`): Response lengths, the stop token counted.
        finished (`torch.Tensor` of shape `[B]`, or `None`): A generation window's finished responses, the only ones
            penalised; `None`: every response is whole.

    Returns:
        `(scores, overlong_penalties)`: `[B]` scores, and the `[B]` overlong term they include (0 where unfinished),
        `None` when shaping is off. The term is kept apart: raw scores stay the correctness.
    """
    done = torch.ones_like(has_stop) if finished is None else finished
    scores = raw_scores.nan_to_num(0.0).clone()
    if missing_eos_penalty is not None:
        scores = scores - missing_eos_penalty * (~has_stop & done).float()
    if overlong_buffer_length is None:
        return scores, None
    penalties = overlong_penalty(
        lengths,
        has_stop,
        response_length,
        buffer_length=overlong_buffer_length,
        factor=overlong_penalty_factor,
    )
    if finished is not None:
        penalties = torch.where(finished, penalties, 0.0)
    return scores + torch.where(torch.isnan(raw_scores), 0.0, penalties), penalties


def token_rewards(
    scores: torch.Tensor,
    kl: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    whiten: bool = False,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """
    Per-token rewards: −kl_coef·KL on every token, plus the score on the last valid response token (never on a
    padding token after it: TRL ≤ 1.12 put it at the first PAD after EOS). With tool or environment tokens masked
    out, the last valid token is the policy's last: the score of an episode lands on its last turn.

    Args:
        scores: `[B]` sequence scores (penalties included).
        kl: `[B, T]` per-token KL estimates (0 where masked).
        response_mask: `[B, T]` bool: the tokens that take rewards (right-padded; with tool tokens masked out, gaps).
        kl_coef: The KL penalty's coefficient.
        whiten: Scale the rewards to unit variance over the valid tokens, keeping their mean (`whiten_rewards`).
        all_reduce: Sum over processes for the whitening statistics (`None`: this process's alone).

    Returns:
        `[B, T]` rewards, 0 outside the mask.
    """
    mask = response_mask
    rewards = -kl_coef * kl
    has_tokens = mask.any(dim=1)
    last = mask.shape[1] - 1 - mask.flip(1).int().argmax(dim=1)  # the last True (= length − 1 when right-padded)
    rows = torch.arange(mask.shape[0], device=mask.device)
    rewards[rows[has_tokens], last[has_tokens]] += scores[has_tokens]
    if whiten:
        rewards = masked_whiten(rewards, mask, shift_mean=False, all_reduce=all_reduce)
    return rewards * mask

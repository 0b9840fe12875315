"""Tests for `vcppo_trl.algo.losses`: clipped PPO policy/value losses and KL estimators."""

from __future__ import annotations

import math

import pytest
import torch

from vcppo_trl.algo.losses import (
    clipped_policy_loss,
    clipped_value_loss,
    kl_penalty,
    sampler_importance_weights,
    token_mean_term,
)
from vcppo_trl.rollout.shaping import overlong_penalty

EPS = 0.2


def _mask(lengths, length):
    return torch.arange(length)[None, :] < torch.as_tensor(lengths)[:, None]


# --------------------------------------------------------------------------------------------------------------------
# clipped_policy_loss
# --------------------------------------------------------------------------------------------------------------------


def test_policy_loss_ratio_one_is_minus_mean_advantage():
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(3, 5, generator=gen)
    logprobs = old.clone().requires_grad_(True)
    advantages = torch.randn(3, 5, generator=gen)
    advantages[~_mask([5, 2, 4], 5)] = 1e3  # padding garbage
    mask = _mask([5, 2, 4], 5)
    out = clipped_policy_loss(logprobs, old, advantages, mask, EPS)
    assert out.loss.item() == pytest.approx(-advantages[mask].mean().item(), rel=1e-6)
    assert out.clipfrac.item() == 0.0
    assert out.approxkl.item() == 0.0
    assert out.ratio.item() == pytest.approx(1.0)
    # d loss / d logprob_t = -A_t / N at ratio 1 on valid tokens, 0 on padding.
    out.loss.backward()
    expected_grad = torch.where(mask, -advantages / mask.sum(), torch.zeros_like(advantages))
    torch.testing.assert_close(logprobs.grad, expected_grad)


def _single_token(log_ratio: float, advantage: float):
    old = torch.zeros(1, 1)
    logprobs = torch.full((1, 1), log_ratio, requires_grad=True)
    advantages = torch.full((1, 1), advantage)
    mask = torch.ones(1, 1, dtype=torch.bool)
    out = clipped_policy_loss(logprobs, old, advantages, mask, EPS)
    out.loss.backward()
    return out, logprobs.grad.item()


@pytest.mark.parametrize(
    ("ratio", "advantage", "clipped"),
    [
        # Positive advantage: clipped above 1 + ε (no more incentive to increase), not below 1 - ε.
        (1.5, 2.0, True),
        (1.0 + EPS + 1e-3, 2.0, True),
        (1.1, 2.0, False),
        (0.5, 2.0, False),
        # Negative advantage: clipped below 1 - ε, not above 1 + ε.
        (0.5, -2.0, True),
        (1.0 - EPS - 1e-3, -2.0, True),
        (0.9, -2.0, False),
        (1.5, -2.0, False),
    ],
)
def test_policy_loss_clipping(ratio, advantage, clipped):
    out, grad = _single_token(math.log(ratio), advantage)
    if clipped:
        bound = 1.0 + EPS if advantage > 0 else 1.0 - EPS
        assert out.loss.item() == pytest.approx(-advantage * bound, rel=1e-6)
        assert grad == 0.0
        assert out.clipfrac.item() == 1.0
    else:
        assert out.loss.item() == pytest.approx(-advantage * ratio, rel=1e-5)
        # d(-A·exp(x))/dx = -A·ratio
        assert grad == pytest.approx(-advantage * ratio, rel=1e-5)
        assert out.clipfrac.item() == 0.0
    assert out.approxkl.item() == pytest.approx(0.5 * math.log(ratio) ** 2, rel=1e-5)
    assert out.ratio.item() == pytest.approx(ratio, rel=1e-5)


def test_policy_loss_clipfrac_and_masking():
    # Four valid tokens: two clipped, two not; padding tokens have extreme ratios that would be clipped.
    log_ratio = torch.log(torch.tensor([[1.5, 1.05, 0.5, 0.95, 3.0, 3.0]]))
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0, 5.0, -5.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
    old = torch.zeros_like(log_ratio)
    logprobs = log_ratio.clone().requires_grad_(True)
    out = clipped_policy_loss(logprobs, old, advantages, mask, EPS)
    assert out.clipfrac.item() == pytest.approx(0.5)
    expected = (-1.0 * 1.2 + -1.0 * 1.05 + 1.0 * 0.8 + 1.0 * 0.95) / 4
    assert out.loss.item() == pytest.approx(expected, rel=1e-5)
    out.loss.backward()
    assert torch.all(logprobs.grad[0, 4:] == 0)
    assert logprobs.grad[0, 0] == 0 and logprobs.grad[0, 2] == 0
    assert logprobs.grad[0, 1] != 0 and logprobs.grad[0, 3] != 0

    # Changing anything on padded tokens leaves every output unchanged.
    log_ratio2 = log_ratio.clone()
    log_ratio2[0, 4:] = torch.tensor([-7.0, 9.0])
    advantages2 = advantages.clone()
    advantages2[0, 4:] = torch.tensor([-100.0, 100.0])
    out2 = clipped_policy_loss(log_ratio2, old, advantages2, mask.bool(), EPS)
    assert out2.loss.item() == pytest.approx(out.loss.item(), rel=1e-6)
    assert out2.clipfrac.item() == pytest.approx(out.clipfrac.item())
    assert out2.approxkl.item() == pytest.approx(out.approxkl.item(), rel=1e-6)
    assert out2.ratio.item() == pytest.approx(out.ratio.item(), rel=1e-6)


def test_policy_loss_uses_difference_of_logprobs():
    """The ratio is exp(logprobs - old_logprobs): shifting both by the same amount changes nothing."""
    gen = torch.Generator().manual_seed(1)
    logprobs = -torch.rand(2, 4, generator=gen) * 3
    old = logprobs + 0.3 * torch.randn(2, 4, generator=gen)
    advantages = torch.randn(2, 4, generator=gen)
    mask = torch.ones(2, 4, dtype=torch.bool)
    a = clipped_policy_loss(logprobs, old, advantages, mask, EPS)
    b = clipped_policy_loss(logprobs - 5.0, old - 5.0, advantages, mask, EPS)
    assert a.loss.item() == pytest.approx(b.loss.item(), rel=1e-5)
    ratio = torch.exp(logprobs - old)
    expected = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - EPS, 1 + EPS)).mean()
    assert a.loss.item() == pytest.approx(expected.item(), rel=1e-5)


# --------------------------------------------------------------------------------------------------------------------
# clipped_value_loss
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dual_clip_c", [None, 3.0])
def test_a_masked_position_whose_ratio_overflows_leaves_the_gradient_finite(dual_clip_c):
    """`exp(log_ratio)` at a masked position must not reach the backward: `where` hides it in the forward only, and
    `0 · inf` there is NaN (plausible under packing, where a masked position's log-probs come from other sequences)."""
    logprobs = torch.tensor([[-1.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.2, -95.0]])
    out = clipped_policy_loss(
        logprobs,
        old,
        advantages=torch.tensor([[1.0, 0.0]]),
        mask=torch.tensor([[True, False]]),
        cliprange=0.2,
        dual_clip_c=dual_clip_c,
    )
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert torch.isfinite(logprobs.grad).all(), logprobs.grad
    assert logprobs.grad[0, 1] == 0.0
    # The valid token's loss and gradient are those of the same token alone.
    alone = torch.tensor([[-1.0]], requires_grad=True)
    ref = clipped_policy_loss(
        alone,
        old[:, :1],
        advantages=torch.tensor([[1.0]]),
        mask=torch.tensor([[True]]),
        cliprange=0.2,
        dual_clip_c=dual_clip_c,
    )
    ref.loss.backward()
    assert torch.equal(out.loss.detach(), ref.loss.detach())
    assert torch.equal(logprobs.grad[:, :1], alone.grad)
    assert out.ratio == ref.ratio and out.approxkl == ref.approxkl


def test_value_loss_unclipped_is_half_mse():
    gen = torch.Generator().manual_seed(0)
    old_values = torch.randn(3, 6, generator=gen)
    values = (old_values + 0.05 * torch.randn(3, 6, generator=gen)).requires_grad_(True)  # within ±0.2
    returns = torch.randn(3, 6, generator=gen)
    mask = _mask([6, 3, 1], 6)
    out = clipped_value_loss(values, old_values, returns, mask, cliprange_value=0.2)
    expected = 0.5 * ((values.detach() - returns)[mask] ** 2).mean()
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert out.clipfrac.item() == 0.0
    out.loss.backward()
    expected_grad = torch.where(mask, (values.detach() - returns) / mask.sum(), torch.zeros_like(returns))
    torch.testing.assert_close(values.grad, expected_grad)


@pytest.mark.parametrize(
    ("value", "target", "clipped_wins"),
    [
        # Moved too far toward the target: the clipped value is further from it, so the max picks it (no gradient).
        (1.0, 1.0, True),
        (-1.0, -1.0, True),
        # Moved too far past the target: the unclipped loss is larger, so the max keeps it (gradient flows).
        (1.0, 0.1, False),
        (-1.0, -0.1, False),
    ],
)
def test_value_loss_clipped_uses_max(value, target, clipped_wins):
    eps = 0.2
    old = torch.zeros(1, 1)
    values = torch.full((1, 1), value, requires_grad=True)
    returns = torch.full((1, 1), target)
    mask = torch.ones(1, 1, dtype=torch.bool)
    out = clipped_value_loss(values, old, returns, mask, cliprange_value=eps)
    clipped_value = max(-eps, min(eps, value))
    loss_unclipped = (value - target) ** 2
    loss_clipped = (clipped_value - target) ** 2
    assert out.loss.item() == pytest.approx(0.5 * max(loss_unclipped, loss_clipped), rel=1e-6)
    out.loss.backward()
    if clipped_wins:
        assert loss_clipped > loss_unclipped
        assert out.clipfrac.item() == 1.0
        assert values.grad.item() == 0.0
    else:
        assert loss_unclipped > loss_clipped
        assert out.clipfrac.item() == 0.0
        assert values.grad.item() == pytest.approx(value - target, rel=1e-6)


def test_value_loss_ignores_masked_tokens():
    values = torch.tensor([[0.1, 0.2, 50.0], [0.3, -40.0, 60.0]])
    old_values = torch.tensor([[0.0, 0.0, -50.0], [0.0, 30.0, 0.0]])
    returns = torch.tensor([[0.0, 1.0, 1e3], [0.5, -1e3, 7.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = clipped_value_loss(values, old_values, returns, mask, cliprange_value=0.2)
    # Valid tokens: (0.1-0)^2 ; clipped 0.2 vs unclipped 0.2 → (0.2-1)^2 ; (0.3 clipped to 0.2) vs 0.3 → max((0.2)^2, (0.3-0.5)^2)
    expected = 0.5 * (0.01 + 0.64 + max(0.04, 0.09)) / 3
    assert out.loss.item() == pytest.approx(expected, rel=1e-5)
    # Token 3: the clipped value 0.2 is further from 0.5 than 0.3 → clipped wins → clipfrac 1/3.
    assert out.clipfrac.item() == pytest.approx(1 / 3, rel=1e-6)


# --------------------------------------------------------------------------------------------------------------------
# kl_penalty
# --------------------------------------------------------------------------------------------------------------------


def test_kl_k1_is_log_ratio():
    gen = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(3, 4, generator=gen) * 4
    ref = -torch.rand(3, 4, generator=gen) * 4
    torch.testing.assert_close(kl_penalty(logprobs, ref, "k1"), logprobs - ref)
    torch.testing.assert_close(kl_penalty(logprobs, ref), logprobs - ref)  # k1 is the default


def test_kl_k3_nonnegative_and_zero_when_equal():
    gen = torch.Generator().manual_seed(1)
    logprobs = -torch.rand(4, 16, generator=gen) * 6
    ref = -torch.rand(4, 16, generator=gen) * 6
    k3 = kl_penalty(logprobs, ref, "k3")
    assert k3.shape == logprobs.shape
    assert torch.all(k3 >= 0)
    assert torch.all(k3[(logprobs - ref).abs() > 1e-3] > 0)
    assert torch.all(kl_penalty(logprobs, logprobs.clone(), "k3") == 0)
    # Closed form: with r = π_ref / π, k3 = (r − 1) − log r.
    r = torch.exp(ref.double() - logprobs.double())
    torch.testing.assert_close(k3.double(), (r - 1) - torch.log(r), rtol=1e-5, atol=1e-6)


def test_kl_k3_is_unbiased_for_kl():
    """E_{a~π}[k3] = KL(π ‖ π_ref) on a small categorical (exact expectation, not sampled)."""
    pi = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    ref = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)
    kl = float((pi * (pi.log() - ref.log())).sum())
    k3 = kl_penalty(pi.log(), ref.log(), "k3")
    k1 = kl_penalty(pi.log(), ref.log(), "k1")
    assert float((pi * k3).sum()) == pytest.approx(kl, rel=1e-9)
    assert float((pi * k1).sum()) == pytest.approx(kl, rel=1e-9)


@pytest.mark.parametrize("estimator", ["k2", "K1", "", "kl"])
def test_kl_bad_estimator_raises(estimator):
    with pytest.raises(ValueError, match="k1"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 2), estimator)


# --------------------------------------------------------------------------------------------------------------------
# aggregate_loss / loss_normalizer
# --------------------------------------------------------------------------------------------------------------------


from vcppo_trl.algo.losses import LOSS_TYPES, aggregate_loss, loss_normalizer  # noqa: E402


def test_aggregate_loss_modes_by_hand():
    per_token = torch.tensor([[1.0, 3.0, 9e9], [2.0, 2.0, 2.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])  # the third sequence is empty (skipped)
    assert aggregate_loss(per_token, mask, "token_mean").item() == pytest.approx(10 / 5)
    assert aggregate_loss(per_token, mask, "seq_mean_token_mean").item() == pytest.approx((2 + 2) / 2)
    assert aggregate_loss(per_token, mask, "seq_mean_token_sum").item() == pytest.approx((4 + 6) / 2)
    assert aggregate_loss(per_token, mask, "seq_mean_token_sum_norm", max_length=8).item() == pytest.approx(10 / 16)
    assert aggregate_loss(per_token, torch.zeros_like(mask), "token_mean").item() == 0.0
    with pytest.raises(ValueError, match="loss_type must be one of"):
        aggregate_loss(per_token, mask, "sum")


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_pieces_with_the_whole_normaliser_add_up_to_the_whole_loss(loss_type):
    """Micro-batches of unequal lengths, each divided by the normaliser of the whole mini-batch, sum to its loss."""
    gen = torch.Generator().manual_seed(0)
    per_token = torch.randn(6, 10, generator=gen)
    mask = _mask([1, 10, 3, 7, 2, 9], 10)
    whole = aggregate_loss(per_token, mask, loss_type, max_length=12)
    normalizer = sum(loss_normalizer(mask[i : i + 2], loss_type, 12) for i in (0, 2, 4))
    pieces = sum(aggregate_loss(per_token[i : i + 2], mask[i : i + 2], loss_type, normalizer, 12) for i in (0, 2, 4))
    assert pieces.item() == pytest.approx(whole.item(), rel=1e-6)
    # Without the whole normaliser (a mean of per-piece means) the token mean is wrong for unequal pieces.
    if loss_type == "token_mean":
        mean_of_means = sum(aggregate_loss(per_token[i : i + 2], mask[i : i + 2], loss_type) for i in (0, 2, 4)) / 3
        assert mean_of_means.item() != pytest.approx(whole.item(), rel=1e-3)


def test_value_loss_without_clipping_is_half_mse_even_far_from_old_values():
    old = torch.zeros(2, 3)
    values = torch.tensor([[2.0, -3.0, 1.0], [0.5, 4.0, 0.0]], requires_grad=True)
    returns = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    mask = _mask([3, 2], 3)
    out = clipped_value_loss(values, old, returns, mask, cliprange_value=None)
    expected = 0.5 * ((values.detach() - returns)[mask] ** 2).mean()
    assert out.loss.item() == pytest.approx(expected.item())
    assert out.clipfrac.item() == 0.0
    clipped = clipped_value_loss(values, old, returns, mask, cliprange_value=0.2)
    assert clipped.clipfrac.item() > 0


# --------------------------------------------------------------------------------------------------------------------
# sampler_importance_weights (vLLM mismatch correction)
# --------------------------------------------------------------------------------------------------------------------


def test_importance_weights_by_hand():
    train = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]])
    sampler = torch.tensor([[-1.5, -2.0, -9.0], [-0.5, -1.5, 0.0]])
    mask = _mask([2, 2], 3)  # the third column is padding: its large difference must not count
    token = sampler_importance_weights(train, sampler, mask, "token_truncate", None, 3.0)
    assert torch.allclose(token, torch.tensor([[math.exp(0.5), 1.0, 1.0], [1.0, math.exp(1.0), 1.0]]))
    seq = sampler_importance_weights(train, sampler, mask, "sequence_truncate", None, 3.0)
    assert seq.shape == (2, 1) and torch.allclose(seq, torch.tensor([[math.exp(0.5)], [math.exp(1.0)]]))
    seq_mask = sampler_importance_weights(train, sampler, mask, "sequence_mask", None, 2.0)
    assert torch.allclose(seq_mask, torch.tensor([[math.exp(0.5)], [0.0]]))  # e^1 > 2: masked out
    token_mask = sampler_importance_weights(train, sampler, mask, "token_mask", 1.5, None)
    assert torch.allclose(token_mask, torch.tensor([[math.exp(0.5), 0.0, 0.0], [0.0, math.exp(1.0), 0.0]]))
    clipped = sampler_importance_weights(train, sampler, mask, "token_truncate", 1.2, 1.5)
    assert torch.allclose(clipped, torch.tensor([[1.5, 1.2, 1.2], [1.2, 1.5, 1.2]]))


def test_importance_weights_rejects_unknown_mode():
    with pytest.raises(ValueError, match="mode must be one of"):
        sampler_importance_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), "token")


def test_policy_loss_weighted_by_importance_weights():
    logprobs = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    advantages = torch.tensor([[1.0, 2.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    weights = torch.tensor([[0.5, 0.0]])
    out = clipped_policy_loss(logprobs, logprobs.detach(), advantages, mask, EPS, importance_weights=weights)
    assert math.isclose(float(out.loss), -(0.5 * 1.0 + 0.0 * 2.0) / 2)


# ------------------------------------------------------------------ clip-higher, dual-clip, overlong shaping


def _one_token_each(ratios, advantages):
    """Tokens with the given ratios and advantages, one per row."""
    logprobs = torch.log(torch.tensor(ratios))[:, None].requires_grad_(True)
    old = torch.zeros_like(logprobs)
    adv = torch.tensor(advantages)[:, None]
    return logprobs, old, adv, torch.ones_like(adv, dtype=torch.bool)


def test_clip_higher_equal_to_symmetric_clip_when_the_bounds_agree():
    gen = torch.Generator().manual_seed(0)
    logprobs = (-torch.rand(3, 5, generator=gen)).requires_grad_(True)
    old = logprobs.detach() + 0.4 * torch.randn(3, 5, generator=gen)
    adv, mask = torch.randn(3, 5, generator=gen), torch.rand(3, 5, generator=gen) > 0.2
    plain = clipped_policy_loss(logprobs, old, adv, mask, 0.2)
    same = clipped_policy_loss(logprobs, old, adv, mask, 0.2, cliprange_high=0.2)
    assert torch.equal(plain.loss, same.loss) and torch.equal(plain.clipfrac, same.clipfrac)
    assert torch.equal(torch.autograd.grad(plain.loss, logprobs)[0], torch.autograd.grad(same.loss, logprobs)[0])


def test_clip_higher_bounds_by_hand():
    # ratio 1.25 with A > 0: inside 1 + 0.28, clipped at 1 + 0.2; ratio 0.7 with A < 0: clipped at 0.8 either way.
    logprobs, old, adv, mask = _one_token_each([1.25, 1.35, 0.7, 1.0], [1.0, 1.0, -1.0, 2.0])
    out = clipped_policy_loss(logprobs, old, adv, mask, 0.2, cliprange_high=0.28, loss_type="token_mean")
    per_token = torch.tensor([-1.25, -1.28, 0.8, -2.0])  # max(−A·r, −A·clip(r, 0.8, 1.28))
    torch.testing.assert_close(out.loss, per_token.mean())
    symmetric = clipped_policy_loss(logprobs, old, adv, mask, 0.2)
    torch.testing.assert_close(symmetric.loss, torch.tensor([-1.2, -1.2, 0.8, -2.0]).mean())
    assert float(out.clipfrac_high) == 0.25 and float(out.clipfrac_low) == 0.25
    assert float(out.clipfrac) == float(out.clipfrac_low + out.clipfrac_high)
    # The unclipped token (ratio 1.25 < 1.28) gets the gradient −A·r/N; the clipped ones none.
    grad = torch.autograd.grad(out.loss, logprobs)[0].squeeze(1)
    torch.testing.assert_close(grad, torch.tensor([-1.25 / 4, 0.0, 0.0, -2.0 / 4]))


def test_dual_clip_bounds_negative_advantages_at_c():
    logprobs, old, adv, mask = _one_token_each([5.0, 2.0, 5.0], [-1.0, -1.0, 1.0])
    out = clipped_policy_loss(logprobs, old, adv, mask, 0.2, dual_clip_c=3.0)
    # −A·r = 5 is bounded at −c·A = 3; ratio 2 < c stays 2; a positive advantage is clipped as before (−1.2).
    torch.testing.assert_close(out.loss, torch.tensor([3.0, 2.0, -1.2]).mean())
    assert float(out.clipfrac_dual) == pytest.approx(1 / 3)
    grad = torch.autograd.grad(out.loss, logprobs)[0].squeeze(1)
    assert float(grad[0]) == 0.0 and float(grad[1]) == pytest.approx(2.0 / 3)
    without = clipped_policy_loss(logprobs, old, adv, mask, 0.2)
    torch.testing.assert_close(without.loss, torch.tensor([5.0, 2.0, -1.2]).mean())
    assert without.clipfrac_dual is None


def test_token_mean_term_uses_the_given_count_and_is_zero_when_empty():
    values = torch.tensor([[1.0, 2.0, float("nan")], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert float(token_mean_term(values, mask, 6.0)) == 1.0
    assert float(token_mean_term(values, torch.zeros_like(mask), 0.0)) == 0.0


def test_overlong_penalty_at_the_buffer_edges():
    # response_length 10, buffer 4: no penalty up to 6 tokens, −factor·(|y| − 6)/4 after, −factor at 10 or no stop.
    lengths = torch.tensor([3, 6, 7, 8, 10, 5])
    has_stop = torch.tensor([True, True, True, True, True, False])
    penalty = overlong_penalty(lengths, has_stop, response_length=10, buffer_length=4, factor=0.5)
    torch.testing.assert_close(penalty, torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5, -0.5]))
    whole = overlong_penalty(torch.tensor([1, 10]), torch.tensor([True, True]), 10, 10, 1.0)
    torch.testing.assert_close(whole, torch.tensor([-0.1, -1.0]))


def test_per_response_clip_fractions_by_hand():
    """TRL GRPO's `clip_ratio/low_min` and `clip_ratio/high_max`: the least low-clipped and the most high-clipped
    response, each a fraction of its own masked tokens; a response with no masked token is left out."""
    ratio = torch.tensor([[0.5, 1.0, 1.0, 9.0], [0.5, 0.5, 1.5, 1.0], [0.5, 1.5, 1.5, 1.0]])
    adv = torch.tensor([[-1.0, -1.0, 1.0, 1.0], [-1.0, -1.0, 1.0, 1.0], [-1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]).bool()  # row 0's 9.0 is masked; row 2 empty
    old = torch.zeros(3, 4)
    out = clipped_policy_loss(ratio.log(), old, adv, mask, 0.2)
    # Row 0: 1 of 3 low-clipped, 0 high; row 1: 2 of 4 low, 1 of 4 high.
    assert float(out.clipfrac_low_min) == pytest.approx(1 / 3)
    assert float(out.clipfrac_high_max) == pytest.approx(1 / 4)
    none = clipped_policy_loss(ratio.log(), old, adv, torch.zeros(3, 4, dtype=torch.bool), 0.2)
    assert math.isnan(float(none.clipfrac_low_min)) and math.isnan(float(none.clipfrac_high_max))

"""Tests for `vcppo_trl.gae`: dual-λ GAE against an independent per-token reference, and the masked statistics."""

from __future__ import annotations

import math

import pytest
import torch

from vcppo_trl.algo.diagnostics import explained_variance, position_correlation
from vcppo_trl.algo.gae import dual_lambda_gae, gae
from vcppo_trl.algo.masked import masked_mean, masked_whiten

# --------------------------------------------------------------------------------------------------------------------
# Reference implementation: plain Python floats (float64), one sequence at a time, only over its valid tokens.
# --------------------------------------------------------------------------------------------------------------------


def _reference_lambda_returns(rewards, values, gamma, lam):
    """Per-token A^λ for ONE sequence given as Python lists of its valid tokens only."""
    n = len(rewards)
    advantages = [0.0] * n
    running = 0.0
    for t in reversed(range(n)):
        next_value = values[t + 1] if t + 1 < n else 0.0  # state after the last valid token is terminal
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
    return advantages


def reference_dual_lambda_gae(rewards, values, lengths, gamma, lam_actor, lam_critic):
    """Float64 `[B, T]` (advantages, returns); zeros beyond each row's length."""
    batch, length = rewards.shape
    adv = torch.zeros(batch, length, dtype=torch.float64)
    ret = torch.zeros(batch, length, dtype=torch.float64)
    for b in range(batch):
        n = int(lengths[b])
        r = [float(x) for x in rewards[b, :n].double()]
        v = [float(x) for x in values[b, :n].double()]
        a_actor = _reference_lambda_returns(r, v, gamma, lam_actor)
        a_critic = _reference_lambda_returns(r, v, gamma, lam_critic)
        for t in range(n):
            adv[b, t] = a_actor[t]
            ret[b, t] = a_critic[t] + v[t]
    return adv, ret


def _right_padded_mask(lengths, length):
    return torch.arange(length)[None, :] < torch.as_tensor(lengths)[:, None]


def _random_batch(seed, lengths, length, dtype=torch.float32, sparse_rewards=False):
    """Random rewards/values everywhere (also on padding, which must be ignored) and a right-padded bool mask."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(lengths)
    rewards = torch.randn(batch, length, generator=gen)
    if sparse_rewards:
        # Rewards at a few arbitrary positions, not only the last token.
        rewards = rewards * (torch.rand(batch, length, generator=gen) < 0.3)
    values = torch.randn(batch, length, generator=gen) * 2.0
    mask = _right_padded_mask(lengths, length)
    return rewards.to(dtype), values.to(dtype), mask


# Varied lengths: an empty row, a full-length row, a length-1 row and partial rows.
LENGTHS = [0, 12, 1, 5, 7, 12, 3]
T = 12

LAMBDA_PAIRS = [
    (0.0, 0.0),
    (0.0, 1.0),
    (0.5, 0.95),
    (0.95, 1.0),
    (1.0, 0.5),
    (1.0, 1.0),
    (0.95, 0.0),
    (0.5, 0.5),
]


@pytest.mark.parametrize("gamma", [0.9, 1.0])
@pytest.mark.parametrize(("lam_actor", "lam_critic"), LAMBDA_PAIRS)
@pytest.mark.parametrize("sparse_rewards", [False, True])
def test_dual_lambda_gae_matches_reference(gamma, lam_actor, lam_critic, sparse_rewards):
    rewards, values, mask = _random_batch(
        seed=hash((gamma, lam_actor, lam_critic, sparse_rewards)) % 2**31,
        lengths=LENGTHS,
        length=T,
        sparse_rewards=sparse_rewards,
    )
    advantages, returns = dual_lambda_gae(rewards, values, mask, gamma, lam_actor, lam_critic)
    ref_adv, ref_ret = reference_dual_lambda_gae(rewards, values, LENGTHS, gamma, lam_actor, lam_critic)

    assert advantages.shape == returns.shape == (len(LENGTHS), T)
    assert advantages.dtype == returns.dtype == torch.float32
    torch.testing.assert_close(advantages.double(), ref_adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(returns.double(), ref_ret, rtol=1e-5, atol=1e-5)
    # Zero outside the mask (exactly), even though rewards and values are non-zero there.
    assert torch.all(advantages[~mask] == 0)
    assert torch.all(returns[~mask] == 0)
    # The empty row is entirely zero.
    assert torch.all(advantages[0] == 0) and torch.all(returns[0] == 0)


def test_dual_lambda_gae_decoupled_lambdas_differ():
    """lam_actor drives advantages and lam_critic drives returns: swapping them must change each output."""
    rewards, values, mask = _random_batch(seed=3, lengths=[8, 6], length=8)
    adv_a, ret_a = dual_lambda_gae(rewards, values, mask, 1.0, 0.5, 1.0)
    adv_b, ret_b = dual_lambda_gae(rewards, values, mask, 1.0, 1.0, 0.5)
    # Advantages with λ=0.5 in (a) equal the λ=0.5 critic advantages in (b): returns_b - V.
    torch.testing.assert_close(adv_a, (ret_b - values) * mask)
    torch.testing.assert_close(adv_b, (ret_a - values) * mask)
    assert not torch.allclose(adv_a, adv_b)


def test_advantages_are_not_whitened():
    # A single non-zero reward on the last token, zero values: A_t = γ^(n-1-t) · r with λ = 1, not zero-mean.
    rewards = torch.zeros(2, 5)
    rewards[0, 4] = 3.0
    rewards[1, 2] = 3.0
    values = torch.zeros(2, 5)
    mask = _right_padded_mask([5, 3], 5)
    advantages, returns = dual_lambda_gae(rewards, values, mask, gamma=1.0, lam_actor=1.0, lam_critic=1.0)
    expected = torch.tensor([[3.0] * 5, [3.0, 3.0, 3.0, 0.0, 0.0]])
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected)


def test_terminal_state_bootstraps_zero_not_padding_value():
    """The value at the first padding position must not be bootstrapped from."""
    rewards = torch.tensor([[0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.25, 100.0]])  # position 2 is padding
    mask = torch.tensor([[1, 1, 0]])
    advantages, returns = dual_lambda_gae(rewards, values, mask, gamma=1.0, lam_actor=0.0, lam_critic=0.0)
    # δ_1 = 1 + 0 - 0.25 ; δ_0 = 0 + 0.25 - 0.5
    torch.testing.assert_close(advantages, torch.tensor([[-0.25, 0.75, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[0.25, 1.0, 0.0]]))


@pytest.mark.parametrize("mask_dtype", [torch.long, torch.int32, torch.float32, torch.float64])
def test_bool_and_numeric_masks_agree(mask_dtype):
    rewards, values, mask = _random_batch(seed=7, lengths=LENGTHS, length=T)
    adv_bool, ret_bool = dual_lambda_gae(rewards, values, mask, 0.9, 0.95, 1.0)
    adv_num, ret_num = dual_lambda_gae(rewards, values, mask.to(mask_dtype), 0.9, 0.95, 1.0)
    torch.testing.assert_close(adv_bool, adv_num, rtol=0, atol=0)
    torch.testing.assert_close(ret_bool, ret_num, rtol=0, atol=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_monte_carlo_identity(seed):
    """γ = λ_critic = 1: returns are the reverse cumulative sum of the rewards over valid tokens, whatever V is."""
    rewards, values, mask = _random_batch(seed=seed, lengths=LENGTHS, length=T)
    values = values * 50.0  # arbitrary, large values must cancel exactly
    _, returns = dual_lambda_gae(rewards, values, mask, gamma=1.0, lam_actor=0.3, lam_critic=1.0)
    masked_rewards = rewards.double() * mask
    expected = torch.flip(torch.cumsum(torch.flip(masked_rewards, [1]), 1), [1]) * mask
    torch.testing.assert_close(returns.double(), expected, rtol=1e-5, atol=1e-4)


def test_monte_carlo_identity_sparse_terminal_reward():
    """The VC-PPO setting: a single score on the last valid token is seen undecayed at every token."""
    lengths = [4, 6, 1]
    rewards = torch.zeros(3, 6)
    for b, n in enumerate(lengths):
        rewards[b, n - 1] = float(b + 1)
    values = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    mask = _right_padded_mask(lengths, 6)
    _, returns = dual_lambda_gae(rewards, values, mask, gamma=1.0, lam_actor=0.95, lam_critic=1.0)
    expected = torch.tensor([[1.0] * 4 + [0.0] * 2, [2.0] * 6, [3.0] + [0.0] * 5])
    torch.testing.assert_close(returns, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("gamma", [0.9, 1.0])
def test_lambda_zero_is_one_step_td(gamma):
    rewards, values, mask = _random_batch(seed=11, lengths=LENGTHS, length=T)
    advantages, returns = dual_lambda_gae(rewards, values, mask, gamma, lam_actor=0.0, lam_critic=0.0)
    next_values = torch.zeros_like(values)
    next_values[:, :-1] = values[:, 1:] * mask[:, 1:]
    td = (rewards + gamma * next_values - values) * mask
    torch.testing.assert_close(advantages, td, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(returns, ((rewards + gamma * next_values) * mask), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95, 1.0])
def test_gae_equals_dual_with_equal_lambdas(lam):
    rewards, values, mask = _random_batch(seed=5, lengths=LENGTHS, length=T)
    adv, ret = gae(rewards, values, mask, 0.9, lam)
    adv_d, ret_d = dual_lambda_gae(rewards, values, mask, 0.9, lam, lam)
    torch.testing.assert_close(adv, adv_d, rtol=0, atol=0)
    torch.testing.assert_close(ret, ret_d, rtol=0, atol=0)
    ref_adv, ref_ret = reference_dual_lambda_gae(rewards, values, LENGTHS, 0.9, lam, lam)
    torch.testing.assert_close(adv.double(), ref_adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret.double(), ref_ret, rtol=1e-5, atol=1e-5)


def test_bfloat16_inputs_computed_in_float32():
    # Long sequence where bf16 accumulation would visibly lose precision.
    length = 512
    rewards = torch.full((1, length), 0.01)
    values = torch.zeros(1, length)
    mask = torch.ones(1, length, dtype=torch.bool)
    adv, ret = dual_lambda_gae(rewards.bfloat16(), values.bfloat16(), mask, gamma=1.0, lam_actor=1.0, lam_critic=1.0)
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32
    # Compare to the float32 computation on the same (bf16-rounded) inputs.
    rewards_rounded = rewards.bfloat16().float()
    adv32, ret32 = dual_lambda_gae(rewards_rounded, values, mask, 1.0, 1.0, 1.0)
    torch.testing.assert_close(adv, adv32, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ret, ret32, rtol=1e-6, atol=1e-6)
    expected_first = float(rewards_rounded[0, 0]) * length
    assert ret[0, 0].item() == pytest.approx(expected_first, rel=1e-5)


def test_float64_inputs_give_float32_outputs_close_to_reference():
    rewards, values, mask = _random_batch(seed=13, lengths=LENGTHS, length=T, dtype=torch.float64)
    adv, ret = dual_lambda_gae(rewards, values, mask, 0.9, 0.95, 1.0)
    ref_adv, ref_ret = reference_dual_lambda_gae(rewards, values, LENGTHS, 0.9, 0.95, 1.0)
    torch.testing.assert_close(adv.double(), ref_adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret.double(), ref_ret, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("gamma", "lam_actor", "lam_critic", "name"),
    [
        (-0.1, 0.5, 0.5, "gamma"),
        (1.01, 0.5, 0.5, "gamma"),
        (1.0, -0.01, 0.5, "lam_actor"),
        (1.0, 1.5, 0.5, "lam_actor"),
        (1.0, 0.5, -1.0, "lam_critic"),
        (1.0, 0.5, 1.0001, "lam_critic"),
        (float("nan"), 0.5, 0.5, "gamma"),
    ],
)
def test_dual_lambda_gae_rejects_out_of_range(gamma, lam_actor, lam_critic, name):
    rewards, values, mask = _random_batch(seed=0, lengths=[3, 2], length=3)
    with pytest.raises(ValueError, match=name):
        dual_lambda_gae(rewards, values, mask, gamma, lam_actor, lam_critic)


@pytest.mark.parametrize("lam", [-0.5, 2.0])
def test_gae_rejects_out_of_range_lambda(lam):
    rewards, values, mask = _random_batch(seed=0, lengths=[3, 2], length=3)
    with pytest.raises(ValueError, match="lam"):
        gae(rewards, values, mask, 1.0, lam)


@pytest.mark.parametrize(
    ("r_shape", "v_shape", "m_shape"),
    [
        ((2, 3), (2, 4), (2, 3)),
        ((2, 3), (2, 3), (2, 4)),
        ((2, 3), (3, 3), (2, 3)),
        ((6,), (6,), (6,)),
        ((1, 2, 3), (1, 2, 3), (1, 2, 3)),
    ],
)
def test_dual_lambda_gae_rejects_bad_shapes(r_shape, v_shape, m_shape):
    with pytest.raises(ValueError, match="shape"):
        dual_lambda_gae(
            torch.zeros(r_shape), torch.zeros(v_shape), torch.ones(m_shape, dtype=torch.bool), 1.0, 0.9, 1.0
        )


# --------------------------------------------------------------------------------------------------------------------
# Masked statistics
# --------------------------------------------------------------------------------------------------------------------


def test_masked_mean():
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, -50.0, -50.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert masked_mean(values, mask).item() == pytest.approx(2.0)
    assert masked_mean(values, mask.long()).item() == pytest.approx(2.0)
    torch.testing.assert_close(masked_mean(values, mask, dim=1), torch.tensor([1.5, 3.0]))
    torch.testing.assert_close(masked_mean(values, mask, dim=0), torch.tensor([2.0, 2.0, 0.0]))
    # Empty mask: 0, not nan.
    assert masked_mean(values, torch.zeros_like(mask)).item() == 0.0


def test_masked_whiten():
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(4, 10, generator=gen) * 5.0 + 3.0
    values[:, 7:] = 1e4  # padding garbage must not affect the statistics
    mask = _right_padded_mask([7, 3, 7, 5], 10)
    whitened = masked_whiten(values, mask)
    valid = whitened[mask].double()
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert valid.var(unbiased=True).item() == pytest.approx(1.0, rel=1e-4)
    assert torch.all(whitened[~mask] == 0)
    # Order-preserving and affine in the masked values.
    raw = values[mask].double()
    expected = (raw - raw.mean()) / raw.std()
    torch.testing.assert_close(valid, expected, rtol=1e-4, atol=1e-4)


def test_masked_whiten_without_mean_shift_keeps_mean():
    gen = torch.Generator().manual_seed(1)
    values = torch.randn(3, 6, generator=gen) * 2.0 + 4.0
    mask = _right_padded_mask([6, 4, 2], 6)
    whitened = masked_whiten(values, mask, shift_mean=False)
    raw = values[mask].double()
    valid = whitened[mask].double()
    assert valid.mean().item() == pytest.approx(raw.mean().item(), rel=1e-4)
    assert torch.all(whitened[~mask] == 0)


def test_explained_variance_perfect_and_mean_predictions():
    gen = torch.Generator().manual_seed(0)
    returns = torch.randn(4, 8, generator=gen)
    mask = _right_padded_mask([8, 5, 3, 6], 8)
    values_garbage_padding = returns.clone()
    values_garbage_padding[~mask] = 123.0
    assert explained_variance(values_garbage_padding, returns, mask) == pytest.approx(1.0, abs=1e-9)
    mean = returns[mask].mean()
    assert explained_variance(torch.full_like(returns, mean.item()), returns, mask) == pytest.approx(0.0, abs=1e-6)
    # Predicting the negated returns is worse than the mean.
    assert explained_variance(-returns, returns, mask) < 0


def test_explained_variance_constant_targets_is_nan():
    returns = torch.full((2, 5), -1.0)
    values = torch.randn(2, 5, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 5, dtype=torch.bool)
    assert math.isnan(explained_variance(values, returns, mask))
    # Constant over the mask, even if padding differs.
    returns[1, 3:] = 7.0
    mask[1, 3:] = False
    assert math.isnan(explained_variance(values, returns, mask))


def test_explained_variance_over_whole_batch_not_per_row():
    """Predicting each row's mean explains the between-row variance: batch-level EV > 0, per-row EVs would be 0."""
    gen = torch.Generator().manual_seed(0)
    offsets = torch.tensor([[-5.0], [0.0], [5.0]])
    returns = torch.randn(3, 6, generator=gen) + offsets
    mask = torch.ones(3, 6, dtype=torch.bool)
    values = returns.mean(dim=1, keepdim=True).expand_as(returns)

    targets = returns.flatten().double()
    residual = (returns - values).flatten().double()
    expected = 1.0 - residual.var().item() / targets.var().item()
    per_row = [
        1.0 - (returns[i] - values[i]).double().var().item() / returns[i].double().var().item() for i in range(3)
    ]
    assert sum(per_row) / 3 == pytest.approx(0.0, abs=1e-6)
    assert expected > 0.8
    assert explained_variance(values, returns, mask) == pytest.approx(expected, rel=1e-9)


def test_position_correlation_signs():
    mask = _right_padded_mask([10, 6, 8], 10)
    positions = torch.arange(10, dtype=torch.float32).expand(3, 10)
    increasing = 0.5 * positions - 2.0
    decreasing = -3.0 * positions + 1.0
    # Padding must be ignored: make it anti-correlated garbage.
    increasing = torch.where(mask, increasing, torch.tensor(-1e3))
    decreasing = torch.where(mask, decreasing, torch.tensor(1e3))
    assert position_correlation(increasing, mask) == pytest.approx(1.0, abs=1e-9)
    assert position_correlation(decreasing, mask) == pytest.approx(-1.0, abs=1e-9)
    noise = torch.randn(3, 10, generator=torch.Generator().manual_seed(0))
    assert abs(position_correlation(noise, mask)) < 0.5
    assert math.isnan(position_correlation(torch.ones(3, 10), mask))


def test_non_finite_padding_does_not_leak_into_valid_tokens():
    rewards = torch.tensor([[0.0, 1.0, float("nan"), float("inf")]])
    values = torch.tensor([[0.5, 0.2, float("nan"), -float("inf")]])
    mask = torch.tensor([[1, 1, 0, 0]])
    advantages, returns = dual_lambda_gae(rewards, values, mask, gamma=1.0, lam_actor=0.95, lam_critic=1.0)
    assert torch.isfinite(advantages).all() and torch.isfinite(returns).all()
    assert returns[0, :2].tolist() == [1.0, 1.0]


# ----------------------------------------------------------- long sequences: the chunked scan


def _reference_per_row_lambda(rewards, values, lengths, gamma, lam_actor_rows, lam_critic):
    adv = torch.zeros_like(rewards, dtype=torch.float64)
    ret = torch.zeros_like(rewards, dtype=torch.float64)
    for b in range(rewards.shape[0]):
        a, r = reference_dual_lambda_gae(
            rewards[b : b + 1], values[b : b + 1], lengths[b : b + 1], gamma, float(lam_actor_rows[b]), lam_critic
        )
        adv[b], ret[b] = a[0], r[0]
    return adv, ret


@pytest.mark.parametrize("length", [1, 63, 64, 65, 300, 4097 + 64 * 3])
@pytest.mark.parametrize("gamma, lam_actor, lam_critic", [(1.0, 0.95, 1.0), (0.9, 0.0, 0.5), (1.0, 1.0, 0.0)])
def test_chunked_scan_matches_reference_on_long_sequences(length, gamma, lam_actor, lam_critic):
    generator = torch.Generator().manual_seed(length)
    lengths = torch.tensor([length, 0, max(1, length // 3), max(1, length - 5)])
    rewards = torch.randn(4, length, generator=generator, dtype=torch.float64) * 0.1
    values = torch.randn(4, length, generator=generator, dtype=torch.float64)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    expected_adv, expected_ret = reference_dual_lambda_gae(rewards, values, lengths, gamma, lam_actor, lam_critic)
    adv, ret = dual_lambda_gae(rewards.float(), values.float(), mask, gamma, lam_actor, lam_critic)
    scale = max(1.0, float(expected_ret.abs().max()), float(expected_adv.abs().max()))
    assert (adv.double() - expected_adv).abs().max() <= 1e-5 * scale
    assert (ret.double() - expected_ret).abs().max() <= 1e-5 * scale


def test_per_sequence_lambda():
    lengths = torch.tensor([200, 150, 7, 0])
    length = 200
    generator = torch.Generator().manual_seed(0)
    rewards = torch.randn(4, length, generator=generator, dtype=torch.float64)
    values = torch.randn(4, length, generator=generator, dtype=torch.float64)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    lam_rows = torch.tensor([0.995, 0.9, 0.0, 1.0])
    expected_adv, expected_ret = _reference_per_row_lambda(rewards, values, lengths, 1.0, lam_rows, 1.0)
    adv, ret = dual_lambda_gae(rewards.float(), values.float(), mask, 1.0, lam_rows, 1.0)
    assert torch.allclose(adv.double(), expected_adv, atol=1e-4)
    assert torch.allclose(ret.double(), expected_ret, atol=1e-4)


def test_per_sequence_lambda_is_validated():
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="shape"):
        dual_lambda_gae(torch.zeros(2, 3), torch.zeros(2, 3), mask, 1.0, torch.tensor([0.9]), 1.0)
    with pytest.raises(ValueError, match="lam_actor"):
        dual_lambda_gae(torch.zeros(2, 3), torch.zeros(2, 3), mask, 1.0, torch.tensor([0.9, 1.5]), 1.0)


def test_mask_must_be_right_padded():
    mask = torch.tensor([[1, 0, 1]])
    with pytest.raises(ValueError, match="right-padded"):
        dual_lambda_gae(torch.zeros(1, 3), torch.zeros(1, 3), mask, 1.0, 0.95, 1.0)


def test_monte_carlo_identity_at_16k_tokens():
    generator = torch.Generator().manual_seed(1)
    rewards = torch.randn(2, 16384, generator=generator)
    mask = torch.ones(2, 16384, dtype=torch.bool)
    values = torch.randn(2, 16384, generator=generator)
    _, returns = dual_lambda_gae(rewards, values, mask, 1.0, 0.95, 1.0)
    expected = rewards.double().flip(1).cumsum(1).flip(1)
    assert (returns.double() - expected).abs().max() <= 1e-5 * max(1.0, float(expected.abs().max()))


def test_masked_whiten_over_processes_equals_whitening_the_whole_batch():
    """Global whitening: each process whitens its share with the statistics of all shares (all_reduce = sum)."""
    import threading

    gen = torch.Generator().manual_seed(3)
    values = torch.randn(6, 9, generator=gen) * 3.0 + 2.0
    values[:3] += 5.0  # the shares have different means: per-share whitening would differ
    mask = _right_padded_mask([9, 2, 5, 7, 1, 8], 9)
    values[~mask] = float("nan")  # padding garbage
    shares = [(values[:3], mask[:3]), (values[3:], mask[3:])]
    barrier = threading.Barrier(2)
    slots: list = [None, None]
    results: list = [None, None]

    def run(rank):
        def all_reduce(t):
            slots[rank] = t.clone()
            barrier.wait()
            total = slots[0] + slots[1]
            barrier.wait()
            return total

        results[rank] = masked_whiten(*shares[rank], all_reduce=all_reduce)

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = masked_whiten(torch.nan_to_num(values), mask)
    torch.testing.assert_close(torch.cat(results), expected, rtol=1e-5, atol=1e-5)
    local = masked_whiten(torch.nan_to_num(values[:3]), mask[:3])
    assert not torch.allclose(local, expected[:3], atol=1e-2)


def test_explained_variance_nan_when_returns_vary_only_by_tiny_amounts():
    """Equal scores, returns that differ only by small KL penalties (std 0.02): nothing to explain, not −250."""
    gen = torch.Generator().manual_seed(0)
    mask = _right_padded_mask([16, 12, 9, 16, 5, 14, 16, 7], 16)
    returns = -1.0 + 0.02 * torch.randn(8, 16, generator=gen)
    values = 0.3 * torch.randn(8, 16, generator=gen)
    targets, residual = returns[mask].double(), (returns - values)[mask].double()
    assert 1.0 - residual.var() / targets.var() < -100  # what the unguarded ratio gives
    assert math.isnan(explained_variance(values, returns, mask))
    # Float-level wiggle on constant returns (λ < 1 bootstrapping with equal scores): also nan, never ~ −3e5.
    assert math.isnan(explained_variance(values, -1.0 + 1e-3 * torch.randn(8, 16, generator=gen), mask))
    # Returns near 0 (0/1 rewards, all wrong, small KL): the scale is at least 1.
    assert math.isnan(explained_variance(values, 0.01 * torch.randn(8, 16, generator=gen), mask))


def test_explained_variance_kept_when_outcomes_differ():
    """One response of 16 scored differently is a real signal: the metric stays a finite number."""
    mask = torch.ones(16, 20, dtype=torch.bool)
    returns = torch.full((16, 20), -1.0)
    returns[3] = 1.0
    values = torch.zeros(16, 20)
    assert explained_variance(values, returns, mask) == pytest.approx(0.0, abs=1e-9)  # a constant guess explains none
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    # With a smaller tolerance the tiny-variation case is computed as before.
    gen = torch.Generator().manual_seed(1)
    small = 0.001 * torch.randn(16, 20, generator=gen)
    assert math.isfinite(explained_variance(small, small * 2, mask, min_relative_std=1e-4))


# ------------------------------------------------------------------------------------------------ window bootstrap


def _reference_bootstrapped(rewards, values, bootstrap, gamma, lam):
    """A^λ of ONE cut sequence: the value after its last token is `bootstrap` instead of 0 (extended GAE)."""
    n = len(rewards)
    advantages, running = [0.0] * n, 0.0
    for t in reversed(range(n)):
        next_value = values[t + 1] if t + 1 < n else bootstrap
        running = rewards[t] + gamma * next_value - values[t] + gamma * lam * running
        advantages[t] = running
    return advantages


@pytest.mark.parametrize("gamma,lam_actor,lam_critic", [(1.0, 0.95, 1.0), (0.99, 0.9, 0.97), (1.0, 0.0, 1.0)])
def test_bootstrap_values_replace_the_terminal_zero_after_a_cut(gamma, lam_actor, lam_critic):
    lengths, length = [5, 1, 0, 7, 3], 7
    rewards, values, mask = _random_batch(11, lengths, length, sparse_rewards=True)
    bootstrap = torch.tensor([0.7, -0.3, 5.0, 0.0, 1.5])
    adv, ret = dual_lambda_gae(rewards, values, mask, gamma, lam_actor, lam_critic, bootstrap_values=bootstrap)
    for b, n in enumerate(lengths):
        r, v = rewards[b, :n].double().tolist(), values[b, :n].double().tolist()
        expected_adv = _reference_bootstrapped(r, v, float(bootstrap[b]), gamma, lam_actor)
        expected_ret = [
            a + x for a, x in zip(_reference_bootstrapped(r, v, float(bootstrap[b]), gamma, lam_critic), v)
        ]
        torch.testing.assert_close(
            adv[b, :n].double(), torch.tensor(expected_adv, dtype=torch.float64), atol=1e-5, rtol=0
        )
        torch.testing.assert_close(
            ret[b, :n].double(), torch.tensor(expected_ret, dtype=torch.float64), atol=1e-5, rtol=0
        )
    assert not adv[~mask].any() and not ret[~mask].any()


def test_zero_bootstrap_is_the_terminal_state_bit_for_bit():
    rewards, values, mask = _random_batch(3, [4, 6, 2], 6)
    plain = dual_lambda_gae(rewards, values, mask, 1.0, 0.95, 1.0)
    zero = dual_lambda_gae(rewards, values, mask, 1.0, 0.95, 1.0, bootstrap_values=torch.zeros(3))
    assert all(torch.equal(a, b) for a, b in zip(plain, zero))
    with pytest.raises(ValueError, match=r"bootstrap_values must have shape \[B\] = \[3\]"):
        dual_lambda_gae(rewards, values, mask, 1.0, 0.95, 1.0, bootstrap_values=torch.zeros(2))


def test_last_valid_values_is_t_ppo_stand_in_for_the_value_after_the_cut():
    from vcppo_trl.algo.gae import last_valid_values

    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [9.0, 9.0, 9.0]])
    mask = _right_padded_mask([3, 1, 0], 3)
    assert last_valid_values(values, mask).tolist() == [3.0, 4.0, 0.0]
    # γ = 1, no reward in the window: the last token's δ is V(s_{l−1}) − V(s_{l−1}) = 0.
    adv, _ = dual_lambda_gae(torch.zeros(3, 3), values, mask, 1.0, 0.95, 1.0, last_valid_values(values, mask))
    assert adv[0, 2] == 0 and adv[1, 0] == 0


# ------------------------------------------------------------------------------------------- action mask (issue 48)


def _tool_block_batch(seed, lengths, length, blocks=3, max_block=12):
    """Right-padded batch with tool blocks inside each row (at its start, middle or end alike); rewards only on the
    policy's tokens; NaN in values on tool tokens and NaN/inf on padding, which must not leak."""
    gen = torch.Generator().manual_seed(seed)
    rewards, values, mask = _random_batch(seed, lengths, length, sparse_rewards=True)
    actions = mask.clone()
    for b, n in enumerate(lengths):
        for _ in range(blocks if n else 0):
            start = int(torch.randint(0, n, (1,), generator=gen))
            actions[b, start : min(n, start + int(torch.randint(1, max_block + 1, (1,), generator=gen)))] = False
    rewards = torch.where(actions, rewards, 0.0)
    values = torch.where(actions | ~mask, values, float("nan"))
    rewards[~mask], values[~mask] = float("inf"), float("nan")
    return rewards, values, mask, actions


def _lambda_of(lam, b):
    return float(lam[b]) if isinstance(lam, torch.Tensor) else lam


def reference_over_actions(rewards, values, actions, gamma, lam_actor, lam_critic, bootstrap=None):
    """Plain Python loop: GAE over each row's policy tokens alone (the compressed sequence), written back; 0 elsewhere."""
    adv = torch.zeros(rewards.shape, dtype=torch.float64)
    ret = torch.zeros(rewards.shape, dtype=torch.float64)
    for b in range(rewards.shape[0]):
        idx = actions[b].nonzero().flatten().tolist()
        r = [float(rewards[b, t]) for t in idx]
        v = [float(values[b, t]) for t in idx]
        end = 0.0 if bootstrap is None else float(bootstrap[b])
        a_actor = _reference_bootstrapped(r, v, end, gamma, _lambda_of(lam_actor, b))
        a_critic = _reference_bootstrapped(r, v, end, gamma, _lambda_of(lam_critic, b))
        for i, t in enumerate(idx):
            adv[b, t], ret[b, t] = a_actor[i], a_critic[i] + v[i]
    return adv, ret


def reference_plain_masking(rewards, values, mask, actions, gamma, lam_actor, lam_critic):
    """Plain Python loop over every valid token, rewards and values zeroed off the action mask (OpenRLHF's way)."""
    zeroed_r = torch.where(actions, rewards, 0.0)
    zeroed_v = torch.where(actions, values, 0.0)
    adv = torch.zeros(rewards.shape, dtype=torch.float64)
    ret = torch.zeros(rewards.shape, dtype=torch.float64)
    for b in range(rewards.shape[0]):
        n = int(mask[b].sum())
        r, v = zeroed_r[b, :n].double().tolist(), zeroed_v[b, :n].double().tolist()
        a_actor = _reference_lambda_returns(r, v, gamma, _lambda_of(lam_actor, b))
        a_critic = _reference_lambda_returns(r, v, gamma, _lambda_of(lam_critic, b))
        for t in range(n):
            if actions[b, t]:
                adv[b, t], ret[b, t] = a_actor[t], a_critic[t] + v[t]
    return adv, ret


ACTION_LENGTHS = [0, 150, 1, 7, 150, 64, 65, 90, 3]  # an empty row, full rows, rows across a scan chunk boundary


@pytest.mark.parametrize("gamma", [0.97, 1.0])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("with_bootstrap", [False, True])
def test_action_mask_skip_equals_the_scan_over_the_compressed_sequence(gamma, seed, with_bootstrap):
    rewards, values, mask, actions = _tool_block_batch(seed, ACTION_LENGTHS, 150)
    actions[3, :] = False  # a row with no policy token at all
    actions[4, 140:] = False  # a row that ends in a tool block: the bootstrap comes after its last policy token
    rewards = torch.where(actions | ~mask, rewards, 0.0)
    values = torch.where(actions | ~mask, values, float("nan"))
    gen = torch.Generator().manual_seed(seed + 100)
    batch = len(ACTION_LENGTHS)
    lam_actor = torch.rand(batch, generator=gen)  # per row (length-adaptive λ)
    lam_critic = 0.8 + 0.2 * torch.rand(batch, generator=gen)
    bootstrap = torch.randn(batch, generator=gen) if with_bootstrap else None
    advantages, returns = dual_lambda_gae(
        rewards, values, mask, gamma, lam_actor, lam_critic, bootstrap_values=bootstrap, action_mask=actions
    )
    ref_adv, ref_ret = reference_over_actions(rewards, values, actions, gamma, lam_actor, lam_critic, bootstrap)
    assert advantages.dtype == returns.dtype == torch.float32
    torch.testing.assert_close(advantages.double(), ref_adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(returns.double(), ref_ret, rtol=1e-5, atol=1e-5)
    # Exactly 0 on tool tokens and padding (where the inputs are NaN or inf), and every policy token is finite.
    assert not advantages[~actions].any() and not returns[~actions].any()
    assert torch.isfinite(advantages).all() and torch.isfinite(returns).all()
    # Single-λ GAE takes the same mask.
    single = gae(rewards, values, mask, gamma, 0.9, bootstrap_values=bootstrap, action_mask=actions.long())
    ref_single = reference_over_actions(rewards, values, actions, gamma, 0.9, 0.9, bootstrap)
    for got, expected in zip(single, ref_single):
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gamma", [0.97, 1.0])
def test_action_mask_plain_equals_the_scan_through_zeroed_tool_tokens(gamma):
    rewards, values, mask, actions = _tool_block_batch(2, ACTION_LENGTHS, 150)
    lam_actor = torch.linspace(0.5, 1.0, len(ACTION_LENGTHS))
    advantages, returns = dual_lambda_gae(
        rewards, values, mask, gamma, lam_actor, 0.95, action_mask=actions, action_mask_mode="plain"
    )
    ref_adv, ref_ret = reference_plain_masking(rewards, values, mask, actions, gamma, lam_actor, 0.95)
    torch.testing.assert_close(advantages.double(), ref_adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(returns.double(), ref_ret, rtol=1e-5, atol=1e-5)
    assert not advantages[~actions].any() and not returns[~actions].any()
    # The two modes differ as soon as a tool block sits between policy tokens.
    skipped, _ = dual_lambda_gae(rewards, values, mask, gamma, lam_actor, 0.95, action_mask=actions)
    assert not torch.allclose(skipped, advantages, atol=1e-3)


def _pre_issue_dual_lambda_gae(rewards, values, mask, gamma, lam_actor, lam_critic, bootstrap=None):
    """The computation of `dual_lambda_gae` before `action_mask` existed, op for op (frozen here)."""
    from vcppo_trl.algo.gae import reverse_discounted_cumsum

    valid = mask.bool()
    batch = rewards.shape[0]
    rewards = torch.where(valid, rewards.float(), 0.0)
    values = torch.where(valid, values.float(), 0.0)
    next_values = torch.nn.functional.pad(values[:, 1:], (0, 1))
    if bootstrap is not None:
        lengths = valid.sum(1)
        at_last = torch.zeros(valid.shape, dtype=torch.float32)
        at_last[torch.arange(batch), (lengths - 1).clamp(min=0)] = torch.where(lengths > 0, bootstrap.float(), 0.0)
        next_values = next_values + at_last
    deltas = rewards + gamma * next_values - values
    decay = torch.cat(
        [
            (gamma * torch.as_tensor(lam, dtype=torch.float64)).expand(batch).contiguous()
            for lam in (lam_actor, lam_critic)
        ]
    )
    both = reverse_discounted_cumsum(torch.cat([deltas, deltas]), decay)
    return both[:batch] * valid.float(), (both[batch:] + values) * valid.float()


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("with_bootstrap", [False, True])
def test_no_action_mask_is_bit_identical_to_the_code_before_it(per_row, with_bootstrap):
    lengths = [300, 0, 1, 257, 64, 199]
    rewards, values, mask = _random_batch(9, lengths, 300, sparse_rewards=True)
    lam_actor = torch.linspace(0.3, 1.0, len(lengths)) if per_row else 0.95
    bootstrap = torch.randn(len(lengths), generator=torch.Generator().manual_seed(1)) if with_bootstrap else None
    for gamma in (0.99, 1.0):
        before = _pre_issue_dual_lambda_gae(rewards, values, mask, gamma, lam_actor, 1.0, bootstrap)
        now = dual_lambda_gae(rewards, values, mask, gamma, lam_actor, 1.0, bootstrap_values=bootstrap)
        explicit = dual_lambda_gae(
            rewards, values, mask, gamma, lam_actor, 1.0, bootstrap_values=bootstrap, action_mask=None
        )
        for old, new, none in zip(before, now, explicit):
            assert torch.equal(old, new) and torch.equal(old, none)


@pytest.mark.parametrize("gamma", [0.99, 1.0])
def test_a_256_token_tool_block_decays_the_next_turns_credit_only_in_plain_mode(gamma):
    """Turn 1 (4 tokens), a 256-token tool result, turn 2 (4 tokens) scored 1 at its end, V = 0: "skip" gives the
    first turn's last token (γλ)^4, as without the block; "plain" gives (γλ)^260, (γλ)^256 times less (≈ 2e-6 at γ = 1,
    λ = 0.95)."""
    lam = 0.95
    actions = torch.ones(1, 264, dtype=torch.bool)
    actions[0, 4:260] = False
    mask = torch.ones_like(actions)
    rewards = torch.zeros(1, 264)
    rewards[0, -1] = 1.0
    values = torch.zeros(1, 264)
    skip, _ = dual_lambda_gae(rewards, values, mask, gamma, lam, 1.0, action_mask=actions)
    plain, _ = dual_lambda_gae(rewards, values, mask, gamma, lam, 1.0, action_mask=actions, action_mask_mode="plain")
    without_block, _ = dual_lambda_gae(
        torch.zeros(1, 8).index_fill_(1, torch.tensor([7]), 1.0),
        torch.zeros(1, 8),
        torch.ones(1, 8, dtype=torch.bool),
        gamma,
        lam,
        1.0,
    )
    assert float(skip[0, 3]) == pytest.approx(float(without_block[0, 3]), rel=1e-6)
    assert float(skip[0, 3]) == pytest.approx((gamma * lam) ** 4, rel=1e-5)
    assert float(plain[0, 3]) / float(skip[0, 3]) == pytest.approx((gamma * lam) ** 256, rel=1e-3)
    if gamma == 1.0:
        assert float(plain[0, 3]) < 3e-6
    # The second turn is the same in both modes (nothing masked after it).
    torch.testing.assert_close(skip[0, 260:], plain[0, 260:])


@pytest.mark.parametrize("seed", [3, 4])
def test_with_gamma_and_lambda_critic_one_both_modes_give_the_monte_carlo_returns(seed):
    rewards, values, mask, actions = _tool_block_batch(seed, ACTION_LENGTHS, 150)
    lam_actor = torch.rand(len(ACTION_LENGTHS), generator=torch.Generator().manual_seed(seed))
    _, skip = dual_lambda_gae(rewards, values, mask, 1.0, lam_actor, 1.0, action_mask=actions)
    _, plain = dual_lambda_gae(
        rewards, values, mask, 1.0, lam_actor, 1.0, action_mask=actions, action_mask_mode="plain"
    )
    policy_rewards = torch.where(actions, rewards, 0.0).double()
    monte_carlo = torch.flip(torch.cumsum(torch.flip(policy_rewards, [1]), 1), [1]) * actions
    torch.testing.assert_close(skip.double(), monte_carlo, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(plain.double(), monte_carlo, rtol=1e-5, atol=1e-4)


def test_action_mask_errors():
    rewards, values, mask, actions = _tool_block_batch(5, [6, 4, 0], 6)
    rewards, values = torch.where(mask, rewards, 0.0), torch.where(actions, values, 0.0)

    def call(**kwargs):
        return dual_lambda_gae(rewards, values, mask, 1.0, 0.95, 1.0, **kwargs)

    for mode in ("carry", "SKIP", None):
        with pytest.raises(ValueError, match=r"action_mask_mode must be one of \('skip', 'plain'\)"):
            call(action_mask=actions, action_mask_mode=mode)
    with pytest.raises(ValueError, match="action_mask_mode must be one of"):
        call(action_mask_mode="carry")  # refused with no mask too
    with pytest.raises(ValueError, match=r"action_mask must have the \[B, T\] shape \(3, 6\), got \(3, 5\)"):
        call(action_mask=actions[:, :5])
    padded_policy_token = actions.clone()
    padded_policy_token[1, 5] = True  # row 1 has 4 valid tokens
    for mode in ("skip", "plain"):
        with pytest.raises(ValueError, match="outside response_mask"):
            call(action_mask=padded_policy_token, action_mask_mode=mode)
    tool = (mask & ~actions).nonzero()[0]
    for bad in (1.0, float("nan")):
        on_tool = rewards.clone()
        on_tool[tool[0], tool[1]] = bad
        for mode in ("skip", "plain"):
            with pytest.raises(ValueError, match="A reward sits on a token outside action_mask"):
                dual_lambda_gae(on_tool, values, mask, 1.0, 0.95, 1.0, action_mask=actions, action_mask_mode=mode)
    # Nonzero rewards on padding stay ignored, as without a mask.
    padded_reward = rewards.clone()
    padded_reward[1, 5] = 7.0
    for got, expected in zip(
        call(action_mask=actions), dual_lambda_gae(padded_reward, values, mask, 1.0, 0.95, 1.0, action_mask=actions)
    ):
        assert torch.equal(got, expected)


def test_masked_whiten_takes_its_statistics_from_a_subset():
    values = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 5.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    stats = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0]], dtype=torch.bool)
    out = masked_whiten(values, mask, stats_mask=stats)
    subset = torch.tensor([1.0, 2.0, 3.0])
    expected = (values - subset.mean()) * torch.rsqrt(subset.var() + 1e-8) * mask
    assert torch.allclose(out, expected)
    assert torch.equal(masked_whiten(values, mask, stats_mask=mask), masked_whiten(values, mask))

"""`vtrace_returns`: V-trace targets (IMPALA) over the policy's tokens, against a float64 loop written from the paper's
recursion, and against GAE's λ = 1 returns when nothing is stale."""

from __future__ import annotations

import math

import pytest
import torch

from vcppo_trl.algo import dual_lambda_gae, vtrace_returns

pytestmark = pytest.mark.fast


def reference(rewards, values, mask, log_ratio, *, gamma, rho_bar, c_bar, bootstrap=None) -> torch.Tensor:
    """The paper's recursion, one row and one token at a time, over the masked tokens only (float64 Python floats)."""
    out = torch.zeros(rewards.shape, dtype=torch.float64)
    for b in range(rewards.shape[0]):
        steps = [t for t in range(rewards.shape[1]) if mask[b, t]]
        after = 0.0 if bootstrap is None else float(bootstrap[b])
        v_next, target_next = after, after  # the state after the last token: v − V = 0
        for t in reversed(steps):
            ratio = math.exp(float(log_ratio[b, t]))
            rho, c = min(rho_bar, ratio), min(c_bar, ratio)
            value = float(values[b, t])
            delta = float(rewards[b, t]) + gamma * v_next - value
            target = value + rho * delta + gamma * c * (target_next - v_next)
            out[b, t] = target
            v_next, target_next = value, target
    return out


def random_inputs(seed: int, batch: int = 5, length: int = 13):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, length + 1, (batch,), generator=generator)
    response = torch.arange(length)[None, :] < lengths[:, None]
    tools = torch.rand(batch, length, generator=generator) < 0.25  # tool tokens inside the response: skipped
    mask = response & ~tools
    rewards = torch.randn(batch, length, generator=generator, dtype=torch.float64) * mask
    values = torch.randn(batch, length, generator=generator, dtype=torch.float64)
    log_ratio = torch.randn(batch, length, generator=generator, dtype=torch.float64) * 0.7
    bootstrap = torch.randn(batch, generator=generator, dtype=torch.float64)
    return rewards, values, mask, log_ratio, bootstrap


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("gamma", "rho_bar", "c_bar"), [(1.0, 1.0, 1.0), (0.9, 2.0, 0.5), (0.97, 0.3, 1.5)])
@pytest.mark.parametrize("with_bootstrap", [False, True])
def test_vtrace_matches_the_papers_recursion_in_float64(seed, gamma, rho_bar, c_bar, with_bootstrap):
    rewards, values, mask, log_ratio, bootstrap = random_inputs(seed)
    bootstrap = bootstrap if with_bootstrap else None
    got = vtrace_returns(
        rewards, values, mask, log_ratio, gamma=gamma, rho_bar=rho_bar, c_bar=c_bar, bootstrap_values=bootstrap
    )
    want = reference(rewards, values, mask, log_ratio, gamma=gamma, rho_bar=rho_bar, c_bar=c_bar, bootstrap=bootstrap)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert bool((got[~mask] == 0).all())


def test_on_policy_vtrace_is_gaes_lambda_one_return_over_the_policys_tokens():
    """No staleness (log_ratio = 0, ρ̄ = c̄ = 1): the targets are GAE's returns at λ = 1, tool tokens skipped alike."""
    rewards, values, mask, _, bootstrap = random_inputs(7, batch=6, length=20)
    response = torch.ones_like(mask)
    response[:, 15:] = False
    mask = mask & response
    rewards = rewards * mask
    for gamma in (1.0, 0.95):
        got = vtrace_returns(
            rewards.float(),
            values.float(),
            mask,
            torch.zeros_like(values).float(),
            gamma=gamma,
            bootstrap_values=bootstrap.float(),
        )
        _, returns = dual_lambda_gae(
            rewards.float(),
            values.float(),
            response,
            gamma=gamma,
            lam_actor=0.95,
            lam_critic=1.0,
            bootstrap_values=bootstrap.float(),
            action_mask=mask,
        )
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, returns, rtol=1e-5, atol=1e-5)


def test_a_zero_trace_is_the_one_step_target_and_weights_above_the_bars_are_cut():
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.2, 0.5, 0.4]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    log_ratio = torch.log(torch.tensor([[3.0, 0.5, 2.0]], dtype=torch.float64))
    got = vtrace_returns(rewards, values, mask, log_ratio, rho_bar=1.0, c_bar=1e-12)
    # c ≈ 0: v_t = V_t + ρ_t δ_t with ρ = min(1, ratio) = (1, 0.5, 1).
    want = torch.tensor(
        [[0.2 + 1.0 * (0.5 - 0.2), 0.5 + 0.5 * (0.4 - 0.5), 0.4 + 1.0 * (1.0 - 0.4)]], dtype=torch.float64
    )
    torch.testing.assert_close(got, want, rtol=0, atol=1e-9)


def test_bad_inputs_are_refused_with_what_is_wrong():
    x = torch.zeros(2, 3)
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="same \\[B, T\\] shape"):
        vtrace_returns(x, x, mask, torch.zeros(2, 4))
    with pytest.raises(ValueError, match="rho_bar and c_bar must be > 0"):
        vtrace_returns(x, x, mask, x, rho_bar=0.0)
    with pytest.raises(ValueError, match="gamma must be in"):
        vtrace_returns(x, x, mask, x, gamma=1.5)
    with pytest.raises(ValueError, match="bootstrap_values must have shape"):
        vtrace_returns(x, x, mask, x, bootstrap_values=torch.zeros(3))

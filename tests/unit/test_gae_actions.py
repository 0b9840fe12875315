"""GAE over the policy's own tokens (issue 48): `action_mask` marks the policy's tokens; tool and environment tokens
inside a response are state, crossed with no γ or λ decay ("skip"), or zeroed and scanned through ("plain", OpenRLHF's
way, for comparison)."""

from __future__ import annotations

import pytest
import torch

from vcppo_trl.algo.gae import dual_lambda_gae, gae


def _batch(seed: int, batch: int = 6, length: int = 70, tool_blocks: int = 2):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    valid = torch.arange(length)[None] < lengths[:, None]
    actions = valid.clone()
    for b in range(batch):
        for _ in range(tool_blocks):
            start = int(torch.randint(0, length, (1,), generator=g))
            actions[b, start : start + int(torch.randint(1, 20, (1,), generator=g))] = False
    rewards = torch.randn(batch, length, generator=g) * actions
    values = torch.randn(batch, length, generator=g)
    return rewards, values, valid, actions


def _compressed_loop(rewards, values, actions, gamma, lam, bootstrap=None):
    """The reference: an ordinary GAE loop over each row's policy tokens alone, written back to their positions."""
    advantages = torch.zeros(rewards.shape, dtype=torch.float64)
    returns = torch.zeros(rewards.shape, dtype=torch.float64)
    for b in range(rewards.shape[0]):
        idx = actions[b].nonzero().flatten().tolist()
        row_lam = float(lam[b]) if isinstance(lam, torch.Tensor) else lam
        carry = 0.0
        for i in reversed(range(len(idx))):
            t = idx[i]
            next_value = (
                float(values[b, idx[i + 1]])
                if i + 1 < len(idx)
                else (0.0 if bootstrap is None else float(bootstrap[b]))
            )
            delta = float(rewards[b, t]) + gamma * next_value - float(values[b, t])
            carry = delta + gamma * row_lam * carry
            advantages[b, t] = carry
            returns[b, t] = carry + float(values[b, t])
    return advantages, returns


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gamma", [1.0, 0.97])
def test_skip_equals_the_scan_over_the_compressed_sequence(seed, gamma):
    rewards, values, valid, actions = _batch(seed)
    lam_actor = torch.rand(rewards.shape[0], generator=torch.Generator().manual_seed(seed)) * 0.5 + 0.5  # per row
    bootstrap = torch.randn(rewards.shape[0])
    for boot in (None, bootstrap):
        advantages, returns = dual_lambda_gae(
            rewards, values, valid, gamma, lam_actor, 1.0, bootstrap_values=boot, action_mask=actions
        )
        expected_advantages, _ = _compressed_loop(rewards, values, actions, gamma, lam_actor, boot)
        _, expected_returns = _compressed_loop(rewards, values, actions, gamma, 1.0, boot)
        torch.testing.assert_close(advantages.double(), expected_advantages, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(returns.double(), expected_returns, rtol=1e-5, atol=1e-5)
        assert not advantages[~actions].any() and not returns[~actions].any()
        single = gae(rewards, values, valid, gamma, 0.9, bootstrap_values=boot, action_mask=actions)
        reference = _compressed_loop(rewards, values, actions, gamma, 0.9, boot)
        torch.testing.assert_close(single[0].double(), reference[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(single[1].double(), reference[1], rtol=1e-5, atol=1e-5)


def test_an_all_ones_mask_gives_the_unmasked_results():
    """Every token the policy's: the same GAE (the scan may be cut into other chunks: equal to float rounding)."""
    rewards, values, valid, _ = _batch(3)
    rewards = rewards * valid
    plain = dual_lambda_gae(rewards, values, valid, 1.0, 0.95, 1.0)
    ones = dual_lambda_gae(rewards, values, valid, 1.0, 0.95, 1.0, action_mask=valid)
    torch.testing.assert_close(plain, ones, rtol=1e-6, atol=1e-6)


def test_a_long_tool_block_keeps_the_next_turns_credit_only_when_skipped():
    """A 256-token tool result between two turns: "skip" carries the final reward back to the first turn undecayed by
    the block; "plain" scales it by (γλ)^256 (≈ 2e-6 at λ 0.95) and loses the bootstrap before the block."""
    length = 4 + 256 + 4
    actions = torch.ones(1, length, dtype=torch.bool)
    actions[0, 4:260] = False
    valid = torch.ones_like(actions)
    rewards = torch.zeros(1, length)
    rewards[0, -1] = 1.0
    values = torch.zeros(1, length)
    skipped, _ = dual_lambda_gae(rewards, values, valid, 1.0, 0.95, 1.0, action_mask=actions)
    plain, _ = dual_lambda_gae(rewards, values, valid, 1.0, 0.95, 1.0, action_mask=actions, action_mask_mode="plain")
    assert float(skipped[0, 3]) == pytest.approx(0.95**4)  # 4 policy tokens after it: λ^4, the block not counted
    assert float(plain[0, 3]) == pytest.approx(0.95 ** (4 + 256), rel=1e-3)
    assert float(plain[0, 3]) < 3e-6
    assert not plain[~actions].any()


def test_with_gamma_and_lambda_critic_one_the_critics_targets_agree_in_both_modes():
    """Monte-Carlo returns (γ = λ = 1) sum the rewards ahead: skipping tool tokens or scanning through zeros gives the
    same targets on the policy's tokens."""
    rewards, values, valid, actions = _batch(4)
    _, skipped = dual_lambda_gae(rewards, values, valid, 1.0, 0.95, 1.0, action_mask=actions)
    _, plain = dual_lambda_gae(rewards, values, valid, 1.0, 0.95, 1.0, action_mask=actions, action_mask_mode="plain")
    torch.testing.assert_close(skipped, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r, v, m, a: (r, v, m, a[:, :-1]), "action_mask must have the"),
        (lambda r, v, m, a: (r, v, m, a | ~m), "outside response_mask"),
        (lambda r, v, m, a: (r + (m & ~a).float(), v, m, a), "A reward sits on a token outside action_mask"),
    ],
)
def test_bad_masks_and_rewards_on_tool_tokens_are_refused(change, message):
    rewards, values, valid, actions = change(*_batch(5))
    with pytest.raises(ValueError, match=message):
        dual_lambda_gae(rewards, values, valid, 1.0, 0.95, 1.0, action_mask=actions)


def test_an_unknown_mode_is_refused_with_the_choices():
    rewards, values, valid, actions = _batch(6)
    with pytest.raises(ValueError, match=r"action_mask_mode must be one of \('skip', 'plain'\)"):
        dual_lambda_gae(rewards, values, valid, 1.0, 0.95, 1.0, action_mask=actions, action_mask_mode="carry")

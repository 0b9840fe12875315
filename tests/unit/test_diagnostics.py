"""The stop-vs-continue advantage gap (`vcppo_trl.diagnostics`): the hand-computed cases of the stop-bias note, with the
package's own GAE, and the trainer's per-update metric."""

import math

import pytest
import torch

from vcppo_trl import PPOConfig, PPOTrainer
from vcppo_trl.algo.diagnostics import marker_token_ids, stop_advantage_gap, stop_positions
from vcppo_trl.algo.gae import gae

from ..builders import length_reward

L = 400  # ramp length of the note: b(t) = 1 − t/L, true values 0, reward 0


def ramp_batch(stop_at: int, lam: float):
    """Two responses under a critic V = −b(t): one stops at `stop_at` (its last token), one continues to L tokens."""
    b = 1.0 - torch.arange(L, dtype=torch.float32) / L
    mask = torch.zeros(2, L, dtype=torch.bool)
    mask[0, : stop_at + 1] = True
    mask[1, :] = True
    values = -b.expand(2, L) * mask
    advantages, _ = gae(torch.zeros(2, L), values, mask, gamma=1.0, lam=lam)
    return advantages, mask, torch.tensor([stop_at, -1])


# The note's table (stop-bias-mechanism.md, "Checked with vcppo_trl.gae.gae"): λ, stop at k, Â(stop), Â(continue), gap.
NOTE_TABLE = [
    (0.95, 10, 0.975, 0.050, 0.925),
    (0.95, 100, 0.750, 0.050, 0.700),
    (0.95, 300, 0.250, 0.050, 0.200),
    (0.99, 10, 0.975, 0.245, 0.730),
]


@pytest.mark.parametrize("lam, k, a_stop, a_continue, expected_gap", NOTE_TABLE)
def test_gap_matches_the_notes_hand_computed_table(lam, k, a_stop, a_continue, expected_gap):
    advantages, mask, stops = ramp_batch(k, lam)
    assert float(advantages[0, k]) == pytest.approx(a_stop, abs=1e-3)
    assert float(advantages[1, k]) == pytest.approx(a_continue, abs=1e-3)
    # One bucket per position: the stop at k is compared with continuing at exactly k.
    result = stop_advantage_gap(advantages, mask, stops, num_buckets=L)
    assert result.gap == pytest.approx(expected_gap, abs=1e-3)
    # Closed form: b(k) − the λ-discounted share (1/L)(1 − λ^(L−k))/(1 − λ) of the ramp's decrease.
    share = (1 / L) * (1 - lam ** (L - k)) / (1 - lam)
    assert result.gap == pytest.approx((1 - k / L) - share, abs=1e-5)
    assert float(result.bucket_gaps[k]) == pytest.approx(result.gap, abs=1e-9)
    assert int(result.stop_counts.sum()) == 1 and int(result.stop_counts[k]) == 1
    # Every other bucket has continue tokens but no stop: nan.
    assert int(torch.isnan(result.bucket_gaps).sum()) == L - 1


@pytest.mark.parametrize("k", [10, 100, 300])
def test_gap_is_zero_at_lambda_one(k):
    """λ = 1: the bias telescopes, stopping and continuing at the same position get the same b(k)."""
    advantages, mask, stops = ramp_batch(k, lam=1.0)
    assert float(advantages[0, k]) == pytest.approx(1 - k / L, abs=1e-5)
    assert stop_advantage_gap(advantages, mask, stops, num_buckets=L).gap == pytest.approx(0.0, abs=1e-5)


def test_gap_shrinks_as_lambda_grows():
    gaps = [stop_advantage_gap(*ramp_batch(10, lam), num_buckets=L).gap for lam in (0.9, 0.95, 0.99, 1.0)]
    assert gaps[0] > gaps[1] > gaps[2] > gaps[3]


def test_buckets_and_token_kinds_hand_computed():
    """4 positions, 2 buckets of 2 positions. Stop tokens: row 0 at 1, row 1 at 2. Continue tokens: those before the
    stop (row 0: 0; row 1: 0, 1) and every token of row 2 (no stop). Row 0's tokens after its stop (the answer) and the
    padding count for neither."""
    advantages = torch.tensor(
        [
            [1.0, 5.0, 100.0, 100.0],  # stop at 1, then an answer token (100) and padding (100)
            [2.0, 4.0, 9.0, 0.0],  # stop at 2
            [3.0, 0.0, 1.0, 3.0],  # never stops (cut at the length limit)
        ]
    )
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
    stops = torch.tensor([1, 2, -1])
    result = stop_advantage_gap(advantages, mask, stops, num_buckets=2)
    # Bucket 0 (positions 0, 1): stop 5; continue 1, 2, 4, 3, 0 -> mean 2. Gap 3.
    # Bucket 1 (positions 2, 3): stop 9; continue 1, 3 -> mean 2. Gap 7.
    assert result.bucket_gaps.tolist() == [3.0, 7.0]
    assert result.stop_counts.tolist() == [1, 1]
    assert result.gap == 5.0
    # The same with max_length = 8: every position falls in bucket 0 of 2; stop mean 7, continue mean 2.
    wide = stop_advantage_gap(advantages, mask, stops, num_buckets=2, max_length=8)
    assert wide.bucket_gaps[0].item() == pytest.approx(7 - 14 / 7) and math.isnan(wide.bucket_gaps[1])
    assert wide.gap == pytest.approx(7 - 14 / 7)


def test_overall_gap_weights_buckets_by_their_stops():
    advantages = torch.tensor([[0.0, 4.0], [0.0, 4.0], [0.0, 0.0], [1.0, 1.0]])
    mask = torch.ones(4, 2)
    stops = torch.tensor([0, 0, 1, -1])  # two stops in bucket 0 (advantage 0), one in bucket 1 (advantage 0)
    result = stop_advantage_gap(advantages, mask, stops, num_buckets=2)
    # Bucket 0: continue tokens only row 2 at 0 (0) and row 3 at 0 (1) -> mean 0.5, gap −0.5 (two stops).
    # Bucket 1: continue tokens row 3 at 1 (1) -> gap −1 (one stop). Overall (2·−0.5 + 1·−1) / 3.
    assert result.bucket_gaps.tolist() == [-0.5, -1.0]
    assert result.gap == pytest.approx(-2 / 3)


def test_gap_is_nan_without_stops_or_without_continue_tokens():
    advantages, mask = torch.ones(2, 3), torch.ones(2, 3)
    assert math.isnan(stop_advantage_gap(advantages, mask, torch.tensor([-1, -1])).gap)
    assert math.isnan(stop_advantage_gap(advantages, mask, torch.tensor([0, 0]), num_buckets=3).gap)
    with pytest.raises(ValueError, match="stop_positions"):
        stop_advantage_gap(advantages, mask, torch.tensor([0]))


class TestStopPositions:
    def test_marker_fallback_and_none(self):
        ids = torch.tensor(
            [
                [5, 7, 8, 9, 7, 8, 1],  # marker (7, 8) first at 1
                [5, 6, 6, 1, 0, 0, 0],  # no marker, stopped: its stop token at 3
                [5, 6, 6, 6, 6, 6, 6],  # no marker, no stop (length limit)
                [5, 6, 7, 1, 7, 8, 0],  # the marker only in padding (ids after the stop): not found
                [7, 8, 6, 6, 6, 6, 6],  # marker at 0, never stopped
            ]
        )
        mask = torch.tensor(
            [[1] * 7, [1, 1, 1, 1, 0, 0, 0], [1] * 7, [1, 1, 1, 1, 0, 0, 0], [1] * 7], dtype=torch.bool
        )
        has_stop = torch.tensor([True, True, False, True, False])
        assert stop_positions(ids, mask, [7, 8], has_stop).tolist() == [1, 3, -1, 3, 0]
        assert stop_positions(ids, mask, None, has_stop).tolist() == [6, 3, -1, 3, -1]
        # A single-token marker; no has_stop: every non-empty response stops at its last token.
        assert stop_positions(ids, mask, [9]).tolist() == [3, 3, 6, 3, 6]
        empty = torch.zeros(1, 7, dtype=torch.bool)
        assert stop_positions(ids[:1], empty, [7, 8]).tolist() == [-1]

    def test_marker_token_ids_with_the_toy_tokenizer(self, tokenizer):
        ids = marker_token_ids(tokenizer, "</think>")
        assert ids == [tokenizer.convert_tokens_to_ids("</think>")]  # one (added) token in the toy tokenizer
        assert marker_token_ids(tokenizer, None) == [] and marker_token_ids(tokenizer, "") == []
        assert marker_token_ids(tokenizer, "é") == []  # unknown to the tokenizer: stop tokens only
        response = tokenizer("<think>1+1\n</think> \\boxed{2}", add_special_tokens=False, return_tensors="pt")
        mask = torch.ones_like(response.input_ids, dtype=torch.bool)
        assert stop_positions(response.input_ids, mask, ids).tolist() == [5]  # <think> 1 + 1 \n </think>


def test_trainer_logs_the_gap_every_update(make_trainer, tiny_config):
    from vcppo_trl import VCPPOConfig

    args = tiny_config(VCPPOConfig, value_pretrain_steps=1, value_pretrain_min_steps=1, total_episodes=32)
    trainer = make_trainer(reward_funcs=length_reward, args=args)
    trainer.train()
    updates = [h for h in trainer.state.log_history if "objective/scores" in h]
    assert len(updates) == 3  # 1 value-pretraining update + 2 policy updates
    assert "value_pretrain/explained_variance" in updates[0]
    for log in updates:
        assert "diagnostics/stop_advantage_gap" in log
        assert all(f"diagnostics/stop_advantage_gap_bucket_{k}" in log for k in range(8))
    # The last log is the function on the last update's advantages (one process: nothing to gather).
    rollout, advantages = trainer.last_update.rollout, trainer.last_update.advantages
    stops = stop_positions(rollout.response_ids, rollout.response_mask, trainer.end_of_thinking_ids, rollout.has_stop)
    expected = stop_advantage_gap(advantages, rollout.response_mask, stops, 8, args.response_length)
    last = updates[-1]
    if math.isnan(expected.gap):
        assert math.isnan(last["diagnostics/stop_advantage_gap"])
    else:
        assert last["diagnostics/stop_advantage_gap"] == pytest.approx(expected.gap, rel=1e-5)


def test_marker_is_configurable_and_bucket_keys_follow_position_buckets(make_trainer, tiny_config):
    args = tiny_config(PPOConfig, end_of_thinking_marker=None, position_buckets=0, total_episodes=16)
    trainer = make_trainer(cls=PPOTrainer, reward_funcs=length_reward, args=args)
    assert trainer.end_of_thinking_ids == []
    trainer.train()
    log = next(h for h in trainer.state.log_history if "objective/scores" in h)
    assert "diagnostics/stop_advantage_gap" in log
    assert not any(k.startswith("diagnostics/stop_advantage_gap_bucket_") for k in log)

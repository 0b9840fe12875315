"""The advantage and critic diagnostics under generation windows read what the update trains (issue 49): the stop
gap, advantage-by-position and the position correlation this window's tokens, the Monte-Carlo explained variance
finished responses only; the advantage split by finished and unfinished responses; `rollout/outcomes_per_step`."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from accelerate import Accelerator

from vcppo_trl.algo.diagnostics import (
    position_bucket_means,
    position_buckets,
    position_correlation,
    stop_advantage_gap,
    stop_positions,
)
from vcppo_trl.rollout.types import Rollout
from vcppo_trl.trainer.metrics import MetricSettings, rollout_metrics

T = 12
LENGTHS = [12, 9, 7, 12, 10, 5]
STARTS = [8, 4, 0, 8, 6, 0]  # where this update's window begins in each response
FINISHED = [True, True, True, False, False, True]
HAS_STOP = [False, True, True, False, False, True]  # row 0 finished at the length cap
BUCKETS = 4
ADVANTAGE_KEYS = ("diagnostics/stop_advantage_gap", "diagnostics/advantage_position_corr")


def settings(num_mini_batches: int = 2) -> MetricSettings:
    return MetricSettings(
        accuracy_threshold=0.0,
        kl_coef=0.0,
        gamma=1.0,
        response_length=T,
        position_buckets=BUCKETS,
        num_mini_batches=num_mini_batches,
        importance_sampling_mode="token_truncate",
        importance_sampling_clip_min=None,
        importance_sampling_clip_max=None,
    )


def whole_rollout(seed: int = 0) -> Rollout:
    """Six responses of a whole-response run (every one finished), with values, rewards and no KL."""
    generator = torch.Generator().manual_seed(seed)
    batch = len(LENGTHS)
    positions = torch.arange(T).unsqueeze(0)
    response_mask = positions < torch.tensor(LENGTHS).unsqueeze(1)
    has_stop = torch.tensor(HAS_STOP)
    scores = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    last = torch.tensor(LENGTHS) - 1
    rewards = torch.zeros(batch, T)
    rewards[torch.arange(batch), last] = scores
    return Rollout(
        prompts=["p"] * batch,
        completions=["c"] * batch,
        extra_columns={},
        query_ids=torch.ones(batch, 3, dtype=torch.long),
        query_mask=torch.ones(batch, 3, dtype=torch.long),
        response_ids=torch.randint(10, 50, (batch, T), generator=generator) * response_mask,
        response_mask=response_mask,
        has_stop=has_stop,
        scores=scores,
        raw_scores=scores.clone(),
        rewards_per_func=scores.unsqueeze(1).clone(),
        reward_failed=torch.zeros(batch, dtype=torch.bool),
        values=torch.randn(batch, T, generator=generator) * response_mask,
        rewards=rewards,
        kl=torch.zeros(batch, T),
    )


def windowed(rollout: Rollout) -> Rollout:
    """The same tokens as a window's rollout: this update's window is the last part of each response, and rows 3 and
    4 did not finish (no score, no reward)."""
    finished = torch.tensor(FINISHED)
    window_mask = rollout.response_mask & (torch.arange(T).unsqueeze(0) >= torch.tensor(STARTS).unsqueeze(1))
    nan = torch.tensor(float("nan"))
    return dataclasses.replace(
        rollout,
        scores=torch.where(finished, rollout.scores, 0.0),
        raw_scores=torch.where(finished, rollout.raw_scores, nan),
        rewards_per_func=torch.where(finished.unsqueeze(1), rollout.rewards_per_func, nan),
        rewards=rollout.rewards * finished.unsqueeze(1),
        window_mask=window_mask,
        finished=finished,
        bootstrap_values=torch.zeros(len(LENGTHS)),
    )


def targets(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(len(LENGTHS), T, generator=generator), torch.randn(len(LENGTHS), T, generator=generator)


def metrics_of(rollout: Rollout, advantages: torch.Tensor, returns: torch.Tensor, **kwargs) -> dict[str, float]:
    accelerator = kwargs.pop("accelerator", None) or Accelerator(cpu=True)
    num_mini_batches = kwargs.pop("num_mini_batches", 2)
    return rollout_metrics(
        accelerator,
        settings(num_mini_batches),
        rollout,
        advantages=advantages,
        returns=returns,
        end_of_thinking_ids=[],
        reward_func_names=["r"],
        **kwargs,
    )


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_trained_tokens_are_the_windows_policy_tokens():
    rollout = whole_rollout()
    assert torch.equal(rollout.trained_tokens, rollout.response_mask)
    window = windowed(rollout)
    assert torch.equal(window.trained_tokens, window.window_mask)
    tools = torch.rand(len(LENGTHS), T, generator=torch.Generator().manual_seed(3)) > 0.3
    with_tools = dataclasses.replace(window, action_mask=tools)
    assert torch.equal(with_tools.trained_tokens, window.window_mask & tools & rollout.response_mask)


def test_advantage_diagnostics_read_only_this_windows_tokens():
    window = windowed(whole_rollout())
    advantages, returns = targets()
    metrics = metrics_of(window, advantages, returns)
    trained = window.window_mask
    # The functions applied to the window's tokens alone (absolute positions: the stop gap and the correlation).
    stops = stop_positions(window.response_ids, window.response_mask, [], has_stop=window.has_stop)
    gap = stop_advantage_gap(advantages, trained, stops, num_buckets=BUCKETS, max_length=T)
    assert not math.isnan(gap.gap) and same(metrics["diagnostics/stop_advantage_gap"], gap.gap)
    for k in range(BUCKETS):
        assert same(metrics[f"diagnostics/stop_advantage_gap_bucket_{k}"], float(gap.bucket_gaps[k]))
    assert metrics["diagnostics/advantage_position_corr"] == position_correlation(advantages, trained)
    # Advantage by relative position: a window's token keeps the bucket of its place in the response so far.
    buckets = position_buckets(window.response_mask, BUCKETS)
    for k in range(BUCKETS):
        selected = advantages[trained & (buckets == k)].double()
        expected = float(selected.mean()) if selected.numel() else float("nan")
        assert metrics[f"diagnostics/advantage_bucket_{k}"] == pytest.approx(expected, rel=1e-12, nan_ok=True)
    # Earlier windows' tokens change nothing the advantage diagnostics log.
    earlier = window.response_mask & ~trained
    noisy = torch.where(earlier, advantages + 100 * torch.randn(advantages.shape), advantages)
    moved = metrics_of(window, noisy, returns)
    keys = [k for k in metrics if k.startswith(("diagnostics/advantage", "diagnostics/stop_advantage_gap"))]
    assert len(keys) == 1 + 2 + BUCKETS + 1 + BUCKETS and all(same(moved[k], metrics[k]) for k in keys)


def test_advantages_split_by_finished_and_unfinished_responses():
    window = windowed(whole_rollout())
    advantages, returns = targets()
    metrics = metrics_of(window, advantages, returns)
    finished = window.finished.unsqueeze(1)
    assert metrics["diagnostics/advantage_finished_mean"] == pytest.approx(
        float(advantages[window.window_mask & finished].double().mean()), rel=1e-12
    )
    assert metrics["diagnostics/advantage_unfinished_mean"] == pytest.approx(
        float(advantages[window.window_mask & ~finished].double().mean()), rel=1e-12
    )
    # A group with no trained token is left out: every response finished, or none.
    whole = metrics_of(whole_rollout(), advantages, returns)
    assert "diagnostics/advantage_unfinished_mean" not in whole
    assert whole["diagnostics/advantage_finished_mean"] == pytest.approx(
        float(advantages[whole_rollout().response_mask].double().mean()), rel=1e-12
    )
    none = dataclasses.replace(window, finished=torch.zeros(len(LENGTHS), dtype=torch.bool))
    assert not any(k.startswith("diagnostics/advantage_finished") for k in metrics_of(none, advantages, returns))


@pytest.mark.parametrize("returns_are_monte_carlo", [True, False])
def test_monte_carlo_explained_variance_counts_finished_responses_only(returns_are_monte_carlo):
    """The windowed rollout's Monte-Carlo explained variance (and value error) by position equals that of a
    whole-response rollout cut down to its finished rows."""
    window = windowed(whole_rollout())
    advantages, returns = targets()
    rows = window.finished
    cut = dataclasses.replace(
        whole_rollout(),
        **{
            name: getattr(window, name)[rows]
            for name in ("response_ids", "response_mask", "has_stop", "scores", "raw_scores", "rewards_per_func")
        },
        reward_failed=window.reward_failed[rows],
        values=window.values[rows],
        rewards=window.rewards[rows],
        kl=window.kl[rows],
        prompts=["p"] * int(rows.sum()),
        completions=["c"] * int(rows.sum()),
        query_ids=window.query_ids[rows],
        query_mask=window.query_mask[rows],
    )
    # Unfinished rows' returns would be the critic's own bootstrap: make them wildly off, to show they are not read.
    returns = torch.where(rows.unsqueeze(1), returns, 1e3)
    kwargs = dict(returns_are_monte_carlo=returns_are_monte_carlo)
    metrics = metrics_of(window, advantages, returns, **kwargs)
    reference = metrics_of(cut, advantages[rows], returns[rows], **kwargs)
    for k in range(BUCKETS):
        for name in ("mc_explained_variance_bucket", "value_error_bucket"):
            key = f"diagnostics/{name}_{k}"
            assert same(metrics[key], reference[key]), key
    assert any(not math.isnan(metrics[f"diagnostics/mc_explained_variance_bucket_{k}"]) for k in range(BUCKETS))


def test_whole_response_metrics_are_todays():
    """Without windows the diagnostics read every policy token and every row, as before; a window that holds every
    response whole (all finished, the window the whole response) logs the same."""
    rollout = whole_rollout()
    advantages, returns = targets()
    metrics = metrics_of(rollout, advantages, returns, returns_are_monte_carlo=True)
    mask = rollout.response_mask
    stops = stop_positions(rollout.response_ids, mask, [], has_stop=rollout.has_stop)
    assert same(
        metrics["diagnostics/stop_advantage_gap"],
        stop_advantage_gap(advantages, mask, stops, num_buckets=BUCKETS, max_length=T).gap,
    )
    assert metrics["diagnostics/advantage_position_corr"] == position_correlation(advantages, mask)
    means = position_bucket_means(advantages, mask, BUCKETS)
    assert torch.equal(position_bucket_means(advantages, mask, BUCKETS, tokens=mask), means)
    for k in range(BUCKETS):
        assert same(metrics[f"diagnostics/advantage_bucket_{k}"], float(means[k]))
    full = dataclasses.replace(rollout, window_mask=mask.clone(), finished=torch.ones(len(LENGTHS), dtype=torch.bool))
    assert str(metrics_of(full, advantages, returns, returns_are_monte_carlo=True)) == str(metrics)


class TwoEqualProcesses:
    """An accelerator whose two processes hold the same rollout: gathers concatenate two copies, sums double."""

    num_processes = 2
    device = torch.device("cpu")

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.cat([tensor, tensor])

    def pad_across_processes(self, tensor: torch.Tensor, dim: int = 0, pad_index: int = 0) -> torch.Tensor:
        return tensor

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return tensor * 2 if reduction == "sum" else tensor


def test_outcomes_per_step_is_finished_responses_per_mini_batch_over_all_processes():
    advantages, returns = targets()
    whole = metrics_of(whole_rollout(), advantages, returns, num_mini_batches=2)
    assert whole["rollout/outcomes_per_step"] == len(LENGTHS) / 2  # the batch's share of each optimizer step
    window = windowed(whole_rollout())
    assert metrics_of(window, advantages, returns, num_mini_batches=2)["rollout/outcomes_per_step"] == 4 / 2
    assert metrics_of(window, advantages, returns, num_mini_batches=4)["rollout/outcomes_per_step"] == 4 / 4
    two = metrics_of(window, advantages, returns, num_mini_batches=2, accelerator=TwoEqualProcesses())
    assert two["rollout/outcomes_per_step"] == 2 * 4 / 2
    none = dataclasses.replace(window, finished=torch.zeros(len(LENGTHS), dtype=torch.bool))
    assert metrics_of(none, advantages, returns)["rollout/outcomes_per_step"] == 0.0


def test_token_staleness_gives_each_samples_age_and_the_staleness_metrics():
    window = windowed(whole_rollout())
    ages = torch.where(window.window_mask, 0, 2) * window.response_mask  # earlier windows: two updates old
    ages[2] = window.response_mask[2].long()  # row 2 (all this window's tokens) sampled one update ago
    tagged = dataclasses.replace(window, token_staleness=ages)
    # A sample's age is its oldest policy token's: 2 where an earlier window sampled part of it, else 1 or 0.
    assert tagged.sample_staleness.tolist() == [2, 2, 1, 2, 2, 0]
    assert window.sample_staleness.tolist() == [0] * len(LENGTHS)  # untagged: the training weights sampled it all
    advantages, returns = targets()
    metrics = metrics_of(tagged, advantages, returns)
    trained = window.window_mask
    assert metrics["sample/token_staleness_mean"] == pytest.approx(float(ages[trained].double().mean()))
    assert metrics["sample/token_staleness_mean"] == pytest.approx(LENGTHS[2] / int(trained.sum()))
    assert metrics["sample/oldest_token_staleness_max"] == 2.0
    # The tool loop's tokens are context: an old tool token does not age its sample.
    tools_only_old = dataclasses.replace(tagged, action_mask=ages == 0)
    assert tools_only_old.sample_staleness.tolist() == [0] * len(LENGTHS)
    assert not any(k.startswith("sample/") for k in metrics_of(window, advantages, returns))


def test_turn_index_counts_the_answers_before_each_policy_token():
    from vcppo_trl.rollout.types import turn_index

    # policy P, tool answer A, padding .: "PPAAPPAP.." -> turns 0 0 0 0 1 1 1 2
    action = torch.tensor([[1, 1, 0, 0, 1, 1, 0, 1, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]]).bool()
    mask = torch.tensor([[1] * 8 + [0] * 2, [1] * 5 + [0] * 5]).bool()
    assert turn_index(action, mask).tolist() == [[0, 0, 0, 0, 1, 1, 1, 2, 0, 0], [0] * 10]
    rollout = whole_rollout()
    assert not bool(rollout.turn_index.any())  # without tools every token is in the first turn

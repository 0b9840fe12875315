"""Dynamic sampling's choice of groups, and the concatenation of several generation rounds' samples."""

from __future__ import annotations

import torch

from vcppo_trl.algo.dynamic_sampling import choose_groups, informative_groups
from vcppo_trl.rollout.scoring import ScoredSamples, concat_scored
from vcppo_trl.sampling.seam import Samples


def test_a_group_is_informative_when_it_has_both_correct_and_wrong_samples():
    correct = torch.tensor([1, 1, 1, 0, 0, 0, 0, 1, 0], dtype=torch.bool)  # groups of 3: all right, all wrong, mixed
    assert informative_groups(correct, 3).tolist() == [False, False, True]


def test_choose_groups_keeps_the_first_informative_ones_in_drawing_order():
    assert choose_groups([False, True, True, False, True], 2) == ([1, 2], 0)
    # Too few informative groups: completed by the first uninformative ones, counted.
    assert choose_groups([False, True, False, False], 3) == ([0, 1, 2], 2)
    assert choose_groups([False, False], 2) == ([0, 1], 2)


def _scored(prompt_width, response_width, rows, with_logprobs=True, offset=0):
    ids = torch.arange(rows * response_width).reshape(rows, response_width) + 10 + offset
    mask = torch.ones(rows, response_width, dtype=torch.bool)
    return ScoredSamples(
        query_ids=torch.full((rows, prompt_width), 5 + offset),
        query_mask=torch.ones(rows, prompt_width, dtype=torch.long),
        samples=Samples(ids, mask, torch.ones(rows, dtype=torch.bool), mask.float() if with_logprobs else None, 1.5),
        completions=[f"c{offset + i}" for i in range(rows)],
        rewards_per_func=torch.arange(rows, dtype=torch.float32)[:, None] + offset,
        reward_failed=torch.zeros(rows, dtype=torch.bool),
        raw_scores=torch.arange(rows, dtype=torch.float32) + offset,
    )


def test_concat_pads_prompts_left_and_responses_right_then_select_takes_rows():
    a, b = _scored(2, 3, rows=2), _scored(4, 1, rows=2, offset=100)
    both = concat_scored([a, b], pad_token_id=0)
    assert both.query_ids.shape == (4, 4) and both.samples.response_ids.shape == (4, 3)
    assert both.query_ids[0].tolist() == [0, 0, 5, 5] and both.query_mask[0].tolist() == [0, 0, 1, 1]
    assert both.samples.response_ids[2].tolist() == [110, 0, 0]
    assert both.samples.response_mask[2].tolist() == [True, False, False]
    assert both.samples.logprobs[2].tolist() == [1.0, 0.0, 0.0] and both.samples.seconds == 3.0
    assert both.completions == ["c0", "c1", "c100", "c101"]
    picked = both.select([3, 0])
    assert picked.raw_scores.tolist() == [101.0, 0.0] and picked.completions == ["c101", "c0"]
    assert torch.equal(picked.samples.response_ids[1], a.samples.response_ids[0])
    # A sampler without log-probabilities (HF generate) gives none.
    assert concat_scored([_scored(2, 3, 2, False), _scored(2, 3, 2, False)], 0).samples.logprobs is None

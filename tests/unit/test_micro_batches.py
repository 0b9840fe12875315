"""Token-budget micro-batches: the partition of a batch by length (pure functions, no model)."""

from __future__ import annotations

import pytest
import torch

from vcppo_trl.algo.micro_batches import (
    MicroBatch,
    micro_batch_count,
    plan_forwards,
    plan_micro_batches,
    sequence_lengths,
    split_by_tokens,
)


def lengths(prompts, responses):
    return torch.tensor(prompts), torch.tensor(responses)


def rows_of(plan):
    return sorted(i for mb in plan for i in mb.indices.tolist())


def test_sequence_lengths_read_left_padded_prompts_and_right_padded_responses():
    query_mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]])
    response_mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]]).bool()
    prompt, response = sequence_lengths(query_mask, response_mask)
    assert prompt.tolist() == [2, 4, 1] and response.tolist() == [2, 5, 0]


def test_every_row_once_within_the_budget_with_its_own_widths():
    prompt, response = lengths([3, 5, 2, 4, 4, 1, 6, 2], [40, 3, 17, 90, 8, 8, 55, 1])
    plan = plan_micro_batches(prompt, response, max_tokens=128)
    assert rows_of(plan) == list(range(8))
    for mb in plan:
        rows = mb.indices.tolist()
        assert mb.prompt_width == max(prompt[rows].tolist())
        assert mb.response_width == max(response[rows].tolist())
        assert mb.tokens <= 128 or len(rows) == 1
    # The 94-token sequence alone fits; nothing here is over the budget.
    assert all(mb.tokens <= 128 for mb in plan)


def test_a_sequence_longer_than_the_budget_runs_alone():
    prompt, response = lengths([4, 4, 4, 4], [200, 10, 10, 10])
    plan = plan_micro_batches(prompt, response, max_tokens=64)
    alone = [mb for mb in plan if 0 in mb.indices.tolist()]
    assert len(alone) == 1 and alone[0].indices.tolist() == [0] and alone[0].tokens == 204
    assert all(mb.tokens <= 64 for mb in plan if mb is not alone[0])


def test_micro_batches_are_balanced_not_only_filled():
    # 10 equal sequences of 10 tokens in 60-token micro-batches: two are needed; 5 + 5, not 6 + 4.
    prompt, response = lengths([2] * 10, [8] * 10)
    plan = plan_micro_batches(prompt, response, max_tokens=60)
    assert sorted(len(mb.indices) for mb in plan) == [5, 5]


def test_a_larger_count_stays_within_the_budget_and_covers_every_row():
    prompt, response = lengths([3, 3, 3, 3, 3, 3], [30, 29, 5, 4, 4, 2])
    fewest = micro_batch_count(prompt, response, max_tokens=70)
    for count in range(fewest, 7):
        plan = plan_micro_batches(prompt, response, max_tokens=70, count=count)
        assert len(plan) == count and rows_of(plan) == list(range(6))
        assert all(mb.tokens <= 70 for mb in plan)
    with pytest.raises(ValueError, match="between"):
        plan_micro_batches(prompt, response, max_tokens=70, count=fewest - 1)
    with pytest.raises(ValueError, match="between"):
        plan_micro_batches(prompt, response, max_tokens=70, count=7)


def test_the_plan_depends_on_lengths_alone():
    prompt, response = lengths([2, 2, 2, 2], [5, 5, 9, 1])
    first = plan_micro_batches(prompt, response, max_tokens=24)
    second = plan_micro_batches(prompt.clone(), response.clone(), max_tokens=24)
    assert [mb.indices.tolist() for mb in first] == [mb.indices.tolist() for mb in second]


def test_empty_responses_still_get_a_column():
    plan = plan_micro_batches(*lengths([3, 3], [0, 0]), max_tokens=100)
    assert [mb.response_width for mb in plan] == [1]


def test_columns_keep_the_prompt_tail_and_the_response_head():
    mb = MicroBatch(indices=torch.tensor([0]), prompt_width=3, response_width=4)
    assert mb.columns(context_length=10) == slice(7, 14)


def test_split_by_tokens_returns_batch_rows():
    prompt, response = lengths([1] * 6, [9, 1, 9, 1, 9, 1])
    rows = torch.tensor([4, 1, 2])  # a mini-batch of the batch
    plan = split_by_tokens(rows, prompt, response, max_tokens=20)
    assert rows_of(plan) == [1, 2, 4]


def test_plan_forwards_without_a_budget_is_the_padded_split_in_order():
    groups = [torch.tensor([3, 0, 2, 1])]
    prompt, response = lengths([1, 2, 3, 4], [5, 6, 7, 8])
    (plan,) = plan_forwards(groups, prompt, response, None, 3, context_length=4, response_length=8)
    assert [mb.indices.tolist() for mb in plan] == [[3, 0, 2], [1]]
    assert all((mb.prompt_width, mb.response_width) == (4, 8) for mb in plan)


def test_plan_forwards_gives_every_group_the_count_of_the_process_that_needs_most():
    groups = [torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5, 6, 7])]
    prompt, response = lengths([1] * 8, [3] * 8)
    seen = []

    def max_across(counts):  # another process needs 3 micro-batches for its first mini-batch
        seen.append(list(counts))
        return [max(c, 3) if i == 0 else c for i, c in enumerate(counts)]

    plans = plan_forwards(groups, prompt, response, 16, 2, 1, 3, max_across)
    assert seen == [[1, 1]]
    assert [len(p) for p in plans] == [3, 1]

"""Balanced ranks: the assignment of a global mini-batch's rows to processes by token count, and the exchange plan,
run here without processes (the all-to-all simulated in memory)."""

import pytest
import torch

from vcppo_trl.algo.rank_assignment import (
    balanced_assignment,
    exchange_plan,
    keep_in_place,
    mini_batch_assignments,
    pad_columns,
    process_loads,
    rank_token_imbalance,
)


def test_greedy_longest_first_onto_the_least_loaded_group_with_equal_counts():
    tokens = [100, 1, 1, 1, 90, 2, 2, 3]
    groups = balanced_assignment(tokens, 2)
    assert sorted(sum(groups, [])) == list(range(8))
    assert [len(g) for g in groups] == [4, 4]
    loads = [sum(tokens[i] for i in g) for g in groups]
    assert loads == [103, 97]  # 100 and 90 apart; 3, 2, 2 onto 90 (then full), the 1s onto 100
    # Deterministic, ties broken by index: equal lengths go in index order to groups in index order.
    assert balanced_assignment([5, 5, 5, 5], 2) == [[0, 2], [1, 3]]
    assert balanced_assignment([7, 3], 1) == [[0, 1]]


def test_equal_counts_even_when_the_loads_would_want_otherwise():
    groups = balanced_assignment([1000, 1, 1, 1, 1, 1], 2)
    assert [len(g) for g in groups] == [3, 3]


@pytest.mark.parametrize("seed", range(5))
def test_the_greedy_bound_holds_on_long_tailed_lengths(seed):
    generator = torch.Generator().manual_seed(seed)
    tokens = (10 / torch.rand(48, generator=generator) ** (1 / 1.2)).long().tolist()  # Pareto, a long tail
    parts = 4
    groups = balanced_assignment(tokens, parts)
    loads = [sum(tokens[i] for i in g) for g in groups]
    assert max(loads) <= sum(tokens) / parts + max(tokens)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="equal size"):
        balanced_assignment([1, 2, 3], 2)
    with pytest.raises(ValueError, match="at least 1"):
        balanced_assignment([1], 0)


def test_groups_go_where_most_of_their_rows_already_are():
    owners = [0, 0, 1, 1]
    assert keep_in_place([[2, 3], [0, 1]], owners) == [[0, 1], [2, 3]]
    assert keep_in_place([[0, 2], [1, 3]], owners) == [[0, 2], [1, 3]]  # a tie: the lower group to the lower process


def test_assignments_per_mini_batch_and_the_imbalance_metric():
    # Process 0 drew short responses, process 1 long ones; 2 mini-batches of 2 rows per process.
    tokens = torch.tensor([[10, 12, 11, 9], [100, 80, 90, 120]])
    own = mini_batch_assignments(tokens, 2, balance=False)
    assert own == [[[0, 1], [2, 3]], [[0, 1], [2, 3]]]
    loads_own = process_loads(tokens, own)
    assert loads_own.tolist() == [[22.0, 180.0], [20.0, 210.0]]
    # The slowest process at each step over the mean process, summed over the steps.
    assert rank_token_imbalance(loads_own) == pytest.approx((180 + 210) / ((22 + 180) / 2 + (20 + 210) / 2))
    balanced = mini_batch_assignments(tokens, 2)
    loads = process_loads(tokens, balanced)
    assert loads.sum(dim=1).tolist() == loads_own.sum(dim=1).tolist()  # the same rows per mini-batch
    assert loads.max(dim=1).values.tolist() == [110.0, 129.0]  # the best split into 2 + 2 rows: 100+10, 120+9
    assert rank_token_imbalance(loads) < 1.11 < 1.7 < rank_token_imbalance(loads_own)
    for plan in balanced:
        assert sorted(sum(plan, [])) == [0, 1, 2, 3] and all(len(p) == 2 for p in plan)
    assert rank_token_imbalance(torch.zeros(1, 2)) == 1.0


def simulate(tokens: torch.Tensor, mini_batch_size: int, payload: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every process's balanced rows of `payload` (`[B, ...]` per process, rows in that process's order), by the
    exchange plans and an all-to-all done in memory."""
    world = tokens.shape[0]
    assignments = mini_batch_assignments(tokens, mini_batch_size)
    plans = [exchange_plan(assignments, mini_batch_size, p) for p in range(world)]
    for p in range(world):  # what p sends to q is what q expects from p
        assert [plans[p].send_counts[q] for q in range(world)] == [plans[q].recv_counts[p] for q in range(world)]
    sent = [list(payload[p][plans[p].send].split(plans[p].send_counts)) for p in range(world)]
    received = [torch.cat([sent[q][p] for q in range(world)]) for p in range(world)]
    return [received[p][plans[p].arrange] for p in range(world)], plans, assignments


@pytest.mark.parametrize(("world", "mini_batch_size", "mini_batches"), [(2, 4, 1), (2, 2, 3), (3, 2, 2), (4, 3, 2)])
def test_every_row_travels_with_its_fields_and_comes_back(world, mini_batch_size, mini_batches):
    rows = mini_batch_size * mini_batches
    generator = torch.Generator().manual_seed(world * 100 + rows)
    tokens = torch.randint(1, 200, (world, rows), generator=generator)
    tokens[-1] *= 10  # the last process drew the long responses
    # A row's fields, tagged with its identity (process, row in its order) so that a mixed-up row shows.
    ids = torch.arange(world * rows).view(world, rows)
    payload = [torch.stack([ids[p].float(), ids[p].float() * 2 + 0.5, tokens[p].float()], dim=1) for p in range(world)]
    balanced, plans, assignments = simulate(tokens, mini_batch_size, payload)
    for p in range(world):
        assert balanced[p].shape == (rows, 3)
        assert torch.equal(balanced[p][:, 1], balanced[p][:, 0] * 2 + 0.5)  # the fields stayed together
        for m in range(mini_batches):
            got = balanced[p][m * mini_batch_size : (m + 1) * mini_batch_size, 0].long().tolist()
            canonical = [
                ids[j // mini_batch_size, m * mini_batch_size + j % mini_batch_size] for j in assignments[m][p]
            ]
            assert got == [int(c) for c in canonical]
    # Each global mini-batch holds the same rows as without balancing.
    for m in range(mini_batches):
        block = slice(m * mini_batch_size, (m + 1) * mini_batch_size)
        after = sorted(int(i) for p in range(world) for i in balanced[p][block, 0])
        assert after == sorted(ids[:, block].reshape(-1).tolist())
    # The way back: each process gets its own rows, in its own order.
    buffers = []
    for p in range(world):
        buffer = torch.empty_like(balanced[p])
        buffer[plans[p].arrange] = balanced[p]
        buffers.append(list(buffer.split(plans[p].recv_counts)))
    for p in range(world):
        back = torch.cat([buffers[q][p] for q in range(world)])
        restored = torch.empty_like(payload[p])
        restored[plans[p].send] = back
        assert torch.equal(restored, payload[p])


def test_rows_stay_where_the_greedy_split_would_be_no_faster():
    # Already even, 6 and 6; the greedy (3, 3 apart, then the 2s) would end at 7 and 5.
    tokens = torch.tensor([[3, 3, 0], [2, 2, 2]])
    assert balanced_assignment([3, 3, 0, 2, 2, 2], 2) == [[0, 3, 5], [1, 2, 4]]
    assert mini_batch_assignments(tokens, 3) == [[[0, 1, 2], [3, 4, 5]]]


def test_balancing_evens_out_a_rank_with_the_long_tail():
    tokens = torch.tensor([[20] * 8, [400, 300, 20, 20, 250, 200, 20, 20]])
    before = rank_token_imbalance(process_loads(tokens, mini_batch_assignments(tokens, 4, balance=False)))
    after = rank_token_imbalance(process_loads(tokens, mini_batch_assignments(tokens, 4)))
    assert before > 1.5 and after < before
    assert before == pytest.approx((740 + 490) / (820 / 2 + 570 / 2))
    # Balanced as far as whole rows and equal row counts allow: the longest row and 3 short ones set each step.
    assert after == pytest.approx((460 + 310) / (820 / 2 + 570 / 2))


def test_pad_columns():
    t = torch.tensor([[1, 2], [3, 4]])
    assert pad_columns(t, 4).tolist() == [[1, 2, 0, 0], [3, 4, 0, 0]]
    assert pad_columns(t, 3, left=True).tolist() == [[0, 1, 2], [0, 3, 4]]
    assert pad_columns(t.bool(), 3).dtype == torch.bool
    assert pad_columns(t, 2) is t

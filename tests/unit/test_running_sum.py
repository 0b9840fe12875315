"""The accuracy-link toy's running-sum task (`vcppo_trl.toy.running_sum`): generator, verifier, cold-start data."""

import random

import pytest

from vcppo_trl.rewards.math_verify import math_verify_reward
from vcppo_trl.toy.running_sum import (
    accuracy_by_stop_line,
    format_prompt,
    format_solution,
    make_running_sum_dataset,
    make_running_sum_splits,
    parse_prompt,
    reasoning_lines,
    reasoning_lines_reward,
    running_sum_after,
    running_sum_reward,
)

DIGITS = [3, 4, 1, 0]  # running sums mod 5: 3, 2, 3, 3


def test_prompt_and_solution_format():
    assert format_prompt(DIGITS) == "Sum mod 5 of: a3 b4 c1 d0\n"
    assert parse_prompt(format_prompt(DIGITS)) == (DIGITS, 5)
    assert parse_prompt(format_prompt([1, 0, 1], modulus=2)) == ([1, 0, 1], 2)
    assert format_solution(DIGITS) == "<think>a3 3\nb4 2\nc1 3\nd0 3\n</think> \\boxed{3}"
    assert format_solution(DIGITS, 2) == "<think>a3 3\nb4 2\n</think> \\boxed{2}"
    assert format_solution([1, 1, 0], modulus=2) == "<think>a1 1\nb1 0\nc0 0\n</think> \\boxed{0}"
    assert [running_sum_after(DIGITS, k) for k in range(1, 5)] == [3, 2, 3, 3]
    assert running_sum_after(DIGITS) == 3
    with pytest.raises(ValueError, match="Digits must be in"):
        format_prompt([5, 1])
    with pytest.raises(ValueError, match="k must be in"):
        format_solution(DIGITS, 5)
    with pytest.raises(ValueError, match="modulus"):
        format_prompt([1], modulus=11)
    with pytest.raises(ValueError, match="Not a running-sum prompt"):
        parse_prompt("Majority of: a1\n")


@pytest.mark.parametrize("verifier", [running_sum_reward, math_verify_reward])
def test_an_answer_after_k_lines_is_scored_against_the_whole_sum(verifier):
    rng = random.Random(0)
    for _ in range(20):
        digits = [rng.randrange(5) for _ in range(rng.randint(3, 9))]
        gold = f"\\boxed{{{running_sum_after(digits)}}}"
        completions = [format_solution(digits, k) for k in range(1, len(digits) + 1)]
        expected = [
            1.0 if running_sum_after(digits, k) == running_sum_after(digits) else -1.0
            for k in range(1, len(digits) + 1)
        ]
        assert verifier(completions, [gold] * len(completions)) == expected
        assert expected[-1] == 1.0
    bad = ["<think>a3 3\n\\boxed{3}", "<think>a3 3\n</think>", "\\boxed{3}", "<think>a3 3\n</think> \\boxed{2}"]
    assert running_sum_reward(bad, ["\\boxed{3}"] * 4) == [-1.0] * 4
    assert running_sum_reward([[{"role": "assistant", "content": format_solution(DIGITS)}]], ["\\boxed{3}"]) == [1.0]


def test_counts_lines_on_bits_answer_the_ones_mod_m():
    bits = [1, 1, 0, 1, 1, 1, 1]  # six ones: 1 mod 5
    assert format_solution(bits, 3, modulus=5, tally="counts") == "<think>a1 1:0\nb1 2:0\nc0 2:1\n</think> \\boxed{2}"
    assert format_solution(bits, modulus=5, tally="counts").endswith("g1 6:1\n</think> \\boxed{1}")
    assert reasoning_lines(format_solution(bits, 5, modulus=5, tally="counts")) == 5
    data = make_running_sum_dataset(50, seed=1, modulus=5, values=2, tally="counts")
    for row in data:
        digits, modulus = parse_prompt(row["prompt"])
        assert set(digits) <= {0, 1} and modulus == 5
        assert row["completion"] == format_solution(digits, row["stop_line"], 5, "counts")
        assert row["solution"] == f"\\boxed{{{sum(digits) % 5}}}"
    with pytest.raises(ValueError, match="needs bits"):
        make_running_sum_dataset(2, modulus=5, values=3, tally="counts")
    with pytest.raises(ValueError, match="needs bits"):
        format_solution([2, 1], modulus=5, tally="counts")
    with pytest.raises(ValueError, match="values"):
        make_running_sum_dataset(2, modulus=3, values=4)
    with pytest.raises(ValueError, match="tally"):
        make_running_sum_dataset(2, tally="diff")


def test_reasoning_lines():
    assert reasoning_lines(format_solution(DIGITS, 3)) == 3
    assert reasoning_lines("<think>a3 3\nb4 2\nc1") == 2  # unclosed, last line incomplete
    assert reasoning_lines("no think") == 0
    assert reasoning_lines_reward([format_solution(DIGITS), "x"]) == [4.0, 0.0]


def test_cold_start_data_mixes_complete_and_early_stopped_solutions():
    data = make_running_sum_dataset(400, seed=0, early_stop_fraction=0.5)
    assert set(data["difficulty"]) <= set(range(15, 32)) and len(set(data["difficulty"])) > 10
    early = [k < n for k, n in zip(data["stop_line"], data["difficulty"])]
    assert 0.4 < sum(early) / 400 < 0.6
    for row in data.select(range(40)):
        digits, modulus = parse_prompt(row["prompt"])
        assert len(digits) == row["difficulty"] and modulus == 5
        assert reasoning_lines(row["completion"]) == row["stop_line"]
        assert row["completion"] == format_solution(digits, row["stop_line"])
        assert row["solution"] == f"\\boxed{{{running_sum_after(digits)}}}"
        assert row["completion_correct"] == (running_sum_reward([row["completion"]], [row["solution"]]) == [1.0])
    complete = [c for c, e in zip(data["completion_correct"], early) if not e]
    stopped = [c for c, e in zip(data["completion_correct"], early) if e]
    assert all(complete) and sum(stopped) / len(stopped) < 0.35  # about 1/5
    assert make_running_sum_dataset(20, seed=3)["prompt"] == make_running_sum_dataset(20, seed=3)["prompt"]
    assert (
        make_running_sum_dataset(20, seed=3, early_stop_fraction=0.0)["prompt"]
        == make_running_sum_dataset(20, seed=3)["prompt"]
    )
    with pytest.raises(ValueError, match="early_stop_fraction"):
        make_running_sum_dataset(2, early_stop_fraction=2.0)
    with pytest.raises(ValueError, match="min_digits"):
        make_running_sum_dataset(2, min_digits=40, max_digits=60)


def test_splits_are_disjoint_with_complete_test_solutions():
    splits = make_running_sum_splits(200, 50, seed=0, modulus=2)
    assert not set(splits["train"]["prompt"]) & set(splits["test"]["prompt"])
    assert len(set(splits["test"]["prompt"])) == 50
    assert splits["test"]["stop_line"] == splits["test"]["difficulty"]
    assert {parse_prompt(p)[1] for p in splits["train"]["prompt"]} == {2}


def test_an_early_stop_is_worth_a_guess():
    """The task's shape (a property of the generator): stopping before the last line is right about 1/modulus of the
    time, whatever the line; reading to the end always is."""
    acc = accuracy_by_stop_line(make_running_sum_splits(200, 300, seed=0)["test"]["prompt"])
    assert len(acc) == 31
    assert all(0.1 < a < 0.3 for a in acc[:14]) and acc[-1] == 1.0


def test_sequences_fit_the_toy_model(tokenizer):
    digits = [4] * 31  # the longest default
    prompt = tokenizer(format_prompt(digits), add_special_tokens=False).input_ids
    completion = tokenizer(format_solution(digits), add_special_tokens=False).input_ids
    assert tokenizer.decode(completion) == format_solution(digits)
    assert len(prompt) == 107 and len(completion) == 167 < 192

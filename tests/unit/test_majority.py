"""The stop-anytime toy task (`vcppo_trl.toy.majority`): generator, verifier, cold-start data."""

import random

import pytest

from vcppo_trl.rewards.math_verify import math_verify_reward
from vcppo_trl.toy.majority import (
    KEYS,
    accuracy_by_stop_line,
    format_prompt,
    format_solution,
    leader_after,
    majority_answer,
    majority_reward,
    make_majority_dataset,
    make_majority_splits,
    parse_prompt,
    reasoning_lines,
    reasoning_lines_reward,
)

BITS = [0, 0, 1, 1, 1]  # majority 1; the leader is 0 after 1, 2 and 3 lines, tied 2:2 after 4 (the bit just read: 1)


def test_formats_hand_written():
    assert format_prompt(BITS) == "Majority of: a0 b0 c1 d1 e1\n"
    assert format_solution(BITS) == "<think>a0 0:1\nb0 0:2\nc1 1:2\nd1 2:2\ne1 3:2\n</think> \\boxed{1}"
    assert format_solution(BITS, stop_line=3) == "<think>a0 0:1\nb0 0:2\nc1 1:2\n</think> \\boxed{0}"
    assert parse_prompt(format_prompt(BITS)) == BITS


def test_leader_and_majority():
    assert majority_answer(BITS) == 1
    assert [leader_after(BITS, k) for k in range(1, 6)] == [0, 0, 0, 1, 1]
    assert leader_after([1, 0], 2) == 0  # a tie answers with the bit just read
    with pytest.raises(ValueError, match="odd"):
        majority_answer([1, 0])
    with pytest.raises(ValueError, match="k must be"):
        leader_after(BITS, 0)
    with pytest.raises(ValueError):
        format_prompt([1] * (len(KEYS) + 1))


@pytest.mark.parametrize("verifier", [majority_reward, math_verify_reward])
def test_an_answer_after_k_lines_is_scored_against_the_whole_string(verifier):
    completions = [format_solution(BITS, k) for k in range(1, 6)]
    assert verifier(completions, ["\\boxed{1}"] * 5) == [-1.0, -1.0, -1.0, 1.0, 1.0]
    # Random strings, every stop line: +1 exactly when the leader so far is the whole string's majority.
    rng = random.Random(0)
    for _ in range(5):
        bits = [rng.randint(0, 1) for _ in range(rng.choice([7, 9, 11]))]
        gold = f"\\boxed{{{majority_answer(bits)}}}"
        ks = range(1, len(bits) + 1)
        expected = [1.0 if leader_after(bits, k) == majority_answer(bits) else -1.0 for k in ks]
        assert verifier([format_solution(bits, k) for k in ks], [gold] * len(bits)) == expected


def test_verifier_rejects_missing_or_unclosed_answers():
    bad = ["<think>a0 0:1\n\\boxed{1}", "<think>a0 0:1\n</think>", "\\boxed{1}", "<think>a1 1:0\n</think> \\boxed{0}"]
    assert majority_reward(bad, ["\\boxed{1}"] * 4) == [-1.0] * 4
    assert majority_reward([[{"role": "assistant", "content": format_solution(BITS)}]], ["\\boxed{1}"]) == [1.0]


def test_reasoning_lines():
    assert reasoning_lines(format_solution(BITS, 3)) == 3
    assert reasoning_lines("<think>a0 0:1\nb0 0:2\nc1") == 2  # unclosed, last line incomplete
    assert reasoning_lines("no think") == 0
    assert reasoning_lines_reward([format_solution(BITS), "x"]) == [5.0, 0.0]


def test_cold_start_data_mixes_complete_and_early_stopped_solutions():
    data = make_majority_dataset(400, seed=0, early_stop_fraction=0.5)
    assert set(data["difficulty"]) <= set(range(15, 32, 2)) and len(set(data["difficulty"])) > 5
    early = [k < n for k, n in zip(data["stop_line"], data["difficulty"])]
    assert 0.4 < sum(early) / 400 < 0.6
    for row in data.select(range(40)):
        bits = parse_prompt(row["prompt"])
        assert len(bits) == row["difficulty"]
        assert reasoning_lines(row["completion"]) == row["stop_line"]
        assert row["completion"] == format_solution(bits, row["stop_line"])
        assert row["solution"] == f"\\boxed{{{majority_answer(bits)}}}"
        assert row["completion_correct"] == (majority_reward([row["completion"]], [row["solution"]]) == [1.0])
    # Complete solutions are always right; early ones are right less often, but not never.
    complete = [c for c, e in zip(data["completion_correct"], early) if not e]
    stopped = [c for c, e in zip(data["completion_correct"], early) if e]
    assert all(complete) and 0.5 < sum(stopped) / len(stopped) < 1.0
    assert make_majority_dataset(20, seed=3)["prompt"] == make_majority_dataset(20, seed=3)["prompt"]
    # The early-stop share does not change the prompts drawn.
    assert (
        make_majority_dataset(20, seed=3, early_stop_fraction=0.0)["prompt"]
        == make_majority_dataset(20, seed=3)["prompt"]
    )
    with pytest.raises(ValueError, match="early_stop_fraction"):
        make_majority_dataset(2, early_stop_fraction=2.0)
    with pytest.raises(ValueError, match="odd lengths"):
        make_majority_dataset(2, min_bits=40, max_bits=60)


def test_splits_are_disjoint_with_complete_test_solutions():
    splits = make_majority_splits(200, 50, seed=0)
    assert not set(splits["train"]["prompt"]) & set(splits["test"]["prompt"])
    assert len(set(splits["test"]["prompt"])) == 50
    assert splits["test"]["stop_line"] == splits["test"]["difficulty"]


def test_stopping_later_is_right_more_often():
    """The task's shape (a property of the generator): accuracy of the leader rises with the lines read, from well
    above chance but below 1 early, to 1 at the end."""
    acc = accuracy_by_stop_line(make_majority_splits(200, 300, seed=0)["test"]["prompt"])
    assert len(acc) == 31
    assert 0.5 < acc[0] < 0.8 and acc[-1] == 1.0
    assert sum(acc[:5]) / 5 < sum(acc[10:15]) / 5 < sum(acc[-5:]) / 5


def test_sequences_fit_the_toy_model(tokenizer):
    bits = [1, 0] * 15 + [1]  # 31 bits, the longest default
    prompt = tokenizer(format_prompt(bits), add_special_tokens=False).input_ids
    completion = tokenizer(format_solution(bits), add_special_tokens=False).input_ids
    assert tokenizer.decode(completion) == format_solution(bits)  # every character is covered
    assert 200 < len(completion) < 320 and len(prompt) + len(completion) + 1 < 512


def test_harness_runs_the_majority_task_on_a_tiny_budget(tmp_path):
    """`reproduce.py --task majority`: its own cache and results directories, the task's data and logged metric; the
    first toy's directories stay untouched. No outcome is asserted."""
    import json
    import os

    import reproduce  # experiments/ is on pytest's pythonpath (pyproject.toml)

    assert reproduce.TASKS["addition"][0] == reproduce.Budget()  # the default run does not change
    results, cache = str(tmp_path / "results"), str(tmp_path / "cache")
    argv = ["--task", "majority", "--smoke", "--variants", "ppo", "--results-dir", results, "--cache-dir", cache]
    assert reproduce.main([*argv, "--workers", "1"]) == 0
    with open(os.path.join(cache, "majority", "assets.json")) as f:
        assert json.load(f)["key"]["task"] == "majority"
    with open(os.path.join(results, "majority", "runs", "ppo", "seed0.json")) as f:
        record = json.load(f)
    assert record["budget"]["min_bits"] == 3 and "accuracy" in record["final_eval"]
    updates = [e for e in record["log_history"] if "diagnostics/stop_advantage_gap" in e]
    assert updates and all("rewards/reasoning_lines_reward/mean" in e for e in updates)
    assert not os.path.exists(os.path.join(results, "runs")) and not os.path.exists(os.path.join(cache, "assets.json"))
    # No variant run starts from the controlled-bias critic: it is not built.
    assert not os.path.exists(os.path.join(cache, "majority", "controlled_bias_critic"))


def test_variants_hand_written():
    """`tally="diff"` keeps ones − zeros; `encoding="changes"` shows each bit XOR the previous one and decodes it."""
    assert format_solution(BITS, 3, tally="diff") == "<think>a0 -1\nb0 -2\nc1 -1\n</think> \\boxed{0}"
    assert format_prompt(BITS, encoding="changes") == "Majority of changes: a0 b0 c1 d0 e0\n"
    assert parse_prompt(format_prompt(BITS, encoding="changes")) == BITS
    assert format_solution(BITS, tally="diff", encoding="changes") == (
        "<think>a0 0 -1\nb0 0 -2\nc1 1 -1\nd0 1 +0\ne0 1 +1\n</think> \\boxed{1}"
    )
    assert reasoning_lines(format_solution(BITS, 4, tally="diff", encoding="changes")) == 4
    assert reasoning_lines(format_solution(BITS, 2, encoding="changes")) == 2
    with pytest.raises(ValueError, match="tally"):
        format_solution(BITS, tally="sum")


@pytest.mark.parametrize("tally,encoding", [("diff", "plain"), ("counts", "changes"), ("diff", "changes")])
def test_variants_draw_the_same_strings_and_score_the_same(tally, encoding):
    plain = make_majority_dataset(30, seed=5)
    variant = make_majority_dataset(30, seed=5, tally=tally, encoding=encoding)
    assert [parse_prompt(p) for p in plain["prompt"]] == [parse_prompt(p) for p in variant["prompt"]]
    assert variant["completion_correct"] == plain["completion_correct"]
    assert variant["stop_line"] == plain["stop_line"]
    for row in variant.select(range(10)):
        assert reasoning_lines(row["completion"]) == row["stop_line"]
        assert row["completion_correct"] == (majority_reward([row["completion"]], [row["solution"]]) == [1.0])
    if encoding == "changes":  # a shown bit is a change about half the time, whichever way the string leans
        shown = [int(t[1]) for p in variant["prompt"] for t in p.split(": ")[1].split()]
        assert 0.35 < sum(shown) / len(shown) < 0.65

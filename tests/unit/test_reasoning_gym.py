"""reasoning-gym tasks as prompts and a reward with the task's own scoring (issue 62)."""

from __future__ import annotations

import json

import pytest

from vcppo_trl.rewards.reasoning_gym import (
    ENTRY_COLUMN,
    reasoning_gym_dataset,
    reasoning_gym_reward,
    reasoning_gym_tasks,
)

TASKS = ("leg_counting", "basic_arithmetic", "spell_backward", "word_sorting")


@pytest.mark.parametrize("task", TASKS)
def test_a_tasks_own_answer_scores_plus_one_and_a_wrong_one_minus_one(task):
    dataset = reasoning_gym_dataset(task, size=4, seed=3)
    assert dataset.column_names == ["prompt", ENTRY_COLUMN, "solution"]
    assert dataset["solution"] == [str(e["answer"]) for e in [json.loads(x) for x in dataset[ENTRY_COLUMN]]]
    entries = [json.loads(e) for e in dataset[ENTRY_COLUMN]]
    system, user = dataset[0]["prompt"]
    assert system["role"] == "system" and "<answer>" in system["content"]
    assert user == {"role": "user", "content": entries[0]["question"]}
    right = [f"<think>Let me count. <answer>9999</answer></think> <answer>{e['answer']}</answer>" for e in entries]
    assert reasoning_gym_reward(right, dataset[ENTRY_COLUMN]) == [1.0] * 4  # the last answer block is the answer
    wrong = ["<answer>not it</answer>", "no answer at all", "", "<answer></answer>"]
    assert reasoning_gym_reward(wrong, dataset[ENTRY_COLUMN]) == [-1.0] * 4
    conversational = [[{"role": "assistant", "content": text}] for text in right]  # TRL's chat completions
    assert reasoning_gym_reward(conversational, dataset[ENTRY_COLUMN]) == [1.0] * 4


def test_partial_credit_maps_onto_the_reward_scale():
    """propositional_logic gives a well-formed wrong answer part of the credit: 2 · score − 1 keeps it between."""
    dataset = reasoning_gym_dataset("propositional_logic", size=1, seed=3)
    (reward,) = reasoning_gym_reward(["<answer>P</answer>"], dataset[ENTRY_COLUMN])
    assert -1.0 < reward < 1.0


def test_the_same_seed_gives_the_same_problems():
    assert (
        reasoning_gym_dataset("leg_counting", 3, seed=7).to_list()
        == reasoning_gym_dataset("leg_counting", 3, seed=7).to_list()
    )
    assert (
        reasoning_gym_dataset("leg_counting", 3, seed=7)[ENTRY_COLUMN]
        != reasoning_gym_dataset("leg_counting", 3, seed=8)[ENTRY_COLUMN]
    )


def test_a_wrong_task_name_is_refused_with_the_closest_names():
    with pytest.raises(ValueError, match="'leg_countin' is not a reasoning-gym task. Did you mean 'leg_counting'"):
        reasoning_gym_dataset("leg_countin", size=2)
    with pytest.raises(ValueError, match="system_prompt must be one of"):
        reasoning_gym_dataset("leg_counting", size=2, system_prompt="chatty")
    assert len(reasoning_gym_tasks()) > 50


def test_task_settings_and_a_system_message_of_ones_own():
    dataset = reasoning_gym_dataset(
        "basic_arithmetic", size=6, seed=0, system_message="Reply with the number.",
        min_terms=2, max_terms=2, min_digits=1, max_digits=1, operators=["+"],
        allow_negation=False, allow_parentheses=False,
    )  # fmt: skip
    assert all(row["prompt"][0] == {"role": "system", "content": "Reply with the number."} for row in dataset)
    for entry in map(json.loads, dataset[ENTRY_COLUMN]):
        left, right = entry["question"].removeprefix("Calculate ").rstrip(".").split(" + ")
        assert (
            int(left) + int(right) == int(entry["answer"]) and max(int(left), int(right)) <= 10
        )  # its 1-digit range ends at 10
    with pytest.raises(ValueError, match="has no setting 'max_animal'; its settings: .*max_animals"):
        reasoning_gym_dataset("leg_counting", size=2, max_animal=3)


def test_train_py_reads_task_settings_as_json():
    from vcppo_trl.cli.datasets import reasoning_gym_settings

    assert reasoning_gym_settings(None) == {} and reasoning_gym_settings("") == {}
    assert reasoning_gym_settings('{"max_terms": 2}') == {"max_terms": 2}
    assert reasoning_gym_settings({"max_terms": 2}) == {"max_terms": 2}  # a mapping in a --config YAML
    with pytest.raises(ValueError, match="is not JSON"):
        reasoning_gym_settings("max_terms=2")
    with pytest.raises(ValueError, match="must be a JSON object"):
        reasoning_gym_settings("[2]")

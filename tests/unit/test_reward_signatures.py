"""Reward functions checked against the dataset's columns when the trainer is built (issue 47), not after the first
rollout."""

from __future__ import annotations

import functools

import pytest

from vcppo_trl.rewards import math_verify_reward
from vcppo_trl.trainer.prompts import check_reward_signatures

COLUMNS = ["prompt", "solution", "difficulty"]


def takes_kwargs(completions, **kwargs):
    return [0.0] * len(completions)


def needs_solution(completions, solution, **kwargs):
    return [0.0] * len(completions)


def needs_answer(completions, answer, **kwargs):
    return [0.0] * len(completions)


def no_kwargs(prompts, completions):
    return [0.0] * len(completions)


def every_keyword(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, solution, difficulty):
    return [0.0] * len(completions)


def test_functions_that_their_calls_can_serve_pass():
    check_reward_signatures([takes_kwargs, needs_solution, every_keyword], COLUMNS, "train_dataset")
    check_reward_signatures([math_verify_reward], COLUMNS, "train_dataset")
    check_reward_signatures([functools.partial(needs_answer, answer="4")], ["prompt"], "train_dataset")
    check_reward_signatures([lambda completions, **kw: [1.0] * len(completions)], ["prompt"], "train_dataset")


def test_a_required_argument_that_is_no_column_is_named_with_the_contract():
    with pytest.raises(
        ValueError,
        match="'needs_answer' needs the argument 'answer', which is neither a column of "
        "train_dataset \\(its columns: prompt, solution, difficulty\\).*f\\(prompts=..., completions=",
    ):
        check_reward_signatures([takes_kwargs, needs_answer], COLUMNS, "train_dataset")


def test_math_verify_on_a_dataset_without_solution_fails_at_build_time():
    with pytest.raises(ValueError, match="needs the argument 'solution'.*Add a 'solution' column"):
        check_reward_signatures([math_verify_reward], ["prompt", "answer"], "train_dataset")


def test_a_function_without_kwargs_that_would_get_more_keywords_is_refused():
    with pytest.raises(
        ValueError,
        match="'no_kwargs' takes no \\*\\*kwargs and would be given completion_ids, "
        "difficulty, log_extra, log_metric, solution, trainer_state",
    ):
        check_reward_signatures([no_kwargs], COLUMNS, "train_dataset")


def test_a_positional_only_parameter_is_refused():
    def positional(completions, /, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match="positional-only parameter 'completions'"):
        check_reward_signatures([positional], COLUMNS, "train_dataset")


def test_reward_models_and_unreadable_signatures_are_not_checked():
    import torch

    check_reward_signatures([torch.nn.Linear(2, 1), max], COLUMNS, "train_dataset")


def test_the_trainer_refuses_a_reward_function_its_dataset_cannot_serve(make_trainer):
    def needs_answer(completions, answer, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(
        ValueError, match="'needs_answer' needs the argument 'answer', which is neither a column of train_dataset"
    ):
        make_trainer(reward_funcs=needs_answer)

"""The cold start says so when it ends at its step cap below its target accuracy (issue 23)."""

import logging

import pytest

from vcppo_trl.toy import cold_start_sft

from ..builders import tiny_policy, tiny_splits

LOGGER = "vcppo_trl.toy.cold_start"


@pytest.fixture(scope="module")
def splits():
    return tiny_splits(64, 8, max_digits=2)


def _run(tokenizer, splits, tmp_path, target_accuracy, max_steps=5):
    cold_start_sft(
        tiny_policy(tokenizer),
        tokenizer,
        splits["train"],
        output_dir=str(tmp_path / "sft"),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        target_accuracy=target_accuracy,
        eval_dataset=splits["test"],
        eval_steps=2,
    )


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def test_warns_when_the_step_cap_ends_the_cold_start_below_target(tokenizer, splits, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _run(tokenizer, splits, tmp_path, target_accuracy=0.99)  # out of reach in 5 steps
    messages = _warnings(caplog)
    assert len(messages) == 1, messages
    message = messages[0]
    # The exact match reached (measured at the last step, 5, although the checks run every 2 steps), the target, the
    # step cap, and the options to change.
    assert "held-out exact match 0.000" in message
    assert "target 0.99" in message
    assert "step 5 (step cap 5)" in message
    for option in ("--toy_cold_start_steps", "--toy_cold_start_learning_rate", "--toy_num_heads"):
        assert option in message


def test_silent_when_the_target_is_reached(tokenizer, splits, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _run(tokenizer, splits, tmp_path, target_accuracy=0.0, max_steps=2)  # reached at the first check
    assert _warnings(caplog) == []

"""Value pretraining, then PPO, as a user sees the two phases (issue 59): the critic trains at its rate after
pretraining, `global_step` counts the updates of both phases, and the progress bar ends full when pretraining stops
early."""

from __future__ import annotations

import pytest

from tests import builders
from vcppo_trl import ValuePretrainCallback
from vcppo_trl.trainer.console import RolloutProgressCallback


def test_the_critic_trains_at_its_rate_after_pretraining_and_the_bar_ends_full(tiny_config):
    value_lr = 2e-3
    # max_steps=3 PPO updates after a pretraining phase planned for 6 updates and stopped after 2 (patience 1 and a
    # relative improvement of 99.9 % that one update cannot make).
    callback = ValuePretrainCallback(max_steps=6, patience=1, min_delta=0.999)
    trainer = builders.tiny_trainer(
        args=tiny_config(max_steps=3, value_learning_rate=value_lr, lr_scheduler_type="linear", disable_tqdm=False),
        callbacks=[callback],
    )
    bar = next(c for c in trainer.callback_handler.callbacks if isinstance(c, RolloutProgressCallback))
    ends = []
    on_train_end = bar.on_train_end

    def record_end(args, state, control, **kwargs):
        ends.append((bar.training_bar.n, bar.training_bar.total, bar.training_bar.desc.rstrip(": ")))
        return on_train_end(args, state, control, **kwargs)

    bar.on_train_end = record_end
    trainer.train()

    assert callback.steps == 2
    # global_step counts every update: the 2 value-pretraining ones, then the 3 PPO ones (max_steps: PPO updates).
    assert trainer.state.global_step == trainer.state.max_steps == 5
    assert trainer.num_ppo_updates == 3
    ppo = [e for e in trainer.state.log_history if "value_lr" in e and "value_pretrain/loss_avg" not in e]
    assert len(ppo) == 3
    # The PPO phase's critic schedule is its own: linear over the 3 PPO updates (2 optimizer steps each), from the
    # full rate, whatever pretraining used; the policy's is the same schedule.
    steps = 3 * 2
    assert [e["value_lr"] for e in ppo] == pytest.approx([value_lr * (steps - 2 * k - 2) / steps for k in range(3)])
    assert [e["lr"] for e in ppo] == pytest.approx([1e-3 * (steps - 2 * k - 2) / steps for k in range(3)])
    assert ends == [(5, 5, "VC-PPO")]  # the bar shrank with the run and ends full, on the PPO phase

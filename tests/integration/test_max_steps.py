"""`max_steps` is the number of PPO updates, as in transformers (issue 47): over num_train_epochs and total_episodes,
with value pretraining's updates on top."""

from __future__ import annotations


def test_max_steps_runs_that_many_ppo_updates(fresh_trainer):
    trainer = fresh_trainer(max_steps=3, total_episodes=32)  # total_episodes alone: 2 updates of 16 sequences
    trainer.train()
    assert trainer.state.global_step == 3
    assert trainer.num_ppo_updates == 3


def test_value_pretraining_comes_on_top_of_max_steps(fresh_trainer):
    trainer = fresh_trainer(max_steps=2, value_pretrain_steps=2)
    trainer.train()
    assert trainer.num_ppo_updates == 2
    assert trainer.state.global_step == 4  # 2 value-pretraining updates, then 2 PPO updates


def test_the_first_ppo_update_is_logged_whatever_logging_steps(fresh_trainer):
    trainer = fresh_trainer(max_steps=2, value_pretrain_steps=3, logging_steps=3)
    trainer.train()
    logged = [entry["step"] for entry in trainer.state.log_history if "episode" in entry]
    assert logged == [3, 4]  # the last value-pretraining update (logging_steps) and the first PPO one (a new phase)

"""Learning-rate schedules: the policy's spans its PPO updates only; the critic has one over value pretraining and
another over the PPO updates (issue 59: pretraining does not spend the critic's rate)."""

import math
import types

import pytest

from vcppo_trl import ValuePretrainCallback
from vcppo_trl.learner.schedules import RoleLR

from ..builders import length_reward

LR, VALUE_LR = 1e-3, 2e-3


def linear_with_warmup(step: int, warmup: int, total: int) -> float:
    """transformers' linear schedule, written out: k/W during warmup, then a linear decay to 0 at `total`."""
    if step < warmup:
        return step / warmup
    return max(0.0, (total - step) / (total - warmup))


def record_lrs(trainer):
    """(policy lr, critic lr) at every optimizer step, read as the step is taken."""
    seen = []
    optimizer = trainer.create_optimizer()
    step = optimizer.step

    def recording_step(self, *args, **kwargs):
        lrs = {g["role"]: g["lr"] for g in self.param_groups}
        seen.append((lrs["policy"], lrs["value"]))
        return step(*args, **kwargs)

    optimizer.step = types.MethodType(recording_step, optimizer)  # a bound method, as the scheduler expects
    return seen


@pytest.mark.parametrize("stop_early", [False, True])
def test_policy_schedule_starts_at_first_ppo_update(make_trainer, tiny_config, stop_early):
    # 16 prompts per update, 2 optimizer steps per update: 2 PPO updates = 4 policy steps; 4 pretraining updates planned.
    args = tiny_config(
        total_episodes=32,
        learning_rate=LR,
        value_learning_rate=VALUE_LR,
        lr_scheduler_type="linear",
        warmup_steps=2,
    )
    # Early stop: the loss cannot improve by 99.9 % in one update, so patience 1 ends the phase after 2 of the 4 updates.
    callback = ValuePretrainCallback(max_steps=4, patience=1 if stop_early else None, min_delta=0.999)
    trainer = make_trainer(reward_funcs=length_reward, args=args, callbacks=[callback])
    seen = record_lrs(trainer)
    trainer.train()

    pretrain_updates = 2 if stop_early else 4
    assert callback.steps == pretrain_updates
    pretrain_steps = pretrain_updates * 2
    assert len(seen) == pretrain_steps + 4
    policy = [p for p, _ in seen]
    critic = [v for _, v in seen]
    # Frozen policy: exactly 0. Then warmup over 2 steps and decay over its 4 PPO steps, whatever came before.
    assert policy[:pretrain_steps] == [0.0] * pretrain_steps
    assert policy[pretrain_steps:] == pytest.approx([LR * linear_with_warmup(k, 2, 4) for k in range(4)])
    # The critic: one schedule over the 4 planned pretraining updates (8 steps), cut where the phase stops, then the
    # PPO phase's, the same as the policy's, from its start.
    expected_critic = [VALUE_LR * linear_with_warmup(k, 2, 8) for k in range(pretrain_steps)]
    expected_critic += [VALUE_LR * linear_with_warmup(k, 2, 4) for k in range(4)]
    assert critic == pytest.approx(expected_critic)
    assert isinstance(trainer.lr_scheduler, RoleLR)


def test_ppo_schedule_without_pretraining(make_trainer, tiny_config):
    """Plain PPO: both clocks start at the first step and span the same updates."""
    from vcppo_trl import PPOConfig, PPOTrainer

    args = tiny_config(
        PPOConfig, total_episodes=32, learning_rate=LR, value_learning_rate=VALUE_LR, lr_scheduler_type="cosine"
    )
    trainer = make_trainer(cls=PPOTrainer, reward_funcs=length_reward, args=args)
    seen = record_lrs(trainer)
    trainer.train()
    cosine = [0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(4)]
    assert [p for p, _ in seen] == pytest.approx([LR * c for c in cosine])
    assert [v for _, v in seen] == pytest.approx([VALUE_LR * c for c in cosine])


def test_schedule_clocks_survive_resume(make_trainer, tiny_config, tmp_path):
    """The clocks are in the scheduler's state dict, so a resumed run continues both schedules where they were."""
    args = tiny_config(total_episodes=32, lr_scheduler_type="linear", warmup_steps=2, value_pretrain_steps=1)
    trainer = make_trainer(reward_funcs=length_reward, args=args)
    trainer.train()
    state = trainer.lr_scheduler.state_dict()
    assert state["starts"] == {"policy": 2, "value": 2}
    fresh = make_trainer(reward_funcs=length_reward, args=args)
    fresh._setup_training()
    fresh.lr_scheduler.load_state_dict(state)
    assert fresh.lr_scheduler.starts == {"policy": 2, "value": 2}
    # A scheduler saved before the phases had their own critic schedule keeps the critic on its one clock over both
    # phases (linear over 1 + 2 updates of 2 steps, from step 0), as the older run would have continued.
    older = {k: v for k, v in state.items() if k != "phases"} | {"starts": {"policy": 2, "value": 0}}
    fresh.lr_scheduler.load_state_dict(older)
    assert fresh.lr_scheduler.starts == {"policy": 2, "value": 0} and not fresh.lr_scheduler.phases
    multipliers = [lam(3) for lam in fresh.lr_scheduler.lr_lambdas]
    roles = [g["role"] for g in fresh.lr_scheduler.optimizer.param_groups]
    assert multipliers[roles.index("value")] == pytest.approx(linear_with_warmup(3, 2, 6))
    assert multipliers[roles.index("policy")] == pytest.approx(linear_with_warmup(1, 2, 4))
    assert fresh.lr_scheduler.state_dict()["phases"] is False  # saved again, it stays on its one clock

"""Checkpoints and resuming: a stopped-and-resumed run equals an uninterrupted one; saves are atomic and checked."""

import os
import shutil

import pytest
import torch

from vcppo_trl import CheckpointError, InsufficientDiskSpaceError, PPOTrainer, VAPOTrainer, VCPPOTrainer
from vcppo_trl.checkpoint.files import missing_checkpoint_files, read_training_state
from vcppo_trl.trainer.value_pretraining import saved_phase

from ..builders import step_logs, tiny_policy


def assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize(
    "trainer_cls, extra, resume_at",
    [
        (VCPPOTrainer, {"value_pretrain_steps": 2}, 1),  # stopped inside value pretraining
        (VCPPOTrainer, {"value_pretrain_steps": 2}, 3),  # stopped after it
        (PPOTrainer, {"kl_coef": 0.05}, 2),  # plain PPO with a reference model
        # token budgets (grouped, cut micro-batches and forwards), resumed after value pretraining
        (VCPPOTrainer, {"value_pretrain_steps": 2, "max_tokens_per_micro_batch": 40, "max_tokens_per_forward": 64}, 3),
        # ... and padding-free, resumed inside value pretraining
        (VCPPOTrainer, {"value_pretrain_steps": 2, "max_tokens_per_micro_batch": 40, "padding_free": True}, 1),
        # VAPO's preset with every policy-loss term and overlong shaping on, resumed after value pretraining
        (
            VAPOTrainer,
            {
                "value_pretrain_steps": 2,
                "num_generations": 4,
                "lam_actor_length_alpha": 0.5,
                "dual_clip_c": 3.0,
                "entropy_coef": 0.01,
                "mask_truncated_completions": True,
                "overlong_buffer_length": 8,
            },
            3,
        ),
        # dynamic sampling: an update draws as many prompt batches as its generation rounds; resumed after pretraining
        (
            VCPPOTrainer,
            {
                "value_pretrain_steps": 2,
                "num_generations": 4,
                "dynamic_sampling": True,
                "dynamic_sampling_max_rounds": 3,
            },
            3,
        ),
        # group advantage estimators (no critic): GRPO's KL loss term and RLOO's KL in the reward
        (VCPPOTrainer, {"advantage_estimator": "grpo", "num_generations": 4, "kl_coef": 0.1}, 2),
        (PPOTrainer, {"advantage_estimator": "rloo", "num_generations": 4, "normalize_advantages": True}, 2),
    ],
)
def test_resumed_run_equals_uninterrupted_run(
    tokenizer, tiny_config, make_trainer, tmp_path, trainer_cls, extra, resume_at
):
    config_cls = trainer_cls._config_class
    value_pretraining = issubclass(trainer_cls, VCPPOTrainer) and extra.get("value_pretrain_steps", 0) > 0

    def make(output_dir, **overrides):
        args = tiny_config(
            config_cls, output_dir=str(output_dir), total_episodes=48, save_strategy="steps", save_steps=1, **extra
        )
        for k, v in overrides.items():
            setattr(args, k, v)
        return make_trainer(trainer_cls, model=tiny_policy(tokenizer), args=args)

    full = make(tmp_path / "full")
    full.train()
    total = full.state.global_step
    assert total == 3 + (2 if value_pretraining else 0)
    checkpoint = str(tmp_path / "full" / f"checkpoint-{resume_at}")
    saved = read_training_state(checkpoint)
    assert saved["global_step"] == resume_at
    if extra.get("dynamic_sampling"):
        assert saved["batches_consumed"] >= resume_at
    else:
        assert saved["batches_consumed"] == resume_at
    if value_pretraining:
        pretrain = saved["callbacks"]["ValuePretrainCallback"]
        assert pretrain["done"] == (resume_at >= 2) and pretrain["steps"] == min(resume_at, 2)

    resumed = make(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=checkpoint)
    assert resumed.state.global_step == total
    full_policy, full_critic = full.unwrapped_policy_and_critic()
    policy, critic = resumed.unwrapped_policy_and_critic()
    assert_same_weights(full_policy, policy)  # bit-identical on CPU
    if extra.get("advantage_estimator") in ("grpo", "rloo"):
        assert full_critic is None and critic is None
        assert not os.path.isdir(os.path.join(checkpoint, "value_model"))
    else:
        assert_same_weights(full_critic, critic)
    full_logs, resumed_logs = step_logs(full), step_logs(resumed)
    assert sorted(resumed_logs) == list(range(1, total + 1))  # the history before the stop is kept
    for step in range(resume_at + 1, total + 1):
        assert resumed_logs[step] == full_logs[step], step
    assert resumed.batches_consumed == full.batches_consumed
    if extra.get("dynamic_sampling"):  # extra generation rounds ran, and the resumed run drew the same prompts
        assert full.batches_consumed > total
    if trainer_cls is VAPOTrainer:  # the new terms ran and were logged
        last = full_logs[total]
        assert {"loss/positive_example_lm_avg", "policy/clipfrac_dual_avg", "reward/overlong_penalty"} <= set(last)
    if value_pretraining and resume_at < 2:
        # Resumed inside pretraining: the phase finished in the resumed run and saved the critic there.
        assert resumed.value_pretrain_callback.done and resumed.value_pretrain_callback.steps == 2
        assert os.path.isdir(tmp_path / "resumed" / "value_pretrained")
    elif value_pretraining:
        # Resumed after it: it is not run again.
        assert not os.path.isdir(tmp_path / "resumed" / "value_pretrained")
        assert all("value_pretrain/loss_avg" not in m for m in resumed_logs.values() if m["step"] > resume_at)


def test_updates_left_unused_by_an_early_end_of_value_pretraining_stay_out_after_resuming(
    make_trainer, tiny_config, tokenizer
):
    # The value loss can never improve by 1000 %: the phase ends after its first update instead of 4.
    early = dict(value_pretrain_steps=4, value_pretrain_min_steps=1, value_pretrain_patience=1)
    args = tiny_config(total_episodes=32, save_strategy="steps", save_steps=1, value_pretrain_min_delta=10.0, **early)
    full = make_trainer(args=args)
    full.train()
    assert full.state.global_step == full.state.max_steps == 1 + 2
    saved = read_training_state(os.path.join(args.output_dir, "checkpoint-1"))
    assert (saved["value_pretraining"], saved["value_pretrain_updates"]) == (False, 1)
    resumed = make_trainer(model=tiny_policy(tokenizer), args=args)
    resumed.train(resume_from_checkpoint=os.path.join(args.output_dir, "checkpoint-1"))
    assert resumed.state.global_step == resumed.state.max_steps == 3


def test_a_longer_value_pretraining_when_resuming_inside_it_keeps_every_ppo_update(
    make_trainer, tiny_config, tokenizer
):
    args = tiny_config(total_episodes=48, save_strategy="steps", save_steps=1, value_pretrain_steps=2)
    make_trainer(args=args).train()
    longer = tiny_config(output_dir=args.output_dir + "-longer", total_episodes=48, value_pretrain_steps=3)
    resumed = make_trainer(model=tiny_policy(tokenizer), args=longer)
    resumed.train(resume_from_checkpoint=os.path.join(args.output_dir, "checkpoint-1"))
    assert resumed.value_pretrain_callback.steps == 3  # the phase keeps the new limit
    assert sum("loss/policy_avg" in entry for entry in resumed.state.log_history) == 3  # and PPO its 3 updates


@pytest.mark.parametrize(
    "old, phase",
    [
        ({"policy_frozen": True, "max_steps": 5, "num_ppo_updates": 3}, (True, None)),  # inside value pretraining
        ({"policy_frozen": False, "max_steps": 4, "num_ppo_updates": 3}, (False, 1)),  # after it ended early
        ({"policy_frozen": False, "max_steps": 3, "num_ppo_updates": 3}, (False, None)),  # plain PPO
    ],
)
def test_the_phase_of_a_checkpoint_saved_before_the_trainer_saved_it(old, phase):
    assert saved_phase(old) == phase


def test_resume_true_takes_latest_checkpoint(make_trainer, tiny_config, tokenizer):
    args = tiny_config(total_episodes=32, save_strategy="steps", save_steps=1)
    make_trainer(args=args).train()
    resumed = make_trainer(model=tiny_policy(tokenizer), args=tiny_config(total_episodes=48))
    resumed.args.output_dir = args.output_dir
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 3  # continued from checkpoint-2, with a larger budget


def test_checkpoint_write_is_atomic_when_save_fails(make_trainer, tiny_config, monkeypatch):
    args = tiny_config(total_episodes=48, save_strategy="steps", save_steps=1)
    trainer = make_trainer(args=args)
    calls = {"n": 0}
    original = trainer._save_optimizer_and_scheduler

    def fail_on_second_save(output_dir):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        return original(output_dir)

    monkeypatch.setattr(trainer, "_save_optimizer_and_scheduler", fail_on_second_save)
    with pytest.raises(OSError, match="No space left"):
        trainer.train()
    assert sorted(os.listdir(args.output_dir)) == ["checkpoint-1"]  # no half-written checkpoint-2, no tmp dir
    assert missing_checkpoint_files(os.path.join(args.output_dir, "checkpoint-1"), 1) == []


def test_checkpoint_needs_free_space(make_trainer, tiny_config, monkeypatch):
    import vcppo_trl.checkpoint.files as checkpointing

    args = tiny_config(total_episodes=32, save_strategy="steps", save_steps=1)
    trainer = make_trainer(args=args)
    real = shutil.disk_usage
    monkeypatch.setattr(
        checkpointing.shutil,
        "disk_usage",
        lambda path: real(path)._replace(free=1024) if trainer.state.global_step >= 2 else real(path),
    )
    with pytest.raises(InsufficientDiskSpaceError, match="Nothing was written"):
        trainer.train()
    assert sorted(os.listdir(args.output_dir)) == ["checkpoint-1"]


def test_stale_temp_checkpoint_is_removed_and_never_resumed(make_trainer, tiny_config, tokenizer):
    args = tiny_config(total_episodes=16, save_strategy="steps", save_steps=1)
    stale = os.path.join(args.output_dir, "tmp-checkpoint-9")
    os.makedirs(stale)
    with pytest.raises(CheckpointError, match="no checkpoint-<step>"):
        make_trainer(args=args).train(resume_from_checkpoint=True)
    make_trainer(model=tiny_policy(tokenizer), args=args).train()
    assert sorted(os.listdir(args.output_dir)) == ["checkpoint-1"]


@pytest.mark.parametrize("damage", ["truncate_critic", "remove_optimizer", "remove_state"])
def test_damaged_checkpoint_is_refused(make_trainer, tiny_config, tokenizer, damage):
    args = tiny_config(total_episodes=16, save_strategy="steps", save_steps=1)
    make_trainer(args=args).train()
    checkpoint = os.path.join(args.output_dir, "checkpoint-1")
    if damage == "truncate_critic":
        path = os.path.join(checkpoint, "value_model", "model.safetensors")
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
        message = "damaged"
    else:
        os.remove(os.path.join(checkpoint, "optimizer.pt" if damage == "remove_optimizer" else "vcppo_state.json"))
        message = "incomplete"
    trainer = make_trainer(model=tiny_policy(tokenizer), args=tiny_config(total_episodes=32))
    with pytest.raises(CheckpointError, match=message):
        trainer.train(resume_from_checkpoint=checkpoint)


@pytest.mark.parametrize("written_by", ["deepspeed", "fsdp2"])
def test_a_checkpoint_of_another_backend_is_refused_with_the_way_out(make_trainer, tiny_config, tokenizer, written_by):
    """A one-process run resuming from a checkpoint whose optimizer state DeepSpeed or FSDP2 wrote (made so by hand:
    their files in place of optimizer.pt) stops before loading anything, naming both backends and the weights to
    start a new run from; the same check refuses the other directions (`checkpoint_backend` below)."""
    args = tiny_config(total_episodes=16, save_strategy="steps", save_steps=1)
    make_trainer(args=args).train()
    checkpoint = os.path.join(args.output_dir, "checkpoint-1")
    os.remove(os.path.join(checkpoint, "optimizer.pt"))
    if written_by == "deepspeed":
        os.makedirs(os.path.join(checkpoint, "global_step1"))
        open(os.path.join(checkpoint, "latest"), "w").write("global_step1")
        name = "DeepSpeed"
    else:
        os.makedirs(os.path.join(checkpoint, "fsdp2_states"))
        name = "FSDP2"
    trainer = make_trainer(model=tiny_policy(tokenizer), args=tiny_config(total_episodes=32))
    with pytest.raises(CheckpointError, match=f"written under {name} and this run uses DDP") as error:
        trainer.train(resume_from_checkpoint=checkpoint)
    assert "value_model" in str(error.value) and "value_pretrain_steps=0" in str(error.value)


def test_checkpoint_backend_reads_which_backend_wrote_the_optimizer_state(tmp_path):
    from vcppo_trl.checkpoint import check_checkpoint_backend, checkpoint_backend

    layouts = {"ddp": ["optimizer.pt"], "deepspeed": ["latest", "global_step3/"], "fsdp2": ["fsdp2_states/"]}
    for backend, names in layouts.items():
        folder = tmp_path / backend
        folder.mkdir()
        for name in names:
            (folder / name).mkdir() if name.endswith("/") else (folder / name).write_text("")
        assert checkpoint_backend(str(folder)) == backend
        check_checkpoint_backend(str(folder), backend)
        for other in set(layouts) - {backend}:
            with pytest.raises(CheckpointError, match="are not converted into each other"):
                check_checkpoint_backend(str(folder), other)
    assert checkpoint_backend(str(tmp_path)) is None  # nothing of any: left to the completeness check


def test_resume_with_other_batch_size_is_refused(make_trainer, tiny_config, tokenizer):
    args = tiny_config(total_episodes=16, save_strategy="steps", save_steps=1)
    make_trainer(args=args).train()
    trainer = make_trainer(model=tiny_policy(tokenizer), args=tiny_config(total_episodes=32, num_mini_batches=1))
    with pytest.raises(CheckpointError, match="prompts per update"):
        trainer.train(resume_from_checkpoint=os.path.join(args.output_dir, "checkpoint-1"))


def test_same_seed_gives_identical_metrics(make_trainer, tiny_config, tokenizer):
    first = make_trainer(model=tiny_policy(tokenizer), args=tiny_config(total_episodes=32))
    first.train()
    second = make_trainer(model=tiny_policy(tokenizer), args=tiny_config(total_episodes=32))
    second.train()
    assert step_logs(first) == step_logs(second)
    assert len(step_logs(first)) == 2

"""PPOTrainer and VCPPOTrainer on a tiny model: updates, value pretraining, checkpoints and bad input."""

import glob
import math
import os

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from vcppo_trl import PPOConfig, PPOTrainer, ValuePretrainCallback, VCPPOTrainer, math_verify_reward
from vcppo_trl.sampling.seam import truncate_at_stop

from ..builders import StopAfterPretraining, length_reward


def _clone_state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _changed(before, model):
    return [k for k, v in model.state_dict().items() if not torch.equal(before[k], v)]


def test_ppo_trainer_updates_policy_and_critic(make_trainer, tiny_policy, tokenizer, toy_splits, tiny_config):
    args = tiny_config(PPOConfig, kl_coef=0.1)
    trainer = make_trainer(cls=PPOTrainer, reward_funcs=length_reward, args=args)
    before_policy = _clone_state(tiny_policy)
    critic = trainer.model.critic
    before_critic = _clone_state(critic)
    trainer.train()
    assert trainer.state.global_step == 32 // 16  # total_episodes / (4 × 2 × 2 prompts per update)
    logs = [h for h in trainer.state.log_history if "loss/policy_avg" in h]
    assert len(logs) == trainer.state.global_step
    for log in logs:
        for key in ("loss/policy_avg", "loss/value_avg", "objective/kl", "policy/entropy_avg", "val/clipfrac_avg"):
            assert math.isfinite(log[key]), key
        assert "value/explained_variance" in log
        assert "diagnostics/advantage_position_corr" in log
        assert log["diagnostics/response_length_min"] <= log["diagnostics/response_length_mean"]
    assert _changed(before_policy, tiny_policy), "policy weights did not change"
    assert _changed(before_critic, critic), "critic weights did not change"
    # KL is on: a frozen reference copy exists and did not move.
    assert trainer.ref_model is not None
    for k, v in trainer.ref_model.state_dict().items():
        assert torch.equal(v, before_policy[k])


def test_no_reference_model_when_kl_is_zero(make_trainer, tiny_policy, tokenizer, toy_splits, tiny_config):
    trainer = make_trainer(cls=PPOTrainer, reward_funcs=length_reward, args=tiny_config(PPOConfig, kl_coef=0.0))
    assert trainer.ref_model is None


def test_value_pretraining_freezes_policy_and_saves_critic(
    make_trainer, tiny_policy, tokenizer, toy_splits, tiny_config
):
    args = tiny_config(value_pretrain_steps=3, value_pretrain_save_steps=[2], total_episodes=8, weight_decay=0.1)
    trainer = make_trainer(reward_funcs=length_reward, args=args)
    callback = trainer.value_pretrain_callback
    assert isinstance(callback, ValuePretrainCallback)
    before_policy = _clone_state(tiny_policy)
    before_critic = _clone_state(trainer.model.critic)

    # Stop right after the pretraining phase to check the policy is bit-identical.
    trainer.add_callback(StopAfterPretraining(callback))
    trainer.train()
    assert callback.done and callback.steps == 3
    assert trainer.state.global_step == 3
    assert not _changed(before_policy, tiny_policy), "the policy moved during value pretraining"
    assert _changed(before_critic, trainer.model.critic), "the critic did not train"
    assert not trainer.in_value_pretraining
    pretrain_logs = [h for h in trainer.state.log_history if "value_pretrain/loss_avg" in h]
    assert len(pretrain_logs) == 3
    assert all("value_pretrain/explained_variance" in h for h in pretrain_logs)
    assert all("loss/policy_avg" not in h for h in pretrain_logs)

    path = os.path.join(args.output_dir, "value_pretrained")
    critic = AutoModelForTokenClassification.from_pretrained(path)
    assert critic.config.num_labels == 1
    for k, v in trainer.model.critic.state_dict().items():
        assert torch.equal(critic.state_dict()[k], v)
    assert os.path.exists(os.path.join(path, "tokenizer_config.json"))
    assert os.path.isdir(os.path.join(args.output_dir, "value_pretrained-step-2"))


def test_vcppo_after_pretraining_trains_policy(make_trainer, tiny_policy, tokenizer, toy_splits, tiny_config):
    args = tiny_config(value_pretrain_steps=2, total_episodes=16)
    trainer = make_trainer(reward_funcs=length_reward, args=args)
    before = _clone_state(tiny_policy)
    trainer.train()
    assert trainer.state.global_step == 2 + 1
    assert _changed(before, tiny_policy)
    ppo_logs = [h for h in trainer.state.log_history if "loss/policy_avg" in h]
    assert len(ppo_logs) == 1


def test_pretraining_stops_early_on_explained_variance(make_trainer, tiny_policy, tokenizer, toy_splits, tiny_config):
    args = tiny_config(
        value_pretrain_steps=5,
        value_pretrain_stop_explained_variance=-1e9,
        total_episodes=8,
        value_pretrain_min_steps=2,
    )
    trainer = make_trainer(reward_funcs=length_reward, args=args)
    trainer.train()
    callback = trainer.value_pretrain_callback
    assert callback.steps == 2 and "explained variance" in callback.stop_reason
    assert trainer.state.global_step == 2 + 1  # PPO keeps its own number of updates


def test_value_model_path_skips_pretraining(
    make_trainer, tiny_policy, tokenizer, toy_splits, tiny_config, tmp_path, caplog
):
    first = make_trainer(reward_funcs=length_reward, args=tiny_config(value_pretrain_steps=1, total_episodes=8))
    first.train()
    saved = os.path.join(first.args.output_dir, "value_pretrained")
    args = tiny_config(
        value_pretrain_steps=4, value_model_path=saved, total_episodes=8, output_dir=str(tmp_path / "b")
    )
    caplog.clear()
    with caplog.at_level("WARNING"):
        second = make_trainer(reward_funcs=length_reward, args=args)
    assert second.value_pretrain_callback is None
    # The skip is said, once, with the path.
    skipped = [r.getMessage() for r in caplog.records if "value pretraining is skipped" in r.getMessage()]
    assert len(skipped) == 1 and saved in skipped[0]
    loaded = AutoModelForTokenClassification.from_pretrained(saved)
    for k, v in loaded.state_dict().items():
        assert torch.equal(second.model.critic.state_dict()[k], v)
    second.train()
    assert second.state.global_step == 1
    assert not any("value_pretrain/loss_avg" in h for h in second.state.log_history)


def test_save_model_writes_policy_and_critic(make_trainer, tiny_policy, tokenizer, toy_splits, tiny_config):
    trainer = make_trainer(reward_funcs=length_reward, args=tiny_config(total_episodes=8))
    trainer.train()
    out = trainer.args.output_dir
    trainer.save_model(out)
    policy = AutoModelForCausalLM.from_pretrained(out)
    for k, v in policy.state_dict().items():
        assert torch.equal(v, tiny_policy.state_dict()[k])
    critic = AutoModelForTokenClassification.from_pretrained(os.path.join(out, "value_model"))
    assert critic.config.num_labels == 1


def test_evaluate_reports_accuracy_and_pass_at_k(make_trainer, tiny_policy, tokenizer, toy_splits, tiny_config):
    def always_right(completions, **kwargs):
        return [1.0] * len(completions)

    trainer = make_trainer(
        reward_funcs=always_right, args=tiny_config(eval_num_generations=3), eval_dataset=toy_splits["test"]
    )
    metrics = trainer.evaluate()
    assert metrics["eval_accuracy"] == 1.0
    assert metrics["eval_pass@3"] == 1.0
    assert metrics["eval_num_samples"] == 3 * len(toy_splits["test"])
    assert metrics["eval_response_length_mean"] > 0


def test_math_verify_reward_in_the_loop(make_trainer, tiny_policy, tokenizer, toy_splits, tiny_config):
    trainer = make_trainer(reward_funcs=[math_verify_reward], args=tiny_config(total_episodes=8))
    trainer.train()
    log = next(h for h in trainer.state.log_history if "rewards/math_verify_reward/mean" in h)
    assert log["rewards/math_verify_reward/mean"] == -1.0  # an untrained model never answers right
    assert log["diagnostics/accuracy"] == 0.0


def test_none_rewards_skip_samples(make_trainer, tiny_policy, tokenizer, toy_splits, tiny_config):
    def half_none(completions, **kwargs):
        return [None if i % 2 else 1.0 for i in range(len(completions))]

    trainer = make_trainer(reward_funcs=half_none, args=tiny_config(total_episodes=8))
    trainer.train()
    log = next(h for h in trainer.state.log_history if "diagnostics/skipped_samples" in h)
    assert log["diagnostics/skipped_samples"] == 8
    # Skipped samples are left out of per-sample metrics, not counted as 0.
    assert log["objective/scores"] == pytest.approx(1.0)
    rollout = trainer.last_update.rollout
    lengths = rollout.response_mask.sum(1)[~torch.isnan(rollout.raw_scores)].float()
    assert log["diagnostics/response_length_mean"] == pytest.approx(float(lengths.mean()))
    assert log["diagnostics/response_length_min"] == float(lengths.min()) >= 1


def test_truncate_at_stop_uses_first_stop_even_when_pad_is_eos():
    eos = pad = 2
    responses = torch.tensor([[5, 6, 2, 2, 2], [5, 2, 7, 2, 9], [5, 6, 7, 8, 9]])
    ids, mask, has_stop = truncate_at_stop(responses, [eos], pad)
    assert mask.tolist() == [
        [True, True, True, False, False],
        [True, True, False, False, False],
        [True, True, True, True, True],
    ]
    assert has_stop.tolist() == [True, True, False]
    assert ids.tolist() == [[5, 6, 2, 2, 2], [5, 2, 2, 2, 2], [5, 6, 7, 8, 9]]


# ---------------------------------------------------------------- bad input


def test_missing_prompt_column(make_trainer):
    data = Dataset.from_dict({"question": ["Add 1 and 2."] * 16})
    with pytest.raises(ValueError, match="'prompt' column"):
        make_trainer(train_dataset=data)


@pytest.mark.parametrize(
    "bad_reward, message",
    [
        (lambda completions, **kw: [1.0] * (len(completions) - 1), "returned 15 values for 16"),
        (lambda completions, **kw: [float("nan")] * len(completions), "failed on all 16 samples"),
    ],
)
def test_bad_reward_function(make_trainer, tiny_policy, tokenizer, toy_splits, tiny_config, bad_reward, message):
    from vcppo_trl.rewards.calls import RewardFunctionError

    trainer = make_trainer(reward_funcs=bad_reward, args=tiny_config())
    with pytest.raises(RewardFunctionError, match=message):
        trainer.train()


def test_dataset_smaller_than_batch(make_trainer, tiny_config):
    with pytest.raises(ValueError, match="needs batch_size"):
        make_trainer(args=tiny_config(per_device_train_batch_size=64))


def test_value_checkpoint_with_other_vocabulary(make_trainer, tiny_policy, tiny_config, tmp_path):
    config = tiny_policy.config.__class__.from_dict(tiny_policy.config.to_dict())
    config.vocab_size = config.vocab_size + 7
    config.num_labels = 1
    other = AutoModelForTokenClassification.from_config(config)
    other.save_pretrained(tmp_path / "critic")
    with pytest.raises(ValueError, match="vocabulary"):
        make_trainer(args=tiny_config(value_model_path=str(tmp_path / "critic")))


def test_vcppo_rejects_ppo_config(make_trainer, tiny_config):
    with pytest.raises(TypeError, match="VCPPOConfig"):
        make_trainer(VCPPOTrainer, args=tiny_config(PPOConfig))


def test_reward_model_as_critic(make_trainer, tiny_policy, tokenizer, toy_splits, tiny_config):
    """The paper's PPO baseline initialises the critic from the reward model."""
    from transformers import AutoModelForSequenceClassification

    config = tiny_policy.config.__class__.from_dict(tiny_policy.config.to_dict())
    config.num_labels = 1
    reward_model = AutoModelForSequenceClassification.from_config(config)
    trainer = make_trainer(reward_funcs=length_reward, value_model=reward_model, args=tiny_config(total_episodes=8))
    assert torch.equal(trainer.model.critic.score.weight, reward_model.score.weight)
    trainer.train()


def test_lora_policy_uses_base_model_as_reference(make_trainer, tiny_policy, tokenizer, toy_splits, tiny_config):
    from peft import LoraConfig

    base_before = _clone_state(tiny_policy)
    trainer = make_trainer(
        reward_funcs=length_reward,
        args=tiny_config(kl_coef=0.1, total_episodes=16),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    assert trainer.ref_model is None  # the reference is the base model with adapters disabled
    policy = trainer.model.policy
    lora_before = {k: v.clone() for k, v in policy.state_dict().items() if "lora_B" in k}
    trainer.train()
    log = next(h for h in trainer.state.log_history if "objective/kl" in h)
    assert math.isfinite(log["objective/kl"])
    assert any(not torch.equal(v, policy.state_dict()[k]) for k, v in lora_before.items()), (
        "LoRA weights did not train"
    )
    # Base weights are untouched by LoRA training.
    with policy.disable_adapter():
        base = policy.get_base_model().state_dict()
        for k, v in base_before.items():
            key = k if k in base else k.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias")
            assert torch.equal(base[key], v), k
    trainer.save_model(trainer.args.output_dir)
    assert os.path.isfile(os.path.join(trainer.args.output_dir, "adapter_config.json"))


def test_metrics_reach_tensorboard_and_periodic_eval(
    make_trainer, tiny_policy, tokenizer, toy_splits, tiny_config, tmp_path, monkeypatch
):
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    args = tiny_config(
        total_episodes=32,
        report_to="tensorboard",
        eval_strategy="steps",
        eval_steps=1,
    )
    trainer = make_trainer(reward_funcs=length_reward, args=args, eval_dataset=toy_splits["test"])
    trainer.train()
    evals = [h for h in trainer.state.log_history if "eval_accuracy" in h]
    assert [h["step"] for h in evals] == [1, 2]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    event_dirs = {
        os.path.dirname(p) for p in glob.glob(str(tmp_path / "tb" / "**" / "events.out.tfevents.*"), recursive=True)
    }
    assert event_dirs, "no TensorBoard event file written"
    tags = set()
    for d in event_dirs:
        acc = EventAccumulator(d)
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    assert {"train/objective/scores", "train/value/explained_variance", "eval/accuracy"} <= tags, sorted(tags)


def test_reward_model_as_reward_function(make_trainer, tiny_policy, tokenizer, toy_splits, tiny_config):
    from transformers import AutoModelForSequenceClassification

    config = tiny_policy.config.__class__.from_dict(tiny_policy.config.to_dict())
    config.num_labels = 1
    reward_model = AutoModelForSequenceClassification.from_config(config)
    trainer = make_trainer(
        reward_funcs=[reward_model, length_reward],
        reward_processing_classes=[tokenizer, None],
        args=tiny_config(total_episodes=16, reward_weights=[0.5, 1.0]),
    )
    trainer.train()
    log = next(h for h in trainer.state.log_history if "objective/scores" in h)
    name = trainer.reward_func_names[0]
    expected = 0.5 * log[f"rewards/{name}/mean"] + log["rewards/length_reward/mean"]
    assert log["objective/scores"] == pytest.approx(expected, abs=1e-5)


def test_value_pretrain_callback_by_hand(make_trainer, tiny_policy, tokenizer, toy_splits, tiny_config):
    callback = ValuePretrainCallback(max_steps=4, patience=1, min_delta=10.0, min_steps=2)
    # value_pretrain_steps stays 0: the callback drives the phase.
    trainer = make_trainer(reward_funcs=length_reward, args=tiny_config(total_episodes=16), callbacks=[callback])
    assert trainer.value_pretrain_callback is callback and callback.trainer is trainer
    trainer.train()
    # min_delta=10 means no update ever counts as an improvement, so patience ends the phase at min_steps.
    assert callback.steps == 2 and "has not improved" in callback.stop_reason
    assert trainer.state.global_step == 2 + 1


def test_periodic_checkpoints_hold_policy_critic_and_optimizer(
    make_trainer, tiny_policy, tokenizer, toy_splits, tiny_config
):
    args = tiny_config(total_episodes=48, save_strategy="steps", save_steps=1, save_total_limit=2)
    trainer = make_trainer(reward_funcs=length_reward, args=args)
    trainer.train()
    checkpoints = sorted(glob.glob(os.path.join(args.output_dir, "checkpoint-*")))
    assert [os.path.basename(c) for c in checkpoints] == ["checkpoint-2", "checkpoint-3"]  # save_total_limit=2
    last = checkpoints[-1]
    for name in (
        "model.safetensors",
        "value_model/model.safetensors",
        "optimizer.pt",
        "scheduler.pt",
        "trainer_state.json",
    ):
        assert os.path.isfile(os.path.join(last, name)), name
    policy = AutoModelForCausalLM.from_pretrained(last)
    for k, v in policy.state_dict().items():
        assert torch.equal(v, tiny_policy.state_dict()[k])


def test_length_adaptive_actor_lambda(make_trainer, tiny_policy, tokenizer, toy_splits, tiny_config):
    from vcppo_trl.algo.gae import dual_lambda_gae

    trainer = make_trainer(reward_funcs=length_reward, args=tiny_config(total_episodes=16, lam_actor_length_alpha=0.5))
    mask = torch.arange(16)[None, :] < torch.tensor([16, 4, 1, 0])[:, None]
    lam = trainer.actor_lambda(mask)
    assert torch.allclose(lam, torch.tensor([1 - 1 / 8, 1 - 1 / 2, 0.0, 0.0], dtype=torch.float64))
    trainer.train()  # the per-sequence λ flows through the trainer
    rollout = trainer.last_update.rollout
    advantages, _ = trainer.compute_advantages(rollout)
    expected, _ = dual_lambda_gae(
        rollout.rewards, rollout.values, rollout.response_mask, 1.0, trainer.actor_lambda(rollout.response_mask), 1.0
    )
    assert torch.equal(advantages, expected)


# Every VAPO/DAPO option on, with overlong shaping over half the response length and dynamic sampling.
VAPO_OPTIONS = dict(
    num_generations=4,
    cliprange_high=0.28,
    dual_clip_c=3.0,
    entropy_coef=0.01,
    positive_example_lm_coef=0.1,
    mask_truncated_completions=True,
    overlong_buffer_length=8,
    overlong_penalty_factor=0.5,
    lam_actor_length_alpha=0.5,
    dynamic_sampling=True,
    dynamic_sampling_max_rounds=3,
)


def check_vapo_run(trainer):
    """After training with `VAPO_OPTIONS` (response_length 16): the overlong term is apart from the correctness score,
    and every new metric is logged and finite."""
    rollout = trainer.last_update.rollout
    lengths = rollout.response_mask.sum(1).float()
    expected = -0.5 * ((lengths - 8) / 8).clamp(0, 1)
    expected = torch.where(rollout.has_stop, expected, torch.full_like(expected, -0.5))
    torch.testing.assert_close(rollout.overlong_penalties, expected)
    torch.testing.assert_close(rollout.scores, rollout.raw_scores.nan_to_num(0.0) + rollout.overlong_penalties)
    ppo_rows = [row for row in trainer.state.log_history if "loss/policy_avg" in row]
    assert ppo_rows
    for row in ppo_rows:
        for key in (
            "policy/clipfrac_low_avg",
            "policy/clipfrac_high_avg",
            "policy/clipfrac_dual_avg",
            "loss/positive_example_lm_avg",
            "reward/overlong_penalty",
            "reward/overlong_fraction",
            "sampling/dynamic_rounds",
        ):
            assert math.isfinite(row[key]), key
        assert row["reward/overlong_penalty"] <= 0
        # The accuracy is the correctness score's alone.
        assert 0 <= row["diagnostics/accuracy"] <= 1


def test_every_vapo_option_trains_on_the_hf_sampler(make_trainer, tiny_config):
    from vcppo_trl import VAPOConfig, VAPOTrainer

    args = tiny_config(VAPOConfig, value_pretrain_steps=1, total_episodes=32, **VAPO_OPTIONS)
    trainer = make_trainer(cls=VAPOTrainer, args=args)
    trainer.train()
    assert trainer.state.global_step == 3  # 1 value-pretraining + 2 PPO updates
    check_vapo_run(trainer)


def test_vapo_trainer_builds_its_own_config(tiny_policy, tokenizer, toy_splits, tmp_path, monkeypatch):
    from vcppo_trl import VAPOConfig, VAPOTrainer

    monkeypatch.chdir(tmp_path)
    trainer = VAPOTrainer(tiny_policy, length_reward, train_dataset=toy_splits["train"], processing_class=tokenizer)
    assert type(trainer.args) is VAPOConfig
    assert (trainer.args.cliprange_high, trainer.args.positive_example_lm_coef) == (0.28, 0.1)


def half_settled_reward(prompts, completions, **kwargs):
    """Prompts of even length: every sample correct (an uninformative group); odd: correct by the completion's parity."""
    return [1.0 if len(str(p)) % 2 == 0 else (1.0 if len(c) % 2 else -1.0) for p, c in zip(prompts, completions)]


def test_dynamic_sampling_keeps_informative_groups_and_counts_the_prompts(make_trainer, tiny_config):
    from vcppo_trl.algo.dynamic_sampling import informative_groups

    args = tiny_config(
        value_pretrain_steps=1,
        total_episodes=32,
        num_generations=4,
        dynamic_sampling=True,
        dynamic_sampling_max_rounds=6,
    )
    trainer = make_trainer(reward_funcs=half_settled_reward, args=args)
    trainer.train()
    ppo_rows = [row for row in trainer.state.log_history if "loss/policy_avg" in row]
    assert len(ppo_rows) == 2 and trainer.state.global_step == 3
    # Value pretraining draws one batch per update; each PPO update as many as its generation rounds.
    assert trainer.batches_consumed == 1 + sum(row["sampling/dynamic_rounds"] for row in ppo_rows)
    assert all(
        "sampling/dynamic_rounds" not in row for row in trainer.state.log_history if "value_pretrain/loss_avg" in row
    )
    rollout = trainer.last_update.rollout
    assert rollout.response_ids.shape[0] == 16  # the batch's shape whatever the rounds
    groups = [rollout.prompts[i : i + 4] for i in range(0, 16, 4)]
    assert all(len({str(p) for p in group}) == 1 for group in groups)  # groups stay whole
    informative = informative_groups(rollout.is_correct(args.accuracy_threshold), 4)
    assert int((~informative).sum()) == ppo_rows[-1]["sampling/dynamic_filled_groups"]


def test_dynamic_sampling_stops_at_the_round_limit_and_completes_the_batch(make_trainer, tiny_config, caplog):
    args = tiny_config(
        value_pretrain_steps=0,
        total_episodes=32,
        num_generations=4,
        dynamic_sampling=True,
        dynamic_sampling_max_rounds=3,
    )
    trainer = make_trainer(reward_funcs=lambda completions, **kw: [1.0] * len(completions), args=args)
    with caplog.at_level("WARNING"):
        trainer.train()
    rows = [row for row in trainer.state.log_history if "sampling/dynamic_rounds" in row]
    assert [row["sampling/dynamic_rounds"] for row in rows] == [3, 3]
    assert all(
        row["sampling/dynamic_filled_groups"] == 4 and row["sampling/dynamic_informative_fraction"] == 0
        for row in rows
    )
    assert trainer.batches_consumed == 6
    assert caplog.text.count("Dynamic sampling: 3 generation rounds") == 1
    assert trainer.last_update.rollout.response_ids.shape[0] == 16


def test_dynamic_sampling_needs_several_samples_per_prompt(tmp_path):
    with pytest.raises(ValueError, match="num_generations >= 2"):
        PPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, dynamic_sampling=True)


def test_bf16_run_with_fp32_lm_head(make_trainer, tokenizer, tiny_config):
    """`bf16=True, cast_lm_head_to_fp32=True` on a bf16 policy with untied embeddings: the heads of the policy and of
    the reference are float32 through the run, the first (on-policy) step's ratio is exactly 1, and the saved head is
    float32 beside bf16 weights."""
    from safetensors import safe_open

    from vcppo_trl.models import is_fp32_head

    from ..builders import tiny_policy

    policy = tiny_policy(tokenizer, tie_word_embeddings=False).to(torch.bfloat16)
    args = tiny_config(
        PPOConfig,
        bf16=True,
        cast_lm_head_to_fp32=True,
        kl_coef=0.1,  # a reference model, and no on-policy shortcut: the rollout forward computes the old log-probs
        num_mini_batches=1,
        gradient_accumulation_steps=4,
        total_episodes=16,
    )
    trainer = make_trainer(PPOTrainer, model=policy, args=args)
    trainer.train()
    assert trainer.state.global_step == 1
    for model in (trainer.model.policy, trainer.ref_model):
        assert is_fp32_head(model.lm_head) and model.lm_head.weight.dtype == torch.float32
    assert trainer.model.policy.model.embed_tokens.weight.dtype == torch.bfloat16
    (log,) = [h for h in trainer.state.log_history if "val/ratio_avg" in h]
    assert log["val/ratio_avg"] == 1.0  # one optimizer step, before which the policy is the rollout's
    trainer.save_model(args.output_dir)
    with safe_open(os.path.join(args.output_dir, "model.safetensors"), framework="pt") as f:
        assert f.get_tensor("lm_head.weight").dtype == torch.float32
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16

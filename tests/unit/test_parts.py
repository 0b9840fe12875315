"""The trainer's parts built and run alone, without a trainer: the value-pretraining phase, the learner, the rollout
maker, and the pure functions between them (per-token rewards, the prompt stream, the batch plan)."""

from __future__ import annotations

import copy
import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from datasets import Dataset

from vcppo_trl import PPOConfig, ValuePretrainCallback
from vcppo_trl.config.batch_plan import plan_batches
from vcppo_trl.learner.optimizers import NonFiniteTrainingError, parameter_groups, role_scheduler
from vcppo_trl.learner.ppo_learner import PPOLearner, UpdateResult, mini_batch_order
from vcppo_trl.learner.schedules import ScheduleSettings
from vcppo_trl.learner.settings import LearnerSettings
from vcppo_trl.models.policy_and_value import PolicyAndValueModel
from vcppo_trl.models.value_model import create_value_model_from_policy
from vcppo_trl.rollout.maker import GenerationStats, RolloutMaker
from vcppo_trl.rollout.settings import RolloutSettings, old_logprobs_from_training_forward
from vcppo_trl.rollout.shaping import token_rewards
from vcppo_trl.rollout.types import Rollout
from vcppo_trl.sampling.hf import HFSampler
from vcppo_trl.trainer.learner_metrics import epoch_metrics
from vcppo_trl.trainer.metrics import PRETRAIN_METRIC_NAMES, UpdateRecord, critic_fit
from vcppo_trl.trainer.prompts import prompt_batches
from vcppo_trl.trainer.value_pretraining import CriticFit, ValuePretrainingPhase, ValuePretrainRule

# ------------------------------------------------------------------------------------ value-pretraining phase


def fit(loss, ev=math.nan):
    return CriticFit(loss=loss, explained_variance=ev)


def test_phase_without_a_rule_plans_nothing():
    phase = ValuePretrainingPhase()
    assert phase.planned_updates == 0 and phase.updates_in_run() == 0
    assert not phase.should_begin() and not phase.active and not phase.done


def test_phase_runs_to_max_updates_and_counts_what_it_ran():
    phase = ValuePretrainingPhase(ValuePretrainRule(max_updates=3))
    assert phase.should_begin() and phase.updates_in_run() == 3
    phase.begin()
    assert [phase.record(fit(1.0)) for _ in range(3)] == [None, None, "reached max_steps=3"]
    assert phase.end("reached max_steps=3") == 3
    assert phase.done and not phase.active and phase.updates_in_run() == 3 and not phase.should_begin()
    with pytest.raises(RuntimeError, match="already ended after 3 updates"):
        phase.begin()
    with pytest.raises(RuntimeError, match="outside the phase"):
        phase.end()


def test_stop_rule_explained_variance_waits_for_min_updates():
    phase = ValuePretrainingPhase(ValuePretrainRule(max_updates=10, stop_explained_variance=0.5, min_updates=3))
    phase.begin()
    assert phase.record(fit(1.0, ev=0.9)) is None  # reached, but before min_updates
    assert phase.record(fit(1.0, ev=0.9)) is None
    assert phase.record(fit(1.0, ev=0.9)) == "explained variance 0.900 >= 0.5"


def test_stop_rule_patience_counts_updates_without_relative_improvement():
    phase = ValuePretrainingPhase(ValuePretrainRule(max_updates=10, patience=2, min_delta=0.1))
    phase.begin()
    assert phase.record(fit(1.0)) is None  # the first loss is the best so far
    assert phase.record(fit(0.95)) is None  # 5 % better: not enough
    assert phase.record(fit(math.nan)) is None  # an update without a loss is not counted either way
    assert phase.updates_since_best == 1
    assert phase.record(fit(0.99)) == "value loss has not improved by 10% for 2 updates"


def test_phase_saves_at_the_rule_updates():
    phase = ValuePretrainingPhase(ValuePretrainRule(max_updates=5, save_at=frozenset({2, 4})))
    phase.begin()
    saves = []
    for _ in range(5):
        phase.record(fit(1.0))
        saves.append(phase.save_now())
    assert saves == [False, True, False, True, False]


def test_phase_state_round_trips_in_the_checkpoint_form():
    phase = ValuePretrainingPhase(ValuePretrainRule(max_updates=4, patience=1))
    phase.begin()
    phase.record(fit(1.0))
    phase.saved_paths.append("out/value_pretrained-step-1")
    state = phase.state_dict()
    # The keys checkpoints have always held under the callback's name (vcppo_state.json).
    assert set(state) == {
        "done",
        "steps",
        "best_loss",
        "updates_since_best",
        "stop_reason",
        "saved_paths",
        "max_steps",
    }
    resumed = ValuePretrainingPhase(ValuePretrainRule(max_updates=4, patience=1))
    assert resumed.load_rule_progress(state) is None
    resumed.restore(active=True, ended_after=None)
    assert resumed.state_dict() == state and resumed.active
    longer = ValuePretrainingPhase(ValuePretrainRule(max_updates=6))
    assert "keeps the new limit" in longer.load_rule_progress(state)


def test_rule_refuses_no_updates():
    with pytest.raises(ValueError, match="max_steps >= 1"):
        ValuePretrainCallback(max_steps=0)


def test_callback_is_a_view_of_its_phase():
    callback = ValuePretrainCallback(max_steps=3, patience=2, min_delta=0.2, min_steps=2, save_steps=[1])
    phase = callback.phase
    assert (callback.max_steps, callback.patience, callback.min_delta, callback.min_steps) == (3, 2, 0.2, 2)
    assert callback.save_steps == {1}
    phase.begin()
    phase.record(fit(1.0))
    assert callback.steps == 1 and not callback.done
    phase.end("by hand")
    assert callback.done and callback.stop_reason == "by hand"
    assert callback.state_dict() == phase.state_dict()
    with pytest.raises(RuntimeError, match="not bound"):
        callback.on_train_begin(None, None, None)


def test_critic_fit_is_built_from_the_update_not_from_metric_names():
    """The stop rule's inputs come from the rollout, its returns and the learner's typed result: renaming a logged
    metric cannot change them (it used to read `value_pretrain/loss_avg` out of the logged dict)."""
    accelerator = Accelerator(cpu=True)
    mask = torch.tensor([[True, True, False], [True, True, False]])
    rollout = SimpleNamespace(
        values=torch.tensor([[0.0, 1.0, 5.0], [2.0, 2.0, 0.0]]),
        response_mask=mask,
        value_mask=mask,
        finished_rows=torch.tensor([True, True]),
    )
    returns = torch.tensor([[0.0, 1.0, -9.0], [2.0, 3.0, 7.0]])  # masked positions must not count
    fit = critic_fit(
        accelerator, UpdateRecord(rollout, None, returns, result=UpdateResult(stats={"loss/value": 0.25}))
    )
    assert fit.loss == 0.25
    # Var(returns − values) = Var([0, 0, 0, 1]) and Var(returns) = Var([0, 1, 2, 3]) over the valid tokens.
    expected = 1 - torch.tensor([0.0, 0.0, 0.0, 1.0]).var() / torch.tensor([0.0, 1.0, 2.0, 3.0]).var()
    assert math.isclose(fit.explained_variance, float(expected), rel_tol=1e-6)
    skipped = critic_fit(
        accelerator, UpdateRecord(rollout, None, returns, result=None)
    )  # an update that did not train
    assert math.isnan(skipped.loss) and skipped.explained_variance == fit.explained_variance
    # The logged names for value pretraining are still the ones docs/trainer.md gives.
    logged = epoch_metrics(accelerator, {"loss/value": 0.25, "diagnostics/nonfinite_steps": 0.0}, train_policy=False)
    assert logged[f"{PRETRAIN_METRIC_NAMES['loss/value']}_avg"] == fit.loss


# ----------------------------------------------------------------------------------------------- shared pieces


@pytest.fixture
def parts(tiny_policy):
    torch.manual_seed(0)
    critic = create_value_model_from_policy(tiny_policy)
    return PolicyAndValueModel(tiny_policy, critic)


def config(tmp_path, **overrides):
    kwargs = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        num_mini_batches=1,
        num_ppo_epochs=1,
        response_length=8,
        learning_rate=1e-3,
        bf16=False,
        use_cpu=True,
        report_to="none",
        lam=0.95,
        local_rollout_forward_batch_size=4,
    )
    kwargs.update(overrides)
    return PPOConfig(**kwargs)


def synthetic_rollout(tokenizer, batch=4, prompt=5, response=8, with_logprobs=True, seed=0):
    generator = torch.Generator().manual_seed(seed)
    vocab = len(tokenizer)
    lengths = torch.tensor([8, 3, 6, 1])[:batch]
    response_mask = torch.arange(response)[None, :] < lengths[:, None]
    rollout = Rollout(
        prompts=["p"] * batch,
        completions=["c"] * batch,
        extra_columns={},
        query_ids=torch.randint(4, vocab, (batch, prompt), generator=generator),
        query_mask=torch.ones(batch, prompt, dtype=torch.long),
        response_ids=torch.randint(4, vocab, (batch, response), generator=generator),
        response_mask=response_mask,
        has_stop=torch.ones(batch, dtype=torch.bool),
        scores=torch.tensor([1.0, -1.0, 1.0, -1.0])[:batch],
        raw_scores=torch.tensor([1.0, -1.0, 1.0, -1.0])[:batch],
        rewards_per_func=torch.zeros(batch, 1),
        reward_failed=torch.zeros(batch, dtype=torch.bool),
    )
    rollout.values = torch.randn(batch, response, generator=generator) * response_mask
    rollout.logprobs = (
        (-torch.rand(batch, response, generator=generator) - 1.0) * response_mask if with_logprobs else None
    )
    rollout.kl = torch.zeros(batch, response)
    rollout.rewards = token_rewards(rollout.scores, rollout.kl, response_mask, kl_coef=0.0)
    return rollout


def make_learner(model, args):
    accelerator = Accelerator(cpu=True)
    rates = dict(learning_rate=args.learning_rate, value_learning_rate=args.value_learning_rate)
    groups = parameter_groups(model.named_parameters(), set(), **rates, weight_decay=args.weight_decay)
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate)
    scheduler = role_scheduler(optimizer, ScheduleSettings.from_args(args), ppo_steps=4, pretrain_steps=0)
    local = args.per_device_train_batch_size * args.gradient_accumulation_steps
    learner = PPOLearner(
        model,
        optimizer,
        lr_scheduler=scheduler,
        accelerator=accelerator,
        settings=LearnerSettings.from_args(args),
        is_deepspeed=False,
        local_mini_batch_size=local,
    )
    learner.steps.start_policy_schedule()  # the policy's clock starts at its first PPO update
    return learner


# ----------------------------------------------------------------------------------------------------- learner


def test_learner_update_steps_both_models_and_reports_its_statistics(parts, tokenizer, tmp_path):
    args = config(tmp_path)
    learner = make_learner(parts, args)
    rollout = synthetic_rollout(tokenizer)
    before = copy.deepcopy(parts.state_dict())
    advantages = rollout.rewards.clone()
    returns = rollout.rewards.flip(1).cumsum(1).flip(1) * rollout.response_mask
    result = learner.update(rollout, advantages, returns, value_cliprange=0.2)
    assert result.old_logprobs is None  # the rollout had its own
    for name in ("loss/policy", "loss/value", "policy/clipfrac", "grad_norm", "grad_norm/policy", "grad_norm/value"):
        assert name in result.stats and math.isfinite(result.stats[name]), name
    assert result.stats["diagnostics/nonfinite_steps"] == 0.0
    after = parts.state_dict()
    for prefix in ("policy.", "critic."):
        assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith(prefix)), prefix


def test_learner_value_only_update_leaves_the_policy_untouched(parts, tokenizer, tmp_path):
    args = config(tmp_path, weight_decay=0.1)  # weight decay would move a policy that only had no gradient
    learner = make_learner(parts, args)
    rollout = synthetic_rollout(tokenizer, with_logprobs=False)
    policy_before = copy.deepcopy(parts.policy.state_dict())
    returns = rollout.rewards.flip(1).cumsum(1).flip(1) * rollout.response_mask
    result = learner.update(rollout, torch.zeros_like(returns), returns, train_policy=False)
    assert "loss/policy" not in result.stats and result.old_logprobs is None
    for name, tensor in parts.policy.state_dict().items():
        assert torch.equal(tensor, policy_before[name]), name


def test_a_mini_batch_with_no_policy_token_leaves_the_policy_untouched(parts, tokenizer, tmp_path):
    """`mask_truncated_completions` with every response truncated: the policy has no token, so it takes no step (a
    zero gradient would still move it by AdamW's momentum and weight decay), while the critic learns."""
    args = config(tmp_path, weight_decay=0.1, mask_truncated_completions=True)
    learner = make_learner(parts, args)
    rollout = synthetic_rollout(tokenizer)
    returns = rollout.rewards.flip(1).cumsum(1).flip(1) * rollout.response_mask
    learner.update(rollout, rollout.rewards.clone(), returns, value_cliprange=0.2)  # AdamW moments for both
    truncated = dataclasses.replace(rollout, has_stop=torch.zeros_like(rollout.has_stop))
    policy_before = copy.deepcopy(parts.policy.state_dict())
    critic_before = copy.deepcopy(parts.critic.state_dict())
    learner.update(truncated, rollout.rewards.clone(), returns, value_cliprange=0.2)
    assert all(torch.equal(v, policy_before[k]) for k, v in parts.policy.state_dict().items())
    assert any(not torch.equal(v, critic_before[k]) for k, v in parts.critic.state_dict().items())
    assert learner.steps.learning_rate("policy") > 0  # the schedule's rate is back for the next mini-batch


def test_learner_returns_the_on_policy_old_logprobs_without_writing_the_rollout(parts, tokenizer, tmp_path):
    args = config(tmp_path, on_policy_shortcut=True, num_mini_batches=1, kl_coef=0.0)
    assert old_logprobs_from_training_forward(args)
    learner = make_learner(parts, args)
    rollout = synthetic_rollout(tokenizer, with_logprobs=False)
    returns = rollout.rewards.flip(1).cumsum(1).flip(1) * rollout.response_mask
    with torch.no_grad():  # the weights the update starts from
        expected, _, _ = parts(rollout.input_ids, rollout.attention_mask, rollout.context_length, args.temperature)
    result = learner.update(rollout, rollout.rewards.clone(), returns)
    assert rollout.logprobs is None  # the rollout is not written to
    torch.testing.assert_close(result.old_logprobs, expected)
    assert result.stats["policy/approxkl"] == 0.0 and result.stats["val/ratio"] == 1.0


def test_learner_skips_non_finite_steps_and_stops_past_the_limit(parts, tokenizer, tmp_path):
    args = config(tmp_path, max_consecutive_nonfinite_steps=1)
    learner = make_learner(parts, args)
    rollout = synthetic_rollout(tokenizer)
    returns = torch.full_like(rollout.rewards, float("nan"))  # a NaN value loss
    before = copy.deepcopy(parts.state_dict())
    result = learner.update(rollout, rollout.rewards.clone(), returns, update_index=1)
    assert result.stats["diagnostics/nonfinite_steps"] == 1.0 and learner.steps.nonfinite_steps_in_a_row == 1
    assert all(torch.equal(before[k], v) for k, v in parts.state_dict().items())
    with pytest.raises(NonFiniteTrainingError, match="2 optimizer steps in a row"):
        learner.update(rollout, rollout.rewards.clone(), returns, update_index=2)


# ----------------------------------------------------------------------------------------------- rollout maker


def test_rollout_maker_makes_a_scored_rollout_from_rows(parts, tokenizer, tmp_path):
    args = config(tmp_path, kl_coef=0.0, on_policy_shortcut=False)
    accelerator = Accelerator(cpu=True)
    stop = [tokenizer.eos_token_id]
    sampler = HFSampler(lambda: parts, accelerator, tokenizer, stop, args.response_length, 4)
    seen = {}

    def reward(completions, solution, **kwargs):
        seen["solution"] = solution
        return [1.0 if i % 2 else None for i in range(len(completions))]  # None: the sample is skipped

    maker = RolloutMaker(
        RolloutSettings.from_args(args),
        accelerator,
        tokenizer=tokenizer,
        sampler=sampler,
        current_model=lambda: parts,
        ref_model=None,
        reward_funcs=[reward],
        reward_processing_classes=[None],
        reward_weights=torch.ones(1),
        stop_token_ids=stop,
        reference_is_initial_policy=True,
    )
    generated = []
    original = sampler.generate
    sampler.generate = lambda *a, **k: generated.append(original(*a, **k)) or generated[-1]
    rows = [{"prompt": f"Add {i} and 1.", "solution": str(i + 1)} for i in range(4)]
    torch.manual_seed(0)
    rollout, made = maker.make(rows)
    generation = made.generation
    assert seen["solution"] == ["1", "2", "3", "4"]
    assert isinstance(generation, GenerationStats) and generation.sync_seconds is None
    assert made.forwards.micro_batches == 1 and made.forwards.computed_tokens == 4 * rollout.input_ids.shape[1]
    assert generation.tokens == int(generated[0].response_mask.sum()) and generation.seconds == generated[0].seconds
    skipped = torch.isnan(rollout.raw_scores)
    assert skipped.tolist() == [True, False, True, False] and not rollout.response_mask[skipped].any()
    assert rollout.values.shape == rollout.logprobs.shape == rollout.response_mask.shape
    lengths = rollout.response_mask.sum(1)
    for i in (1, 3):  # the score sits on the last valid token
        assert rollout.rewards[i, lengths[i] - 1] == 1.0 and rollout.rewards[i].sum() == 1.0
    assert not rollout.rewards[~rollout.response_mask].any()


# ------------------------------------------------------------------------------------------- pure functions


def test_token_rewards_put_the_score_on_the_last_valid_token_and_the_kl_everywhere():
    mask = torch.tensor([[True, True, True, False], [True, False, False, False], [False] * 4])
    kl = torch.full((3, 4), 0.5) * mask
    rewards = token_rewards(torch.tensor([2.0, -1.0, 7.0]), kl, mask, kl_coef=0.1)
    expected = torch.tensor([[-0.05, -0.05, 1.95, 0.0], [-1.05, 0.0, 0.0, 0.0], [0.0] * 4])
    torch.testing.assert_close(rewards, expected)
    whitened = token_rewards(torch.tensor([2.0, -1.0, 7.0]), kl, mask, kl_coef=0.1, whiten=True)
    assert float(whitened[mask].std()) == pytest.approx(1.0, rel=1e-5)
    assert float(whitened[mask].mean()) == pytest.approx(float(rewards[mask].mean()), rel=1e-5)  # mean kept


def test_prompt_batches_split_the_ranks_and_resume_at_a_batch(tmp_path):
    dataset = Dataset.from_dict({"prompt": [f"p{i}" for i in range(10)]})
    args = config(tmp_path, per_device_train_batch_size=1, gradient_accumulation_steps=2, num_generations=2)
    plan = plan_batches(args, world_size=2, train_rows=len(dataset))
    assert (plan.prompts_per_update, plan.local_prompts_per_update, plan.batch_size) == (2, 1, 4)
    ranks = [prompt_batches(dataset, plan, rank, seed=0, num_generations=2) for rank in (0, 1)]
    seen = []
    for _ in range(5):  # one pass: 5 batches of 2 prompts
        rows = [next(r) for r in ranks]
        assert all(len(r) == 2 and r[0] == r[1] for r in rows)  # each prompt num_generations times in a row
        seen += [r[0]["prompt"] for r in rows]
    assert sorted(seen) == sorted(dataset["prompt"])  # the ranks never overlap
    resumed = prompt_batches(dataset, plan, 1, seed=0, num_generations=2, start=3)
    fresh = prompt_batches(dataset, plan, 1, seed=0, num_generations=2)
    for _ in range(3):
        next(fresh)
    assert next(resumed) == next(fresh)


def test_plan_batches_refuses_what_cannot_be_split(tmp_path):
    with pytest.raises(ValueError, match="num_generations=3 must divide"):
        plan_batches(config(tmp_path, num_generations=3), world_size=1, train_rows=100)
    with pytest.raises(ValueError, match="has only 3 rows"):
        plan_batches(config(tmp_path), world_size=1, train_rows=3)


def test_metrics_reuse_lambda_one_returns_as_the_monte_carlo_returns(tokenizer, tmp_path):
    from vcppo_trl.algo.gae import dual_lambda_gae
    from vcppo_trl.trainer.metrics import MetricSettings, rollout_metrics

    args = MetricSettings.from_args(config(tmp_path, position_buckets=4))
    rollout = synthetic_rollout(tokenizer)
    advantages, returns = dual_lambda_gae(rollout.rewards, rollout.values, rollout.response_mask, 1.0, 0.95, 1.0)
    accelerator = Accelerator(cpu=True)
    computed = rollout_metrics(accelerator, args, rollout, advantages, returns, [], ["r"])
    reused = rollout_metrics(accelerator, args, rollout, advantages, returns, [], ["r"], returns_are_monte_carlo=True)
    assert any(k.startswith("diagnostics/mc_explained_variance_bucket_") for k in computed)
    assert str(reused) == str(computed)  # nan-safe, bit for bit


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_mask"])
def test_learner_returns_the_sampler_weights_its_loss_used(parts, tokenizer, tmp_path, mode):
    from vcppo_trl.algo.losses import sampler_importance_weights

    args = config(tmp_path, vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=mode)
    learner = make_learner(parts, args)
    rollout = synthetic_rollout(tokenizer)
    mask = rollout.response_mask
    rollout.sampler_logprobs = (rollout.logprobs + 0.05 * torch.randn(mask.shape, generator=torch.Generator())) * mask
    returns = rollout.rewards.flip(1).cumsum(1).flip(1) * mask
    result = learner.update(rollout, rollout.rewards.clone(), returns)
    clip = (args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max)
    expected = sampler_importance_weights(rollout.logprobs, rollout.sampler_logprobs, mask, mode, *clip)
    torch.testing.assert_close(result.importance_weights, expected, rtol=0, atol=0)
    # Without the correction the loss computes none (the metrics then compute them themselves).
    plain = make_learner(parts, config(tmp_path, vllm_importance_sampling_correction=False))
    assert plain.update(rollout, rollout.rewards.clone(), returns).importance_weights is None


def test_sampler_settings_carry_the_mixed_precision_that_vllm_is_told(tmp_path):
    from vcppo_trl.sampling import SamplerSettings, vllm_dtype

    policy = torch.nn.Linear(2, 2).to(torch.float64)
    plain = SamplerSettings.from_args(config(tmp_path, vllm_server_host="h", vllm_server_port=9))
    assert plain.mixed_precision is None and vllm_dtype(plain.mixed_precision, policy) == "float64"
    assert plain.server_base_url == "http://h:9"
    assert plain.chunk_size == config(tmp_path).local_rollout_forward_batch_size
    bf16 = SamplerSettings.from_args(config(tmp_path, bf16=True))
    assert vllm_dtype(bf16.mixed_precision, policy) == "bfloat16"


def test_evaluation_settings_generate_at_least_one_prompt_per_chunk(tmp_path):
    from vcppo_trl.trainer.evaluation import EvaluationSettings

    args = config(tmp_path, local_rollout_forward_batch_size=4, eval_num_generations=8, eval_temperature=0.7)
    settings = EvaluationSettings.from_args(args)
    assert (settings.prompts_per_chunk, settings.num_generations, settings.temperature) == (1, 8, 0.7)
    assert EvaluationSettings.from_args(config(tmp_path, local_rollout_forward_batch_size=4)).prompts_per_chunk == 4


def test_the_mini_batch_order_comes_from_its_own_generator():
    """The PPO epochs' shuffle is a permutation fixed by (seed, update, epoch, process), whatever the global generator
    did before it (sampling advances that one), and it does not advance the global generator."""
    order = mini_batch_order(16, seed=3, update_index=2, epoch=0, process_index=0)
    assert sorted(order.tolist()) == list(range(16))
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    again = mini_batch_order(16, seed=3, update_index=2, epoch=0, process_index=0)
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.rand(1000)  # sampling drew from the global generator
    assert torch.equal(mini_batch_order(16, seed=3, update_index=2, epoch=0, process_index=0), again)
    assert torch.equal(order, again)
    others = [
        mini_batch_order(16, seed=4, update_index=2, epoch=0, process_index=0),
        mini_batch_order(16, seed=3, update_index=3, epoch=0, process_index=0),
        mini_batch_order(16, seed=3, update_index=2, epoch=1, process_index=0),
        mini_batch_order(16, seed=3, update_index=2, epoch=0, process_index=1),
    ]
    assert all(not torch.equal(order, other) for other in others)

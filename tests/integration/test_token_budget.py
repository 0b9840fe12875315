"""Token-budget micro-batches equal the padded path: losses, gradients, values and log-probabilities, on uneven
batches (left-padded prompts of different lengths, responses of different lengths, one sequence longer than the
budget), for the learner alone, the rollout's no-grad forwards, LoRA, and whole training runs with their resume."""

from __future__ import annotations

import copy
import logging
import re

import pytest
import torch
from accelerate import Accelerator
from trl.trainer.utils import disable_dropout_in_model

from vcppo_trl import PPOConfig
from vcppo_trl.learner.optimizers import parameter_groups
from vcppo_trl.learner.ppo_learner import PPOLearner
from vcppo_trl.learner.settings import LearnerSettings
from vcppo_trl.models.policy_and_value import PolicyAndValueModel
from vcppo_trl.models.value_model import create_value_model_from_policy
from vcppo_trl.rollout.forwards import RolloutForwards
from vcppo_trl.rollout.settings import RolloutSettings
from vcppo_trl.rollout.shaping import token_rewards
from vcppo_trl.rollout.types import Rollout

from ..builders import step_logs, tiny_policy

PROMPT_LENGTHS = [5, 2, 4, 1, 3, 5, 2, 4]
RESPONSE_LENGTHS = [12, 3, 7, 1, 12, 5, 2, 9]


@pytest.fixture
def pair(tokenizer):
    policy = tiny_policy(tokenizer, num_layers=2)
    torch.manual_seed(0)
    return no_dropout(PolicyAndValueModel(policy, create_value_model_from_policy(policy)))


def no_dropout(model):
    """As the trainer does (`disable_dropout`): dropout would draw different masks for differently split batches."""
    disable_dropout_in_model(model)
    return model


def uneven_rollout(tokenizer, seed=0):
    """8 sequences: prompts left-padded to 5, responses right-padded to 12, every length different in places."""
    generator = torch.Generator().manual_seed(seed)
    batch, prompt, response = len(PROMPT_LENGTHS), max(PROMPT_LENGTHS), max(RESPONSE_LENGTHS)
    vocab, pad = len(tokenizer), tokenizer.pad_token_id
    query_mask = torch.arange(prompt)[None, :] >= (prompt - torch.tensor(PROMPT_LENGTHS))[:, None]
    response_mask = torch.arange(response)[None, :] < torch.tensor(RESPONSE_LENGTHS)[:, None]
    query_ids = torch.randint(4, vocab, (batch, prompt), generator=generator).masked_fill(~query_mask, pad)
    response_ids = torch.randint(4, vocab, (batch, response), generator=generator).masked_fill(~response_mask, pad)
    scores = torch.tensor([1.0, -1.0] * 4)
    rollout = Rollout(
        prompts=["p"] * batch,
        completions=["c"] * batch,
        extra_columns={},
        query_ids=query_ids,
        query_mask=query_mask.long(),
        response_ids=response_ids,
        response_mask=response_mask,
        has_stop=torch.ones(batch, dtype=torch.bool),
        scores=scores,
        raw_scores=scores,
        rewards_per_func=scores[:, None],
        reward_failed=torch.zeros(batch, dtype=torch.bool),
    )
    rollout.kl = torch.zeros(batch, response)
    rollout.rewards = token_rewards(rollout.scores, rollout.kl, response_mask, kl_coef=0.0)
    return rollout


def config(tmp_path, **overrides):
    kwargs = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        num_mini_batches=2,
        num_ppo_epochs=2,
        response_length=12,
        learning_rate=1e-3,
        max_grad_norm=None,
        bf16=False,
        use_cpu=True,
        report_to="none",
        lam=0.95,
        kl_coef=0.0,
        local_rollout_forward_batch_size=8,
    )
    kwargs.update(overrides)
    return PPOConfig(**kwargs)


def rollout_forwards(args, model, accelerator=None, ref_model=None):
    """The rollout's no-grad forwards alone ([`RolloutForwards`], what a rollout maker runs them with)."""
    return RolloutForwards(
        RolloutSettings.from_args(args),
        accelerator or Accelerator(cpu=True),
        current_model=lambda: model,
        ref_model=ref_model,
        pad_token_id=0,
    )


def run_update(model, args, rollout, train_policy=True):
    """One update with plain SGD from a fixed RNG state; returns its result and the gradient of every optimizer step."""
    accelerator = Accelerator(cpu=True)
    rates = dict(learning_rate=args.learning_rate, value_learning_rate=args.value_learning_rate)
    groups = parameter_groups(model.named_parameters(), set(), **rates, weight_decay=args.weight_decay)
    optimizer = torch.optim.SGD(groups, lr=args.learning_rate)
    gradients = []
    step = optimizer.step

    def recording_step(*a, **k):
        gradients.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
        return step(*a, **k)

    optimizer.step = recording_step
    local = args.per_device_train_batch_size * args.gradient_accumulation_steps
    learner = PPOLearner(
        model,
        optimizer,
        lr_scheduler=None,
        accelerator=accelerator,
        settings=LearnerSettings.from_args(args),
        is_deepspeed=False,
        local_mini_batch_size=local,
    )
    forwards = rollout_forwards(args, model, accelerator=accelerator)
    rollout = copy.copy(rollout)
    with torch.no_grad():
        rollout.logprobs, rollout.values = forwards.forward(rollout, compute_policy=True)
    returns = rollout.rewards.flip(1).cumsum(1).flip(1) * rollout.response_mask
    advantages = returns - rollout.values * rollout.response_mask
    if args.on_policy_shortcut:
        rollout.logprobs = None
    torch.manual_seed(1)
    result = learner.update(rollout, advantages, returns, train_policy=train_policy, value_cliprange=0.2)
    return result, gradients


def assert_same_update(padded, budget):
    """The global losses and every optimizer step's gradient agree (fp32 sums in another order). Statistics that are
    means of per-micro-batch means (clip fractions, `val/vpred`) depend on the split and are not compared."""
    (result_a, steps_a), (result_b, steps_b) = padded, budget
    for name in ("loss/policy", "loss/value", "loss/positive_example_lm"):
        if name in result_a.stats:
            assert result_b.stats[name] == pytest.approx(result_a.stats[name], rel=1e-5, abs=1e-7), name
    assert len(steps_a) == len(steps_b) > 0
    for step, (grads_a, grads_b) in enumerate(zip(steps_a, steps_b)):
        assert grads_a.keys() == grads_b.keys()
        for name, grad in grads_a.items():
            scale = float(grad.abs().max())
            torch.testing.assert_close(grads_b[name], grad, rtol=1e-4, atol=1e-5 * scale, msg=f"{step} {name}")
    assert any(float(g.abs().max()) > 0 for g in steps_a[0].values())


@pytest.mark.parametrize(
    ("budget", "padding_free"), [(20, False), (48, False), (64, False), (None, True), (20, True), (48, True)]
)
def test_budget_update_equals_the_padded_update(pair, tokenizer, tmp_path, budget, padding_free):
    rollout = uneven_rollout(tokenizer)
    padded = run_update(copy.deepcopy(pair), config(tmp_path), rollout)
    args = config(tmp_path, max_tokens_per_micro_batch=budget, padding_free=padding_free)
    budgeted = run_update(copy.deepcopy(pair), args, rollout)
    assert_same_update(padded, budgeted)
    # Fewer tokens computed for the same real ones; each micro-batch within budget unless one sequence is longer.
    assert budgeted[0].work.real_tokens == padded[0].work.real_tokens
    assert budgeted[0].work.computed_tokens < padded[0].work.computed_tokens
    assert padded[0].work.computed_tokens == 2 * 8 * (5 + 12)  # two epochs, 8 sequences at full width
    if padding_free:
        assert budgeted[0].work.computed_tokens == budgeted[0].work.real_tokens


# Every VAPO/DAPO term of the policy loss on; rows 0 and 4 are cut at response_length without a stop token.
VAPO_TERMS = dict(
    cliprange_high=0.28,
    dual_clip_c=3.0,
    entropy_coef=0.01,
    positive_example_lm_coef=0.1,
    mask_truncated_completions=True,
)


def truncated_rollout(tokenizer):
    rollout = uneven_rollout(tokenizer)
    rollout.has_stop = torch.tensor([False, True, True, True, False, True, True, True])
    return rollout


@pytest.mark.parametrize(
    ("split", "budget", "padding_free"),
    [
        (dict(per_device_train_batch_size=1, gradient_accumulation_steps=4), None, False),
        ({}, 20, False),
        ({}, 20, True),
    ],
)
def test_vapo_terms_do_not_depend_on_the_micro_batch_split(pair, tokenizer, tmp_path, split, budget, padding_free):
    rollout = truncated_rollout(tokenizer)
    whole = run_update(copy.deepcopy(pair), config(tmp_path, **VAPO_TERMS), rollout)
    args = config(tmp_path, **VAPO_TERMS, **split, max_tokens_per_micro_batch=budget, padding_free=padding_free)
    assert_same_update(whole, run_update(copy.deepcopy(pair), args, rollout))
    assert whole[0].stats["loss/positive_example_lm"] > 0
    for name in ("policy/clipfrac_low", "policy/clipfrac_high", "policy/clipfrac_dual"):
        assert name in whole[0].stats
    # The terms are not inert: without them the first step's gradient differs.
    plain = run_update(copy.deepcopy(pair), config(tmp_path), rollout)
    policy_grads = [n for n in whole[1][0] if n.startswith("policy.")]
    assert any(not torch.allclose(whole[1][0][n], plain[1][0][n]) for n in policy_grads)


def test_masked_truncated_responses_give_the_policy_no_gradient(pair, tokenizer, tmp_path):
    """Only the truncated rows differ between two rollouts: with the mask, the policy's gradient is the same."""
    rollout = truncated_rollout(tokenizer)
    other = copy.copy(rollout)
    other.response_ids = rollout.response_ids.clone()
    other.response_ids[[0, 4], 3:] = (rollout.response_ids[[0, 4], 3:] + 1) % len(tokenizer)
    args = config(tmp_path, mask_truncated_completions=True, num_ppo_epochs=1, num_mini_batches=1)
    args.per_device_train_batch_size = 8
    grads_a = run_update(copy.deepcopy(pair), args, rollout)[1][0]
    grads_b = run_update(copy.deepcopy(pair), args, other)[1][0]
    for name, grad in grads_a.items():
        if name.startswith("policy."):
            torch.testing.assert_close(grads_b[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert any(not torch.allclose(grads_a[n], grads_b[n]) for n in grads_a if n.startswith("critic."))


@pytest.mark.parametrize("padding_free", [False, True])
def test_budget_value_only_update_equals_the_padded_one(pair, tokenizer, tmp_path, padding_free):
    rollout = uneven_rollout(tokenizer)
    padded = run_update(copy.deepcopy(pair), config(tmp_path), rollout, train_policy=False)
    args = config(tmp_path, max_tokens_per_micro_batch=24, padding_free=padding_free)
    budgeted = run_update(copy.deepcopy(pair), args, rollout, False)
    assert_same_update(padded, budgeted)


@pytest.mark.parametrize("loss_type", ["seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_budget_keeps_every_loss_aggregation(pair, tokenizer, tmp_path, loss_type):
    rollout = uneven_rollout(tokenizer)
    padded = run_update(copy.deepcopy(pair), config(tmp_path, loss_type=loss_type), rollout)
    args = config(tmp_path, loss_type=loss_type, max_tokens_per_micro_batch=30)
    assert_same_update(padded, run_update(copy.deepcopy(pair), args, rollout))


@pytest.mark.parametrize("padding_free", [False, True])
def test_budget_on_policy_shortcut_gives_the_same_old_logprobs(pair, tokenizer, tmp_path, padding_free):
    rollout = uneven_rollout(tokenizer)
    shortcut = dict(on_policy_shortcut=True, num_mini_batches=1, num_ppo_epochs=1, per_device_train_batch_size=8)
    padded = run_update(copy.deepcopy(pair), config(tmp_path, **shortcut), rollout)
    args = config(tmp_path, max_tokens_per_micro_batch=40, padding_free=padding_free, **shortcut)
    budgeted = run_update(copy.deepcopy(pair), args, rollout)
    assert_same_update(padded, budgeted)
    mask = rollout.response_mask
    old_a, old_b = padded[0].old_logprobs, budgeted[0].old_logprobs
    torch.testing.assert_close(old_b[mask], old_a[mask], rtol=1e-5, atol=1e-6)


def test_budget_warns_once_about_a_sequence_longer_than_the_budget(pair, tokenizer, tmp_path, caplog):
    rollout = uneven_rollout(tokenizer)
    with caplog.at_level(logging.WARNING, logger="vcppo_trl"):
        run_update(copy.deepcopy(pair), config(tmp_path, max_tokens_per_micro_batch=10), rollout)
    warnings = [r.message for r in caplog.records if "max_tokens_per_micro_batch=10" in r.message]
    assert len(warnings) == 1 and "runs alone" in warnings[0]
    assert re.search(r"A sequence of 1[3-7] tokens", warnings[0])  # the longest sequences: 5 + 12 and 3 + 12


def test_budget_rollout_forwards_equal_the_padded_ones(pair, tokenizer, tmp_path):
    rollout = uneven_rollout(tokenizer)
    reference = copy.deepcopy(pair.policy)
    outputs = {}
    for budget, padding_free in ((None, False), (18, False), (40, False), (None, True), (40, True)):
        args = config(tmp_path, max_tokens_per_forward=budget, kl_coef=0.1, padding_free=padding_free)
        accelerator = Accelerator(cpu=True)
        forwards = rollout_forwards(args, pair, accelerator=accelerator, ref_model=reference)
        plan = forwards.forward_plan(rollout)
        logprobs, values = forwards.forward(rollout, compute_policy=True, plan=plan)
        outputs[budget, padding_free] = (logprobs, values, forwards.reference_logprobs(rollout, plan), len(plan))
    mask = rollout.response_mask
    for key in ((18, False), (40, False), (None, True), (40, True)):
        for got, expected in zip(outputs[key][:3], outputs[None, False][:3]):
            torch.testing.assert_close(got[mask], expected[mask], rtol=1e-5, atol=1e-6)
    assert outputs[None, False][3] == 1 and outputs[18, False][3] > outputs[40, False][3] > 1


@pytest.mark.parametrize("padding_free", [False, True])
def test_budget_with_lora_equals_the_padded_path(tokenizer, tmp_path, padding_free):
    from peft import LoraConfig, get_peft_model

    policy = tiny_policy(tokenizer, num_layers=2)
    torch.manual_seed(0)
    critic = create_value_model_from_policy(policy)
    lora = LoraConfig(
        task_type="CAUSAL_LM", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    pair = no_dropout(PolicyAndValueModel(get_peft_model(policy, lora), critic))
    rollout = uneven_rollout(tokenizer)
    padded = run_update(copy.deepcopy(pair), config(tmp_path), rollout)
    args = config(tmp_path, max_tokens_per_micro_batch=32, padding_free=padding_free)
    budgeted = run_update(copy.deepcopy(pair), args, rollout)
    assert_same_update(padded, budgeted)
    assert any("lora" in name for name in padded[1][0])  # the adapters got gradients
    # The PEFT reference (the base model, adapters disabled) under the forward budget too.
    args = config(tmp_path, max_tokens_per_forward=24, kl_coef=0.1, padding_free=padding_free)
    forwards = rollout_forwards(args, pair)
    padded_args = config(tmp_path, kl_coef=0.1)
    padded_forwards = rollout_forwards(padded_args, pair)
    mask = rollout.response_mask
    torch.testing.assert_close(
        forwards.reference_logprobs(rollout)[mask],
        padded_forwards.reference_logprobs(rollout)[mask],
        rtol=1e-5,
        atol=1e-6,
    )


# ------------------------------------------------------------------------------------------ whole training runs


def test_training_with_budgets_matches_the_padded_run(make_trainer, tiny_config, tokenizer):
    """The same seed with and without budgets: the same samples, and metrics equal up to rounding. (Resumed runs
    with budgets: tests/integration/test_resume.py.)"""
    runs = {}
    for name, budget, padding_free in (("padded", None, False), ("budget", 48, False), ("packed", 48, True)):
        out = f"{tiny_config().output_dir}-{name}"
        args = tiny_config(max_tokens_per_micro_batch=budget, padding_free=padding_free, output_dir=out)
        trainer = make_trainer(model=tiny_policy(tokenizer), args=args)
        trainer.train()
        runs[name] = step_logs(trainer)
    for variant in ("budget", "packed"):
        assert runs["padded"].keys() == runs[variant].keys()
        for step, padded in runs["padded"].items():
            other = runs[variant][step]
            for key in ("val/num_eos_tokens", "episode", "objective/scores"):
                assert other[key] == padded[key], (variant, step, key)
            for key in ("loss/policy_avg", "loss/value_avg"):
                assert other[key] == pytest.approx(padded[key], rel=1e-4, abs=1e-6), (variant, step, key)
            assert other["perf/update_padding_fraction"] < padded["perf/update_padding_fraction"]
    assert all(m["perf/update_padding_fraction"] == 0.0 for m in runs["packed"].values())


def test_train_sampling_strategy_other_than_random_is_refused(tmp_path):
    with pytest.raises(ValueError, match="set max_tokens_per_micro_batch to group by length"):
        config(tmp_path, train_sampling_strategy="group_by_length")
    with pytest.raises(ValueError, match="at least 1 token"):
        config(tmp_path, max_tokens_per_micro_batch=0)
    assert config(tmp_path, max_tokens_per_micro_batch=100).max_tokens_per_forward == 100
    assert config(tmp_path, max_tokens_per_micro_batch=100, max_tokens_per_forward=300).max_tokens_per_forward == 300

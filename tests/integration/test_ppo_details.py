"""PPO details that change results on real checkpoints (issue 13): the sampled distribution, eval-mode rollout passes,
value clipping in pretraining, loss aggregation over whole mini-batches, the frozen policy's optimizer state, KL in
pretraining, whitening scope, metrics of skipped samples and per-model gradient clipping."""

from __future__ import annotations

import copy

import pytest
import torch

from vcppo_trl import PPOConfig, PPOTrainer
from vcppo_trl.algo import objective as ppo_loss
from vcppo_trl.rollout.shaping import token_rewards
from vcppo_trl.trainer import sampler_setup


def _rows(trainer, n=None):
    n = n or trainer.batches.local_batch_size
    return [trainer.train_dataset[i] for i in range(n)]


def _make_rollout(trainer, rows, train_policy=True):
    rollout, _ = trainer.rollout_maker.make(rows, train_policy=train_policy, trainer_state=trainer.state)
    return rollout


def _update(trainer, rollout, advantages, returns, train_policy=True):
    value_clip = trainer.value_cliprange()
    return trainer.learner.update(rollout, advantages, returns, train_policy=train_policy, value_cliprange=value_clip)


def _token_rewards(trainer, rollout):
    args = trainer.args
    return token_rewards(rollout.scores, rollout.kl, rollout.response_mask, args.kl_coef, args.whiten_rewards)


# ------------------------------------------------------------------------ value clipping during value pretraining


def _record_value_clipranges(monkeypatch, trainer):
    calls = []
    original = ppo_loss.clipped_value_loss

    def spy(values, old_values, returns, mask, cliprange_value, **kwargs):
        calls.append((trainer.in_value_pretraining, cliprange_value))
        return original(values, old_values, returns, mask, cliprange_value, **kwargs)

    monkeypatch.setattr(ppo_loss, "clipped_value_loss", spy)
    return calls


@pytest.mark.parametrize(("pretrain_clip", "expected"), [(None, 0.3), (0.5, 0.5), (float("inf"), None)])
def test_value_pretraining_uses_its_own_value_clip_range(
    make_trainer, tiny_config, monkeypatch, pretrain_clip, expected
):
    args = tiny_config(
        value_pretrain_steps=1, total_episodes=16, cliprange_value=0.3, value_pretrain_cliprange_value=pretrain_clip
    )
    trainer = make_trainer(args=args)
    calls = _record_value_clipranges(monkeypatch, trainer)
    trainer.train()
    pretraining = {clip for frozen, clip in calls if frozen}
    ppo = {clip for frozen, clip in calls if not frozen}
    assert pretraining == {expected}  # default: cliprange_value; inf: no clipping while the critic is pretrained
    assert ppo == {0.3}


def test_value_pretraining_without_clipping_reaches_far_targets(make_trainer, tiny_config):
    # One pretraining update with a large critic learning rate: unclipped, the critic's values move further from
    # their rollout values than a clipped step lets them.
    def constant_reward(completions, **kwargs):
        return [5.0] * len(completions)

    moved = {}
    for clip in (float("inf"), None):
        args = tiny_config(
            value_pretrain_steps=1,
            total_episodes=16,
            value_learning_rate=3e-2,
            learning_rate=0.0,
            num_ppo_epochs=4,
            vf_coef=1.0,
            cliprange_value=0.2,
            value_pretrain_cliprange_value=clip,
        )
        trainer = make_trainer(reward_funcs=constant_reward, args=args)
        trainer._setup_training()
        trainer.begin_value_pretraining()
        rollout = _make_rollout(trainer, _rows(trainer), train_policy=False)
        advantages, returns = trainer.compute_advantages(rollout)
        _update(trainer, rollout, advantages, returns, train_policy=False)
        _, after = trainer.rollout_maker.forwarder.forward(rollout, compute_policy=False)
        mask = rollout.response_mask
        moved[clip] = float((after - rollout.values)[mask].abs().mean())
    # Clipped, a value whose clipped loss wins gets no gradient once it has moved 0.2; unclipped it keeps going.
    assert moved[float("inf")] > 1.5 * moved[None]


# ----------------------------------------------------------------------------- rollout passes run in eval mode


def test_rollout_logprobs_and_values_are_computed_in_eval_mode(make_trainer, tiny_policy, tiny_config):
    for layer in tiny_policy.model.layers:
        layer.self_attn.attention_dropout = 0.5
    trainer = make_trainer(args=tiny_config(disable_dropout=False))
    model = trainer.model
    critic_dropout = [m for m in model.critic.modules() if isinstance(m, torch.nn.Dropout)]
    assert critic_dropout and critic_dropout[0].p > 0  # the token-classification head has dropout
    model.train()  # the state a PPO update leaves the model in
    rollout = _make_rollout(trainer, _rows(trainer))
    assert model.training and model.critic.training  # the rollout restored the training flags
    model.eval()
    with torch.no_grad():
        logprobs, _, values = model(
            rollout.input_ids, rollout.attention_mask, rollout.context_length, trainer.args.temperature
        )
    mask = rollout.response_mask
    torch.testing.assert_close(rollout.values[mask], values[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rollout.logprobs[mask], logprobs[mask], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------- sampling is the distribution of the ratio


def _leaky_generation_config(policy, tokenizer):
    config = policy.generation_config
    digit = tokenizer.convert_tokens_to_ids("1")
    config.repetition_penalty = 1.3
    config.min_p = 0.2
    config.no_repeat_ngram_size = 2
    config.bad_words_ids = [[digit]]
    config.top_k = 5
    config.top_p = 0.5
    config.typical_p = 0.9
    config.min_new_tokens = 6
    config.suppress_tokens = [tokenizer.convert_tokens_to_ids("2")]
    return {"repetition_penalty", "min_p", "no_repeat_ngram_size", "bad_words_ids", "top_k", "top_p", "typical_p"}


def test_sampler_logprobs_equal_training_logprobs_despite_model_generation_config(
    make_trainer, tiny_policy, tokenizer, tiny_config, monkeypatch
):
    fields = _leaky_generation_config(tiny_policy, tokenizer)
    warnings = []
    monkeypatch.setattr(sampler_setup.logger, "warning", lambda msg, *a, **k: warnings.append(str(msg)))
    trainer = make_trainer(args=tiny_config(temperature=0.7, response_length=24))
    warning = next(w for w in warnings if "generation_config" in w)
    for name in fields | {"min_new_tokens", "suppress_tokens"}:
        assert name in warning

    scores = []
    original = tiny_policy.generate

    def generate_with_scores(*args, **kwargs):
        out = original(*args, **kwargs, output_scores=True, return_dict_in_generate=True)
        scores.append(torch.stack(out.scores, dim=1))
        return out.sequences

    monkeypatch.setattr(tiny_policy, "generate", generate_with_scores)
    torch.manual_seed(0)
    rollout = _make_rollout(trainer, _rows(trainer))
    sampler = torch.log_softmax(torch.cat(scores).float(), dim=-1)  # scores are after the sampler's processors
    tokens = rollout.response_ids[:, : sampler.shape[1]]
    sampler_logprobs = sampler.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    mask = rollout.response_mask[:, : sampler.shape[1]]
    gap = (sampler_logprobs - rollout.logprobs[:, : sampler.shape[1]])[mask].abs().max()
    assert float(gap) < 1e-4
    # The model's own generation config is untouched.
    assert tiny_policy.generation_config.repetition_penalty == 1.3


# ------------------------------------------------------------- loss aggregation over the whole mini-batch


def _capture_first_step_grads(trainer):
    """Record every parameter's gradient at the first optimizer step (after clipping, before the update)."""
    grads = {}
    wrapper = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    original = trainer.optimizer.step

    def step(*args, **kwargs):
        if not grads:
            for name, p in wrapper.named_parameters():
                grads[name] = None if p.grad is None else p.grad.detach().clone()
        return original(*args, **kwargs)

    trainer.optimizer.step = step
    return grads


def _with_lengths(trainer, rollout, lengths):
    """Cut the rollout's responses to the given lengths (unequal micro-batches) and recompute rewards."""
    positions = torch.arange(rollout.response_mask.shape[1])
    rollout.response_mask = rollout.response_mask & (positions[None, :] < torch.tensor(lengths)[:, None])
    rollout.rewards = _token_rewards(trainer, rollout)
    return rollout


@pytest.mark.parametrize(
    "loss_type", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
)
def test_minibatch_gradient_does_not_depend_on_the_micro_batch_split(
    make_trainer, tiny_policy, tiny_config, loss_type
):
    policy0 = copy.deepcopy(tiny_policy)
    critic0 = None
    rollout = None
    grads = {}
    for micro, accumulation in ((1, 4), (4, 1), (2, 2)):
        args = tiny_config(
            PPOConfig,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=accumulation,
            num_mini_batches=1,
            num_ppo_epochs=1,
            kl_coef=0.0,
            max_grad_norm=0.0,
            loss_type=loss_type,
        )
        trainer = make_trainer(
            cls=PPOTrainer,
            model=copy.deepcopy(policy0),
            value_model=None if critic0 is None else copy.deepcopy(critic0),
            args=args,
        )
        if critic0 is None:
            critic0 = copy.deepcopy(trainer.model.critic)
        trainer._setup_training()
        if rollout is None:
            rollout = _with_lengths(trainer, _make_rollout(trainer, _rows(trainer, 4)), [1, 16, 3, 9])
        advantages, returns = trainer.compute_advantages(rollout)
        captured = _capture_first_step_grads(trainer)
        _update(trainer, rollout, advantages, returns)
        grads[(micro, accumulation)] = captured
    reference = grads[(4, 1)]  # one micro-batch holds the whole mini-batch
    for split in ((1, 4), (2, 2)):
        for name, grad in reference.items():
            assert grad is not None, name
            torch.testing.assert_close(grads[split][name], grad, rtol=1e-4, atol=1e-7, msg=f"{split} {name}")


# ------------------------------------------------------------------------------- per-model gradient clipping


def test_large_critic_gradients_do_not_shrink_the_policy_step(make_trainer, tiny_policy, tiny_config):
    policy0 = copy.deepcopy(tiny_policy)
    critic0 = None
    rollout = None
    grads = {}
    for vf_coef in (1e-3, 1e3):
        args = tiny_config(
            PPOConfig, num_mini_batches=1, num_ppo_epochs=1, kl_coef=0.0, max_grad_norm=1.0, vf_coef=vf_coef
        )
        trainer = make_trainer(
            cls=PPOTrainer,
            model=copy.deepcopy(policy0),
            value_model=None if critic0 is None else copy.deepcopy(critic0),
            args=args,
        )
        if critic0 is None:
            critic0 = copy.deepcopy(trainer.model.critic)
        trainer._setup_training()
        if rollout is None:
            rollout = _make_rollout(trainer, _rows(trainer))
        advantages, returns = trainer.compute_advantages(rollout)
        grads[vf_coef] = _capture_first_step_grads(trainer)
        _update(trainer, rollout, advantages, returns)
    for name, grad in grads[1e-3].items():
        if name.startswith("policy."):
            torch.testing.assert_close(grads[1e3][name], grad, msg=name)
    for coef, captured in grads.items():
        for prefix in ("policy.", "critic."):
            norm = torch.linalg.vector_norm(
                torch.stack([g.norm() for n, g in captured.items() if n.startswith(prefix)])
            )
            assert float(norm) <= 1.0 + 1e-4, (coef, prefix)


# ------------------------------------------------------------------------------------- KL during pretraining


def test_value_pretraining_targets_include_kl_to_a_user_reference(make_trainer, tokenizer, tiny_config):
    from ..builders import tiny_policy

    reference = tiny_policy(tokenizer, seed=1)  # not the policy
    args = tiny_config(value_pretrain_steps=1, total_episodes=16, kl_coef=0.1)
    trainer = make_trainer(args=args, ref_model=reference)
    rollout = _make_rollout(trainer, _rows(trainer), train_policy=False)
    mask = rollout.response_mask
    assert rollout.kl[mask].abs().min() > 0  # the frozen policy differs from the reference
    with_kl = _token_rewards(trainer, rollout)
    no_kl = copy.copy(rollout)
    no_kl.kl = torch.zeros_like(rollout.kl)
    torch.testing.assert_close(with_kl - _token_rewards(trainer, no_kl), -0.1 * rollout.kl * mask)
    torch.testing.assert_close(rollout.rewards, with_kl)
    # The critic's targets during pretraining (λ = 1) are the reverse sums of those rewards, KL included.
    trainer.begin_value_pretraining()
    _, returns = trainer.compute_advantages(rollout)
    expected = torch.flip(torch.cumsum(torch.flip(with_kl, [1]), 1), [1]) * mask
    torch.testing.assert_close(returns, expected, rtol=1e-5, atol=1e-5)


def test_value_pretraining_skips_kl_when_the_reference_is_the_initial_policy(make_trainer, tiny_config, monkeypatch):
    trainer = make_trainer(args=tiny_config(value_pretrain_steps=1, total_episodes=16, kl_coef=0.1))
    assert trainer.rollout_maker.reference_is_initial_policy
    monkeypatch.setattr(
        trainer.rollout_maker.forwarder,
        "reference_logprobs",
        lambda *args, **kwargs: pytest.fail("reference forward in pretraining"),
    )
    rollout = _make_rollout(trainer, _rows(trainer), train_policy=False)
    assert rollout.logprobs is None and not rollout.kl.any()

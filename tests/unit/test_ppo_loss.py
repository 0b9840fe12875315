"""Tests for `vcppo_trl.algo.objective`: one micro-batch's loss against the losses of `vcppo_trl.algo.losses` by hand."""

from __future__ import annotations

import pytest
import torch

from vcppo_trl import PPOConfig
from vcppo_trl.algo.losses import clipped_policy_loss, clipped_value_loss, loss_normalizer, sampler_importance_weights
from vcppo_trl.algo.masked import masked_mean
from vcppo_trl.algo.objective import PPOBatch, PPOLossSettings, mean_metrics, ppo_micro_batch_loss

B, T = 4, 6


def _inputs(seed=0):
    """A rollout's rows and the model's outputs for them: random, with padding garbage past each response."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.arange(T)[None, :] < torch.tensor([6, 2, 4, 0])[:, None]
    old_logprobs = -torch.rand(B, T, generator=gen) * 3
    batch = PPOBatch(
        mask=mask,
        old_values=torch.randn(B, T, generator=gen),
        returns=torch.randn(B, T, generator=gen),
        advantages=torch.randn(B, T, generator=gen),
        old_logprobs=old_logprobs,
    )
    logprobs = (old_logprobs + 0.3 * torch.randn(B, T, generator=gen)).requires_grad_(True)
    vpred = (batch.old_values + 0.5 * torch.randn(B, T, generator=gen)).requires_grad_(True)
    entropy = torch.rand(B, T, generator=gen)
    sampler_logprobs = old_logprobs + 0.2 * torch.randn(B, T, generator=gen)
    return batch, logprobs, entropy, vpred, sampler_logprobs


def _settings(loss_type, **kwargs):
    return PPOLossSettings(
        cliprange=0.2,
        cliprange_value=0.2,
        vf_coef=0.1,
        loss_type=loss_type,
        value_loss_type="token_mean",
        max_length=T,
        **kwargs,
    )


def _normalizers(batch, settings):
    return (
        loss_normalizer(batch.mask, settings.loss_type, settings.max_length) * 2,  # as if the mini-batch were larger
        loss_normalizer(batch.mask, settings.value_loss_type, settings.max_length) * 2,
    )


def _by_hand(settings, batch, logprobs, vpred, normalizers, importance_weights=None):
    value = clipped_value_loss(
        vpred,
        batch.old_values,
        batch.returns,
        batch.mask,
        settings.cliprange_value,
        loss_type=settings.value_loss_type,
        normalizer=normalizers[1],
        max_length=settings.max_length,
    )
    policy = clipped_policy_loss(
        logprobs,
        batch.old_logprobs,
        batch.advantages,
        batch.mask,
        settings.cliprange,
        loss_type=settings.loss_type,
        normalizer=normalizers[0],
        max_length=settings.max_length,
        importance_weights=importance_weights,
    )
    return value, policy


def _grads(loss, *tensors):
    return torch.autograd.grad(loss, tensors)


@pytest.mark.parametrize("loss_type", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_policy_and_value_loss_is_vf_coef_times_value_plus_policy(loss_type):
    batch, logprobs, entropy, vpred, _ = _inputs()
    settings = _settings(loss_type)
    normalizers = _normalizers(batch, settings)
    out = ppo_micro_batch_loss(settings, batch, logprobs, entropy, vpred, *normalizers)
    value, policy = _by_hand(settings, batch, logprobs, vpred, normalizers)
    expected = settings.vf_coef * value.loss + policy.loss
    assert torch.equal(out.loss, expected)
    for got, want in zip(_grads(out.loss, logprobs, vpred), _grads(expected, logprobs, vpred), strict=True):
        assert torch.equal(got, want)
    assert out.metrics() == {
        "val/clipfrac": value.clipfrac,
        "val/vpred": masked_mean(vpred.detach(), batch.mask),
        "policy/clipfrac": policy.clipfrac,
        "policy/clipfrac_low": policy.clipfrac_low,
        "policy/clipfrac_high": policy.clipfrac_high,
        "policy/clipfrac_low_min": policy.clipfrac_low_min,
        "policy/clipfrac_high_max": policy.clipfrac_high_max,
        "policy/approxkl": policy.approxkl,
        "val/ratio": policy.ratio,
        "policy/entropy": masked_mean(entropy, batch.mask),
    }
    assert 0 < float(policy.clipfrac) < 1 and 0 < float(value.clipfrac) < 1  # both clips are exercised


def test_value_only_loss_leaves_the_policy_out():
    batch, _, _, vpred, _ = _inputs()
    batch.old_logprobs = None
    settings = _settings("token_mean")
    normalizers = _normalizers(batch, settings)
    out = ppo_micro_batch_loss(settings, batch, None, None, vpred, *normalizers)
    value = clipped_value_loss(
        vpred, batch.old_values, batch.returns, batch.mask, 0.2, loss_type="token_mean", normalizer=normalizers[1]
    )
    assert torch.equal(out.loss, settings.vf_coef * value.loss)
    assert out.policy is None and out.entropy is None
    assert set(out.metrics()) == {"val/clipfrac", "val/vpred"}


def test_no_value_clipping():
    batch, logprobs, entropy, vpred, _ = _inputs()
    settings = PPOLossSettings(cliprange=0.2, cliprange_value=None, vf_coef=0.5)
    out = ppo_micro_batch_loss(settings, batch, logprobs, entropy, vpred, 1.0, 1.0)
    unclipped = 0.5 * ((vpred - batch.returns) ** 2)[batch.mask].sum()
    torch.testing.assert_close(out.value.loss, unclipped)
    assert float(out.value.clipfrac) == 0.0


@pytest.mark.parametrize(
    ("mode", "clip_min", "clip_max"),
    [("token_truncate", None, 1.1), ("sequence_mask", 0.5, 1.5)],
)
def test_sampler_importance_weights_weight_the_policy_loss(mode, clip_min, clip_max):
    batch, logprobs, entropy, vpred, sampler_logprobs = _inputs(seed=1)
    batch.sampler_logprobs = sampler_logprobs
    settings = _settings(
        "token_mean",
        importance_sampling_mode=mode,
        importance_sampling_clip_min=clip_min,
        importance_sampling_clip_max=clip_max,
    )
    normalizers = _normalizers(batch, settings)
    out = ppo_micro_batch_loss(settings, batch, logprobs, entropy, vpred, *normalizers)
    weights = sampler_importance_weights(batch.old_logprobs, sampler_logprobs, batch.mask, mode, clip_min, clip_max)
    value, policy = _by_hand(settings, batch, logprobs, vpred, normalizers, importance_weights=weights)
    assert torch.equal(out.loss, settings.vf_coef * value.loss + policy.loss)
    _, uncorrected = _by_hand(settings, batch, logprobs, vpred, normalizers)
    assert not torch.equal(out.policy.loss, uncorrected.loss)  # the weights did change the loss


def test_select_takes_the_rows_of_every_tensor():
    batch, _, _, _, _ = _inputs()
    idx = torch.tensor([2, 0])
    rows = batch.select(idx)
    assert torch.equal(rows.mask, batch.mask[idx]) and torch.equal(rows.advantages, batch.advantages[idx])
    assert torch.equal(rows.old_logprobs, batch.old_logprobs[idx])
    assert rows.sampler_logprobs is None


def test_settings_from_a_config(tmp_path):
    args = PPOConfig(
        output_dir=str(tmp_path),
        report_to="none",
        bf16=False,
        use_cpu=True,
        loss_type="seq_mean_token_sum_norm",
        response_length=7,
        vllm_importance_sampling_mode="token_mask",
    )
    settings = PPOLossSettings.from_args(args, cliprange_value=None)
    assert settings == PPOLossSettings(
        cliprange=args.cliprange,
        cliprange_value=None,
        vf_coef=args.vf_coef,
        loss_type="seq_mean_token_sum_norm",
        value_loss_type="seq_mean_token_sum_norm",  # value_loss_type defaults to loss_type
        max_length=7,
        importance_sampling_mode="token_mask",
        importance_sampling_clip_min=args.vllm_importance_sampling_clip_min,
        importance_sampling_clip_max=args.vllm_importance_sampling_clip_max,
        cliprange_high=None,
        dual_clip_c=None,
        entropy_coef=0.0,
        positive_example_lm_coef=0.0,
    )


def test_mean_metrics():
    stats = {"val/ratio": [torch.tensor(1.0), torch.tensor(3.0)], "loss/value": [torch.tensor(2.0), 4.0]}
    assert mean_metrics(stats) == {"val/ratio": 2.0, "loss/value": 3.0, "val/ratio_var": 2.0}
    assert "val/ratio_var" not in mean_metrics({"val/ratio": [torch.tensor(1.0)]})


# ------------------------------------------------------------------ VAPO's terms


def _vapo_batch(seed=2):
    """`_inputs` with a policy mask that leaves row 0 out (truncated) and positives in rows 0 and 2."""
    batch, logprobs, entropy, vpred, _ = _inputs(seed)
    entropy = entropy.clone().requires_grad_(True)
    batch.policy_mask = batch.mask & torch.tensor([False, True, True, True])[:, None]
    batch.positive_mask = batch.policy_mask & torch.tensor([True, False, True, False])[:, None]
    return batch, logprobs, entropy, vpred


def test_entropy_bonus_and_positive_example_lm_loss_by_hand():
    batch, logprobs, entropy, vpred = _vapo_batch()
    settings = _settings("token_mean", entropy_coef=0.03, positive_example_lm_coef=0.1)
    policy_tokens, positive_tokens = 20.0, 8.0  # as if counted over a larger mini-batch
    base_settings = _settings("token_mean")
    normalizers = _normalizers(batch, settings)
    out = ppo_micro_batch_loss(settings, batch, logprobs, entropy, vpred, *normalizers, policy_tokens, positive_tokens)
    base = ppo_micro_batch_loss(base_settings, batch, logprobs, entropy, vpred, *normalizers)
    pm, pos = batch.policy_mask, batch.positive_mask
    entropy_mean = (entropy * pm).sum() / policy_tokens
    nll = (-logprobs * pos).sum() / positive_tokens
    expected = base.loss - 0.03 * entropy_mean + 0.1 * nll
    torch.testing.assert_close(out.loss, expected)
    torch.testing.assert_close(out.positive_example_lm, nll.detach())
    grad_lp, grad_h = torch.autograd.grad(out.loss, (logprobs, entropy))
    grad_lp_base = torch.autograd.grad(base.loss, logprobs)[0]
    # The LM term's gradient is −μ/N on the positive tokens only; the entropy's −c/N on the policy's tokens only.
    torch.testing.assert_close(grad_lp - grad_lp_base, -0.1 / positive_tokens * pos.float())
    torch.testing.assert_close(grad_h, -0.03 / policy_tokens * pm.float())


def test_positive_example_lm_loss_is_zero_without_correct_responses():
    batch, logprobs, entropy, vpred = _vapo_batch()
    batch.positive_mask = torch.zeros_like(batch.mask)
    settings = _settings("token_mean", positive_example_lm_coef=0.1)
    out = ppo_micro_batch_loss(settings, batch, logprobs, entropy, vpred, *_normalizers(batch, settings), 10.0, 0.0)
    base = ppo_micro_batch_loss(
        _settings("token_mean"), batch, logprobs, entropy, vpred, *_normalizers(batch, settings)
    )
    assert float(out.positive_example_lm) == 0.0 and torch.isfinite(out.loss)
    assert torch.equal(out.loss, base.loss)


def test_masked_truncated_rows_get_no_policy_gradient_but_keep_the_value_loss():
    batch, logprobs, entropy, vpred = _vapo_batch()
    batch.positive_mask = None
    settings = _settings("token_mean", entropy_coef=0.01)
    out = ppo_micro_batch_loss(settings, batch, logprobs, entropy, vpred, *_normalizers(batch, settings))
    grad_lp, grad_v = torch.autograd.grad(out.loss, (logprobs, vpred))
    assert torch.all(grad_lp[0] == 0)  # row 0 is left out of the policy loss
    assert torch.any(grad_lp[2] != 0)
    assert torch.any(grad_v[0] != 0)  # ... and still in the value loss
    unmasked = PPOBatch(batch.mask, batch.old_values, batch.returns, batch.advantages, batch.old_logprobs)
    full = ppo_micro_batch_loss(settings, unmasked, logprobs, entropy, vpred, *_normalizers(unmasked, settings))
    torch.testing.assert_close(out.value.loss, full.value.loss)


@pytest.mark.parametrize("loss_type", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_new_terms_do_not_depend_on_the_micro_batch_split(loss_type):
    """Micro-batch losses normalised by the whole mini-batch's counts add up to the one-micro-batch loss."""
    batch, logprobs, entropy, vpred = _vapo_batch()
    settings = _settings(
        loss_type, cliprange_high=0.28, dual_clip_c=2.0, entropy_coef=0.02, positive_example_lm_coef=0.1
    )
    pm = batch.policy_mask
    counts = (
        loss_normalizer(pm, loss_type, T),
        loss_normalizer(batch.mask, "token_mean", T),
        pm.sum().float(),
        batch.positive_mask.sum().float(),
    )
    whole = ppo_micro_batch_loss(settings, batch, logprobs, entropy, vpred, *counts).loss
    parts = sum(
        ppo_micro_batch_loss(settings, batch.select(idx), logprobs[idx], entropy[idx], vpred[idx], *counts).loss
        for idx in (torch.tensor([0, 3]), torch.tensor([1]), torch.tensor([2]))
    )
    torch.testing.assert_close(parts, whole)
    grads_whole = torch.autograd.grad(whole, (logprobs, entropy, vpred))
    grads_parts = torch.autograd.grad(parts, (logprobs, entropy, vpred))
    for a, b in zip(grads_whole, grads_parts, strict=True):
        torch.testing.assert_close(a, b)


def test_dual_clip_fraction_is_logged_only_when_on():
    batch, logprobs, entropy, vpred, _ = _inputs()
    off = ppo_micro_batch_loss(_settings("token_mean"), batch, logprobs, entropy, vpred, 1.0, 1.0)
    on = ppo_micro_batch_loss(_settings("token_mean", dual_clip_c=1.1), batch, logprobs, entropy, vpred, 1.0, 1.0)
    assert "policy/clipfrac_dual" not in off.metrics()
    assert "policy/clipfrac_dual" in on.metrics()

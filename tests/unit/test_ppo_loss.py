"""Tests for `vcppo_trl.ppo_loss`: one micro-batch's loss against the losses of `vcppo_trl.losses` by hand."""

from __future__ import annotations

import pytest
import torch

from vcppo_trl import PPOConfig
from vcppo_trl.losses import clipped_policy_loss, clipped_value_loss, loss_normalizer, sampler_importance_weights
from vcppo_trl.masked import masked_mean
from vcppo_trl.ppo_loss import PPOBatch, PPOLossSettings, mean_metrics, ppo_micro_batch_loss

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
    )


def test_mean_metrics():
    stats = {"val/ratio": [torch.tensor(1.0), torch.tensor(3.0)], "loss/value": [torch.tensor(2.0), 4.0]}
    assert mean_metrics(stats) == {"val/ratio": 2.0, "loss/value": 3.0, "val/ratio_var": 2.0}
    assert "val/ratio_var" not in mean_metrics({"val/ratio": [torch.tensor(1.0)]})

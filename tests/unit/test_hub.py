"""push_to_hub with the real huggingface_hub client against a local stand-in of the Hub's HTTP API (127.0.0.1)."""

import json
import os

import pytest
import torch
from huggingface_hub import constants

from ..hub_standin import HubStandIn


@pytest.fixture(autouse=True)
def _private_hf_cache(monkeypatch, tmp_path):
    """Keep the client's own cache files (agent registry, token) out of the user's HF_HOME."""
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(tmp_path / "hf_home" / ".agent_harnesses.json"))


@pytest.fixture
def hub(monkeypatch):
    """The stand-in server, with huggingface_hub pointed at it (`HF_ENDPOINT`) and offline mode lifted."""
    server = HubStandIn().start()
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    # huggingface_hub reads both variables once, at import: set what it read.
    monkeypatch.setattr(constants, "ENDPOINT", server.endpoint)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield server
    server.stop()


@pytest.fixture
def named_policy(tiny_policy):
    tiny_policy.config._name_or_path = "test-org/tiny-base"  # as if loaded from the Hub
    return tiny_policy


def _train_and_push(make_trainer, tiny_config, named_policy, **config):
    args = tiny_config(
        **{
            "total_episodes": 8,
            "num_mini_batches": 1,
            "gradient_accumulation_steps": 1,
            "value_pretrain_steps": 1,
            "push_to_hub": True,
            "hub_token": "hf_test_token",
            **config,
        }
    )
    trainer = make_trainer(model=named_policy, args=args)
    trainer.train()
    return trainer


def test_push_policy_and_critic_with_cards(hub, make_trainer, tiny_config, named_policy):
    trainer = _train_and_push(
        make_trainer,
        tiny_config,
        named_policy,
        hub_model_id="test-org/tiny-vcppo",
        hub_private_repo=True,
        value_pretrain_push=True,
    )
    result = trainer.push_to_hub(dataset_name="test-org/toy-arith")
    assert set(result) == {"policy", "value"}
    assert hub.unknown == []
    assert set(hub.repos) == {
        "test-org/tiny-vcppo",
        "test-org/tiny-vcppo-value",
        "test-org/tiny-vcppo-value-pretrained",
    }
    assert all(repo["private"] for repo in hub.repos.values())
    auth = {h.get("Authorization") or h.get("authorization") for m, p, h in hub.requests if m == "POST"}
    assert auth == {"Bearer hf_test_token"}

    policy_files = hub.files("test-org/tiny-vcppo")
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= set(policy_files)
    assert not [p for p in policy_files if p.startswith(("value_model", "value_pretrained", "checkpoint-"))]
    value_files = hub.files("test-org/tiny-vcppo-value")
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= set(value_files)
    assert json.loads(value_files["config.json"])["id2label"] == {"0": "value"}  # num_labels == 1

    # What arrived is what was saved, and loads.
    out = trainer.args.output_dir
    for repo, folder in (
        ("test-org/tiny-vcppo", out),
        ("test-org/tiny-vcppo-value", os.path.join(out, "value_model")),
    ):
        with open(os.path.join(folder, "model.safetensors"), "rb") as f:
            assert hub.files(repo)["model.safetensors"] == f.read()

    policy_card = policy_files["README.md"].decode()
    value_card = value_files["README.md"].decode()
    for card in (policy_card, value_card):
        assert "base_model: test-org/tiny-base" in card
        assert "VC-PPO" in card and "2503.01491" in card and "@article{yuan2025vcppo" in card
        assert "| λ_actor (policy advantages) | 0.95 |" in card
        assert "| λ_critic (value targets) | 1.0 |" in card
        assert "| value-pretraining steps | 1 |" in card
        assert "test-org/toy-arith" in card
        for tag in ("trl", "ppo", "vc-ppo", "vcppo-trl", "generated_from_trainer"):
            assert f"- {tag}\n" in card
    assert "This is the **policy**" in policy_card and "pipeline_tag: text-generation" in policy_card
    assert "This is the **critic (value model)**" in value_card and "- value-model\n" in value_card
    assert "pipeline_tag: token-classification" in value_card
    assert "test-org/tiny-vcppo-value" in policy_card and "(https://huggingface.co/test-org/tiny-vcppo)" in value_card

    # The pretrained critic was pushed right after pretraining, before PPO moved the critic on.
    pretrained = hub.files("test-org/tiny-vcppo-value-pretrained")
    assert {"config.json", "model.safetensors", "README.md"} <= set(pretrained)
    assert "value-pretrained on rollouts of the frozen initial policy" in pretrained["README.md"].decode()
    assert pretrained["model.safetensors"] != value_files["model.safetensors"]


def test_a_run_without_a_critic_pushes_the_policy_alone(hub, make_trainer, tiny_config, named_policy):
    """A group advantage estimator builds no critic: the checkpoint pushes at each save and push_to_hub push the
    policy only, and its card says how its advantages were made."""
    trainer = _train_and_push(
        make_trainer,
        tiny_config,
        named_policy,
        hub_model_id="test-org/tiny-grpo",
        value_pretrain_steps=0,
        advantage_estimator="grpo",
        num_generations=2,
        save_strategy="steps",
        save_steps=1,
    )
    result = trainer.push_to_hub()
    assert set(result) == {"policy"}
    assert set(hub.repos) == {"test-org/tiny-grpo"}
    card = hub.files("test-org/tiny-grpo")["README.md"].decode()
    assert "trained without a critic: its advantages are TRL GRPO's group-relative baseline" in card
    assert "value_model" not in card and "| critic learning rate |" not in card and "| λ_critic" not in card
    assert not os.path.exists(os.path.join(trainer.args.output_dir, "value_model"))


def test_push_honours_revision_and_default_value_repo(hub, make_trainer, tiny_config, named_policy):
    trainer = _train_and_push(
        make_trainer, tiny_config, named_policy, hub_model_id="test-org/rev-run", hub_revision="exp-1"
    )
    trainer.push_to_hub()
    assert set(hub.repos) == {"test-org/rev-run", "test-org/rev-run-value"}  # no pretrained push unless asked
    assert not any(repo["private"] for repo in hub.repos.values())
    for repo in hub.repos.values():
        assert repo["files"]["main"] == {}
        assert "model.safetensors" in repo["files"]["exp-1"]
        assert {c["revision"] for c in repo["commits"]} == {"exp-1"}


def test_every_save_pushes_the_checkpoint_without_its_training_state(hub, make_trainer, tiny_config, named_policy):
    _train_and_push(
        make_trainer,
        tiny_config,
        named_policy,
        hub_model_id="test-org/periodic",
        save_strategy="steps",
        save_steps=1,
    )
    policy_commits = hub.repos["test-org/periodic"]["commits"]
    assert len(policy_commits) == 3  # one per checkpoint: 1 pretraining + 2 PPO updates
    files = hub.files("test-org/periodic")
    assert "model.safetensors" in files
    assert not [
        f for f in files if f.startswith(("optimizer", "scheduler", "rng_state", "trainer_state", "vcppo_state"))
    ]
    assert "model.safetensors" in hub.files("test-org/periodic-value")


def test_push_without_network_is_a_clear_error_and_keeps_the_checkpoint(
    monkeypatch, make_trainer, tiny_config, named_policy
):
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    from vcppo_trl.checkpoint.hub import HubPushError

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # what CI sets: no request may leave
    trainer = _train_and_push(make_trainer, tiny_config, named_policy, hub_model_id="test-org/offline")
    with pytest.raises(HubPushError, match=r"Could not push the policy to the Hub repo 'test-org/offline'.*complete"):
        trainer.push_to_hub()
    out = trainer.args.output_dir
    policy = AutoModelForCausalLM.from_pretrained(out)
    critic = AutoModelForTokenClassification.from_pretrained(os.path.join(out, "value_model"))
    live_policy, live_critic = trainer.unwrapped_policy_and_critic()
    for saved, live in ((policy, live_policy), (critic, live_critic)):
        for (name, a), b in zip(saved.state_dict().items(), live.state_dict().values()):
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert os.path.isfile(os.path.join(out, "README.md"))

    # A refused connection (Hub unreachable) reads the same.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(HubPushError, match="ConnectError|Connect|refused"):
        trainer.push_to_hub()


def test_pretrained_critic_push_failure_does_not_stop_training(monkeypatch, make_trainer, tiny_config, named_policy):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    trainer = _train_and_push(
        make_trainer, tiny_config, named_policy, hub_model_id="test-org/offline", value_pretrain_push=True
    )
    assert trainer.state.global_step == trainer.state.max_steps
    assert os.path.isfile(os.path.join(trainer.args.output_dir, "value_pretrained", "model.safetensors"))


def test_building_the_trainer_with_push_to_hub_needs_no_network(monkeypatch, make_trainer, tiny_config):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    trainer = make_trainer(args=tiny_config(push_to_hub=True, hub_model_id="org/x"))
    assert trainer.hub_model_id == "org/x"

"""One model card per model, written on save and on push: framework versions, the real base model, upload hints."""

import os

import pytest
import torch
import transformers
import trl
from huggingface_hub import ModelCard, constants

from vcppo_trl.checkpoint.hub import HubPushError

from ..builders import length_reward


@pytest.fixture(autouse=True)
def _private_hf_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(tmp_path / "hf_home" / ".agent_harnesses.json"))


def _read(path):
    with open(path) as f:
        return f.read()


def _trained(make_trainer, tiny_config, **kwargs):
    trainer = make_trainer(reward_funcs=length_reward, args=tiny_config(total_episodes=16), **kwargs)
    trainer.train()
    return trainer


def test_save_model_writes_one_card_per_model_with_framework_versions(make_trainer, tiny_config):
    trainer = _trained(make_trainer, tiny_config)
    out = trainer.args.output_dir
    trainer.save_model(out)
    policy_card = _read(os.path.join(out, "README.md"))
    critic_card = _read(os.path.join(out, "value_model", "README.md"))
    assert "This is the **policy**" in policy_card and "This is the **critic (value model)**" in critic_card
    # Saved, not pushed: the card points at the critic's folder, not at a repo that was never made (issue 47).
    assert "https://huggingface.co/" + trainer.args.output_dir not in policy_card
    assert (
        "saved with it, in the `value_model/` folder" in policy_card and "The policy of the run is" not in critic_card
    )
    assert "| prompts per update | 16 |" in policy_card  # total_episodes=16: one update of 16 prompts
    for card in (policy_card, critic_card):
        assert "## Framework versions" in card
        assert f"- TRL: {trl.__version__}" in card
        assert f"- Transformers: {transformers.__version__}" in card
        assert f"- PyTorch: {torch.__version__}" in card
        assert "- vcppo-trl: " in card
    # TRL's inherited create_model_card() writes the same card, not a second, generic one.
    os.remove(os.path.join(out, "README.md"))
    trainer.create_model_card(dataset_name="test-org/toy-arith")
    card = _read(os.path.join(out, "README.md"))
    assert "This is the **policy**" in card and "test-org/toy-arith" in card and "## Framework versions" in card
    assert card.count("---\n") >= 2 and card.count("## Framework versions") == 1


def test_card_names_the_real_base_model_of_a_local_checkpoint(make_trainer, tiny_config, tiny_policy, tmp_path):
    # A local fine-tune whose own card names its Hub base: the card links that base and says it came through the path.
    local = tmp_path / "my-sft"
    tiny_policy.save_pretrained(local)
    ModelCard("---\nbase_model: test-org/upstream-base\n---\n\n# my sft\n").save(local / "README.md")
    trainer = _trained(make_trainer, tiny_config, model=str(local))
    trainer.save_model()
    card = _read(os.path.join(trainer.args.output_dir, "README.md"))
    assert "base_model: test-org/upstream-base" in card
    assert f"| base model | test-org/upstream-base, through the local checkpoint {local} |" in card

    # Without a card: the path itself, and no `base_model` metadata (the Hub only takes repo ids there).
    os.remove(local / "README.md")
    trainer = _trained(make_trainer, tiny_config, model=str(local))
    trainer.save_model()
    card = _read(os.path.join(trainer.args.output_dir, "README.md"))
    assert f"| base model | the local checkpoint {local} |" in card
    assert "base_model:" not in card and "| base model | local |" not in card


def test_push_error_suggests_one_upload_per_model(monkeypatch, make_trainer, tiny_config):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    trainer = _trained(make_trainer, tiny_config)
    trainer.args.hub_model_id = "test-org/offline"
    with pytest.raises(HubPushError) as info:
        trainer.push_to_hub()
    out = trainer.args.output_dir
    message = str(info.value)
    lines = [line.strip() for line in message.splitlines()]
    policy_cmd = next(line for line in lines if line.startswith(f"hf upload test-org/offline {out} . "))
    assert "--exclude 'value_model/*'" in policy_cmd and "--exclude 'checkpoint-*'" in policy_cmd
    assert f"hf upload test-org/offline-value {out}/value_model ." in lines
    assert f"hf upload test-org/offline {out}`" not in message  # never the whole output_dir into the policy repo


def test_a_vapo_card_names_vapo_and_the_terms_that_are_on(make_trainer, tiny_config):
    from vcppo_trl import VAPOConfig, VAPOTrainer

    args = tiny_config(VAPOConfig, total_episodes=16, num_generations=4, dual_clip_c=3.0)
    trainer = make_trainer(cls=VAPOTrainer, reward_funcs=length_reward, args=args)
    trainer.train()
    out = trainer.args.output_dir
    trainer.save_model(out)
    card = _read(os.path.join(out, "README.md"))
    assert "vcppo-trl, a TRL-compatible VAPO trainer" in card and "2504.05118" in card
    assert "- vapo" in card and "- vc-ppo" in card  # tags
    for fact in ("(0.2, 0.28)", "positive-example LM loss μ", "dual-clip c"):
        assert fact in card, fact

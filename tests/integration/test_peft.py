"""PEFT: LoRA on the policy (reference = base with adapters off), LoRA on the critic (scalar head trained fully)."""

import os

import pytest
import torch
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from ..builders import StopAfterPretraining

LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture
def saved_base(tiny_policy, tmp_path):
    """The tiny policy saved and reloaded, so that adapters name a base model that can be loaded again."""
    path = str(tmp_path / "base")
    tiny_policy.save_pretrained(path)
    return path, AutoModelForCausalLM.from_pretrained(path)


def test_lora_critic_trains_only_adapters_and_head_and_saves_an_adapter(make_trainer, tiny_config, saved_base):
    base_path, policy = saved_base
    trainer = make_trainer(model=policy, args=tiny_config(value_peft_config=dict(LORA)))
    critic = trainer.model.critic
    assert isinstance(critic, PeftModel)
    trainable = [n for n, p in critic.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or ".score." in n for n in trainable), trainable
    assert any(".score." in n for n in trainable), "the scalar head must be trained fully"
    value_groups = [g for g in trainer.create_optimizer().param_groups if g["role"] == "value"]
    assert sum(len(g["params"]) for g in value_groups) == len(trainable)
    before = _state(critic)
    trainer.train()
    after = critic.state_dict()
    moved = {k for k in after if not torch.equal(before[k], after[k])}
    assert moved and all("lora_" in k or "score" in k for k in moved), sorted(moved)[:5]
    assert any("lora_B" in k for k in moved) and any("score" in k for k in moved)

    trainer.save_model()
    value_dir = os.path.join(trainer.args.output_dir, "value_model")
    assert os.path.isfile(os.path.join(value_dir, "adapter_config.json"))
    base = AutoModelForTokenClassification.from_pretrained(base_path, num_labels=1)
    loaded = PeftModel.from_pretrained(base, value_dir).eval()
    ids = torch.randint(3, 40, (2, 12))
    critic.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, critic(input_ids=ids).logits)

    # The trainer starts from a saved LoRA critic too (as VC-PPO does from a pretrained one), trainable.
    from vcppo_trl.models.value_model import load_value_model

    reloaded = load_value_model(value_dir)
    assert isinstance(reloaded, PeftModel)
    assert any(p.requires_grad for n, p in reloaded.named_parameters() if "lora_" in n)


def test_value_pretraining_with_lora_critic_and_lora_policy(make_trainer, tiny_config, saved_base):
    _, policy = saved_base
    args = tiny_config(value_pretrain_steps=2, total_episodes=8, weight_decay=0.1, value_peft_config=dict(LORA))
    trainer = make_trainer(model=policy, args=args, peft_config=LoraConfig(task_type="CAUSAL_LM", **LORA))
    callback = trainer.value_pretrain_callback
    policy_before = _state(trainer.model.policy)
    critic_before = _state(trainer.model.critic)

    trainer.add_callback(StopAfterPretraining(callback))
    trainer.train()
    assert callback.done and callback.steps == 2
    policy_after = trainer.model.policy.state_dict()
    assert all(torch.equal(policy_before[k], v) for k, v in policy_after.items()), "policy moved in pretraining"
    assert any(not torch.equal(critic_before[k], v) for k, v in trainer.model.critic.state_dict().items())
    pretrained = os.path.join(trainer.args.output_dir, "value_pretrained")
    assert os.path.isfile(os.path.join(pretrained, "adapter_config.json"))

    # A later run starts from the pretrained LoRA critic by path: pretraining is skipped.
    from vcppo_trl import VCPPOTrainer

    args2 = tiny_config(value_model_path=pretrained, value_pretrain_steps=5, total_episodes=8)
    _, policy2 = saved_base
    trainer2 = make_trainer(cls=VCPPOTrainer, model=policy2, args=args2)
    assert trainer2.value_pretrain_callback is None and isinstance(trainer2.model.critic, PeftModel)
    for k, v in trainer2.model.critic.state_dict().items():
        if "lora_" in k or "modules_to_save" in k:
            torch.testing.assert_close(v, trainer.model.critic.state_dict()[k], rtol=0, atol=0, msg=k)


def test_lora_policy_saves_an_adapter_that_peft_loads(make_trainer, tiny_config, saved_base):
    base_path, policy = saved_base
    trainer = make_trainer(
        model=policy, args=tiny_config(kl_coef=0.1), peft_config=LoraConfig(task_type="CAUSAL_LM", **LORA)
    )
    assert trainer.ref_model is None  # the reference is the base model with the adapter disabled, not a copy
    trainer.train()
    trainer.save_model()
    out = trainer.args.output_dir
    assert os.path.isfile(os.path.join(out, "adapter_config.json"))
    assert not os.path.isfile(os.path.join(out, "model.safetensors"))
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), out).eval()
    live = trainer.model.policy.eval()
    ids = torch.randint(3, 40, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, live(input_ids=ids).logits)
        with live.disable_adapter():
            base_logits = live(input_ids=ids).logits
    assert not torch.allclose(base_logits, loaded(input_ids=ids).logits), "the adapter did not train"


def test_every_vapo_option_with_lora_policy_and_critic(make_trainer, tiny_config, saved_base):
    from vcppo_trl import VAPOConfig, VAPOTrainer

    from .test_trainer import VAPO_OPTIONS, check_vapo_run

    _, policy = saved_base
    args = tiny_config(
        VAPOConfig, value_pretrain_steps=1, total_episodes=32, value_peft_config=dict(LORA), **VAPO_OPTIONS
    )
    trainer = make_trainer(
        cls=VAPOTrainer, model=policy, args=args, peft_config=LoraConfig(task_type="CAUSAL_LM", **LORA)
    )
    before = _state(trainer.model.policy)
    trainer.train()
    check_vapo_run(trainer)
    changed = [k for k, v in trainer.model.policy.state_dict().items() if not torch.equal(before[k], v)]
    assert changed and all("lora_" in k for k in changed)  # only the adapters moved

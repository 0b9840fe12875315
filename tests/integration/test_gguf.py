"""A policy named by a GGUF file (issue 62): `model_init_kwargs={"gguf_file": ...}` reaches the policy, its tokenizer
(chat template kept), the critic built from it and the reference; the model trains in float32 and saves as a plain
transformers checkpoint that the Auto classes reload. The file is a tiny Llama written in-process
(tests/gguf_fixtures.py); SmolLM2's real file goes through the same path (scripts/fetch_smollm2.py)."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

from tests import builders
from tests.gguf_fixtures import CHAT_TEMPLATE, write_tiny_llama_gguf
from vcppo_trl import PPOConfig, PPOTrainer, VCPPOTrainer

GGUF = "tiny.gguf"


@pytest.fixture
def gguf_dir(tmp_path):
    folder = tmp_path / "gguf"
    folder.mkdir()
    written = write_tiny_llama_gguf(str(folder / GGUF))
    return str(folder), written


def _chat_prompts(n: int = 16):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Add {i} and 7."}] for i in range(n)]})


def test_a_gguf_policy_trains_and_saves_as_a_plain_checkpoint(gguf_dir, tmp_path):
    folder, written = gguf_dir
    args = builders.tiny_config(
        tmp_path / "out",
        model_init_kwargs={"gguf_file": GGUF},
        value_pretrain_steps=1,
        max_steps=1,
        kl_coef=0.05,  # a reference model, copied from the policy
        response_length=12,
    )
    trainer = VCPPOTrainer(model=folder, reward_funcs=builders.length_reward, args=args, train_dataset=_chat_prompts())
    policy, critic = trainer.unwrapped_policy_and_critic()
    # The file's weights, dequantized, as plain trainable float32 with no quantizer attached.
    for name, value in written.state_dict().items():
        assert torch.equal(policy.state_dict()[name], value), name
    assert all(p.dtype == torch.float32 and p.requires_grad for p in policy.parameters())
    assert policy.hf_quantizer is None and not policy.is_quantized
    assert not hasattr(policy.config, "quantization_config")
    assert trainer.processing_class.chat_template == CHAT_TEMPLATE  # the tokenizer came from the GGUF file
    assert critic.config.hidden_size == policy.config.hidden_size and not hasattr(critic.config, "quantization_config")
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    trainer.train()
    assert any(not torch.equal(before[k], v) for k, v in policy.state_dict().items())  # it trained

    out = tmp_path / "saved"
    trainer.save_model(str(out))
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    for name, value in policy.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], value), name
    assert getattr(reloaded, "hf_quantizer", None) is None
    assert AutoTokenizer.from_pretrained(out).chat_template == CHAT_TEMPLATE
    value_dir = out / "value_model"
    assert os.path.isdir(value_dir)
    reloaded_critic = AutoModelForTokenClassification.from_pretrained(value_dir)
    for name, value in critic.state_dict().items():
        assert torch.equal(reloaded_critic.state_dict()[name], value), name


def test_a_critic_by_path_beside_a_gguf_policy_is_loaded_from_its_own_folder(gguf_dir, tmp_path):
    """`gguf_file` names the policy's file: a critic (or reward model) loaded from a folder of its own ignores it."""
    folder, _ = gguf_dir
    first = VCPPOTrainer(
        model=folder,
        reward_funcs=builders.length_reward,
        args=builders.tiny_config(tmp_path / "first", model_init_kwargs={"gguf_file": GGUF}),
        train_dataset=_chat_prompts(),
    )
    critic_dir = tmp_path / "critic"
    first.unwrapped_policy_and_critic()[1].save_pretrained(critic_dir)
    second = PPOTrainer(
        model=folder,
        value_model=str(critic_dir),
        reward_funcs=builders.length_reward,
        args=builders.tiny_config(tmp_path / "second", PPOConfig, model_init_kwargs={"gguf_file": GGUF}),
        train_dataset=_chat_prompts(),
    )
    loaded = second.unwrapped_policy_and_critic()[1]
    for name, value in first.unwrapped_policy_and_critic()[1].state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name


def test_a_gguf_with_packed_weights_is_refused_with_the_fix():
    from vcppo_trl.models.loading import detach_gguf_quantizer

    model = builders.tiny_policy(builders.tiny_tokenizer())
    model.model.norm.weight = torch.nn.Parameter(torch.zeros(4, dtype=torch.uint8), requires_grad=False)
    with pytest.raises(ValueError, match="packed torch.uint8 blocks.*uninstall the `kernels` package"):
        detach_gguf_quantizer(model, source="dir/model.gguf")

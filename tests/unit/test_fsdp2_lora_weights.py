"""The LoRA weights a vLLM sync sends under FSDP2 ([`fsdp2_merged_lora_weights`]: each layer's base weight and
adapters gathered, then merged by PEFT's `get_delta_weight`), here on an unsharded model, where nothing is gathered:
the same names, order and values as the `merge_adapter` path; and what it refuses. The sharded case runs on 2 CPU
processes (`test_fsdp2_with_lora_policy_and_critic_trains_saves_and_resumes`)."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from peft import IA3Config, LoraConfig, get_peft_model

from vcppo_trl.sampling.vllm_checks import fsdp2_merged_lora_weights, named_policy_weights

from ..builders import tiny_policy, tiny_tokenizer


def tiny_peft(config):
    return get_peft_model(tiny_policy(tiny_tokenizer(), num_layers=2), config)


def test_the_merge_from_full_tensors_equals_peft_merge_adapter():
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], modules_to_save=["o_proj"])
    model = tiny_peft(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:  # B starts at 0; the copy would equal the original
                param.copy_(torch.randn(param.shape, generator=generator))
    got = [(name, tensor.clone()) for name, tensor in fsdp2_merged_lora_weights(model)]
    expected = [(name, tensor.clone()) for name, tensor in named_policy_weights(model, lambda _: nullcontext())]
    assert [name for name, _ in got] == [name for name, _ in expected]
    assert not any("lora_" in name or "original_module" in name or "base_layer" in name for name, _ in got)
    for (name, a), (_, b) in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    base = dict(model.named_parameters())
    q = "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"
    assert (dict(got)["model.layers.0.self_attn.q_proj.weight"] - base[q]).abs().max() > 0.1  # merged, not the base
    o = "base_model.model.model.layers.0.self_attn.o_proj.modules_to_save.default.weight"
    assert torch.equal(dict(got)["model.layers.0.self_attn.o_proj.weight"], base[o])  # the trained copy
    assert all(not layer.merged for layer in model.modules() if hasattr(layer, "merged"))  # the model is untouched


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (IA3Config(target_modules=["q_proj", "v_proj"], feedforward_modules=[]), "PEFT method.*IA3"),
        (LoraConfig(r=4, target_modules=["q_proj", "embed_tokens"]), "LoRA on .*embed_tokens, a Embedding layer"),
        (LoraConfig(r=4, target_modules=["q_proj"], use_dora=True), "variant \\(DoRA\\)"),
    ],
)
def test_what_it_does_not_merge_is_refused_before_any_gather(config, message):
    with pytest.raises(ValueError, match=f"merges plain LoRA on Linear layers only.*{message}"):
        next(fsdp2_merged_lora_weights(tiny_peft(config)))

"""Chunked response log-probabilities: equal to the full-logits computation (values, entropy, gradients), PEFT and
gradient checkpointing included, and never holding a `[B, T, V]` tensor."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from vcppo_trl.models import logprobs as logprobs_module
from vcppo_trl.models.logprobs import causal_lm_parts, full_logits_logprobs, response_logprobs
from vcppo_trl.models.policy_and_value import policy_logprobs, position_ids_from_mask

CONTEXT = 5
TEMPERATURE = 0.7


def tiny_lm(vocab_size=50, tied=True, arch="llama", seed=0, **overrides):
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
        **overrides,
    )
    if arch == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common)).eval()
    return LlamaForCausalLM(LlamaConfig(**common)).eval()


def batch(vocab_size=50, batch_size=3, response_length=7, seed=1):
    """Left-padded prompts (different lengths) followed by responses, with the mask generation would give."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, vocab_size, (batch_size, CONTEXT + response_length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :2] = 0
    attention_mask[2, :4] = 0
    input_ids[attention_mask == 0] = 0
    return input_ids, attention_mask


def both_paths(model, input_ids, attention_mask, compute_entropy=True):
    position_ids = position_ids_from_mask(attention_mask)
    args = (input_ids, attention_mask, position_ids, CONTEXT, TEMPERATURE, compute_entropy)
    return response_logprobs(model, *args), full_logits_logprobs(model, *args)


@pytest.mark.parametrize("arch,tied", [("llama", True), ("qwen2", False)])
def test_chunked_equals_full_logits(arch, tied):
    model = tiny_lm(arch=arch, tied=tied)
    assert causal_lm_parts(model) is not None
    input_ids, attention_mask = batch()
    with torch.no_grad():
        (lp, ent), (lp_ref, ent_ref) = both_paths(model, input_ids, attention_mask)
    assert lp.shape == ent.shape == (3, 7) and lp.dtype == ent.dtype == torch.float32
    torch.testing.assert_close(lp, lp_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent, ent_ref, rtol=1e-5, atol=1e-6)


def test_vocabulary_larger_than_one_tile(monkeypatch):
    """Several vocabulary tiles fold into the same log-sum-exp as one softmax over the whole vocabulary."""
    monkeypatch.setattr(logprobs_module, "VOCAB_CHUNK", 16)
    model = tiny_lm(vocab_size=50)
    input_ids, attention_mask = batch()
    with torch.no_grad():
        (lp, ent), (lp_ref, ent_ref) = both_paths(model, input_ids, attention_mask)
    torch.testing.assert_close(lp, lp_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent, ent_ref, rtol=1e-5, atol=1e-6)


def parameter_grads(model, loss_fn):
    model.zero_grad(set_to_none=True)
    loss_fn().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("gradient_checkpointing", [False, True])
def test_gradients_equal_full_logits(gradient_checkpointing):
    model = tiny_lm(vocab_size=40, tied=False, arch="qwen2")
    model.train()
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    input_ids, attention_mask = batch(vocab_size=40)
    weights = torch.randn(3, 7, generator=torch.Generator().manual_seed(3))
    position_ids = position_ids_from_mask(attention_mask)

    def loss(fn):
        def compute():
            lp, ent = fn(model, input_ids, attention_mask, position_ids, CONTEXT, TEMPERATURE, True)
            return (lp * weights).sum() + 0.1 * ent.sum()

        return compute

    chunked = parameter_grads(model, loss(response_logprobs))
    full = parameter_grads(model, loss(full_logits_logprobs))
    assert chunked.keys() == full.keys() and "lm_head.weight" in chunked
    for name in full:
        torch.testing.assert_close(chunked[name], full[name], rtol=1e-4, atol=1e-6, msg=name)


def test_policy_logprobs_keeps_its_contract():
    """`policy_logprobs` (the trainer's entry point) builds position ids from the mask and returns no entropy by
    default."""
    model = tiny_lm()
    input_ids, attention_mask = batch()
    with torch.no_grad():
        lp, ent = policy_logprobs(model, input_ids, attention_mask, CONTEXT, TEMPERATURE)
        lp_ref, _ = full_logits_logprobs(
            model, input_ids, attention_mask, position_ids_from_mask(attention_mask), CONTEXT, TEMPERATURE
        )
    assert ent is None
    torch.testing.assert_close(lp, lp_ref, rtol=1e-5, atol=1e-6)


def lora(model, target_modules):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=target_modules, init_lora_weights=False)
    )
    return peft_model.eval()


def test_peft_policy_and_its_disabled_adapter_reference():
    base_copy = tiny_lm()
    model = lora(tiny_lm(), ["q_proj", "v_proj"])
    assert causal_lm_parts(model) is not None
    input_ids, attention_mask = batch()
    with torch.no_grad():
        (lp, ent), (lp_ref, ent_ref) = both_paths(model, input_ids, attention_mask)
        with model.disable_adapter():
            (lp_base, _), _ = both_paths(model, input_ids, attention_mask)
        (lp_plain, _), _ = both_paths(base_copy, input_ids, attention_mask)
    torch.testing.assert_close(lp, lp_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent, ent_ref, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(lp, lp_base, atol=1e-4)  # the adapter changes the policy...
    torch.testing.assert_close(lp_base, lp_plain, rtol=1e-5, atol=1e-6)  # ...and disabling it gives the base model


def test_lora_on_the_lm_head_falls_back_to_full_logits():
    model = lora(tiny_lm(tied=False), ["q_proj", "lm_head"])
    assert causal_lm_parts(model) is None
    input_ids, attention_mask = batch()
    with torch.no_grad():
        (lp, _), (lp_ref, _) = both_paths(model, input_ids, attention_mask)
    torch.testing.assert_close(lp, lp_ref)


def test_unsupported_output_scaling_falls_back_to_full_logits():
    model = tiny_lm()
    model.config.logits_scaling = 2.0
    assert causal_lm_parts(model) is None


def test_final_logit_softcapping_is_applied():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
        final_logit_softcapping=2.0,
    )
    model = Gemma2ForCausalLM(config).eval()
    assert causal_lm_parts(model).final_logit_softcapping == 2.0
    input_ids, attention_mask = batch()
    with torch.no_grad():
        (lp, ent), (lp_ref, ent_ref) = both_paths(model, input_ids, attention_mask)
    torch.testing.assert_close(lp, lp_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent, ent_ref, rtol=1e-5, atol=1e-6)


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("train", [False, True])
def test_no_tensor_as_large_as_the_logits(monkeypatch, train):
    """Forward (and backward) never produce a `[B, T, V]` tensor, while the full-logits path does."""
    monkeypatch.setattr(logprobs_module, "VOCAB_CHUNK", 64)
    vocab = 1024
    model = tiny_lm(vocab_size=vocab)
    # Enough tokens that the logits outgrow the weights (and their gradients), which are allowed.
    input_ids, attention_mask = batch(vocab_size=vocab, response_length=60)
    logits_numel = input_ids.shape[0] * (input_ids.shape[1] - CONTEXT) * vocab
    position_ids = position_ids_from_mask(attention_mask)
    largest = {}
    for name, fn in (("chunked", response_logprobs), ("full", full_logits_logprobs)):
        with torch.set_grad_enabled(train), LargestTensor() as probe:
            lp, ent = fn(model, input_ids, attention_mask, position_ids, CONTEXT, TEMPERATURE, True)
            if train:
                (lp.sum() + ent.sum()).backward()
        largest[name] = probe.largest
    assert largest["full"] >= logits_numel
    assert largest["chunked"] < logits_numel / 4

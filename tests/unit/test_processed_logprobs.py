"""The trainer's log-probabilities under sampling knobs (issue 47): every path that scores response tokens (the chunked
head in tiles of tokens, the full logits, padding-free packing, a sequence split) gives the log-probs of the
distribution transformers' own logits processors produce on the model's logits, with the entropy of that
distribution and the gradients of the full-logits computation."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessorList

from vcppo_trl.algo.logits_processing import UNREACHABLE_LOGPROB, VLLM_ORDER, SamplingKnobs
from vcppo_trl.algo.micro_batches import MicroBatch
from vcppo_trl.models import logprobs as logprobs_module
from vcppo_trl.models.logprobs import full_logits_logprobs, response_logprobs
from vcppo_trl.models.packing import TokenBatch
from vcppo_trl.models.policy_and_value import PolicyAndValueModel, position_ids_from_mask
from vcppo_trl.parallel.sequence import SequenceGroup

from .test_logits_processing import transformers_processors
from .test_logprobs import LargestTensor

VOCAB = 40
CONTEXT = 5
TEMPERATURE = 0.7  # test_logits_processing's
KNOBS = {
    "top_k": SamplingKnobs(top_k=6),
    "top_p": SamplingKnobs(top_p=0.85),
    "min_p": SamplingKnobs(min_p=0.45),
    "repetition_penalty": SamplingKnobs(repetition_penalty=1.5),
    "all": SamplingKnobs(top_k=15, top_p=0.9, min_p=0.05, repetition_penalty=1.3),
    "all, vLLM's order": SamplingKnobs(top_k=15, top_p=0.9, min_p=0.05, repetition_penalty=1.3, order=VLLM_ORDER),
}


def tiny_lm(seed=0, tied=True):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).eval()


def batch(response_length=7, seed=1):
    """Left-padded prompts (different lengths) followed by responses that repeat tokens, with generation's mask."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, VOCAB, (3, CONTEXT + response_length), generator=generator)
    input_ids[:, CONTEXT:] = torch.randint(1, 12, (3, response_length), generator=generator)  # repeats
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :2] = 0
    attention_mask[2, :4] = 0
    input_ids[attention_mask == 0] = 0
    return input_ids, attention_mask


def paths(model, knobs, compute_entropy=True):
    input_ids, attention_mask = batch()
    args = (model, input_ids, attention_mask, position_ids_from_mask(attention_mask), CONTEXT, TEMPERATURE)
    chunked = response_logprobs(*args, compute_entropy=compute_entropy, knobs=knobs)
    full = full_logits_logprobs(*args, compute_entropy=compute_entropy, knobs=knobs)
    return chunked, full


def transformers_logprobs(model, input_ids, attention_mask, knobs):
    """Each response token's log-prob under what `generate`'s processors make of the model's logits at its step."""
    if knobs.order == VLLM_ORDER:
        pytest.skip("transformers' order only")
    with torch.no_grad():
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask)
        ).logits.float()
    padding = (attention_mask != 0).int().argmax(dim=1)
    processors: LogitsProcessorList = transformers_processors(knobs, padding)
    out = []
    for t in range(input_ids.shape[1] - CONTEXT):
        scores = processors(input_ids[:, : CONTEXT + t], logits[:, CONTEXT - 1 + t].clone())
        out.append(torch.log_softmax(scores, -1).gather(-1, input_ids[:, CONTEXT + t, None]).squeeze(-1))
    return torch.stack(out, 1)


@pytest.mark.parametrize("name", sorted(KNOBS))
def test_chunked_and_full_logits_give_transformers_processed_log_probs(name, monkeypatch):
    monkeypatch.setattr(logprobs_module, "PROCESSED_TILE", VOCAB * 4)  # 4 tokens per tile: several tiles
    knobs = KNOBS[name]
    model = tiny_lm()
    with torch.no_grad():
        (lp, ent), (lp_full, ent_full) = paths(model, knobs)
    torch.testing.assert_close(lp, lp_full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ent_full, rtol=1e-5, atol=1e-5)
    if knobs.order != VLLM_ORDER:
        input_ids, attention_mask = batch()
        expected = transformers_logprobs(model, input_ids, attention_mask, knobs).clamp(min=UNREACHABLE_LOGPROB)
        torch.testing.assert_close(lp, expected, rtol=1e-5, atol=1e-5)
    if knobs.truncates:  # these random responses hold tokens inside and outside the kept sets
        assert (lp > -80).any() and (lp == UNREACHABLE_LOGPROB).any()


@pytest.mark.parametrize("train", [False, True])
def test_no_tensor_as_large_as_the_logits(monkeypatch, train):
    """The processed path holds tiles of whole vocabulary rows, never the `[B, T, V]` logits (forward and backward)."""
    vocab = 1024
    monkeypatch.setattr(logprobs_module, "PROCESSED_TILE", vocab * 8)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4
    )
    model = LlamaForCausalLM(config)
    input_ids = torch.randint(1, vocab, (3, CONTEXT + 60))
    attention_mask = torch.ones_like(input_ids)
    logits_numel = 3 * 60 * vocab
    knobs = SamplingKnobs(top_k=50, top_p=0.9, min_p=0.01, repetition_penalty=1.2)
    with torch.set_grad_enabled(train), LargestTensor() as probe:
        lp, ent = response_logprobs(
            model, input_ids, attention_mask, position_ids_from_mask(attention_mask), CONTEXT, TEMPERATURE,
            compute_entropy=True, knobs=knobs,
        )  # fmt: skip
        if train:
            (lp.sum() + ent.sum()).backward()
    assert probe.largest < logits_numel / 4


def test_truncation_changes_the_log_probs_and_lowers_the_entropy():
    model = tiny_lm()
    with torch.no_grad():
        (plain, plain_entropy), _ = paths(model, SamplingKnobs())
        (lp, entropy), _ = paths(model, SamplingKnobs(top_k=3))
    assert (entropy <= plain_entropy + 1e-6).all() and (entropy < plain_entropy - 0.1).any()
    kept = lp > -80
    assert (lp[kept] >= plain[kept] - 1e-6).all()  # renormalised over fewer tokens


@pytest.mark.parametrize("name", ["top_p", "all", "all, vLLM's order"])
def test_gradients_equal_full_logits(name, monkeypatch):
    monkeypatch.setattr(logprobs_module, "PROCESSED_TILE", VOCAB * 5)
    knobs = KNOBS[name]
    model = tiny_lm(tied=False).train()
    weights = torch.randn(3, 7, generator=torch.Generator().manual_seed(3))

    def grads(fn):
        model.zero_grad(set_to_none=True)
        input_ids, attention_mask = batch()
        args = (model, input_ids, attention_mask, position_ids_from_mask(attention_mask), CONTEXT, TEMPERATURE)
        lp, ent = fn(*args, compute_entropy=True, knobs=knobs)
        kept = (lp > -80).float()
        ((lp * weights * kept).sum() + 0.1 * ent.sum()).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    chunked, full = grads(response_logprobs), grads(full_logits_logprobs)
    assert chunked.keys() == full.keys() and "lm_head.weight" in chunked
    for name_, grad in full.items():
        torch.testing.assert_close(chunked[name_], grad, rtol=1e-4, atol=1e-6, msg=name_)


@pytest.mark.parametrize("head", ["chunked", "full logits"])
@pytest.mark.parametrize("name", ["repetition_penalty", "all"])
def test_padded_packed_and_split_layouts_agree(name, head, monkeypatch):
    """The repetition penalty's history is each row's prompt (without its padding) and its response in every layout."""
    from transformers import AutoModelForTokenClassification

    if head == "full logits":
        monkeypatch.setattr("vcppo_trl.models.split_forwards.causal_lm_parts", lambda model: None)
        monkeypatch.setattr("vcppo_trl.models.logprobs.causal_lm_parts", lambda model: None)
    knobs = KNOBS[name]
    policy = tiny_lm()
    critic_config = LlamaConfig(**policy.config.to_dict())
    critic_config.num_labels = 1
    model = PolicyAndValueModel(policy, AutoModelForTokenClassification.from_config(critic_config).eval())
    query = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10], [0, 0, 0, 3]])
    response = torch.tensor([[11, 5, 11, 0], [14, 7, 7, 0], [3, 16, 3, 16]])
    lengths = torch.tensor([3, 3, 4])
    tokens = TokenBatch(query, (query != 0).long(), response, torch.arange(4)[None, :] < lengths[:, None])
    micro = MicroBatch(indices=torch.tensor([0, 1, 2]), prompt_width=4, response_width=4)
    mask = tokens.attention_mask[:, 4:].bool()

    def run(inputs):
        model.zero_grad()
        logprobs, entropy, _ = model(temperature=TEMPERATURE, knobs=knobs, **inputs)
        ((logprobs * mask).sum() + (entropy * mask).sum()).backward()
        return logprobs.detach(), entropy.detach(), {n: p.grad.clone() for n, p in policy.named_parameters()}

    padded = run(tokens.model_inputs(micro, padding_free=False))
    packed = run(tokens.model_inputs(micro, padding_free=True))
    split = run(tokens.model_inputs(micro, padding_free=False, group=SequenceGroup(size=1, rank=0, first_process=0)))
    for other in (packed, split):
        torch.testing.assert_close(other[0][mask], padded[0][mask], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(other[1][mask], padded[1][mask], rtol=1e-5, atol=1e-5)
        for n, grad in padded[2].items():
            torch.testing.assert_close(other[2][n], grad, rtol=1e-4, atol=1e-5, msg=n)
    # the penalty is on: the prompt and the earlier response tokens are penalised
    plain = model(temperature=TEMPERATURE, **tokens.model_inputs(micro, padding_free=False))[0].detach()
    assert not torch.allclose(plain[mask], padded[0][mask])

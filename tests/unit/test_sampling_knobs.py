"""Sampling knobs on the HF path (issue 47): `generate` samples with the knobs and nothing else of the model's
generation config, and the trainer's log-probs of what it sampled are those of transformers' own logits processors
re-run on the same logits (within float noise), the sampled tokens always inside the kept set."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from vcppo_trl.algo.logits_processing import UNREACHABLE_LOGPROB, SamplingKnobs
from vcppo_trl.models.policy_and_value import policy_logprobs, position_ids_from_mask
from vcppo_trl.sampling.hf import HFSampler, sample_with_policy

from .test_logits_processing import transformers_processors

TEMPERATURE = 0.7  # test_logits_processing's
# Per knob and combined; values that drop tokens of the untrained tiny policy (a near-flat distribution).
KNOBS = {
    "top_k": SamplingKnobs(top_k=8),
    "top_p": SamplingKnobs(top_p=0.6),
    "min_p": SamplingKnobs(min_p=0.5),
    "repetition_penalty": SamplingKnobs(repetition_penalty=1.8),
    "all": SamplingKnobs(top_k=20, top_p=0.8, min_p=0.3, repetition_penalty=1.3),
}
PROMPTS = ["Add 63 and 15.\n", "Add 7 and 8.\n", "Add 105 and 26.\n", "Add 3 and 4.\n"] * 2
TOLERANCE = 1e-5


def sample(policy, tokenizer, knobs, seed=0, response_length=16):
    sampler = HFSampler(
        lambda: None, None, tokenizer, [tokenizer.eos_token_id], response_length=response_length, chunk_size=4,
        knobs=knobs,
    )  # fmt: skip
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    torch.manual_seed(seed)
    samples = sample_with_policy(
        policy,
        enc["input_ids"],
        enc["attention_mask"],
        config=sampler.generation_config(greedy=False, temperature=TEMPERATURE),
        chunk_size=4,
        stop_token_ids=[tokenizer.eos_token_id],
        with_logprobs=True,
    )
    return enc["input_ids"], enc["attention_mask"], samples


def max_gaps(policy, tokenizer, knobs):
    query_ids, query_mask, samples = sample(policy, tokenizer, knobs)
    context = query_ids.shape[1]
    ids = torch.cat([query_ids, samples.response_ids], 1)
    mask = torch.cat([query_mask.bool(), samples.response_mask], 1).long()
    valid = samples.response_mask
    with torch.no_grad():
        trainer, _ = policy_logprobs(policy, ids, mask, context, TEMPERATURE, knobs=knobs)
        logits = policy(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits.float()
    processors = transformers_processors(knobs, (query_mask != 0).int().argmax(dim=1))
    independent = torch.stack(
        [
            torch.log_softmax(processors(ids[:, : context + t], logits[:, context - 1 + t].clone()), -1)
            .gather(-1, ids[:, context + t, None])
            .squeeze(-1)
            for t in range(samples.response_ids.shape[1])
        ],
        1,
    )
    assert valid.any()
    assert (trainer[valid] > UNREACHABLE_LOGPROB + 1).all()  # never outside the kept set
    assert torch.isfinite(independent[valid]).all() and torch.isfinite(samples.logprobs[valid]).all()
    return (
        float((trainer - independent).abs()[valid].max()),
        float((trainer - samples.logprobs).abs()[valid].max()),
        trainer,
        valid,
    )


@pytest.mark.parametrize("name", sorted(KNOBS))
def test_hf_samples_are_scored_under_the_distribution_they_were_drawn_from(name, tokenizer, tiny_policy):
    knobs = KNOBS[name]
    independent_gap, sampler_gap, _, _ = max_gaps(tiny_policy, tokenizer, knobs)
    print(f"HF {name}: max |Δ log p| trainer vs transformers' processors {independent_gap:.2e}, vs generate's scores "
          f"{sampler_gap:.2e}")  # fmt: skip
    assert independent_gap < TOLERANCE
    assert sampler_gap < TOLERANCE


def test_the_knobs_change_what_is_sampled_and_the_tokens_stay_in_the_kept_set(tokenizer, tiny_policy):
    """Under top-k the sampled tokens are each among the k most probable, which sampling at the temperature alone
    is not."""
    knobs = SamplingKnobs(top_k=3)
    query_ids, query_mask, samples = sample(tiny_policy, tokenizer, knobs, response_length=24)
    ids = torch.cat([query_ids, samples.response_ids], 1)
    mask = torch.cat([query_mask.bool(), samples.response_mask], 1).long()
    with torch.no_grad():
        logits = tiny_policy(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    context = query_ids.shape[1]
    steps = logits[:, context - 1 : -1]
    rank = (steps > steps.gather(-1, samples.response_ids[..., None])).sum(-1)
    assert (rank[samples.response_mask] < 3).all()
    _, _, plain = sample(tiny_policy, tokenizer, SamplingKnobs(), response_length=24)
    ids = torch.cat([query_ids, plain.response_ids], 1)
    mask = torch.cat([query_mask.bool(), plain.response_mask], 1).long()
    with torch.no_grad():
        logits = tiny_policy(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    steps = logits[:, context - 1 : -1]
    rank = (steps > steps.gather(-1, plain.response_ids[..., None])).sum(-1)
    assert (rank[plain.response_mask] >= 3).any()


def test_generation_config_sets_the_knobs_and_greedy_none(tokenizer):
    knobs = SamplingKnobs(top_k=5, top_p=0.9, min_p=0.1, repetition_penalty=1.2)
    sampler = HFSampler(lambda: None, None, tokenizer, [1], response_length=8, chunk_size=4, knobs=knobs)
    config = sampler.generation_config(greedy=False, temperature=0.5)
    assert (config.temperature, config.top_k, config.top_p, config.min_p, config.repetition_penalty) == (
        0.5,
        5,
        0.9,
        0.1,
        1.2,
    )
    greedy = sampler.generation_config(greedy=True, temperature=0.5)
    assert not greedy.do_sample and greedy.repetition_penalty is None and greedy.top_k is None
    plain = HFSampler(lambda: None, None, tokenizer, [1], response_length=8, chunk_size=4).generation_config(
        greedy=False, temperature=1.0
    )
    assert (plain.top_k, plain.top_p, plain.min_p, plain.repetition_penalty) == (0, 1.0, None, 1.0)


def test_the_models_own_generation_config_still_does_not_apply(tokenizer, tiny_policy):
    """A checkpoint's repetition_penalty or min_p is set aside: only the trainer's knobs shape the samples."""
    knobs = SamplingKnobs(top_k=8)
    _, _, expected = sample(tiny_policy, tokenizer, knobs)
    tiny_policy.generation_config = GenerationConfig(repetition_penalty=3.0, min_p=0.9, no_repeat_ngram_size=1)
    _, _, got = sample(tiny_policy, tokenizer, knobs)
    assert torch.equal(got.response_ids, expected.response_ids)


def test_a_sampler_refuses_knobs_scored_in_the_other_samplers_order(tokenizer):
    """With both top_p and min_p the order decides the distribution: knobs scored in vLLM's order are refused by
    transformers' generate, and the other way round by vLLM's samplers, never sampled silently."""
    from vcppo_trl.algo.logits_processing import VLLM_ORDER, require_order

    both = SamplingKnobs(top_p=0.9, min_p=0.1, order=VLLM_ORDER)
    with pytest.raises(ValueError, match="transformers' generate applies min_p after top_p.*order='transformers'"):
        HFSampler(lambda: None, None, tokenizer, [1], response_length=8, chunk_size=4, knobs=both)
    HFSampler(lambda: None, None, tokenizer, [1], response_length=8, chunk_size=4, knobs=SamplingKnobs(top_p=0.9))
    require_order(SamplingKnobs(top_k=3, min_p=0.1, order=VLLM_ORDER), "transformers", sampler="x")  # they commute
    with pytest.raises(ValueError, match="vLLM applies min_p before top_p"):
        require_order(SamplingKnobs(top_p=0.9, min_p=0.1), VLLM_ORDER, sampler="vLLM")

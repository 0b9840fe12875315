"""The sampled distribution as one pure function (algo/logits_processing.py): on random logits it is exactly what
transformers' own logits processors give, per knob and combined, with the repetition penalty's history as `generate`
sees it; the two samplers' orders differ only for top_p with min_p; log-probs, entropy and gradients stay finite."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LogitsProcessorList
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from vcppo_trl.algo.logits_processing import (
    UNREACHABLE_LOGPROB,
    VLLM_ORDER,
    SamplingKnobs,
    first_seen_steps,
    processed_logits,
    processed_logprobs,
    seen_before,
)

VOCAB = 40
TEMPERATURE = 0.7
# Per knob and combined (the TRL names and values a GRPO config would give).
KNOBS = {
    "top_k": SamplingKnobs(top_k=5),
    "top_p": SamplingKnobs(top_p=0.8),
    "min_p": SamplingKnobs(min_p=0.1),
    "repetition_penalty": SamplingKnobs(repetition_penalty=1.3),
    "repetition_penalty_below_1": SamplingKnobs(repetition_penalty=0.8),
    "all": SamplingKnobs(top_k=12, top_p=0.9, min_p=0.05, repetition_penalty=1.2),
}


def transformers_processors(knobs: SamplingKnobs, padding: torch.Tensor | None = None) -> LogitsProcessorList:
    """The processors `generate` builds for these knobs, in `_get_logits_processor`'s order."""
    processors = LogitsProcessorList()
    if knobs.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(knobs.repetition_penalty, prompt_ignore_length=padding))
    processors.append(TemperatureLogitsWarper(TEMPERATURE))
    if knobs.top_k:
        processors.append(TopKLogitsWarper(knobs.top_k))
    if knobs.top_p < 1.0:
        processors.append(TopPLogitsWarper(knobs.top_p))
    if knobs.min_p is not None:
        processors.append(MinPLogitsWarper(knobs.min_p))
    return processors


def histories(rows=4, prompt=6, response=9, seed=0):
    """Left-padded prompts (pad id -1 where the mask is 0) and responses drawn from a small vocabulary (repeats)."""
    generator = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(0, VOCAB, (rows, prompt), generator=generator)
    response_ids = torch.randint(0, VOCAB // 2, (rows, response), generator=generator)
    prompt_mask = torch.ones(rows, prompt, dtype=torch.bool)
    prompt_mask[1, :2] = False
    prompt_mask[2, :5] = False
    return prompt_ids, prompt_mask, response_ids


@pytest.mark.parametrize("name", sorted(KNOBS))
def test_equal_to_transformers_processors_step_by_step(name):
    """At each response step, the processors `generate` runs (the penalty over the prompt without its left padding,
    and the response so far) give exactly the pure function's logits, dropped tokens included."""
    knobs = KNOBS[name]
    prompt_ids, prompt_mask, response_ids = histories()
    rows, steps = response_ids.shape
    logits = torch.randn(rows, steps, VOCAB, generator=torch.Generator().manual_seed(1)) * 3
    history = torch.cat([torch.where(prompt_mask, prompt_ids, -1), response_ids], 1)
    first_seen = first_seen_steps(history, prompt_ids.shape[1], VOCAB)
    seen = seen_before(first_seen[:, None, :], torch.arange(steps)[None, :].expand(rows, -1))
    ours = processed_logits(logits, TEMPERATURE, knobs, seen=seen)
    padding = (prompt_mask != 0).int().argmax(dim=1)  # as generate computes it from the attention mask
    for t in range(steps):
        input_ids = torch.cat([torch.where(prompt_mask, prompt_ids, 0), response_ids[:, :t]], 1)
        expected = transformers_processors(knobs, padding)(input_ids, logits[:, t].clone())
        assert torch.equal(torch.isneginf(ours[:, t]), torch.isneginf(expected)), t
        kept = ~torch.isneginf(expected)
        torch.testing.assert_close(ours[:, t][kept], expected[kept], rtol=0, atol=0)
    if knobs.truncates:
        assert torch.isneginf(ours).any()


@pytest.mark.parametrize("name", sorted(KNOBS))
def test_log_probs_are_the_renormalised_kept_set(name):
    knobs = KNOBS[name]
    prompt_ids, prompt_mask, response_ids = histories(seed=3)
    history = torch.cat([torch.where(prompt_mask, prompt_ids, -1), response_ids], 1)
    seen = seen_before(first_seen_steps(history, prompt_ids.shape[1], VOCAB)[:, None, :], torch.arange(9)[None, :])
    logits = torch.randn(4, 9, VOCAB, generator=torch.Generator().manual_seed(4)) * 3
    scores = processed_logits(logits, TEMPERATURE, knobs, seen=seen)
    targets = scores.argmax(-1)  # always kept
    logprobs, entropy = processed_logprobs(logits, targets, TEMPERATURE, knobs, seen=seen, compute_entropy=True)
    expected = torch.log_softmax(scores, -1).gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(logprobs, expected, rtol=0, atol=0)
    probs = scores.softmax(-1)
    expected_entropy = -(probs * torch.log(probs).nan_to_num(neginf=0.0)).sum(-1)
    torch.testing.assert_close(entropy, expected_entropy, rtol=1e-5, atol=1e-6)


def test_no_knobs_is_the_temperature_alone():
    logits = torch.randn(3, 5, VOCAB)
    targets = torch.randint(0, VOCAB, (3, 5))
    logprobs, entropy = processed_logprobs(logits, targets, TEMPERATURE, compute_entropy=True)
    full = torch.log_softmax(logits / TEMPERATURE, -1)
    torch.testing.assert_close(logprobs, full.gather(-1, targets[..., None]).squeeze(-1))
    torch.testing.assert_close(entropy, -(full.exp() * full).sum(-1))
    assert not SamplingKnobs().active and SamplingKnobs(min_p=0.0).active is False


def test_a_dropped_token_gets_the_floor_and_no_gradient():
    logits = torch.randn(2, VOCAB, requires_grad=True)
    knobs = SamplingKnobs(top_k=3)
    dropped = logits.detach().argmin(-1)
    logprobs, entropy = processed_logprobs(logits, dropped, TEMPERATURE, knobs, compute_entropy=True)
    assert torch.equal(logprobs, torch.full((2,), UNREACHABLE_LOGPROB))
    assert UNREACHABLE_LOGPROB == pytest.approx(math.log(torch.finfo(torch.float32).tiny))
    (logprobs.sum() + entropy.sum()).backward()
    assert torch.isfinite(logits.grad).all()
    kept = logits.detach().topk(3, -1).indices
    outside = torch.ones_like(logits, dtype=torch.bool).scatter(-1, kept, False)
    assert (logits.grad[outside] == 0).all()  # dropped tokens take no gradient, from the entropy either


def test_gradient_is_that_of_the_log_softmax_over_the_kept_tokens():
    logits = torch.randn(3, VOCAB, dtype=torch.float64, requires_grad=True)
    knobs = SamplingKnobs(top_p=0.7, repetition_penalty=1.4)
    seen = torch.zeros(3, VOCAB, dtype=torch.bool)
    seen[:, :10] = True
    targets = processed_logits(logits.detach(), TEMPERATURE, knobs, seen=seen).argmax(-1)
    (logprobs, entropy) = processed_logprobs(logits, targets, TEMPERATURE, knobs, seen=seen, compute_entropy=True)
    (logprobs.sum() + 0.3 * entropy.sum()).backward()
    kept = ~torch.isneginf(processed_logits(logits.detach(), TEMPERATURE, knobs, seen=seen))
    reference = logits.detach().clone().requires_grad_()
    penalised = torch.where(seen, torch.where(reference < 0, reference * 1.4, reference / 1.4), reference)
    scores = (penalised / TEMPERATURE).masked_fill(~kept, -math.inf)
    log_p = torch.log_softmax(scores, -1)
    ref_entropy = -(log_p.exp() * log_p.masked_fill(~kept, 0)).sum(-1)
    (log_p.gather(-1, targets[:, None]).sum() + 0.3 * ref_entropy.sum()).backward()
    torch.testing.assert_close(logits.grad, reference.grad)


def test_first_seen_steps_is_what_each_step_has_seen():
    prompt_ids, prompt_mask, response_ids = histories()
    history = torch.cat([torch.where(prompt_mask, prompt_ids, -1), response_ids], 1)
    first_seen = first_seen_steps(history, prompt_ids.shape[1], VOCAB)
    for row in range(4):
        for t in range(response_ids.shape[1] + 1):
            expected = set(prompt_ids[row][prompt_mask[row]].tolist()) | set(response_ids[row, :t].tolist())
            got = set(seen_before(first_seen[row], torch.tensor(t)).nonzero().flatten().tolist())
            assert got == expected, (row, t)
    # ids past the logits' width are never penalised, as transformers' processor drops them
    assert first_seen_steps(torch.tensor([[VOCAB + 3, 1]]), 1, VOCAB)[0, :].lt(10).sum() == 1


def test_the_orders_differ_only_for_top_p_with_min_p():
    """Top-k and min-p commute (each keeps the most probable tokens down to a threshold); top-p after min-p
    renormalises over fewer tokens, so vLLM's order can keep fewer."""
    logits = torch.randn(256, VOCAB, generator=torch.Generator().manual_seed(0)) * 2

    def kept(**knobs):
        hf = torch.isneginf(processed_logits(logits, 1.0, SamplingKnobs(**knobs)))
        vllm = torch.isneginf(processed_logits(logits, 1.0, SamplingKnobs(**knobs, order=VLLM_ORDER)))
        return hf, vllm

    for knobs in (dict(top_k=7), dict(top_p=0.8), dict(min_p=0.1), dict(top_k=7, top_p=0.8), dict(top_k=5, min_p=0.2)):
        hf, vllm = kept(**knobs)
        assert torch.equal(hf, vllm), knobs
    hf, vllm = kept(top_p=0.8, min_p=0.1)
    assert not torch.equal(hf, vllm)
    assert (vllm & ~hf).sum() > 0 and (hf & ~vllm).sum() == 0  # vLLM's drops a superset


def test_unknown_order_and_a_penalty_without_history_are_refused():
    with pytest.raises(ValueError, match="order must be one of"):
        SamplingKnobs(order="sglang")
    with pytest.raises(ValueError, match="repetition_penalty needs"):
        processed_logits(torch.randn(2, VOCAB), 1.0, SamplingKnobs(repetition_penalty=1.2))

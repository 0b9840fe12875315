"""What both sides of `benchmarks/step.py` share: the tokenizer, the tiny models and the prompts, built from a seed.

Imports only torch, transformers and tokenizers, so that the TRL 1.12 runner (in its own virtual environment) and our
runner build bit-identical inputs.

Full-length responses on both sides: the models have a 99-token vocabulary (ids 0–98) while the tokenizer has 100
tokens; its EOS (also its pad) is id 99, which the model can never sample. Generation therefore never stops early and
no response is truncated, so both trainers process exactly `response_length` tokens per sequence. All prompts have the
same length, so no pad token is ever fed to a model.
"""

from __future__ import annotations

import math
import time

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
    TrainerCallback,
)

MODEL_VOCAB = 99  # ids the models can emit
EOS_ID = MODEL_VOCAB  # the tokenizer's EOS/pad: outside the models' vocabulary, so never sampled
PROMPT_LENGTH = 16
# One single-character token per id: letters of Latin Extended-A, so decode → encode is the identity.
ALPHABET = tuple(chr(0x100 + i) for i in range(MODEL_VOCAB))


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {ch: i for i, ch in enumerate(ALPHABET)} | {"<eos>": EOS_ID}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<eos>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken("<eos>", special=True, normalized=False)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<eos>", pad_token="<eos>", padding_side="left", model_max_length=4096
    )


def model_config(response_length: int, vocab_size: int = MODEL_VOCAB, hidden_size: int = 64, num_labels: int = 1):
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=PROMPT_LENGTH + response_length + 8,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,  # the stop token lies outside the vocabulary (see the module docstring)
        pad_token_id=None,  # an embedding padding_idx must lie inside the vocabulary
        num_labels=num_labels,
    )


def build_models(response_length: int, seed: int = 0, stop_token_in_vocab: bool = False):
    """Policy, reward model and value model (same size), each from its own seed offset, in float32 on CPU. With
    `stop_token_in_vocab` the vocabulary also holds the EOS id, so that completions cut by [`stop_at_drawn_lengths`]
    can be fed back to the models."""
    vocab = MODEL_VOCAB + 1 if stop_token_in_vocab else MODEL_VOCAB
    torch.manual_seed(seed)
    policy = Qwen2ForCausalLM(model_config(response_length, vocab))
    torch.manual_seed(seed + 1)
    reward_model = Qwen2ForSequenceClassification(model_config(response_length, vocab))
    torch.manual_seed(seed + 2)
    value_model = Qwen2ForSequenceClassification(model_config(response_length, vocab))
    for model in (reward_model, value_model):
        # Sequence classification pools at the last non-pad token; EOS never appears, so that is the last token.
        model.config.pad_token_id = EOS_ID
    policy.generation_config.pad_token_id = EOS_ID
    return policy, reward_model, value_model


def long_tailed_lengths(count: int, max_length: int, generator: torch.Generator) -> list[int]:
    """Response lengths like a long chain-of-thought batch's: about 7 % (at least one) exactly at the cap, the rest
    lognormal (σ = 0.8, median 0.14 × max, clipped to [min(32, max/16), max]); mean ≈ 0.25 × max. Shuffled."""
    at_cap = max(1, round(0.07 * count))
    normal = torch.randn(count - at_cap, generator=generator)
    drawn = (math.log(0.14 * max_length) + 0.8 * normal).exp().round()
    drawn = drawn.clamp(min(32, max(1, max_length // 16)), max_length).long().tolist()
    lengths = drawn + [max_length] * at_cap
    return [lengths[i] for i in torch.randperm(count, generator=generator).tolist()]


def stop_at_drawn_lengths(policy, seed: int = 0) -> None:
    """
    Make `policy.generate` stop each completion at a drawn length, the same on both sides of a comparison: EOS is
    suppressed while sampling, then each completion gets EOS at a length drawn by [`long_tailed_lengths`] (the
    same stream of lengths for the same seed and call order) and pad after it; one per call stays at the cap.
    """
    generator = torch.Generator().manual_seed(seed + 4)
    original = policy.generate

    def generate(*args, **kwargs):
        kwargs["suppress_tokens"] = [EOS_ID]
        out = original(*args, **kwargs)
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        prompt = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        width = sequences.shape[1] - prompt.shape[1]
        for row, length in enumerate(long_tailed_lengths(sequences.shape[0], width, generator)):
            sequences[row, prompt.shape[1] + length :] = EOS_ID  # EOS, then pads (the same id)
        return out

    policy.generate = generate


def prompt_ids(num_prompts: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed + 3)
    return torch.randint(0, MODEL_VOCAB, (num_prompts, PROMPT_LENGTH), generator=generator).tolist()


def prompt_texts(num_prompts: int, seed: int = 0) -> list[str]:
    return ["".join(ALPHABET[i] for i in ids) for ids in prompt_ids(num_prompts, seed)]


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (Linux reports `ru_maxrss` in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class UpdateClock(TrainerCallback):
    """Wall time between consecutive `on_step_end` calls: one per PPO update in both trainers."""

    def __init__(self):
        self.marks = [time.perf_counter()]

    def on_step_end(self, args, state, control, **kwargs):
        self.marks.append(time.perf_counter())


def timed(function, seconds: list[float]):
    """`function`, wrapped to append the wall time of each call to `seconds` (the generation time of each update)."""

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = function(*args, **kwargs)
        seconds.append(time.perf_counter() - start)
        return out

    return wrapper


def bench_result(side: str, response_length: int, clock: UpdateClock, generation_seconds: list[float], warmup: int):
    """The JSON a runner prints: per-update wall and generation times after the warm-up updates, and the peak RSS."""
    update_seconds = [b - a for a, b in zip(clock.marks, clock.marks[1:])]
    return {
        "side": side,
        "response_length": response_length,
        "update_s": update_seconds[warmup:],
        "generation_s": generation_seconds[warmup:],
        "peak_rss_mib": peak_rss_mib(),
    }

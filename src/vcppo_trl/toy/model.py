"""Tiny randomly initialised Llama causal language model for the toy task (built in-process, no Hub access)."""

from __future__ import annotations

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from .defaults import TOY_HIDDEN_SIZE, TOY_NUM_HEADS, TOY_NUM_LAYERS


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase,
    hidden_size: int = TOY_HIDDEN_SIZE,
    num_layers: int = TOY_NUM_LAYERS,
    num_heads: int = TOY_NUM_HEADS,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 512,
    tie_word_embeddings: bool = True,
    seed: int = 0,
) -> LlamaForCausalLM:
    """Builds a tiny, randomly initialised [`~transformers.LlamaForCausalLM`] matching `tokenizer`.

    The vocabulary size is `len(tokenizer)`, and the pad/eos (and bos, if the tokenizer has one) ids are set both in
    the model config and in its generation config, so that `generate` stops on the tokenizer's eos token. The same
    config with `num_labels=1` builds a token-classification critic via
    `AutoModelForTokenClassification.from_config`.

    The architecture is Llama rather than Qwen2 on purpose: when a Qwen2 config sits next to the tokenizer files
    (`save_pretrained` of model and tokenizer to the same folder), transformers 5 makes `AutoTokenizer.from_pretrained`
    load a `Qwen2Tokenizer`, which silently replaces the character-level pre-tokenizer (spaces get dropped). With a
    Llama config the saved `TokenizersBackend` tokenizer is loaded as is.

    Args:
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]):
            Tokenizer of the toy task (see [`build_tokenizer`]).
        hidden_size (`int`, *optional*, defaults to `TOY_HIDDEN_SIZE`):
            Width of the residual stream.
        num_layers (`int`, *optional*, defaults to `TOY_NUM_LAYERS`):
            Number of decoder layers.
        num_heads (`int`, *optional*, defaults to `TOY_NUM_HEADS`):
            Number of attention (and key/value) heads; must divide `hidden_size`.
        intermediate_size (`int` or `None`, *optional*):
            Width of the MLP; defaults to `4 * hidden_size`.
        max_position_embeddings (`int`, *optional*, defaults to `512`):
            Maximum sequence length (prompt + completion).
        tie_word_embeddings (`bool`, *optional*, defaults to `True`):
            Whether the output projection shares the input embedding matrix.
        seed (`int`, *optional*, defaults to `0`):
            Seed of the weight initialisation.

    Returns:
        [`~transformers.LlamaForCausalLM`]: The model, in float32, on CPU.
    """
    if hidden_size % num_heads != 0:
        raise ValueError(f"`hidden_size` ({hidden_size}) must be divisible by `num_heads` ({num_heads}).")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        rope_theta=10000.0,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        attention_bias=False,
        mlp_bias=False,
        use_cache=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    return model

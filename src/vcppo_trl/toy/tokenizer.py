"""Character-level tokenizer for the toy task, built locally with the `tokenizers` library (no Hub access)."""

from __future__ import annotations

import string

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from .task import THINK_END, THINK_START

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"

# Every printable ASCII character plus the newline: a superset of what the task produces.
CHARACTERS: tuple[str, ...] = tuple(sorted(set(string.printable) - set("\t\r\x0b\x0c")))


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Builds the character-level tokenizer of the toy task.

    Each printable ASCII character (and `"\\n"`) is one token. `<think>` and `</think>` are single, *non-special*
    tokens, so they survive `decode(..., skip_special_tokens=True)`. The special tokens are `<pad>` (id 0), `<eos>`
    (id 1) and `<unk>` (id 2); there is no beginning-of-sequence token and nothing is added around the encoded text,
    so `decode(encode(s)) == s` for any text made of the covered characters.

    Returns:
        [`~transformers.PreTrainedTokenizerFast`]: The tokenizer, with `padding_side="left"` (for generation). It can
        be saved with `save_pretrained` and reloaded with `AutoTokenizer.from_pretrained`.
    """
    special = [PAD_TOKEN, EOS_TOKEN, UNK_TOKEN]
    vocab = {token: i for i, token in enumerate([*special, *CHARACTERS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # One pre-token per character (newline included); WordLevel then maps each character to its id.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Concatenate the tokens back without inserting spaces.
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in (THINK_START, THINK_END)])

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )


def build_chat_tokenizer() -> PreTrainedTokenizerFast:
    """The toy's tokenizer made a chat tokenizer with tools: `<|im_start|>` and `<|im_end|>` added as special tokens,
    `<|im_end|>` its EOS (a turn's end), and TRL's bundled Qwen2.5 chat template, which renders tools and whose tool
    calls TRL knows how to parse (`trl.chat_template_utils.add_response_schema`). No download: the template ships
    with TRL."""
    import os

    import trl

    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.eos_token = "<|im_end|>"
    with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", "qwen2_5.jinja")) as f:
        tokenizer.chat_template = f.read()
    return tokenizer

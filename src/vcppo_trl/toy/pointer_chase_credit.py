"""Credit on the pointer chase (`pointer_chase.py`): where each hop of a response decides and whether it decided right,
and the oracle critic, the value function that knows the table, as values and as a critic module for the trainers.

The state before response token t is the prompt and the response's tokens 0..t−1; a hop decides at its value letter
(the token after the key). The oracle's value of a state is the expected ±1 reward under the cold start's error model:
each remaining hop right with probability 1 − ε, a wrong hop never leading back to the answer, the answer copied from
the last hop ([`oracle_values`]).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForTokenClassification,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.modeling_outputs import TokenClassifierOutput

from .pointer_chase import (
    BOX_OPEN,
    FILLER,
    POINTER_CHASE_HOPS,
    ChaseProblem,
    hop_error_rate,
    parse_prompt,
)
from .task import THINK_END, THINK_START

_HOP_LINE = re.compile(f"([a-z])([A-Z])\\{FILLER}*")


@dataclass(frozen=True)
class HopDecision:
    """One hop line of a response: `position` is the response token of its decision (the value letter; for a line
    that is not a hop, its first token), `right` whether it is a correct lookup (its key is the lower case of the
    value before it, or of the start, and its value is the table's value for that key)."""

    position: int
    key: str
    value: str
    right: bool


def token_texts(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """The text of every token id (special tokens as `""`): what responses are read with. The toy's tokenizers decode
    a sequence as the concatenation of these."""
    return [tokenizer.decode([i], skip_special_tokens=True) for i in range(len(tokenizer))]


def decode_with_owners(ids: Iterable[int | None], texts: Sequence[str]) -> tuple[str, list[int]]:
    """The text of `ids` (`None`: a token that reads as nothing) and, for each of its characters, the index (in `ids`)
    of the token that wrote it."""
    pieces, owner = [], []
    for index, token in enumerate(ids):
        piece = "" if token is None else texts[token]
        pieces.append(piece)
        owner += [index] * len(piece)
    return "".join(pieces), owner


def _think_lines(text: str) -> Iterable[tuple[int, str]]:
    """(offset, text) of each complete line inside the response's `<think>` block (none without the opening tag)."""
    if not text.startswith(THINK_START):
        return
    offset, end = len(THINK_START), text.find(THINK_END)
    end = len(text) if end < 0 else end
    while (newline := text.find("\n", offset, end)) >= 0:
        yield offset, text[offset:newline]
        offset = newline + 1


def read_hops(problem: ChaseProblem, response: str) -> list[tuple[int, str, str, bool]]:
    """Each complete hop line of a response text as `(offset of its decision character, key, value, right)` (see
    [`HopDecision`]); a line that is not `kV...` is a wrong hop at its first character, with empty key and value."""
    lookup, expected, hops = problem.lookup, problem.start.lower(), []
    for offset, line in _think_lines(response):
        match = _HOP_LINE.fullmatch(line)
        if match is None:
            hops.append((offset, "", "", False))
            expected = ""
            continue
        key, value = match.groups()
        hops.append((offset + 1, key, value, key == expected and lookup.get(key) == value))
        expected = value.lower()
    return hops


def _rows(responses: Sequence[Sequence[int]] | torch.Tensor) -> list[list[int]]:
    return responses.tolist() if isinstance(responses, torch.Tensor) else [list(ids) for ids in responses]


def hop_correctness(
    prompts: Sequence[str], responses: Sequence[Sequence[int]] | torch.Tensor, tokenizer: PreTrainedTokenizerBase
) -> list[list[HopDecision]]:
    """Where each hop of sampled responses decides, and whether it decided right: what an experiment correlates with
    the advantage at that token, hop by hop.

    Args:
        prompts (`Sequence[str]`): The prompts, as [`~toy.pointer_chase.format_prompt`] writes them.
        responses (`Sequence[Sequence[int]]` or `torch.Tensor` of shape `[B, T]`): The response token ids (padding and
            end-of-sequence tokens decode to nothing).
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): The policy's tokenizer.

    Returns:
        `list[list[HopDecision]]`: Per response, its complete hop lines in order (more or fewer than K when the
        response writes more or fewer), each with the response-token index of its decision and whether it was right. A
        hop is judged on its own line: one after a wrong hop is right when it looks its key up correctly.
    """
    texts = token_texts(tokenizer)
    decisions = []
    for prompt, ids in zip(prompts, _rows(responses)):
        text, owner = decode_with_owners(ids, texts)
        # The number of hops plays no part in reading them.
        hops = read_hops(parse_prompt(prompt, num_hops=1), text)
        decisions.append([HopDecision(position=owner[o], key=k, value=v, right=r) for o, k, v, r in hops])
    return decisions


def _first_mismatch(text: str, offset: int, expected: str) -> int | None:
    """The offset of the first character of `text[offset:]` that departs from `expected` (None: none does, or the
    text ends first)."""
    for i, char in enumerate(expected):
        if offset + i >= len(text):
            return None
        if text[offset + i] != char:
            return offset + i
    return None


def oracle_events(problem: ChaseProblem, response: str) -> list[tuple[int, str]]:
    """The characters of a response text at which the oracle's value changes, in order: `"right"` (a correct hop's
    decision, on the correct trace so far), `"off"` (the response leaves the correct trace's form: a wrong hop's value,
    a key that is not the previous value's, a malformed line, a missing or extra hop line, a wrong tag or box), and at
    the boxed answer's letter `"answer_right"` or `"answer_wrong"` (then `"off"` if the box does not close right
    after). Dots after a value are free: any number keeps the form. A truncated response just has no further
    event."""
    events, lookup, key, offset = [], problem.lookup, problem.start.lower(), len(THINK_START)
    off = _first_mismatch(response, 0, THINK_START)
    for _ in range(problem.num_hops if off is None else 0):
        off = _first_mismatch(response, offset, key)
        value = response[offset + 1 : offset + 2]
        if off is not None or not value:
            break
        if value != lookup[key]:
            off = offset + 1
            break
        events.append((offset + 1, "right"))
        offset += 2
        while response[offset : offset + 1] == FILLER:
            offset += 1
        if (off := _first_mismatch(response, offset, "\n")) is not None or offset >= len(response):
            break
        offset, key = offset + 1, value.lower()
    else:
        off = _first_mismatch(response, offset, THINK_END + BOX_OPEN) if off is None else off
    if off is not None:
        events.append((off, "off"))
    # The answer counts even after the response left the form: the reward reads the box alone.
    close = response.find(THINK_END)
    box = response.find(BOX_OPEN, close) if close >= 0 else -1
    letter = box + len(BOX_OPEN)
    if box >= 0 and letter < len(response):
        events.append((letter, "answer_right" if response[letter] == problem.answer else "answer_wrong"))
        if (after := _first_mismatch(response, letter + 1, "}")) is not None:
            events.append((after, "off"))
    return sorted(events)


def oracle_value_track(
    problem: ChaseProblem, response: str, *, owner: Sequence[int], num_tokens: int, error_rate: float
) -> list[float]:
    """V(s_t) for t = 0..`num_tokens`: the value before response token t, and last the value after the last token
    (`owner`: the token of each character of `response`, [`decode_with_owners`]). See [`oracle_values`]."""
    changes: dict[int, list[str]] = {}
    for offset, kind in oracle_events(problem, response):
        changes.setdefault(owner[offset], []).append(kind)
    values, done = [], 0
    value = 2 * (1 - error_rate) ** problem.num_hops - 1
    for t in range(num_tokens + 1):
        values.append(value)
        for kind in changes.get(t, ()):
            if kind == "right":  # only ever before the first "off"
                done += 1
                value = 2 * (1 - error_rate) ** (problem.num_hops - done) - 1
            else:
                value = 1.0 if kind == "answer_right" else -1.0
    return values


def oracle_values(
    prompts: Sequence[str],
    responses: Sequence[Sequence[int]] | torch.Tensor,
    tokenizer: PreTrainedTokenizerBase,
    num_hops: int = POINTER_CHASE_HOPS,
    error_rate: float | None = None,
) -> torch.Tensor:
    """The oracle critic's values: the expected reward of each state under the cold start's error model, on the
    reward's ±1 scale.

    `values[:, t]` is V(s_t), s_t the prompt and response tokens 0..t−1: the value before response token t is chosen,
    what the trainer's critic gives for token t. A hop decides at its value letter, so its outcome shows from the token
    after it. With ε the per-hop error rate and K the hops:
    - on the correct trace with j of the K hops written (all right): V = 2(1 − ε)^(K − j) − 1, the probability that
      the remaining K − j hops are right, on the ±1 scale (after the K-th hop: +1);
    - after the first wrong hop (or any departure from the correct trace's form, [`oracle_events`]): −1, since a wrong
      hop never leads back to the answer;
    - after the boxed answer's letter: +1 if it is the answer, else −1 (the reward is then known), whatever came
      before. So the value after a complete response is its reward; on a response that boxes the answer after a wrong
      hop (off the error model: its box contradicts its own trace) V is −1 until the letter.

    Args:
        prompts (`Sequence[str]`): The prompts ([`~toy.pointer_chase.format_prompt`]).
        responses (`Sequence[Sequence[int]]` or `torch.Tensor` of shape `[B, T]`): Response token ids; padding and
            end-of-sequence tokens decode to nothing and keep the value before them, as do the columns past a shorter
            row's end.
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): The policy's tokenizer.
        num_hops (`int`): K.
        error_rate (`float` or `None`): ε; `None` takes the cold start's, [`~toy.pointer_chase.hop_error_rate`]`(K)`.

    Returns:
        `torch.Tensor` of shape `[B, T]` (float32), `T` the longest response.
    """
    error_rate = hop_error_rate(num_hops) if error_rate is None else error_rate
    texts, rows = token_texts(tokenizer), _rows(responses)
    values = torch.zeros(len(rows), max((len(ids) for ids in rows), default=0))
    for row, (prompt, ids) in enumerate(zip(prompts, rows)):
        text, owner = decode_with_owners(ids, texts)
        problem = parse_prompt(prompt, num_hops)
        track = oracle_value_track(problem, text, owner=owner, num_tokens=len(ids), error_rate=error_rate)
        values[row, : len(ids)] = torch.tensor(track[:-1])
        values[row, len(ids) :] = track[-1]  # a shorter row: the value after its last token
    return values


# ----------------------------------------------------------------------------------------------------------------------
# The oracle as a critic module
# ----------------------------------------------------------------------------------------------------------------------


class PointerChaseOracleConfig(PretrainedConfig):
    """Config of [`PointerChaseOracleForTokenClassification`]: the text of every token id, K and ε."""

    model_type = "pointer_chase_oracle"

    def __init__(
        self,
        token_texts: Sequence[str] = (),
        num_hops: int = POINTER_CHASE_HOPS,
        error_rate: float | None = None,
        **kwargs,
    ):
        kwargs["num_labels"] = 1
        super().__init__(**kwargs)
        self.token_texts = list(token_texts)
        self.vocab_size = len(self.token_texts)
        self.num_hops = num_hops
        self.error_rate = hop_error_rate(num_hops) if error_rate is None else float(error_rate)


class PointerChaseOracleForTokenClassification(PreTrainedModel):
    """The oracle critic ([`oracle_values`]) as a token-classification model with one label, to pass as
    `value_model=` to the trainers in place of a learned critic.

    `forward(input_ids, attention_mask=None, position_ids=None)` decodes each sequence, reads the table from its prompt
    (the text up to the first newline), and returns `.logits` `[B, L, 1]` (float32) with, at position p, the value of
    the state after token p (the trainer reads the value of response token t at the position before it). Prompt
    positions before the last are 0. Padded rows (`attention_mask`) and padding-free rows (several sequences with
    `position_ids` restarting at 0) are both read; a sequence-parallel forward, which sees only some columns of each
    row, cannot be.

    It learns nothing: its one parameter, a `[vocab, 1]` embedding of zeros (which also answers
    `get_input_embeddings()` for the trainer's vocabulary check), is multiplied by 0 and added to the values, so the
    value loss has a graph to go back through, the gradient is exactly 0 and an AdamW step (weight decay included)
    leaves it at 0. It supports no activation checkpointing (leave `activation_checkpointing` off) and is saved as a
    transformers checkpoint that `AutoModelForTokenClassification` loads once this module is imported.
    """

    config_class = PointerChaseOracleConfig
    base_model_prefix = "oracle"

    def __init__(self, config: PointerChaseOracleConfig):
        super().__init__(config)
        self.anchor = nn.Embedding(config.vocab_size, 1)
        self.post_init()

    @classmethod
    def from_tokenizer(
        cls, tokenizer: PreTrainedTokenizerBase, num_hops: int = POINTER_CHASE_HOPS, error_rate: float | None = None
    ) -> PointerChaseOracleForTokenClassification:
        """The oracle for the policy's `tokenizer`, K = `num_hops` and ε = `error_rate` (default: the cold start's)."""
        config = PointerChaseOracleConfig(token_texts=token_texts(tokenizer), num_hops=num_hops, error_rate=error_rate)
        return cls(config)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Embedding):
            nn.init.zeros_(module.weight)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.anchor

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs,
    ) -> TokenClassifierOutput:
        values = oracle_sequence_values(
            input_ids, attention_mask=attention_mask, position_ids=position_ids, config=self.config
        )
        logits = values.to(input_ids.device).unsqueeze(-1) + 0 * self.anchor(input_ids).float()
        return TokenClassifierOutput(logits=logits)


def oracle_sequence_values(
    input_ids: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    config: PointerChaseOracleConfig,
) -> torch.Tensor:
    """`[B, L]` float32: at each position of each `[prompt | response]` sequence, the oracle's value of the state after
    that token (0 before the prompt's last token). A row holds one sequence from its first attended token, or several
    where `position_ids` restart at 0 (padding-free rows); unattended tokens read as nothing."""
    values = torch.zeros(input_ids.shape, dtype=torch.float32)
    ids = input_ids.tolist()
    valid = attention_mask.bool().tolist() if attention_mask is not None else [[True] * len(row) for row in ids]
    positions = position_ids.tolist() if position_ids is not None else None
    for row in range(len(ids)):
        starts = [p for p in range(len(ids[row])) if valid[row][p] and (positions is None or positions[row][p] == 0)]
        starts = starts[:1] if positions is None else starts
        for start, end in zip(starts, starts[1:] + [len(ids[row])]):
            tokens = [ids[row][p] if valid[row][p] else None for p in range(start, end)]
            text, owner = decode_with_owners(tokens, config.token_texts)
            newline = text.find("\n")
            if newline < 0:
                continue  # a prompt with no response yet: nothing is read from it
            prompt_end = owner[newline]
            problem = parse_prompt(text[: newline + 1], config.num_hops)
            response_owner = [o - prompt_end - 1 for o in owner[newline + 1 :]]
            num_tokens = end - start - prompt_end - 1
            track = oracle_value_track(
                problem, text[newline + 1 :], owner=response_owner, num_tokens=num_tokens, error_rate=config.error_rate
            )
            values[row, start + prompt_end : end] = torch.tensor(track)
    return values


AutoConfig.register(PointerChaseOracleConfig.model_type, PointerChaseOracleConfig, exist_ok=True)
AutoModelForTokenClassification.register(
    PointerChaseOracleConfig, PointerChaseOracleForTokenClassification, exist_ok=True
)

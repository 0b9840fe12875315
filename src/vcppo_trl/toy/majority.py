"""The stop-anytime toy task: the majority bit of a noisy bit string, one running tally per line.

The first toy (`vcppo_trl.toy.task`, additions) fixes the response length by the digits, so a policy cannot stop
early without simply being wrong. Here it can stop after any line and still be right fairly often: each line reads one
more bit and keeps a running count of ones and zeros, and a response may close its reasoning after any line and answer
with the bit that leads so far. The leader after k lines names the whole string's majority more often as k grows, so
thinking longer helps gradually, and stopping early is only moderately worse (never hopeless): the shape that lets a
critic biased low on early prefixes push PPO toward shorter responses (see the stop-bias note behind
`vcppo_trl.diagnostics.stop_advantage_gap`).

```text
prompt:      "Majority of: a1 b0 c1 d1 e0\\n"
completion:  "<think>a1 1:0\\nb0 1:1\\nc1 2:1\\nd1 3:1\\ne0 3:2\\n</think> \\\\boxed{1}"         (complete)
completion:  "<think>a1 1:0\\nb0 1:1\\nc1 2:1\\n</think> \\\\boxed{1}"                        (stopped after 3 lines)
```

Every bit carries a one-character key (`a`…`z`, `A`…`Z`), so the line that reads bit `i` finds it in the prompt by its
key (the successor of the previous line's key): a lookup a tiny transformer learns, unlike counting positions. A line
is `<key><bit> <ones>:<zeros>`. The answer after k lines is the bit with more ones or zeros so far, and on a tie the
bit just read ([`leader_after`]). Strings have an odd length, so the whole string always has a majority, and every
answer, whatever line it follows, is scored against that majority ([`majority_reward`], or `math_verify_reward` on
the `solution` column).

With the character-level toy tokenizer, 15 to 31 bits give prompts of 59 to 107 tokens and complete responses of about
120 to 270 tokens (within the toy model's 512 positions).

Two variants change the task's shape without changing what is scored (the whole string's majority):

- `tally="diff"`: a line keeps the running difference ones − zeros (`"c1 +1"`) instead of both counts, a smaller number
  to carry from line to line.
- `encoding="changes"`: the prompt shows each bit XOR the previous one (`"Majority of changes: a1 b1 c1"` for the bits
  1 0 1), and a line writes the bit it decodes (`"c1 1 +1"`: shown bit, decoded bit, tally). The majority of the decoded
  string is then a running parity away from the prompt's symbols (each shown bit is a change with probability
  2·0.6·0.4 = 0.48, whichever direction the string has), so a model cannot estimate it by looking at the prompt: only
  the tally determines it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence

from datasets import Dataset, DatasetDict

from .task import THINK_END, THINK_START, count_think_lines, is_correct, verifier_scores  # noqa: F401 (is_correct re-exported)

KEYS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
"""Keys of the bits, in order: a string has at most `len(KEYS)` = 52 bits."""

MAJORITY_MIN_BITS = 15
MAJORITY_MAX_BITS = 31
MAJORITY_BIAS = 0.6
"""Probability that a bit equals the string's drawn direction (a 60/40 string)."""
MAJORITY_EARLY_STOP_FRACTION = 0.5
"""Share of cold-start solutions that stop at a random line before the end."""
MAJORITY_NUM_TRAIN = 4000
MAJORITY_NUM_EVAL = 300
MAJORITY_MAX_NEW_TOKENS = 320
TALLIES = ("counts", "diff")
"""Tally kept on each line: both counts (`"3:2"`) or the difference ones − zeros (`"+1"`)."""
ENCODINGS = ("plain", "changes")
"""How the prompt shows the string: the bits themselves, or each bit XOR the previous one (a running parity away)."""

_PROMPT_RE = re.compile(r"Majority of( changes)?: ((?:[A-Za-z][01] ?)+)")
_LINE_RE = re.compile(r"^[A-Za-z][01]( [01])? (\d+:\d+|[+-]\d+)$")


def _check_bits(bits: Sequence[int]) -> None:
    if not 1 <= len(bits) <= len(KEYS):
        raise ValueError(f"A string has 1 to {len(KEYS)} bits, got {len(bits)}.")
    if any(b not in (0, 1) for b in bits):
        raise ValueError(f"Bits must be 0 or 1, got {list(bits)}.")


def majority_answer(bits: Sequence[int]) -> int:
    """The bit that appears more often in `bits` (an odd number of bits: no tie).

    Args:
        bits (`Sequence[int]`): The string, as 0/1 integers, of odd length.

    Returns:
        `int`: 0 or 1.
    """
    _check_bits(bits)
    if len(bits) % 2 == 0:
        raise ValueError(f"The whole string must have an odd length (a majority), got {len(bits)} bits.")
    return int(2 * sum(bits) > len(bits))


def leader_after(bits: Sequence[int], k: int) -> int:
    """The answer a solution gives when it stops after `k` lines: the leading bit among the first `k`.

    Args:
        bits (`Sequence[int]`): The string, as 0/1 integers.
        k (`int`): Lines read, in `[1, len(bits)]`.

    Returns:
        `int`: 1 when the first `k` bits hold more ones than zeros, 0 when fewer, and on a tie the `k`-th bit (the one
        just read). With `k == len(bits)` (odd) it is [`majority_answer`].
    """
    _check_bits(bits)
    if not 1 <= k <= len(bits):
        raise ValueError(f"k must be in [1, {len(bits)}], got {k}.")
    ones = sum(bits[:k])
    zeros = k - ones
    if ones == zeros:
        return int(bits[k - 1])
    return int(ones > zeros)


def _check_variant(tally: str, encoding: str) -> None:
    if tally not in TALLIES:
        raise ValueError(f"`tally` must be one of {TALLIES}, got {tally!r}.")
    if encoding not in ENCODINGS:
        raise ValueError(f"`encoding` must be one of {ENCODINGS}, got {encoding!r}.")


def shown_bits(bits: Sequence[int], encoding: str = "plain") -> list[int]:
    """The symbols the prompt shows: the bits (`"plain"`), or each bit XOR the previous one, the first as is
    (`"changes"`)."""
    _check_variant("counts", encoding)
    if encoding == "plain":
        return list(bits)
    return [int(b) ^ (int(bits[i - 1]) if i else 0) for i, b in enumerate(bits)]


def format_prompt(bits: Sequence[int], encoding: str = "plain") -> str:
    """The prompt, e.g. `"Majority of: a1 b0 c1\\n"` (`"Majority of changes: a1 b1 c1\\n"` for the same bits with
    `encoding="changes"`)."""
    _check_bits(bits)
    head = "Majority of changes: " if encoding == "changes" else "Majority of: "
    return head + " ".join(f"{KEYS[i]}{b}" for i, b in enumerate(shown_bits(bits, encoding))) + "\n"


def parse_prompt(prompt: str) -> list[int]:
    """The bits of a prompt written by [`format_prompt`] (decoded when it shows changes)."""
    match = _PROMPT_RE.search(prompt)
    if match is None:
        raise ValueError(f"Not a majority prompt: {prompt!r}")
    shown = [int(token[1]) for token in match.group(2).split()]
    if not match.group(1):
        return shown
    bits: list[int] = []
    for i, c in enumerate(shown):
        bits.append(c ^ (bits[i - 1] if i else 0))
    return bits


def format_solution(
    bits: Sequence[int], stop_line: int | None = None, tally: str = "counts", encoding: str = "plain"
) -> str:
    """A worked solution that reads `stop_line` bits (all of them by default), one tally line each, then answers.

    Args:
        bits (`Sequence[int]`): The string (decoded bits, whatever the prompt shows).
        stop_line (`int`, *optional*): Lines before the reasoning closes, in `[1, len(bits)]`; `None`: all.
        tally (`str`, defaults to `"counts"`): `"counts"` (`"a1 1:0"`) or `"diff"` (`"a1 +1"`, ones − zeros).
        encoding (`str`, defaults to `"plain"`): The prompt's encoding; with `"changes"` each line also writes the bit
            it decodes after the shown one (`"b1 0 +0"`).

    Returns:
        `str`: `"<think>…</think> \\boxed{a}"` with `a` = [`leader_after`]`(bits, stop_line)`, without an
        end-of-sequence token.
    """
    _check_bits(bits)
    k = len(bits) if stop_line is None else stop_line
    if not 1 <= k <= len(bits):
        raise ValueError(f"stop_line must be in [1, {len(bits)}], got {stop_line}.")
    _check_variant(tally, encoding)
    shown = shown_bits(bits, encoding)
    lines, ones = [], 0
    for i in range(k):
        ones += bits[i]
        zeros = i + 1 - ones
        count = f"{ones}:{zeros}" if tally == "counts" else f"{ones - zeros:+d}"
        decoded = f" {bits[i]}" if encoding == "changes" else ""
        lines.append(f"{KEYS[i]}{shown[i]}{decoded} {count}\n")
    return f"{THINK_START}{''.join(lines)}{THINK_END} \\boxed{{{leader_after(bits, k)}}}"


def reasoning_lines(text: str) -> int:
    """Number of tally lines inside the (possibly unclosed) `<think>` block of a response; 0 without one."""
    return count_think_lines(text, _LINE_RE)


def majority_reward(completions: list, solution: list[str], **kwargs) -> list[float]:
    """The task's verifier in the TRL reward-function protocol: +1 when the answer after `</think>` is the whole
    string's majority, whatever line the reasoning stopped at, −1 otherwise (wrong, missing, or reasoning never closed).

    Agrees with `vcppo_trl.rewards.math_verify_reward` on this task, without its cost.
    """
    return verifier_scores(completions, solution)


def reasoning_lines_reward(completions: list, **kwargs) -> list[float]:
    """Tally lines of each response ([`reasoning_lines`]): a length metric to log with weight 0, never trained on."""
    from ..rewards.math_verify import completion_to_text

    return [float(reasoning_lines(completion_to_text(c))) for c in completions]


def sample_bits(rng: random.Random, num_bits: int, bias: float = MAJORITY_BIAS) -> list[int]:
    """A noisy string: a direction drawn 50/50, then each bit equal to it with probability `bias`."""
    direction = rng.randint(0, 1)
    return [direction if rng.random() < bias else 1 - direction for _ in range(num_bits)]


def make_majority_dataset(
    num_examples: int,
    seed: int = 0,
    min_bits: int = MAJORITY_MIN_BITS,
    max_bits: int = MAJORITY_MAX_BITS,
    bias: float = MAJORITY_BIAS,
    early_stop_fraction: float = MAJORITY_EARLY_STOP_FRACTION,
    exclude_prompts: Iterable[str] | None = None,
    unique: bool = False,
    tally: str = "counts",
    encoding: str = "plain",
) -> Dataset:
    """Generates majority problems with worked solutions, a share of them stopped early (the cold-start data).

    The length is drawn uniformly among the odd numbers in `[min_bits, max_bits]` for each example (mixed
    difficulties). A solution stops early with probability `early_stop_fraction`, after a number of lines drawn
    uniformly in `[1, num_bits − 1]`, and then answers with the leader so far (which may be wrong): a policy trained on
    it stops at a spread of positions, and its accuracy rises with its length.

    Args:
        num_examples (`int`): Number of examples.
        seed (`int`, defaults to `0`): Seed; the same arguments always give the same dataset.
        min_bits, max_bits (`int`): Range of string lengths (only odd lengths are drawn), within `[1, 52]`.
        bias (`float`, defaults to `0.6`): Probability of each bit to follow the string's direction, in `[0.5, 1]`.
        early_stop_fraction (`float`, defaults to `0.5`): Share of solutions stopped before the last line.
        exclude_prompts (`Iterable[str]`, *optional*): Prompts that must not appear (e.g. a held-out split's).
        unique (`bool`, defaults to `False`): Whether every prompt must be distinct.
        tally, encoding (`str`): The task variant (see [`format_solution`]); the strings drawn do not depend on it.

    Returns:
        [`~datasets.Dataset`]: Columns `prompt`, `completion` (without end-of-sequence token), `solution`
        (`"\\boxed{b}"`, the whole string's majority), `difficulty` (number of bits), `stop_line` (lines of the
        completion), `completion_correct` (whether the completion's answer is the majority) and `margin` (|ones −
        zeros| of the whole string).
    """
    _check_variant(tally, encoding)
    if not 0.0 <= early_stop_fraction <= 1.0:
        raise ValueError(f"`early_stop_fraction` must be in [0, 1], got {early_stop_fraction}.")
    if not 0.5 <= bias <= 1.0:
        raise ValueError(f"`bias` must be in [0.5, 1], got {bias}.")
    lengths = [n for n in range(min_bits, max_bits + 1) if n % 2 == 1]
    if min_bits < 1 or max_bits > len(KEYS) or not lengths:
        raise ValueError(f"Need odd lengths within [1, {len(KEYS)}], got [{min_bits}, {max_bits}].")
    rng = random.Random(seed)
    excluded = set(exclude_prompts or ())
    seen: set[str] = set()
    rows: list[dict] = []
    attempts, max_attempts = 0, 100 * num_examples + 1000
    while len(rows) < num_examples:
        attempts += 1
        if attempts > max_attempts:
            raise ValueError(f"Could only generate {len(rows)} of {num_examples} distinct examples.")
        num_bits = rng.choice(lengths)
        bits = sample_bits(rng, num_bits, bias)
        prompt = format_prompt(bits, encoding)
        # Both drawn for every example, so that the prompts do not depend on `early_stop_fraction`.
        early = rng.random() < early_stop_fraction
        early_line = rng.randint(1, max(num_bits - 1, 1))
        stop_line = early_line if early and num_bits > 1 else num_bits
        if prompt in excluded or (unique and prompt in seen):
            continue
        seen.add(prompt)
        answer = majority_answer(bits)
        rows.append(
            {
                "prompt": prompt,
                "completion": format_solution(bits, stop_line, tally, encoding=encoding),
                "solution": f"\\boxed{{{answer}}}",
                "difficulty": num_bits,
                "stop_line": stop_line,
                "completion_correct": leader_after(bits, stop_line) == answer,
                "margin": abs(2 * sum(bits) - num_bits),
            }
        )
    return Dataset.from_list(rows)


def make_majority_splits(
    num_train: int = MAJORITY_NUM_TRAIN,
    num_eval: int = MAJORITY_NUM_EVAL,
    seed: int = 0,
    min_bits: int = MAJORITY_MIN_BITS,
    max_bits: int = MAJORITY_MAX_BITS,
    bias: float = MAJORITY_BIAS,
    early_stop_fraction: float = MAJORITY_EARLY_STOP_FRACTION,
    tally: str = "counts",
    encoding: str = "plain",
) -> DatasetDict:
    """Non-overlapping train and test splits. The test split has distinct prompts and complete reference solutions;
    the train split mixes complete and early-stopped ones (`early_stop_fraction`) and never holds a test prompt.

    Returns:
        [`~datasets.DatasetDict`]: `"train"` and `"test"`, with the columns of [`make_majority_dataset`].
    """
    common = {"min_bits": min_bits, "max_bits": max_bits, "bias": bias, "tally": tally, "encoding": encoding}
    test = make_majority_dataset(num_eval, seed=seed + 1_000_003, unique=True, early_stop_fraction=0.0, **common)
    train = make_majority_dataset(
        num_train, seed=seed, exclude_prompts=test["prompt"], early_stop_fraction=early_stop_fraction, **common
    )
    return DatasetDict(train=train, test=test)


def accuracy_by_stop_line(prompts: Iterable[str], max_lines: int | None = None) -> list[float]:
    """Share of problems that a solution stopping after k lines gets right, for k = 1, 2, …: the task's true gain from
    thinking longer (problems shorter than k count as read to the end).

    Args:
        prompts (`Iterable[str]`): Prompts written by [`format_prompt`].
        max_lines (`int`, *optional*): Largest k; defaults to the longest string.

    Returns:
        `list[float]`: Entry `k − 1` is the accuracy of stopping after `k` lines.
    """
    strings = [parse_prompt(p) for p in prompts]
    if not strings:
        return []
    max_lines = max_lines or max(len(b) for b in strings)
    return [
        sum(leader_after(b, min(k, len(b))) == majority_answer(b) for b in strings) / len(strings)
        for k in range(1, max_lines + 1)
    ]

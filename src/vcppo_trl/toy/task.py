"""Synthetic long chain-of-thought arithmetic task, generated entirely in code.

Each example asks for the sum of two integers with the same number of digits. The worked solution inside
`<think>...</think>` processes one column per line, from the least significant digit up. Each line restates the
digits not yet consumed, the column sum `x+y+carry=s`, and the answer digits written so far; the final answer follows
the closing tag as ` \\boxed{N}`:

```text
prompt:      "Add 4738 and 2919.\n"
completion:  "<think>4738+2919: 8+9+0=17, 7\n"
             "473+291: 3+1+1=5, 57\n"
             "47+29: 7+9+0=16, 657\n"
             "4+2: 4+2+1=7, 7657\n"
             "</think> \\boxed{7657}"
```

A *short* (compressed) solution writes only the column sums, without restating the digits, and the answer:

```text
completion:  "<think>8+9+0=17\n3+1+1=5\n7+9+0=16\n4+2+1=7\n</think> \\boxed{7657}"
```

It is about half as long, and harder for a tiny model: the digits of each column must be found in the prompt by
position, and the answer assembled from the lines' last digits in reverse. A cold start on a mix of both forms
(`short_fraction`) gives a policy with a length degree of freedom, as in real long-CoT models: it can drift toward the
short form (and lose accuracy on long numbers) or toward the worked one.

Restating the remaining digits on every line keeps the digits of the current column right next to the step that uses
them, so a tiny model learns the procedure in a couple of minutes on a CPU. The difficulty of an example is the
number of digits of its operands: with the character-level toy tokenizer, difficulties 1..6 give completions of about
30 to 165 tokens. A briefly fine-tuned tiny model makes a small error rate per step, so its success probability
decreases with the difficulty of the prompt (and the critic has something to learn).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable

from datasets import Dataset, DatasetDict

from .defaults import TOY_MAX_DIGITS, TOY_MIN_DIGITS, TOY_NUM_EVAL, TOY_NUM_TRAIN

THINK_START = "<think>"
THINK_END = "</think>"

_BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")


def _check_operands(a: int, b: int) -> None:
    if a < 0 or b < 0:
        raise ValueError(f"Operands must be non-negative, got {a} and {b}.")


def format_prompt(a: int, b: int) -> str:
    """Formats the plain-text prompt asking for `a + b`.

    Args:
        a (`int`):
            First operand (non-negative).
        b (`int`):
            Second operand (non-negative).

    Returns:
        `str`: The prompt, e.g. `"Add 4738 and 2919.\\n"`.
    """
    _check_operands(a, b)
    return f"Add {a} and {b}.\n"


def format_solution(a: int, b: int) -> str:
    """Writes the worked, column-by-column solution of `a + b`, ending with the boxed answer.

    Args:
        a (`int`):
            First operand (non-negative).
        b (`int`):
            Second operand (non-negative).

    Returns:
        `str`: The completion `"<think>...</think> \\boxed{a+b}"`, one line per column, without any end-of-sequence
        token.
    """
    _check_operands(a, b)
    num_columns = max(len(str(a)), len(str(b)))
    str_a, str_b = str(a).zfill(num_columns), str(b).zfill(num_columns)
    lines = []
    carry = 0
    written = ""
    for i in range(num_columns):
        rem_a, rem_b = str_a[: num_columns - i], str_b[: num_columns - i]
        x, y = int(rem_a[-1]), int(rem_b[-1])
        total = x + y + carry
        # The last column writes its full sum (final carry included); the others write the units digit.
        written = (str(total) if i == num_columns - 1 else str(total % 10)) + written
        lines.append(f"{rem_a}+{rem_b}: {x}+{y}+{carry}={total}, {written}\n")
        carry = total // 10
    return f"{THINK_START}{''.join(lines)}{THINK_END} \\boxed{{{a + b}}}"


def format_short_solution(a: int, b: int) -> str:
    """Writes the compressed solution of `a + b`: one `x+y+carry=s` line per column, then the boxed answer.

    Args:
        a (`int`):
            First operand (non-negative).
        b (`int`):
            Second operand (non-negative).

    Returns:
        `str`: The completion `"<think>...</think> \\boxed{a+b}"`, without any end-of-sequence token.
    """
    _check_operands(a, b)
    num_columns = max(len(str(a)), len(str(b)))
    str_a, str_b = str(a).zfill(num_columns), str(b).zfill(num_columns)
    lines = []
    carry = 0
    for i in range(1, num_columns + 1):
        x, y = int(str_a[-i]), int(str_b[-i])
        total = x + y + carry
        lines.append(f"{x}+{y}+{carry}={total}\n")
        carry = total // 10
    return f"{THINK_START}{''.join(lines)}{THINK_END} \\boxed{{{a + b}}}"


def response_mode(text: str) -> str | None:
    """Which form a response takes: `"long"` (worked lines that restate the digits), `"short"` (column sums only), or
    `None` (no closed `<think>` block).

    Args:
        text (`str`):
            A model response (completion only).

    Returns:
        `str` or `None`: `"long"` when the reasoning has a `":"` (a restated line), `"short"` otherwise.
    """
    start, end = text.find(THINK_START), text.find(THINK_END)
    if start < 0 or end < start:
        return None
    return "long" if ":" in text[start:end] else "short"


def extract_boxed_answer(text: str) -> str | None:
    """Extracts the content of the last `\\boxed{...}` that follows the closing `</think>` tag.

    Args:
        text (`str`):
            A model response (completion only, or prompt + completion).

    Returns:
        `str` or `None`: The stripped content of the last `\\boxed{...}` after `</think>`, or `None` if the response
        never closes its reasoning or gives no boxed answer after it.
    """
    end = text.rfind(THINK_END)
    if end < 0:
        return None
    matches = _BOXED_RE.findall(text[end + len(THINK_END) :])
    if not matches:
        return None
    return matches[-1].strip()


def is_correct(response: str, solution: str) -> bool:
    """Checks a response against the gold answer by exact match of the boxed integer after `</think>`.

    Args:
        response (`str`):
            Decoded model response (special tokens skipped).
        solution (`str`):
            Gold answer, either `"\\boxed{N}"` or `"N"`.

    Returns:
        `bool`: Whether the content of the last `\\boxed{...}` after `</think>` equals the gold answer.
    """
    gold = extract_boxed_answer(THINK_END + solution) if "\\boxed" in solution else solution.strip()
    answer = extract_boxed_answer(response)
    return answer is not None and gold is not None and answer == gold


def count_think_lines(text: str, line_re: re.Pattern) -> int:
    """Number of lines matching `line_re` inside the (possibly unclosed) `<think>` block of a response; 0 without
    one. The toy tasks' length metric: each task passes the pattern of its reasoning lines."""
    start = text.find(THINK_START)
    if start < 0:
        return 0
    end = text.find(THINK_END, start)
    body = text[start + len(THINK_START) : end if end >= 0 else len(text)]
    return sum(1 for line in body.split("\n") if line_re.match(line))


def verifier_scores(completions: list, solution: list[str]) -> list[float]:
    """+1 where a completion's boxed answer after `</think>` is its `solution`, −1 otherwise (wrong, missing, or
    reasoning never closed): the body of the toy tasks' TRL reward functions, whose names TRL logs."""
    from ..rewards.math_verify import completion_to_text

    return [1.0 if is_correct(completion_to_text(c), s) else -1.0 for c, s in zip(completions, solution)]


def _sample_operand(rng: random.Random, num_digits: int) -> int:
    low = 0 if num_digits == 1 else 10 ** (num_digits - 1)
    return rng.randint(low, 10**num_digits - 1)


def _example(a: int, b: int, difficulty: int, short: bool) -> dict[str, str | int]:
    return {
        "prompt": format_prompt(a, b),
        "completion": format_short_solution(a, b) if short else format_solution(a, b),
        "solution": f"\\boxed{{{a + b}}}",
        "difficulty": difficulty,
        "mode": "short" if short else "long",
    }


def make_arithmetic_dataset(
    num_examples: int,
    seed: int = 0,
    min_digits: int = TOY_MIN_DIGITS,
    max_digits: int = TOY_MAX_DIGITS,
    exclude_prompts: Iterable[str] | None = None,
    unique: bool = False,
    short_fraction: float = 0.0,
) -> Dataset:
    """Generates a prompt-completion dataset of multi-digit additions with worked long chain-of-thought solutions.

    The difficulty (number of digits of both operands) is drawn uniformly in `[min_digits, max_digits]` for each
    example, so difficulties are mixed across prompts.

    Args:
        num_examples (`int`):
            Number of examples to generate.
        seed (`int`, *optional*, defaults to `0`):
            Seed of the generator; the same arguments always give the same dataset.
        min_digits (`int`, *optional*, defaults to `TOY_MIN_DIGITS`):
            Smallest number of digits per operand.
        max_digits (`int`, *optional*, defaults to `TOY_MAX_DIGITS`):
            Largest number of digits per operand.
        exclude_prompts (`Iterable[str]` or `None`, *optional*):
            Prompts that must not appear in the dataset (e.g. the prompts of a held-out split).
        unique (`bool`, *optional*, defaults to `False`):
            Whether every prompt of the dataset must be distinct. Leave it `False` when `min_digits` is 1 and many
            examples are requested, since there are only 100 one-digit problems.
        short_fraction (`float`, *optional*, defaults to `0.0`):
            Share of examples whose completion is the compressed solution ([`format_short_solution`]) instead of the
            worked one, drawn independently of the difficulty.

    Returns:
        [`~datasets.Dataset`]: A dataset with columns `prompt` (plain text), `completion` (worked or compressed
        solution ending with ` \\boxed{N}`, without end-of-sequence token), `solution` (gold answer `"\\boxed{N}"`),
        `difficulty` (`int`, number of digits) and `mode` (`"long"` or `"short"`, the completion's form).
    """
    if not 0.0 <= short_fraction <= 1.0:
        raise ValueError(f"`short_fraction` must be in [0, 1], got {short_fraction}.")
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"Expected 1 <= min_digits <= max_digits, got {min_digits} and {max_digits}.")
    rng = random.Random(seed)
    excluded = set(exclude_prompts or ())
    seen: set[str] = set()
    rows: list[dict[str, str | int]] = []
    attempts = 0
    max_attempts = 100 * num_examples + 1000
    while len(rows) < num_examples:
        attempts += 1
        if attempts > max_attempts:
            raise ValueError(
                f"Could only generate {len(rows)} of {num_examples} examples with digits in [{min_digits}, "
                f"{max_digits}] under the exclusion/uniqueness constraints."
            )
        difficulty = rng.randint(min_digits, max_digits)
        a = _sample_operand(rng, difficulty)
        b = _sample_operand(rng, difficulty)
        prompt = format_prompt(a, b)
        if prompt in excluded or (unique and prompt in seen):
            continue
        seen.add(prompt)
        # Drawn only when needed, so that short_fraction=0 leaves the generator's sequence (and old datasets) as is.
        short = short_fraction > 0 and rng.random() < short_fraction
        rows.append(_example(a, b, difficulty, short=short))
    return Dataset.from_list(rows)


def make_splits(
    num_train: int = TOY_NUM_TRAIN,
    num_eval: int = TOY_NUM_EVAL,
    seed: int = 0,
    min_digits: int = TOY_MIN_DIGITS,
    max_digits: int = TOY_MAX_DIGITS,
    short_fraction: float = 0.0,
) -> DatasetDict:
    """Builds non-overlapping train and test splits of the arithmetic task.

    The test split is generated first with distinct prompts; the train split is then generated with a different seed
    and never contains a test prompt (train prompts may repeat, which only happens for the smallest difficulties).

    Args:
        num_train (`int`, *optional*, defaults to `TOY_NUM_TRAIN`):
            Number of training examples.
        num_eval (`int`, *optional*, defaults to `TOY_NUM_EVAL`):
            Number of held-out examples.
        seed (`int`, *optional*, defaults to `0`):
            Base seed.
        min_digits (`int`, *optional*, defaults to `TOY_MIN_DIGITS`):
            Smallest number of digits per operand.
        max_digits (`int`, *optional*, defaults to `TOY_MAX_DIGITS`):
            Largest number of digits per operand.
        short_fraction (`float`, *optional*, defaults to `0.0`):
            Share of compressed solutions in both splits (see [`make_arithmetic_dataset`]).

    Returns:
        [`~datasets.DatasetDict`]: With splits `"train"` and `"test"`, both with the columns of
        [`make_arithmetic_dataset`].
    """
    test = make_arithmetic_dataset(
        num_eval,
        seed=seed + 1_000_003,
        min_digits=min_digits,
        max_digits=max_digits,
        unique=True,
        short_fraction=short_fraction,
    )
    train = make_arithmetic_dataset(
        num_train,
        seed=seed,
        min_digits=min_digits,
        max_digits=max_digits,
        exclude_prompts=test["prompt"],
        short_fraction=short_fraction,
    )
    return DatasetDict(train=train, test=test)

"""The accuracy-link toy task: the sum of a digit string modulo m, one running sum per line.

A response may close its reasoning after any line and answer with the running sum so far, as on the stop-anytime
majority task (`vcppo_trl.toy.majority`), but here an answer stopped before the last line is worth no more than a
guess: the digits not yet read are uniform, so the sum of the rest is uniform modulo m and the running value names
the whole answer with probability 1/m whatever the line. Only the complete reasoning is reliably right, and an answer
given without reasoning needs the whole sum in one forward pass, which a tiny model cannot do.

```text
prompt:      "Sum mod 5 of: a3 b4 c1 d0\\n"
completion:  "<think>a3 3\\nb4 2\\nc1 3\\nd0 3\\n</think> \\\\boxed{3}"          (complete)
completion:  "<think>a3 3\\nb4 2\\n</think> \\\\boxed{2}"                      (stopped after 2 lines: wrong)
```

Every digit carries a one-character key (`a`…`z`, `A`…`Z`), so the line that reads digit `i` finds it in the prompt by
its key (the successor of the previous line's key). A line is `<key><digit> <running sum mod m>`. Every answer,
whatever line it follows, is scored against the whole string's sum ([`running_sum_reward`], or `math_verify_reward`
on the `solution` column). With `modulus=2` the task is the parity of a bit string with a running parity.

With bits for digits (`values=2`) and `tally="counts"`, a line keeps the majority task's counts instead
(`"c1 2:1"`: ones and zeros so far) and the answer is the number of ones modulo m: the same lines as the majority
task (`vcppo_trl.toy.majority`), whose counts a tiny model learns, with an answer that needs them exactly.

With the character-level toy tokenizer, 15 to 31 digits give prompts of 59 to 107 tokens and complete responses of 87
to 167 tokens.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence

from datasets import Dataset, DatasetDict

from .majority import KEYS
from .task import THINK_END, THINK_START, count_think_lines, is_correct, verifier_scores

RUNNING_SUM_MODULUS = 5
RUNNING_SUM_MIN_DIGITS = 15
RUNNING_SUM_MAX_DIGITS = 31
RUNNING_SUM_EARLY_STOP_FRACTION = 0.5
"""Share of cold-start solutions that stop at a random line before the end."""
RUNNING_SUM_NUM_TRAIN = 4000
RUNNING_SUM_NUM_EVAL = 300

TALLIES = ("mod", "counts")
"""What a line keeps: the running sum mod m (`"c1 3"`), or, for bits, the counts of ones and zeros (`"c1 2:1"`)."""

_PROMPT_RE = re.compile(r"Sum mod (\d) of: ((?:[A-Za-z]\d ?)+)")
_LINE_RE = re.compile(r"^[A-Za-z]\d (\d|\d+:\d+)$")

__all__ = [
    "accuracy_by_stop_line",
    "format_prompt",
    "format_solution",
    "is_correct",
    "make_running_sum_dataset",
    "make_running_sum_splits",
    "parse_prompt",
    "reasoning_lines",
    "reasoning_lines_reward",
    "running_sum_after",
    "running_sum_reward",
]


def _check(digits: Sequence[int], modulus: int) -> None:
    if not 2 <= modulus <= 10:
        raise ValueError(f"`modulus` must be in [2, 10] (one-character digits and answers), got {modulus}.")
    if not 1 <= len(digits) <= len(KEYS):
        raise ValueError(f"A string has 1 to {len(KEYS)} digits, got {len(digits)}.")
    if any(d not in range(modulus) for d in digits):
        raise ValueError(f"Digits must be in [0, {modulus - 1}] for modulus {modulus}, got {list(digits)}.")


def _check_variant(modulus: int, values: int, tally: str) -> None:
    if not 2 <= values <= modulus:
        raise ValueError(
            f"`values` (digits drawn from [0, values − 1]) must be in [2, modulus={modulus}], got {values}."
        )
    if tally not in TALLIES:
        raise ValueError(f"`tally` must be one of {TALLIES}, got {tally!r}.")
    if tally == "counts" and values != 2:
        raise ValueError(f"`tally='counts'` counts ones and zeros: it needs bits (`values=2`), got values={values}.")


def running_sum_after(digits: Sequence[int], k: int | None = None, modulus: int = RUNNING_SUM_MODULUS) -> int:
    """The answer a solution gives when it stops after `k` lines: the sum of the first `k` digits modulo `modulus`
    (`k = None`: all of them, the problem's answer)."""
    _check(digits, modulus)
    k = len(digits) if k is None else k
    if not 1 <= k <= len(digits):
        raise ValueError(f"k must be in [1, {len(digits)}], got {k}.")
    return sum(digits[:k]) % modulus


def format_prompt(digits: Sequence[int], modulus: int = RUNNING_SUM_MODULUS) -> str:
    """The prompt, e.g. `"Sum mod 5 of: a3 b4 c1\\n"`."""
    _check(digits, modulus)
    return f"Sum mod {modulus} of: " + " ".join(f"{KEYS[i]}{d}" for i, d in enumerate(digits)) + "\n"


def parse_prompt(prompt: str) -> tuple[list[int], int]:
    """The digits and the modulus of a prompt written by [`format_prompt`]."""
    match = _PROMPT_RE.search(prompt)
    if match is None:
        raise ValueError(f"Not a running-sum prompt: {prompt!r}")
    return [int(token[1]) for token in match.group(2).split()], int(match.group(1))


def format_solution(
    digits: Sequence[int], stop_line: int | None = None, modulus: int = RUNNING_SUM_MODULUS, tally: str = "mod"
) -> str:
    """A worked solution that reads `stop_line` digits (all of them by default), one line each, then answers.

    Args:
        tally (`str`, defaults to `"mod"`): `"mod"` (`"c1 3"`, the running sum mod m) or, for bits, `"counts"`
            (`"c1 2:1"`, ones and zeros so far).

    Returns:
        `str`: `"<think>…</think> \\boxed{s}"` with `s` = [`running_sum_after`]`(digits, stop_line)`, without an
        end-of-sequence token.
    """
    k = len(digits) if stop_line is None else stop_line
    answer = running_sum_after(digits, k, modulus)  # checks the digits and k
    if tally == "counts" and any(d not in (0, 1) for d in digits):
        raise ValueError(f"`tally='counts'` needs bits, got {list(digits)}.")
    if tally not in TALLIES:
        raise ValueError(f"`tally` must be one of {TALLIES}, got {tally!r}.")
    lines = []
    for i in range(k):
        total = sum(digits[: i + 1])
        state = f"{total}:{i + 1 - total}" if tally == "counts" else f"{total % modulus}"
        lines.append(f"{KEYS[i]}{digits[i]} {state}\n")
    return f"{THINK_START}{''.join(lines)}{THINK_END} \\boxed{{{answer}}}"


def reasoning_lines(text: str) -> int:
    """Number of reasoning lines (either tally) inside the (possibly unclosed) `<think>` block of a response; 0 without one."""
    return count_think_lines(text, _LINE_RE)


def running_sum_reward(completions: list, solution: list[str], **kwargs) -> list[float]:
    """The task's verifier in the TRL reward-function protocol: +1 when the answer after `</think>` is the whole
    string's sum, whatever line the reasoning stopped at, −1 otherwise (wrong, missing, or reasoning never closed).

    Agrees with `vcppo_trl.rewards.math_verify_reward` on this task, without its cost.
    """
    return verifier_scores(completions, solution)


def reasoning_lines_reward(completions: list, **kwargs) -> list[float]:
    """Running-sum lines of each response ([`reasoning_lines`]): a length metric to log with weight 0, never trained
    on."""
    from ..rewards.math_verify import completion_to_text

    return [float(reasoning_lines(completion_to_text(c))) for c in completions]


def make_running_sum_dataset(
    num_examples: int,
    seed: int = 0,
    modulus: int = RUNNING_SUM_MODULUS,
    min_digits: int = RUNNING_SUM_MIN_DIGITS,
    max_digits: int = RUNNING_SUM_MAX_DIGITS,
    early_stop_fraction: float = RUNNING_SUM_EARLY_STOP_FRACTION,
    exclude_prompts: Iterable[str] | None = None,
    unique: bool = False,
    values: int | None = None,
    tally: str = "mod",
) -> Dataset:
    """Generates running-sum problems with worked solutions, a share of them stopped early (the cold-start data).

    The length is drawn uniformly in `[min_digits, max_digits]`, the digits uniformly in `[0, values − 1]` (`values`
    defaults to `modulus`). A solution stops early with probability `early_stop_fraction`, after a number of lines
    drawn uniformly in `[1, num_digits − 1]`, and then answers with the running sum (right with probability about
    1/modulus). `tally` is the lines' form (see [`format_solution`]).

    Returns:
        [`~datasets.Dataset`]: Columns `prompt`, `completion` (without end-of-sequence token), `solution`
        (`"\\boxed{s}"`, the whole string's sum), `difficulty` (number of digits), `stop_line` (lines of the
        completion) and `completion_correct` (whether the completion's answer is the whole sum).
    """
    if not 0.0 <= early_stop_fraction <= 1.0:
        raise ValueError(f"`early_stop_fraction` must be in [0, 1], got {early_stop_fraction}.")
    if not 2 <= min_digits <= max_digits <= len(KEYS):
        raise ValueError(f"Need 2 <= min_digits <= max_digits <= {len(KEYS)}, got [{min_digits}, {max_digits}].")
    _check([0], modulus)
    values = modulus if values is None else values
    _check_variant(modulus, values, tally)
    rng = random.Random(seed)
    excluded = set(exclude_prompts or ())
    seen: set[str] = set()
    rows: list[dict] = []
    attempts, max_attempts = 0, 100 * num_examples + 1000
    while len(rows) < num_examples:
        attempts += 1
        if attempts > max_attempts:
            raise ValueError(f"Could only generate {len(rows)} of {num_examples} distinct examples.")
        n = rng.randint(min_digits, max_digits)
        digits = [rng.randrange(values) for _ in range(n)]
        # Both drawn for every example, so that the prompts do not depend on `early_stop_fraction`.
        early = rng.random() < early_stop_fraction
        early_line = rng.randint(1, n - 1)
        stop_line = early_line if early else n
        prompt = format_prompt(digits, modulus)
        if prompt in excluded or (unique and prompt in seen):
            continue
        seen.add(prompt)
        answer = running_sum_after(digits, None, modulus)
        rows.append(
            {
                "prompt": prompt,
                "completion": format_solution(digits, stop_line, modulus, tally=tally),
                "solution": f"\\boxed{{{answer}}}",
                "difficulty": n,
                "stop_line": stop_line,
                "completion_correct": running_sum_after(digits, stop_line, modulus) == answer,
            }
        )
    return Dataset.from_list(rows)


def make_running_sum_splits(
    num_train: int = RUNNING_SUM_NUM_TRAIN,
    num_eval: int = RUNNING_SUM_NUM_EVAL,
    seed: int = 0,
    modulus: int = RUNNING_SUM_MODULUS,
    min_digits: int = RUNNING_SUM_MIN_DIGITS,
    max_digits: int = RUNNING_SUM_MAX_DIGITS,
    early_stop_fraction: float = RUNNING_SUM_EARLY_STOP_FRACTION,
    values: int | None = None,
    tally: str = "mod",
) -> DatasetDict:
    """Non-overlapping train and test splits: distinct test prompts with complete solutions; the train split mixes
    complete and early-stopped solutions and never holds a test prompt."""
    common = {"modulus": modulus, "min_digits": min_digits, "max_digits": max_digits, "values": values, "tally": tally}
    test = make_running_sum_dataset(num_eval, seed=seed + 1_000_003, unique=True, early_stop_fraction=0.0, **common)
    train = make_running_sum_dataset(
        num_train, seed=seed, exclude_prompts=test["prompt"], early_stop_fraction=early_stop_fraction, **common
    )
    return DatasetDict(train=train, test=test)


def accuracy_by_stop_line(prompts: Iterable[str], max_lines: int | None = None) -> list[float]:
    """Share of problems that a solution stopping after k lines gets right, for k = 1, 2, … (problems shorter than k
    count as read to the end): about 1/modulus until the last line."""
    problems = [parse_prompt(p) for p in prompts]
    if not problems:
        return []
    max_lines = max_lines or max(len(d) for d, _ in problems)
    return [
        sum(running_sum_after(d, min(k, len(d)), m) == running_sum_after(d, None, m) for d, m in problems)
        / len(problems)
        for k in range(1, max_lines + 1)
    ]

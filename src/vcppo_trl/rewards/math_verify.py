"""Rule-based verifier rewards for VC-PPO.

VC-PPO (arXiv 2503.01491) trains long chain-of-thought policies against a rule-based verifier: a completion receives
`+1.0` when the final answer written after the reasoning block is mathematically equivalent to the reference answer,
and `-1.0` otherwise. This module implements that verifier with
[math-verify](https://github.com/huggingface/Math-Verify), following TRL's reward-function protocol
(`reward_func(completions, solution, **kwargs) -> list[float | None]`).

math-verify guards its parsing/comparison with `signal.alarm`, which only works in the main thread. The reward below
uses those timeouts in the main thread and, when called from any other thread (e.g. a thread pool in the trainer),
runs each sample in a separate worker process under a wall-clock timeout ([`~rewards.verifier_worker.VerifierWorker`]),
killing the worker when it is exceeded, so that a pathological expression can never hang training.
"""

from __future__ import annotations

import atexit
import logging
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

from latex2sympy2_extended import NormalizationConfig
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from .verifier_worker import VerifierWorker, WorkerError, WorkerTimeout

__all__ = [
    "DEFAULT_THINK_TAGS",
    "DEFAULT_TIMEOUT_SECONDS",
    "MathVerifyReward",
    "completion_to_text",
    "gold_candidates",
    "make_math_verify_reward",
    "math_verify_reward",
    "shutdown_verifier_worker",
    "split_think",
    "verify_answer",
]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS: float = 5.0
"""Default per-sample verification timeout (seconds), read at call time by rewards built without an explicit one."""

DEFAULT_THINK_TAGS: tuple[str, str] = ("<think>", "</think>")
"""Default opening and closing tags of the reasoning block."""

CORRECT_REWARD: float = 1.0
INCORRECT_REWARD: float = -1.0

# Markers that math-verify's LaTeX extraction recognises in a gold solution; without them bare LaTeX is either not
# parsed at all (`\sqrt{2}`) or parsed wrongly by the plain-expression fallback (`3\sqrt{2}` -> 3, `[1, 3)` -> 3).
_LATEX_DELIMITERS = ("$", "\\boxed", "\\fbox", "\\(", "\\[")


class _DropTimeoutDisabledWarning(logging.Filter):
    """Drops math-verify's "Timeout is disabled ..." warning, expected whenever timeouts are handled by the caller."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


_TIMEOUT_DISABLED_FILTER = _DropTimeoutDisabledWarning()
for _name in ("math_verify.parser", "math_verify.grader"):
    _mv_logger = logging.getLogger(_name)
    if not any(isinstance(f, _DropTimeoutDisabledWarning) for f in _mv_logger.filters):
        _mv_logger.addFilter(_TIMEOUT_DISABLED_FILTER)


# ----------------------------------------------------------------------------------------------------------------------
# Pure helpers
# ----------------------------------------------------------------------------------------------------------------------


def completion_to_text(completion: str | Sequence[dict[str, Any]]) -> str:
    """
    Returns the text of a completion, in either of TRL's formats.

    Args:
        completion (`str` or `list[dict]`):
            A plain-text completion, or a conversational one (a list of messages with `"role"` and `"content"`). For a
            conversational completion, the content of the last assistant message is used (the last message if none
            has a role); a content given as a list of parts (`{"type": "text", "text": ...}`) is concatenated.

    Returns:
        `str`: The completion text (empty when there is none).
    """
    if isinstance(completion, str):
        return completion
    messages = list(completion)
    if not messages:
        return ""
    assistant = [m for m in messages if m.get("role") == "assistant"]
    content = (assistant or messages)[-1].get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def split_think(text: str, think_tags: tuple[str, str] | None = DEFAULT_THINK_TAGS) -> tuple[str | None, bool]:
    """
    Separates the final answer from the reasoning block of a completion.

    The answer is the text after the last closing tag. This also covers chat templates (Qwen3, DeepSeek-R1) that put
    the opening tag in the prompt, so that the completion contains only the closing one.

    Args:
        text (`str`):
            Completion text.
        think_tags (`tuple[str, str]` or `None`, *optional*, defaults to `("<think>", "</think>")`):
            Opening and closing tags of the reasoning block. `None` disables splitting.

    Returns:
        `tuple[str | None, bool]`: `(answer, closed)`, where `closed` tells whether a closing tag was found, and
        `answer` is:
            - the text after the last closing tag, if there is one and no reasoning block is reopened after it;
            - `None` if a reasoning block is opened but never closed (the completion has no valid answer);
            - the full text if there are no tags at all.

    Example:
    ```python
    >>> split_think("<think>2+2=4</think> The answer is 4.")
    (' The answer is 4.', True)
    >>> split_think("2+2=4</think> 4")
    (' 4', True)
    >>> split_think("<think>2+2=4, so the answer is 4.")
    (None, False)
    >>> split_think("The answer is 4.")
    ('The answer is 4.', False)
    ```
    """
    if think_tags is None:
        return text, False
    open_tag, close_tag = think_tags
    _, sep, tail = text.rpartition(close_tag)
    if sep:
        return (None, False) if open_tag in tail else (tail, True)
    return (None, False) if open_tag in text else (text, False)


def gold_candidates(solution: str) -> list[str]:
    """
    Lists the forms of a gold solution to hand to math-verify, in order of preference.

    math-verify only extracts LaTeX between delimiters (`$...$`, `\\boxed{}`, ...); on bare LaTeX its plain-expression
    fallback either finds nothing (`\\sqrt{2}`) or grabs a fragment (`3\\sqrt{2}` -> `3`, `[1, 3)` -> `3`). Bare gold
    solutions are therefore wrapped in `$...$` (then `\\boxed{...}`) first, and tried raw last. Gold solutions that
    already contain delimiters are tried raw first.

    Args:
        solution (`str`):
            Raw gold solution.

    Returns:
        `list[str]`: Candidate strings to parse, most preferred first.
    """
    solution = solution.strip()
    if not solution:
        return []
    wrapped = [f"${solution}$", f"\\boxed{{{solution}}}"]
    if any(delim in solution for delim in _LATEX_DELIMITERS):
        return [solution, *wrapped]
    return [*wrapped, solution]


def _signal_timeout(timeout_seconds: float) -> int:
    """Rounds a timeout up to the whole seconds that `signal.alarm` (math-verify's timeout) accepts."""
    return max(1, math.ceil(timeout_seconds))


def _answer_extraction_config() -> list[LatexExtractionConfig | ExprExtractionConfig]:
    """Extraction targets for model answers: `\\boxed{}` first, then anchored LaTeX, then anchored plain expressions."""
    return [
        LatexExtractionConfig(
            normalization_config=NormalizationConfig(units=True),
            boxed_match_priority=0,
            try_extract_without_anchor=False,
        ),
        ExprExtractionConfig(try_extract_without_anchor=False),
    ]


def _extracted_string(parsed: list) -> str:
    """Returns the raw string math-verify extracted (never `str()` of a SymPy object, which can itself hang)."""
    return next((p for p in reversed(parsed) if isinstance(p, str)), "[parsed]")


def verify_answer(answer: str | None, solution: str, timeout: int | None = None) -> tuple[float | None, str]:
    """
    Scores one extracted answer against a gold solution with math-verify.

    Args:
        answer (`str` or `None`):
            Answer part of the completion (see [`split_think`]); `None` when the completion has no valid answer.
        solution (`str`):
            Raw gold solution (bare LaTeX is accepted, see [`gold_candidates`]).
        timeout (`int` or `None`, *optional*):
            math-verify timeout in whole seconds, applied to every parse/comparison with `signal.alarm`; only usable in
            the main thread. `None` disables it.

    Returns:
        `tuple[float | None, str]`: The reward (`1.0` if equivalent, `-1.0` otherwise, `None` if the gold solution
        cannot be parsed) and the answer string that was extracted, for logging.
    """
    gold: list = []
    for candidate in gold_candidates(str(solution)):
        gold = parse(candidate, parsing_timeout=timeout)
        if gold:
            break
    if not gold:
        return None, "[unparseable gold]"
    if answer is None:
        return INCORRECT_REWARD, "[unclosed reasoning]"
    parsed = parse(answer, _answer_extraction_config(), extraction_mode="first_match", parsing_timeout=timeout)
    if not parsed:
        return INCORRECT_REWARD, "[no answer]"
    correct = verify(gold, parsed, timeout_seconds=timeout)
    return (CORRECT_REWARD if correct else INCORRECT_REWARD), _extracted_string(parsed)


def _score_sample(answer: str | None, solution: str, timeout: int | None) -> tuple[float | None, str]:
    """Entry point run in the verifier worker (module-level, so that it pickles by reference)."""
    return verify_answer(answer, solution, timeout)


# ----------------------------------------------------------------------------------------------------------------------
# The worker process used off the main thread
# ----------------------------------------------------------------------------------------------------------------------

_WORKER = VerifierWorker()
atexit.register(_WORKER.shutdown)


def shutdown_verifier_worker() -> None:
    """Stops the process used to verify answers off the main thread (restarted on demand; also stopped at exit)."""
    _WORKER.shutdown()


# ----------------------------------------------------------------------------------------------------------------------
# Reward function
# ----------------------------------------------------------------------------------------------------------------------


class MathVerifyReward:
    """
    Rule-based verifier reward: `+1.0` if the answer after the reasoning block is equivalent to the gold solution,
    `-1.0` otherwise, `None` when the gold solution cannot be parsed. Build it with [`make_math_verify_reward`].

    A callable class (rather than a closure) so that it stays picklable.
    """

    # Every sample is bounded by its own timeout, so the trainer calls it inline rather than under a thread timeout.
    has_own_timeout = True

    def __init__(
        self,
        timeout_seconds: float | None = None,
        think_tags: tuple[str, str] | None = DEFAULT_THINK_TAGS,
        name: str = "math_verify_reward",
    ) -> None:
        if timeout_seconds is not None and not timeout_seconds > 0:
            raise ValueError(f"`timeout_seconds` must be positive, got {timeout_seconds}.")
        if think_tags is not None and (len(think_tags) != 2 or not all(think_tags)):
            raise ValueError(f"`think_tags` must be a pair of non-empty strings or None, got {think_tags!r}.")
        self.timeout_seconds = timeout_seconds
        self.think_tags = tuple(think_tags) if think_tags is not None else None
        self.__name__ = name

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(timeout_seconds={self.timeout_seconds!r}, think_tags={self.think_tags!r}, "
            f"name={self.__name__!r})"
        )

    def _score(self, answer: str | None, solution: str, timeout: float) -> tuple[float | None, str]:
        if threading.current_thread() is threading.main_thread():
            try:
                return verify_answer(answer, solution, _signal_timeout(timeout))
            except (Exception, TimeoutException) as error:
                logger.warning("math-verify failed on a sample (%s); giving it %s.", error, INCORRECT_REWARD)
                return INCORRECT_REWARD, "[error]"
        try:
            # Inside the worker (its own main thread) math-verify's signal timeouts work too, as a first line of
            # defence; the wall-clock timeout is the hard limit.
            return _WORKER.run(_score_sample, (answer, solution, _signal_timeout(timeout)), timeout)
        except WorkerTimeout:
            logger.warning("math-verify timed out after %s s on a sample; giving it %s.", timeout, INCORRECT_REWARD)
            return INCORRECT_REWARD, "[timeout]"
        except WorkerError as error:
            logger.warning("math-verify failed on a sample (%s); giving it %s.", error, INCORRECT_REWARD)
            return INCORRECT_REWARD, "[error]"

    def __call__(
        self,
        completions: list[str] | list[list[dict[str, Any]]],
        solution: list[str],
        log_extra: Callable[[str, list], None] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        """
        Scores completions against their gold solutions.

        Args:
            completions (`list[str]` or `list[list[dict]]`):
                Plain-text or conversational completions.
            solution (`list[str]`):
                Gold solutions, one per completion (typically a dataset column named `solution`).
            log_extra (`Callable`, *optional*):
                Provided by TRL trainers to add columns to the completions table; the extracted answers are logged.
            **kwargs:
                Other dataset columns and trainer arguments, ignored.

        Returns:
            `list[float | None]`: `1.0` for a verified answer, `-1.0` for a wrong or missing one (including an
            answer only inside the reasoning block, or an unclosed reasoning block), `None` when the gold solution
            cannot be parsed (the sample is then skipped).
        """
        timeout = self.timeout_seconds if self.timeout_seconds is not None else DEFAULT_TIMEOUT_SECONDS
        rewards: list[float | None] = []
        extracted: list[str] = []
        for completion, sol in zip(completions, solution, strict=True):
            if sol is None:
                reward, shown = None, "[no gold]"
            else:
                answer, _ = split_think(completion_to_text(completion), self.think_tags)
                reward, shown = self._score(answer, sol, timeout)
            rewards.append(reward)
            extracted.append(shown)
        if log_extra is not None:
            log_extra(f"{self.__name__}/answer", extracted)
        return rewards


def make_math_verify_reward(
    timeout_seconds: float | None = None,
    think_tags: tuple[str, str] | None = DEFAULT_THINK_TAGS,
    name: str = "math_verify_reward",
) -> MathVerifyReward:
    r"""
    Builds a math-verify reward function.

    Args:
        timeout_seconds (`float`, *optional*):
            Verification time limit. In the main thread it bounds each math-verify parse/comparison (rounded up to
            whole seconds, as `signal.alarm` requires); off the main thread it is the wall-clock limit for a whole
            sample, after which the worker process is killed and the sample gets `-1.0`. Defaults to
            [`DEFAULT_TIMEOUT_SECONDS`], read at call time.
        think_tags (`tuple[str, str]` or `None`, *optional*, defaults to `("<think>", "</think>")`):
            Opening and closing tags of the reasoning block; `None` judges the full completion text.
        name (`str`, *optional*, defaults to `"math_verify_reward"`):
            `__name__` of the reward, used by TRL trainers to name its metrics.

    Returns:
        [`MathVerifyReward`]: A reward function `(completions, solution, **kwargs) -> list[float | None]`.

    Example:
    ```python
    >>> reward = make_math_verify_reward(timeout_seconds=2.0)
    >>> reward([r"<think>1/2 + 1/2</think> $\boxed{1}$", r"\boxed{2}"], ["1", "1"])
    [1.0, -1.0]
    ```
    """
    return MathVerifyReward(timeout_seconds=timeout_seconds, think_tags=think_tags, name=name)


math_verify_reward: MathVerifyReward = make_math_verify_reward()
"""Default math-verify reward (timeout [`DEFAULT_TIMEOUT_SECONDS`], `<think>...</think>` reasoning block)."""
"""Reward functions available by name to scripts."""

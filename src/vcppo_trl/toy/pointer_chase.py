"""A task where credit is visible: a pointer chase, K lookups in a table, each one right or wrong in the text so far.

The prompt is a table (keys lower case, values upper case, each letter once as a key) and a start value; the response
writes one hop line per lookup, the key (the lower-case form of the value just found) then the value the table gives
it, then the last value in `\\boxed{}`:

```text
prompt:      "Kd Ax Qa Bk Dq Xb | A\\n"                 (the table, each entry value then key; then the start value)
completion:  "<think>aQ\\nqD\\ndK\\n</think> \\\\boxed{K}"   (K = 3 hops: a → Q, q → D, d → K)
```

The form is what a 3-layer, 128-wide toy learns in minutes. Keys are lower case and values upper case, so that every
key appears once in the prompt (with the same letters for both, toys stayed at chance). A table entry writes the value
before its key, so that a lookup is find-the-key-and-read-the-letter-before-it: the hop line's key matches the table's
copy of the same token, whose neighbour one attention layer below has already read. With the key first (`aQ`) the key
must be matched against what the value's position read of its neighbour: at 2 hops over 6 pairs, on correct traces
and at the same learning rate, the key-first table stayed at chance for 1,500 steps where the value-first one put 0.55
on the right value (and `a>Q` stayed at chance for 3,000 steps at 8 hops). `filler` dots after each hop's value
(`"aQ....\\n"`) add length at a fixed number of decisions. The reward is ±1 on the boxed answer only
([`pointer_chase_reward`]).

**Table.** A permutation of `num_pairs` letters (each once as a key and once as a value, so no letter stands out):
the chain (the start, then one letter per hop, the last the answer) and the distractors. A wrong hop of the cold
start's traces writes a distractor and the trace goes on consistently from it ([`sample_trace`]); it never ends on the
answer, however many hops are wrong:
- when the chain fits (`num_hops + 1 + num_distractors <= num_pairs`) the table is one cycle: the chain, then the
  distractors, then back to the start. A trace that jumped to a distractor is at least one step past the answer's
  place on the cycle and needs more than K hops to come round to it again (the distractor d_j, j ≥ 1 letters after the
  answer, with s ≤ K − 1 hops left ends j + s < `num_pairs` letters after it);
- otherwise (e.g. 32 hops over 12 pairs) the chain is its own cycle, walked round several times, and the distractors
  form another, which a trace never leaves. The chain's length is chosen so that the answer is neither the start nor
  the start's predecessor ([`chain_cycle_length`]).

Letters are reused along a long walk rather than made two characters long: a lookup stays one token and the prompt
stays short (a 12-pair table is 40 tokens at every K).

**Decisions.** The decision of hop i is its value letter (the token after its key); the key before it is fixed by the
previous value. `pointer_chase_credit.py` finds each hop's decision token and whether it is a correct lookup
(`hop_correctness`), and gives the critic that knows the table (`oracle_values`, and a critic module for the trainers).
"""

from __future__ import annotations

import dataclasses
import random
import re
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from datasets import Dataset, DatasetDict

from .task import THINK_END, THINK_START, verifier_scores

POINTER_CHASE_HOPS = 8
POINTER_CHASE_PAIRS = 12
POINTER_CHASE_DISTRACTORS = 3
POINTER_CHASE_FILLER = 0
POINTER_CHASE_SUCCESS = 0.35
"""Success rate of the cold start's traces at every K: each hop is wrong with probability 1 - s^(1/K)."""
POINTER_CHASE_TABLES = None
"""Tables of the task: `None` draws a fresh table for every problem; M draws each problem from a pool of M tables
([`table_pool`])."""
TABLE_POOL_SEED = 20_261_206
"""Seed of [`table_pool`]: the pool is part of the task, the same for every run's seed."""
POINTER_CHASE_NUM_TRAIN = 4000
POINTER_CHASE_NUM_EVAL = 300

FILLER = "."
BOX_OPEN = " \\boxed{"

_PROMPT_RE = re.compile(r"((?:[A-Z][a-z] )*[A-Z][a-z]) \| ([A-Z])\n?")


@dataclass(frozen=True)
class ChaseProblem:
    """A pointer-chase problem: the table in prompt order (`(key, VALUE)` pairs), the start value and the hops."""

    entries: tuple[tuple[str, str], ...]
    start: str
    num_hops: int

    @property
    def lookup(self) -> dict[str, str]:
        return dict(self.entries)

    def walk(self) -> list[str]:
        """The values of the correct hops, in order (`num_hops` upper-case letters; the last is the answer)."""
        lookup, values, value = self.lookup, [], self.start
        for _ in range(self.num_hops):
            value = lookup[value.lower()]
            values.append(value)
        return values

    @property
    def answer(self) -> str:
        return self.walk()[-1]

    @property
    def distractors(self) -> list[str]:
        """The values a wrong hop of the cold start writes: the table's values off the correct walk (sorted)."""
        on_chain = {self.start, *self.walk()}
        return sorted({value for _, value in self.entries} - on_chain)


def hop_error_rate(num_hops: int, success: float = POINTER_CHASE_SUCCESS) -> float:
    """ε_K = 1 − s^(1/K): the per-hop error rate whose K independent hops are all right with probability `success`."""
    if num_hops < 1 or not 0.0 < success <= 1.0:
        raise ValueError(f"Need num_hops >= 1 and success in (0, 1], got {num_hops} and {success}.")
    return 1.0 - success ** (1.0 / num_hops)


def chain_cycle_length(num_hops: int, num_pairs: int, num_distractors: int) -> int | None:
    """Letters of the chain's own cycle when K hops do not fit in one pass (`num_hops + 1 + num_distractors >
    num_pairs`): the most, at most `num_pairs - num_distractors`, that leaves the answer neither the start (K a
    multiple of the cycle) nor the start's predecessor (one lookup back from the prompt's start). `None` when the chain
    fits."""
    if num_hops + 1 + num_distractors <= num_pairs:
        return None
    for length in range(num_pairs - num_distractors, 2, -1):
        if num_hops % length not in (0, length - 1):
            return length
    raise ValueError(
        f"{num_hops} hops cannot walk a table of {num_pairs} pairs with {num_distractors} distractors: the chain's "
        "cycle would put the answer on the start or one lookup back from it. Give more pairs or fewer distractors."
    )


def check_table_shape(num_hops: int, num_pairs: int, num_distractors: int) -> None:
    """Refuses a table that cannot hold the chain and its distractors (see the module's docstring)."""
    if num_hops < 1:
        raise ValueError(f"`num_hops` must be at least 1, got {num_hops}.")
    if num_distractors < 2 or num_pairs > len(string.ascii_lowercase):
        raise ValueError(f"Need at least 2 distractors and at most 26 pairs, got {num_distractors} and {num_pairs}.")
    chain_cycle_length(num_hops, num_pairs, num_distractors)


def make_problem(
    rng: random.Random,
    num_hops: int = POINTER_CHASE_HOPS,
    num_pairs: int = POINTER_CHASE_PAIRS,
    num_distractors: int = POINTER_CHASE_DISTRACTORS,
) -> ChaseProblem:
    """Draws a table (a permutation of `num_pairs` letters, entries shuffled): one cycle through the chain (the start
    and K hops) then the distractors back to the start when it fits, else the chain's own cycle and the distractors'
    ([`chain_cycle_length`]).

    Args:
        rng (`random.Random`): The generator.
        num_hops (`int`): K, the lookups of a correct trace.
        num_pairs (`int`): Entries of the table (distinct key letters, at most 26).
        num_distractors (`int`): Fewest distractor letters (all the letters off the chain are distractors).

    Returns:
        [`ChaseProblem`]
    """
    check_table_shape(num_hops, num_pairs, num_distractors)
    letters = rng.sample(string.ascii_lowercase, num_pairs)
    length = chain_cycle_length(num_hops, num_pairs, num_distractors)
    cycles = [letters] if length is None else [letters[:length], letters[length:]]
    successor = {key: value for cycle in cycles for key, value in zip(cycle, cycle[1:] + cycle[:1])}
    entries = [(key, successor[key].upper()) for key in letters]
    rng.shuffle(entries)
    return ChaseProblem(entries=tuple(entries), start=letters[0].upper(), num_hops=num_hops)


def start_letters(problem: ChaseProblem) -> list[str]:
    """The values a problem of this table may start from: the letters of its start's cycle, in walk order. From any of
    them the chain and its distractors keep [`make_problem`]'s shape: on one cycle the distractors are the letters just
    after the answer; on two, the other cycle's letters, and K modulo the cycle's length is the same."""
    lookup, letters, value = problem.lookup, [problem.start], problem.start
    while (value := lookup[value.lower()]) != problem.start:
        letters.append(value)
    return letters


def table_pool(
    num_tables: int,
    num_hops: int = POINTER_CHASE_HOPS,
    num_pairs: int = POINTER_CHASE_PAIRS,
    num_distractors: int = POINTER_CHASE_DISTRACTORS,
) -> list[ChaseProblem]:
    """The task's `num_tables` tables ([`make_problem`] from [`TABLE_POOL_SEED`]: the same for every run). With a pool,
    a table's lookups can be learned into the weights, by the policy and by a critic: with a fresh table per problem a
    critic must redo the in-context lookup to see that a hop was wrong, which a toy critic did not learn from returns
    (`experiments/credit_critic_learnability.py`)."""
    if num_tables < 1:
        raise ValueError(f"`num_tables` must be at least 1 (or None for a fresh table per problem), got {num_tables}.")
    rng = random.Random(TABLE_POOL_SEED)
    shape = {"num_hops": num_hops, "num_pairs": num_pairs, "num_distractors": num_distractors}
    return [make_problem(rng, **shape) for _ in range(num_tables)]


def draw_problem(rng: random.Random, pool: Sequence[ChaseProblem] | None, **shape) -> ChaseProblem:
    """A problem: a fresh table ([`make_problem`] with `shape`) without a pool, else a pool's table from one of its
    [`start_letters`]."""
    if pool is None:
        return make_problem(rng, **shape)
    table = pool[rng.randrange(len(pool))]
    return dataclasses.replace(table, start=rng.choice(start_letters(table)))


def format_prompt(problem: ChaseProblem) -> str:
    """The prompt: `"Kd Qa ... | A\\n"`, the table (each entry the value, then its key), then the start value; the only
    newline ends it."""
    table = " ".join(f"{value}{key}" for key, value in problem.entries)
    return f"{table} | {problem.start}\n"


def parse_prompt(prompt: str, num_hops: int) -> ChaseProblem:
    """The problem of a prompt written by [`format_prompt`] (`num_hops` is not in the text)."""
    match = _PROMPT_RE.fullmatch(prompt)
    if match is None:
        raise ValueError(f"Not a pointer-chase prompt: {prompt!r}")
    entries = tuple((entry[1], entry[0]) for entry in match.group(1).split(" "))
    return ChaseProblem(entries=entries, start=match.group(2), num_hops=num_hops)


def sample_trace(problem: ChaseProblem, error_rate: float, rng: random.Random) -> list[str]:
    """The values of a cold-start trace: each hop is wrong with probability `error_rate`, and a wrong hop writes a
    distractor other than the right value (uniformly); the next key is always the value just written.

    Returns:
        `list[str]`: `num_hops` values; the last is the trace's answer (the problem's answer iff no hop was wrong).
    """
    lookup, distractors = problem.lookup, problem.distractors
    values, value = [], problem.start
    for _ in range(problem.num_hops):
        right = lookup[value.lower()]
        value = rng.choice([d for d in distractors if d != right]) if rng.random() < error_rate else right
        values.append(value)
    return values


def format_completion(problem: ChaseProblem, values: Sequence[str], filler: int = POINTER_CHASE_FILLER) -> str:
    """The response that writes the hops `values` (each key the lower case of the value before), `filler` dots after
    each value, then the last value boxed: `"<think>aQ\\nqD\\n</think> \\\\boxed{D}"` (no end-of-sequence token)."""
    keys = [problem.start.lower()] + [value.lower() for value in values[:-1]]
    lines = "".join(f"{key}{value}{FILLER * filler}\n" for key, value in zip(keys, values))
    return f"{THINK_START}{lines}{THINK_END}{BOX_OPEN}{values[-1]}}}"


def pointer_chase_reward(completions: list, solution: list[str], **kwargs) -> list[float]:
    """The task's verifier in the TRL reward-function protocol: +1 when the boxed answer after `</think>` is exactly
    the chain's last value, −1 otherwise. `math_verify_reward` agrees except that it takes a lower-case letter for the
    upper-case one."""
    return verifier_scores(completions, solution)


def make_pointer_chase_dataset(
    num_examples: int,
    seed: int = 0,
    num_hops: int = POINTER_CHASE_HOPS,
    num_pairs: int = POINTER_CHASE_PAIRS,
    num_distractors: int = POINTER_CHASE_DISTRACTORS,
    filler: int = POINTER_CHASE_FILLER,
    success: float | None = POINTER_CHASE_SUCCESS,
    exclude_prompts: Iterable[str] | None = None,
    num_tables: int | None = POINTER_CHASE_TABLES,
) -> Dataset:
    """Pointer-chase problems with cold-start traces, each hop wrong with probability ε_K ([`hop_error_rate`]).

    Args:
        success (`float` or `None`): Success rate of the traces (ε_K from it); `None` writes correct traces only.
        exclude_prompts (`Iterable[str]` or `None`): Prompts that must not appear (a held-out split's).
        num_tables (`int` or `None`): `None`, a fresh table per problem; M, problems from the pool of M tables
            ([`table_pool`]), so that M × (letters a start may be) prompts exist.

    Returns:
        [`~datasets.Dataset`]: Columns `prompt`, `completion` (a trace, no end-of-sequence token), `solution`
        (`"\\\\boxed{X}"`, the correct answer), `difficulty` (K), `wrong_hops` (the trace's wrong lookups) and
        `completion_correct`.
    """
    error_rate = 0.0 if success is None else hop_error_rate(num_hops, success)
    rng = random.Random(seed)
    excluded = set(exclude_prompts or ())
    shape = {"num_hops": num_hops, "num_pairs": num_pairs, "num_distractors": num_distractors}
    pool = None if num_tables is None else table_pool(num_tables, **shape)
    rows = []
    while len(rows) < num_examples:
        problem = draw_problem(rng, pool, **shape)
        values = sample_trace(problem, error_rate, rng)
        prompt = format_prompt(problem)
        if prompt in excluded:
            continue
        lookup, before = problem.lookup, [problem.start, *values[:-1]]
        wrong = sum(value != lookup[key.lower()] for value, key in zip(values, before))
        rows.append(
            {
                "prompt": prompt,
                "completion": format_completion(problem, values, filler=filler),
                "solution": f"\\boxed{{{problem.answer}}}",
                "difficulty": num_hops,
                "wrong_hops": wrong,
                "completion_correct": values[-1] == problem.answer,
            }
        )
    return Dataset.from_list(rows)


def make_pointer_chase_splits(
    num_train: int = POINTER_CHASE_NUM_TRAIN, num_eval: int = POINTER_CHASE_NUM_EVAL, seed: int = 0, **task
) -> DatasetDict:
    """Train and test splits (test first, with correct traces). `task`: the knobs of [`make_pointer_chase_dataset`]
    (`num_hops`, `num_pairs`, `num_distractors`, `filler`, `success`, `num_tables`). With a fresh table per problem
    no test prompt is in train; with a pool of tables the test prompts are drawn from the same pool and may be in
    train (the few prompts it has are all trained on: test accuracy is then on fresh samples, not unseen prompts)."""
    test = make_pointer_chase_dataset(num_eval, seed=seed + 1_000_003, **{**task, "success": None})
    held_out = test["prompt"] if task.get("num_tables") is None else None
    train = make_pointer_chase_dataset(num_train, seed=seed, exclude_prompts=held_out, **task)
    return DatasetDict(train=train, test=test)

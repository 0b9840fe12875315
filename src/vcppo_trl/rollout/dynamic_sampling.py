"""Dynamic sampling's rounds (`dynamic_sampling`; DAPO, arXiv 2503.14476, §3.2): sample and score prompts, and draw
more while the batch lacks groups with both correct and wrong samples ([`DynamicSamplingRounds`]). Which groups to
keep is pure math, in `algo/dynamic_sampling.py`; the rounds are here because they sample, score and agree across
processes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from accelerate import Accelerator
from transformers.utils import logging

from ..algo.dynamic_sampling import DynamicSamplingStats, choose_groups, informative_groups
from ..parallel.collectives import max_across_processes
from .scoring import ScoredSamples, concat_scored
from .settings import RolloutSettings
from .types import is_correct

logger = logging.get_logger(__name__)

Rows = list[dict[str, Any]]


class DynamicSamplingRounds:
    """
    Runs dynamic sampling's generation rounds for the rollout maker ([`~rollout.maker.RolloutMaker.make`]).

    Args:
        settings ([`~rollout.settings.RolloutSettings`]): `num_generations` (the group size),
            `dynamic_sampling_max_rounds` and `accuracy_threshold` (what counts as correct).
        accelerator: The trainer's accelerator (every process runs the same rounds).
        pad_token_id: The tokenizer's pad id (the rounds' samples padded to one width).
    """

    def __init__(self, settings: RolloutSettings, accelerator: Accelerator, *, pad_token_id: int):
        self.settings = settings
        self.accelerator = accelerator
        self.pad_token_id = pad_token_id
        self.warned_at_round_limit = False

    def sample_informative_groups(
        self, rows: Rows, more_rows: Callable[[], Rows], sample_and_score: Callable[[Rows], ScoredSamples]
    ) -> tuple[Rows, ScoredSamples, DynamicSamplingStats]:
        """
        Sample and score `rows` (`sample_and_score`), then, while some process has fewer groups with both correct and
        wrong samples than its batch holds, draw the next prompts (`more_rows`) and sample again, up to
        `dynamic_sampling_max_rounds` rounds. Every process runs the same rounds (one all-reduce per round), so
        sharded generation never waits on a process that stopped. Each process keeps its first informative groups
        in drawing order; at the round limit the batch is completed with uninformative ones (counted, warned once).

        Returns:
            The rows and scored samples of the batch (as many as `rows`), and what the rounds did.
        """
        settings, k = self.settings, self.settings.num_generations
        needed = len(rows) // k
        drawn_rows, parts, informative = [], [], []
        for round_index in range(settings.dynamic_sampling_max_rounds):
            if round_index:
                rows = more_rows()
            scored = sample_and_score(rows)
            drawn_rows += rows
            parts.append(scored)
            informative += informative_groups(is_correct(scored.raw_scores, settings.accuracy_threshold), k).tolist()
            if not self.any_process_short(sum(informative) < needed):
                break
        groups, filled = choose_groups(informative, needed)
        if filled:
            self.warn_at_round_limit(sum(informative), needed)
        idx = [g * k + j for g in groups for j in range(k)]
        scored = concat_scored(parts, self.pad_token_id).select(idx)
        tokens = sum(part.samples.num_tokens for part in parts)
        stats = DynamicSamplingStats(
            len(parts), len(informative), sum(informative), filled_groups=filled, generated_tokens=tokens
        )
        return [drawn_rows[i] for i in idx], scored, stats

    def any_process_short(self, short: bool) -> bool:
        """Whether this or any other process still lacks informative groups (a collective under several processes)."""
        flag = int(short)
        if self.accelerator.num_processes > 1:
            flag = max_across_processes(self.accelerator)([flag])[0]
        return bool(flag)

    def warn_at_round_limit(self, informative: int, needed: int) -> None:
        if self.warned_at_round_limit:
            return
        self.warned_at_round_limit = True
        rounds = self.settings.dynamic_sampling_max_rounds
        logger.warning(
            f"Dynamic sampling: {rounds} generation rounds gave {informative} of the "
            f"{needed} groups with both correct and wrong responses; the batch is completed with groups that are "
            "all right or all wrong (sampling/dynamic_filled_groups counts them). Raise "
            "dynamic_sampling_max_rounds, or use prompts nearer the policy's level. (Warned once.)"
        )

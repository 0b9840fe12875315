"""Dynamic sampling (DAPO, arXiv 2503.14476, §3.2; verl's `filter_groups`): which groups of samples to keep.

With several samples per prompt (`num_generations`), a group whose samples all got the same correctness (all right or
all wrong) has a group-normalised advantage of zero in GRPO/DAPO: it adds no gradient and dilutes the batch. DAPO drops
such groups and samples more prompts until the batch is full. The rollout runs the rounds
([`~rollout.dynamic_sampling.DynamicSamplingRounds`]); the choice of groups is here, as pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def informative_groups(correct: torch.Tensor, group_size: int) -> torch.Tensor:
    """
    `[G]` bool: whether each group of `group_size` consecutive samples has both correct and wrong ones.

    Args:
        correct (`torch.Tensor` of shape `[G × group_size]`): Each sample's correctness (unscored samples: False).
    """
    groups = correct.reshape(-1, group_size)
    return groups.any(dim=1) & ~groups.all(dim=1)


def choose_groups(informative: list[bool], needed: int) -> tuple[list[int], int]:
    """
    The groups that make up the batch, in the order they were drawn: the first `needed` informative ones, completed
    (when the rounds ran out) by the first uninformative ones. Returns `(group indices, how many were completed)`.
    """
    kept = [g for g, keep in enumerate(informative) if keep][:needed]
    filled = [g for g, keep in enumerate(informative) if not keep][: needed - len(kept)]
    return sorted(kept + filled), len(filled)


@dataclass(frozen=True)
class DynamicSamplingStats:
    """What dynamic sampling did for one rollout (this process)."""

    rounds: int  # generation rounds (1: the first batch was enough)
    groups_drawn: int  # groups sampled over all rounds
    informative_groups: int  # of which had both correct and wrong samples
    filled_groups: int  # uninformative groups used to complete the batch at the round limit
    generated_tokens: int = 0  # response tokens generated over all rounds (the kept ones and the dropped ones)

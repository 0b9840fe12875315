"""The [`Rollout`] of one update (tokens, masks, log-probabilities, values and scores), the type its maker produces
and the learner and metrics consume, the correctness of a score, a token's turn ([`turn_index`]), the value GAE bootstraps from ([`gae_bootstrap`]), a generation window's marks ([`WindowMarks`]), and what
a source reports of itself ([`SourceReport`], e.g. [`OverlapStats`]) and the held-out rollouts a source may keep
([`HeldOutRollouts`])."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from accelerate import Accelerator

from ..algo.gae import last_valid_values


@dataclass
class Rollout:
    """
    One batch of experience, all tensors on the trainer's device.

    Shapes: `B` sequences, `P` prompt tokens (left-padded), `T` response tokens (right-padded).
    """

    prompts: list[Any]
    completions: list[Any]
    extra_columns: dict[str, list[Any]]
    query_ids: torch.Tensor  # [B, P]
    query_mask: torch.Tensor  # [B, P]
    response_ids: torch.Tensor  # [B, T], padded after the stop token
    response_mask: torch.Tensor  # [B, T] bool: valid response tokens (stop token included)
    has_stop: torch.Tensor  # [B] bool: the response ended with a stop token
    scores: torch.Tensor  # [B] reward used for training (penalties included), 0 where skipped
    raw_scores: torch.Tensor  # [B] weighted reward-function sum before penalties, nan where skipped
    rewards_per_func: torch.Tensor  # [B, F], nan where a function returned None
    reward_failed: torch.Tensor  # [B] bool: a reward function failed on the sample (given reward_failure_value)
    values: torch.Tensor | None = None  # [B, T]
    logprobs: torch.Tensor | None = None  # [B, T] old log-probs; filled by the update under the on-policy shortcut
    ref_logprobs: torch.Tensor | None = None  # [B, T]
    rewards: torch.Tensor | None = None  # [B, T] per-token rewards fed to GAE
    kl: torch.Tensor | None = None  # [B, T] per-token KL estimate
    sampler_logprobs: torch.Tensor | None = None  # [B, T] the sampler's own log-probs (vLLM), 0 outside the mask
    # [B] ≤ 0: the overlong shaping term included in `scores` ([`overlong_penalty`]); None when shaping is off
    overlong_penalties: torch.Tensor | None = None
    # Generation windows (`generation_window`, see `rollout/response_pool.py`); all None when every response is whole.
    window_mask: torch.Tensor | None = None  # [B, T] bool: the tokens sampled in this update (the policy's)
    finished: torch.Tensor | None = None  # [B] bool: finished in this update (stop token, or `response_length`)
    bootstrap_values: torch.Tensor | None = None  # [B] V after the last token of an unfinished response, else 0
    # Tools and environments: [B, T] bool, the policy's own tokens within `response_mask` (the rest are tool and
    # environment tokens: context for the policy and the critic, never actions). None: every response token.
    action_mask: torch.Tensor | None = None
    episode_counts: dict[str, torch.Tensor] | None = None  # tool episodes: [B] counts each (`episodes/tool_loop.py`)
    # [B, T] int64: policy updates between the weights that sampled each response token and those that train on this
    # rollout (0 outside `response_mask`); None: every token was sampled by the training weights (synchronous).
    token_staleness: torch.Tensor | None = None
    # What the reward functions logged while scoring it (TRL's `log_extra`: B values per column; `log_metric`).
    reward_columns: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    reward_metrics: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.query_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.query_mask.bool(), self.response_mask], dim=1).long()

    @property
    def context_length(self) -> int:
        return self.query_ids.shape[1]

    @property
    def finished_rows(self) -> torch.Tensor:
        """`[B]` bool: the responses that finished in this update (all of them without generation windows)."""
        if self.finished is None:
            return torch.ones_like(self.has_stop)
        return self.finished

    @property
    def responses_are_whole(self) -> bool:
        """Whether every response was sampled and finished in this update (no row is a window's, or unfinished): a
        prompt's samples are then all here, as a group."""
        return self.finished is None

    @property
    def action_tokens(self) -> torch.Tensor:
        """`[B, T]` bool: the policy's own response tokens (the response mask less tool and environment tokens)."""
        return self.response_mask if self.action_mask is None else self.response_mask & self.action_mask

    @property
    def trained_tokens(self) -> torch.Tensor:
        """`[B, T]` bool: the tokens the policy trains on in this update: its own tokens (`action_tokens`) sampled in
        this update (a generation window's earlier tokens were trained when they were sampled, and are only context
        now). `mask_truncated_completions` is not applied here (the learner's `policy_mask` does)."""
        return self.action_tokens if self.window_mask is None else self.action_tokens & self.window_mask

    @property
    def trains_every_response_token(self) -> bool:
        """Whether every valid response token is one the policy trains on (no tool token, no earlier window's)."""
        return self.window_mask is None and self.action_mask is None

    @property
    def truncated_rows(self) -> torch.Tensor:
        """`[B]` bool: the responses that ended at `response_length` without a stop token in this update (a window's
        cut is not an end)."""
        return self.finished_rows & ~self.has_stop

    @property
    def value_mask(self) -> torch.Tensor:
        """`[B, T]` bool: the critic's tokens, the policy's own tokens of finished responses (its targets need their
        score)."""
        if self.finished is None:
            return self.action_tokens
        return self.action_tokens & self.finished.unsqueeze(1)

    @property
    def sample_staleness(self) -> torch.Tensor:
        """`[B]` int64: each response's age, its oldest policy token's (`token_staleness`; 0 without the tag, or
        for a response without a policy token)."""
        if self.token_staleness is None:
            return torch.zeros(self.has_stop.shape, dtype=torch.long, device=self.has_stop.device)
        return (self.token_staleness * self.action_tokens).amax(dim=1)

    @property
    def turn_index(self) -> torch.Tensor:
        """`[B, T]` int64: the turn each response token belongs to ([`turn_index`] of `action_tokens`)."""
        return turn_index(self.action_tokens, self.response_mask)

    def is_correct(self, accuracy_threshold: float) -> torch.Tensor:
        """`[B]` bool: [`is_correct`] of the raw scores (the accuracy metric's rule)."""
        return is_correct(self.raw_scores, accuracy_threshold)


def is_correct(raw_scores: torch.Tensor, accuracy_threshold: float) -> torch.Tensor:
    """Whether each response counts as correct: its reward before penalties and shaping exceeds the threshold (False
    where it was not scored, nan). The rule of `diagnostics/accuracy`, `eval/accuracy` and the positive-example LM loss."""
    return raw_scores > accuracy_threshold  # nan compares False


def turn_index(action_tokens: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """
    `[B, T]` int64: the turn of each response token, 0 for the first: a turn is a run of the policy's tokens
    (`action_tokens`) and the tool or environment tokens that answer it, so turn k starts at the policy token that
    follows the k-th answer. Without tools every response token is in turn 0. 0 outside `response_mask`.
    """
    action = action_tokens & response_mask
    after_other = torch.zeros_like(action)
    after_other[:, 1:] = response_mask[:, :-1] & ~action[:, :-1]  # the token before is the tools' or environment's
    starts = action & after_other
    return torch.cumsum(starts.long(), dim=1) * response_mask


def uniform_staleness(response_mask: torch.Tensor, age: int) -> torch.Tensor:
    """`[B, T]` int64 `token_staleness` of a batch one set of weights sampled, `age` policy updates ago."""
    return response_mask.long() * age


def gae_bootstrap(rollout: Rollout, rule: str) -> torch.Tensor | None:
    """
    The value after each response's last token that GAE bootstraps from (`None`: no window, every response is
    terminal): the critic's value of the state after a window's cut (`rule="value"`, exact: the rollout's forward
    computed it), or the last value computed before the cut (`"last_value"`, T-PPO's rule V(s_l) := V(s_{l−1}));
    0 for the responses that finished.
    """
    if rollout.bootstrap_values is None:
        return None
    if rule == "last_value":
        return torch.where(rollout.finished, 0.0, last_valid_values(rollout.values, rollout.response_mask))
    return rollout.bootstrap_values


@dataclasses.dataclass(frozen=True)
class WindowMarks:
    """
    What marks a generation window's rollout apart from one of whole responses (see `rollout/windowed.py`): the
    tokens sampled in this update and the responses that finished in it. Penalties, scores and rewards act on the
    finished responses only; the others are bootstrapped from the critic.
    """

    window_mask: torch.Tensor  # [B, T] bool: the tokens sampled in this update
    finished: torch.Tensor  # [B] bool: finished in this update (stop token, or `response_length`)


@dataclasses.dataclass(frozen=True)
class OverlapStats:
    """What one overlapped rollout measured (this process)."""

    staleness: int  # policy updates between the weights that sampled the batch and those that train it
    wait_seconds: float  # the trainer idle, waiting for the samples
    sampler_idle_seconds: float  # the worker idle, waiting for work, before it sampled this batch
    push_seconds: float  # the last weight push (staging it: a copy, or a file written)
    in_flight: int  # generations queued beyond this one
    dropped: int = 0  # samples dropped for their age so far in the run (this process)

    def metrics(self, accelerator: Accelerator) -> dict[str, float]:
        """
        This rollout over all processes (a collective: every process calls it): `sampling/staleness_max` (policy
        updates between the weights that sampled the batch and those that train it, the most over processes),
        `time/sampler_wait_s` (the trainer idle, waiting for the samples), `time/sampler_idle_s` (the worker idle
        before it sampled them), `time/weight_push_s` (the last weight push) and `rollout/prefetched` (generations
        queued beyond this one); and under TRL AsyncGRPO's names `sample/staleness_mean` and `sample/staleness_max`
        (over processes), `perf/rollout_wait_s` (the trainer's wait, the longest over processes) and
        `sample/dropped_stale_total` (samples dropped for their age over the run, all processes).
        """
        values = torch.tensor(
            [self.staleness, self.wait_seconds, self.sampler_idle_seconds, self.push_seconds],
            dtype=torch.float64,
            device=accelerator.device,
        )
        sums = torch.tensor([self.staleness, self.dropped], dtype=torch.float64, device=accelerator.device)
        if accelerator.num_processes > 1:
            values = accelerator.reduce(values, "max")
            sums = accelerator.reduce(sums, "sum")
        staleness, wait, idle, push = values.tolist()
        staleness_sum, dropped = sums.tolist()
        return {
            "sampling/staleness_max": staleness,
            "time/sampler_wait_s": wait,
            "time/sampler_idle_s": idle,
            "time/weight_push_s": push,
            "rollout/prefetched": float(self.in_flight),
            "sample/staleness_mean": staleness_sum / accelerator.num_processes,
            "sample/staleness_max": staleness,
            "perf/rollout_wait_s": wait,
            "sample/dropped_stale_total": dropped,
        }


class SourceReport(Protocol):
    """What a rollout source reports of itself for one rollout (a generation window's step, an overlapped rollout's
    staleness and waits): its metrics over all processes. Every process's source reports the same kinds in the same
    order, so that the collectives inside `metrics` pair up."""

    def metrics(self, accelerator: Accelerator) -> dict[str, float]: ...


class HeldOutRollouts(Protocol):
    """Rollouts a source keeps out of training, on which a stop rule scores the critic (value pretraining's held-out
    stored batches: [`~rollout.stored_source.StoredRolloutSource`]), so that the trainer reads them without knowing the
    source's type."""

    path: str  # where they are read from, for messages
    heldout_batches: list[int]  # the batches kept out (empty: none; the stop rule then scores the update's rollout)

    def heldout(self) -> list[Rollout]: ...

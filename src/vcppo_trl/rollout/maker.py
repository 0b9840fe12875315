"""The rollout maker: dataset rows in, a [`~rollout.types.Rollout`] with everything the PPO epochs need out.

prompts → chat template and tokenisation → the sampler (HF `generate` or vLLM) → decoding → the reward functions →
no-grad forwards (old log-probabilities, values, reference log-probabilities; [`~rollout.forwards.RolloutForwards`])
→ KL penalty → per-token rewards. Training uses all of it ([`RolloutMaker.make`]); evaluation the part up to the
rewards ([`RolloutMaker.sample_and_score`]), so a reward function sees both kinds of completions alike. The maker owns
the sampler and composes the parts that do the work: the scoring ([`~rollout.reward_scorer.RewardScorer`]),
dynamic sampling's rounds ([`~rollout.dynamic_sampling.DynamicSamplingRounds`]), the no-grad forwards, and the
penalties and per-token rewards (`rollout/shaping.py`); it reports what generation took ([`GenerationStats`]) with the
rollout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from accelerate import Accelerator
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..algo.dynamic_sampling import DynamicSamplingStats
from ..algo.losses import kl_penalty
from ..algo.micro_batches import ForwardWork
from ..episodes import episode_kind
from ..parallel.collectives import whitening_all_reduce
from ..parallel.sequence import SequenceGroup
from ..sampling.seam import Samples
from .dynamic_sampling import DynamicSamplingRounds
from .forwards import RolloutForwards
from .reward_scorer import RewardScorer
from .scoring import ScoredSamples, padded_to_multiple, prompt_text
from .settings import RolloutSettings
from .shaping import penalised_scores, token_rewards
from .types import Rollout, SourceReport, WindowMarks


@dataclasses.dataclass(frozen=True)
class GenerationStats:
    """What the sampler spent on one rollout (this process)."""

    seconds: float  # generation wall time
    tokens: int  # response tokens generated (valid ones)
    sync_seconds: float | None  # the sampler's last weight sync (vLLM), `None` for samplers that have none


@dataclasses.dataclass(frozen=True)
class RolloutStats:
    """What making one rollout measured (this process): its generation and its no-grad forwards."""

    generation: GenerationStats
    forwards: ForwardWork  # values, old and reference log-probs (reward models not counted)
    dynamic_sampling: DynamicSamplingStats | None = None  # None unless `dynamic_sampling` ran for this rollout
    reports: tuple[SourceReport, ...] = ()  # what the source reports of itself (a window's step, an overlap's waits)


class RolloutMaker:
    """
    Makes rollouts and scored samples.

    Args:
        settings ([`~rollout.settings.RolloutSettings`]): What it reads of the config.
        accelerator: The trainer's accelerator (device, process count, unwrapping).
        tokenizer: The policy's tokenizer.
        sampler: The generation backend ([`~sampling.seam.Sampler`]).
        current_model: Returns the current (prepared) [`~models.policy_and_value.PolicyAndValueModel`]; called at each use, since
            preparing the model for training replaces it.
        ref_model: The frozen reference policy, or `None` (no KL, or PEFT: the base model with adapters disabled).
        reward_funcs, reward_processing_classes: Reward functions and the tokenizers of reward models among them.
        reward_weights: `[F]` weight of each reward function.
        stop_token_ids: Ids that end a response.
        reference_is_initial_policy: Whether KL(policy ‖ reference) is exactly 0 while the policy is frozen.
        sequence_group: The sequence-parallel group of its forwards (`None`: whole sequences).
        rollout_function: TRL's `rollout_func` bound to the trainer (`prompts -> dict`), which samples in place of
            `sampler` ([`~episodes.rollout_function.function_rollouts`]); `None`: the sampler samples.
        tool_loop: TRL's `tools=`: episodes of turns and tool calls sampled by `sampler` ([`~episodes.tool_loop`]).

    The no-grad forwards (and the sequence-parallel group that splits them) are `forwarder`'s
    ([`~rollout.forwards.RolloutForwards`]), built here from `settings`, `current_model` and `ref_model`; the reward
    calls are `scorer`'s ([`~rollout.reward_scorer.RewardScorer`]), and dynamic sampling's rounds `dynamic_rounds`'s
    ([`~rollout.dynamic_sampling.DynamicSamplingRounds`]).
    """

    def __init__(
        self,
        settings: RolloutSettings,
        accelerator: Accelerator,
        *,
        tokenizer: PreTrainedTokenizerBase,
        sampler,
        current_model: Callable[[], torch.nn.Module],
        ref_model: PreTrainedModel | None,
        reward_funcs: list,
        reward_processing_classes: list,
        reward_weights: torch.Tensor,
        stop_token_ids: list[int],
        reference_is_initial_policy: bool,
        sequence_group: SequenceGroup | None = None,
        rollout_function: Callable[[list[Any]], dict[str, Any]] | None = None,
        tool_loop=None,
    ):
        self.settings = settings
        self.rollout_function = rollout_function
        self.tool_loop = tool_loop
        self.accelerator = accelerator
        self.tokenizer = tokenizer
        self.sampler = sampler
        self.forwarder = RolloutForwards(
            settings,
            accelerator,
            current_model=current_model,
            ref_model=ref_model,
            pad_token_id=tokenizer.pad_token_id,
            sequence_group=sequence_group,
        )
        self.scorer = RewardScorer(
            settings,
            accelerator,
            tokenizer=tokenizer,
            stop_token_ids=stop_token_ids,
            reward_funcs=reward_funcs,
            reward_processing_classes=reward_processing_classes,
            reward_weights=reward_weights,
        )
        self.dynamic_rounds = DynamicSamplingRounds(settings, accelerator, pad_token_id=tokenizer.pad_token_id)
        self.stop_token_ids = stop_token_ids
        self.reference_is_initial_policy = reference_is_initial_policy

    # --------------------------------------------------------- prompts to scores

    def prompt_texts(self, rows: list[dict[str, Any]]) -> list[str]:
        return [prompt_text(row["prompt"], self.tokenizer, self.settings.chat_template_kwargs) for row in rows]

    def tokenize_prompts(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        encoded = self.tokenizer(
            texts,
            return_tensors="pt",
            padding=True,
            padding_side="left",
            add_special_tokens=False,
            truncation=self.settings.max_prompt_length is not None,
            truncation_side="left",
            max_length=self.settings.max_prompt_length,
            pad_to_multiple_of=self.settings.pad_to_multiple_of,
        )
        return encoded["input_ids"].to(self.accelerator.device), encoded["attention_mask"].to(self.accelerator.device)

    @torch.no_grad()
    def generate(
        self, query_ids: torch.Tensor, query_mask: torch.Tensor, greedy: bool = False, temperature: float | None = None
    ) -> Samples:
        """
        Sample responses for left-padded prompts and cut them at the stop token, with the configured sampler (HF
        `generate` or vLLM; see [`~sampling.seam`]).

        Returns:
            [`~sampling.seam.Samples`]: response ids, mask and `has_stop` as in [`~sampling.seam.truncate_at_stop`], the
            sampler's own log-probabilities when it reports them (vLLM), and the generation's wall time.
        """
        if self.sampler is None:
            raise RuntimeError(
                "This trainer has no sampler: a critic job (value_pretrain_only with value_pretrain_dataset) holds no "
                "policy and reads its rollouts from the stored ones. Evaluation and sampling need a run with a policy."
            )
        return self.sampler.generate(
            query_ids, query_mask, greedy, temperature=temperature or self.settings.temperature
        )

    def sample_and_score(
        self,
        rows: list[dict[str, Any]],
        greedy: bool = False,
        temperature: float | None = None,
        trainer_state=None,
        num_generations: int | None = None,
    ) -> ScoredSamples:
        """
        The steps training and evaluation share: chat template and tokenization, generation with the configured
        sampler (or the `rollout_func`, given each of the `num_generations` times repeated prompts once), decoding,
        and every reward function's score with their weighted sum (`raw_scores`, nan where no function scored the
        sample). No penalty is applied here. `trainer_state` is passed to reward functions that take it (TRL's
        protocol).
        """
        batch = episode_kind(self).sample(
            rows, greedy=greedy, temperature=temperature, num_generations=num_generations
        )
        return self.scorer.score_all(
            batch.rows,
            batch.prompt_texts,
            query_ids=batch.query_ids,
            query_mask=batch.query_mask,
            samples=batch.samples,
            episodes=batch.messages,
            trainer_state=trainer_state,
        )

    # ----------------------------------------------------------- the rollout

    def make(
        self,
        rows: list[dict[str, Any]],
        train_policy: bool = True,
        trainer_state=None,
        more_rows: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> tuple[Rollout, RolloutStats]:
        """
        Generate, score and evaluate one batch of prompts.

        Args:
            rows: Dataset rows for this process.
            train_policy: When False (value-only updates) the policy does not move. The KL penalty then still
                enters the critic's targets when the reference is not the initial policy (a `ref_model` given by the
                user, or the base model of a PEFT policy whose adapter may not start at zero); only when the
                reference is a copy of the initial policy, where it is exactly 0, are the log-probabilities skipped.
            trainer_state: The trainer's `TrainerState`, for reward functions that take it.
            more_rows: Draws the next prompts of the stream, for dynamic sampling's extra rounds (policy updates with
                `dynamic_sampling` only; value-only updates see the policy's own distribution of prompts).

        Returns:
            `(rollout, stats)`: the rollout (`logprobs` is `None` under the on-policy shortcut: the learner's
            forward gives them) and what its generation and forwards took.
        """
        settings = self.settings
        dynamic = None
        if settings.dynamic_sampling and train_policy and more_rows is not None:
            rows, scored, dynamic = self.dynamic_rounds.sample_informative_groups(
                rows, more_rows, lambda batch: self.sample_and_score(batch, trainer_state=trainer_state)
            )
        else:
            scored = self.sample_and_score(rows, trainer_state=trainer_state)
        samples = scored.samples
        tokens = samples.num_tokens if dynamic is None else dynamic.generated_tokens  # every round's, for the rate
        generation = GenerationStats(samples.seconds, tokens, getattr(self.sampler, "sync_seconds", None))
        rollout, work = self.complete(rows, scored, train_policy)
        return rollout, RolloutStats(generation, work, dynamic)

    def complete(
        self,
        rows: list[dict[str, Any]],
        scored: ScoredSamples,
        train_policy: bool,
        window: WindowMarks | None = None,
    ) -> tuple[Rollout, ForwardWork]:
        """
        The rollout of scored samples: penalties, masks, the no-grad forwards (old log-probabilities, values,
        reference log-probabilities), the KL penalty and the per-token rewards. `window`: the marks of a generation
        window ([`~rollout.types.WindowMarks`]); penalties and rewards then act on finished responses only, and the
        unfinished ones get the critic's bootstrap value.
        """
        settings = self.settings
        scored = padded_to_multiple(scored, settings.pad_to_multiple_of, self.tokenizer.pad_token_id)
        rollout = penalised_rollout(rows, scored, settings, window=window)
        with_kl = self.with_kl(train_policy)
        needs_old_logprobs = train_policy and not settings.old_logprobs_from_training_forward
        work = self.forwarder.fill(rollout, compute_policy=needs_old_logprobs or with_kl, compute_reference=with_kl)
        self.add_token_rewards(rollout, with_kl)
        return rollout, work

    def with_kl(self, train_policy: bool) -> bool:
        """Whether the rollout takes the KL penalty: always when it has a coefficient, except in value-only updates
        against a reference that is a copy of the initial (frozen) policy, where it is exactly 0."""
        return self.settings.kl_coef > 0 and (train_policy or not self.reference_is_initial_policy)

    def add_token_rewards(self, rollout: Rollout, with_kl: bool) -> None:
        """The rollout's per-token KL (zeros without it) and its per-token rewards, from its forwards and scores."""
        settings = self.settings
        if with_kl:
            # On the policy's own tokens only: a tool's output is not the policy's to be charged for.
            rollout.kl = (
                kl_penalty(rollout.logprobs, rollout.ref_logprobs, settings.kl_estimator) * rollout.action_tokens
            )
        else:
            rollout.kl = torch.zeros(rollout.response_mask.shape, device=rollout.response_mask.device)
        all_reduce = whitening_all_reduce(self.accelerator, settings.advantage_whitening)
        rollout.rewards = token_rewards(
            rollout.scores,
            rollout.kl,
            rollout.value_mask,  # the score sits on a finished response's last token
            kl_coef=settings.kl_coef,
            whiten=settings.whiten_rewards,
            all_reduce=all_reduce,
        )


def penalised_rollout(
    rows: list[dict[str, Any]], scored: ScoredSamples, settings: RolloutSettings, *, window: WindowMarks | None
) -> Rollout:
    """The rollout of scored samples before its forwards: the training scores with their penalties
    ([`~rollout.shaping.penalised_scores`]), the loss mask, and a window's marks."""
    samples, raw_scores, has_stop = scored.samples, scored.raw_scores, scored.samples.has_stop
    finished = None if window is None else window.finished
    scores, overlong_penalties = penalised_scores(
        raw_scores,
        has_stop,
        lengths=samples.response_mask.sum(1),
        finished=finished,
        missing_eos_penalty=settings.missing_eos_penalty,
        response_length=settings.response_length,
        overlong_buffer_length=settings.overlong_buffer_length,
        overlong_penalty_factor=settings.overlong_penalty_factor,
    )
    done = torch.ones_like(has_stop) if finished is None else finished  # the responses with a score
    # A finished sample that no reward function could score is dropped from the losses.
    response_mask = samples.response_mask & ~(torch.isnan(raw_scores) & done).unsqueeze(1)
    return Rollout(
        prompts=[row["prompt"] for row in rows],
        completions=scored.completions,
        extra_columns={k: [row[k] for row in rows] for k in rows[0] if k != "prompt"},
        query_ids=scored.query_ids,
        query_mask=scored.query_mask,
        response_ids=samples.response_ids,
        response_mask=response_mask,
        has_stop=has_stop,
        scores=scores,
        raw_scores=raw_scores,
        rewards_per_func=scored.rewards_per_func,
        reward_failed=scored.reward_failed,
        sampler_logprobs=samples.logprobs,
        overlong_penalties=overlong_penalties,
        window_mask=None if window is None else window.window_mask & response_mask,
        finished=finished,
        action_mask=None if samples.action_mask is None else samples.action_mask & response_mask,
        episode_counts=samples.episode_counts,
        reward_columns=scored.logged_columns,
        reward_metrics=scored.logged_metrics,
    )

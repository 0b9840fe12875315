"""The rollout maker: dataset rows in, a [`~rollout.types.Rollout`] with everything the PPO epochs need out.

prompts → chat template and tokenisation → the sampler (HF `generate` or vLLM) → decoding → the reward functions →
no-grad forwards (old log-probabilities, values, reference log-probabilities; [`~rollout.forwards.RolloutForwards`])
→ KL penalty → per-token rewards. Training uses all of it ([`RolloutMaker.make`]); evaluation the part up to the
rewards ([`RolloutMaker.sample_and_score`]), so a reward function sees both kinds of completions alike. The maker owns
the sampler and the forwards, and reports what generation took ([`GenerationStats`]) with the rollout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from accelerate import Accelerator
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging

from ..algo.dynamic_sampling import DynamicSamplingStats, choose_groups, informative_groups
from ..algo.losses import kl_penalty
from ..algo.micro_batches import ForwardWork, measured
from ..parallel.collectives import max_across_processes, whitening_all_reduce
from ..parallel.sequence import SequenceGroup
from ..rewards.calls import call_reward_function
from ..rewards.reward_logs import RewardLogs, scattered_columns
from ..rewards.reward_models import reward_model_scores
from ..sampling.seam import Samples
from .episodes import sample_episodes
from .forwards import RolloutForwards
from .scoring import ScoredSamples, concat_scored, decode_completions, padded_to_multiple, prompt_text
from .settings import RolloutSettings
from .shaping import overlong_penalty, token_rewards
from .types import Rollout, SourceReport, WindowMarks, is_correct

logger = logging.get_logger(__name__)


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
            `sampler` ([`~rollout.rollout_function.function_rollouts`]); `None`: the sampler samples.
        tool_loop: TRL's `tools=`: episodes of turns and tool calls sampled by `sampler` ([`~rollout.tool_loop`]).

    The no-grad forwards (and the sequence-parallel group that splits them) are `forwarder`'s
    ([`~rollout.forwards.RolloutForwards`]), built here from `settings`, `current_model` and `ref_model`.
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
        self.reward_funcs = reward_funcs
        self.reward_processing_classes = reward_processing_classes
        self.reward_weights = reward_weights
        self.stop_token_ids = stop_token_ids
        self.reference_is_initial_policy = reference_is_initial_policy
        self.warned: set[str] = set()

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

    def score(
        self,
        rows: list[dict[str, Any]],
        prompt_texts: list[str],
        completions: list[Any],
        completion_texts: list[str],
        completion_ids: list[list[int]],
        trainer_state=None,
    ) -> tuple[torch.Tensor, torch.Tensor, RewardLogs]:
        """
        Rewards of every function for every completion, and what the functions logged (TRL's `log_extra`,
        `log_metric`).

        A function's failures on single samples (raised, timed out, NaN) give those samples `reward_failure_value`
        (see [`~rewards.calls.call_reward_function`]); a function that fails on the whole batch stops the run.

        Returns:
            `(rewards, failed)`: `[B, F]` float32 rewards on device (`nan` where a function returned `None`), and
            `[B]` bool, true where at least one function failed on the sample; the [`~rewards.RewardLogs`].
        """
        prompts = [row["prompt"] for row in rows]
        extra = {key: [row[key] for row in rows] for key in rows[0] if key not in ("prompt", "completion")}
        columns, logs = [], RewardLogs()
        failed = [False] * len(rows)
        for func, proc in zip(self.reward_funcs, self.reward_processing_classes):
            if isinstance(func, torch.nn.Module):
                texts = [p + c for p, c in zip(prompt_texts, completion_texts)]
                values = reward_model_scores(
                    func,
                    proc,
                    texts,
                    batch_size=self.settings.reward_model_batch_size,
                    max_tokens=self.settings.forwards.max_tokens,
                    max_across=max_across_processes(self.accelerator),
                )
            else:
                result = call_reward_function(
                    func,
                    prompts,
                    completions,
                    completion_ids=completion_ids,
                    extra_columns=extra,
                    timeout=self.settings.reward_timeout,
                    failure_value=self.settings.reward_failure_value,
                    max_concurrency=self.settings.reward_max_concurrency,
                    trainer_state=trainer_state,
                    **logs.kwargs(),
                )
                values = result.values
                if result.failures:
                    failed = [f or value_failed for f, value_failed in zip(failed, result.failed)]
            columns.append([float("nan") if v is None else float(v) for v in values])
        device = self.accelerator.device
        rewards = torch.tensor(columns, dtype=torch.float32, device=device).T
        return rewards, torch.tensor(failed, dtype=torch.bool, device=device), logs

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
        rows, query_ids, query_mask, samples, prompt_texts, episodes = sample_episodes(
            self, rows, greedy=greedy, temperature=temperature, num_generations=num_generations
        )
        completions, texts, completion_ids = decode_completions(
            rows,
            samples.response_ids,
            samples.response_mask,
            stop_token_ids=self.stop_token_ids,
            tokenizer=self.tokenizer,
        )
        completions = completions if episodes is None else episodes  # a tool episode's messages, as TRL gives them
        rewards_per_func, reward_failed, logs = self.score(
            rows,
            prompt_texts,
            completions,
            completion_texts=texts,
            completion_ids=completion_ids,
            trainer_state=trainer_state,
        )
        return ScoredSamples(
            query_ids,
            query_mask,
            samples,
            completions=completions,
            rewards_per_func=rewards_per_func,
            reward_failed=reward_failed,
            raw_scores=self.weighted_scores(rewards_per_func),
            logged_columns=logs.columns_for(len(rows)),
            logged_metrics=logs.metrics,
        )

    # ----------------------------------------------------------- the rollout

    def sample_informative_groups(
        self,
        rows: list[dict[str, Any]],
        more_rows: Callable[[], list[dict[str, Any]]],
        trainer_state=None,
    ) -> tuple[list[dict[str, Any]], ScoredSamples, DynamicSamplingStats]:
        """
        Dynamic sampling (`dynamic_sampling`): sample and score `rows`, then, while some process has fewer groups with
        both correct and wrong samples than its batch holds, draw the next prompts (`more_rows`) and sample again, up
        to `dynamic_sampling_max_rounds` rounds. Every process runs the same rounds (one all-reduce per round), so
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
            scored = self.sample_and_score(rows, trainer_state=trainer_state)
            drawn_rows += rows
            parts.append(scored)
            informative += informative_groups(is_correct(scored.raw_scores, settings.accuracy_threshold), k).tolist()
            short = int(sum(informative) < needed)
            if self.accelerator.num_processes > 1:
                short = max_across_processes(self.accelerator)([short])[0]
            if not short:
                break
        groups, filled = choose_groups(informative, needed)
        if filled and "dynamic_sampling_limit" not in self.warned:
            self.warned.add("dynamic_sampling_limit")
            logger.warning(
                f"Dynamic sampling: {settings.dynamic_sampling_max_rounds} generation rounds gave {sum(informative)} of the "
                f"{needed} groups with both correct and wrong responses; the batch is completed with groups that are "
                "all right or all wrong (sampling/dynamic_filled_groups counts them). Raise "
                "dynamic_sampling_max_rounds, or use prompts nearer the policy's level. (Warned once.)"
            )
        idx = [g * k + j for g in groups for j in range(k)]
        scored = concat_scored(parts, self.tokenizer.pad_token_id).select(idx)
        tokens = sum(part.samples.num_tokens for part in parts)
        stats = DynamicSamplingStats(
            len(parts), len(informative), sum(informative), filled_groups=filled, generated_tokens=tokens
        )
        return [drawn_rows[i] for i in idx], scored, stats

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
            rows, scored, dynamic = self.sample_informative_groups(rows, more_rows, trainer_state)
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
        settings, forwarder = self.settings, self.forwarder
        scored = padded_to_multiple(scored, settings.pad_to_multiple_of, self.tokenizer.pad_token_id)
        samples, raw_scores, has_stop = scored.samples, scored.raw_scores, scored.samples.has_stop
        done = torch.ones_like(has_stop) if window is None else window.finished  # the responses with a score
        scores = raw_scores.nan_to_num(0.0).clone()
        if settings.missing_eos_penalty is not None:
            scores = scores - settings.missing_eos_penalty * (~has_stop & done).float()
        overlong_penalties = None
        if settings.overlong_buffer_length is not None:  # a reward term of its own: raw_scores stay the correctness
            lengths = samples.response_mask.sum(1)
            overlong_penalties = overlong_penalty(
                lengths,
                has_stop,
                settings.response_length,
                buffer_length=settings.overlong_buffer_length,
                factor=settings.overlong_penalty_factor,
            )
            if window is not None:
                overlong_penalties = torch.where(window.finished, overlong_penalties, 0.0)
            scores = scores + torch.where(torch.isnan(raw_scores), 0.0, overlong_penalties)
        # A finished sample that no reward function could score is dropped from the losses.
        response_mask = samples.response_mask & ~(torch.isnan(raw_scores) & done).unsqueeze(1)

        rollout = Rollout(
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
            finished=None if window is None else window.finished,
            action_mask=None if samples.action_mask is None else samples.action_mask & response_mask,
            episode_counts=samples.episode_counts,
            reward_columns=scored.logged_columns,
            reward_metrics=scored.logged_metrics,
        )
        with_kl = settings.kl_coef > 0 and (train_policy or not self.reference_is_initial_policy)
        needs_old_logprobs = train_policy and not settings.old_logprobs_from_training_forward
        with measured(ForwardWork(), self.accelerator.device) as work:
            if window is None or bool(window.finished.all()):  # every response finished: nothing to bootstrap
                plan = forwarder.forward_plan(rollout)
                rollout.logprobs, rollout.values = forwarder.forward(
                    rollout, needs_old_logprobs or with_kl, plan=plan, work=work
                )
                if window is not None:
                    rollout.bootstrap_values = torch.zeros_like(rollout.scores)
            else:
                plan = None
                rollout.logprobs, rollout.values, rollout.bootstrap_values = forwarder.forward_with_bootstrap(
                    rollout, needs_old_logprobs or with_kl, work=work
                )
            if with_kl:
                rollout.ref_logprobs = forwarder.reference_logprobs(rollout, plan, work)
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
        return rollout, work

    def score_samples(
        self,
        rows: list[dict[str, Any]],
        query_ids: torch.Tensor,
        query_mask: torch.Tensor,
        samples: Samples,
        which: torch.Tensor,
        trainer_state=None,
    ) -> ScoredSamples:
        """Decode every sample and score those in `which` (`[B]` bool); the others get nan rewards and scores."""
        completions, texts, completion_ids = decode_completions(
            rows,
            samples.response_ids,
            samples.response_mask,
            stop_token_ids=self.stop_token_ids,
            tokenizer=self.tokenizer,
        )
        device = self.accelerator.device
        rewards_per_func = torch.full((len(rows), len(self.reward_funcs)), float("nan"), device=device)
        reward_failed = torch.zeros(len(rows), dtype=torch.bool, device=device)
        chosen = which.nonzero().flatten().tolist()
        logged_columns, logged_metrics = {}, {}
        if chosen:
            prompt_texts = self.prompt_texts([rows[i] for i in chosen])
            rewards, failed, logs = self.score(
                [rows[i] for i in chosen],
                prompt_texts,
                [completions[i] for i in chosen],
                completion_texts=[texts[i] for i in chosen],
                completion_ids=[completion_ids[i] for i in chosen],
                trainer_state=trainer_state,
            )
            rewards_per_func[chosen], reward_failed[chosen] = rewards, failed
            logged_columns = scattered_columns(logs.columns_for(len(chosen)), chosen, len(rows))
            logged_metrics = logs.metrics
        return ScoredSamples(
            query_ids,
            query_mask,
            samples,
            completions=completions,
            rewards_per_func=rewards_per_func,
            reward_failed=reward_failed,
            raw_scores=self.weighted_scores(rewards_per_func),
            logged_columns=logged_columns,
            logged_metrics=logged_metrics,
        )

    def weighted_scores(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """`[B]` weighted sum of the functions' rewards, nan where none applied."""
        weights = self.reward_weights.to(rewards_per_func.device)
        raw_scores = (rewards_per_func.nan_to_num(0.0) * weights).sum(dim=1)
        all_none = torch.isnan(rewards_per_func).all(dim=1)
        return torch.where(all_none, torch.full_like(raw_scores, float("nan")), raw_scores)

"""The learner: PPO epochs over one rollout, as an object with explicit inputs.

`PPOLearner.update(rollout, advantages, returns, ...)` runs `num_ppo_epochs × num_mini_batches` optimizer steps —
micro-batches, the micro-batch loss ([`~algo.objective.ppo_micro_batch_loss`]) and backward, then the optimizer's
end of each mini-batch ([`~learner.optimizer_steps.OptimizerSteps`]: clipping per model, the non-finite skip, the
optimizer and scheduler steps) — and returns the statistics of those steps, with the old log-probabilities it computed
itself under the on-policy shortcut (the rollout is not written to). It holds the prepared model the trainer gives it,
and its optimizer and scheduler in `steps`.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable

import numpy
import torch
from accelerate import Accelerator
from transformers.utils import logging

from ..algo.losses import loss_normalizer
from ..algo.masked import masked_whiten
from ..algo.micro_batches import ForwardWork, measured
from ..algo.objective import MicroBatchLoss, PPOBatch, PPOLossSettings, mean_metrics, ppo_micro_batch_loss
from ..models.forward_engine import ForwardEngine
from ..models.packing import TokenBatch
from ..parallel.collectives import micro_batch_context, whitening_all_reduce
from ..parallel.sequence import SequenceGroup
from ..rollout.types import Rollout
from .epoch_rows import EpochRowSource, OwnRows
from .optimizer_steps import OptimizerSteps
from .settings import LearnerSettings

logger = logging.get_logger(__name__)


@dataclasses.dataclass
class UpdateResult:
    """What [`PPOLearner.update`] returns."""

    stats: dict[str, float]  # the optimizer steps' statistics, averaged over micro-batches (this process)
    # `[B, T]` old log-probabilities from the training forward (the on-policy shortcut), else `None`
    old_logprobs: torch.Tensor | None = None
    # The sampler-mismatch weights the policy loss used (`[B, T]`, or `[B, 1]` per sequence), else `None`
    importance_weights: torch.Tensor | None = None
    # Tokens the PPO epochs' forwards computed (padding included) against the real ones, and their wall time
    work: ForwardWork = dataclasses.field(default_factory=ForwardWork)
    # `perf/rank_token_imbalance` (and `_before` with `balance_ranks`) with more than one process, else empty
    balance: dict[str, float] = dataclasses.field(default_factory=dict)


def mini_batch_order(size: int, *, seed: int, update_index: int, epoch: int, process_index: int) -> torch.Tensor:
    """
    The order in which one PPO epoch visits a rollout's rows: a permutation drawn from a generator of its own, seeded
    by `(seed, update, epoch, process)`. Sampling draws from torch's global generator, so a shuffle drawn there would
    depend on how the rollout was made; this one is the same whether the rollout was sampled now or read from stored
    rollouts, and after a resume.
    """
    state = numpy.random.SeedSequence([seed, update_index, epoch, process_index]).generate_state(2, dtype=numpy.uint32)
    generator = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
    return torch.randperm(size, generator=generator)


@dataclasses.dataclass
class UpdateRun:
    """What the steps of one [`PPOLearner.update`] share: the loss's batch and options, and what they accumulate."""

    batch: PPOBatch
    loss_settings: PPOLossSettings  # with this update's value clip range
    train_policy: bool
    fill_old_logprobs: bool  # the on-policy shortcut: each micro-batch's forward writes `batch.old_logprobs`
    update_index: int
    has_critic: bool
    stats: defaultdict = dataclasses.field(default_factory=lambda: defaultdict(list))
    nonfinite_steps: int = 0
    # The sampler-mismatch weights the policy loss used, over the update's rows, and over the current epoch's rows
    importance_weights: torch.Tensor | None = None
    epoch_weights: torch.Tensor | None = None

    def new_weights(self, like: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """Zeros to hold sampler-mismatch weights of `shape[0]` rows: `[B, 1]` per sequence, else `[B, T]`."""
        per_sequence = self.loss_settings.importance_sampling_mode.startswith("sequence")
        return like.new_zeros(shape[0], 1 if per_sequence else shape[1])


class PPOLearner:
    """
    Runs the PPO epochs of an update on the prepared policy-and-critic model.

    Args:
        model: The prepared (wrapped) [`~models.policy_and_value.PolicyAndValueModel`].
        optimizer: The prepared optimizer, with parameter groups tagged `role="policy"` / `role="value"`.
        lr_scheduler: The scheduler stepped once per optimizer step (a [`~learner.schedules.RoleLR`] by default), or `None`.
        accelerator: The trainer's accelerator.
        settings ([`~learner.settings.LearnerSettings`]): What it reads of the config.
        is_deepspeed: Whether the model is a DeepSpeed engine (it steps inside the last backward of a mini-batch).
        local_mini_batch_size: Sequences of this process per mini-batch.
        sequence_group: The sequence-parallel group that splits every training forward (`None`: whole sequences);
            its [`~models.forward_engine.ForwardEngine`] shares and splits the rows.
        epoch_rows: Builds, for each update, what hands each PPO epoch its rows from the mini-batch size: this
            process's own ([`~learner.epoch_rows.OwnRows`], the default), mini-batches handed out to processes by
            tokens or measured ([`~learner.epoch_rows.RankBalancer`]), or a sequence-parallel group's shared rows
            ([`~learner.sequence_group_rows.SequenceGroupRows`]); the trainer's setup chooses
            ([`~trainer.model_setup.epoch_rows`]).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        lr_scheduler,
        accelerator: Accelerator,
        settings: LearnerSettings,
        is_deepspeed: bool,
        local_mini_batch_size: int,
        sequence_group: SequenceGroup | None = None,
        epoch_rows: Callable[[int], EpochRowSource] = OwnRows,
    ):
        self.model = model
        # The optimizer and scheduler as each mini-batch ends: clipping, the non-finite skip, the roles' rates.
        self.steps = OptimizerSteps(
            model,
            optimizer,
            lr_scheduler=lr_scheduler,
            accelerator=accelerator,
            settings=settings,
            is_deepspeed=is_deepspeed,
        )
        self.accelerator = accelerator
        self.settings = settings
        # Sequence parallelism: every training forward split along the sequence across this group (the trainer's
        # setup built it, Ulysses installed; `None`: whole sequences).
        self.forwards = ForwardEngine(settings.forwards, accelerator, sequence_group)
        self.epoch_rows = epoch_rows
        self.is_deepspeed = is_deepspeed
        self.local_mini_batch_size = local_mini_batch_size

    # ------------------------------------------------------------------ update

    def update(
        self,
        rollout: Rollout,
        advantages: torch.Tensor,
        returns: torch.Tensor | None,
        train_policy: bool = True,
        value_cliprange: float | None = None,
        update_index: int = 0,
    ) -> UpdateResult:
        """
        `num_ppo_epochs × num_mini_batches` optimizer steps over one rollout.

        Each micro-batch's loss is its token (or sequence) sum divided by the count of the whole mini-batch across all
        micro-batches and processes (`loss_type`, `value_loss_type`), so the gradient of a mini-batch does not depend
        on how it is split, nor on which process runs which of its sequences: with `balance_ranks` each epoch's global
        mini-batches are handed out to processes by token count ([`~learner.epoch_rows.RankBalancer`]), and what the
        epoch computes per row comes back to the row's process. With `train_policy=False` only the value loss is
        optimised and the policy's parameters get no gradient and no optimizer step (their learning rate is also held
        at exactly 0, so no weight decay touches them).

        The steps, each a method: the batch of the loss ([`batch_of`]), then per epoch its rows and mini-batches
        ([`train_epoch`]), per mini-batch its normalisers, backward passes and optimizer step ([`train_mini_batch`]),
        per micro-batch the forward, loss and backward ([`micro_batch_backward`]).

        Args:
            rollout: The batch; `rollout.logprobs` are the old log-probabilities (`None` under the on-policy shortcut:
                this update's own forward, detached, gives them, a ratio of exactly 1).
            advantages: `[B, T]` raw advantages (whitened here for policy updates, when the estimator's are).
            returns: `[B, T]` the critic's targets (`None` without a critic).
            train_policy: `False` for value-only updates.
            value_cliprange: Clip range of the value loss (`None`: no clipping).
            update_index: The update's number from 1, for messages.
        """
        self.model.train()
        run = UpdateRun(
            batch=self.batch_of(rollout, advantages, returns=returns, train_policy=train_policy),
            loss_settings=dataclasses.replace(self.settings.loss, cliprange_value=value_cliprange),
            train_policy=train_policy,
            # On-policy shortcut: the old log-probs are this update's own forward, detached (ratio exactly 1), written
            # into the batch's tensor before each micro-batch's loss reads them.
            fill_old_logprobs=train_policy and rollout.logprobs is None,
            update_index=update_index,
            has_critic=rollout.values is not None,
        )
        tokens = TokenBatch.of(rollout)
        self.check_packing()
        # Each epoch's rows: this process's own, its global mini-batches handed out by tokens (`balance_ranks`), or a
        # sequence-parallel group's rows shared by its processes.
        balancer = self.epoch_rows(self.local_mini_batch_size)
        with measured(ForwardWork(), self.accelerator.device) as work:
            for epoch in range(self.settings.num_ppo_epochs):
                self.train_epoch(run, balancer, tokens=tokens, epoch=epoch, work=work)
        metrics = mean_metrics(run.stats) | {"diagnostics/nonfinite_steps": float(run.nonfinite_steps)}
        return UpdateResult(
            metrics,
            run.batch.old_logprobs if run.fill_old_logprobs else None,
            run.importance_weights,
            work=work,
            balance=balancer.metrics(),
        )

    def batch_of(
        self, rollout: Rollout, advantages: torch.Tensor, *, returns: torch.Tensor | None, train_policy: bool
    ) -> PPOBatch:
        """The loss's view of the rollout: its masks (the critic's tokens, the policy's, the positive examples'), the
        advantages (whitened for policy updates when the estimator's are: GAE's; a group baseline's are used as they
        are, as in TRL), the critic's targets, and the old, sampler and reference log-probs the loss reads."""
        settings = self.settings
        value_mask = rollout.value_mask  # the response mask, less unfinished responses of a generation window
        policy_mask = self.policy_mask(rollout)
        adv = advantages
        if train_policy and settings.whiten_advantages:
            adv = self.whiten(advantages, policy_mask, stats_mask=self.whitening_stats_mask(rollout))
        old_logprobs, sampler_logprobs = rollout.logprobs, rollout.sampler_logprobs
        if train_policy and old_logprobs is None:  # the on-policy shortcut fills it (see `update`)
            old_logprobs = torch.zeros(rollout.response_mask.shape, dtype=torch.float32, device=value_mask.device)
        if settings.ratio_against_sampler and sampler_logprobs is not None:  # `off_policy_ratio="behaviour"`
            old_logprobs, sampler_logprobs = sampler_logprobs.float(), None
        # vLLM sampled the rollout: weight the policy loss by π_train/π_sampler of the sampled tokens (see
        # `losses.sampler_importance_weights`). Under the on-policy shortcut the "old" log-probs are this forward's.
        return PPOBatch(
            value_mask,
            rollout.values,
            returns,
            advantages=adv,
            old_logprobs=old_logprobs,
            sampler_logprobs=sampler_logprobs if settings.correct_sampler_mismatch else None,
            policy_mask=None if policy_mask is value_mask else policy_mask,
            positive_mask=self.positive_mask(rollout, policy_mask),
            sampler_mask=None if rollout.trains_every_response_token else policy_mask,
            ref_logprobs=rollout.ref_logprobs if settings.loss.kl_loss_coef else None,
        )

    def train_epoch(
        self, run: UpdateRun, balancer: EpochRowSource, *, tokens: TokenBatch, epoch: int, work: ForwardWork
    ) -> None:
        """One PPO epoch: its rows in this epoch's order (this process's own, or handed out and brought back by the
        balancer), one optimizer step per mini-batch; what the epoch computed per row (the on-policy shortcut's old
        log-probs, the sampler-mismatch weights) goes back to the rows' owners."""
        order = mini_batch_order(
            run.batch.mask.shape[0],
            seed=self.settings.shuffle_seed,
            update_index=run.update_index,
            epoch=epoch,
            process_index=self.accelerator.process_index,
        ).to(run.batch.mask.device)
        rows = balancer.epoch(order, batch=run.batch, tokens=tokens)
        # Balanced or shared rows are the epoch's own tensors: what it computes per row goes back to the owners.
        run.epoch_weights = None if rows.moved else run.importance_weights
        plans = self.forwards.plan(rows.tokens, rows.mini_batches, rows.batch.mask.shape[1])
        for mb_idx, micro_batches in zip(rows.mini_batches, plans):
            self.train_mini_batch(
                run, rows.batch, tokens=rows.tokens, mb_idx=mb_idx, micro_batches=micro_batches, work=work
            )
        if not rows.moved:
            run.importance_weights = run.epoch_weights
            return
        if run.fill_old_logprobs:
            balancer.restore(rows, rows.batch.old_logprobs, run.batch.old_logprobs)
        if run.epoch_weights is not None:  # on every process alike: the policy's step with sampler log-probs
            if run.importance_weights is None:
                run.importance_weights = run.new_weights(run.epoch_weights, run.batch.mask.shape)
            balancer.restore(rows, run.epoch_weights, run.importance_weights)

    def train_mini_batch(
        self,
        run: UpdateRun,
        batch: PPOBatch,
        *,
        tokens: TokenBatch,
        mb_idx: torch.Tensor,
        micro_batches: list,
        work: ForwardWork,
    ) -> None:
        """One mini-batch of the epoch's rows `batch`: its loss normalisers (all processes), a backward pass per
        micro-batch, its loss statistics and one optimizer step."""
        steps, train_policy = self.steps, run.train_policy
        self.forwards.warn_over_budget(micro_batches)
        normalizers = self.loss_normalizers(batch.select(mb_idx))
        policy_normalizer, value_normalizer = normalizers[0], normalizers[1]
        # Before the backward passes (DeepSpeed steps inside the last one); the scheduler's next step restores the
        # rates. A mini-batch with no finished response (generation windows) has no critic target: the critic takes no
        # step (lr 0 leaves AdamW's parameters exactly unchanged). Likewise the policy with no token of its own
        # (`mask_truncated_completions` with every response truncated): a zero gradient would still move it by AdamW's
        # momentum and weight decay.
        if not train_policy or policy_normalizer == 0:
            steps.set_lr_to_zero("policy")
        if value_normalizer == 0:
            steps.set_lr_to_zero("value")
        # DDP and DeepSpeed average gradients over processes (× world undoes it: the normaliser is global); DeepSpeed
        # also divides by its own gradient_accumulation_steps, whatever our micro-batch count.
        world = self.accelerator.num_processes
        scale = world * (steps.deepspeed_accumulation_steps(len(micro_batches)) if self.is_deepspeed else 1)
        # The loss statistics: a process's share of the mini-batch loss times `share` averages over processes to the
        # global loss (every process of a sequence-parallel group reports the same share: the group's).
        share = world // self.forwards.row_holders
        vf_total = pg_total = lm_total = 0.0
        for i, (micro, inputs) in enumerate(self.forwards.micro_batches(tokens, micro_batches, work)):
            # Gradient accumulation over the micro-batches of one minibatch; DDP syncs on the last one only.
            is_last = i == len(micro_batches) - 1
            out = self.micro_batch_backward(
                run, batch, micro=micro, inputs=inputs, normalizers=normalizers, scale=scale, is_last=is_last
            )
            for name, value in out.metrics().items():
                run.stats[name].append(value)
            if out.value is not None:
                vf_total = vf_total + out.value.loss.detach() * share
            if train_policy:
                pg_total = pg_total + out.policy.loss.detach() * share
            if out.positive_example_lm is not None:
                lm_total = lm_total + out.positive_example_lm * share
        # This process's share of the mini-batch loss, × share: its mean over processes is the global loss.
        if run.has_critic:
            run.stats["loss/value"].append(vf_total)
        if train_policy:
            run.stats["loss/policy"].append(pg_total)
        if train_policy and batch.positive_mask is not None:
            run.stats["loss/positive_example_lm"].append(lm_total)
        grad_norms = steps.step(run.update_index)
        if grad_norms is None:
            run.nonfinite_steps += 1
        else:
            for name, value in grad_norms.items():
                run.stats[name].append(value)

    def micro_batch_backward(
        self,
        run: UpdateRun,
        batch: PPOBatch,
        *,
        micro,
        inputs: dict,
        normalizers: torch.Tensor,
        scale: float,
        is_last: bool,
    ) -> MicroBatchLoss:
        """One micro-batch: the forward (policy log-probs and entropy, the critic's values), the on-policy shortcut's
        old log-probs, the loss ([`~algo.objective.ppo_micro_batch_loss`]) and its backward pass; the sampler-mismatch
        weights the loss used are kept in the epoch's tensor."""
        idx, width = micro.indices, micro.response_width
        policy_normalizer, value_normalizer, policy_tokens, positive_tokens = normalizers
        with (
            self.forwards.attention(),
            micro_batch_context(self.accelerator, self.is_deepspeed, self.model, is_last=is_last),
        ):
            logprobs, entropy, vpred = self.model(
                temperature=self.settings.temperature,
                knobs=self.settings.knobs,
                compute_policy=run.train_policy,
                **inputs,
            )
            if run.fill_old_logprobs:
                batch.old_logprobs[idx, :width] = logprobs.detach().float()
            out = ppo_micro_batch_loss(
                run.loss_settings,
                batch.select(idx, width),
                logprobs,
                entropy=entropy,
                vpred=vpred,
                policy_normalizer=policy_normalizer,
                value_normalizer=value_normalizer,
                policy_tokens=policy_tokens,
                positive_tokens=positive_tokens,
            )
            self.accelerator.backward(out.loss * scale)
        if out.importance_weights is not None:
            if run.epoch_weights is None:
                run.epoch_weights = run.new_weights(out.importance_weights, batch.mask.shape)
            run.epoch_weights[idx, : out.importance_weights.shape[1]] = out.importance_weights
        return out

    def whiten(
        self, values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, stats_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[`~algo.masked.masked_whiten`] with the statistics `advantage_whitening` asks for (all processes, or this one),
        taken over `stats_mask` when given."""
        all_reduce = whitening_all_reduce(self.accelerator, self.settings.advantage_whitening)
        return masked_whiten(values, mask, shift_mean=shift_mean, all_reduce=all_reduce, stats_mask=stats_mask)

    def whitening_stats_mask(self, rollout: Rollout) -> torch.Tensor | None:
        """`window_whitening="finished"`: the rows of the responses that finished in this update (all of them without
        generation windows); None otherwise, or when no process finished one in this update (then every trained token
        gives the statistics)."""
        if self.settings.window_whitening != "finished":
            return None
        finished = rollout.finished_rows.sum().reshape(1)
        if self.settings.advantage_whitening != "local":  # the statistics are over every process's tokens
            finished = self.accelerator.reduce(finished, "sum")
        return rollout.finished_rows.unsqueeze(1) if int(finished) else None

    def check_packing(self) -> None:
        """Before the first padding-free forward: refuse a policy or critic that lets packed sequences attend to each
        other ([`~models.packing.check_packing`])."""
        if not self.settings.forwards.padding_free:
            return
        wrapper = self.accelerator.unwrap_model(self.model)
        vocab = wrapper.config.get_text_config().vocab_size
        self.forwards.check_packing(wrapper.models(), vocab)

    # -------------------------------------------------------------------- step

    def policy_mask(self, rollout: Rollout) -> torch.Tensor:
        """The policy loss's tokens: those it trains on in this update (`trained_tokens`: its own, a generation
        window's only), less the responses cut at `response_length` without a stop token under
        `mask_truncated_completions` (the critic still learns from them; see docs/vapo.md)."""
        if not self.settings.mask_truncated_completions:
            return rollout.trained_tokens
        return rollout.trained_tokens & ~rollout.truncated_rows.unsqueeze(1)

    def positive_mask(self, rollout: Rollout, policy_mask: torch.Tensor) -> torch.Tensor | None:
        """The tokens of the positive-example LM loss: the policy's tokens of responses judged correct by the accuracy
        metric's rule (`raw_scores > accuracy_threshold`); None when the loss is off."""
        if not self.settings.loss.positive_example_lm_coef:
            return None
        return policy_mask & rollout.is_correct(self.settings.accuracy_threshold).unsqueeze(1)

    def loss_normalizers(self, batch: PPOBatch) -> torch.Tensor:
        """
        `[policy, value, policy tokens, positive-example tokens]`: the denominators of one mini-batch's loss terms,
        summed over all processes (one all-reduce).

        `batch` holds this process's sequences of the mini-batch (all its micro-batches), so every micro-batch's loss
        is normalised by the count of the whole mini-batch (see [`~algo.losses.aggregate_loss`]); the entropy bonus and the
        LM loss are token means over the policy's and the correct responses' tokens.
        """
        length = self.settings.response_length
        policy_mask = batch.mask if batch.policy_mask is None else batch.policy_mask
        positives = batch.positive_mask
        counts = torch.stack(
            [
                loss_normalizer(policy_mask, self.settings.loss.loss_type, length),
                loss_normalizer(batch.mask, self.settings.loss.value_loss_type, length),
                policy_mask.sum().float(),
                (positives.sum() if positives is not None else policy_mask.new_zeros(())).float(),
            ]
        )
        if self.accelerator.num_processes > 1:
            counts = self.accelerator.reduce(counts, "sum")
        # Every process of a sequence-parallel group holds the group's rows: counted once.
        counts = counts / self.forwards.row_holders
        return counts

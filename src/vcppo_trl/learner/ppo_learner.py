"""The learner: PPO epochs over one rollout, as an object with explicit inputs.

`PPOLearner.update(rollout, advantages, returns, ...)` runs `num_ppo_epochs × num_mini_batches` optimizer steps —
micro-batches, the micro-batch loss ([`~algo.objective.ppo_micro_batch_loss`]), backward, gradient clipping per model, the
non-finite skip, the optimizer and scheduler steps — and returns the statistics of those steps, with the old
log-probabilities it computed itself under the on-policy shortcut (the rollout is not written to). It holds the
prepared model, optimizer and scheduler the trainer gives it, and the count of non-finite steps in a row.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections import defaultdict
from collections.abc import Callable

import numpy
import torch
from accelerate import Accelerator
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import logging

from ..algo.losses import loss_normalizer
from ..algo.masked import masked_whiten
from ..algo.micro_batches import ForwardWork, measured
from ..algo.objective import PPOBatch, mean_metrics, ppo_micro_batch_loss
from ..models.forward_engine import ForwardEngine
from ..models.packing import TokenBatch
from ..parallel.collectives import micro_batch_context, whitening_all_reduce
from ..parallel.fsdp import full_tensor
from ..parallel.sequence import SequenceGroup
from ..rollout.types import Rollout
from .optimizers import NonFiniteTrainingError, reset_optimizer_state
from .rank_exchange import EpochRowSource, OwnRows
from .schedules import RoleLR
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
            process's own ([`~learner.rank_exchange.OwnRows`], the default), mini-batches handed out to processes by
            tokens or measured ([`~learner.rank_exchange.RankBalancer`]), or a sequence-parallel group's shared rows
            ([`~learner.epoch_group_rows.SequenceGroupRows`]); the trainer's setup chooses
            ([`~trainer.setup.epoch_rows`]).
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
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.accelerator = accelerator
        self.settings = settings
        # Sequence parallelism: every training forward split along the sequence across this group (the trainer's
        # setup built it, Ulysses installed; `None`: whole sequences).
        self.forwards = ForwardEngine(settings.forwards, accelerator, sequence_group)
        self.epoch_rows = epoch_rows
        self.is_deepspeed = is_deepspeed
        self.local_mini_batch_size = local_mini_batch_size
        self.nonfinite_steps_in_a_row = 0

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
        mini-batches are handed out to processes by token count ([`~learner.rank_exchange.RankBalancer`]), and what the
        epoch computes per row comes back to the row's process. With `train_policy=False` only the value loss is
        optimised and the policy's parameters get no gradient and no optimizer step (their learning rate is also held
        at exactly 0, so no weight decay touches them).

        Args:
            rollout: The batch; `rollout.logprobs` are the old log-probabilities (`None` under the on-policy shortcut:
                this update's own forward, detached, gives them, a ratio of exactly 1).
            advantages: `[B, T]` raw advantages (whitened here for policy updates, when the estimator's are).
            returns: `[B, T]` the critic's targets (`None` without a critic).
            train_policy: `False` for value-only updates.
            value_cliprange: Clip range of the value loss (`None`: no clipping).
            update_index: The update's number from 1, for messages.
        """
        settings = self.settings
        model = self.model
        model.train()
        mask = rollout.response_mask
        value_mask = rollout.value_mask  # the response mask, less unfinished responses of a generation window
        policy_mask = self.policy_mask(rollout)
        adv = advantages
        if train_policy and settings.whiten_advantages:  # GAE's; a group baseline's are used as they are (TRL)
            adv = self.whiten(advantages, policy_mask, stats_mask=self.whitening_stats_mask(rollout))
        loss_settings = dataclasses.replace(settings.loss, cliprange_value=value_cliprange)
        # On-policy shortcut: the old log-probs are this update's own forward, detached (ratio exactly 1), written
        # into the batch's tensor before each micro-batch's loss reads them.
        fill_old_logprobs = train_policy and rollout.logprobs is None
        old_logprobs = rollout.logprobs
        if fill_old_logprobs:
            old_logprobs = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        # vLLM sampled the rollout: weight the policy loss by π_train/π_sampler of the sampled tokens (see
        # `losses.sampler_importance_weights`). Under the on-policy shortcut the "old" log-probs are this forward's.
        correct_sampler = settings.correct_sampler_mismatch
        batch = PPOBatch(
            value_mask,
            rollout.values,
            returns,
            advantages=adv,
            old_logprobs=old_logprobs,
            sampler_logprobs=rollout.sampler_logprobs if correct_sampler else None,
            policy_mask=None if policy_mask is value_mask else policy_mask,
            positive_mask=self.positive_mask(rollout, policy_mask),
            sampler_mask=None if rollout.window_mask is None and rollout.action_mask is None else policy_mask,
            ref_logprobs=rollout.ref_logprobs if settings.loss.kl_loss_coef else None,
        )
        stats = defaultdict(list)
        importance_weights = None  # filled per micro-batch from the loss's own (old log-probs may come from it)
        sequence_weights = loss_settings.importance_sampling_mode.startswith("sequence")
        nonfinite_steps = 0
        world = self.accelerator.num_processes
        tokens = TokenBatch.of(rollout)
        self.check_packing()
        # Each epoch's rows: this process's own, its global mini-batches handed out by tokens (`balance_ranks`), or a
        # sequence-parallel group's rows shared by its processes.
        balancer = self.epoch_rows(self.local_mini_batch_size)
        # The loss statistics: a process's share of the mini-batch loss times `share` averages over processes to the
        # global loss (every process of a sequence-parallel group reports the same share: the group's).
        share = world // self.forwards.row_holders
        with measured(ForwardWork(), self.accelerator.device) as work:
            for epoch in range(settings.num_ppo_epochs):
                order = mini_batch_order(
                    mask.shape[0],
                    seed=settings.shuffle_seed,
                    update_index=update_index,
                    epoch=epoch,
                    process_index=self.accelerator.process_index,
                ).to(mask.device)
                rows = balancer.epoch(order, batch=batch, tokens=tokens)
                mini_batches, epoch_batch, epoch_tokens = rows.mini_batches, rows.batch, rows.tokens
                # Balanced or shared rows are the epoch's own tensors: what it computes per row goes back to the owners.
                moved = rows.moved
                epoch_weights = None if moved else importance_weights
                plans = self.forwards.plan(epoch_tokens, mini_batches, epoch_batch.mask.shape[1])
                for mb_idx, micro_batches in zip(mini_batches, plans):
                    self.forwards.warn_over_budget(micro_batches)
                    policy_normalizer, value_normalizer, policy_tokens, positive_tokens = self.loss_normalizers(
                        epoch_batch.select(mb_idx)
                    )
                    # Before the backward passes (DeepSpeed steps inside the last one); the scheduler's next step
                    # restores the rates. A mini-batch with no finished response (generation windows) has no
                    # critic target: the critic takes no step (lr 0 leaves AdamW's parameters exactly unchanged).
                    # Likewise the policy with no token of its own (`mask_truncated_completions` with every response
                    # truncated): a zero gradient would still move it by AdamW's momentum and weight decay.
                    if not train_policy or policy_normalizer == 0:
                        self.set_lr_to_zero("policy")
                    if value_normalizer == 0:
                        self.set_lr_to_zero("value")
                    # DDP and DeepSpeed average gradients over processes (× world undoes it: the normaliser is global);
                    # DeepSpeed also divides by its own gradient_accumulation_steps, whatever our micro-batch count.
                    scale = world * (self.deepspeed_accumulation_steps(len(micro_batches)) if self.is_deepspeed else 1)
                    vf_total = pg_total = lm_total = 0.0
                    micro_inputs = self.forwards.micro_batches(epoch_tokens, micro_batches, work)
                    for i, (micro, inputs) in enumerate(micro_inputs):
                        idx, width = micro.indices, micro.response_width
                        # Gradient accumulation over the micro-batches of one minibatch; DDP syncs on the last one only.
                        is_last = i == len(micro_batches) - 1
                        with (
                            self.forwards.attention(),
                            micro_batch_context(self.accelerator, self.is_deepspeed, model, is_last=is_last),
                        ):
                            logprobs, entropy, vpred = model(
                                temperature=settings.temperature,
                                knobs=settings.knobs,
                                compute_policy=train_policy,
                                **inputs,
                            )
                            if fill_old_logprobs:
                                epoch_batch.old_logprobs[idx, :width] = logprobs.detach().float()
                            out = ppo_micro_batch_loss(
                                loss_settings,
                                epoch_batch.select(idx, width),
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
                            if epoch_weights is None:
                                shape = epoch_batch.mask.shape
                                epoch_weights = out.importance_weights.new_zeros(
                                    shape[0], 1 if sequence_weights else shape[1]
                                )
                            epoch_weights[idx, : out.importance_weights.shape[1]] = out.importance_weights
                        for name, value in out.metrics().items():
                            stats[name].append(value)
                        if out.value is not None:
                            vf_total = vf_total + out.value.loss.detach() * share
                        if train_policy:
                            pg_total = pg_total + out.policy.loss.detach() * share
                        if out.positive_example_lm is not None:
                            lm_total = lm_total + out.positive_example_lm * share
                    # This process's share of the mini-batch loss, × share: its mean over processes is the global loss.
                    if rollout.values is not None:
                        stats["loss/value"].append(vf_total)
                    if train_policy:
                        stats["loss/policy"].append(pg_total)
                    if train_policy and batch.positive_mask is not None:
                        stats["loss/positive_example_lm"].append(lm_total)
                    grad_norms = self.optimizer_step(update_index)
                    if grad_norms is None:
                        nonfinite_steps += 1
                    else:
                        for name, value in grad_norms.items():
                            stats[name].append(value)
                if not moved:
                    importance_weights = epoch_weights
                    continue
                if fill_old_logprobs:
                    balancer.restore(rows, epoch_batch.old_logprobs, old_logprobs)
                if epoch_weights is not None:  # on every process alike: the policy's step with sampler log-probs
                    if importance_weights is None:
                        importance_weights = epoch_weights.new_zeros(
                            mask.shape[0], 1 if sequence_weights else mask.shape[1]
                        )
                    balancer.restore(rows, epoch_weights, importance_weights)
        metrics = mean_metrics(stats) | {"diagnostics/nonfinite_steps": float(nonfinite_steps)}
        return UpdateResult(
            metrics,
            old_logprobs if fill_old_logprobs else None,
            importance_weights,
            work=work,
            balance=balancer.metrics(),
        )

    def whiten(
        self, values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, stats_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[`~algo.masked.masked_whiten`] with the statistics `advantage_whitening` asks for (all processes, or this one),
        taken over `stats_mask` when given."""
        all_reduce = whitening_all_reduce(self.accelerator, self.settings.advantage_whitening)
        return masked_whiten(values, mask, shift_mean=shift_mean, all_reduce=all_reduce, stats_mask=stats_mask)

    def whitening_stats_mask(self, rollout: Rollout) -> torch.Tensor | None:
        """`window_whitening="finished"`: the finished responses' rows (None otherwise, or when no process finished
        one in this update: then every window token gives the statistics)."""
        if self.settings.window_whitening != "finished" or rollout.finished is None:
            return None
        finished = rollout.finished.sum().reshape(1)
        if self.settings.advantage_whitening != "local":  # the statistics are over every process's tokens
            finished = self.accelerator.reduce(finished, "sum")
        return rollout.finished.unsqueeze(1) if int(finished) else None

    def check_packing(self) -> None:
        """Before the first padding-free forward: refuse a policy or critic that lets packed sequences attend to each
        other ([`~models.packing.check_packing`])."""
        if not self.settings.forwards.padding_free:
            return
        wrapper = self.accelerator.unwrap_model(self.model)
        vocab = wrapper.config.get_text_config().vocab_size
        self.forwards.check_packing(wrapper.models(), vocab)

    def deepspeed_accumulation_steps(self, micro_batches: int) -> int:
        """The DeepSpeed engine's `gradient_accumulation_steps` (it divides every backward's loss by it). Without a
        token budget it equals the micro-batch count (checked at setup); with one the count varies per mini-batch."""
        steps = getattr(self.model, "gradient_accumulation_steps", None)
        return int(steps()) if callable(steps) else micro_batches

    # --------------------------------------------------------- learning rates

    def set_lr_to_zero(self, role: str) -> None:
        """Hold the `"policy"` or `"value"` parameter groups for the next optimizer step."""
        for group in self.optimizer.param_groups:
            if group.get("role") == role:
                group["lr"] = 0.0

    def learning_rate(self, role: str) -> float:
        """Current learning rate of the policy's or the critic's parameter groups (nan when the role has none)."""
        for group in self.optimizer.param_groups:
            if group.get("role") == role:
                return float(group["lr"])
        return float("nan")

    def start_policy_schedule(self) -> None:
        """At the first PPO update: start the PPO phase's clocks, the policy's and the critic's (whose value-pretraining
        schedule, if any, ends here however far it got)."""
        scheduler = self.lr_scheduler
        if not isinstance(scheduler, RoleLR) or scheduler.started("policy"):
            return
        if scheduler.phases:  # (an older run resumed in pretraining keeps its critic's one clock)
            scheduler.start("value")
        scheduler.start("policy")

    def reset_policy_optimizer_state(self) -> None:
        """Forget the policy's optimizer state (see [`~learner.optimizers.reset_optimizer_state`]); done when value
        pretraining ends, so that the first PPO step is the same with and without DeepSpeed."""
        reset_optimizer_state(self.optimizer, "policy")

    # -------------------------------------------------------------------- step

    def policy_mask(self, rollout: Rollout) -> torch.Tensor:
        """The policy loss's tokens: the policy's own response tokens (no tool or environment token; a generation
        window's tokens only), less the responses cut at `response_length` without a stop token under
        `mask_truncated_completions` (the critic still learns from them; see docs/vapo.md)."""
        if rollout.window_mask is None:
            if not self.settings.mask_truncated_completions:
                return rollout.action_tokens
            return rollout.action_tokens & rollout.has_stop.unsqueeze(1)
        mask = rollout.window_mask if rollout.action_mask is None else rollout.window_mask & rollout.action_mask
        if self.settings.mask_truncated_completions:  # only a finished response is truncated; a cut one goes on
            mask = mask & ~(rollout.finished & ~rollout.has_stop).unsqueeze(1)
        return mask

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

    def optimizer_step(self, update_index: int = 0) -> dict[str, torch.Tensor] | None:
        """
        The end of a mini-batch: clip the gradients, step the optimizer unless they are non-finite, step the scheduler
        (after a skipped step too) and clear the gradients.

        Returns:
            The gradient norms before clipping (`grad_norm`, `grad_norm/policy`, `grad_norm/value`), or `None` when
            the step was skipped: the weights and optimizer state stay as they were.
        """
        norms = self.clip_gradients()
        grad_norms = None
        if norms["total"] is None or self.step_is_finite(norms["total"], update_index):
            names = (("total", "grad_norm"), ("policy", "grad_norm/policy"), ("value", "grad_norm/value"))
            grad_norms = {
                name: torch.as_tensor(norms[key]).detach().float() for key, name in names if norms.get(key) is not None
            }
            self.optimizer.step()  # a no-op under DeepSpeed, whose engine stepped in the last backward
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norms

    def clip_gradients(self) -> dict[str, torch.Tensor | None]:
        """
        Clip the policy's and the critic's gradients each to `max_grad_norm` (a large critic gradient does not shrink
        the policy's step); returns their norms before clipping and the joint norm (`"total"`).

        Under DeepSpeed the engine has already clipped the joint norm of both models (its `gradient_clipping`) inside
        the last backward: only the joint norm is returned.
        """
        settings = self.settings
        # The norms are computed even without clipping (max_norm=inf): they tell a non-finite step.
        max_norm = settings.max_grad_norm if settings.max_grad_norm and settings.max_grad_norm > 0 else math.inf
        if self.is_deepspeed:
            return {"total": self.accelerator.clip_grad_norm_(self.model.parameters(), max_norm)}
        self.accelerator.unscale_gradients()
        wrapper = self.accelerator.unwrap_model(self.model)
        norms: dict[str, torch.Tensor | None] = {}
        for role, module in (("policy", wrapper.policy), ("value", wrapper.critic)):
            params = [] if module is None else [p for p in module.parameters() if p.grad is not None]
            norms[role] = full_tensor(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else None
        present = [n.float() for n in norms.values() if n is not None]
        norms["total"] = torch.linalg.vector_norm(torch.stack(present)) if present else None
        return norms

    def step_is_finite(self, grad_norm: torch.Tensor, update_index: int = 0) -> bool:
        """
        Whether an optimizer step's gradient is finite; counts non-finite steps in a row and stops past the limit.

        One host sync per optimizer step. Under DDP the gradient is already all-reduced, so all ranks agree.
        """
        if bool(torch.isfinite(torch.as_tensor(grad_norm))):
            self.nonfinite_steps_in_a_row = 0
            return True
        self.nonfinite_steps_in_a_row += 1
        limit = self.settings.max_consecutive_nonfinite_steps
        what = "DeepSpeed has already applied it" if self.is_deepspeed else "optimizer step skipped"
        logger.warning(
            f"Non-finite loss or gradient at update {update_index}: {what} "
            f"({self.nonfinite_steps_in_a_row} in a row, limit {limit})."
        )
        if self.nonfinite_steps_in_a_row > limit:
            last = get_last_checkpoint(self.settings.output_dir) if os.path.isdir(self.settings.output_dir) else None
            raise NonFiniteTrainingError(
                f"{self.nonfinite_steps_in_a_row} optimizer steps in a row had a non-finite loss or gradient (limit "
                f"max_consecutive_nonfinite_steps={limit}); stopping. "
                + (
                    f"The last checkpoint, {last}, was saved before this and is intact: resume from it with a lower "
                    "learning rate, or check the rewards and the data."
                    if last
                    else "No checkpoint was saved yet (set save_steps to keep one)."
                )
            )
        return False

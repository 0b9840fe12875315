"""The rollout's no-grad forwards: the policy's old log-probabilities and the critic's values (with a window's bootstrap
value), and the reference's log-probabilities, micro-batch by micro-batch through a
[`~models.forward_engine.ForwardEngine`], in eval mode like generation.

Kept apart from the maker ([`~rollout.maker.RolloutMaker`], which calls [`RolloutForwards.fill`] in `complete`) because
they act on models, not on prompts and rewards: they own the sequence-parallel group that splits them and the packing
checks.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import torch
from accelerate import Accelerator
from transformers import PreTrainedModel

from ..algo.micro_batches import ForwardWork, measured
from ..models.forward_engine import ForwardEngine, ForwardPlan
from ..models.modes import eval_mode
from ..models.packing import TokenBatch
from ..models.policy_and_value import PolicyAndValueModel, response_logprobs_of
from ..parallel.sequence import SequenceGroup
from .settings import RolloutSettings
from .types import Rollout


class RolloutForwards:
    """
    Runs the rollout's no-grad forwards.

    Args:
        settings ([`~rollout.settings.RolloutSettings`]): What it reads of the config: how the forwards are cut
            (`forwards`) and the sampled distribution the log-probabilities are taken under (`temperature` and
            `knobs`).
        accelerator: The trainer's accelerator (device, process count, unwrapping).
        current_model: Returns the current (prepared) [`~models.policy_and_value.PolicyAndValueModel`]; called at
            each use, since preparing the model for training replaces it.
        ref_model: The frozen reference policy, or `None` (no KL, or PEFT: the base model with adapters disabled).
        pad_token_id: The tokenizer's pad id (the extra token of a window's bootstrap forward).
        sequence_group: The sequence-parallel group that splits every forward along the sequence (`None`: whole),
            built once by the trainer's setup with Ulysses installed in front of the models' attention (generation
            keeps the original one).
    """

    def __init__(
        self,
        settings: RolloutSettings,
        accelerator: Accelerator,
        *,
        current_model: Callable[[], torch.nn.Module],
        ref_model: PreTrainedModel | None,
        pad_token_id: int,
        sequence_group: SequenceGroup | None = None,
    ):
        self.settings = settings
        self.accelerator = accelerator
        self.current_model = current_model
        self.ref_model = ref_model
        self.pad_token_id = pad_token_id
        self.forwards = ForwardEngine(settings.forwards, accelerator, sequence_group)

    def _unwrapped_model(self) -> PolicyAndValueModel:
        return self.accelerator.unwrap_model(self.current_model())

    def forward_plan(self, rollout: Rollout) -> ForwardPlan:
        """
        The micro-batches of the rollout's no-grad forwards: `local_rollout_forward_batch_size` sequences at full
        width, or by `max_tokens_per_forward` (grouped by length, each cut to its widths or packed, the same count on
        every process; see [`~models.forward_engine.ForwardEngine`]). With a sequence-parallel group: over the rows
        of this process's group, shared first, each micro-batch split along the sequence across the group.
        """
        return self.forwards.plan_all(TokenBatch.of(rollout))

    def fill(self, rollout: Rollout, *, compute_policy: bool, compute_reference: bool) -> ForwardWork:
        """
        Fill in the rollout's no-grad forwards: its values and old log-probabilities (`None` unless
        `compute_policy`), a window's bootstrap values, and the reference's log-probabilities when
        `compute_reference`. Returns what they took.
        """
        window = not rollout.responses_are_whole
        with measured(ForwardWork(), self.accelerator.device) as work:
            if not window or bool(rollout.finished.all()):  # every response finished: nothing to bootstrap
                plan = self.forward_plan(rollout)
                rollout.logprobs, rollout.values = self.forward(rollout, compute_policy, plan=plan, work=work)
                if window:
                    rollout.bootstrap_values = torch.zeros_like(rollout.scores)
            else:
                plan = None  # the bootstrap forward is one token wider: the reference plans its own
                rollout.logprobs, rollout.values, rollout.bootstrap_values = self.forward_with_bootstrap(
                    rollout, compute_policy, work=work
                )
            if compute_reference:
                rollout.ref_logprobs = self.reference_logprobs(rollout, plan, work)
        return work

    @torch.no_grad()
    def forward(
        self,
        rollout: Rollout,
        compute_policy: bool,
        plan: ForwardPlan | None = None,
        work: ForwardWork | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Old log-probabilities (`None` unless `compute_policy`) and values of a rollout, `[B, T]` (0 after each
        micro-batch's longest response), micro-batch by micro-batch ([`forward_plan`]), in eval mode (no dropout),
        like generation."""
        model = self._unwrapped_model()
        self.check_packing(*model.models().values())
        plan = self.forward_plan(rollout) if plan is None else plan

        def run(inputs: dict) -> tuple[torch.Tensor | None, torch.Tensor]:
            logprobs, _, values = model(
                temperature=self.settings.temperature,
                knobs=self.settings.knobs,
                compute_policy=compute_policy,
                compute_entropy=False,
                **inputs,
            )
            return logprobs, values

        with eval_mode(model):
            logprobs, values = self.forwards.gather(plan, run, work=work)
        return logprobs, values

    @torch.no_grad()
    def forward_with_bootstrap(
        self, rollout: Rollout, compute_policy: bool, work: ForwardWork | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """
        [`forward`] of a window's rollout, with the critic's value after the last token of each unfinished response:
        those rows get one more (pad) token, whose value column is the critic's output at the last real token,
        V(s_cut), exactly (causal attention: the extra token changes no earlier output). Returns the `[B, T]` old
        log-probabilities (or `None`) and values, and the `[B]` bootstrap values (0 for finished rows).
        """
        unfinished = ~rollout.finished
        lengths = rollout.response_mask.sum(1)
        ids = torch.nn.functional.pad(rollout.response_ids, (0, 1), value=self.pad_token_id)
        mask = torch.nn.functional.pad(rollout.response_mask, (0, 1), value=False)
        rows = torch.arange(ids.shape[0], device=ids.device)
        mask[rows, lengths] = mask[rows, lengths] | unfinished
        extended = dataclasses.replace(rollout, response_ids=ids, response_mask=mask)
        logprobs, values = self.forward(extended, compute_policy, work=work)
        bootstrap = torch.where(unfinished, values[rows, lengths].float(), 0.0)
        width = rollout.response_ids.shape[1]
        return (None if logprobs is None else logprobs[:, :width]), values[:, :width], bootstrap

    @torch.no_grad()
    def reference_logprobs(
        self, rollout: Rollout, plan: ForwardPlan | None = None, work: ForwardWork | None = None
    ) -> torch.Tensor:
        """Log-probabilities of the response tokens under the reference policy (the base model under PEFT), `[B, T]`
        (0 after each micro-batch's longest response)."""
        reference = self.ref_model if self.ref_model is not None else self._unwrapped_model().policy
        self.check_packing(reference)
        plan = self.forward_plan(rollout) if plan is None else plan

        def run(inputs: dict) -> tuple[torch.Tensor]:
            logprobs, _ = response_logprobs_of(
                reference, self.settings.temperature, knobs=self.settings.knobs, **inputs
            )
            return (logprobs,)

        # PEFT without a reference model: the reference is the policy's base model, adapters disabled.
        adapters_off = reference.disable_adapter() if self.ref_model is None else contextlib.nullcontext()
        with adapters_off, eval_mode(reference):
            (logprobs,) = self.forwards.gather(plan, run, work=work)
        return logprobs

    def check_packing(self, *models: torch.nn.Module) -> None:
        """Before the first padding-free forward of each model: refuse one that lets packed sequences attend to each
        other ([`~models.packing.check_packing`]). Padded forwards need no check."""
        if not self.settings.forwards.padding_free:
            return
        for model in models:
            config = model.config
            if not hasattr(config, "get_text_config"):  # a DeepSpeed engine (ZeRO-3 reference): the model is inside
                config = model.module.config
            vocab = config.get_text_config().vocab_size
            self.forwards.check_packing({type(model).__name__: model}, vocab)

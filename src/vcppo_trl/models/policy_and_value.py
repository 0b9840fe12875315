"""The policy and the critic as one module (one optimizer, one `accelerator.prepare`), and the policy's log-probs."""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

from ..algo.logits_processing import NO_KNOBS, SamplingKnobs
from .logprobs import packed_response_logprobs, response_logprobs
from .packing import PackedRow, SplitRows
from .split_forwards import split_response_logprobs, split_value_forward
from .value_model import packed_value_forward, value_forward


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over attended tokens only, as `generate` does for left-padded prompts."""
    return (attention_mask.long().cumsum(1) - 1).clamp(min=0)


class PolicyAndValueModel(nn.Module):
    """
    The policy and the critic as one module, so that one optimizer (with a learning rate per model) and one
    `accelerator.prepare` (DDP or DeepSpeed) serve both, and one forward feeds the PPO loss. A critic job holds no
    policy (`policy=None`): its forwards compute values only.
    """

    def __init__(self, policy: PreTrainedModel | None, critic: PreTrainedModel | None):
        super().__init__()
        self.policy = policy
        self.critic = critic
        self.config = (policy if policy is not None else critic).config

    def models(self) -> dict[str, PreTrainedModel]:
        """The models it holds by role (`"policy"`, `"critic"`)."""
        return {name: m for name, m in (("policy", self.policy), ("critic", self.critic)) if m is not None}

    @property
    def is_gradient_checkpointing(self) -> bool:
        # transformers ≥ 5.2x renamed the flag `is_activation_checkpointing`; older versions only have the old name.
        first = next(iter(self.models().values()))
        flag = getattr(first, "is_activation_checkpointing", None)
        if flag is None:
            flag = getattr(first, "is_gradient_checkpointing", False)
        return bool(flag)

    # TRL and transformers call these by the old names (e.g. around generation); each model is asked by transformers
    # 5.2's names where it has them, so that no deprecation warning is printed.
    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        for model in self.models().values():
            if hasattr(model, "activation_checkpointing_enable"):
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=gradient_checkpointing_kwargs)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)

    def gradient_checkpointing_disable(self) -> None:
        for model in self.models().values():
            if hasattr(model, "activation_checkpointing_disable"):
                model.activation_checkpointing_disable()
            else:
                model.gradient_checkpointing_disable()

    def generate(self, *args, **kwargs):
        """The policy's `generate`: `trainer.model` is this wrapper, and a TRL `rollout_func` samples with
        `trainer.accelerator.unwrap_model(trainer.model).generate(...)`. The policy's own train/eval mode is kept."""
        if self.policy is None:
            raise RuntimeError("This model holds no policy (a critic job): it cannot generate.")
        return self.policy.generate(*args, **kwargs)

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs: dict | None = None) -> None:
        self.gradient_checkpointing_enable(activation_checkpointing_kwargs)

    def activation_checkpointing_disable(self) -> None:
        self.gradient_checkpointing_disable()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        context_length: int,
        temperature: float,
        compute_policy: bool = True,
        compute_entropy: bool = True,
        packed: PackedRow | None = None,
        split: SplitRows | None = None,
        knobs: SamplingKnobs = NO_KNOBS,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """
        Log-probabilities (and entropy) of the response tokens under the policy, and the critic's values. The
        log-probabilities and the entropy are those of the sampled distribution: at `temperature`, processed by the
        sampler's other `knobs` ([`~algo.logits_processing.SamplingKnobs`]).

        With `packed` (a padding-free micro-batch, [`~models.packing.PackedRow`]) or `split` (this process's columns
        of a sequence-parallel micro-batch, [`~models.packing.SplitRows`]) the padded inputs are ignored.

        Returns:
            `(logprobs, entropy, values)`, each `[B, T]` for the `T` tokens after `context_length` (`[b, w]` of the
            packed row's responses); the first two are `None` when `compute_policy` is False (value-only updates leave
            the policy out of the graph); `values` is `None` without a critic.
        """
        position_ids = None if split is not None or packed is not None else position_ids_from_mask(attention_mask)
        values = None
        if self.critic is not None:
            values = self.values(
                input_ids,
                attention_mask,
                context_length=context_length,
                position_ids=position_ids,
                packed=packed,
                split=split,
            )
        if not compute_policy:
            return None, None, values
        if self.policy is None:
            raise RuntimeError("This model holds no policy (a critic job): only values can be computed.")
        logprobs, entropy = response_logprobs_of(
            self.policy,
            temperature,
            input_ids=input_ids,
            attention_mask=attention_mask,
            context_length=context_length,
            packed=packed,
            split=split,
            compute_entropy=compute_entropy,
            position_ids=position_ids,
            knobs=knobs,
        )
        return logprobs, entropy, values

    def values(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        context_length: int,
        position_ids: torch.Tensor | None,
        packed: PackedRow | None = None,
        split: SplitRows | None = None,
    ) -> torch.Tensor:
        """The critic's values of the response tokens, from the same inputs as [`forward`]."""
        if split is not None:
            return split_value_forward(self.critic, split)
        if packed is not None:
            return packed_value_forward(self.critic, packed)
        return value_forward(
            self.critic, input_ids, attention_mask, position_ids=position_ids, context_length=context_length
        )


def response_logprobs_of(
    policy: nn.Module,
    temperature: float,
    *,
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    context_length: int,
    packed: PackedRow | None = None,
    split: SplitRows | None = None,
    compute_entropy: bool = False,
    position_ids: torch.Tensor | None = None,
    knobs: SamplingKnobs = NO_KNOBS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """
    Log-probabilities (and entropy) of a micro-batch's response tokens under `policy` (the policy, or the reference
    model), from the forward engine's inputs: this process's columns of a split micro-batch (`split`), one packed
    row (`packed`), or padded `input_ids` with their mask; at `temperature` and under the sampler's other `knobs`.

    Returns:
        `(logprobs, entropy)`: `[b, w]` float32 tensors; `entropy` is `None` unless `compute_entropy`.
    """
    if split is not None:
        return split_response_logprobs(policy, split, temperature, compute_entropy=compute_entropy, knobs=knobs)
    if packed is not None:
        return packed_response_logprobs(policy, packed, temperature, compute_entropy=compute_entropy, knobs=knobs)
    return policy_logprobs(
        policy,
        input_ids,
        attention_mask,
        context_length=context_length,
        temperature=temperature,
        compute_entropy=compute_entropy,
        position_ids=position_ids,
        knobs=knobs,
    )


def policy_logprobs(
    policy: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    context_length: int,
    temperature: float,
    compute_entropy: bool = False,
    position_ids: torch.Tensor | None = None,
    knobs: SamplingKnobs = NO_KNOBS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """
    Log-probabilities of the response tokens (after `context_length`), at the sampling temperature and under the
    sampler's other `knobs` (the processed distribution, [`~algo.logits_processing.processed_logprobs`]).

    The log-probability of response token `t` comes from the logits at position `context_length - 1 + t`. One backbone
    pass; the LM head is applied in vocabulary tiles, so the `[B, T, V]` logits are never materialised (see
    [`~models.logprobs.response_logprobs`]), and the prompt's logits are never computed.

    Returns:
        `(logprobs, entropy)`: `[B, T]` float32 tensors; `entropy` is `None` unless `compute_entropy`.
    """
    if position_ids is None:
        position_ids = position_ids_from_mask(attention_mask)
    return response_logprobs(
        policy,
        input_ids,
        attention_mask,
        position_ids=position_ids,
        context_length=context_length,
        temperature=temperature,
        compute_entropy=compute_entropy,
        knobs=knobs,
    )

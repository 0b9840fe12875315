"""`cast_lm_head_to_fp32`: the LM head in float32 and its logits computed in float32, whatever the autocast.

TRL GRPO's flag, with its meaning (TRL 1.16 `GRPOTrainer.__init__`): the head module of the policy and of the
reference model is cast to float32 once, at setup, and its forward upcasts the hidden states; with tied embeddings the
shared matrix becomes float32 and a hook keeps the input embeddings' output in the model's dtype. Beyond TRL, the
forward also runs with autocast off (under bf16 mixed precision, autocast would otherwise run the projection in bf16
again), and the head becomes an [`FP32LMHead`] (TRL patches the instance's `forward` instead, which neither a
`deepcopy` nor a pickled copy keeps), so that the chunked log-prob path ([`~models.logprobs.chunked_token_logprobs`]),
which reads the head's weight without calling it, computes in float32 too. Every log-prob path, HF `generate` and a
saved checkpoint (float32 head weights) follow from the module itself.
"""

from __future__ import annotations

import torch
from accelerate.utils import is_peft_model
from torch import nn
from transformers.utils import is_peft_available


class FP32LMHead(nn.Linear):
    """
    An `nn.Linear` LM head whose forward computes float32 logits with autocast off (under bf16 mixed precision,
    autocast would otherwise run the projection in bf16 whatever the operands' dtype). [`cast_lm_head_to_fp32`] gives
    a model's plain `nn.Linear` head this class in place (same parameters, same state-dict keys), so the cast survives
    `copy.deepcopy` (the reference policy) and pickling (a rollout worker's copy), which a patched `forward` would not.
    """

    # Read by FSDP2's sharding (`parallel.fsdp`), which gathers such a head in float32 under a bf16 policy.
    computes_in_float32 = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        with torch.autocast(hidden_states.device.type, enabled=False):
            return nn.functional.linear(
                hidden_states.float(), self.weight.float(), None if self.bias is None else self.bias.float()
            )


class KeepOutputDtype:
    """A forward hook that casts a module's output to `dtype`: with tied embeddings, the input embeddings (whose matrix
    the cast made float32) keep feeding the backbone in the model's dtype, as TRL's hook does. A module-level class,
    so that it pickles, and so that a rollout worker's copy can tell it from training hooks."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype

    def __call__(self, module: nn.Module, args, output: torch.Tensor) -> torch.Tensor:
        return output.to(self.dtype)


def is_fp32_head(lm_head: nn.Module) -> bool:
    """Whether `lm_head` was cast by [`cast_lm_head_to_fp32`]: its logits are computed in float32, autocast off."""
    return isinstance(lm_head, FP32LMHead)


def _peft_wrapper_types() -> tuple[type, ...]:
    if not is_peft_available():
        return ()
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper

    return (BaseTunerLayer, AuxiliaryTrainingWrapper)


def cast_lm_head_to_fp32(model: nn.Module) -> None:
    """
    Cast the LM head of `model` (a causal LM, PEFT-wrapped or not) to float32 and make it an [`FP32LMHead`], whose
    forward computes float32 logits with autocast off (the chunked log-prob path reads the class too). Idempotent.

    With tied word embeddings the one shared matrix becomes float32 (the input embedding reads it too); a forward hook
    ([`KeepOutputDtype`]) casts the embeddings' output back to the model's former dtype, as TRL does, so the backbone
    runs as before.

    Raises:
        ValueError: The head carries a PEFT adapter (LoRA on `lm_head`, or `lm_head` in `modules_to_save`), or is not
            a plain `nn.Linear` (e.g. quantized).
    """
    base = model.get_base_model() if is_peft_model(model) else model
    lm_head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if isinstance(lm_head, _peft_wrapper_types()):
        raise ValueError(
            "`cast_lm_head_to_fp32=True` is not supported when the lm_head carries a PEFT adapter (e.g. "
            "`target_modules` or `modules_to_save` includes `lm_head`): the head's float32 projection would bypass "
            "the adapter. Remove `lm_head` from the adapter's `target_modules` / `modules_to_save`, or set "
            "`cast_lm_head_to_fp32=False`."
        )
    if is_fp32_head(lm_head):
        return
    if type(lm_head) is not nn.Linear:
        raise ValueError(
            f"`cast_lm_head_to_fp32=True` needs a causal LM whose output embeddings are a plain `torch.nn.Linear`, but "
            f"{type(base).__name__}'s are {type(lm_head).__name__}. Set `cast_lm_head_to_fp32=False`."
        )
    original_dtype = lm_head.weight.dtype
    input_embeddings = base.get_input_embeddings()
    tied = input_embeddings is not None and input_embeddings.weight is lm_head.weight
    # In place: a tied matrix stays one parameter. A ZeRO-3-partitioned head keeps DeepSpeed's dtype (its shards are
    # DeepSpeed's; the DeepSpeed engine casts every unpartitioned model to bf16/fp16 at prepare anyway): its logits are
    # still computed in float32, from the gathered weights.
    if not any(hasattr(p, "ds_id") for p in lm_head.parameters()):
        lm_head.float()
    lm_head.__class__ = FP32LMHead
    if tied and original_dtype != torch.float32:
        input_embeddings.register_forward_hook(KeepOutputDtype(original_dtype))

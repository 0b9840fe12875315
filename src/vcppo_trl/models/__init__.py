"""The models: the joint policy-and-value module, log-probabilities without `[B, T, V]` logits, the critic (create,
load, check, save; LoRA), padding-free packing, the float32 LM head, eval mode outside training, and loading what a
trainer is built from.
"""

# A sequence-parallel group's rows live in parallel/row_sharing.py; their names stay importable from here too.
from ..parallel.row_sharing import TOKEN_FIELDS, group_row_shapes, padded_token_rows, share_group_rows
from .critic_peft import load_value_adapter, wrap_value_model
from .forward_engine import ForwardEngine, ForwardPlan, ForwardSettings
from .fp32_head import FP32LMHead, KeepOutputDtype, cast_lm_head_to_fp32, is_fp32_head
from .loading import (
    build_critic,
    is_zero3_partitioned,
    load_policy,
    load_reward_funcs,
    load_tokenizer,
    resolve_stop_token_ids,
)
from .logprobs import full_logits_logprobs, packed_response_logprobs, response_logprobs
from .modes import eval_mode
from .packing import PackedRow, PackingError, TokenBatch, check_packing, pack_micro_batch
from .policy_and_value import PolicyAndValueModel, policy_logprobs, position_ids_from_mask, response_logprobs_of
from .value_model import (
    as_value_model,
    check_value_model_source,
    create_value_model_from_policy,
    load_value_model,
    save_value_model,
    value_forward,
)

__all__ = [
    "ForwardEngine",
    "ForwardPlan",
    "ForwardSettings",
    "FP32LMHead",
    "KeepOutputDtype",
    "TOKEN_FIELDS",
    "response_logprobs_of",
    "PackedRow",
    "PackingError",
    "PolicyAndValueModel",
    "TokenBatch",
    "as_value_model",
    "build_critic",
    "cast_lm_head_to_fp32",
    "check_packing",
    "check_value_model_source",
    "create_value_model_from_policy",
    "eval_mode",
    "full_logits_logprobs",
    "group_row_shapes",
    "is_fp32_head",
    "is_zero3_partitioned",
    "load_policy",
    "load_reward_funcs",
    "load_tokenizer",
    "load_value_adapter",
    "load_value_model",
    "pack_micro_batch",
    "packed_response_logprobs",
    "padded_token_rows",
    "policy_logprobs",
    "position_ids_from_mask",
    "resolve_stop_token_ids",
    "response_logprobs",
    "save_value_model",
    "share_group_rows",
    "value_forward",
    "wrap_value_model",
]

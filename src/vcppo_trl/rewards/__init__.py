"""Rewards: the math-verify verifier (`math_verify_reward`, +1 / −1, the `<think>` part ignored), calling reward
functions so that a faulty one costs samples and not the run, reward models, and reward functions by name.
"""

from .async_calls import run_awaitables
from .calls import RewardCallResult, RewardFunctionError, call_reward_function, is_async_callable, run_in_threads
from .math_verify import (
    DEFAULT_THINK_TAGS,
    DEFAULT_TIMEOUT_SECONDS,
    MathVerifyReward,
    completion_to_text,
    gold_candidates,
    make_math_verify_reward,
    math_verify_reward,
    shutdown_verifier_worker,
    split_think,
    verify_answer,
)
from .reasoning_gym import reasoning_gym_dataset
from .registry import BUILTIN_REWARDS, import_dotted, resolve_reward_funcs, think_format_reward
from .reward_logs import RewardLogs, merged_columns, merged_metrics, reward_log_metrics, scattered_columns
from .reward_models import reward_func_name, reward_model_scores

__all__ = [
    "BUILTIN_REWARDS",
    "DEFAULT_THINK_TAGS",
    "DEFAULT_TIMEOUT_SECONDS",
    "MathVerifyReward",
    "RewardCallResult",
    "RewardFunctionError",
    "RewardLogs",
    "call_reward_function",
    "is_async_callable",
    "run_awaitables",
    "run_in_threads",
    "scattered_columns",
    "completion_to_text",
    "gold_candidates",
    "import_dotted",
    "make_math_verify_reward",
    "math_verify_reward",
    "merged_columns",
    "merged_metrics",
    "reasoning_gym_dataset",
    "resolve_reward_funcs",
    "reward_func_name",
    "reward_log_metrics",
    "reward_model_scores",
    "shutdown_verifier_worker",
    "split_think",
    "think_format_reward",
    "verify_answer",
]

"""Embedded toy setting: a synthetic long chain-of-thought arithmetic task, a character-level tokenizer and a tiny
model, all built in-process so that the default run needs no download and fits on a laptop CPU."""

from .cold_start import TargetAccuracyCallback, cold_start_sft
from .command_line import build_toy, toy_tools
from .defaults import (
    TOY_HIDDEN_SIZE,
    TOY_MAX_DIGITS,
    TOY_MAX_NEW_TOKENS,
    TOY_MIN_DIGITS,
    TOY_NUM_EVAL,
    TOY_NUM_HEADS,
    TOY_NUM_LAYERS,
    TOY_NUM_TRAIN,
    TOY_SFT_BATCH_SIZE,
    TOY_SFT_EVAL_SIZE,
    TOY_SFT_EVAL_STEPS,
    TOY_SFT_LEARNING_RATE,
    TOY_SFT_STEPS,
    TOY_SFT_TARGET_ACCURACY,
    TOY_SFT_WARMUP_STEPS,
)
from .evaluate import greedy_accuracy, is_correct, sampled_accuracy, teacher_forced_exact_match
from .model import build_tiny_model
from .task import (
    extract_boxed_answer,
    format_prompt,
    format_short_solution,
    format_solution,
    make_arithmetic_dataset,
    make_splits,
    response_mode,
)
from .tokenizer import build_chat_tokenizer, build_tokenizer

__all__ = [
    "TargetAccuracyCallback",
    "TOY_HIDDEN_SIZE",
    "TOY_MAX_DIGITS",
    "TOY_MAX_NEW_TOKENS",
    "TOY_MIN_DIGITS",
    "TOY_NUM_EVAL",
    "TOY_NUM_HEADS",
    "TOY_NUM_LAYERS",
    "TOY_NUM_TRAIN",
    "TOY_SFT_BATCH_SIZE",
    "TOY_SFT_EVAL_SIZE",
    "TOY_SFT_EVAL_STEPS",
    "TOY_SFT_LEARNING_RATE",
    "TOY_SFT_STEPS",
    "TOY_SFT_TARGET_ACCURACY",
    "TOY_SFT_WARMUP_STEPS",
    "build_tiny_model",
    "build_toy",
    "build_chat_tokenizer",
    "build_tokenizer",
    "cold_start_sft",
    "extract_boxed_answer",
    "format_prompt",
    "format_short_solution",
    "format_solution",
    "greedy_accuracy",
    "is_correct",
    "make_arithmetic_dataset",
    "make_splits",
    "response_mode",
    "sampled_accuracy",
    "teacher_forced_exact_match",
    "toy_tools",
]

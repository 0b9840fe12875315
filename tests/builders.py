"""The tiny tokenizer, policy, prompts, config and trainer the tests build, as plain functions (no Hub access).

tests/conftest.py's fixtures (`tokenizer`, `tiny_policy`, `toy_splits`, `tiny_config`, `make_trainer`) call them; a
test that needs its own (another seed or width, a config outside pytest's `tmp_path`) calls them with overrides. The
2-process workers in tests/integration/distributed/ build from them too (through common.py there), so this module
imports nothing from pytest and the package lazily.
"""

from __future__ import annotations

import math

# The tiny policy every test starts from: 1 layer, 32 wide, 2 heads (the toy's defaults are larger).
TINY_MODEL = dict(hidden_size=32, num_layers=1, num_heads=2)


def tiny_tokenizer():
    """The toy task's character-level tokenizer."""
    from vcppo_trl.toy.tokenizer import build_tokenizer

    return build_tokenizer()


def tiny_policy(tokenizer, seed: int = 0, **overrides):
    """The tiny toy policy (`TINY_MODEL`, weights from `seed`); `overrides` go to `build_tiny_model` (e.g.
    `hidden_size=64`, `num_layers=2`, `tie_word_embeddings=False`)."""
    from vcppo_trl.toy.model import build_tiny_model

    return build_tiny_model(tokenizer, **{**TINY_MODEL, **overrides}, seed=seed)


def tiny_splits(num_train: int = 64, num_eval: int = 16, seed: int = 0, min_digits: int = 1, max_digits: int = 3):
    """The toy's prompts: `train` and `eval` splits of 1- to 3-digit additions by default."""
    from vcppo_trl.toy.task import make_splits

    return make_splits(num_train, num_eval, seed=seed, min_digits=min_digits, max_digits=max_digits)


def length_reward(completions, **kwargs):
    """A cheap deterministic reward: +1 for responses shorter than 10 characters, −1 otherwise."""
    return [1.0 if len(c) < 10 else -1.0 for c in completions]


def tiny_config_kwargs(output_dir, cls=None, **overrides) -> dict:
    """The keyword arguments of the tests' tiny config of class `cls` (`VCPPOConfig` by default) writing under
    `output_dir`: one CPU process, 2 updates of 16 prompts (2 mini-batches of 2 micro-batches of 4), responses of
    16 tokens, no value pretraining for VC-PPO (tests that pretrain say so; the default, 100, is the paper's) and
    λ = 0.95 for the others; `overrides` replace any of them."""
    from vcppo_trl import VCPPOConfig

    kwargs = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_mini_batches=2,
        num_ppo_epochs=1,
        total_episodes=32,
        response_length=16,
        bf16=False,
        activation_checkpointing=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        learning_rate=1e-3,
        num_sample_generations=0,
        local_rollout_forward_batch_size=16,
        disable_tqdm=True,
        seed=0,
    )
    if cls is None or issubclass(cls, VCPPOConfig):
        kwargs["value_pretrain_steps"] = 0
    else:
        kwargs["lam"] = 0.95
    kwargs.update(overrides)
    return kwargs


def tiny_config(output_dir, cls=None, **overrides):
    """The tests' tiny config (see [`tiny_config_kwargs`]), an instance of `cls` (`VCPPOConfig` by default)."""
    from vcppo_trl import VCPPOConfig

    cls = cls or VCPPOConfig
    return cls(**tiny_config_kwargs(output_dir, cls, **overrides))


def tiny_trainer(cls=None, *, output_dir=None, **kwargs):
    """A trainer of class `cls` (`VCPPOTrainer` by default) with, unless given, a fresh tiny policy (seed 0),
    `length_reward`, the toy's training split, its tokenizer and `tiny_config(output_dir)`; keyword arguments are the
    constructor's."""
    from vcppo_trl import VCPPOTrainer

    if "processing_class" not in kwargs:
        kwargs["processing_class"] = tiny_tokenizer()
    if "model" not in kwargs:
        kwargs["model"] = tiny_policy(kwargs["processing_class"])
    if "args" not in kwargs:
        if output_dir is None:
            raise ValueError("tiny_trainer needs `args` or an `output_dir` for the tiny config")
        kwargs["args"] = tiny_config(output_dir)
    if "train_dataset" not in kwargs:
        kwargs["train_dataset"] = tiny_splits()["train"]
    kwargs.setdefault("reward_funcs", length_reward)
    return (cls or VCPPOTrainer)(**kwargs)


class StopAfterPretraining:
    """A callback that ends training as soon as value pretraining is done (to inspect the models at that point)."""

    def __init__(self, pretrain_callback):
        self.pretrain_callback = pretrain_callback

    def __getattr__(self, name):
        return lambda *a, **k: None

    def on_step_end(self, args, state, control, **kwargs):
        if self.pretrain_callback.done:
            control.should_training_stop = True
        return control


def weights(trainer) -> list:
    """Copies of the trainer's parameters (policy and critic)."""
    return [p.detach().clone() for p in trainer.model.parameters()]


TIMING_KEYS = ("train_runtime", "perf/rollout_wait_s")  # and every `time/...` key


def step_logs(trainer) -> dict[int, dict[str, float]]:
    """Logged metrics per update, without wall-clock timings."""
    logs = {}
    for entry in trainer.state.log_history:
        if "episode" in entry:
            # nan (e.g. explained variance of returns with nothing to explain) compares equal to itself here.
            logs[entry["step"]] = {
                k: "nan" if isinstance(v, float) and math.isnan(v) else v
                for k, v in entry.items()
                if k not in TIMING_KEYS and not k.startswith("time/")
            }
    return logs

"""What the 2-process workers beside this file (worker.py, grad_worker.py, balance_worker.py, loading_worker.py,
sp_rollout_worker.py) share: the tiny config each starts from, and the tokenizer, policy, critic, prompts and reward
they build, the same on every rank.

The workers run as scripts (under `torch.distributed.run` or `accelerate launch`, this folder first on their path)
and import it inside `main` as `from common import ...`. It puts the repository on the path after this folder, to
build from tests/builders.py as the in-process tests do.
"""

from __future__ import annotations

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if REPO not in sys.path:
    sys.path.insert(1, REPO)

from tests.builders import tiny_policy, tiny_splits, tiny_tokenizer  # noqa: E402


def worker_settings(out_dir: str, *, gloo_under_deepspeed: bool = False, **overrides) -> dict:
    """The config fields every worker starts from: output under `OUT/run`, float32, seed 0, no reporting, saving,
    sample generations or progress bars; with `gloo_under_deepspeed`, `ddp_backend="gloo"` when launched with DeepSpeed
    (configs/accelerate/zero3_cpu.yaml runs on CPU). `overrides` replace or add fields."""
    settings = dict(
        output_dir=os.path.join(out_dir, "run"),
        bf16=False,
        report_to="none",
        save_strategy="no",
        num_sample_generations=0,
        disable_tqdm=True,
        seed=0,
    )
    if gloo_under_deepspeed and os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true":
        settings["ddp_backend"] = "gloo"
    settings.update(overrides)
    return settings


def worker_config(cls, out_dir: str, *, gloo_under_deepspeed: bool = False, **overrides):
    """A `cls` (`PPOConfig`, `VCPPOConfig`) of [`worker_settings`]. Under DeepSpeed a model created once the config
    exists is created partitioned: build the models first."""
    return cls(**worker_settings(out_dir, gloo_under_deepspeed=gloo_under_deepspeed, **overrides))


def tiny_models_and_prompts(**policy_overrides):
    """The toy tokenizer, the tiny policy (seed 0; `policy_overrides` go to `tiny_policy`, e.g. `num_layers=2`) and
    the training split of 64 prompts (8 held out), built the same on every rank."""
    tokenizer = tiny_tokenizer()
    policy = tiny_policy(tokenizer, **policy_overrides)
    train = tiny_splits(64, 8)["train"]
    return tokenizer, policy, train


def tiny_critic(policy):
    """A critic on the policy's backbone, its fresh value head seeded (0) so that it is the same on every rank."""
    import torch

    from vcppo_trl.models.value_model import create_value_model_from_policy

    torch.manual_seed(0)
    return create_value_model_from_policy(policy)


def parity_reward(completions, **kwargs):
    """+1 for a response of odd length, −1 for an even one."""
    return [1.0 if len(c) % 2 else -1.0 for c in completions]

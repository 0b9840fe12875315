"""Shared fixtures: a tiny tokenizer, policy and dataset built in-process (no Hub access at test time)."""

import math
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
torch.set_num_threads(1)


UNIT_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unit") + os.sep


def pytest_collection_modifyitems(config, items):
    """The fast tier, `pytest -m fast` (about a minute on 2 cores, run it before every commit): the tests under
    tests/unit/, which build at most a tiny model in-process and launch no process; `pytest -m "not fast"` runs the
    rest (trainer runs, launches, scripts, notebooks)."""
    for item in items:
        if str(item.path).startswith(UNIT_TESTS):
            item.add_marker(pytest.mark.fast)


@pytest.fixture(scope="session")
def tokenizer():
    from vcppo_trl.toy.tokenizer import build_tokenizer

    return build_tokenizer()


@pytest.fixture
def tiny_policy(tokenizer):
    from vcppo_trl.toy.model import build_tiny_model

    return build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)


@pytest.fixture
def gloo_world_of_one(tmp_path):
    """A process group of one process (gloo) in this process: collectives and FSDP2's sharding run as on a world of
    many, without a launcher."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def toy_splits():
    from vcppo_trl.toy.task import make_splits

    return make_splits(64, 16, seed=0, min_digits=1, max_digits=3)


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


def length_reward(completions, **kwargs):
    """A cheap deterministic reward: +1 for responses shorter than 10 characters, −1 otherwise."""
    return [1.0 if len(c) < 10 else -1.0 for c in completions]


def fresh_trainer(tokenizer, toy_splits, tiny_config, **overrides):
    """A `VCPPOTrainer` on the tiny toy policy (seed 0), `length_reward` and the toy's training split, with
    `tiny_config(**overrides)`."""
    from vcppo_trl import VCPPOTrainer
    from vcppo_trl.toy.model import build_tiny_model

    policy = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    return VCPPOTrainer(
        model=policy,
        reward_funcs=length_reward,
        args=tiny_config(**overrides),
        train_dataset=toy_splits["train"],
        processing_class=tokenizer,
    )


def weights(trainer) -> list:
    """Copies of the trainer's parameters (policy and critic)."""
    return [p.detach().clone() for p in trainer.model.parameters()]


TIMING_KEYS = ("train_runtime",)  # and every `time/...` key


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


@pytest.fixture
def tiny_config(tmp_path):
    from vcppo_trl import VCPPOConfig

    def make(cls=VCPPOConfig, **overrides):
        kwargs = dict(
            output_dir=str(tmp_path / "out"),
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
        if not issubclass(cls, VCPPOConfig):
            kwargs["lam"] = 0.95
        else:
            kwargs["value_pretrain_steps"] = 0  # tests that pretrain say so (the default, 100, is the paper's)
        kwargs.update(overrides)
        return cls(**kwargs)

    return make


@pytest.fixture
def make_trainer(tiny_policy, tokenizer, toy_splits, tiny_config):
    """A trainer on the tiny policy and toy prompts; keyword arguments override any constructor argument."""
    from vcppo_trl import VCPPOTrainer

    def make(cls=VCPPOTrainer, **kwargs):
        kwargs.setdefault("model", tiny_policy)
        kwargs.setdefault("reward_funcs", length_reward)
        kwargs.setdefault("args", tiny_config())
        kwargs.setdefault("train_dataset", toy_splits["train"])
        kwargs.setdefault("processing_class", tokenizer)
        return cls(**kwargs)

    return make

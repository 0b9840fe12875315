"""Shared fixtures: a tiny tokenizer, policy, dataset, config and trainer built in-process (no Hub access at test time),
from tests/builders.py's plain functions (which tests import for what is not a fixture: `length_reward`, `step_logs`,
...)."""

import os

import pytest
import torch

from . import builders
from .builders import tiny_splits, tiny_tokenizer, tiny_trainer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
torch.set_num_threads(1)


UNIT_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unit") + os.sep


def pytest_collection_modifyitems(config, items):
    """The fast tier, `pytest -m fast` (about a minute on 2 cores, run it before every commit): the tests under
    tests/unit/, which build at most a tiny model in-process and launch no trainer or launcher process (only the sandbox
    tests start short `python -I` children, the sandbox being what they test); `pytest -m "not fast"` runs the rest
    (trainer runs, launches, scripts, notebooks)."""
    for item in items:
        if str(item.path).startswith(UNIT_TESTS):
            item.add_marker(pytest.mark.fast)


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture
def tiny_policy(tokenizer):
    return builders.tiny_policy(tokenizer)


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
    return tiny_splits()


@pytest.fixture
def tiny_config(tmp_path):
    """`tiny_config(cls=VCPPOConfig, **overrides)`: the tests' tiny config ([`builders.tiny_config_kwargs`]) writing
    under `tmp_path / "out"`."""

    def make(cls=None, **overrides):
        return builders.tiny_config(overrides.pop("output_dir", tmp_path / "out"), cls, **overrides)

    return make


@pytest.fixture
def make_trainer(tiny_policy, tokenizer, toy_splits, tiny_config):
    """A trainer on the tiny policy and toy prompts; keyword arguments override any constructor argument."""

    def make(cls=None, **kwargs):
        if "args" not in kwargs:
            kwargs["args"] = tiny_config()
        defaults = dict(model=tiny_policy, train_dataset=toy_splits["train"], processing_class=tokenizer)
        return tiny_trainer(cls, **{**defaults, **kwargs})

    return make


@pytest.fixture
def fresh_trainer(tokenizer, toy_splits, tiny_config):
    """`fresh_trainer(**overrides)`: a `VCPPOTrainer` on a fresh tiny policy (seed 0; a new one on every call),
    `length_reward` and the toy's training split, with `tiny_config(**overrides)`."""

    def make(**overrides):
        return tiny_trainer(
            model=builders.tiny_policy(tokenizer),
            args=tiny_config(**overrides),
            train_dataset=toy_splits["train"],
            processing_class=tokenizer,
        )

    return make

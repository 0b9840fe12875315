"""The mode a model runs in outside training: [`eval_mode`], shared by generation and the rollout's no-grad forwards
so that both see the same model (no dropout)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """Run `module` in eval mode (dropout off) and restore each submodule's own training flag afterwards."""
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in flags:
            m.training = training

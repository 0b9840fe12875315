"""A probe for the windows-remedy follow-up 2 (results/windows_remedy/plan.md): responses sampled in generation
windows as usual, but each trained once, in the update in which it finishes, on all its tokens, with whole-response
GAE and whitening; unfinished responses go on in the pool untrained. It separates sampling a response in windows
(successive policies, the pool's finishing order) from training it window by window. Experiment-only: a trainer
subclass, not a package option."""

from __future__ import annotations

import torch


def finished_response_tokens(response_mask: torch.Tensor, finished: torch.Tensor) -> torch.Tensor:
    """`[B, T]` bool: every token of the responses that finished in this update, none of the others."""
    return response_mask.bool() & finished.bool().unsqueeze(1)


def train_when_finished_trainer(base: type) -> type:
    """`base` (VCPPOTrainer or a subclass) whose policy trains on the finished responses' whole tokens instead of this
    window's: the rollout's `window_mask` is replaced before the advantages are computed, so GAE runs over the whole
    response (a finished response has no bootstrap), whitening and the diagnostics read those tokens, and the old
    log-probs are the rollout forward's at the finish. Refused without windows or with tool tokens."""

    class TrainWhenFinishedTrainer(base):
        def compute_advantages(self, rollout):
            if not getattr(self, "in_value_pretraining", False):
                if rollout.window_mask is None or rollout.action_mask is not None:
                    raise ValueError(
                        "train-when-finished probes generation windows without tools: set generation_window, and "
                        "run it without tools or an env_mask."
                    )
                rollout.window_mask = finished_response_tokens(rollout.response_mask, rollout.finished)
            return super().compute_advantages(rollout)

    TrainWhenFinishedTrainer.__name__ = f"TrainWhenFinished{base.__name__}"
    return TrainWhenFinishedTrainer

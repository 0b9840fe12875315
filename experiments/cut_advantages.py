"""A probe for the windows-remedy follow-up (results/windows_remedy/plan.md, follow-up 1): whole responses whose
policy advantages are cut every `segment` response tokens as a generation window's are — GAE over each segment's δ
alone, with the critic's value at the segment's end as the tail (0 where the response ends inside it) — while the
critic's targets stay whole-response. Experiment-only: a trainer subclass, not a package option."""

from __future__ import annotations

import torch

from vcppo_trl.algo import dual_lambda_gae


def cut_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    gamma: float,
    lam_actor: float | torch.Tensor,
    segment: int,
) -> torch.Tensor:
    """Advantages `[B, T]` with GAE restarted at every multiple of `segment`: for t in [kW, (k+1)W),
    A_t = Σ_{j < (k+1)W − t} (γλ)^j δ_{t+j} (δ over the response's own values), each segment computed by
    `dual_lambda_gae` with `bootstrap_values` = V at the segment's end, as the windowed path bootstraps at a cut."""
    if segment < 1:
        raise ValueError(f"segment must be a positive number of tokens, got {segment}.")
    length = rewards.shape[1]
    lengths = response_mask.bool().sum(dim=1)
    advantages = torch.zeros(rewards.shape, dtype=torch.float32, device=rewards.device)
    for start in range(0, length, segment):
        end = min(start + segment, length)
        # The response goes on past the segment: the state after its last token is V at `end`; else terminal.
        goes_on = lengths > end
        tail = values[:, end] if end < length else torch.zeros_like(values[:, 0])
        bootstrap = torch.where(goes_on, tail, torch.zeros_like(tail))
        advantages[:, start:end], _ = dual_lambda_gae(
            rewards[:, start:end],
            values[:, start:end],
            response_mask[:, start:end],
            gamma=gamma,
            lam_actor=lam_actor,
            lam_critic=1.0,
            bootstrap_values=bootstrap,
        )
    return advantages


def cut_advantage_trainer(base: type, segment: int) -> type:
    """`base` (VCPPOTrainer or a subclass: its `actor_lambda`) with the policy's advantages cut every `segment` tokens
    after value pretraining; the critic's returns are `base`'s. Refused under windows or with tool tokens."""

    class CutAdvantagesTrainer(base):
        def compute_advantages(self, rollout):
            advantages, returns = super().compute_advantages(rollout)
            if getattr(self, "in_value_pretraining", False):
                return advantages, returns
            if rollout.bootstrap_values is not None or rollout.action_mask is not None:
                raise ValueError(
                    "cut advantages probe whole responses without tools: run it without generation_window, tools or "
                    "an env_mask."
                )
            cut = cut_advantages(
                rollout.rewards,
                rollout.values,
                rollout.response_mask,
                gamma=self.args.gamma,
                lam_actor=self.actor_lambda(rollout.action_tokens),
                segment=segment,
            )
            return cut, returns

    CutAdvantagesTrainer.__name__ = f"CutAdvantages{base.__name__}"
    return CutAdvantagesTrainer

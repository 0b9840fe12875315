"""The accuracy-link toy's candidate tasks `sum-mod-5` and `parity` (`vcppo_trl.toy.running_sum`): their budget and
task assets (the splits, the reasoning-lines metric logged beside the verifier, the toy policy's size, the reward
model's truncated prefixes). Chosen or dropped by the rules in `results/accuracy_link/plan.md`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from task_addition import Budget


@dataclass(frozen=True)
class RunningSumBudget(Budget):
    """The running-sum task: the sum of 15–31 digits modulo `modulus`, one running sum per line, where an answer given
    before the last line is right only by chance. The cold start mixes complete solutions with ones stopped at a random
    line (`early_stop_fraction`), with the majority task's model and steps (plan.md §1). `short_fraction` is unused."""

    short_fraction: float = 0.0
    cold_start_steps: int = 2200
    modulus: int = 5
    min_digits: int = 15
    max_digits: int = 31
    early_stop_fraction: float = 0.5
    toy_hidden_size: int = 96
    toy_num_layers: int = 2
    response_length: int = 192  # complete responses are 87-167 tokens
    rm_prefixes_per_response: int = 1
    rm_samples: int = 640

    def asset_key(self) -> dict[str, Any]:
        keys = (
            "num_train",
            "num_eval",
            "cold_start_steps",
            "modulus",
            "min_digits",
            "max_digits",
            "early_stop_fraction",
            "toy_hidden_size",
            "toy_num_layers",
        )
        return {"task": "running_sum", **{k: getattr(self, k) for k in keys}}

    def splits(self, cold_start: bool = False):
        """The train/test splits (seed 0 for every run: the same problems, whatever the seed)."""
        from vcppo_trl.toy.running_sum import make_running_sum_splits

        return make_running_sum_splits(
            self.num_train,
            self.num_eval,
            seed=0,
            modulus=self.modulus,
            min_digits=self.min_digits,
            max_digits=self.max_digits,
            early_stop_fraction=self.early_stop_fraction,
        )

    def logged_rewards(self) -> list:
        """Reward functions logged with weight 0 (never trained on) beside the verifier: a length-mode metric."""
        from vcppo_trl.toy.running_sum import reasoning_lines_reward

        return [reasoning_lines_reward]

    def model_size(self) -> dict[str, int]:
        return {"hidden_size": self.toy_hidden_size, "num_layers": self.toy_num_layers}

    def reward_model_prefixes(self) -> int:
        return self.rm_prefixes_per_response

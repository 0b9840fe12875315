"""VAPO (arXiv 2504.05118, ByteDance Seed): VC-PPO's successor as a preset of the same trainer.

VAPO keeps VC-PPO's value pretraining and decoupled GAE and adds length-adaptive GAE, the token-level loss,
clip-higher, a positive-example LM loss and group sampling. Every one of those is a field of [`VCPPOConfig`]; a
[`VAPOConfig`] only changes their defaults to the paper's, and [`VAPOTrainer`] is [`VCPPOTrainer`] with that config
and VAPO's name on its model cards. See docs/vapo.md for each technique, its field and the paper's ablation.
"""

from __future__ import annotations

from ..config.vapo import VAPOConfig
from .vcppo import VCPPOTrainer


class VAPOTrainer(VCPPOTrainer):
    """
    VAPO: [`VCPPOTrainer`] with a [`VAPOConfig`] (the paper's defaults). Same arguments as [`PPOTrainer`].

    Any [`VCPPOConfig`] works too (VAPO is a set of defaults, not another algorithm); a bare `args=None` builds a
    [`VAPOConfig`].
    """

    _tag_names = ["trl", "ppo", "vc-ppo", "vapo", "vcppo-trl"]
    _name = "VAPO"
    _config_class = VAPOConfig
    _paper = {
        "title": "VAPO: Efficient and Reliable Reinforcement Learning for Advanced Reasoning Tasks",
        "id": "2504.05118",
    }

"""[`VAPOConfig`]: [`VCPPOConfig`] with VAPO's settings (arXiv 2504.05118) as its defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from .field_docs import document_fields
from .vcppo import VCPPOConfig


@document_fields
@dataclass
class VAPOConfig(VCPPOConfig):
    r"""
    [`VCPPOConfig`] with VAPO's settings (arXiv 2504.05118, §5.1 "Training Details", items 1–7, and the basic-PPO
    settings it keeps). `VAPOConfig()` builds as is; what depends on the hardware and the number of processes (prompts
    per update, mini-batches, response length) is set by a recipe (configs/recipes/vapo_*.yaml).

    It adds no field and no check: it changes the defaults of `exp_name`, `learning_rate`, `value_learning_rate`,
    `lr_scheduler_type`, `value_pretrain_steps`, `value_pretrain_min_steps`, `lam_actor_length_alpha`,
    `cliprange_high`, `positive_example_lm_coef`, `num_generations` and `per_device_train_batch_size`, each field's
    `help` saying where the paper sets it (listed at the end of this docstring); [`VCPPOConfig`]'s checks apply.

    The token-level loss (item 5) is `loss_type="token_mean"`, already the default. The paper does not state a KL
    penalty, an entropy bonus, the sampling temperature, dynamic sampling or overlong shaping: `kl_coef` stays 0
    (VC-PPO's), `entropy_coef` 0, `temperature` [`PPOConfig`]'s, and the DAPO options off.
    """

    # Defaults that differ from VCPPOConfig, with where the paper sets them
    exp_name: str = field(default="vapo", metadata={"help": "Name of this experiment."})
    learning_rate: float = field(
        default=1e-6, metadata={"help": "The policy's learning rate (VAPO §5.1: 1e-6, kept from basic PPO)."}
    )
    value_learning_rate: float | None = field(
        default=2e-6,
        metadata={"help": "The critic's learning rate (VAPO §5.1: 2e-6, 'the critic needs to update faster')."},
    )
    lr_scheduler_type: str = field(
        default="constant_with_warmup",
        metadata={
            "help": "Learning-rate schedule (VAPO §5.1's warmup-constant). The paper does not give the warmup "
            "length: warmup_steps stays 0 unless a recipe sets it."
        },
    )
    value_pretrain_steps: int = field(
        default=50,
        metadata={"help": "Value-pretraining updates (VAPO §5.1 item 1: 'a value network warmup for 50 steps')."},
    )
    value_pretrain_min_steps: int = field(
        default=50,
        metadata={
            "help": "Never stop value pretraining early before this many updates; with value_pretrain_steps 50, "
            "VAPO's warmup is exactly 50 updates (no early stop)."
        },
    )
    lam_actor_length_alpha: float | None = field(
        default=0.05,
        metadata={
            "help": "Length-adaptive GAE, λ_policy = 1 − 1/(α·l) per response of length l (VAPO §5.1 item 3, §4.2: "
            "α = 0.05). λ_critic stays 1.0 (item 2, decoupled GAE)."
        },
    )
    cliprange_high: float | None = field(
        default=0.28,
        metadata={"help": "Clip-higher ε_high (VAPO §5.1 item 4, as DAPO: 0.28, with cliprange ε_low 0.2)."},
    )
    positive_example_lm_coef: float = field(
        default=0.1, metadata={"help": "The positive-example LM loss weight μ (VAPO §5.1 item 6, §4.3: 0.1)."}
    )
    num_generations: int = field(
        default=16,
        metadata={"help": "Samples per prompt (VAPO §5.1 item 7, group sampling: 512 prompts × 16 samples)."},
    )
    per_device_train_batch_size: int = field(
        default=16,
        metadata={
            "help": "Sequences per micro-batch and process: one 16-sample group by default, so that a bare config "
            "builds (num_generations must divide each process's sequences per update). Recipes set the real size."
        },
    )

"""[`VAPOConfig`]: [`VCPPOConfig`] with VAPO's settings (arXiv 2504.05118) as its defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from .vcppo import VCPPOConfig


@dataclass
class VAPOConfig(VCPPOConfig):
    r"""
    [`VCPPOConfig`] with VAPO's settings (arXiv 2504.05118, §5.1 "Training Details", items 1–7, and the basic-PPO
    settings it keeps). `VAPOConfig()` builds as is; what depends on the hardware and the number of processes (prompts
    per update, mini-batches, response length) is set by a recipe (configs/recipes/vapo_*.yaml).

    Parameters:
        > Parameters whose default values differ from [`VCPPOConfig`], with where the paper sets them

        exp_name (`str`, defaults to `"vapo"`): Name of the experiment.
        learning_rate (`float`, defaults to `1e-6`): The policy's learning rate (§5.1, kept from basic PPO).
        value_learning_rate (`float`, defaults to `2e-6`): The critic's (§5.1: "the critic needs to update faster").
        lr_scheduler_type (`str`, defaults to `"constant_with_warmup"`): §5.1's "warmup-constant" schedule. The paper
            does not give the warmup length: `warmup_steps` stays 0 unless a recipe sets it.
        value_pretrain_steps (`int`, defaults to `50`): §5.1 item 1, "a value network warmup for 50 steps".
        value_pretrain_min_steps (`int`, defaults to `50`): With it, the warmup is exactly 50 updates (no early stop).
        lam_actor_length_alpha (`float`, defaults to `0.05`): Length-adaptive GAE, λ_policy = 1 − 1/(α·l) (§5.1 item
            3, §4.2). λ_critic stays 1.0 (item 2, decoupled GAE).
        cliprange_high (`float`, defaults to `0.28`): Clip-higher, ε_high 0.28 with ε_low = `cliprange` 0.2 (item 4).
        positive_example_lm_coef (`float`, defaults to `0.1`): The positive-example LM loss weight μ (item 6, §4.3).
        num_generations (`int`, defaults to `16`): Group sampling, 16 samples per prompt (item 7: 512 prompts × 16).
        per_device_train_batch_size (`int`, defaults to `16`): One group per micro-batch, so that a bare config
            builds (`num_generations` must divide each process's sequences per update). Recipes set the real size.

        The token-level loss (item 5) is `loss_type="token_mean"`, already the default. The paper does not state a KL
        penalty, an entropy bonus, the sampling temperature, dynamic sampling or overlong shaping: `kl_coef` stays 0
        (VC-PPO's), `entropy_coef` 0, `temperature` [`PPOConfig`]'s, and the DAPO options off.
    """

    exp_name: str = field(default="vapo", metadata={"help": "Name of this experiment."})
    learning_rate: float = field(default=1e-6, metadata={"help": "Policy learning rate (VAPO §5.1: 1e-6)."})
    value_learning_rate: float | None = field(
        default=2e-6, metadata={"help": "Critic learning rate (VAPO §5.1: 2e-6)."}
    )
    lr_scheduler_type: str = field(
        default="constant_with_warmup", metadata={"help": "Learning-rate schedule (VAPO §5.1: warmup-constant)."}
    )
    value_pretrain_steps: int = field(
        default=50, metadata={"help": "Value-pretraining updates (VAPO §5.1: a value network warmup for 50 steps)."}
    )
    value_pretrain_min_steps: int = field(
        default=50, metadata={"help": "Never stop value pretraining early before this many updates."}
    )
    lam_actor_length_alpha: float | None = field(
        default=0.05, metadata={"help": "Length-adaptive λ_policy = 1 − 1/(α·l) (VAPO: α = 0.05)."}
    )
    cliprange_high: float | None = field(
        default=0.28, metadata={"help": "Clip-higher ε_high (VAPO/DAPO: 0.28, with cliprange ε_low 0.2)."}
    )
    positive_example_lm_coef: float = field(
        default=0.1, metadata={"help": "Positive-example LM loss weight μ (VAPO: 0.1)."}
    )
    num_generations: int = field(default=16, metadata={"help": "Samples per prompt (VAPO group sampling: 16)."})
    per_device_train_batch_size: int = field(
        default=16, metadata={"help": "Sequences per micro-batch and process (one 16-sample group by default)."}
    )

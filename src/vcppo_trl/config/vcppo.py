"""[`VCPPOConfig`]: [`PPOConfig`] plus VC-PPO's fields (value pretraining, decoupled GAE)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from .field_docs import document_fields
from .ppo import PPOConfig, _require_at_least, _require_nonnegative, _require_positive, _require_unit_interval


@document_fields
@dataclass
class VCPPOConfig(PPOConfig):
    r"""
    Configuration for [`VCPPOTrainer`]: [`PPOConfig`] plus VC-PPO's two changes (arXiv 2503.01491).

    `VCPPOConfig()` is VC-PPO out of the box: value pretraining on (up to 100 updates, the paper's best), decoupled GAE
    with λ_actor 0.95 and λ_critic 1.0, and no KL penalty (`kl_coef=0`: a rule-based verifier cannot be reward-hacked,
    and no reference model is then loaded). Everything else keeps TRL's PPO defaults (e.g. `learning_rate` 3e-6; the
    paper used 1e-6 for the policy and 2e-6 for the critic on a 32B model).

    Decoupled GAE replaces `lam`: the critic's targets use `lam_critic` (1.0: Monte-Carlo returns, no decay of the
    end-of-sequence reward) and the policy's advantages use `lam_actor` (paper: 0.95 to 0.99).

    Value pretraining trains the critic alone on rollouts of the frozen initial policy with λ = 1 for up to
    `value_pretrain_steps` updates, stopping earlier (never before `value_pretrain_min_steps`) when the value loss stops
    improving for `value_pretrain_patience` updates, or when the explained variance reaches
    `value_pretrain_stop_explained_variance`. The critic is then saved under `output_dir/value_pretrained` and PPO
    starts. A later run starts from it with `value_model_path` and skips the phase.

    Learning-rate schedules: the policy's (`lr_scheduler_type`, warmup) spans the PPO updates only and starts at the
    first of them; the critic's spans value pretraining and PPO (see [`~learner.schedules.RoleLR`]).

    Each field is documented once, by its `help` (listed at the end of this docstring). [`PPOConfig`]'s groups and
    checks come first; the groups this class adds, each under a comment header, and their checks (run in this order
    after [`PPOConfig`]'s):

    - Defaults that differ from PPOConfig [none]: `exp_name`, `lam` (refused by `_check_decoupled_gae`), `kl_coef`.
    - Decoupled GAE [`_check_decoupled_gae`]: `lam_actor`, `lam_critic`, `lam_actor_length_alpha`.
    - Value pretraining [`_check_value_pretraining`]: `value_pretrain_steps`, `value_pretrain_stop_explained_variance`,
      `value_pretrain_patience`, `value_pretrain_min_delta`, `value_pretrain_min_steps`, `value_pretrain_save_steps`,
      `value_pretrain_cliprange_value`, `value_pretrain_dataset`, `value_pretrain_heldout_batches`,
      `value_pretrain_only`, `value_model_path`.
    - Pushing the pretrained critic to the Hub [none]: `value_pretrain_push`, `value_pretrain_hub_model_id`.
    """

    _uses_lam: ClassVar[bool] = False

    # Defaults that differ from PPOConfig
    exp_name: str = field(default="vcppo", metadata={"help": "Name of this experiment."})
    lam: float | None = field(
        default=None,
        metadata={"help": "Unused by VC-PPO (setting it is an error): lam_actor and lam_critic replace it."},
    )
    kl_coef: float = field(
        default=0.0,
        metadata={
            "help": "KL penalty coefficient, as in PPOConfig: 0 (the paper's setting; no reference model) instead of "
            "TRL's 0.05."
        },
    )

    # Decoupled GAE
    lam_actor: float = field(
        default=0.95,
        metadata={"help": "GAE lambda of the policy's advantages (the paper's ablation: 0.95-0.99 best, 1.0 worst)."},
    )
    lam_critic: float = field(default=1.0, metadata={"help": "GAE lambda of the critic's value targets."})
    lam_actor_length_alpha: float | None = field(
        default=None,
        metadata={
            "help": "Length-adaptive λ_actor (VAPO, arXiv 2504.05118): each response of length l uses "
            "λ = 1 − 1/(α·l) (clipped to [0, 1]) instead of lam_actor. VAPO used α = 0.05."
        },
    )

    # Value pretraining
    value_pretrain_steps: int = field(
        default=100,
        metadata={
            "help": "Maximum number of value-pretraining updates; 0 disables it. The paper found 100 best (AIME "
            "20.6 / 30.1 / 25.1 after 50 / 100 / 150 steps: 150 over-fitted)."
        },
    )
    value_pretrain_stop_explained_variance: float | None = field(
        default=None,
        metadata={
            "help": "Stop value pretraining once the explained variance of an update reaches this value. None (off) "
            "by default: how much of the return variance a critic can explain depends on the task (sampling noise "
            "it cannot predict), so no threshold fits every task."
        },
    )
    value_pretrain_patience: int | None = field(
        default=20,
        metadata={
            "help": "Stop value pretraining when the value loss has not improved by at least "
            "value_pretrain_min_delta (relative) over this many updates: the slow 'knowledge injection' stage has "
            "flattened and further updates only cost rollouts. None: off."
        },
    )
    value_pretrain_min_delta: float = field(
        default=0.01, metadata={"help": "Relative value-loss improvement that resets the patience counter."}
    )
    value_pretrain_min_steps: int = field(
        default=50,
        metadata={
            "help": "Never stop value pretraining early before this many updates (the paper's 50-step critic was "
            "clearly worse than its 100-step one)."
        },
    )
    value_pretrain_save_steps: list[int] | None = field(
        default=None,
        metadata={
            "help": "Pretraining steps at which to also save the critic, e.g. 50 100 150 (the paper compared them), "
            "under output_dir/value_pretrained-step-<n>."
        },
    )
    value_pretrain_cliprange_value: float | None = field(
        default=None,
        metadata={
            "help": "Value clip range during value pretraining. None: cliprange_value, as PPO updates do; inf turns "
            "clipping off there. Clipping around the rollout's values lets a value move at most ε per rollout: off, "
            "a critic that starts far from its targets aligns its range in fewer rollouts, but on the toy it then "
            "over-fitted each rollout (explained variance on the next rollouts 0.04-0.11 without clipping vs "
            "0.09-0.18 with it, 3 seeds, 10× the recipe's value learning rate); at the recipe's learning rate "
            "clipping never binds (clip fraction <= 0.5 %%)."
        },
    )
    value_pretrain_dataset: str | None = field(
        default=None,
        metadata={
            "help": "Stored rollouts of the initial policy (the folder train.py --store_rollouts wrote, or a Hub "
            "dataset id) that value pretraining reads instead of sampling: update u trains on stored batch u "
            "(cycling, i.e. several epochs, when the phase runs more updates than there are batches). Refused when "
            "the stored policy, tokenizer, sampling settings, reward functions or process layout differ from this "
            "run's (the error names the field). See docs/critic_pretraining.md."
        },
    )
    value_pretrain_heldout_batches: int = field(
        default=0,
        metadata={
            "help": "With value_pretrain_dataset, the last this many stored batches are never trained on; the stop "
            "rule then reads the critic's value loss and explained variance on them after each update (on reused "
            "rollouts the update's own fit is optimistic)."
        },
    )
    value_pretrain_only: bool = field(
        default=False,
        metadata={
            "help": "A critic job: training stops when value pretraining ends, with the critic saved under "
            "output_dir/value_pretrained (value_model_path of a later run loads it); no policy update runs. With "
            "value_pretrain_dataset no rollout is sampled either, and no policy is kept (it is loaded only to build "
            "the critic and hash its weights; evaluation and push_to_hub are refused). The critic's learning-rate "
            "schedule is the full run's, so the saved critic is the one a full run would start PPO from."
        },
    )
    value_model_path: str | None = field(
        default=None,
        metadata={
            "help": "A saved pretrained critic (local directory or Hub id) to start from; value pretraining is then "
            "skipped (a line in the log says so)."
        },
    )

    # Pushing the pretrained critic to the Hub
    value_pretrain_push: bool = field(
        default=False,
        metadata={
            "help": "Push the pretrained critic to the Hub right after value pretraining (to "
            "value_pretrain_hub_model_id), so that later runs can start from it by repo id "
            "(value_model_path=<repo id>). A failed push is logged as an error and training goes on."
        },
    )
    value_pretrain_hub_model_id: str | None = field(
        default=None,
        metadata={
            "help": "Hub repo of the pretrained critic. Default: <value_hub_model_id>-pretrained, i.e. "
            "<hub_model_id>-value-pretrained."
        },
    )

    @property
    def is_critic_job(self) -> bool:
        """A critic job from stored rollouts (`value_pretrain_only` with `value_pretrain_dataset`): nothing is sampled
        and no policy is kept; the policy is loaded only to build the critic from and to hash its weights."""
        return self.value_pretrain_only and self.value_pretrain_dataset is not None

    def __post_init__(self):
        super().__post_init__()
        self._check_decoupled_gae()
        self._check_value_pretraining()

    def _resolve_defaults(self) -> None:
        super()._resolve_defaults()
        self.value_pretrain_save_steps = sorted(set(self.value_pretrain_save_steps or []))

    def _check_decoupled_gae(self) -> None:
        if self.lam is not None:
            raise ValueError(
                "VCPPOConfig does not use `lam`: set `lam_actor` (policy advantages, e.g. 0.95) and `lam_critic` "
                "(value targets, 1.0 in VC-PPO) instead."
            )
        _require_unit_interval("lam_actor", self.lam_actor)
        _require_unit_interval("lam_critic", self.lam_critic)
        if self.lam_actor_length_alpha is not None:
            _require_positive("lam_actor_length_alpha", self.lam_actor_length_alpha)

    def _refuse_critic_fields_without_a_critic(self) -> None:
        """With an estimator that builds no critic (`"grpo"`, `"rloo"`), a critic field set away from its default is
        refused: it would silently do nothing."""
        if self.uses_critic:
            return
        fields = self.__dataclass_fields__
        critic_fields = [name for name in fields if name.startswith("value_pretrain_") or name == "value_model_path"]
        # Unset, or set to what means "none" (no pretraining steps, no steps to save) is not acting on anything.
        off = {"value_pretrain_steps": 0, "value_pretrain_save_steps": []}
        given = [
            name
            for name in critic_fields
            if getattr(self, name) not in (fields[name].default, off.get(name, fields[name].default))
        ]
        if given:
            raise ValueError(
                f"advantage_estimator={self.advantage_estimator!r} builds no critic, so {', '.join(given)} has nothing "
                "to act on (value pretraining and a pretrained critic are the critic's). Drop them, or use "
                "advantage_estimator='gae' to train with a critic."
            )

    def _check_value_pretraining(self) -> None:
        self._refuse_critic_fields_without_a_critic()
        _require_nonnegative("value_pretrain_steps", self.value_pretrain_steps)
        _require_at_least("value_pretrain_min_steps", self.value_pretrain_min_steps, 1)
        _require_at_least("value_pretrain_patience", self.value_pretrain_patience, 1, optional=True)
        _require_nonnegative("value_pretrain_min_delta", self.value_pretrain_min_delta)
        if self.value_pretrain_stop_explained_variance is not None and not (
            self.value_pretrain_stop_explained_variance <= 1.0
        ):
            raise ValueError(
                "`value_pretrain_stop_explained_variance` must be <= 1 (explained variance never exceeds 1)."
            )
        if self.value_pretrain_cliprange_value is not None and not self.value_pretrain_cliprange_value > 0:
            raise ValueError(
                "`value_pretrain_cliprange_value` must be > 0 (inf: no clipping; None: cliprange_value); got "
                f"{self.value_pretrain_cliprange_value}."
            )
        bad = [s for s in self.value_pretrain_save_steps if not 1 <= s <= self.value_pretrain_steps]
        if bad:
            raise ValueError(
                f"`value_pretrain_save_steps` {bad} fall outside 1..value_pretrain_steps ({self.value_pretrain_steps}): "
                "raise value_pretrain_steps or drop those steps."
            )
        # Critic jobs and stored rollouts
        if self.value_pretrain_only and (self.value_pretrain_steps < 1 or self.value_model_path is not None):
            raise ValueError(
                "`value_pretrain_only` runs value pretraining alone: it needs `value_pretrain_steps` >= 1 and no "
                "`value_model_path` (which skips the phase)."
            )
        _require_nonnegative("value_pretrain_heldout_batches", self.value_pretrain_heldout_batches)
        if self.value_pretrain_dataset is None:
            if self.value_pretrain_heldout_batches:
                raise ValueError("`value_pretrain_heldout_batches` needs `value_pretrain_dataset` (stored rollouts).")
            return
        if self.value_model_path is not None:
            raise ValueError(
                "`value_pretrain_dataset` pretrains the critic and `value_model_path` skips pretraining: set one."
            )
        if self.value_pretrain_steps < 1:
            raise ValueError("`value_pretrain_dataset` needs `value_pretrain_steps` >= 1 (the phase's updates).")
        if self.generation_window is not None or self.max_staleness > 0:
            raise ValueError(
                "`value_pretrain_dataset` does not combine with `generation_window` or `max_staleness` yet: stored "
                "rollouts are whole responses read in the phase's order, while a window or a rollout worker samples "
                "the policy itself. Pretrain the critic in a run without them and start from it with `value_model_path`."
            )
        if not self.is_critic_job:
            return
        needs_policy = {  # what a critic job, which holds no policy, cannot do
            "eval_strategy": self.eval_strategy != "no",
            "eval_on_start": self.eval_on_start,
            "push_to_hub": self.push_to_hub,
        }
        given = [name for name, on in needs_policy.items() if on]
        if given:
            raise ValueError(
                f"A critic job (value_pretrain_only with value_pretrain_dataset) holds no policy, so {', '.join(given)} "
                "has nothing to work on: evaluation samples the policy, and push_to_hub pushes it. Turn them off "
                "(eval_strategy='no'); push the pretrained critic with value_pretrain_push=True."
            )

"""The first toy (`--task addition`, the default): its budget, its variants (the main table, the pilot's knobs, the
sweeps) and its task assets (the splits, the short-form metric logged beside the verifier).

The toy (additions of 1- to 6-digit numbers, a cold start on a mix of worked and compressed solutions, and the two
variants that start from a controlled-bias critic) is described in `reproduce.py`'s docstring, its `--help`.

`Budget` and `Variant` are also the types every task builds on: the stop-anytime task's budget
(`task_majority.MajorityBudget`) and the running-sum one (`task_running_sum.RunningSumBudget`) extend `Budget` and
override its task hooks (`splits`, `logged_rewards`, `model_size`, `reward_model_prefixes`, `held_out_samples`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Budget:
    """Everything a run's outcome depends on, fixed before the table is run (changing it invalidates the cache)."""

    # Task and cold start
    num_train: int = 4000
    num_eval: int = 300
    short_fraction: float = 0.5
    cold_start_steps: int = 2200
    # Reward model (complete responses of the cold-start policy, labelled +1/-1 by math-verify) and biased critic
    rm_samples: int = 1280
    rm_epochs: int = 4
    controlled_bias: float = 1.0
    controlled_bias_samples: int = 640
    controlled_bias_epochs: int = 3
    # RL: per update 32 prompts (8 x 2 accumulation x 2 minibatches), 2 PPO epochs
    ppo_updates: int = 60
    pretrain_updates: int = 20
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 2
    num_mini_batches: int = 2
    num_ppo_epochs: int = 2
    learning_rate: float = 1e-4
    value_learning_rate: float = 2e-4  # chosen by the pilot (PILOT_KNOBS); the paper's 2:1 critic/policy ratio
    vf_coef: float = 0.5
    response_length: int = 256
    grpo_generations: int = 4
    seeds: tuple[int, ...] = (0, 1, 2)
    # Held-out evaluation along the run (issue 49): every `eval_every` policy updates as well as at the end, recorded
    # as the run's `held_out_along_run` (`runner.held_out_callback`); None: at the end only, as every run saved before
    # this field. It leaves training as it was (the evaluations keep the trainer's random state), and a saved run
    # without the field counts as made at None (`run_files.ADDED_FIELDS`), so the saved tables stay valid.
    eval_every: int | None = None

    @property
    def prompts_per_update(self) -> int:
        return self.per_device_train_batch_size * self.gradient_accumulation_steps * self.num_mini_batches

    def asset_key(self) -> dict[str, Any]:
        keys = ("num_train", "num_eval", "short_fraction", "cold_start_steps")
        return {k: getattr(self, k) for k in keys}

    # Task hooks: what the asset builders (toy_assets.py) and the runner (runner.py) ask of a task.

    def splits(self, cold_start: bool = False):
        """The train/test splits of the budget's task (seed 0 for every run: the same problems, whatever the seed);
        with `cold_start`, those the cold start trains on (the majority task may draw them with another bias)."""
        from vcppo_trl.toy import make_splits

        return make_splits(self.num_train, self.num_eval, seed=0, short_fraction=self.short_fraction)

    def logged_rewards(self) -> list:
        """Reward functions logged with weight 0 (never trained on) beside the verifier: a length-mode metric."""
        return [short_form]

    def model_size(self) -> dict[str, int]:
        """Size arguments of the toy policy (`vcppo_trl.toy.build_tiny_model`); none: its defaults."""
        return {}

    def reward_model_prefixes(self) -> int:
        """Truncated prefixes per response in the baseline critic's reward model (0: complete responses only, and no
        EOS-only reward model beside it)."""
        return 0

    def held_out_samples(self) -> int:
        """Samples per held-out prompt of the sampled evaluation beside the greedy one (temperature 1); 0: greedy
        only."""
        return 0


SMOKE_BUDGET = Budget(
    num_train=64,
    num_eval=16,
    cold_start_steps=4,
    rm_samples=16,
    rm_epochs=1,
    controlled_bias_samples=16,
    controlled_bias_epochs=1,
    ppo_updates=2,
    pretrain_updates=1,
    per_device_train_batch_size=2,
    gradient_accumulation_steps=1,
    num_mini_batches=2,
    num_ppo_epochs=1,
    response_length=32,
    grpo_generations=2,
    seeds=(0,),
)


def short_form(completions, **kwargs) -> list[float]:
    """1 for a response in the compressed (short) form, else 0: logged with weight 0, never trained on."""
    from vcppo_trl.rewards.math_verify import completion_to_text
    from vcppo_trl.toy.task import response_mode

    return [1.0 if response_mode(completion_to_text(c)) == "short" else 0.0 for c in completions]


@dataclass(frozen=True)
class Variant:
    """One arm of the comparison. `critic`: where the critic starts ("rm", "controlled_bias", or on the majority and
    running-sum tasks "rm_eos", the EOS-only reward model beside the prefix-trained one); unused by GRPO."""

    name: str
    label: str
    trainer: str = "vcppo"  # "vcppo", "vapo" (VAPOConfig's parts on the budget's learning rates) or "grpo"
    critic: str = "rm"
    pretrain: bool = False
    pretrain_updates: int | None = None  # None: the budget's field named by `pretrain_field`
    pretrain_field: str = "pretrain_updates"
    lam_actor: float = 0.95
    lam_critic: float = 0.95
    group: str = "main"
    value_lr_ratio: float | None = None  # critic lr = ratio x policy lr; None: the budget's value_learning_rate
    # Config fields set on top of the variant's trainer config (an ablation: e.g. (("cliprange_high", None),)).
    options: tuple[tuple[str, Any], ...] = ()
    # Generation windows (`generation_window` = the budget's response_length // window_divisor; None: whole responses)
    # and the run-length factors of the equal-finished-responses rule: a windowed run finishes fewer responses per
    # update than its batch, so its value-pretraining and policy updates are the budget's times these factors, rounded
    # up (results/windows_overlap/plan.md §3).
    window_divisor: int | None = None
    pretrain_factor: float = 1.0
    update_factor: float = 1.0
    # Held-out evaluation every this many policy updates of this variant's run (None: the budget's `eval_every`), for
    # grids whose arms take different numbers of updates (results/windows_remedy/plan.md §5).
    eval_every: int | None = None
    # Whole responses whose policy advantages are cut every response_length // this many tokens as a window's are
    # (cut_advantages.py: a probe, results/windows_remedy/plan.md follow-up 1); None: whole-response GAE.
    advantage_cut_divisor: int | None = None
    # Under generation windows, each response trained once when it finishes, on all its tokens (train_when_finished.py:
    # a probe, results/windows_remedy/plan.md follow-up 2); False: each window's tokens trained when sampled.
    train_when_finished: bool = False

    def value_learning_rate(self, budget: Budget) -> float:
        return (
            budget.value_learning_rate if self.value_lr_ratio is None else self.value_lr_ratio * budget.learning_rate
        )

    def generation_window(self, budget: Budget) -> int | None:
        return None if self.window_divisor is None else max(1, budget.response_length // self.window_divisor)

    def ppo_updates(self, budget: Budget) -> int:
        """Policy updates of this variant's run: the budget's, times `update_factor` rounded up."""
        return scaled_updates(budget.ppo_updates, self.update_factor)

    def pretrain_updates_in_run(self, budget: Budget) -> int:
        """Value-pretraining updates of this variant's run (0 without pretraining), times `pretrain_factor` rounded up."""
        if not self.pretrain:
            return 0
        base = getattr(budget, self.pretrain_field) if self.pretrain_updates is None else self.pretrain_updates
        return scaled_updates(base, self.pretrain_factor)


def scaled_updates(updates: int, factor: float) -> int:
    """`updates × factor` rounded up (a product within 1e-9 of an integer counts as that integer)."""
    return max(1, math.ceil(updates * factor - 1e-9)) if updates else 0


MAIN_VARIANTS = (
    Variant("ppo", "PPO (RM critic, λ .95/.95)"),
    Variant("vcppo_no_dgae", "VC-PPO w/o decoupled GAE (pretrain, λ .95/.95)", pretrain=True),
    Variant("vcppo_no_pretrain", "VC-PPO w/o value pretraining (RM critic, λ .95/1.0)", lam_critic=1.0),
    Variant("vcppo", "VC-PPO (pretrain, λ .95/1.0)", pretrain=True, lam_critic=1.0),
    Variant("grpo", "GRPO (TRL GRPOTrainer)", trainer="grpo"),
    Variant("ppo_biased", "PPO, controlled-bias critic (λ .95/.95)", critic="controlled_bias"),
    Variant(
        "vcppo_biased",
        "VC-PPO from the controlled-bias critic (pretrain, λ .95/1.0)",
        critic="controlled_bias",
        pretrain=True,
        lam_critic=1.0,
    ),
)


# The knob exploration run before the table (`--pilot`): one seed (100, not a table seed), 30 updates, the three
# critics. The rule, fixed before the last knob was run, looks at critics and the Figure-2 diagnostic only, never at
# accuracy or length: a knob is eligible when VC-PPO's value pretraining reaches explained variance >= 0.2 (mean of
# its last 5 updates; the method needs a critic that has converged); among eligible knobs, take the one whose
# advantage-position correlation (mean of the first 10 updates) separates PPO's critics (RM, controlled-bias) most
# from VC-PPO's pretrained one. Only lr 1e-4 / value lr 2e-4 was eligible (pretraining EV 0.49; 0.06 at value lr 5e-5).
PILOT_KNOBS = {
    "lr1e-4_vlr5e-5": {"learning_rate": 1e-4, "value_learning_rate": 5e-5},
    "lr1e-4_vlr1e-5": {"learning_rate": 1e-4, "value_learning_rate": 1e-5},
    "lr3e-5_vlr5e-5": {"learning_rate": 3e-5, "value_learning_rate": 5e-5},
    "lr1e-4_vlr2e-4": {"learning_rate": 1e-4, "value_learning_rate": 2e-4},  # the paper's ratio (critic 2x policy)
}
PILOT_VARIANTS = ("ppo", "ppo_biased", "vcppo")

# The sweeps (`--full`) add only the points the main table lacks: its VC-PPO run is λ_actor 0.95 with the budget's
# pretraining, its "w/o value pretraining" run is 0 pretraining updates, and its "w/o decoupled GAE" run is
# λ_critic 0.95 (the paper's Figure 3 comparison, drawn from the main runs).
SWEEP_VARIANTS = (
    *(
        Variant(
            f"lam_actor_{lam}", f"VC-PPO, λ_actor {lam}", pretrain=True, lam_actor=lam, lam_critic=1.0, group="sweep"
        )
        for lam in (0.9, 0.99, 1.0)
    ),
    *(
        Variant(
            f"pretrain_{n}",
            f"VC-PPO, {n} pretraining updates",
            pretrain=True,
            pretrain_updates=n,
            lam_critic=1.0,
            group="sweep",
        )
        for n in (5, 60)
    ),
)

# Sweep tables: (title, [(variant name, row label)]), rows reusing main runs where they are the same arm.
SWEEP_TABLES = (
    (
        "λ_actor with λ_critic = 1 and value pretraining (cf. the paper's Table 4)",
        [
            ("lam_actor_0.9", "λ_actor 0.9"),
            ("vcppo", "λ_actor 0.95 (the main VC-PPO runs)"),
            ("lam_actor_0.99", "λ_actor 0.99"),
            ("lam_actor_1.0", "λ_actor 1.0"),
        ],
    ),
    (
        "Value-pretraining updates, λ 0.95/1.0 (cf. the paper's Table 3)",
        [
            ("vcppo_no_pretrain", "0 (the main w/o-pretraining runs)"),
            ("pretrain_5", "5"),
            ("vcppo", "20 (the main VC-PPO runs)"),
            ("pretrain_60", "60"),
        ],
    ),
)

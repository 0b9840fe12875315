"""The accuracy-link toy (`vcppo_trl.toy.running_sum`): a task where an answer given before the end of the reasoning is
right only by chance, its budget and task assets (the splits, the reasoning-lines metric logged beside the verifier,
the toy policy's size, the reward model's truncated prefixes, the sampled held-out evaluation), the grid of variants
in the order they are cut, and the prediction written before its runs. The task is chosen among the candidates of
`results/accuracy_link/plan.md` by its rules (`accuracy_link_shape.py`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from task_addition import SMOKE_BUDGET, Budget, Variant


@dataclass(frozen=True)
class RunningSumBudget(Budget):
    """The running-sum task: the sum of 15–31 digits modulo `modulus`, one running sum per line, where an answer given
    before the last line is right only by chance. The cold start mixes complete solutions with ones stopped at a random
    line (`early_stop_fraction`), with the majority task's model and steps (plan.md §1). `short_fraction` is unused."""

    short_fraction: float = 0.0
    cold_start_steps: int = 2200
    modulus: int = 5
    values: int | None = None  # digits drawn from [0, values - 1]; None: [0, modulus - 1]
    tally: str = "mod"  # "mod" (the running sum mod m per line) or, for bits, "counts" (ones:zeros)
    min_digits: int = 15
    max_digits: int = 31
    early_stop_fraction: float = 0.5
    toy_hidden_size: int = 96
    toy_num_layers: int = 2
    toy_num_heads: int = 4  # 96 / 4: heads 24 wide; vLLM's CPU backend needs >= 32 (3 heads)
    response_length: int = 192  # complete responses are 87-167 tokens
    # The PPO baseline's critics: a reward model trained on complete responses and on truncated prefixes (our device,
    # vcppo_trl.toy.reward_model) and the paper's EOS-only one beside it (`reward_model_eos`), as on the majority task.
    rm_prefixes_per_response: int = 1
    rm_samples: int = 640
    ppo_updates: int = 40
    # Held-out evaluation: greedy, and `eval_samples` samples per prompt at temperature 1 (plan.md §3).
    eval_samples: int = 4
    # VAPO's α on the toy (plan.md §2): 1 / (0.05 · l̄), l̄ the cold start's mean sampled length on training prompts.
    vapo_length_alpha: float = 0.1

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
        key = {"task": "running_sum", **{k: getattr(self, k) for k in keys}}
        # Only where they differ from the first running-sum assets, so that those stay valid.
        for k, default in (("values", None), ("tally", "mod"), ("toy_num_heads", 4)):
            if getattr(self, k) != default:
                key[k] = getattr(self, k)
        return key

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
            values=self.values,
            tally=self.tally,
        )

    def logged_rewards(self) -> list:
        """Reward functions logged with weight 0 (never trained on) beside the verifier: a length-mode metric."""
        from vcppo_trl.toy.running_sum import reasoning_lines_reward

        return [reasoning_lines_reward]

    def model_size(self) -> dict[str, int]:
        return {
            "hidden_size": self.toy_hidden_size,
            "num_layers": self.toy_num_layers,
            "num_heads": self.toy_num_heads,
        }

    def reward_model_prefixes(self) -> int:
        return self.rm_prefixes_per_response

    def held_out_samples(self) -> int:
        return self.eval_samples


# VAPO's α on the toy (plan.md §2): 1 / (0.05 · l̄) with l̄ = 141.4 tokens, the chosen cold start's mean sampled length
# on 256 training prompts (results/accuracy_link/shape/count-mod-5_1100.json), so that λ_policy = 0.95 at that length.
VAPO_ALPHA_TOY = 0.1414

# The accuracy-link task, chosen by plan.md's rules (results/accuracy_link/shape.md): C5, the number of ones mod 5 on
# the majority task's counts lines, with the plan's one adjustment (half the cold-start steps: at 2,200 its greedy
# accuracy was above 0.80).
COUNT_MOD_5_BUDGET = RunningSumBudget(
    modulus=5,
    values=2,
    tally="counts",
    cold_start_steps=1100,
    response_length=320,  # complete responses are about 120 to 260 tokens
    vapo_length_alpha=VAPO_ALPHA_TOY,
    # By the budget rule (plan.md) on the U = 30 table's measured costs: 20 updates x 5 seeds of the grid's five
    # first variants, estimated at 77 minutes on the 2-core machine, took 57.5 (30 updates took 100: kept in
    # results/accuracy_link/u30/, made by `--updates 30 --results-dir experiments/results/accuracy_link/u30`).
    ppo_updates=20,
    seeds=(0, 1, 2, 3, 4),
)

COUNT_MOD_5_SMOKE_BUDGET = dataclasses.replace(
    COUNT_MOD_5_BUDGET,
    **{
        **{f.name: getattr(SMOKE_BUDGET, f.name) for f in dataclasses.fields(Budget) if f.name != "short_fraction"},
        "min_digits": 3,
        "max_digits": 5,
        "response_length": 64,
        "eval_samples": 2,
    },
)


# The grid (plan.md §2, in the order variants are cut when the time does not allow them all: last cut first). Equal
# samples: 32 responses per update for every variant (PPO and VC-PPO: 32 prompts x 1; VAPO and GRPO: 8 prompts x the
# budget's grpo_generations = 4), the same updates, learning rates and schedule.
ACCURACY_LINK_GRID = (
    Variant("ppo", "PPO (RM critic trained with truncated prefixes, λ .95/.95)"),
    Variant("ppo_rm_eos", "PPO (the paper's EOS-only RM critic, λ .95/.95)", critic="rm_eos"),
    Variant("vcppo", "VC-PPO (pretrain, λ .95/1.0)", pretrain=True, lam_critic=1.0),
    Variant("vapo", "VAPO (every part, α_toy)", trainer="vapo", pretrain=True, lam_critic=1.0),
    Variant("grpo", "GRPO (TRL 1.16 GRPOTrainer, dapo loss)", trainer="grpo"),
    Variant("vcppo_no_dgae", "VC-PPO w/o decoupled GAE (pretrain, λ .95/.95)", pretrain=True),
    Variant(
        "vapo_no_clip_higher",
        "VAPO w/o clip-higher (ε 0.2/0.2)",
        trainer="vapo",
        pretrain=True,
        lam_critic=1.0,
        options=(("cliprange_high", None),),
    ),
    Variant(
        "vapo_no_lm_loss",
        "VAPO w/o the positive-example LM loss",
        trainer="vapo",
        pretrain=True,
        lam_critic=1.0,
        options=(("positive_example_lm_coef", 0.0),),
    ),
    Variant(
        "grpo_clip_higher",
        "GRPO (TRL 1.16, dapo loss) with clip-higher (epsilon_high 0.28)",
        trainer="grpo",
        options=(("epsilon_high", 0.28),),
    ),
)


# What `reproduce.py --task count-mod-5` runs: the five first variants (the budget rule cut the optional ones 6-9,
# which stay available with --variants).
ACCURACY_LINK_MAIN = ACCURACY_LINK_GRID[:5]


# Written before any RL run on the accuracy-link task (plan.md §3); not to be edited after the runs.
ACCURACY_LINK_PREDICTION = """\
Prediction (written before the table's runs). When the answer needs the whole reasoning (an answer given before the
last line is right only by chance):
  1. PPO loses held-out length and accuracy, with the reward-model critic trained on truncated prefixes and with the
     paper's EOS-only one;
  2. VC-PPO keeps length and gains accuracy;
  3. VAPO ends at or above VC-PPO.
What counts: per variant, Δ = end − cold start of held-out accuracy (greedy, and sampled: temperature 1, 4 samples per
prompt) and of held-out length, over seeds, with a 95 % t-interval: "loses" when it lies below 0, "keeps" when it
contains 0, "gains" when it lies above 0. Two variants are compared on their end values by a 95 % Welch interval of
the difference of their means: "differs" when it excludes 0. A negative result is reported with the diagnostic that
names the failed link: no spurious stop gap at the first updates, a true stop penalty (λ = 1 gap) larger than the
spurious one, or a critic that refits before the policy drifts.
"""
# The comparisons the report makes by the Welch rule (first minus second).
ACCURACY_LINK_PAIRS = (
    ("vcppo", "ppo"),
    ("vcppo", "ppo_rm_eos"),
    ("vapo", "vcppo"),
    ("vapo", "grpo"),
    ("vcppo", "grpo"),
    ("vcppo", "vcppo_no_dgae"),
    ("vapo", "vapo_no_clip_higher"),
    ("vapo", "vapo_no_lm_loss"),
    ("grpo_clip_higher", "grpo"),
)

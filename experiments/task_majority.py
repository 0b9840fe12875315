"""The stop-anytime toy (`--task majority`, `vcppo_trl.toy.majority`): its budget, its variants (the grid at two
critic speeds, and the arm run only when asked), the prediction written before its table, and its task assets (the
splits, the reasoning-lines metric logged beside the verifier, the toy policy's size, the reward model's truncated
prefixes).

Its results and cache go to the `majority` sub-directory of `reproduce.py`'s `--results-dir` and `--cache-dir`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from task_addition import MAIN_VARIANTS, SMOKE_BUDGET, Budget, Variant


@dataclass(frozen=True)
class MajorityBudget(Budget):
    """The stop-anytime task (`--task majority`, `vcppo_trl.toy.majority`): the majority of a noisy bit string, one
    running tally per line, where an answer given after fewer lines is right less often but not never. The cold start
    mixes complete solutions with ones stopped at a random line (`early_stop_fraction`). `short_fraction` is unused.

    The RL knobs were fixed on the first rollouts' stop-advantage gap, critic explained variance, the policy's clip
    fraction and approximate KL, and the tabular simulation, never on accuracy or length
    (`results/majority/first_look.md`): policy lr 1e-4, value lr 2e-4 (ratio 2) as the budget's, and the grid's second
    critic speed in `MAJORITY_CRITIC_RATIOS`. The task (fair strings, counts tally, plain prompt) and its 2200-step
    cold start were chosen on sampled accuracy by stop line, measured before any RL (`experiments/majority_shape.py`).
    """

    short_fraction: float = 0.0
    cold_start_steps: int = 2200  # chosen on the shape measurements (results/majority/first_look.md)
    min_bits: int = 15
    max_bits: int = 31
    # Fair strings: the leader after a few lines is a weak guess (60/40 strings made it a strong one).
    bias: float = 0.5
    early_stop_fraction: float = 0.5
    cold_start_bias: float | None = None  # the cold start's strings drawn with this bias (None: `bias`)
    tally: str = "counts"  # the task variant (vcppo_trl.toy.majority): "counts" or "diff"
    encoding: str = "plain"  # "plain" or "changes"
    toy_hidden_size: int = 96  # the toy policy's size (vcppo_trl.toy.build_tiny_model)
    toy_num_layers: int = 2
    response_length: int = 320  # complete responses are 117-258 tokens
    # The PPO baseline's critic: a reward model trained on complete responses and on truncated prefixes (our device,
    # vcppo_trl.toy.reward_model); the EOS-only reward model (the paper's) is built beside it as `reward_model_eos`.
    rm_prefixes_per_response: int = 1
    rm_samples: int = 640  # per reward model (two are built); the first toy used 1280 for its one
    # Value-pretraining updates of the slow-critic arm (critic lr ½x the policy's), measured before the table by the
    # rule in results/majority/first_look.md §4 (knobs/vcppo_pretrain60_vlr5e-5.json).
    slow_pretrain_updates: int = 60
    # 40, not the first toy's 60: the 75-minute limit (results/majority/first_look.md §5-6).
    ppo_updates: int = 40

    def asset_key(self) -> dict[str, Any]:
        keys = ("num_train", "num_eval", "cold_start_steps", "min_bits", "max_bits", "bias", "early_stop_fraction")
        key = {"task": "majority", **{k: getattr(self, k) for k in keys}}
        # Only where they differ from the first majority assets, so that those stay valid.
        for k, default in (
            ("tally", "counts"),
            ("encoding", "plain"),
            ("toy_hidden_size", 96),
            ("toy_num_layers", 2),
            ("cold_start_bias", None),
        ):
            if getattr(self, k) != default:
                key[k] = getattr(self, k)
        return key

    def splits(self, cold_start: bool = False):
        """The train/test splits of the task (seed 0 for every run: the same problems, whatever the seed); with
        `cold_start`, those the cold start trains on (drawn with `cold_start_bias` where it is set)."""
        from vcppo_trl.toy.majority import make_majority_splits

        bias = self.cold_start_bias if cold_start and self.cold_start_bias is not None else self.bias
        return make_majority_splits(
            self.num_train,
            self.num_eval,
            seed=0,
            min_bits=self.min_bits,
            max_bits=self.max_bits,
            bias=bias,
            early_stop_fraction=self.early_stop_fraction,
            tally=self.tally,
            encoding=self.encoding,
        )

    def logged_rewards(self) -> list:
        """Reward functions logged with weight 0 (never trained on) beside the verifier: a length-mode metric."""
        from vcppo_trl.toy.majority import reasoning_lines_reward

        return [reasoning_lines_reward]

    def model_size(self) -> dict[str, int]:
        """Size arguments of the toy policy (`vcppo_trl.toy.build_tiny_model`)."""
        return {"hidden_size": self.toy_hidden_size, "num_layers": self.toy_num_layers}

    def reward_model_prefixes(self) -> int:
        """Truncated prefixes per response in the baseline critic's reward model; where there are any, the EOS-only
        reward model (the paper's) is built beside it."""
        return self.rm_prefixes_per_response


# The critic's speed relative to the policy's, the grid's axis on the majority task (value lr = ratio x policy lr),
# fixed before any table run from the first rollouts (results/majority/first_look.md) and the tabular simulation:
# 2 (the paper's, the budget's value lr 2e-4) and 1/2 (value lr 5e-5).
MAJORITY_CRITIC_RATIOS = (2.0, 0.5)

MAJORITY_SMOKE_BUDGET = MajorityBudget(
    **{
        **{f.name: getattr(SMOKE_BUDGET, f.name) for f in dataclasses.fields(Budget) if f.name != "short_fraction"},
        "min_bits": 3,
        "max_bits": 5,
        "slow_pretrain_updates": 1,
        "response_length": 48,
    }
)


# Written before any table run of the stop-anytime task (`--task majority`), from the stop-bias mechanism (derived in
# docs/reproduction.md, "The second toy: stopping at any line", and in notebooks/why_ppo_collapses.ipynb with the
# package's GAE) and its tabular simulation (its outcome by critic speed: results/majority/first_look.md §3); not to be
# edited after the runs.
PREDICTION = """\
Prediction (written before the table's runs). If the stop-bias mechanism drives the paper's collapse, then at a critic
that refits slower than the policy moves (critic/policy learning-rate ratio below 1; the simulation collapses at 1/2
and below, only dips and recovers at 1 and 2):
  1. PPO (RM critic, λ .95/.95) loses length and accuracy;
  2. VC-PPO without value pretraining (RM critic, λ .95/1.0) drifts early on like PPO, until its critic refits;
  3. VC-PPO without decoupled GAE (pretrained, λ .95/.95) holds at first, then drifts as its λ = 0.95 critic lags;
  4. VC-PPO (pretrained, λ .95/1.0) keeps or gains both;
  5. λ_actor = 1.0 with the RM critic shows no spurious stop gap (its cost is variance) and does not lose length.
At a critic at least as fast as the policy, PPO only dips (training-rollout length falls, then recovers) and the end
points do not separate. The first updates' diagnostics/stop_advantage_gap is positive for the RM critic at λ 0.95 and
≈ 0 or negative for the pretrained one (λ = 1 targets).
What counts: per variant, the difference (end − cold start) of held-out accuracy and of held-out length, averaged over
≥ 3 seeds with a 95 % t-interval. "Loses length" / "loses accuracy": that interval lies entirely below 0. "Keeps or
gains": it contains 0 or lies above 0. The claim "PPO collapses and VC-PPO holds" needs, at the same critic speed, PPO
losing both and VC-PPO keeping or gaining both, with the two variants' intervals of the end values not overlapping.
Held-out decoding is greedy, which may hide a shift of the stop hazard that stays below 1/2 at every line; the training
rollouts' mean length (sampled at temperature 1, mean of the last 5 updates minus the first 5) is judged by the same
rule beside it.
"""


# The stop-anytime task's grid adds the slow critic (MAJORITY_CRITIC_RATIOS[1], value lr = ½ x policy lr) for the
# three variants whose critic speed is the experiment's axis, and λ_actor = 1 with the reward-model critic (no spurious
# stop gap, more variance); the main variants run at the budget's ratio 2. Fixed before the table's runs.
MAJORITY_GRID = (
    Variant("ppo_slow", "PPO (RM critic, λ .95/.95), critic lr ½x", value_lr_ratio=0.5),
    Variant(
        "vcppo_no_dgae_slow",
        "VC-PPO w/o decoupled GAE (pretrain, λ .95/.95), critic lr ½x",
        pretrain=True,
        pretrain_field="slow_pretrain_updates",
        value_lr_ratio=0.5,
    ),
    Variant(
        "vcppo_slow",
        "VC-PPO (pretrain, λ .95/1.0), critic lr ½x",
        pretrain=True,
        pretrain_field="slow_pretrain_updates",
        lam_critic=1.0,
        value_lr_ratio=0.5,
    ),
    Variant("ppo_lam_actor1", "PPO with λ_actor 1.0 (RM critic, λ 1.0/.95)", lam_actor=1.0),
)
# Run only when asked (`--variants ppo_rm_eos`): the paper's EOS-only reward model as PPO's critic.
MAJORITY_EXTRA = (
    Variant("ppo_rm_eos", "PPO, EOS-only reward-model critic (the paper's; λ .95/.95)", critic="rm_eos"),
)
# On the majority task the controlled-bias pair is left out (the time limit; first_look.md §5-6): the reward model with
# truncated prefixes already starts PPO's critic low on early prefixes. It stays available with --variants.
MAJORITY_MAIN = tuple(v for v in MAIN_VARIANTS if v.critic != "controlled_bias")

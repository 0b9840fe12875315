"""Reproduce VC-PPO's claim at toy scale: plain PPO with a reward-model critic vs VC-PPO and its ablations, and GRPO.

    python experiments/reproduce.py              # main table: 7 variants x 3 seeds, 2 worker processes
    python experiments/reproduce.py --full       # + the sweeps (lambda_actor, pretraining steps, lambda_critic)
    python experiments/reproduce.py --report     # rebuild the table and plots from the saved runs only
    python experiments/reproduce.py --task majority  # the stop-anytime task (results/majority/, .cache/majority/)
    python experiments/reproduce.py --seeds 3 4 5    # other seeds than the budget's (a rerun with unused seeds)

Everything is cached and resumable: the cold start, the reward model and the controlled-bias critic are built once
under `experiments/.cache/`, and every run writes `experiments/results/runs/<variant>/seed<k>.json` when it ends (its
whole metric history, the held-out evaluation, its seed and the commit it ran at; its console output goes to
`results/logs/`, not kept in git); a run whose file exists (with the same budget, whatever the seed list) is skipped. The table and plots are then
rebuilt from those files by `experiments/report.py`.

The toy (fixed before any run, see `Budget`): additions of 1- to 6-digit numbers, with a cold start on a 50/50 mix of
worked solutions and compressed ones (about half as long, worse on long numbers), so a policy can drift toward shorter
reasoning. The paper's PPO baseline starts its critic from a reward model trained on complete responses only. Because
that reward model's values do not rise along the response on this toy (see the README), two variants start instead
from a *controlled-bias* critic: the reward model's values plus a known ramp, low at the start of each response
(`vcppo_trl.toy.reward_model.position_ramp`). They are labelled as such everywhere.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing as mp
import os
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_RESULTS = os.path.join(HERE, "results")
DEFAULT_CACHE = os.path.join(HERE, ".cache")


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

    @property
    def prompts_per_update(self) -> int:
        return self.per_device_train_batch_size * self.gradient_accumulation_steps * self.num_mini_batches

    def asset_key(self) -> dict[str, Any]:
        keys = ("num_train", "num_eval", "short_fraction", "cold_start_steps")
        return {k: getattr(self, k) for k in keys}


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

# `--task`: (budget, smoke budget, results sub-directory); the first toy keeps the top-level directories.
TASKS = {
    "addition": (Budget(), SMOKE_BUDGET, ""),
    "majority": (MajorityBudget(), MAJORITY_SMOKE_BUDGET, "majority"),
}


# Written before any table run of the stop-anytime task (`--task majority`), from the stop-bias note
# (shared/notes/stop-bias-mechanism.md) and its tabular simulation; not to be edited after the runs.
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


def task_splits(budget: Budget, cold_start: bool = False):
    """The train/test splits of the budget's task (seed 0 for every run: the same problems, whatever the seed); with
    `cold_start`, those the cold start trains on (the majority task may draw them with another bias)."""
    if isinstance(budget, MajorityBudget):
        from vcppo_trl.toy.majority import make_majority_splits

        bias = budget.cold_start_bias if cold_start and budget.cold_start_bias is not None else budget.bias
        return make_majority_splits(
            budget.num_train,
            budget.num_eval,
            seed=0,
            min_bits=budget.min_bits,
            max_bits=budget.max_bits,
            bias=bias,
            early_stop_fraction=budget.early_stop_fraction,
            tally=budget.tally,
            encoding=budget.encoding,
        )
    from vcppo_trl.toy import make_splits

    return make_splits(budget.num_train, budget.num_eval, seed=0, short_fraction=budget.short_fraction)


def logged_rewards(budget: Budget) -> list:
    """Reward functions logged with weight 0 (never trained on) beside the verifier: a length-mode metric."""
    if isinstance(budget, MajorityBudget):
        from vcppo_trl.toy.majority import reasoning_lines_reward

        return [reasoning_lines_reward]
    return [short_form]


@dataclass(frozen=True)
class Variant:
    """One arm of the comparison. `critic`: where the critic starts ("rm", "controlled_bias", or on the majority task
    "rm_eos", the EOS-only reward model beside the prefix-trained one); unused by GRPO."""

    name: str
    label: str
    trainer: str = "vcppo"  # "vcppo" or "grpo"
    critic: str = "rm"
    pretrain: bool = False
    pretrain_updates: int | None = None  # None: the budget's field named by `pretrain_field`
    pretrain_field: str = "pretrain_updates"
    lam_actor: float = 0.95
    lam_critic: float = 0.95
    group: str = "main"
    value_lr_ratio: float | None = None  # critic lr = ratio x policy lr; None: the budget's value_learning_rate

    def value_learning_rate(self, budget: Budget) -> float:
        return (
            budget.value_learning_rate if self.value_lr_ratio is None else self.value_lr_ratio * budget.learning_rate
        )


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
TASK_VARIANTS = {"addition": MAIN_VARIANTS, "majority": MAJORITY_MAIN + MAJORITY_GRID}

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


# --------------------------------------------------------------------------------------------------------- assets


def build_cold_start(budget: Budget, cache_dir: str) -> dict[str, Any]:
    """The cold-start policy (cached under `cache_dir/cold_start`, keyed by `budget.asset_key()` in
    `cache_dir/assets.json`) and its greedy held-out scores; returns the manifest."""
    from vcppo_trl.toy import build_tiny_model, build_tokenizer, cold_start_sft, greedy_accuracy

    os.makedirs(cache_dir, exist_ok=True)
    key = budget.asset_key()
    manifest_path = os.path.join(cache_dir, "assets.json")
    policy_dir = os.path.join(cache_dir, "cold_start")
    manifest = _read_json(manifest_path)
    if manifest is None or manifest.get("key") != key:
        splits = task_splits(budget, cold_start=True)
        t0 = time.time()
        tokenizer = build_tokenizer()
        size = {}
        if isinstance(budget, MajorityBudget):
            size = {"hidden_size": budget.toy_hidden_size, "num_layers": budget.toy_num_layers}
        policy = build_tiny_model(tokenizer, seed=0, **size)
        policy = cold_start_sft(
            policy,
            tokenizer,
            splits["train"],
            output_dir=os.path.join(cache_dir, "sft_logs"),
            max_steps=budget.cold_start_steps,
            target_accuracy=None,
            seed=0,
        )
        policy.save_pretrained(policy_dir)
        tokenizer.save_pretrained(policy_dir)
        seconds = time.time() - t0
        evaluation = greedy_accuracy(policy, tokenizer, splits["test"], max_new_tokens=budget.response_length)
        manifest = {"key": key, "cold_start_seconds": seconds, "cold_start_eval": evaluation}
        _write_json(manifest_path, manifest)
    manifest["policy"] = policy_dir
    return manifest


def build_reward_model_asset(budget: Budget, cache_dir: str, policy, tokenizer, eos_only: bool = False):
    """The baseline critic's reward model, cached in `cache_dir/reward_model` (with truncated prefixes where the budget
    asks, the majority task), or with `eos_only` the paper's EOS-only one in `cache_dir/reward_model_eos`."""
    import torch

    from vcppo_trl.toy.reward_model import build_reward_model

    prefixes = budget.rm_prefixes_per_response if isinstance(budget, MajorityBudget) and not eos_only else 0
    torch.manual_seed(0)
    return build_reward_model(
        policy,
        tokenizer,
        task_splits(budget)["train"],
        output_dir=os.path.join(cache_dir, "reward_model_eos" if eos_only else "reward_model"),
        num_samples=budget.rm_samples,
        num_epochs=budget.rm_epochs,
        max_new_tokens=budget.response_length,
        cache_key=budget.asset_key(),
        prefixes_per_response=prefixes,
    )


def build_assets(budget: Budget, cache_dir: str) -> dict[str, Any]:
    """Cold-start policy, reward model and controlled-bias critic (cached), and the cold start's held-out scores."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vcppo_trl.toy.reward_model import build_controlled_bias_critic

    manifest = build_cold_start(budget, cache_dir)
    key = budget.asset_key()
    manifest_path = os.path.join(cache_dir, "assets.json")
    policy_dir = manifest["policy"]
    splits = task_splits(budget)
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    policy = AutoModelForCausalLM.from_pretrained(policy_dir)
    rm_dir = os.path.join(cache_dir, "reward_model")
    t0 = time.time()
    torch.manual_seed(0)
    reward_model, rm_stats = build_reward_model_asset(budget, cache_dir, policy, tokenizer)
    if isinstance(budget, MajorityBudget) and budget.rm_prefixes_per_response:
        _, rm_eos_stats = build_reward_model_asset(budget, cache_dir, policy, tokenizer, eos_only=True)
        manifest.update(
            reward_model_eos=os.path.join(cache_dir, "reward_model_eos"), reward_model_eos_stats=rm_eos_stats
        )
    cb_dir = os.path.join(cache_dir, "controlled_bias_critic")
    _, cb_stats = build_controlled_bias_critic(
        reward_model,
        policy,
        tokenizer,
        splits["train"],
        bias=budget.controlled_bias,
        output_dir=cb_dir,
        num_samples=budget.controlled_bias_samples,
        num_epochs=budget.controlled_bias_epochs,
        max_new_tokens=budget.response_length,
        cache_key=key,
    )
    manifest.update(
        policy=policy_dir,
        reward_model=rm_dir,
        controlled_bias_critic=cb_dir,
        reward_model_stats=rm_stats,
        controlled_bias_stats=cb_stats,
    )
    manifest.setdefault("critic_build_seconds", time.time() - t0)  # the first (real) build, not a cache load
    _write_json(manifest_path, manifest)
    return manifest


# ----------------------------------------------------------------------------------------------------------- runs


def short_form(completions, **kwargs) -> list[float]:
    """1 for a response in the compressed (short) form, else 0: logged with weight 0, never trained on."""
    from vcppo_trl.rewards import completion_to_text
    from vcppo_trl.toy.task import response_mode

    return [1.0 if response_mode(completion_to_text(c)) == "short" else 0.0 for c in completions]


def _common_args(out_dir: str, seed: int) -> dict[str, Any]:
    """Settings every trainer of the comparison shares: CPU, fp32, every update logged, nothing saved."""
    return {
        "output_dir": out_dir,
        "seed": seed,
        "use_cpu": True,
        "bf16": False,
        "report_to": "none",
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
    }


def _run_vcppo(
    variant: Variant, seed: int, budget: Budget, assets: dict, out_dir: str, train, test, callbacks: tuple = ()
) -> list[dict]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vcppo_trl import VCPPOConfig, VCPPOTrainer
    from vcppo_trl.rewards import math_verify_reward

    pretrain = (
        getattr(budget, variant.pretrain_field) if variant.pretrain_updates is None else variant.pretrain_updates
    )
    pretrain = pretrain if variant.pretrain else 0
    args = VCPPOConfig(
        **_common_args(out_dir, seed),
        eval_strategy="no",
        num_sample_generations=0,
        per_device_train_batch_size=budget.per_device_train_batch_size,
        gradient_accumulation_steps=budget.gradient_accumulation_steps,
        num_mini_batches=budget.num_mini_batches,
        num_ppo_epochs=budget.num_ppo_epochs,
        local_rollout_forward_batch_size=64,
        total_episodes=budget.ppo_updates * budget.prompts_per_update,
        response_length=budget.response_length,
        temperature=1.0,
        kl_coef=0.0,
        lam_actor=variant.lam_actor,
        lam_critic=variant.lam_critic,
        learning_rate=budget.learning_rate,
        value_learning_rate=variant.value_learning_rate(budget),
        vf_coef=budget.vf_coef,
        value_pretrain_steps=pretrain,
        # A fixed number of pretraining updates (no early stop), so every seed gets the same budget.
        value_pretrain_min_steps=max(pretrain, 1),
        value_pretrain_patience=None,
        value_pretrain_stop_explained_variance=None,
        missing_eos_penalty=1.0,
        reward_weights=[1.0, 0.0],
    )
    critics = {"controlled_bias": "controlled_bias_critic", "rm_eos": "reward_model_eos"}  # else "reward_model"
    critic_dir = assets[critics.get(variant.critic, "reward_model")]
    tokenizer = AutoTokenizer.from_pretrained(assets["policy"])
    trainer = VCPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(assets["policy"]),
        processing_class=tokenizer,
        reward_funcs=[math_verify_reward, *logged_rewards(budget)],
        args=args,
        train_dataset=train,
        value_model=critic_dir,
        callbacks=list(callbacks),
    )
    trainer.train()
    return trainer.state.log_history, trainer.model.policy if hasattr(trainer.model, "policy") else trainer.model


def _run_grpo(variant: Variant, seed: int, budget: Budget, assets: dict, out_dir: str, train, test):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from vcppo_trl.rewards import math_verify_reward

    # Same samples as PPO: prompts_per_update completions per generation batch (prompts_per_update / G prompts with G
    # completions each), and the same number of optimizer steps per batch (num_mini_batches x num_ppo_epochs).
    completions = budget.prompts_per_update
    args = GRPOConfig(
        **_common_args(out_dir, seed),
        num_generations=budget.grpo_generations,
        per_device_train_batch_size=completions // budget.num_mini_batches,
        gradient_accumulation_steps=1,
        steps_per_generation=budget.num_mini_batches,
        num_iterations=budget.num_ppo_epochs,
        max_steps=budget.ppo_updates * budget.num_mini_batches * budget.num_ppo_epochs,
        max_completion_length=budget.response_length,
        learning_rate=budget.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=0,
        beta=0.0,
        temperature=1.0,
        reward_weights=[1.0, 0.0],
        disable_dropout=True,
    )
    tokenizer = AutoTokenizer.from_pretrained(assets["policy"])
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(assets["policy"]),
        reward_funcs=[math_verify_reward, *logged_rewards(budget)],
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
    )
    trainer.train()
    return trainer.state.log_history, trainer.model


def run_one(variant: Variant, seed: int, budget: Budget, assets: dict, path: str) -> None:
    """Train one variant with one seed in this process (one torch thread) and write its JSON."""
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from vcppo_trl.toy import greedy_accuracy

    splits = task_splits(budget)
    columns = ["prompt", "solution", "difficulty"]
    train, test = splits["train"].select_columns(columns), splits["test"].select_columns(columns)
    scratch = os.path.join(os.path.dirname(path), f".scratch-seed{seed}")
    t0 = time.time()
    runner = _run_grpo if variant.trainer == "grpo" else _run_vcppo
    history, policy = runner(variant, seed, budget, assets, scratch, train, test)
    train_seconds = time.time() - t0
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(assets["policy"])
    final_eval = greedy_accuracy(policy, tokenizer, splits["test"], max_new_tokens=budget.response_length)
    record = {
        "variant": dataclasses.asdict(variant),
        "seed": seed,
        "commit": git_commit(),
        "budget": _budget_dict(budget),
        "train_seconds": train_seconds,
        "wall_seconds": time.time() - t0,
        "cold_start_eval": assets["cold_start_eval"],
        "final_eval": final_eval,
        "log_history": history,
    }
    _write_json(path, record)


def _worker(task: tuple) -> tuple[str, str | None]:
    variant, seed, budget, assets, path = task
    # Each run's own output (metric dicts, warnings) goes to its log file, not to the sweep's console.
    log_path = os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(path))), "logs", f"{variant.name}-seed{seed}.log"
    )
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = log
        try:
            run_one(variant, seed, budget, assets, path)
            return path, None
        except Exception:  # reported by the parent; the other runs go on
            error = traceback.format_exc()
            print(error, flush=True)
            return path, error


def run_path(results_dir: str, variant: Variant, seed: int) -> str:
    return os.path.join(results_dir, "runs", variant.name, f"seed{seed}.json")


def run_all(
    variants: tuple[Variant, ...], budget: Budget, assets: dict, results_dir: str, workers: int
) -> list[tuple[str, str]]:
    """Run every (variant, seed) whose JSON is missing, `workers` at a time; returns the failures."""
    tasks = []
    for seed in budget.seeds:  # seed-major: an interrupted sweep has whole seeds of every variant
        for variant in variants:
            path = run_path(results_dir, variant, seed)
            existing = _read_json(path)
            if existing is not None and _same_budget(existing.get("budget"), budget):
                continue
            tasks.append((variant, seed, budget, assets, path))
    print(f"{len(tasks)} runs to do ({len(variants)} variants x {len(budget.seeds)} seeds, rest already saved).")
    failures = []
    if not tasks:
        return failures
    t0 = time.time()
    ctx = mp.get_context("spawn")
    with ctx.Pool(processes=workers, maxtasksperchild=1) as pool:
        for done, (path, error) in enumerate(pool.imap_unordered(_worker, tasks), start=1):
            status = "failed" if error else "done"
            print(f"[{done}/{len(tasks)}] {status}: {os.path.relpath(path, results_dir)} ({time.time() - t0:.0f} s)")
            if error:
                failures.append((path, error))
                print(error, file=sys.stderr)
    return failures


# ---------------------------------------------------------------------------------------------------------- utils


def _budget_dict(budget: Budget) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(budget).items()}


def _same_budget(saved: dict | None, budget: Budget) -> bool:
    """Whether a saved run used this budget; the seed list is not part of it (`--seeds` picks which runs to do)."""
    if saved is None:
        return False
    current = _budget_dict(budget)
    return {k: v for k, v in saved.items() if k != "seeds"} == {k: v for k, v in current.items() if k != "seeds"}


def git_commit() -> str | None:
    """The commit this code runs at (`<sha>`, with `-dirty` when tracked files differ from it); `None` outside git."""
    import subprocess

    try:
        sha = subprocess.run(
            ["git", "-C", HERE, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", HERE, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{sha}-dirty" if dirty else sha


def _read_json(path: str) -> dict | None:
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError:
        return None  # a run killed while writing: redo it


def _write_json(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=_json_default)
    os.replace(tmp, path)


def _json_default(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    if hasattr(x, "item"):
        return x.item()
    return str(x)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--task",
        choices=sorted(TASKS),
        default="addition",
        help="addition: the first toy (fixed-length reasoning). majority: the stop-anytime task, whose results and "
        "cache go to a 'majority' sub-directory of --results-dir and --cache-dir.",
    )
    parser.add_argument("--full", action="store_true", help="Also run the sweeps (λ_actor, pretraining, λ_critic).")
    parser.add_argument("--report", action="store_true", help="Only rebuild the table and plots from saved runs.")
    parser.add_argument("--smoke", action="store_true", help="Tiny budget (tests): 1 seed, 2 updates.")
    parser.add_argument("--pilot", action="store_true", help="The knob exploration (PILOT_KNOBS) into results/pilot/.")
    parser.add_argument("--variants", nargs="*", help="Only these variants (names), e.g. ppo vcppo.")
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        help="Run (and report) these seeds instead of the budget's, e.g. --seeds 3 4 5 to rerun the table with seeds "
        "not used before. Saved runs of other seeds are kept; a run's file records its seed and commit.",
    )
    parser.add_argument("--workers", type=int, default=2, help="Parallel worker processes (one torch thread each).")
    parser.add_argument("--results-dir", default=DEFAULT_RESULTS)
    parser.add_argument("--cache-dir", default=DEFAULT_CACHE)
    args = parser.parse_args(argv)

    sys.path.insert(0, HERE)
    import report

    full_budget, smoke_budget, subdir = TASKS[args.task]
    budget = smoke_budget if args.smoke else full_budget
    if args.seeds:
        if len(set(args.seeds)) != len(args.seeds) or min(args.seeds) < 0:
            parser.error(f"--seeds must be distinct non-negative integers, got {args.seeds}")
        budget = dataclasses.replace(budget, seeds=tuple(args.seeds))
    if subdir:
        args.results_dir = os.path.join(args.results_dir, subdir)
        args.cache_dir = os.path.join(args.cache_dir, subdir)
    variants = TASK_VARIANTS[args.task] + (SWEEP_VARIANTS if args.full else ())
    all_variants = MAIN_VARIANTS + SWEEP_VARIANTS + (MAJORITY_GRID + MAJORITY_EXTRA if args.task == "majority" else ())
    if args.variants:
        known = {v.name: v for v in all_variants}
        unknown = [n for n in args.variants if n not in known]
        if unknown:
            parser.error(f"unknown variant(s) {unknown}; choose from {sorted(known)}")
        variants = tuple(known[n] for n in args.variants)
    failures = []
    if args.pilot:
        import torch

        torch.set_num_threads(1)
        assets = build_assets(budget, args.cache_dir)
        known = {v.name: v for v in MAIN_VARIANTS}
        pilot_variants = tuple(known[n] for n in PILOT_VARIANTS)
        for knob, settings in PILOT_KNOBS.items():
            pilot_budget = dataclasses.replace(budget, ppo_updates=30, seeds=(100,), **settings)
            pilot_dir = os.path.join(args.results_dir, "pilot", knob)
            failures += run_all(pilot_variants, pilot_budget, assets, pilot_dir, args.workers)
            report.build_report(pilot_dir, pilot_variants, (100,), cache_dir=args.cache_dir)
        return 1 if failures else 0
    if not args.report:
        import torch

        torch.set_num_threads(1)  # the same numerics as the one-thread workers, and no oversubscription
        t0 = time.time()
        assets = build_assets(budget, args.cache_dir)
        print(f"Assets ready in {time.time() - t0:.0f} s: {args.cache_dir}")
        failures = run_all(variants, budget, assets, args.results_dir, args.workers)
        print(f"All runs finished in {time.time() - t0:.0f} s.")
    report.build_report(
        args.results_dir,
        all_variants,
        budget.seeds,
        cache_dir=args.cache_dir,
        sweeps=SWEEP_TABLES,
        prediction=PREDICTION if args.task == "majority" else None,
    )
    if failures:
        print(f"{len(failures)} run(s) failed: {[os.path.relpath(p, args.results_dir) for p, _ in failures]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

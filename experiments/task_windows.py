"""The windows/overlap grid (`reproduce.py --task count-mod-5 --grid windows`, `--task majority --grid windows`;
rules in `results/windows_overlap/plan.md`): VC-PPO with generation windows of L/4 and VC-PPO with one-step-off overlap
(`max_staleness` 1) against VC-PPO, and PPO with the reward-model critic under a window against PPO, on the two toys
where stopping early costs accuracy. Here: the grid's variants in the order they are cut, the equal-finished-responses
factors of the windowed ones, each toy's budget for the grid (seeds not used before; on the majority task 20 updates
and the sampled held-out evaluation), the prediction written before any run, and the comparisons the report makes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from task_addition import Budget, Variant
from task_majority import MAJORITY_SMOKE_BUDGET, MajorityBudget
from task_running_sum import COUNT_MOD_5_BUDGET, COUNT_MOD_5_SMOKE_BUDGET

# Seeds never used by an earlier table, rerun or pilot (those used 0-7, 31-33, 100, 101).
WINDOWS_SEEDS = tuple(range(200, 208))
# The window: response_length // 4 (80 of 320 tokens on both toys).
WINDOW_DIVISOR = 4


def expected_windows(lengths, window: int) -> float:
    """Windows a finished response takes, estimated from mean response lengths (one per update): the mean of
    max(1, l / W + 1/2), i.e. E⌈l / W⌉ for lengths spread over a window's width (at least one window)."""
    lengths = list(lengths)
    return sum(max(1.0, length / window + 0.5) for length in lengths) / len(lengths)


# The equal-finished-responses factors (plan.md §3): a slot of the pool finishes one response every ⌈l / W⌉ updates,
# so a windowed run finishes about batch / E⌈l / W⌉ responses per update, and its updates are the budget's times
# E⌈l / W⌉, rounded up. E⌈l / W⌉ is `expected_windows` of the reference runs' per-update mean sampled lengths at W = 80,
# over every saved seed of the toy's earlier table (count-mod-5: results/count_mod_5/runs, U = 20, seeds 0-4; majority:
# results/majority/runs, the first 20 policy updates of its U = 40 runs, seeds 0-2): "pretrain" from VC-PPO's value-
# pretraining updates (the frozen cold start), "vcppo" and "ppo" from those variants' policy updates. A variant whose
# lengths move away from its reference's finishes more (shorter) or fewer (longer) responses: the report gives the
# realized count per run beside the reference's (tests/integration/scripts/test_windows_grid.py recomputes these).
COUNT_MOD_5_WINDOW_FACTORS = {"pretrain": 2.220, "vcppo": 2.556, "ppo": 1.944}
MAJORITY_WINDOW_FACTORS = {"pretrain": 2.248, "vcppo": 2.279, "ppo": 1.200}

VCPPO_LABEL = "VC-PPO (pretrain, λ .95/1.0)"
PPO_LABEL = "PPO (RM critic trained with truncated prefixes, λ .95/.95)"


def windows_grid(factors: dict[str, float]) -> tuple[Variant, ...]:
    """The grid in the order variants are cut when the time does not allow them all (last cut first; the PPO pair
    is cut together). Equal finished responses: 32 per update for the whole-response variants, and the windowed ones
    run `factors` times the updates."""
    vcppo = Variant("vcppo", VCPPO_LABEL, pretrain=True, lam_critic=1.0)
    return (
        vcppo,
        dataclasses.replace(
            vcppo,
            name="vcppo_window",
            label="VC-PPO, window L/4 (pretrain, λ .95/1.0)",
            window_divisor=WINDOW_DIVISOR,
            pretrain_factor=factors["pretrain"],
            update_factor=factors["vcppo"],
        ),
        dataclasses.replace(
            vcppo,
            name="vcppo_stale1",
            label="VC-PPO, one-step-off (max_staleness 1; pretrain, λ .95/1.0)",
            options=(("max_staleness", 1),),
        ),
        Variant("ppo", PPO_LABEL),
        Variant(
            "ppo_window",
            "PPO, window L/4 (RM critic trained with truncated prefixes, λ .95/.95)",
            window_divisor=WINDOW_DIVISOR,
            update_factor=factors["ppo"],
        ),
    )


COUNT_MOD_5_WINDOWS_GRID = windows_grid(COUNT_MOD_5_WINDOW_FACTORS)
MAJORITY_WINDOWS_GRID = windows_grid(MAJORITY_WINDOW_FACTORS)
# What `--grid windows` runs without `--variants`: the first three (plan.md §5: the PPO pair does not fit the 90
# minutes by the estimate; it stays available with --variants).
WINDOWS_MAIN = 3


@dataclass(frozen=True)
class MajoritySampledBudget(MajorityBudget):
    """The majority task with the sampled held-out evaluation beside the greedy one (`eval_samples` samples per prompt
    at temperature 1), as the count-mod-5 task has it. The same assets as `MajorityBudget` (its cold start's sampled
    scores are added to the cached manifest)."""

    eval_samples: int = 4

    def held_out_samples(self) -> int:
        return self.eval_samples


def _majority_fields(budget: MajorityBudget) -> dict:
    return {f.name: getattr(budget, f.name) for f in dataclasses.fields(MajorityBudget)}


# `--task <toy> --grid windows`: (budget, smoke budget). Count-mod-5: its table's budget (U = 20). Majority: its
# table's, with 20 policy updates instead of 40 (plan.md §5) and the sampled held-out evaluation.
WINDOWS_BUDGETS: dict[str, tuple[Budget, Budget]] = {
    "count-mod-5": (dataclasses.replace(COUNT_MOD_5_BUDGET, seeds=WINDOWS_SEEDS), COUNT_MOD_5_SMOKE_BUDGET),
    "majority": (
        MajoritySampledBudget(**{**_majority_fields(MajorityBudget()), "ppo_updates": 20, "seeds": WINDOWS_SEEDS}),
        MajoritySampledBudget(**{**_majority_fields(MAJORITY_SMOKE_BUDGET), "eval_samples": 2}),
    ),
}
WINDOWS_GRIDS = {"count-mod-5": COUNT_MOD_5_WINDOWS_GRID, "majority": MAJORITY_WINDOWS_GRID}

# The comparisons the report makes by the Welch rule (first minus second), and the contrast of contrasts.
WINDOWS_PAIRS = (
    ("vcppo_window", "vcppo"),
    ("vcppo_stale1", "vcppo"),
    ("ppo_window", "ppo"),
    ("vcppo", "ppo"),
    ("vcppo_window", "ppo_window"),
)
# (VC-PPO − PPO) under a window minus (VC-PPO − PPO) without: does value pretraining matter more under a window?
WINDOWS_CONTRAST = (("vcppo_window", "ppo_window"), ("vcppo", "ppo"))

# Written before any run of the grid (plan.md §4); not to be edited after the runs.
WINDOWS_PREDICTION = """\
Prediction (written before any run of this grid). At equal finished responses (windowed runs: the budget's updates
times the toy's E⌈l/W⌉, plan.md §3), on count-mod-5 and on the majority task:
  1. VC-PPO with a window of L/4 ends where VC-PPO ends: no difference shown in held-out accuracy (greedy, sampled)
     or length (greedy, sampled), and none in the stop gap of the first 5 policy updates (its pretrained critic is
     not biased low on long prefixes, so bootstrapping at the cut adds no push toward stopping).
  2. VC-PPO with max_staleness 1 ends where VC-PPO ends: no difference shown in any of those values.
  3. PPO with the reward-model critic under a window of L/4 stops harder than PPO: a larger stop gap over its first
     5 policy updates (the interval of window − whole lies above 0) on both toys, and on count-mod-5 a shorter
     held-out length at the end (below 0, greedy or sampled); on the majority task PPO already ends near its floor
     (about 35 of 187 tokens), so no length difference is expected there.
  4. So value pretraining matters more under a window on count-mod-5: (VC-PPO − PPO) under the window minus
     (VC-PPO − PPO) without lies above 0 for held-out length (greedy or sampled); on the majority task, for the same
     floor, no difference is expected.
What counts: per variant, end values and Δ = end − cold start over the seeds with 95 % t-intervals; two variants are
compared by the 95 % Welch interval of the difference of their mean end values (first 5 policy updates for the stop
gap): "differs" when it excludes 0, "no difference shown" when it contains 0. A "no difference shown" is read with
its width: it shows the two within ±0.05 accuracy or ±10 tokens only if the whole interval lies inside that margin.
The contrast of 4 is judged by its Welch-Satterthwaite 95 % interval the same way.
"""

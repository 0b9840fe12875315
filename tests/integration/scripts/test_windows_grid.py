"""The windows/overlap grid (`experiments/reproduce.py --task <toy> --grid windows`, results/windows_overlap/plan.md):
its variants (windows of L/4 at equal finished responses, `max_staleness` 1), the factors derived from the saved
reference runs, the report's run-length table and contrast, and the grid on a tiny budget (no outcome is asserted)."""

import glob
import json
import math
import os

import pytest
import report_stats
import report_windows
import reproduce
import task_windows
from run_files import DEFAULT_RESULTS
from task_addition import Variant, scaled_updates
from task_majority import MajorityBudget
from task_running_sum import COUNT_MOD_5_BUDGET


def test_updates_scale_up_and_whole_response_variants_keep_the_budget():
    assert scaled_updates(20, 2.556) == 52 and scaled_updates(20, 2.220) == 45 and scaled_updates(20, 1.944) == 39
    assert scaled_updates(20, 1.200) == 24  # 24.000000000000004 is 24, not 25
    assert scaled_updates(20, 1.0) == 20 and scaled_updates(0, 2.5) == 0
    budget = task_windows.WINDOWS_BUDGETS["count-mod-5"][0]
    grid = {v.name: v for v in task_windows.COUNT_MOD_5_WINDOWS_GRID}
    assert grid["vcppo_window"].generation_window(budget) == 80 and grid["vcppo"].generation_window(budget) is None
    assert (grid["vcppo_window"].pretrain_updates_in_run(budget), grid["vcppo_window"].ppo_updates(budget)) == (45, 52)
    assert (grid["vcppo"].pretrain_updates_in_run(budget), grid["vcppo"].ppo_updates(budget)) == (20, 20)
    assert (grid["ppo_window"].pretrain_updates_in_run(budget), grid["ppo_window"].ppo_updates(budget)) == (0, 39)
    assert dict(grid["vcppo_stale1"].options) == {"max_staleness": 1}
    # An earlier variant's run length is unchanged (its pretraining field and override still apply).
    slow = Variant("v", "v", pretrain=True, pretrain_field="slow_pretrain_updates")
    assert (
        slow.pretrain_updates_in_run(MajorityBudget()) == 60 and Variant("p", "p").pretrain_updates_in_run(budget) == 0
    )


def test_the_grids_budgets_keep_each_toys_assets_and_use_seeds_not_used_before():
    count, _ = task_windows.WINDOWS_BUDGETS["count-mod-5"]
    majority, majority_smoke = task_windows.WINDOWS_BUDGETS["majority"]
    assert count.seeds == majority.seeds == tuple(range(200, 208))
    assert count.asset_key() == COUNT_MOD_5_BUDGET.asset_key() and count.ppo_updates == 20
    assert majority.asset_key() == MajorityBudget().asset_key()  # the majority table's cold start and critics
    assert majority.ppo_updates == 20 and majority.held_out_samples() == 4 and majority_smoke.held_out_samples() == 2
    assert [v.name for v in task_windows.MAJORITY_WINDOWS_GRID[: task_windows.WINDOWS_MAIN]] == [
        "vcppo",
        "vcppo_window",
        "vcppo_stale1",
    ]
    with pytest.raises(SystemExit):
        reproduce.main(["--task", "addition", "--grid", "windows", "--report"])


@pytest.mark.parametrize(
    "task, reference, factors",
    [
        ("count_mod_5", 20, task_windows.COUNT_MOD_5_WINDOW_FACTORS),
        ("majority", 20, task_windows.MAJORITY_WINDOW_FACTORS),
    ],
)
def test_the_window_factors_are_those_of_the_saved_reference_runs(task, reference, factors):
    """E⌈l/W⌉ at W = 80 from the earlier tables' per-update mean lengths (their first 20 policy updates)."""
    lengths = {"pretrain": [], "vcppo": [], "ppo": []}
    for name in ("vcppo", "ppo"):
        paths = sorted(glob.glob(os.path.join(DEFAULT_RESULTS, task, "runs", name, "seed*.json")))
        assert paths, f"the saved {task} runs the factors were computed from are missing"
        for path in paths:
            with open(path) as f:
                record = json.load(f)
            policy = report_stats.training_entries(record)[:reference]
            lengths[name] += [float(e["diagnostics/response_length_mean"]) for e in policy]
            if name == "vcppo":  # value pretraining: the frozen cold start
                pretrain = report_stats.pretrain_entries(record)
                lengths["pretrain"] += [float(e["diagnostics/response_length_mean"]) for e in pretrain]
    for key, factor in factors.items():
        assert task_windows.expected_windows(lengths[key], 80) == pytest.approx(factor, abs=5e-4), key


def _update(step, finished=None, pretrain=False, **extra):
    entry = {"step": step, "time/update_s": 2.0, "diagnostics/response_length_mean": 100.0 + step}
    if finished is not None:
        entry["rollout/finished_responses"] = float(finished)
        if finished:
            entry["rollout/windows_per_finished_mean"] = 2.0
    if pretrain:
        entry["value_pretrain/loss_avg"] = 0.1
    return entry | extra


def test_run_length_rows_count_finished_responses_per_phase_against_the_reference():
    budget = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "num_mini_batches": 2}
    budget |= {"ppo_updates": 3, "pretrain_updates": 2}
    window = {
        "variant": {"name": "w", "trainer": "vcppo", "pretrain": True, "pretrain_updates": None},
        "budget": budget,
        "wall_seconds": 60.0,
        "log_history": [
            _update(1, 1, pretrain=True),
            _update(2, 0, pretrain=True),  # no response finished: no explained variance, still an update
            {"step": 2, "value_pretrain/steps": 2},  # the phase's summary line: not an update
            _update(3, 4, pretrain=True),
            *[_update(4 + k, n) for k, n in enumerate((0, 3, 4, 4))],
        ],
    }
    whole = {
        "variant": {"name": "s", "trainer": "vcppo", "pretrain": False},
        "budget": budget,
        "wall_seconds": 30.0,
        "log_history": [
            _update(k, **{"sampling/staleness_max": min(k - 1, 1), "time/sampler_wait_s": 0.5}) for k in (1, 2, 3)
        ],
    }
    runs = {"w": [window], "s": [whole]}
    rows = {r["name"]: r for r in report_windows.run_length_rows(runs, [Variant("w", "W"), Variant("s", "S")])}
    w, s = rows["w"], rows["s"]
    assert (w["pretrain_updates"], w["policy_updates"]) == ([3], [4])
    assert w["finished_pretrain"] == [5.0] and w["pretrain_ratio"] == [5 / 8] and w["policy_ratio"] == [11 / 12]
    assert w["windows"] == [2.0] and math.isnan(w["staleness"][0]) and w["minutes"] == [1.0]
    assert s["policy_ratio"] == [1.0] and s["staleness"] == [1] and s["wait_s"] == [0.5]
    assert math.isnan(s["pretrain_ratio"][0])  # no pretraining: no reference to divide by
    table = report_windows.run_length_table(list(rows.values()))
    assert "| W | 1 | 3 / 4 | 0.625 | 0.917 | 2.00 | 2.00 | 1.0 | – | – |" in table


def test_the_contrast_interval_is_welchs_for_two_groups_and_adds_variances_for_four():
    a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0]
    assert report_stats.contrast_interval([(a, 1.0), (b, -1.0)]) == pytest.approx(report_stats.welch_interval(a, b))
    # Four groups of 3 with variance 1 each: se² = 4/3, df = (4/3)² / (4 · (1/3)² / 2) = 8 (t = 2.306).
    groups = [([0.0, 1.0, 2.0], 1.0), ([0.0, 1.0, 2.0], -1.0), ([1.0, 2.0, 3.0], -1.0), ([0.0, 1.0, 2.0], 1.0)]
    est, lo, hi = report_stats.contrast_interval(groups)
    assert est == pytest.approx(-1.0) and hi - est == pytest.approx(2.306 * (4 / 3) ** 0.5)
    assert all(math.isnan(x) for x in report_stats.contrast_interval([([1.0], 1.0), ([1.0, 2.0], -1.0)]))
    assert report_stats.t95(14.7) == 2.145 and report_stats.t95(31) == 1.96


def test_the_windows_grid_runs_on_a_tiny_budget(tmp_path):
    """`--task count-mod-5 --grid windows --smoke`: the windowed run has the window and the scaled run length, the
    one-step-off run samples one update behind (its rollout worker started from the runner's process), each records
    the sampled held-out evaluation, and the report holds the prediction, the grid, the run lengths and the plots."""
    results, cache = str(tmp_path / "results"), str(tmp_path / "cache")
    argv = ["--task", "count-mod-5", "--grid", "windows", "--smoke", "--results-dir", results, "--cache-dir", cache]
    names = ["vcppo_window", "vcppo_stale1", "ppo_window"]
    assert reproduce.main([*argv, "--workers", "1", "--variants", *names]) == 0
    root = os.path.join(results, "windows_overlap", "count_mod_5")
    records = {}
    for name in names:
        with open(os.path.join(root, "runs", name, "seed0.json")) as f:
            records[name] = json.load(f)
        assert records[name]["final_eval_sampled"]["num_samples"] == 2
    pretrain, policy = report_windows.phase_entries(records["vcppo_window"])
    assert (len(pretrain), len(policy)) == (3, 6)  # ceil(1 × 2.220), ceil(2 × 2.556)
    assert all("rollout/finished_responses" in e for e in pretrain + policy)
    assert len(report_windows.phase_entries(records["ppo_window"])[1]) == 4  # ceil(2 × 1.944)
    stale = report_windows.phase_entries(records["vcppo_stale1"])[1]
    assert len(stale) == 2 and max(e["sampling/staleness_max"] for e in stale) == 1
    with open(os.path.join(root, "results.md")) as f:
        text = f.read()
    assert task_windows.WINDOWS_PREDICTION.splitlines()[0] in text
    assert f"--task count-mod-5 --grid windows --report --results-dir {results} --seeds 0` from `runs/`" in text
    assert "| VC-PPO, window L/4 (pretrain, λ .95/1.0) | 1 | 3 / 6 |" in text
    for png in ("training_curves.png", "stop_gap_by_position.png", "advantage_by_position.png"):
        assert os.path.getsize(os.path.join(root, png)) > 1000, png

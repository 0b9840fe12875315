"""Held-out evaluation along a run (`reproduce.py --eval-every`, `Budget.eval_every`, issue 49): a VC-PPO run and a TRL
GRPO run on the count-mod-5 toy's tiny budget record `held_out_along_run` at the expected policy updates (value
pretraining not counted; GRPO's update = its optimizer steps per generation batch) without changing what they train,
the saved runs of the earlier tables stay valid, and the report's table gives means with their intervals."""

import dataclasses
import json
import math

import pytest
import report_stats
import report_windows
import reproduce
import runner
from run_files import budget_dict, same_budget
from task_addition import Budget, Variant
from task_running_sum import COUNT_MOD_5_SMOKE_BUDGET
from toy_assets import build_assets


def test_runs_record_the_held_out_evaluation_along_the_run(tmp_path):
    # 3 policy updates, evaluated every 2: at update 2 along the run and at update 3 (the final evaluation).
    budget = dataclasses.replace(COUNT_MOD_5_SMOKE_BUDGET, ppo_updates=3, eval_every=2)
    assets = build_assets(budget, str(tmp_path / "cache"), controlled_bias_critic=False)
    vcppo = Variant("vcppo", "VC-PPO", pretrain=True, lam_critic=1.0)  # 1 value-pretraining update first
    grpo = Variant("grpo", "GRPO", trainer="grpo")
    records = {}
    for variant in (vcppo, grpo):
        path = str(tmp_path / "runs" / variant.name / "seed0.json")
        runner.run_one(variant, 0, budget, assets, path)
        with open(path) as f:
            records[variant.name] = json.load(f)
    # The trainer's global step of each entry: VC-PPO's update k is step k + 1 (after its pretraining update); GRPO's
    # is step 2k (num_mini_batches 2 x num_ppo_epochs 1 optimizer steps per update).
    expected = {"vcppo": [(2, 3), (3, 4)], "grpo": [(2, 4), (3, 6)]}
    for name, record in records.items():
        along = record["held_out_along_run"]
        assert [(e["update"], e["step"]) for e in along] == expected[name], name
        for entry in along:
            assert entry["greedy"]["num_examples"] == budget.num_eval and 0.0 <= entry["greedy"]["accuracy"] <= 1.0
            assert entry["sampled"]["num_samples"] == budget.held_out_samples()
        assert along[-1]["greedy"] == record["final_eval"] and along[-1]["sampled"] == record["final_eval_sampled"]
        assert record["held_out_along_run_seconds"] > 0 and record["budget"]["eval_every"] == 2

    # The evaluations leave training alone: the same run without them trains the same (its losses, its final eval).
    plain = dataclasses.replace(budget, eval_every=None)
    path = str(tmp_path / "plain" / "seed0.json")
    runner.run_one(vcppo, 0, plain, assets, path)
    with open(path) as f:
        without = json.load(f)
    assert "held_out_along_run" not in without and without["final_eval"] == records["vcppo"]["final_eval"]

    def losses(record):
        return [e["loss/policy_avg"] for e in record["log_history"] if "loss/policy_avg" in e]

    assert losses(without) and losses(without) == losses(records["vcppo"])

    # The windows report's section reads them (one seed: means without an interval).
    section = report_windows.along_run_section({"vcppo": [records["vcppo"]]}, [vcppo])
    assert "### VC-PPO" in section and "| 0 (cold start) | 1 |" in section and "| 3 | 1 |" in section


def test_saved_runs_without_the_field_keep_their_budget():
    saved = budget_dict(Budget())
    del saved["eval_every"]  # a run saved before the field
    assert same_budget(saved, Budget()) and same_budget(saved, dataclasses.replace(Budget(), seeds=(5,)))
    assert not same_budget(saved, dataclasses.replace(Budget(), eval_every=5))
    assert not same_budget(budget_dict(dataclasses.replace(Budget(), eval_every=5)), Budget())
    # The running-sum budgets' later field, at the default the earlier runs were built with.
    count = budget_dict(COUNT_MOD_5_SMOKE_BUDGET)
    old = {k: v for k, v in count.items() if k not in ("eval_every", "toy_num_heads")}
    assert same_budget(old, COUNT_MOD_5_SMOKE_BUDGET)
    assert not same_budget(old, dataclasses.replace(COUNT_MOD_5_SMOKE_BUDGET, toy_num_heads=3))
    with pytest.raises(SystemExit):
        reproduce.main(["--eval-every", "0", "--report"])
    with pytest.raises(ValueError, match="at least 1"):
        runner.held_out_callback(0, lambda policy: {})


def _evaluation(accuracy, length, sampled=None):
    entry = {"greedy": {"accuracy": accuracy, "response_length_mean": length}}
    if sampled is not None:
        entry["sampled"] = {"accuracy": sampled, "response_length_mean": length + 10}
    return entry


def test_the_along_run_table_gives_means_with_95_percent_intervals():
    runs = [
        {
            "cold_start_eval": {"accuracy": 0.5, "response_length_mean": 100.0},
            "cold_start_eval_sampled": {"accuracy": 0.4, "response_length_mean": 110.0},
            "held_out_along_run": [
                {"update": 2, **_evaluation(acc, 90.0, acc - 0.1)},
                {"update": 4, **_evaluation(acc - 0.2, 80.0, acc - 0.3)},
            ],
        }
        for acc in (0.6, 0.8)
    ]
    table = report_stats.along_run_table(runs)
    lines = table.splitlines()
    assert (
        lines[0] == ("| update | runs | greedy accuracy | sampled accuracy | greedy length | sampled length |")
        and len(lines) == 5
    )
    # Update 2: greedy 0.6 and 0.8, mean 0.7, half-width t(1) · sd / √2 = 12.706 · 0.1414 / 1.414 = 1.271.
    half = 12.706 * math.sqrt(0.02) / math.sqrt(2)
    assert f"| 2 | 2 | 0.700 ± {half:.3f} | 0.600 ± {half:.3f} | 90.0 ± 0.0 | 100.0 ± 0.0 |" in table
    assert "| 0 (cold start) | 2 | 0.500 ± 0.000 | 0.400 ± 0.000 | 100.0 ± 0.0 | 110.0 ± 0.0 |" in table
    assert "| 4 | 2 | 0.500 ± " in table
    # Greedy only (no sampled evaluation), an extra column, one run: its values without an interval.
    greedy_only = [
        {"cold_start_eval": {"accuracy": 0.5}, "held_out_along_run": [{"update": 1, **_evaluation(0.75, 60)}]}
    ]
    table = report_stats.along_run_table(greedy_only, [("x", lambda record, update: 2.0 * update, 1)])
    assert table.splitlines()[0] == "| update | runs | greedy accuracy | greedy length | x |"
    assert "| 1 | 1 | 0.750 | 60.0 | 2.0 |" in table and "| 0 (cold start) | 1 | 0.500 | – | 0.0 |" in table
    # Runs saved without the field: no table, and the windows report's section is left out.
    assert report_stats.along_run_table([{"final_eval": {}}]) == ""
    assert report_windows.along_run_section({"v": [{"final_eval": {}}]}, [Variant("v", "V")]) == ""

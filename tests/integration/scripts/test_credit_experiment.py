"""experiments/credit.py and credit_pilots.py on a tiny budget: a seed's pointer-chase cold start built once and
cached, every arm (each in its own process, as the table's) with its run file in the contract's layout, the report;
and pilot (c)'s measures."""

import json
import os

import credit
import credit_pilots


def test_every_arm_runs_and_writes_the_contracts_files(tmp_path):
    results, cache = str(tmp_path / "results"), str(tmp_path / "cache")
    argv = ["--smoke", "--hops", "2", "--seeds", "0", "--workers", "2", "--results-dir", results, "--cache-dir", cache]
    assert credit.main(argv) == 0
    for arm in credit.ARMS:
        with open(os.path.join(results, "runs", f"{arm}_K2", "seed0.json")) as f:
            run = json.load(f)
        assert (run["arm"], run["hops"], run["seed"]) == (arm, 2, 0)
        assert run["budget"] == credit.SMOKE_BUDGET.run_key()
        for key in ("cold_start_eval_sampled", "final_eval_sampled"):
            assert 0 <= run[key]["accuracy"] <= 1 and run[key]["num_samples"] == 1
        assert run["cold_start"]["weights_sha256"]
    # One cold start for the seed and K: every arm started from the same weights.
    assert (
        len(
            {
                json.load(open(os.path.join(results, "runs", f"{a}_K2", "seed0.json")))["cold_start"]["key"]
                for a in credit.ARMS
            }
        )
        == 1
    )
    with open(os.path.join(results, "results.md")) as f:
        text = f.read()
    assert "| vcppo | 2 | 1 |" in text and "| oracle | 2 | 1 |" in text
    assert credit.main([*argv, "--report"]) == 0  # rebuilt from the saved runs alone


def test_the_critic_pilot_measures_both_critics(tmp_path):
    results, cache = str(tmp_path / "pilots"), str(tmp_path / "cache")
    argv = ["critic", "--hops", "2", "--seed", "0", "--updates", "1", "--eval-prompts", "4", "--cold-start-steps", "2"]
    assert credit_pilots.main([*argv, "--results-dir", results, "--cache-dir", cache]) == 0
    with open(os.path.join(results, "critic_K2_seed0_pool1.json")) as f:  # the budget's pool of one table
        record = json.load(f)
    assert record["episodes"] == 16 and len(record["pretrain_curve"]) == 1
    assert set(record["ev_by_position"]) == {"critic", "oracle"} and len(record["ev_by_position"]["oracle"]) == 8
    assert set(record["hop_advantage_correlation"]) == {"group_G2", "group_G4", "critic", "oracle"}

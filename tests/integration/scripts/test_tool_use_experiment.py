"""experiments/tool_use.py on its smoke budget: the tool toy's cold start, a VC-PPO and a TRL GRPO run with the tool
(each in its own process, as the table's), their held-out evaluations through the tool loop, and the report."""

import json
import os

import tool_use


def test_the_tool_toy_runs_and_reports_on_a_tiny_budget(tmp_path):
    results, cache = str(tmp_path / "results"), str(tmp_path / "cache")
    argv = ["--smoke", "--variants", "vcppo", "grpo", "--workers", "1", "--results-dir", results, "--cache-dir", cache]
    assert tool_use.main(argv) == 0
    for variant in ("vcppo", "grpo"):
        with open(os.path.join(results, "runs", variant, "seed0.json")) as f:
            run = json.load(f)
        assert run["variant"]["name"] == variant and run["budget"] == tool_use.SMOKE_BUDGET.run_key()
        for split in ("eval_greedy", "eval_sampled"):
            assert 0 <= run[split]["tool_call_rate"] <= 1 and run[split]["num_episodes"] > 0
        assert any("tools/call_frequency" in e for e in run["log_history"])
    assert os.path.exists(os.path.join(results, "logs", "vcppo-seed0.log"))
    with open(os.path.join(results, "results.md")) as f:
        text = f.read()
    assert "| VC-PPO (pretrain on tool episodes" in text and "The prediction (written before any run)" in text
    assert tool_use.main([*argv, "--report"]) == 0  # rebuilt from the saved runs alone

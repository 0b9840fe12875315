"""experiments/pretrain_scaling.py on a tiny budget: the held-out store per length, one online phase per batch size
scored on the held-out responses before and after every update, and the report."""

import json
import os

import pretrain_scaling


def test_the_grid_runs_on_a_tiny_budget(tmp_path):
    results = str(tmp_path / "results")
    argv = ["--smoke", "--seeds", "0", "--updates", "2", "--heldout-batches", "1", "--threads", "1"]
    text = pretrain_scaling.main([*argv, "--results-dir", results, "--cache-dir", str(tmp_path / "cache")])
    for length in pretrain_scaling.SMOKE_LENGTHS:
        heldout = set()
        for batch in pretrain_scaling.SMOKE_BATCHES:
            with open(os.path.join(results, "runs", f"seed0_{length}_batch{batch}.json")) as f:
                run = json.load(f)
            assert [s["step"] for s in run["scores"]] == [0, 1, 2]  # before the first update, then after each
            assert len([e for e in run["log"] if "value_pretrain/explained_variance" in e]) == 2
            heldout.add(run["heldout"]["path"])
            summary = pretrain_scaling.summary(run)
            assert summary["enough"] in (1, 2) and summary["tokens_per_update"] > 0
        assert len(heldout) == 1  # every batch size of a seed and length is scored on the same responses
    assert "| short | 2 |" in text and "| long | 4 |" in text and "patience 5: stops after" in text

"""experiments/critic_epochs.py on a tiny budget: the store job, the three epoch variants over the stored batches with
the held-out fit after every update, the report, and the timing mode."""

import json
import os

import critic_epochs
import pytest


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One tiny cold start for both tests."""
    return str(tmp_path_factory.mktemp("critic_epochs_cache"))


def test_the_epochs_table_runs_on_a_tiny_budget(tmp_path, cache):
    results = str(tmp_path / "results")
    argv = ["--smoke", "--seeds", "0", "--train-batches", "1", "--heldout-batches", "1"]
    critic_epochs.main([*argv, "--results-dir", results, "--cache-dir", cache])
    for epochs in critic_epochs.EPOCHS:
        with open(os.path.join(results, "runs", f"seed0_epochs{epochs}.json")) as f:
            run = json.load(f)
        heldout = [e for e in run["log"] if "value_pretrain/heldout_explained_variance" in e]
        assert len(heldout) == epochs  # one update per stored training batch and epoch, each followed by the fit
        assert run["store_seconds"] > 0 and run["train_batches"] == 1 and run["heldout_batches"] == 1
    with open(os.path.join(results, "results.md")) as f:
        text = f.read()
    assert "| 4 | 4 |" in text and "4 epochs − 1: explained variance" in text


def test_the_timing_mode_times_three_ways_in_one_process(tmp_path, cache):
    results = str(tmp_path / "results")
    argv = ["--smoke", "--timing", "--timing-updates", "2", "--seeds", "0"]
    result = critic_epochs.main([*argv, "--results-dir", results, "--cache-dir", cache])
    timings = result["timings"]
    assert set(timings) == {"online", "stored_1_epoch", "stored_2_epochs"}
    assert timings["online"]["ratio_to_online"] == 1.0
    assert all(t["store_seconds"] > 0 and t["train_seconds"] > 0 for k, t in timings.items() if k != "online")
    assert os.path.isfile(os.path.join(results, "timing_2_updates.json"))

"""experiments/staleness.py on a tiny budget: cells with a rollout worker (staleness, V-trace) and a generation window
each run in their own process and write the contract's files; the report reads them."""

import json
import os

import staleness


def test_cells_run_and_write_the_contracts_files(tmp_path, capsys):
    results, cache = str(tmp_path / "results"), str(tmp_path / "cache")
    cells = ["s0_lr1", "s2_lr1_vtrace", "window4_s0_lr1"]
    argv = ["--smoke", "--hops", "2", "--seeds", "0", "--workers", "2", "--results-dir", results, "--cache-dir", cache]
    assert staleness.main([*argv, "--cells", *cells]) == 0
    for name in cells:
        with open(os.path.join(results, "runs", name, "seed0.json")) as f:
            run = json.load(f)
        assert run["cell"]["name"] == name and run["seed"] == 0 and run["budget"] == staleness.SMOKE_BUDGET.run_key()
        assert 0 <= run["final_eval_sampled"]["accuracy"] <= 1
    vtrace = json.load(open(os.path.join(results, "runs", "s2_lr1_vtrace", "seed0.json")))
    assert vtrace["overrides"]["max_staleness"] == 2 and vtrace["overrides"]["critic_target_correction"] == "vtrace"
    staleness_logged = [e["sampling/staleness_max"] for e in vtrace["log_history"] if "sampling/staleness_max" in e]
    assert staleness_logged and max(staleness_logged) <= 2
    window = json.load(open(os.path.join(results, "runs", "window4_s0_lr1", "seed0.json")))
    assert window["overrides"]["generation_window"] >= 1
    assert any("rollout/window_tokens" in e for e in window["log_history"])
    with open(os.path.join(results, "results.md")) as f:
        text = f.read()
    assert "| s2_lr1_vtrace | 1 |" in text and "Minimum detectable effect: not yet" in text
    assert staleness.main([*argv, "--report"]) == 0  # rebuilt from the saved runs alone
    # A saved run of the same budget and cell is skipped: nothing to do the second time.
    budget = staleness.SMOKE_BUDGET
    cells_again = [staleness.CELLS[name] for name in cells]
    capsys.readouterr()
    assert staleness.run_all(cells_again, [0], budget, hops=2, results_dir=results, cache_dir=cache, workers=1) == []
    assert "0 runs to do." in capsys.readouterr().out


def test_the_dose_slope_and_the_minimum_detectable_effect():
    def run(accuracy):  # the same accuracy at updates 10, 20 and the end: the curve mean is it
        along = [{"update": u, "eval_sampled": {"accuracy": accuracy}} for u in (10, 20)]
        return {"final_eval_sampled": {"accuracy": accuracy}, "held_out_along_run": along}

    runs = {f"s{d}_lr1": [run(0.9 - 0.01 * d + e) for e in (-0.01, 0.0, 0.01)] for d in (0, 1, 2, 4)}
    slope, low, high, _, df = staleness.dose_slope(runs, "lr1")
    assert df == 10
    assert abs(slope + 0.01) < 1e-12 and low < slope < high < 0
    assert staleness.dose_slope(runs, "lrhalf") is None
    # Pooled SD 0.01 over the staleness-0 cell (3 seeds): 2.8 × 0.01 × √(2/3).
    assert abs(staleness.minimum_detectable_effect(runs) - 2.8 * 0.01 * (2 / 3) ** 0.5) < 1e-12

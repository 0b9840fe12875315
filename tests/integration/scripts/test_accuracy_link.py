"""The accuracy-link toy: its task measurements (experiments/accuracy_link_shape.py: the texts that force an answer
without reasoning or after k lines, the reading of the model's forced answer) and its report (the verdicts on greedy
and sampled accuracy, the Welch comparisons)."""

import json
import math
import os

import accuracy_link_shape as shape
import pytest
import report_accuracy_link
import report_stats
import torch
from task_addition import Variant

from vcppo_trl.toy import running_sum
from vcppo_trl.toy.majority import format_prompt, format_solution, leader_after, majority_reward, reasoning_lines


def test_no_reasoning_text_closes_the_reasoning_at_once():
    prompt = format_prompt([1, 0, 1], encoding="changes")
    text = shape.no_reasoning_text(prompt)
    assert text == prompt + "<think></think> \\boxed{"
    assert reasoning_lines(text[len(prompt) :]) == 0


def test_forced_stop_text_holds_k_exact_lines_and_is_scored_against_the_whole_answer():
    bits = [1, 1, 0, 0, 0]  # leader after 2 lines: 1; the whole string's majority: 0
    prompt = format_prompt(bits, encoding="changes")
    text = shape.forced_stop_text(prompt, format_solution(bits, stop_line=2, encoding="changes"))
    assert text.endswith("</think> \\boxed{") and reasoning_lines(text[len(prompt) :]) == 2
    full = format_solution(bits, stop_line=2, encoding="changes")
    assert text[len(prompt) :] == full.split("</think>")[0] + "</think> \\boxed{"
    # An answer after 2 lines (the leader so far) is scored against the whole string's majority: wrong here.
    answered = text[len(prompt) :] + f"{leader_after(bits, 2)}}}"
    assert majority_reward([answered], ["\\boxed{0}"]) == [-1.0]
    assert majority_reward([text[len(prompt) :] + "0}"], ["\\boxed{0}"]) == [1.0]


def test_running_sum_candidate_reads_the_problem_and_scores_an_early_answer_against_the_whole_sum():
    candidate = shape.CANDIDATES["sum-mod-5"]
    digits = [3, 4, 1, 0]  # running sums 3, 2, 3, 3
    prompt = running_sum.format_prompt(digits)
    assert candidate.num_lines(prompt) == 4 and candidate.chance == 0.2
    assert [candidate.answer_after(prompt, k) for k in range(1, 5)] == ["3", "2", "3", "3"]
    text = shape.forced_stop_text(prompt, candidate.reference(prompt, 2))
    assert text == prompt + "<think>a3 3\nb4 2\n</think> \\boxed{"
    assert candidate.reasoning_lines(text[len(prompt) :]) == 2
    # The exact state after 2 lines answers 2; the whole sum is 3.
    assert not candidate.is_correct(text[len(prompt) :] + "2}", "\\boxed{3}")
    assert candidate.is_correct(text[len(prompt) :] + "3}", "\\boxed{3}")
    parity = shape.CANDIDATES["parity"]
    assert parity.chance == 0.5 and parity.answers == ("0", "1") and parity.budget.modulus == 2
    assert parity.budget.asset_key() != candidate.budget.asset_key()
    # The majority candidate reads the same way.
    majority = shape.CANDIDATES["majority-changes"]
    bits = [1, 1, 0, 0, 0]
    assert majority.answer_after(format_prompt(bits, encoding="changes"), 2) == str(leader_after(bits, 2)) == "1"
    assert majority.answer_after(format_prompt(bits, encoding="changes"), 5) == "0"


def test_forced_answers_reads_the_greedy_answer_up_to_the_brace(tokenizer, tiny_policy):
    model = tiny_policy.eval()
    answer_ids = tokenizer("1}", add_special_tokens=False)["input_ids"]

    def generate(input_ids, attention_mask=None, max_new_tokens=4, **kwargs):
        # A model that always answers "1}" (then pads): what forced_answers must read as "1".
        tail = torch.tensor(answer_ids + [tokenizer.pad_token_id] * (max_new_tokens - len(answer_ids)))
        return torch.cat([input_ids, tail.expand(input_ids.shape[0], -1)], dim=1)

    model.generate = generate
    texts = [shape.no_reasoning_text(format_prompt([1, 0, 1])), shape.no_reasoning_text(format_prompt([0] * 5))]
    assert shape.forced_answers(model, tokenizer, texts) == ["1", "1"]
    # Without a closing brace within the tokens read, no answer.
    zeros = torch.tensor(tokenizer("0000", add_special_tokens=False)["input_ids"])
    model.generate = lambda input_ids, **kw: torch.cat([input_ids, zeros.expand(input_ids.shape[0], -1)], dim=1)
    assert shape.forced_answers(model, tokenizer, texts[:1]) == [None]


def test_welch_interval_by_hand():
    # a = 1, 2, 3 against a constant: df = 2, t = 4.303, se = sqrt(1/3).
    diff, lo, hi = report_stats.welch_interval([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])
    assert diff == 2.0 and lo == pytest.approx(2.0 - 4.303 * (1 / 3) ** 0.5) and hi == pytest.approx(2 * diff - lo)
    # Unequal variances and sizes: se² = 1.6667/4 + 4/3 = 1.75, df = 3.23 -> 3 (t = 3.182).
    diff, lo, hi = report_stats.welch_interval([1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0])
    assert diff == -1.5 and hi - diff == pytest.approx(3.182 * 1.75**0.5)
    assert report_stats.welch_interval([0.5, 0.5], [0.2, 0.2]) == (pytest.approx(0.3),) * 3  # no spread: a point
    assert all(math.isnan(x) for x in report_stats.welch_interval([0.5], [0.1, 0.2]))


def _fake_run(name: str, trainer: str, seed: int, acc: float, sampled: float, length: float) -> dict:
    entries = [
        {
            "objective/scores": 0.0,
            "diagnostics/response_length_mean": length + k,
            "diagnostics/accuracy": acc,
            "diagnostics/stop_advantage_gap": 0.1 * k,
            "value/explained_variance": 0.01 * k,
            **{f"diagnostics/mc_explained_variance_bucket_{b}": 0.01 * b for b in range(8)},
        }
        if trainer != "grpo"
        else {"reward": 0.0, "completions/mean_length": length + k, "rewards/math_verify_reward/mean": 2 * acc - 1}
        for k in range(10)
    ]
    if name == "vcppo":  # value pretraining's updates come first in its history
        entries = [{"value_pretrain/explained_variance": 0.1 * k} for k in range(6)] + entries
    cold = {"accuracy": 0.5, "response_length_mean": 100.0}
    cold_sampled = {"accuracy": 0.4, "response_length_mean": 90.0, "num_samples": 4}
    return {
        "variant": {"name": name, "trainer": trainer},
        "seed": seed,
        "commit": "abc",
        "wall_seconds": 120.0,
        "cold_start_eval": cold,
        "cold_start_eval_sampled": cold_sampled,
        "final_eval": {"accuracy": acc, "response_length_mean": length},
        "final_eval_sampled": {"accuracy": sampled, "response_length_mean": length - 5},
        "log_history": entries,
    }


def test_accuracy_link_report_judges_greedy_and_sampled_and_compares_by_welch(tmp_path):
    """The report's rows and verdicts from hand-made runs: VC-PPO gains (its Δ interval above 0), PPO loses, the
    Welch comparison of their end values differs; GRPO rows have no stop gap."""
    variants = (Variant("ppo", "PPO"), Variant("vcppo", "VC-PPO"), Variant("grpo", "GRPO", trainer="grpo"))
    end = {"ppo": (0.30, 0.25, 40.0), "vcppo": (0.70, 0.60, 110.0), "grpo": (0.55, 0.50, 100.0)}
    for v in variants:
        for seed, jitter in ((0, -0.02), (1, 0.0), (2, 0.02)):
            acc, sampled, length = end[v.name]
            record = _fake_run(v.name, v.trainer, seed, acc + jitter, sampled + jitter, length + 10 * jitter)
            path = tmp_path / "runs" / v.name / f"seed{seed}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record))
    text = report_accuracy_link.build_accuracy_link_report(
        str(tmp_path), variants, (0, 1, 2), None, "Prediction: test\n", (("vcppo", "ppo"), ("vcppo", "grpo")), "t"
    )
    runs = report_stats.load_runs(str(tmp_path), [v.name for v in variants], (0, 1, 2))
    rows = {r["name"]: r for r in report_accuracy_link.accuracy_link_rows(runs, variants)}
    assert rows["ppo"]["d_acc"] == pytest.approx([-0.22, -0.2, -0.18])
    assert rows["vcppo"]["d_acc_sampled"] == pytest.approx([0.18, 0.2, 0.22])
    assert "| PPO | 3 | 0.300 ± 0.050 | -0.200 ± 0.050 (loses) | 0.250 ± 0.050 | -0.150 ± 0.050 (loses) |" in text
    assert "| VC-PPO | 3 | 0.700 ± 0.050 | 0.200 ± 0.050 (gains) |" in text
    assert "| VC-PPO − PPO | +0.400 [" in text and "(differs)" in text
    # greedy and sampled lengths each compared (both differ by 70 tokens here)
    comparison = next(line for line in text.splitlines() if line.startswith("| VC-PPO − PPO |"))
    assert comparison.count("+70.0 [") == 2 and comparison.count("|") == 6
    assert "| GRPO | 3 |" in text and "– → – |" in text  # no critic, no stop gap
    assert "Prediction: test" in text
    # critic fit: pretraining's last 5 (0.1..0.5 -> 0.3), own targets 0.02 -> 0.07, MC mean over buckets 0.035
    assert "| VC-PPO | 0.300 ± 0.000 | 0.020 ± 0.000 → 0.070 ± 0.000 | 0.035 ± 0.000 → 0.035 ± 0.000 |" in text
    assert "| PPO | – | 0.020 ± 0.000 → 0.070 ± 0.000 |" in text
    assert "| GRPO | –" not in text.split("How much the critics explain")[1]
    assert os.path.getsize(tmp_path / "training_curves.png") > 1000


def test_harness_runs_the_accuracy_link_grid_on_a_tiny_budget_with_seeds(tmp_path):
    """`reproduce.py --task count-mod-5 --seeds 3`: the VAPO arm is a VAPOTrainer run with its parts on (clip-higher,
    LM loss, length-adaptive λ at the budget's α, group sampling), an ablation sets its option, GRPO takes
    `epsilon_high`; every run records the sampled held-out evaluation beside the greedy one, and the report holds the
    prediction, the grid and the comparisons. No outcome is asserted."""
    import reproduce
    import task_running_sum

    results, cache = str(tmp_path / "results"), str(tmp_path / "cache")
    argv = ["--task", "count-mod-5", "--smoke", "--seeds", "3", "--results-dir", results, "--cache-dir", cache]
    variants = ["vcppo", "vapo", "vapo_no_lm_loss", "grpo_clip_higher"]
    assert reproduce.main([*argv, "--workers", "1", "--variants", *variants]) == 0
    runs = os.path.join(results, "count_mod_5", "runs")
    records = {}
    for name in variants:
        with open(os.path.join(runs, name, "seed3.json")) as f:
            records[name] = json.load(f)
        record = records[name]
        assert record["seed"] == 3 and record["budget"]["tally"] == "counts"
        assert record["final_eval_sampled"]["num_samples"] == 2
        assert record["cold_start_eval_sampled"]["num_examples"] == record["final_eval"]["num_examples"]
    assert records["grpo_clip_higher"]["variant"]["options"] == [["epsilon_high", 0.28]]
    vapo_first = report_stats.training_entries(records["vapo"])[0]
    assert "policy/clipfrac_high_avg" in vapo_first and "loss/positive_example_lm_avg" in vapo_first
    no_lm_first = report_stats.training_entries(records["vapo_no_lm_loss"])[0]
    assert "loss/positive_example_lm_avg" not in no_lm_first
    assert (
        len(report_stats.pretrain_entries(records["vapo"]))
        == task_running_sum.COUNT_MOD_5_SMOKE_BUDGET.pretrain_updates
    )
    with open(os.path.join(results, "count_mod_5", "results.md")) as f:
        text = f.read()
    assert task_running_sum.ACCURACY_LINK_PREDICTION.splitlines()[0] in text
    # The header names the command that rebuilds this report: its results directory and seeds.
    assert f"--task count-mod-5 --report --results-dir {results} --seeds 3` from `runs/`" in text
    assert "| VAPO (every part, α_toy) | 1 |" in text and "Comparisons" in text
    for png in ("training_curves.png", "stop_gap_by_position.png", "advantage_by_position.png"):
        assert os.path.getsize(os.path.join(results, "count_mod_5", png)) > 1000, png


def test_report_command_names_the_results_directory_and_seeds_only_where_they_are_not_the_defaults():
    import reproduce
    from run_files import DEFAULT_RESULTS

    base = "python experiments/reproduce.py --task count-mod-5 --report"
    assert reproduce.report_command("count-mod-5", DEFAULT_RESULTS, (0, 1), (0, 1)) == base
    u30 = os.path.join(os.path.dirname(DEFAULT_RESULTS), "results", "accuracy_link", "u30")
    assert (
        reproduce.report_command("count-mod-5", u30, (5, 6, 7), (0, 1))
        == base + " --results-dir experiments/results/accuracy_link/u30 --seeds 5 6 7"
    )

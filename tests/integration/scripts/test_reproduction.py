"""The toy reproduction's parts: the length-choice task, the reward-model and controlled-bias critic builders, the
position-bucket diagnostics, and the harness on a tiny budget (no outcome is asserted: outcomes are measured).

The experiments/ modules (`reproduce`, `report_stats`, `task_majority`) are imported as top-level modules: pytest's
`pythonpath` setting (pyproject.toml) puts experiments/ on the import path, as running a script there does."""

import json
import math
import os

import pytest
import report_stats
import reproduce
import task_majority
import torch
from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

from vcppo_trl import PPOConfig, PPOTrainer
from vcppo_trl.algo.diagnostics import position_bucket_explained_variance, position_bucket_means
from vcppo_trl.models.value_model import load_value_model
from vcppo_trl.toy import make_arithmetic_dataset
from vcppo_trl.toy.reward_model import build_controlled_bias_critic, build_reward_model, position_ramp
from vcppo_trl.toy.task import format_short_solution, format_solution, response_mode

from ...builders import length_reward, tiny_policy


class TestLengthChoiceTask:
    def test_short_solution_is_compressed_and_correct(self):
        short, long = format_short_solution(4738, 2919), format_solution(4738, 2919)
        assert short == "<think>8+9+0=17\n3+1+1=5\n7+9+0=16\n4+2+1=7\n</think> \\boxed{7657}"
        assert len(short) < 0.6 * len(long)
        assert response_mode(short) == "short" and response_mode(long) == "long"
        assert response_mode("no think block") is None and response_mode("<think>1+1=2") is None

    def test_short_fraction_mixes_forms_and_keeps_plain_datasets_unchanged(self):
        mixed = make_arithmetic_dataset(400, seed=0, short_fraction=0.5)
        share = mixed["mode"].count("short") / 400
        assert 0.4 < share < 0.6
        for row in mixed.select(range(20)):
            assert response_mode(row["completion"]) == row["mode"]
        plain = make_arithmetic_dataset(50, seed=0)
        assert set(plain["mode"]) == {"long"}
        # The default draws nothing extra from the generator: same prompts as a mixed dataset would not guarantee.
        assert plain["prompt"] == make_arithmetic_dataset(50, seed=0, short_fraction=0.0)["prompt"]
        with pytest.raises(ValueError, match="short_fraction"):
            make_arithmetic_dataset(5, short_fraction=1.5)


class TestPositionBuckets:
    def test_means_by_relative_position_hand_computed(self):
        # Row 0: 4 tokens -> buckets (4 buckets) 0,1,2,3. Row 1: 2 tokens -> buckets 0, 2. Padding ignored.
        values = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 99.0, 99.0]])
        mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
        means = position_bucket_means(values, mask, num_buckets=4)
        assert means.tolist() == [5.5, 2.0, 11.5, 4.0]
        # A bucket no token falls in is nan.
        assert math.isnan(position_bucket_means(values[1:], mask[1:], num_buckets=4)[1])

    def test_explained_variance_per_bucket(self):
        returns = torch.tensor([[1.0, 0.0], [-1.0, 2.0], [3.0, 4.0]])
        values = torch.tensor([[1.0, 5.0], [-1.0, 5.0], [3.0, 5.0]])  # exact in bucket 0, constant in bucket 1
        ev = position_bucket_explained_variance(values, returns, torch.ones(3, 2), num_buckets=2)
        assert ev[0] == pytest.approx(1.0)
        var = torch.tensor([0.0, 2.0, 4.0]).var()
        assert ev[1] == pytest.approx(float(1 - (torch.tensor([0.0, 2.0, 4.0]) - 5).var() / var))

    def test_trainer_logs_bucket_diagnostics(self, make_trainer, tiny_config):
        trainer = make_trainer(cls=PPOTrainer, reward_funcs=length_reward, args=tiny_config(PPOConfig))
        trainer.train()
        log = next(h for h in trainer.state.log_history if "loss/policy_avg" in h)
        for k in range(8):
            for name in ("advantage_bucket", "value_error_bucket", "mc_explained_variance_bucket"):
                assert f"diagnostics/{name}_{k}" in log
        rollout, advantages = trainer.last_update.rollout, trainer.last_update.advantages
        expected = position_bucket_means(advantages, rollout.response_mask, 8)
        # The last update's advantages give the last log's advantage buckets (one process: nothing to gather).
        last = [h for h in trainer.state.log_history if "loss/policy_avg" in h][-1]
        for k in range(8):
            if not math.isnan(expected[k]):
                assert last[f"diagnostics/advantage_bucket_{k}"] == pytest.approx(float(expected[k]), rel=1e-5)

    def test_position_ramp(self):
        mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
        ramp = position_ramp(mask, bias=2.0)
        assert torch.allclose(ramp, torch.tensor([[-1.5, -1.0, -0.5, 0.0], [-1.0, 0.0, 0.0, 0.0]]))


@pytest.fixture(scope="module")
def rm_setup(tokenizer):
    policy = tiny_policy(tokenizer)
    data = make_arithmetic_dataset(8, seed=0, max_digits=2, short_fraction=0.5)
    return policy, data


def test_reward_model_builder_trains_saves_and_caches(rm_setup, tokenizer, tmp_path):
    policy, data = rm_setup
    out = str(tmp_path / "rm")
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    model, stats = build_reward_model(
        policy, tokenizer, data, output_dir=out, num_samples=8, num_epochs=2, batch_size=4, max_new_tokens=16
    )
    assert stats["num_responses"] == 8 and stats["label_mean"] == -1.0  # an untrained policy is always wrong
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items()), "the policy must not move"
    loaded = AutoModelForSequenceClassification.from_pretrained(out)
    assert loaded.config.num_labels == 1
    critic = load_value_model(out)  # what value_model=<path> does
    assert isinstance(critic, torch.nn.Module) and type(critic).__name__.endswith("ForTokenClassification")

    # A second call with the same settings loads the cached model: the reward function is never called.
    def must_not_run(**kwargs):
        raise AssertionError("the cached reward model was rebuilt")

    cached, cached_stats = build_reward_model(
        policy,
        tokenizer,
        data,
        output_dir=out,
        num_samples=8,
        num_epochs=2,
        batch_size=4,
        max_new_tokens=16,
        reward_func=must_not_run,
    )
    assert cached_stats == stats
    ids = torch.tensor([[5, 6, 7]])
    assert torch.allclose(cached(input_ids=ids).logits, model(input_ids=ids).logits)


def test_reward_model_with_truncated_prefixes(rm_setup, tokenizer, tmp_path):
    """Our device: complete responses and truncated prefixes, each labelled by the verifier; cached, and loadable as a
    critic through `value_model=`."""
    from vcppo_trl.rewards.math_verify import math_verify_reward

    policy, data = rm_setup
    calls = []

    def recording_verifier(completions, solution, **kwargs):
        calls.append(list(completions))
        return math_verify_reward(completions, solution)

    out = str(tmp_path / "prefix_rm")
    kwargs = dict(output_dir=out, num_samples=8, num_epochs=1, batch_size=4, max_new_tokens=16)
    model, stats = build_reward_model(
        policy, tokenizer, data, reward_func=recording_verifier, prefixes_per_response=2, **kwargs
    )
    complete, prefixes = calls  # one call on the 8 responses, one on their 16 prefixes
    assert len(complete) == 8 and len(prefixes) == 16
    # The prefixes of response i are entries 2i and 2i + 1; a cut before the EOS token gives the whole text.
    assert all(complete[n // 2].startswith(prefix) for n, prefix in enumerate(prefixes))
    assert any(len(prefix) < len(complete[n // 2]) for n, prefix in enumerate(prefixes))
    assert stats["num_responses"] == 24.0 and stats["num_prefixes"] == 16.0
    assert stats["prefix_label_mean"] == -1.0  # none holds a whole (right) answer
    assert math.isfinite(stats["prefix_score_mean"]) and math.isfinite(stats["complete_score_mean"])
    with open(os.path.join(out, "toy_build_settings.json")) as f:
        settings = json.load(f)
    assert settings["kind"] == "reward_model_with_prefixes" and settings["prefixes_per_response"] == 2
    critic = load_value_model(out)  # what value_model=<path> does
    assert type(critic).__name__.endswith("ForTokenClassification") and critic.config.num_labels == 1

    # Cached with its settings: the same call loads it; a reward model without prefixes is another model.
    def must_not_run(**kw):
        raise AssertionError("the cached reward model was rebuilt")

    cached, cached_stats = build_reward_model(
        policy, tokenizer, data, reward_func=must_not_run, prefixes_per_response=2, **kwargs
    )
    assert cached_stats == stats
    ids = torch.tensor([[5, 6, 7]])
    assert torch.allclose(cached(input_ids=ids).logits, model(input_ids=ids).logits)
    calls.clear()
    _, plain_stats = build_reward_model(policy, tokenizer, data, reward_func=recording_verifier, **kwargs)
    assert len(calls) == 1 and "num_prefixes" not in plain_stats
    with pytest.raises(ValueError, match="prefixes_per_response"):
        build_reward_model(policy, tokenizer, data, prefixes_per_response=-1)


def test_controlled_bias_critic_is_a_loadable_critic(rm_setup, tokenizer, tmp_path):
    policy, data = rm_setup
    rm, _ = build_reward_model(policy, tokenizer, data, num_samples=4, num_epochs=1, max_new_tokens=8)
    out = str(tmp_path / "cb")
    critic, stats = build_controlled_bias_critic(
        rm,
        policy,
        tokenizer,
        data,
        bias=1.0,
        output_dir=out,
        num_samples=8,
        num_epochs=1,
        batch_size=4,
        max_new_tokens=16,
    )
    assert math.isfinite(stats["mse"])
    # The targets it was taught fall by ~bias from the first to the last position bucket.
    assert stats["target_bucket_0"] < stats["target_bucket_7"]
    loaded = AutoModelForTokenClassification.from_pretrained(out)
    assert loaded.config.num_labels == 1
    with open(os.path.join(out, "toy_build_settings.json")) as f:
        assert json.load(f)["kind"] == "controlled_bias_critic"


def test_harness_on_a_tiny_budget_writes_table_and_plots(tmp_path):
    results, cache = str(tmp_path / "results"), str(tmp_path / "cache")
    code = reproduce.main(
        ["--smoke", "--variants", "ppo", "vcppo", "--results-dir", results, "--cache-dir", cache, "--workers", "1"]
    )
    assert code == 0
    for name in ("ppo", "vcppo"):
        with open(os.path.join(results, "runs", name, "seed0.json")) as f:
            record = json.load(f)
        assert record["variant"]["name"] == name and "accuracy" in record["final_eval"]
        assert any("diagnostics/advantage_bucket_0" in e for e in record["log_history"])
    with open(os.path.join(results, "results.md")) as f:
        table = f.read()
    assert "PPO (RM critic" in table and "VC-PPO (pretrain" in table
    for png in ("training_curves.png", "advantage_by_position.png", "lambda_critic.png", "value_pretraining.png"):
        assert os.path.getsize(os.path.join(results, png)) > 1000, png
    # Resumable: a second call finds every run saved and only rebuilds the report.
    mtime = os.path.getmtime(os.path.join(results, "runs", "ppo", "seed0.json"))
    assert reproduce.main(["--smoke", "--variants", "ppo", "--results-dir", results, "--cache-dir", cache]) == 0
    assert os.path.getmtime(os.path.join(results, "runs", "ppo", "seed0.json")) == mtime


def test_harness_seeds_flag_records_seed_and_commit(tmp_path):
    """`--seeds` runs (and reports) the given seeds instead of the budget's; each run's file records its seed and the
    commit; a later call with more seeds keeps the saved runs. No outcome is asserted."""
    results, cache = str(tmp_path / "results"), str(tmp_path / "cache")
    argv = ["--smoke", "--variants", "ppo", "--results-dir", results, "--cache-dir", cache, "--workers", "1"]
    assert reproduce.main([*argv, "--seeds", "7"]) == 0
    path = os.path.join(results, "runs", "ppo", "seed7.json")
    with open(path) as f:
        record = json.load(f)
    assert record["seed"] == 7 and record["budget"]["seeds"] == [7]
    assert record["commit"] is None or len(record["commit"].split("-")[0]) == 40
    assert not os.path.exists(os.path.join(results, "runs", "ppo", "seed0.json"))  # the budget's seed is not run
    mtime = os.path.getmtime(path)
    assert reproduce.main([*argv, "--seeds", "7", "8"]) == 0
    assert os.path.getmtime(path) == mtime  # saved under another seed list: kept
    with open(os.path.join(results, "runs", "ppo", "seed8.json")) as f:
        assert json.load(f)["seed"] == 8
    with pytest.raises(SystemExit):
        reproduce.main([*argv, "--seeds", "7", "7"])
    assert "loses length" in reproduce.PREDICTION.lower()


def test_majority_grid_on_a_tiny_budget_checks_the_prediction(tmp_path):
    """`--task majority`: the slow-critic arm trains its critic at ½ the policy's lr, with the budget's slow-arm
    pretraining; the report holds the prediction, the grid with verdicts, the claim per critic speed and the plots.
    No outcome is asserted."""
    results, cache = str(tmp_path / "results"), str(tmp_path / "cache")
    argv = ["--task", "majority", "--smoke", "--results-dir", results, "--cache-dir", cache, "--workers", "1"]
    assert reproduce.main([*argv, "--variants", "ppo", "ppo_slow", "vcppo_slow"]) == 0
    runs = os.path.join(results, "majority", "runs")
    first_ppo = {}
    for name in ("ppo", "ppo_slow", "vcppo_slow"):
        with open(os.path.join(runs, name, "seed0.json")) as f:
            record = json.load(f)
        assert report_stats.critic_ratio(record) == (2.0 if name == "ppo" else 0.5)
        first_ppo[name] = report_stats.training_entries(record)[0]
        assert "diagnostics/stop_advantage_gap" in first_ppo[name]
    # The same schedule at a quarter of the critic lr (ratio ½ against the budget's 2); the policy lr unchanged.
    assert first_ppo["ppo_slow"]["value_lr"] == pytest.approx(0.25 * first_ppo["ppo"]["value_lr"], rel=1e-6)
    assert first_ppo["ppo_slow"]["lr"] == first_ppo["ppo"]["lr"]
    with open(os.path.join(runs, "vcppo_slow", "seed0.json")) as f:
        pretraining = report_stats.pretrain_entries(json.load(f))
    assert len(pretraining) == task_majority.MAJORITY_SMOKE_BUDGET.slow_pretrain_updates
    with open(os.path.join(results, "majority", "results.md")) as f:
        text = f.read()
    assert reproduce.PREDICTION.splitlines()[0] in text
    # The header names the command that rebuilds this report: its results directory, not the default one.
    assert f"Generated by `python experiments/reproduce.py --task majority --report --results-dir {results}" in text
    assert "| PPO (RM critic, λ .95/.95), critic lr ½x | 0.5 | 1 |" in text
    assert "critic/policy lr 0.5" in text and "claim" in text
    assert "Controlled-bias critic" not in text  # no variant run used it: neither built nor reported
    for png in ("training_curves.png", "stop_gap_by_position.png", "advantage_by_position.png"):
        assert os.path.getsize(os.path.join(results, "majority", png)) > 1000, png


def test_the_controlled_bias_critic_is_built_only_for_variants_that_start_from_it():
    assert reproduce.needs_controlled_bias_critic(reproduce.MAIN_VARIANTS)  # the first toy's ppo_biased, vcppo_biased
    assert not reproduce.needs_controlled_bias_critic(reproduce.TASK_VARIANTS["majority"])
    assert not reproduce.needs_controlled_bias_critic(reproduce.ACCURACY_LINK_GRID)


def test_verdicts_follow_the_written_rule():
    assert report_stats.verdict([-0.3, -0.25, -0.2]) == "loses"
    assert report_stats.verdict([0.3, 0.25, 0.2]) == "gains"
    assert report_stats.verdict([-0.3, 0.0, 0.3]) == "keeps"
    assert report_stats.verdict([0.1]) == "–"  # one seed: no interval, no verdict


def test_assets_section_lists_the_critics_built_and_nothing_without_a_cache(tmp_path):
    assert report_stats.assets_section(None, [("Reward model", "reward_model_stats")]) == ""
    assert report_stats.assets_section(str(tmp_path), [("Reward model", "reward_model_stats")]) == ""
    with open(tmp_path / "assets.json", "w") as f:
        json.dump({"reward_model_stats": {"mse": 0.5}, "cold_start_seconds": 12.4, "critic_build_seconds": 3.6}, f)
    section = report_stats.assets_section(
        str(tmp_path), [("Reward model", "reward_model_stats"), ("Controlled-bias critic", "controlled_bias_stats")]
    )
    assert section == '\n## Assets\n\n- Reward model: {"mse": 0.5}\n- Cold start 12 s, critics 4 s\n'

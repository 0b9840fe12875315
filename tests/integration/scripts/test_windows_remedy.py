"""experiments/windows_remedy.py (issue 49's table): the arms as the plan fixes them, one smoke sweep of every arm
from one pretrained critic per seed (each arm in its own process, as the table's), and the report's reading rule."""

import contextlib
import dataclasses
import io
import json
import math
import os
import re

import pytest
import report_windows_remedy as report
import torch
import windows_remedy as wr
from cut_advantages import cut_advantage_trainer, cut_advantages
from train_when_finished import finished_response_tokens, train_when_finished_trainer

from vcppo_trl import VCPPOConfig


def _arm(name):
    return next(a for a in wr.ARMS if a.name == name)


def test_the_arms_are_the_plans():
    """plan.md §4: A and E take the budget's 20 updates, B, C and D 52; C's batch is 12, D's learning rate makes
    Σ lr·steps A's, E's pool is 80 (accepted by the config's check), and every arm loads the seed's critic."""
    budget = wr.BUDGET
    assert budget.seeds == tuple(range(208, 216)) and budget.ppo_updates == 20 and budget.prompts_per_update == 32
    updates = {a.name[0]: a.ppo_updates(budget) for a in wr.ARMS}
    assert updates == {"A": 20, "B": 52, "C": 52, "D": 52, "E": 20, "F": 20, "G": 20, "H": 20, "J": 20, "K": 20}
    assert all(a.critic == "pretrained" and not a.pretrain for a in wr.ARMS)
    assert {a.name[0]: a.eval_every for a in wr.ARMS} == {
        "A": 5,
        "B": 13,
        "C": 13,
        "D": 13,
        "E": 5,
        "F": 5,
        "G": 5,
        "H": 5,
        "J": 5,
        "K": 5,
    }
    c = dict(_arm("C_whole_batch12").options)
    assert c["per_device_train_batch_size"] * c["gradient_accumulation_steps"] * budget.num_mini_batches == 12
    lr = dict(_arm("D_window_low_lr").options)["learning_rate"]
    assert math.isclose(lr * 52, budget.learning_rate * 20)
    assert [a.generation_window(budget) for a in wr.ARMS] == [None, 80, None, 80, 80, 80, None, 80, None, None]
    g = _arm("G_whole_cut_advantages")  # follow-up 1: A but for the cut every W tokens
    assert dataclasses.replace(g, name="A_whole", label=_arm("A_whole").label, advantage_cut_divisor=None) == _arm(
        "A_whole"
    )
    assert budget.response_length // g.advantage_cut_divisor == 80
    h = _arm("H_window_train_finished")  # follow-up 2: E but for when a response is trained
    e = _arm("E_window_pool80")
    assert dataclasses.replace(h, name=e.name, label=e.label, train_when_finished=False) == e
    j = _arm("J_whole_one_step_off")  # follow-up 3: A but one update stale
    assert dataclasses.replace(j, name="A_whole", label=_arm("A_whole").label, options=()) == _arm("A_whole")
    assert dict(j.options) == {"max_staleness": 1, "rollout_worker_threads": 1}
    k = _arm("K_whole_one_step_off_uncorrected")  # follow-up 4: J but for the sampler correction
    assert dict(k.options) == {**dict(j.options), "vllm_importance_sampling_correction": False}
    for name in ("E_window_pool80", "F_pool80_finished_whitening"):
        options = dict(_arm(name).options)
        VCPPOConfig(
            output_dir="/tmp/unused",
            per_device_train_batch_size=budget.per_device_train_batch_size,
            gradient_accumulation_steps=budget.gradient_accumulation_steps,
            num_mini_batches=budget.num_mini_batches,
            response_length=budget.response_length,
            generation_window=80,
            **options,
        )
        assert options["rollout_pool_size"] == 80


def test_the_reading_rule_and_the_verdicts():
    assert report.reading(0.01, 0.2) == "first higher" and report.reading(-0.2, -0.01) == "second higher"
    assert report.reading(-0.04, 0.049) == "equivalent" and report.reading(-0.06, 0.02) == "not resolved"
    pairs = report.PAIRS[:5]

    def readings(below):
        return {
            (a, b, k): ("second higher" if (a[0], b[0]) in below else "not resolved")
            for a, b in pairs
            for k in ("greedy", "sampled")
        }

    step_noise = report.verdicts(readings({("C", "A"), ("B", "A")}))
    assert "support step noise" in step_noise[0] and "recommend rollout_pool_size" in step_noise[-1]
    bootstrap = report.verdicts(readings({("B", "A"), ("D", "A"), ("E", "A")}))
    assert "support the bootstrap" in bootstrap[0] and "the default stays" in bootstrap[-1]
    assert "nothing to remedy" in report.verdicts(readings(set()))[-1]
    assert "no verdict" in report.verdicts({})[0]
    h_a, h_e = ((*pair, "greedy") for pair in report.FOLLOWUP2_PAIRS)
    training = report.followup2_verdict({h_a: "not resolved", h_e: "first higher"})
    assert (
        "training side" in training and report.followup2_verdict({h_a: "equivalent", h_e: "first higher"}) == training
    )
    sampling = report.followup2_verdict({h_a: "second higher", h_e: "not resolved"})
    assert "sampling a response" in sampling
    for both in ({h_a: "second higher", h_e: "first higher"}, {h_a: "not resolved", h_e: "not resolved"}):
        assert "no verdict" in report.followup2_verdict(both)
    assert "not every comparison" in report.followup2_verdict({h_a: "equivalent"})
    j_a, j_e = ((*pair, "greedy") for pair in report.FOLLOWUP3_PAIRS)
    stale = report.followup3_verdict({j_a: "second higher", j_e: "not resolved"})
    assert "staleness alone costs" in stale
    assert "does not explain" in report.followup3_verdict({j_a: "equivalent", j_e: "first higher"})
    assert "no verdict" in report.followup3_verdict({j_a: "not resolved", j_e: "not resolved"})
    assert "not every comparison" in report.followup3_verdict({})
    k_a, k_j = ((*pair, "greedy") for pair in report.FOLLOWUP4_PAIRS)
    assert "withdrawn" in report.followup4_verdict({k_a: "not resolved", k_j: "first higher"})
    assert "corrected or not" in report.followup4_verdict({k_a: "second higher", k_j: "equivalent"})
    assert "no verdict" in report.followup4_verdict({k_a: "second higher", k_j: "first higher"})


def _cut_reference(rewards, values, lengths, gamma, lam, segment):
    """Follow-up 1's advantages by their definition, a float64 loop: GAE restarted at each multiple of `segment`,
    bootstrapped from V at the segment's end where the response goes on past it."""
    out = torch.zeros(rewards.shape, dtype=torch.float64)
    for b, n in enumerate(lengths):
        v = values[b].double()
        for t in range(n):
            end = min((t // segment + 1) * segment, n)
            acc, weight = 0.0, 1.0
            for k in range(t, end):
                following = v[k + 1] if k + 1 < n else 0.0
                acc += weight * (rewards[b, k].double() + gamma * following - v[k])
                weight *= gamma * lam
            out[b, t] = acc
    return out


@pytest.mark.parametrize("segment", [1, 3, 5, 7, 40])
def test_cut_advantages_restart_gae_at_every_cut(segment):
    torch.manual_seed(segment)
    lengths = [14, 5, 10, 0, 1]
    T = 14
    mask = torch.tensor([[t < n for t in range(T)] for n in lengths])
    rewards = torch.randn(len(lengths), T) * mask
    values = torch.randn(len(lengths), T) * mask
    got = cut_advantages(rewards, values, mask, gamma=0.99, lam_actor=0.95, segment=segment)
    want = _cut_reference(rewards, values, lengths, 0.99, 0.95, segment)
    assert torch.allclose(got.double(), want, atol=1e-5)
    if segment >= T:  # one segment: whole-response GAE
        from vcppo_trl.algo import dual_lambda_gae

        whole, _ = dual_lambda_gae(rewards, values, mask, gamma=0.99, lam_actor=0.95, lam_critic=1.0)
        assert torch.equal(got, whole)
    with pytest.raises(ValueError, match="positive number of tokens"):
        cut_advantages(rewards, values, mask, gamma=1.0, lam_actor=0.95, segment=0)


def test_the_cut_trainer_keeps_the_critics_returns_and_refuses_windows():
    from vcppo_trl import VCPPOTrainer

    mask = torch.ones(2, 6, dtype=torch.bool)
    rollout = type("R", (), {})()
    rollout.rewards, rollout.values, rollout.response_mask = torch.zeros(2, 6), torch.randn(2, 6), mask
    rollout.rewards[:, -1] = 1.0
    rollout.action_tokens, rollout.action_mask, rollout.bootstrap_values = mask, None, None

    class Base:  # the parts of VCPPOTrainer the probe reads
        args = type("A", (), {"gamma": 1.0})()
        in_value_pretraining = False

        def compute_advantages(self, rollout):
            return torch.full((2, 6), 7.0), torch.full((2, 6), 3.0)

        def actor_lambda(self, action_tokens):
            return 0.95

    trainer = cut_advantage_trainer(Base, 2)()
    advantages, returns = trainer.compute_advantages(rollout)
    assert torch.equal(returns, torch.full((2, 6), 3.0))
    assert torch.allclose(
        advantages, cut_advantages(rollout.rewards, rollout.values, mask, gamma=1.0, lam_actor=0.95, segment=2)
    )
    trainer.in_value_pretraining = True  # value pretraining: the base's advantages, untouched
    assert torch.equal(trainer.compute_advantages(rollout)[0], torch.full((2, 6), 7.0))
    trainer.in_value_pretraining = False
    rollout.bootstrap_values = torch.zeros(2)
    with pytest.raises(ValueError, match="without generation_window"):
        trainer.compute_advantages(rollout)
    assert cut_advantage_trainer(VCPPOTrainer, 80).__mro__[1] is VCPPOTrainer


def test_train_when_finished_trains_the_finished_responses_whole_tokens():
    """Follow-up 2's seam: after the advantages, `window_mask` holds every token of the finished responses and none of
    the others, whatever the window sampled; the base computes the advantages from that rollout; value pretraining
    and a rollout without windows or with tool tokens are left alone or refused."""
    from vcppo_trl import VCPPOTrainer

    response_mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    finished = torch.tensor([True, False, True])
    window = response_mask & (torch.arange(5) >= 2)  # this window's tokens
    rollout = type("R", (), {})()
    rollout.response_mask, rollout.finished, rollout.window_mask, rollout.action_mask = (
        response_mask,
        finished,
        window,
        None,
    )
    seen = []

    class Base:  # the part of VCPPOTrainer the probe calls
        in_value_pretraining = False

        def compute_advantages(self, rollout):
            seen.append(rollout.window_mask.clone())
            return torch.zeros(3, 5), torch.ones(3, 5)

    trainer = train_when_finished_trainer(Base)()
    advantages, returns = trainer.compute_advantages(rollout)
    want = torch.tensor([[1, 1, 1, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(rollout.window_mask, want) and torch.equal(seen[-1], want)
    assert torch.equal(finished_response_tokens(response_mask, finished), want)
    assert torch.equal(returns, torch.ones(3, 5))
    trainer.in_value_pretraining = True
    rollout.window_mask = window
    trainer.compute_advantages(rollout)
    assert torch.equal(rollout.window_mask, window)  # value pretraining: untouched
    trainer.in_value_pretraining = False
    for broken in ({"window_mask": None}, {"action_mask": response_mask}):
        bad = type("R", (), {})()
        bad.__dict__.update(vars(rollout) | broken)
        with pytest.raises(ValueError, match="set generation_window"):
            trainer.compute_advantages(bad)
    assert train_when_finished_trainer(VCPPOTrainer).__mro__[1] is VCPPOTrainer


def test_the_entropy_section_fits_the_whole_response_arms_only():
    """Accuracy = 0.7 − 10 × entropy rise on A and C exactly: an arm on that line has residual 0, one 0.1 below it
    −0.1; the correlation is over every run."""

    def run(rise, acc):
        return {"entropy_start": 0.02, "entropy_end": 0.02 + rise, "greedy_acc": acc, "kl_sum": 0.01}

    line = lambda rise: 0.7 - 10 * rise  # noqa: E731
    measures = {
        "A_whole": [run(r, line(r)) for r in (0.0, 0.002, 0.004)],
        "C_whole_batch12": [run(r, line(r)) for r in (0.01, 0.012, 0.014)],
        "B_window": [run(r, line(r) - 0.1) for r in (0.02, 0.021, 0.022)],
        "E_window_pool80": [run(r, line(r)) for r in (0.005, 0.006, 0.007)],
    }
    text = report.entropy_section(measures)
    assert "-10.0 accuracy per unit" in text
    assert "| B | 3 | -0.100 ± 0.000 |" in text and re.search(r"\| E \| 3 \| -?0\.000 ± 0\.000 \|", text)
    assert "| A |" not in text and "| C |" not in text
    assert report.entropy_section({"A_whole": measures["A_whole"]}) == ""


def test_every_arm_runs_from_the_seeds_critic_and_reports(tmp_path):
    results, cache = str(tmp_path / "results"), str(tmp_path / "cache")
    argv = ["--smoke", "--workers", "2", "--results-dir", results, "--cache-dir", cache]
    assert wr.main(argv) == 0
    with open(os.path.join(results, "runs", "critic", "seed0.json")) as f:
        critic = json.load(f)
    assert any("value_pretrain/explained_variance" in e for e in critic["log_history"])
    assert wr.critic_ready(critic, wr.SMOKE_BUDGET, cache, 0)
    assert not wr.critic_ready({**critic, "critic_sha256": "0" * 64}, wr.SMOKE_BUDGET, cache, 0)
    runs = {}
    for arm in wr.smoke_arms():
        with open(os.path.join(results, "runs", arm.name, "seed0.json")) as f:
            runs[arm.name[0]] = run = json.load(f)
        assert run["pretrained_critic"]["sha256"] == critic["critic_sha256"]
        assert not any("value_pretrain/explained_variance" in e for e in run["log_history"])  # loaded, not pretrained
        assert [e["update"] for e in run["held_out_along_run"]] == list(range(1, arm.ppo_updates(wr.SMOKE_BUDGET) + 1))
    measures = {k: report.run_measures(r) for k, r in runs.items()}
    assert {k: m["updates"] for k, m in measures.items()} == {
        "A": 2,
        "B": 6,
        "C": 6,
        "D": 6,
        "E": 2,
        "F": 2,
        "G": 2,
        "H": 2,
        "J": 2,
        "K": 2,
    }
    assert measures["C"]["finished"] == 6 * 2  # its own batch (1 × 1 × 2), not the budget's
    first = {k: next(e for e in r["log_history"] if "lr" in e) for k, r in runs.items()}
    assert math.isclose(first["D"]["lr"] / first["B"]["lr"], 20 / 52, rel_tol=1e-6)  # the table's lr × 20/52
    assert max(e.get("rollout/in_flight", 0) for e in runs["E"]["log_history"]) <= wr.SMOKE_POOL
    # G samples A's first batch (same seed and critic) and cuts its advantages: same responses, other advantages.
    first_a, first_g = (next(e for e in runs[k]["log_history"] if "lr" in e) for k in "AG")
    assert first_g["diagnostics/response_length_mean"] == first_a["diagnostics/response_length_mean"]
    assert first_g["diagnostics/advantage_finished_mean"] != first_a["diagnostics/advantage_finished_mean"]
    # H samples E's windows (same seed, critic and pool) but trains only finished responses, all their tokens.
    first_e, first_h = (next(e for e in runs[k]["log_history"] if "lr" in e) for k in "EH")
    assert first_h["rollout/finished_responses"] == first_e["rollout/finished_responses"]
    assert first_h["rollout/window_tokens"] == first_e["rollout/window_tokens"]
    assert first_e["diagnostics/advantage_unfinished_mean"] is not None
    assert first_h.get("diagnostics/advantage_unfinished_mean") is None  # no unfinished token is trained
    with open(os.path.join(results, "results.md")) as f:
        text = f.read()
    assert "| H − E |" in text and "Follow-up 2" in text
    assert "| J − A |" in text and "Follow-up 3" in text
    assert max(e.get("sampling/staleness_max", 0) for e in runs["J"]["log_history"]) == 1  # one update stale
    # K: the same staleness; that it trains without the correction is the learner's (test_parts.py).
    assert max(e.get("sampling/staleness_max", 0) for e in runs["K"]["log_history"]) == 1
    assert "| K − J |" in text and "Follow-up 4" in text
    assert "| G − A |" in text and "Follow-up 1 (greedy accuracy)" in text
    assert "| B − C |" in text and "## Held-out evaluation along the run" in text and "The seeds' critics" in text
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert wr.main(argv) == 0  # everything saved: nothing is run again
    assert "0 critics to do" in out.getvalue() and "0 runs to do" in out.getvalue()

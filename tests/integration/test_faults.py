"""Faults injected for real: failing and hanging verifiers, NaN losses, malformed rows, degenerate responses, signals."""

import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from datasets import Dataset

from vcppo_trl import NonFiniteTrainingError, RewardFunctionError
from vcppo_trl.checkpoint.files import missing_checkpoint_files
from vcppo_trl.rewards.calls import call_reward_function

from ..builders import tiny_policy

# ------------------------------------------------------------------ verifier faults


def flaky_reward(completions, **kwargs):
    """Fails differently on some samples: raises for 'boom', hangs for 'hang', NaN for 'nan', None for 'skip'."""
    out = []
    for c in completions:
        if c == "boom":
            raise RuntimeError("verifier crashed")
        if c == "hang":
            time.sleep(30)
        out.append({"nan": float("nan"), "inf": math.inf, "skip": None, "text": "1.0"}.get(c, 1.0))
    return out


def call(completions, timeout=0.5):
    return call_reward_function(
        flaky_reward, [""] * len(completions), completions, [[]] * len(completions), {}, timeout
    )


def test_failing_samples_get_failure_value_and_are_counted():
    start = time.monotonic()
    result = call(["ok", "boom", "hang", "nan", "inf", "skip", "text", "ok"])
    assert time.monotonic() - start < 5  # the hang is bounded: one batch timeout plus one per-sample timeout
    assert result.values == [1.0, -1.0, -1.0, -1.0, -1.0, None, -1.0, 1.0]
    assert result.failed == [False, True, True, True, True, False, True, False]
    assert result.failures == 5


def test_timeout_works_off_the_main_thread():
    box = {}
    worker = threading.Thread(target=lambda: box.update(result=call(["hang", "ok"])))
    worker.start()
    worker.join(10)
    assert box["result"].values == [-1.0, 1.0]


def test_timeout_works_in_a_worker_process():
    code = textwrap.dedent(
        """
        import time
        from vcppo_trl.rewards.calls import call_reward_function

        def reward(completions, **kw):
            if completions == ["hang"] or "hang" in completions and len(completions) > 1:
                time.sleep(60)
            return [1.0 for _ in completions]

        r = call_reward_function(reward, ["", ""], ["hang", "ok"], [[], []], {}, timeout=0.5)
        print(r.values)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[-1.0, 1.0]"


def test_whole_batch_failure_stops():
    with pytest.raises(RewardFunctionError, match="failed on all 2 samples"):
        call(["boom", "nan"])


def test_verifier_faults_in_training_are_counted(make_trainer, tiny_config):
    seen = {"calls": 0}

    def sometimes_failing(completions, **kwargs):
        seen["calls"] += 1
        if seen["calls"] == 1:
            raise RuntimeError("transient verifier crash")  # the whole batch call fails once
        # In a whole batch the first sample gets NaN; scored one by one, every sample is fine.
        return [float("nan") if i == 0 and len(completions) > 1 else 1.0 for i in range(len(completions))]

    trainer = make_trainer(reward_funcs=sometimes_failing, args=tiny_config(total_episodes=32, reward_timeout=5.0))
    trainer.train()
    failures = [e["reward/verifier_failures"] for e in trainer.state.log_history if "episode" in e]
    assert seen["calls"] == 1 + 16 + 1  # the crashed batch call, its 16 per-sample retries, the next batch
    assert failures == [0.0, 1.0]  # the crash cost nothing; the NaN sample is counted


# ------------------------------------------------------------------ numerical faults


def nan_value_loss(fail_calls):
    """clipped_value_loss that returns a NaN loss on the given (1-based) calls."""
    from vcppo_trl.algo import objective as ppo_loss

    original = ppo_loss.clipped_value_loss
    count = {"n": 0}

    def patched(*args, **kwargs):
        count["n"] += 1
        out = original(*args, **kwargs)
        if fail_calls(count["n"]):
            out.loss = out.loss * float("nan")
        return out

    return patched


def test_nonfinite_step_is_skipped(make_trainer, tiny_config, monkeypatch):
    from vcppo_trl.algo import objective as ppo_loss

    # One update = 2 minibatches × 2 micro-batches; the first micro-batch of the first step is NaN.
    monkeypatch.setattr(ppo_loss, "clipped_value_loss", nan_value_loss(lambda n: n == 1))
    trainer = make_trainer(args=tiny_config(total_episodes=32))
    policy, critic = trainer.unwrapped_policy_and_critic()
    trainer.train()
    logs = [e for e in trainer.state.log_history if "episode" in e]
    assert [e["diagnostics/nonfinite_steps"] for e in logs] == [1.0, 0.0]
    assert all(torch.isfinite(p).all() for p in list(policy.parameters()) + list(critic.parameters()))
    assert trainer.learner.steps.nonfinite_steps_in_a_row == 0


def test_persistent_nonfinite_loss_stops_with_last_checkpoint_intact(make_trainer, tiny_config, monkeypatch):
    from vcppo_trl.algo import objective as ppo_loss

    # Update 1 (4 micro-batches, 2 steps) is fine and saved; from update 2 on every loss is NaN.
    monkeypatch.setattr(ppo_loss, "clipped_value_loss", nan_value_loss(lambda n: n > 4))
    args = tiny_config(total_episodes=64, save_strategy="steps", save_steps=1, max_consecutive_nonfinite_steps=1)
    trainer = make_trainer(args=args)
    with pytest.raises(NonFiniteTrainingError, match="checkpoint-1, was saved before this and is intact"):
        trainer.train()
    assert sorted(os.listdir(args.output_dir)) == ["checkpoint-1"]
    assert missing_checkpoint_files(os.path.join(args.output_dir, "checkpoint-1"), 1) == []
    policy, _ = trainer.unwrapped_policy_and_critic()
    assert all(torch.isfinite(p).all() for p in policy.parameters())  # skipped steps never touched the weights


# ------------------------------------------------------------------ data faults


def test_bad_rows_are_dropped_and_counted(make_trainer, tiny_config):
    from vcppo_trl.rewards.math_verify import math_verify_reward

    rows = {
        "prompt": ["Add 1 and 2.\n"] * 16 + ["", "   ", "Add 3 and 4.\n", "Add " + "9" * 80 + " and 1.\n"],
        "solution": ["3"] * 16 + ["1", "1", None, "1"],
    }
    args = tiny_config(max_prompt_length=40, overlong_prompt="drop", total_episodes=16)
    trainer = make_trainer(
        reward_funcs=math_verify_reward,  # takes `solution` by name: rows without one cannot be scored
        args=args,
        train_dataset=Dataset.from_dict(rows),
    )
    report = trainer.data_reports["train"]
    assert report.dropped == {"empty_prompt": 2, "missing_solution": 1, "overlong_prompt": 1}
    assert len(trainer.train_dataset) == 16
    trainer.train()
    first = trainer.state.log_history[0]
    assert first["data/train_rows_dropped_empty_prompt"] == 2.0
    assert first["data/train_rows_dropped_overlong_prompt"] == 1.0


def test_overlong_prompts_are_truncated_and_counted(make_trainer, tiny_config):
    rows = {"prompt": ["Add 1 and 2.\n"] * 15 + ["Add " + "9" * 80 + " and 1.\n"]}
    trainer = make_trainer(
        args=tiny_config(max_prompt_length=40, total_episodes=16), train_dataset=Dataset.from_dict(rows)
    )
    assert trainer.data_reports["train"].truncated_prompts == 1
    maker = trainer.rollout_maker
    ids, _ = maker.tokenize_prompts(maker.prompt_texts([{"prompt": rows["prompt"][-1]}]))
    assert ids.shape[1] == 40


@pytest.mark.parametrize(
    "prompts, message",
    [
        ([1, 2, 3, 4], "must hold text or chat messages"),
        ([[{"text": "hi"}]] * 4, "must hold text or chat messages"),
        ([""] * 4, "no usable rows"),
    ],
)
def test_wrong_schema_stops_before_training(make_trainer, prompts, message):
    with pytest.raises(ValueError, match=message):
        make_trainer(train_dataset=Dataset.from_dict({"prompt": prompts}))


# ------------------------------------------------------------------ degenerate responses


def always_stop_policy(tokenizer):
    """A policy whose first sampled token is always EOS: every response is empty."""
    policy = tiny_policy(tokenizer)
    head = torch.nn.Linear(policy.config.hidden_size, policy.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(-30.0)
        head.bias[tokenizer.eos_token_id] = 30.0
    policy.lm_head = head
    policy.config.tie_word_embeddings = False
    return policy


def test_every_response_empty(make_trainer, tiny_config, tokenizer):
    trainer = make_trainer(model=always_stop_policy(tokenizer), args=tiny_config(total_episodes=16))
    trainer.train()
    rollout = trainer.last_update.rollout
    assert rollout.response_mask.sum(1).tolist() == [1] * 16  # only the stop token
    assert all(c == "" for c in rollout.completions)
    log = trainer.state.log_history[0]
    assert log["diagnostics/response_length_mean"] == 1.0 and math.isfinite(log["loss/value_avg"])


def test_single_token_and_truncated_responses(make_trainer, tiny_config):
    trainer = make_trainer(args=tiny_config(total_episodes=16, response_length=1, missing_eos_penalty=1.0))
    trainer.train()
    rollout = trainer.last_update.rollout
    assert rollout.response_ids.shape[1] == 1
    no_stop = ~rollout.has_stop
    assert no_stop.any()  # responses cut at response_length without a stop token
    assert torch.equal(rollout.scores[no_stop], rollout.raw_scores[no_stop] - 1.0)
    assert math.isfinite(trainer.state.log_history[0]["loss/policy_avg"])


def test_batch_with_no_scorable_sample_skips_the_update(make_trainer, tiny_config):
    trainer = make_trainer(reward_funcs=lambda completions, **kw: [None] * len(completions), args=tiny_config())
    policy, critic = trainer.unwrapped_policy_and_critic()
    before = [p.detach().clone() for p in list(policy.parameters()) + list(critic.parameters())]
    trainer.train()
    assert all(e.get("diagnostics/skipped_update") == 1.0 for e in trainer.state.log_history if "episode" in e)
    after = list(policy.parameters()) + list(critic.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, after))


# ------------------------------------------------------------------ preemption

PREEMPTIBLE_RUN = """
import sys
from transformers import TrainerCallback
from vcppo_trl import VCPPOConfig, VCPPOTrainer, TrainingInterrupted
from vcppo_trl.toy.model import build_tiny_model
from vcppo_trl.toy.task import make_splits
from vcppo_trl.toy.tokenizer import build_tokenizer

class Started(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        print(f"UPDATE {state.global_step}", flush=True)

tokenizer = build_tokenizer()
args = VCPPOConfig(
    output_dir=sys.argv[1], per_device_train_batch_size=4, gradient_accumulation_steps=1, num_ppo_epochs=1,
    total_episodes=4000, response_length=16, bf16=False, activation_checkpointing=False, report_to="none",
    save_strategy="no", use_cpu=True, num_sample_generations=0, disable_tqdm=True, value_pretrain_steps=2,
    logging_steps=1,
)
trainer = VCPPOTrainer(
    model=build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0),
    reward_funcs=lambda completions, **kw: [1.0 if len(c) < 10 else -1.0 for c in completions],
    args=args, train_dataset=make_splits(64, 16, seed=0, min_digits=1, max_digits=3)["train"],
    processing_class=tokenizer, callbacks=[Started()],
)
try:
    trainer.train()
except TrainingInterrupted as stop:
    print(stop, file=sys.stderr, flush=True)
    sys.exit(stop.exit_code)
print("FINISHED", flush=True)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_a_checkpoint_and_exits_nonzero(tmp_path, signum, make_trainer, tiny_config):
    script = tmp_path / "run.py"
    script.write_text(PREEMPTIBLE_RUN)
    out_dir = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, str(script), str(out_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        for line in process.stdout:  # wait until training is under way
            if line.startswith("UPDATE 1"):
                break
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 128 + signum, stderr
    checkpoints = [d for d in os.listdir(out_dir) if d.startswith("checkpoint-")]
    assert len(checkpoints) == 1
    checkpoint = os.path.join(out_dir, checkpoints[0])
    assert f"checkpoint saved to {checkpoint}" in stderr
    assert missing_checkpoint_files(checkpoint, 1) == []
    step = int(checkpoints[0].split("-")[1])
    assert 1 <= step < 1000

    # The checkpoint resumes: one more update from where the signal stopped the run.
    ppo_updates = max(1, step - 1)  # 2 pretraining updates + this many PPO updates: at least one more update
    args = tiny_config(
        output_dir=str(tmp_path / "resumed"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        num_mini_batches=1,
        total_episodes=4 * ppo_updates,
        value_pretrain_steps=2,
    )
    trainer = make_trainer(args=args)
    trainer.train(resume_from_checkpoint=checkpoint)
    assert trainer.state.global_step == 2 + ppo_updates > step


def test_wrong_number_of_rewards_stops_at_the_first_batch(make_trainer, tiny_config):
    """A function returning one value too few is a bug: a clear error at the first batch, no per-sample retries."""
    calls = []

    def drops_last(completions, **kwargs):
        calls.append(len(completions))
        return [1.0] * (len(completions) - 1)

    trainer = make_trainer(reward_funcs=drops_last, args=tiny_config(total_episodes=32))
    with pytest.raises(RewardFunctionError, match="'drops_last' returned 15 values for 16 completions"):
        trainer.train()
    assert calls == [16]  # one batch call, no retries, no second update
    assert trainer.state.global_step == 0


def test_raising_reward_function_is_still_retried_per_sample():
    calls = []

    def raises_on_batches(completions, **kwargs):
        calls.append(len(completions))
        if len(completions) > 1:
            raise RuntimeError("batch mode broken")
        return [0.5]

    result = call_reward_function(raises_on_batches, ["", ""], ["a", "b"], [[], []], {}, timeout=5.0)
    assert result.values == [0.5, 0.5] and result.failures == 0
    assert sorted(calls) == [1, 1, 2]

"""Fingerprints of tiny training runs, to check that a change meant to keep behaviour (a refactor) keeps it bit for bit.

    python scripts/equivalence.py record OUT.json [--checkpoints DIR] [--only NAME ...]
    python scripts/equivalence.py resume OUT.json --checkpoints DIR     # resume the checkpoints another commit wrote
    python scripts/equivalence.py compare BEFORE.json AFTER.json

`record` also checks the twins of one record (`TWINS`: a generation window as long as the response against the
whole-response run) and exits non-zero when a pair differs.

`record` trains each configuration below in-process on the toy policy and writes, per configuration: the logged
metrics of every entry of `state.log_history` (timings left out), the printed output (timings masked), the result of
`evaluate()`, and SHA-256 hashes of the policy's and the critic's weights. Run it at the commit before the change and
after it (same machine, same torch), then `compare`. With `--checkpoints`, each `resume*` configuration keeps its
mid-run checkpoint there (`DIR/<name>`); `resume` then continues from those checkpoints with the code checked out now,
and each fingerprint must equal the uninterrupted run's.

Multi-process runs (DDP, ZeRO-3) are fingerprinted by `tests/integration/distributed/worker.py`, which writes the
same kind of record per rank.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

TIMING = re.compile(r"(time/\S+|train_runtime|_s\b|\bs/update|\d+(\.\d+)? ?s\b)")


def weights_hash(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def clean(value):
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def log_history(trainer) -> list[dict]:
    return [
        {
            k: clean(v)
            for k, v in entry.items()
            if not k.startswith("time/") and k not in ("train_runtime", "perf/rollout_wait_s")
        }
        for entry in trainer.state.log_history
    ]


def masked_output(text: str) -> list[str]:
    """Printed lines with their timings masked (they differ between runs of the same code)."""
    return [re.sub(r"\d+(\.\d+)?", "#", line) if TIMING.search(line) else line for line in text.splitlines()]


def base_config(cls, output_dir: str, **overrides):
    kwargs = dict(
        output_dir=output_dir,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_mini_batches=2,
        num_ppo_epochs=1,
        total_episodes=32,
        response_length=16,
        bf16=False,
        activation_checkpointing=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        learning_rate=1e-3,
        num_sample_generations=0,
        local_rollout_forward_batch_size=16,
        disable_tqdm=True,
        seed=0,
    )
    from vcppo_trl import VCPPOConfig

    if cls is VCPPOConfig:
        kwargs["value_pretrain_steps"] = 0
    else:
        kwargs["lam"] = 0.95
    kwargs.update(overrides)
    return cls(**kwargs)


def length_reward(completions, **kwargs):
    return [1.0 if len(c) < 10 else -1.0 for c in completions]


# name -> (trainer class name, config overrides, extra trainer kwargs tag)
CONFIGS: dict[str, tuple[str, dict, str | None]] = {
    "ppo_kl_buckets_2epochs": ("PPO", dict(kl_coef=0.05, position_buckets=4, num_ppo_epochs=2), None),
    "ppo_seq_mean_token_sum": (
        "PPO",
        dict(loss_type="seq_mean_token_sum", value_loss_type="seq_mean_token_mean"),
        None,
    ),
    "ppo_token_mean_k3": ("PPO", dict(loss_type="token_mean", kl_coef=0.1, kl_estimator="k3"), None),
    "vcppo_pretrain_eval_samples": (
        "VCPPO",
        dict(
            value_pretrain_steps=2,
            eval_steps=2,
            eval_strategy="steps",
            num_sample_generations=2,
            eval_num_generations=2,
            total_episodes=48,
        ),
        "eval",
    ),
    "vcppo_pretrain_stop_rule": (
        "VCPPO",
        dict(
            value_pretrain_steps=5,
            value_pretrain_patience=1,
            value_pretrain_min_delta=0.5,
            value_pretrain_min_steps=2,
            value_pretrain_save_steps=[1],
            value_pretrain_cliprange_value=float("inf"),
        ),
        None,
    ),
    "vcppo_greedy_eval": ("VCPPO", dict(eval_num_generations=1), "eval"),
    "vcppo_on_policy_shortcut": (
        "VCPPO",
        dict(num_mini_batches=1, on_policy_shortcut=True, value_pretrain_steps=1),
        None,
    ),
    "vcppo_cosine_tiny_clip": (
        "VCPPO",
        dict(
            lr_scheduler_type="cosine",
            max_grad_norm=1e-3,
            warmup_steps=1,
            value_pretrain_steps=1,
            whiten_rewards=True,
            advantage_whitening="local",
        ),
        None,
    ),
    "vcppo_lora_kl": ("VCPPO", dict(kl_coef=0.05, value_pretrain_steps=1), "lora"),
    "vcppo_length_adaptive": ("VCPPO", dict(lam_actor_length_alpha=0.5, num_generations=2), None),
    "resume": ("VCPPO", dict(value_pretrain_steps=1, save_strategy="steps", save_steps=2), None),
    "vcppo_whole_responses": ("VCPPO", dict(value_pretrain_steps=1), None),
    # A generation window as long as the response must reproduce the whole-response run (its twin, below).
    "vcppo_window_as_long_as_response": ("VCPPO", dict(value_pretrain_steps=1, generation_window=16), None),
    "vcppo_window_quarter": ("VCPPO", dict(value_pretrain_steps=1, generation_window=4), None),
    # One-step-off overlap (a rollout worker process), alone and under a window, and a checkpoint of each mid-run.
    "vcppo_overlap": ("VCPPO", dict(value_pretrain_steps=1, max_staleness=1), None),
    "vcppo_window_quarter_overlap": (
        "VCPPO",
        dict(value_pretrain_steps=1, generation_window=4, max_staleness=1),
        None,
    ),
    "resume_overlap": (
        "VCPPO",
        dict(value_pretrain_steps=1, max_staleness=1, save_strategy="steps", save_steps=2),
        None,
    ),
    "resume_window_overlap": (
        "VCPPO",
        dict(value_pretrain_steps=1, generation_window=4, max_staleness=1, save_strategy="steps", save_steps=2),
        None,
    ),
    # Needs vLLM (the CPU build: scripts/setup_vllm_cpu.sh, then run with .venv-vllm/bin/python --only vllm_colocate).
    "vllm_colocate": (
        "VCPPO",
        dict(use_vllm=True, vllm_mode="colocate", value_pretrain_steps=1, vllm_importance_sampling_correction=True),
        "vllm",
    ),
}
DEFAULT_CONFIGS = [name for name, (_, _, extra) in CONFIGS.items() if extra != "vllm"]
# Configurations that must fingerprint alike within one record, less what only windows log.
TWINS = {"vcppo_window_as_long_as_response": "vcppo_whole_responses"}
WINDOW_ONLY = re.compile(r"  done \d+")


def build_trainer(name: str, output_dir: str):
    from vcppo_trl import PPOConfig, PPOTrainer, VCPPOConfig, VCPPOTrainer
    from vcppo_trl.toy.model import build_tiny_model
    from vcppo_trl.toy.task import make_splits
    from vcppo_trl.toy.tokenizer import build_tokenizer

    kind, overrides, extra = CONFIGS[name]
    config_cls, trainer_cls = (PPOConfig, PPOTrainer) if kind == "PPO" else (VCPPOConfig, VCPPOTrainer)
    tokenizer = build_tokenizer()
    hidden = 64 if extra == "vllm" else 32  # vLLM's CPU attention needs heads at least 32 wide
    policy = build_tiny_model(tokenizer, hidden_size=hidden, num_layers=1, num_heads=2, seed=0)
    splits = make_splits(64, 16, seed=0, min_digits=1, max_digits=3)
    kwargs = {}
    if extra == "eval":
        kwargs["eval_dataset"] = splits["test"]
    if extra == "lora":
        from peft import LoraConfig

        kwargs["peft_config"] = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    args = base_config(config_cls, output_dir, **overrides)
    return trainer_cls(
        model=policy,
        reward_funcs=length_reward,
        args=args,
        train_dataset=splits["train"],
        processing_class=tokenizer,
        **kwargs,
    )


def fingerprint(name: str, output_dir: str, resume_from: str | None = None) -> dict:
    # A real file, not a StringIO: vLLM's engine asks stdout for its file descriptor.
    with tempfile.TemporaryFile(mode="w+") as out, contextlib.redirect_stdout(out):
        trainer = build_trainer(name, output_dir)
        trainer.train(resume_from_checkpoint=resume_from)
        evaluation = trainer.evaluate() if trainer.eval_dataset is not None else None
        out.flush()
        out.seek(0)
        printed = out.read()
    wrapper = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    return {
        "log_history": log_history(trainer),
        "printed": masked_output(printed),
        "evaluate": {k: clean(v) for k, v in evaluation.items()} if evaluation else None,
        "policy_sha256": weights_hash(wrapper.policy),
        "critic_sha256": weights_hash(wrapper.critic),
    }


def record(path: str, names: list[str], checkpoints: str | None) -> int:
    results = {}
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            out_dir = os.path.join(tmp, "out")
            results[name] = fingerprint(name, out_dir)
            if name.startswith("resume") and checkpoints:
                kept = os.path.join(checkpoints, name)
                shutil.rmtree(kept, ignore_errors=True)
                shutil.copytree(os.path.join(out_dir, "checkpoint-2"), kept)
        print(f"{name}: policy {results[name]['policy_sha256'][:12]} critic {results[name]['critic_sha256'][:12]}")
    with open(path, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    return check_twins(results)


def window_only(key: str) -> bool:
    """What only a window logs (`rollout/...`, its tokens' ages) or leaves out by design (`frac_reward_zero_std`:
    groups finish apart)."""
    return key.startswith("rollout/") or key in TOKEN_AGE_METRICS or key == "frac_reward_zero_std"


TOKEN_AGE_METRICS = ("sample/token_staleness_mean", "sample/oldest_token_staleness_max")


def without_window_metrics(result: dict) -> dict:
    return {
        "log_history": [{k: v for k, v in e.items() if not window_only(k)} for e in result["log_history"]],
        "printed": [WINDOW_ONLY.sub("", line) for line in result["printed"]],
        "evaluate": result["evaluate"],
        "policy_sha256": result["policy_sha256"],
        "critic_sha256": result["critic_sha256"],
    }


def check_twins(results: dict) -> int:
    """Each twin pair recorded here must match (a window as long as the response is the whole-response run)."""
    failures = 0
    for name, twin in TWINS.items():
        if name in results and twin in results:
            same = without_window_metrics(results[name]) == without_window_metrics(results[twin])
            print(f"twin {name} == {twin}: {'IDENTICAL' if same else 'DIFFERENT'}")
            failures += not same
    return 1 if failures else 0


def resume(path: str, checkpoints: str) -> None:
    """Continue every `resume*` checkpoint kept in `checkpoints` (see `record`) and fingerprint the whole runs."""
    result = {}
    for name in sorted(os.listdir(checkpoints)):
        with tempfile.TemporaryDirectory() as tmp:
            out_dir = os.path.join(tmp, "out")
            os.makedirs(out_dir)
            checkpoint = os.path.join(out_dir, "checkpoint-2")
            shutil.copytree(os.path.join(checkpoints, name), checkpoint)
            result[name] = fingerprint(name, out_dir, resume_from=checkpoint)
        # Printed output of a resumed run starts at the checkpoint: compare only what a resumed run can reproduce.
        result[name]["printed"] = None
        print(f"{name}: policy {result[name]['policy_sha256'][:12]} critic {result[name]['critic_sha256'][:12]}")
    with open(path, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)


def compare(before_path: str, after_path: str) -> int:
    with open(before_path) as f:
        before = json.load(f)
    with open(after_path) as f:
        after = json.load(f)
    failures = 0
    for name in sorted(set(before) & set(after)):
        b, a = before[name], after[name]
        for key in ("policy_sha256", "critic_sha256", "evaluate", "log_history", "printed"):
            if a.get(key) is None or b.get(key) is None:
                continue
            if key == "log_history" and a[key] != b[key]:
                # A resumed run's history holds the saved entries and the new ones: compare the whole list.
                first = next(
                    (i for i, (x, y) in enumerate(zip(b[key], a[key])) if x != y), min(len(a[key]), len(b[key]))
                )
                print(f"DIFF {name} {key}: entry {first}: {b[key][first : first + 1]} != {a[key][first : first + 1]}")
                failures += 1
            elif a[key] != b[key]:
                print(f"DIFF {name} {key}")
                failures += 1
        print(f"{'same' if not failures else 'checked'} {name}")
    missing = sorted(set(before) ^ set(after))
    if missing:
        print(f"only in one file: {missing}")
    print("IDENTICAL" if failures == 0 else f"{failures} differences")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("record", "resume", "compare"))
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--checkpoints", default=None)
    parser.add_argument("--only", nargs="*", default=None)
    opts = parser.parse_args()
    if opts.mode == "compare":
        return compare(*opts.paths)
    if opts.mode == "resume":
        resume(opts.paths[0], opts.checkpoints)
        return 0
    return record(opts.paths[0], opts.only or DEFAULT_CONFIGS, opts.checkpoints)


if __name__ == "__main__":
    sys.exit(main())

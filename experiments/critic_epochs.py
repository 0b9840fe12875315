"""Value pretraining from stored rollouts on the count-mod-5 toy (issue 37; plan: results/critic_epochs/plan.md).

    python experiments/critic_epochs.py                 # the epochs table: 3 seeds x epochs 1, 2, 4 (results/critic_epochs/)
    python experiments/critic_epochs.py --timing        # online phase against store-once + train-from-dataset, timed
    .venv-vllm/bin/python experiments/critic_epochs.py --timing --use-vllm --critic-job   # the same, sampled by vLLM
    python experiments/critic_epochs.py --smoke         # the same code at tiny sizes (tests/integration/scripts)

Epochs table: per seed, the cached count-mod-5 cold-start policy samples `--train-batches` + `--heldout-batches`
prompt batches once (`store_rollouts`), then critics built from the policy pretrain on the training batches for 1, 2
and 4 epochs (`value_pretrain_dataset`, the held-out batches never trained on). Equal rollout cost: every variant
reads the same stored batches; one epoch is what an online phase of as many updates does with fresh rollouts.
After every update the critic's explained variance and ½(V − R)² on the held-out batches are logged
(`value_pretrain/heldout_*`), with the training batch's own (`value_pretrain/explained_variance`, values before the
update). Every run's log history is written under `runs/`; `results.md` is made from them.

Timing: the same cold start, `--timing-updates` critic updates three ways in one process, one after the other:
online (sampling every update), store that many batches then train on them (1 epoch), and store half as many then
train two epochs; the seconds of each, and their ratios to online. `--use-vllm` samples with colocated vLLM (its CPU
backend needs heads >= 32 wide: the cold start is rebuilt with 3 heads of 32, cached apart); its engine starts once,
before the first timed leg, and is reused by the others. `--critic-job` trains from the stored batches in critic jobs
(`value_pretrain_only`: no policy kept, nothing sampled).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from report_stats import mean_ci  # noqa: E402
from run_files import DEFAULT_CACHE, DEFAULT_RESULTS, git_commit, write_json  # noqa: E402
from task_running_sum import COUNT_MOD_5_BUDGET, COUNT_MOD_5_SMOKE_BUDGET  # noqa: E402

SEEDS = (300, 301, 302)  # not used by the count-mod-5 tables or their pilots (0-7, 31-33, 100, 101, 200-207)
EPOCHS = (1, 2, 4)


def phase_only_callback(trainer):
    """Stop training as soon as value pretraining has ended (the PPO updates after it are not this experiment's)."""
    from transformers import TrainerCallback

    class StopAfterPhase(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if trainer.value_pretraining.done:
                control.should_training_stop = True
            return control

    return StopAfterPhase()


def make_trainer(budget, assets_dir: str, out_dir: str, seed: int, pretrain_updates: int, **options):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vcppo_trl import VCPPOConfig, VCPPOTrainer
    from vcppo_trl.rewards.math_verify import math_verify_reward

    policy_dir = os.path.join(assets_dir, "cold_start")
    args = VCPPOConfig(
        output_dir=out_dir,
        seed=seed,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        eval_strategy="no",
        num_sample_generations=0,
        per_device_train_batch_size=budget.per_device_train_batch_size,
        gradient_accumulation_steps=budget.gradient_accumulation_steps,
        num_mini_batches=budget.num_mini_batches,
        num_ppo_epochs=budget.num_ppo_epochs,
        local_rollout_forward_batch_size=64,
        total_episodes=budget.prompts_per_update,  # one PPO update after the phase, never run (stopped first)
        response_length=budget.response_length,
        temperature=1.0,
        kl_coef=0.0,
        learning_rate=budget.learning_rate,
        value_learning_rate=budget.value_learning_rate,
        vf_coef=budget.vf_coef,
        value_pretrain_steps=pretrain_updates,
        value_pretrain_min_steps=pretrain_updates,  # a fixed number of updates: no early stop
        value_pretrain_patience=None,
        missing_eos_penalty=1.0,
        **options,
    )
    trainer = VCPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(policy_dir),
        processing_class=AutoTokenizer.from_pretrained(policy_dir),
        reward_funcs=[math_verify_reward],
        args=args,
        train_dataset=budget.splits()["train"],
    )
    trainer.add_callback(phase_only_callback(trainer))
    return trainer


def phase_log(trainer) -> list[dict]:
    return [
        {k: v for k, v in entry.items() if isinstance(v, (int, float))}
        for entry in trainer.state.log_history
        if any(k.startswith("value_pretrain/") for k in entry)
    ]


def run_epochs_table(
    budget, assets_dir: str, results_dir: str, seeds, train_batches: int, heldout_batches: int
) -> None:
    from vcppo_trl import store_rollouts

    runs_dir = os.path.join(results_dir, "runs")
    os.makedirs(runs_dir, exist_ok=True)
    commit = git_commit()  # the code this process runs, read once (HEAD may move while it runs)
    for seed in seeds:
        stored = os.path.join(assets_dir, "stored_rollouts", f"seed{seed}_{train_batches}_{heldout_batches}")
        batches = train_batches + heldout_batches
        scratch = os.path.join(assets_dir, "critic_epochs_output")  # trainer output: not a result
        storer = make_trainer(budget, assets_dir, scratch, seed, batches)
        t0 = time.time()
        report = store_rollouts(storer, stored, num_batches=batches)
        store_seconds = time.time() - t0
        del storer
        for epochs in EPOCHS:
            path = os.path.join(runs_dir, f"seed{seed}_epochs{epochs}.json")
            if os.path.exists(path):
                continue
            trainer = make_trainer(
                budget,
                assets_dir,
                scratch,
                seed,
                train_batches * epochs,
                value_pretrain_dataset=stored,
                value_pretrain_heldout_batches=heldout_batches,
            )
            t0 = time.time()
            trainer.train()
            write_json(
                path,
                {
                    "seed": seed,
                    "epochs": epochs,
                    "train_batches": train_batches,
                    "heldout_batches": heldout_batches,
                    "batch_size": budget.prompts_per_update,
                    "store_seconds": store_seconds if report.batches_written else None,
                    "train_seconds": time.time() - t0,
                    "commit": commit,
                    "log": phase_log(trainer),
                },
            )
            print(f"seed {seed} epochs {epochs}: {final(json.load(open(path)))}", flush=True)


def final(run: dict) -> dict:
    last = [e for e in run["log"] if "value_pretrain/heldout_explained_variance" in e][-1]
    return {
        "heldout_ev": last["value_pretrain/heldout_explained_variance"],
        "heldout_loss": last["value_pretrain/heldout_loss"],
        # the last update's own batch, values before the update: a batch the critic trained on in earlier epochs
        "own_batch_ev": last["value_pretrain/explained_variance"],
    }


def interval(values: list[float]) -> str:
    """Mean and 95 % t-interval (n − 1 degrees of freedom)."""
    mean, half = mean_ci(values)
    if math.isnan(half):
        return f"{mean:+.3f}"
    return f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"


def write_report(results_dir: str) -> str:
    runs = [
        json.load(open(os.path.join(results_dir, "runs", f)))
        for f in sorted(os.listdir(os.path.join(results_dir, "runs")))
    ]
    by = {(r["seed"], r["epochs"]): final(r) for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    lines = [
        "# Several epochs over stored rollouts against one (count-mod-5, equal rollout cost)",
        "",
        f"Made by `python experiments/critic_epochs.py` (plan.md), commit {runs[0]['commit']}, seeds {seeds}; "
        f"{runs[0]['train_batches']} training batches of {runs[0]['batch_size']} responses and {runs[0]['heldout_batches']} held-out "
        "batches stored once per seed. Held-out figures: after the last update, the critic against Monte-Carlo "
        "returns of held-out responses it never trained on.",
        "",
        "| epochs | critic updates | held-out explained variance | held-out ½(V − R)² | per seed (EV) "
        "| last update's own batch: explained variance |",
        "|---|---|---|---|---|---|",
    ]
    for epochs in EPOCHS:
        present = [s for s in seeds if (s, epochs) in by]
        evs = [by[(s, epochs)]["heldout_ev"] for s in present]
        losses = [by[(s, epochs)]["heldout_loss"] for s in present]
        updates = runs[0]["train_batches"] * epochs
        own = [by[(s, epochs)]["own_batch_ev"] for s in present]
        lines.append(
            f"| {epochs} | {updates} | {interval(evs)} | {interval(losses)} | "
            + ", ".join(f"{v:.3f}" for v in evs)
            + f" | {interval(own)} |"
        )
    lines += ["", "Paired differences against one epoch (same seed, same stored rollouts; 95 % t-intervals):", ""]
    for epochs in EPOCHS[1:]:
        present = [s for s in seeds if (s, epochs) in by and (s, 1) in by]
        dev = [by[(s, epochs)]["heldout_ev"] - by[(s, 1)]["heldout_ev"] for s in present]
        dloss = [by[(s, epochs)]["heldout_loss"] - by[(s, 1)]["heldout_loss"] for s in present]
        lines.append(f"- {epochs} epochs − 1: explained variance {interval(dev)}, ½(V − R)² {interval(dloss)}")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(results_dir, "results.md"), "w") as f:
        f.write(text)
    return text


def run_timing(
    budget,
    assets_dir: str,
    results_dir: str,
    updates: int,
    seed: int,
    use_vllm: bool = False,
    critic_job: bool = False,
) -> dict:
    """Online phase of `updates` updates, against store-then-train at 1 and at 2 epochs, in this process."""
    import shutil
    import tempfile

    from vcppo_trl import store_rollouts

    commit = git_commit()
    tmp = tempfile.mkdtemp(prefix="critic_timing_")
    timings = {}
    sampler = {"use_vllm": True, "vllm_mode": "colocate"} if use_vllm else {}
    try:
        trainer = make_trainer(budget, assets_dir, os.path.join(tmp, "online"), seed, updates, **sampler)
        engine_start_s = trainer.sampler.start_seconds if use_vllm else None
        t0 = time.time()
        trainer.train()
        timings["online"] = {"seconds": time.time() - t0}
        for name, batches in (("stored_1_epoch", updates), ("stored_2_epochs", updates // 2)):
            path = os.path.join(tmp, f"rollouts_{name}")
            storer = make_trainer(budget, assets_dir, os.path.join(tmp, "store"), seed, batches, **sampler)
            t0 = time.time()
            store_rollouts(storer, path, num_batches=batches)
            store_s = time.time() - t0
            trainer = make_trainer(
                budget,
                assets_dir,
                os.path.join(tmp, name),
                seed,
                updates,
                value_pretrain_dataset=path,
                value_pretrain_only=critic_job,
            )
            t0 = time.time()
            trainer.train()
            train_s = time.time() - t0
            timings[name] = {"store_seconds": store_s, "train_seconds": train_s, "seconds": store_s + train_s}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for entry in timings.values():
        entry["ratio_to_online"] = entry["seconds"] / timings["online"]["seconds"]
    result = {
        "updates": updates,
        "seed": seed,
        "commit": commit,
        "sampler": "vllm-colocate" if use_vllm else "hf",
        "critic_job": critic_job,
        "vllm_engine_start_seconds": engine_start_s,  # paid once, before the timed legs (all of them reuse it)
        "model_size": budget.model_size(),
        "timings": timings,
    }
    os.makedirs(results_dir, exist_ok=True)
    write_json(os.path.join(results_dir, f"timing_{updates}_updates.json"), result)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--train-batches", type=int, default=8)
    parser.add_argument("--heldout-batches", type=int, default=4)
    parser.add_argument("--results-dir", default=os.path.join(DEFAULT_RESULTS, "critic_epochs"))
    parser.add_argument("--cache-dir", default=os.path.join(DEFAULT_CACHE, "count_mod_5"))
    parser.add_argument("--timing", action="store_true")
    parser.add_argument("--timing-updates", type=int, default=8)
    parser.add_argument(
        "--use-vllm", action="store_true", help="--timing: sample with colocated vLLM (3-head cold start)"
    )
    parser.add_argument("--critic-job", action="store_true", help="--timing: train from stored batches in critic jobs")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    budget = COUNT_MOD_5_SMOKE_BUDGET if args.smoke else COUNT_MOD_5_BUDGET
    if args.use_vllm:
        import dataclasses

        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        budget = dataclasses.replace(budget, toy_num_heads=budget.toy_hidden_size // 32)
        if args.cache_dir == parser.get_default("cache_dir"):
            args.cache_dir += "_vllm"  # the 4-head cold start stays cached where it is
    from toy_assets import build_cold_start

    build_cold_start(budget, args.cache_dir)
    if args.timing:
        result = run_timing(
            budget,
            args.cache_dir,
            args.results_dir,
            args.timing_updates,
            args.seeds[0],
            use_vllm=args.use_vllm,
            critic_job=args.critic_job,
        )
        print(json.dumps(result, indent=2))
        return result
    run_epochs_table(budget, args.cache_dir, args.results_dir, args.seeds, args.train_batches, args.heldout_batches)
    print(write_report(args.results_dir))


if __name__ == "__main__":
    main()

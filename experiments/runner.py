"""Running the comparison: one variant with one seed (VC-PPO/PPO through `VCPPOTrainer`, or TRL's GRPO), in a worker
process with its console output in `results/logs/`, and the sweep over (variant, seed) pairs, resumable: each run
writes its raw result `results/runs/<variant>/seed<k>.json` when it ends (its whole metric history, the held-out
evaluation, its seed, budget and commit), and a run whose file exists with the same budget is skipped. With
`Budget.eval_every` the held-out evaluation is also made every few policy updates along the run (`held_out_callback`),
recorded as the run's `held_out_along_run`."""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import os
import sys
import time
import traceback
from typing import TYPE_CHECKING, Any

from run_files import budget_dict, git_commit, read_json, same_budget, write_json

if TYPE_CHECKING:
    from task_addition import Budget, Variant


def common_args(out_dir: str, seed: int) -> dict[str, Any]:
    """Settings every trainer of the comparison shares: CPU, fp32, every update logged, nothing saved."""
    return {
        "output_dir": out_dir,
        "seed": seed,
        "use_cpu": True,
        "bf16": False,
        "report_to": "none",
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
    }


def run_vcppo(
    variant: Variant, seed: int, budget: Budget, assets: dict, out_dir: str, train, test, callbacks: tuple = ()
) -> list[dict]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vcppo_trl import VAPOConfig, VAPOTrainer, VCPPOConfig, VCPPOTrainer
    from vcppo_trl.rewards.math_verify import math_verify_reward

    # Both scaled by the variant's equal-finished-responses factors (1 unless it runs generation windows).
    pretrain = variant.pretrain_updates_in_run(budget)
    config_class, trainer_class, vapo = VCPPOConfig, VCPPOTrainer, {}
    if variant.trainer == "vapo":
        # VAPOConfig's parts (clip-higher, the positive-example LM loss, value pretraining, λ_critic 1) with the
        # toy's α (length-adaptive λ at the toy's lengths) and its group size; the learning rates, the schedule and
        # the pretraining length stay the budget's, as for every other variant (results/accuracy_link/plan.md).
        config_class, trainer_class = VAPOConfig, VAPOTrainer
        vapo = {
            "lam_actor_length_alpha": budget.vapo_length_alpha,
            "num_generations": budget.grpo_generations,
            "lr_scheduler_type": VCPPOConfig.lr_scheduler_type,
        }
    if variant.advantage_cut_divisor is not None:
        from cut_advantages import cut_advantage_trainer

        trainer_class = cut_advantage_trainer(trainer_class, budget.response_length // variant.advantage_cut_divisor)
    if variant.train_when_finished:
        from train_when_finished import train_when_finished_trainer

        trainer_class = train_when_finished_trainer(trainer_class)
    fields = dict(
        **common_args(out_dir, seed),
        eval_strategy="no",
        num_sample_generations=0,
        per_device_train_batch_size=budget.per_device_train_batch_size,
        gradient_accumulation_steps=budget.gradient_accumulation_steps,
        num_mini_batches=budget.num_mini_batches,
        num_ppo_epochs=budget.num_ppo_epochs,
        local_rollout_forward_batch_size=64,
        response_length=budget.response_length,
        generation_window=variant.generation_window(budget),
        temperature=1.0,
        kl_coef=0.0,
        lam_actor=variant.lam_actor,
        lam_critic=variant.lam_critic,
        learning_rate=budget.learning_rate,
        value_learning_rate=variant.value_learning_rate(budget),
        vf_coef=budget.vf_coef,
        value_pretrain_steps=pretrain,
        # A fixed number of pretraining updates (no early stop), so every seed gets the same budget.
        value_pretrain_min_steps=max(pretrain, 1),
        value_pretrain_patience=None,
        value_pretrain_stop_explained_variance=None,
        missing_eos_penalty=1.0,
        reward_weights=[1.0, 0.0],
    )
    # The variant's options override the budget's settings (e.g. a smaller batch or another learning rate); the run's
    # length follows its own batch: the variant's policy updates × its responses per update.
    fields |= vapo | dict(variant.options)
    batch = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_mini_batches")
    fields.setdefault("total_episodes", variant.ppo_updates(budget) * math.prod(fields[k] for k in batch))
    args = config_class(**fields)
    if variant.critic == "pretrained":  # this seed's critic, pretrained once and loaded by every arm of a grid
        critic_dir = assets["pretrained_critics"][seed]
    else:
        critics = {"controlled_bias": "controlled_bias_critic", "rm_eos": "reward_model_eos"}  # else "reward_model"
        critic_dir = assets[critics.get(variant.critic, "reward_model")]
    tokenizer = AutoTokenizer.from_pretrained(assets["policy"])
    trainer = trainer_class(
        model=AutoModelForCausalLM.from_pretrained(assets["policy"]),
        processing_class=tokenizer,
        reward_funcs=[math_verify_reward, *budget.logged_rewards()],
        args=args,
        train_dataset=train,
        value_model=critic_dir,
        callbacks=list(callbacks),
    )
    _attach(callbacks, trainer)
    trainer.train()
    return trainer.state.log_history, trainer.model.policy if hasattr(trainer.model, "policy") else trainer.model


def grpo_args(budget, *, completions: int, out_dir: str, seed: int) -> dict[str, Any]:
    """TRL GRPOConfig settings that give GRPO the PPO side's samples and steps: `completions` per generation batch
    (completions / G prompts with G completions each) and the same optimizer steps per batch (num_mini_batches ×
    num_ppo_epochs), the budget's length and learning rate, no KL; the first reward is trained, the second logged."""
    return dict(
        **common_args(out_dir, seed),
        num_generations=budget.grpo_generations,
        per_device_train_batch_size=completions // budget.num_mini_batches,
        gradient_accumulation_steps=1,
        steps_per_generation=budget.num_mini_batches,
        num_iterations=budget.num_ppo_epochs,
        max_steps=budget.ppo_updates * budget.num_mini_batches * budget.num_ppo_epochs,
        max_completion_length=budget.response_length,
        learning_rate=budget.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=0,
        beta=0.0,
        temperature=1.0,
        reward_weights=[1.0, 0.0],
        disable_dropout=True,
    )


def run_grpo(
    variant: Variant, seed: int, budget: Budget, assets: dict, out_dir: str, train, test, callbacks: tuple = ()
):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from vcppo_trl.rewards.math_verify import math_verify_reward

    args = GRPOConfig(
        **grpo_args(budget, completions=budget.prompts_per_update, out_dir=out_dir, seed=seed),
        **dict(variant.options),
    )
    tokenizer = AutoTokenizer.from_pretrained(assets["policy"])
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(assets["policy"]),
        reward_funcs=[math_verify_reward, *budget.logged_rewards()],
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=list(callbacks),
    )
    _attach(callbacks, trainer)
    trainer.train()
    return trainer.state.log_history, trainer.model


def _attach(callbacks, trainer) -> None:
    """Give the callbacks that evaluate the trainer's policy (`held_out_callback`'s) the trainer they watch."""
    for callback in callbacks:
        if hasattr(callback, "attach"):
            callback.attach(trainer)


def grpo_steps_per_update(budget: Budget) -> int:
    """Optimizer steps of TRL's GRPO per policy update (one generation batch): `num_mini_batches × num_ppo_epochs`,
    the `max_steps` mapping of `run_grpo`."""
    return budget.num_mini_batches * budget.num_ppo_epochs


def held_out_callback(every: int, evaluate, steps_per_update: int = 1, last_update: int | None = None):
    """A `TrainerCallback` that evaluates the policy every `every` policy updates (`Budget.eval_every`).

    `evaluate(policy)` returns the update's entry (`{"greedy": {...}, "sampled": {...}}`), made with the policy in eval
    mode (train mode restored after) and with the trainer's random state left as it was (a run with evaluations
    along it trains as one without). Policy updates are counted at `on_step_end`: a VC-PPO value-pretraining update
    (its metrics carry `value_pretrain/` keys, the mark the trainer's loop reads too) is not one, and for TRL's GRPO a
    policy update is `steps_per_update` optimizer steps. No evaluation at `last_update`: the run's final evaluation is
    that update's entry (`run_one`). The callback needs the trainer (`attach`, done by `run_vcppo` and `run_grpo`);
    it evaluates `trainer.model.policy` (VC-PPO, VAPO) or `trainer.model` (GRPO). Built by a function so that
    importing this module does not import transformers (the spawned workers re-import it)."""
    import torch
    from transformers import TrainerCallback

    if every < 1 or steps_per_update < 1:
        raise ValueError(f"eval_every and steps_per_update must be at least 1, got {every} and {steps_per_update}")

    class HeldOutAlongRun(TrainerCallback):
        def __init__(self):
            self.trainer = None
            self.steps = 0  # optimizer steps (GRPO) or updates (VC-PPO) that trained the policy
            self.last_step = 0  # the trainer's global step at the last policy update
            self.entries: list[dict] = []
            self.seconds = 0.0  # spent evaluating (inside the run's training time)

        def attach(self, trainer) -> None:
            self.trainer = trainer

        @property
        def updates(self) -> int:
            """Policy updates made so far."""
            return self.steps // steps_per_update

        def policy(self):
            model = self.trainer.model
            unwrap = getattr(getattr(self.trainer, "accelerator", None), "unwrap_model", None)
            model = unwrap(model) if unwrap is not None else model
            return model.policy if hasattr(model, "policy") else model

        def on_step_end(self, args, state, control, metrics=None, **kwargs):
            if metrics is not None and any(key.startswith("value_pretrain/") for key in metrics):
                return  # a value-pretraining update: the policy is frozen
            self.steps += 1
            self.last_step = state.global_step
            if self.steps % steps_per_update or self.updates % every or self.updates == last_update:
                return
            if self.trainer is None:
                raise RuntimeError("held_out_callback: attach(trainer) before training")
            policy, t0 = self.policy(), time.time()
            was_training = policy.training
            policy.eval()
            try:
                with torch.random.fork_rng(devices=[]):
                    entry = evaluate(policy)
            finally:
                policy.train(was_training)
            self.seconds += time.time() - t0
            self.entries.append({"update": self.updates, "step": state.global_step, **entry})

    return HeldOutAlongRun()


def run_one(variant: Variant, seed: int, budget: Budget, assets: dict, path: str) -> None:
    """Train one variant with one seed in this process (one torch thread) and write its JSON."""
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from vcppo_trl.toy import greedy_accuracy, sampled_accuracy

    splits = budget.splits()
    columns = ["prompt", "solution", "difficulty"]
    train, test = splits["train"].select_columns(columns), splits["test"].select_columns(columns)
    scratch = os.path.join(os.path.dirname(path), f".scratch-seed{seed}")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(assets["policy"])  # the evaluations' own (not the trainer's)

    def evaluate(policy) -> dict[str, Any]:
        """The held-out evaluation: greedy, and sampled when the task asks for it."""
        entry = {"greedy": greedy_accuracy(policy, tokenizer, splits["test"], max_new_tokens=budget.response_length)}
        if budget.held_out_samples():
            entry["sampled"] = sampled_accuracy(
                policy, tokenizer, splits["test"], budget.held_out_samples(), budget.response_length, seed=seed
            )
        return entry

    along = None
    eval_every = variant.eval_every or budget.eval_every
    if eval_every is not None:
        grpo = variant.trainer == "grpo"
        along = held_out_callback(
            eval_every,
            evaluate,
            steps_per_update=grpo_steps_per_update(budget) if grpo else 1,
            last_update=budget.ppo_updates if grpo else variant.ppo_updates(budget),
        )
    t0 = time.time()
    runner = run_grpo if variant.trainer == "grpo" else run_vcppo
    history, policy = runner(variant, seed, budget, assets, scratch, train, test, callbacks=(along,) if along else ())
    train_seconds = time.time() - t0
    end = evaluate(policy)
    final_eval = end["greedy"]
    extra = {}
    if budget.held_out_samples():
        extra["final_eval_sampled"] = end["sampled"]
        extra["cold_start_eval_sampled"] = assets["cold_start_eval_sampled"]
    if along is not None:
        # The final evaluation is the last update's entry (unless a run stopped early was just evaluated there).
        if not along.entries or along.entries[-1]["update"] != along.updates:
            along.entries.append({"update": along.updates, "step": along.last_step, **end})
        extra["held_out_along_run"] = along.entries
        extra["held_out_along_run_seconds"] = along.seconds
    record = {
        "variant": dataclasses.asdict(variant),
        "seed": seed,
        "commit": git_commit(),
        "budget": budget_dict(budget),
        "train_seconds": train_seconds,
        "wall_seconds": time.time() - t0,
        "cold_start_eval": assets["cold_start_eval"],
        "final_eval": final_eval,
        **extra,
        "log_history": history,
    }
    write_json(path, record)


def _worker(task: tuple, run=None) -> tuple[str, str | None]:
    """One run in this (spawned) process with its output in its log file: `run(variant, seed, budget, assets, path)`,
    by default this module's `run_one` (another sweep passes its own)."""
    variant, seed, budget, assets, path = task
    # Each run's own output (metric dicts, warnings) goes to its log file, not to the sweep's console.
    log_path = os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(path))), "logs", f"{variant.name}-seed{seed}.log"
    )
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = log
        try:
            (run or run_one)(variant, seed, budget, assets, path)
            return path, None
        except Exception:  # reported by the parent; the other runs go on
            error = traceback.format_exc()
            print(error, flush=True)
            return path, error


def run_path(results_dir: str, variant: Variant, seed: int) -> str:
    return os.path.join(results_dir, "runs", variant.name, f"seed{seed}.json")


def run_all(
    variants: tuple[Variant, ...], budget: Budget, assets: dict, results_dir: str, workers: int
) -> list[tuple[str, str]]:
    """Run every (variant, seed) whose JSON is missing, `workers` at a time; returns the failures."""
    tasks = []
    for seed in budget.seeds:  # seed-major: an interrupted sweep has whole seeds of every variant
        for variant in variants:
            path = run_path(results_dir, variant, seed)
            existing = read_json(path)
            if existing is not None and same_budget(existing.get("budget"), budget):
                continue
            tasks.append((variant, seed, budget, assets, path))
    print(f"{len(tasks)} runs to do ({len(variants)} variants x {len(budget.seeds)} seeds, rest already saved).")
    failures = []
    if not tasks:
        return failures
    t0 = time.time()
    for done, (path, error) in enumerate(_run_processes(tasks, workers), start=1):
        status = "failed" if error else "done"
        print(f"[{done}/{len(tasks)}] {status}: {os.path.relpath(path, results_dir)} ({time.time() - t0:.0f} s)")
        if error:
            failures.append((path, error))
            print(error, file=sys.stderr)
    return failures


def _run_task(task: tuple, result) -> None:
    result.send(_worker(task))
    result.close()


def _run_processes(tasks: list[tuple], workers: int, target=None):
    """Each task in a fresh spawned process, `workers` at a time, in order; yields `(path, error)` as runs end.

    Not `multiprocessing.Pool`: its workers are daemons, which may not start processes, and a `max_staleness` run
    starts its rollout worker process (so it occupies two processes while it runs). Nor `ProcessPoolExecutor`'s
    `max_tasks_per_child`, which can hang on Python 3.11 (cpython#115634)."""
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    pending, running = list(tasks), {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                task = pending.pop(0)
                receiver, sender = ctx.Pipe(duplex=False)
                process = ctx.Process(target=target or _run_task, args=(task, sender))
                process.start()
                sender.close()  # the child holds the only writer: its exit without a result reads as EOF
                running[receiver] = (process, task)
            for receiver in wait(list(running)):
                process, task = running.pop(receiver)
                try:
                    path, error = receiver.recv()
                    died = False
                except EOFError:  # the process died before it could report (killed, out of memory, a crash)
                    path, error, died = task[-1], None, True
                receiver.close()
                process.join()
                if died:
                    error = f"the run's process ended with exit code {process.exitcode} and no result"
                yield path, error
    finally:
        for process, _ in running.values():  # interrupted: stop the runs still going
            process.terminate()
            process.join()

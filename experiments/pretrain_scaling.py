"""How many value-pretraining updates, and how that scales with the batch and the response length (issue 47; plan:
results/pretrain_scaling/plan.md).

    cd experiments && ../.venv/bin/python pretrain_scaling.py --threads 1    # the grid (results/pretrain_scaling/)
    ... --threads 1 --lengths short & ... --threads 1 --lengths long         # the same, one process per length
    cd experiments && ../.venv/bin/python pretrain_scaling.py --smoke         # the same code at tiny sizes

Per seed and response length, the cached count-mod-5 cold-start policy (`toy_assets.build_cold_start`) samples
`--heldout-batches` batches of prompts of that length once (`store_rollouts`, its own seed: responses no run trains
on). Then, per prompts-per-update batch, an online value-pretraining phase (critic built from the policy, fresh
rollouts every update, constant value learning rate, a fixed number of updates, no early stop) is run; after every
update (and once before the first) the critic is scored on the held-out responses of its seed and length: ½(V − R)²
over their tokens, the explained variance, and the mean of V − R (the bias). The length of the responses is set by
the prompts (`min_digits`-`max_digits` digits: one reasoning line per digit), not by a cap: the task stays the same.
Every run's log history is written under `runs/`; `results.md` is made from them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from critic_epochs import make_trainer, phase_log  # noqa: E402
from report_stats import mean_ci  # noqa: E402
from run_files import DEFAULT_CACHE, DEFAULT_RESULTS, git_commit, read_json, write_json  # noqa: E402
from task_running_sum import COUNT_MOD_5_BUDGET, COUNT_MOD_5_SMOKE_BUDGET  # noqa: E402

SEEDS = (400, 401, 402)  # not used by earlier runs (count-mod-5: 0-7, 31-33, 100, 101, 200-207, 300-302)
HELDOUT_SEED_OFFSET = 1000  # the held-out store of seed s samples with seed s + 1000: no run trains on its responses
BATCHES = (8, 16, 32)  # prompts (= responses) per update
LENGTHS = {"short": (15, 19), "long": (27, 31)}  # digits per prompt; the cold start saw 15-31
SMOKE_BATCHES = (2, 4)
SMOKE_LENGTHS = {"short": (3, 4), "long": (5, 5)}
TOLERANCE = 0.05  # "enough": held-out ½(V − R)² within 5 % of the plateau
PLATEAU_WINDOW = 8  # the plateau: mean held-out ½(V − R)² over the last 8 updates
PATIENCES = (5, 10, 20)  # the package's stop rule replayed on the online value loss (min_delta 1 %)


def variant_budget(budget, batch: int, digits: tuple[int, int]):
    """The budget with `batch` prompts per update (the same optimizer steps per update: only per_device_train_batch_size
    changes) and prompts of `digits` digits."""
    per_step = budget.gradient_accumulation_steps * budget.num_mini_batches
    if batch % per_step:
        raise ValueError(f"batch {batch} is not a multiple of {per_step} (gradient accumulation x mini-batches)")
    return dataclasses.replace(
        budget, per_device_train_batch_size=batch // per_step, min_digits=digits[0], max_digits=digits[1]
    )


class HeldoutScorer:
    """Scores the trainer's critic, as it is now, on stored held-out rollouts (another run's store: read directly)."""

    def __init__(self, trainer, path: str):
        from vcppo_trl.rollout.stored_source import StoredRolloutSource

        self.trainer = trainer
        self.source = StoredRolloutSource(trainer.rollout_maker, path, process_index=0)
        self.scores: list[dict] = []

    def score(self, step: int) -> None:
        import torch

        from vcppo_trl.trainer.metrics import heldout_fit

        trainer = self.trainer
        with torch.no_grad():
            rollouts = [self.source.rollout_of(b)[0] for b in self.source.training_batches]
            returns = [trainer.compute_advantages(r)[1] for r in rollouts]
        fit = heldout_fit(trainer.accelerator, rollouts, returns)
        values = torch.cat([r.values[r.value_mask.bool()].float() for r in rollouts])
        targets = torch.cat([ret[r.value_mask.bool()].float() for r, ret in zip(rollouts, returns)])
        self.scores.append(
            {
                "step": step,
                "loss": fit.loss,
                "explained_variance": fit.explained_variance,
                "bias": float((values - targets).mean()),
                "constant_loss": float(0.5 * targets.var(unbiased=False)),  # the best constant predictor's loss
                "tokens": int(targets.numel()),
                "responses": sum(int(r.value_mask.any(dim=1).sum()) for r in rollouts),
            }
        )

    def callback(self, updates: int):
        from transformers import TrainerCallback

        scorer = self

        class ScoreAfterUpdate(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step <= updates:
                    scorer.score(state.global_step)
                return control

        return ScoreAfterUpdate()


def store_heldout(budget, assets_dir: str, seed: int, digits: tuple[int, int], batches: int, batch: int) -> str:
    from vcppo_trl import store_rollouts

    path = os.path.join(
        assets_dir, "pretrain_scaling_heldout", f"seed{seed}_{digits[0]}-{digits[1]}_{batches}x{batch}"
    )
    storer = make_trainer(
        variant_budget(budget, batch, digits),
        assets_dir,
        os.path.join(assets_dir, "pretrain_scaling_output"),
        seed + HELDOUT_SEED_OFFSET,
        batches,
    )
    store_rollouts(storer, path, num_batches=batches)
    return path


def run_grid(budget, assets_dir, results_dir, seeds, batches, lengths, updates, heldout_batches) -> None:
    runs_dir = os.path.join(results_dir, "runs")
    os.makedirs(runs_dir, exist_ok=True)
    commit = git_commit()  # the code this process runs, read once (HEAD may move while it runs)
    scratch = os.path.join(assets_dir, "pretrain_scaling_output")  # trainer output: not a result
    for seed in seeds:
        for length, digits in lengths.items():
            heldout = None
            for batch in batches:
                path = os.path.join(runs_dir, f"seed{seed}_{length}_batch{batch}.json")
                if read_json(path) is not None:
                    continue
                if heldout is None:
                    heldout = store_heldout(budget, assets_dir, seed, digits, heldout_batches, max(batches))
                trainer = make_trainer(
                    variant_budget(budget, batch, digits),
                    assets_dir,
                    scratch,
                    seed,
                    updates,
                    lr_scheduler_type="constant",  # the phase as a small part of a long run's critic schedule
                )
                scorer = HeldoutScorer(trainer, heldout)
                scorer.score(0)
                trainer.add_callback(scorer.callback(updates))
                t0 = time.time()
                trainer.train()
                write_json(
                    path,
                    {
                        "seed": seed,
                        "length": length,
                        "digits": list(digits),
                        "batch": batch,
                        "updates": updates,
                        "heldout": {"batches": heldout_batches, "batch": max(batches), "path": heldout},
                        "seconds": time.time() - t0,
                        "commit": commit,
                        "scores": scorer.scores,
                        "log": phase_log(trainer),
                    },
                )
                print(f"seed {seed} {length} batch {batch}: {json.dumps(summary(read_json(path)))}", flush=True)


def replay_patience(losses: list[float], patience: int, min_delta: float = 0.01) -> int | None:
    """The update after which the package's patience rule (value_pretrain_patience, min_steps 0) stops, read on the
    online value losses; None when it does not within the run."""
    best, since = math.inf, 0
    for u, loss in enumerate(losses, start=1):
        if not math.isnan(loss):
            if loss < best * (1.0 - min_delta):
                best, since = loss, 0
            else:
                since += 1
        if since >= patience:
            return u
    return None


def summary(run: dict) -> dict:
    """The run's measures (plan.md): updates to enough, the plateau, and the online metrics there."""
    scores = {s["step"]: s for s in run["scores"]}
    steps = sorted(k for k in scores if k >= 1)
    tail = steps[-PLATEAU_WINDOW:]
    plateau = sum(scores[u]["loss"] for u in tail) / len(tail)
    initial = scores[0]["loss"]
    enough = next((u for u in steps if scores[u]["loss"] <= (1 + TOLERANCE) * plateau), None)
    excess_90 = next((u for u in steps if scores[u]["loss"] - plateau <= 0.1 * (initial - plateau)), None)
    log = [e for e in run["log"] if "value_pretrain/explained_variance" in e]
    online_ev = [e["value_pretrain/explained_variance"] for e in log]
    online_loss = [e.get("value_pretrain/loss_avg", math.nan) for e in log]
    lengths = [e["diagnostics/response_length_mean"] for e in log]

    def window_mean(xs, end, n=4):  # the n updates ending at `end` (1-based)
        w = [x for x in xs[max(0, end - n) : end] if x is not None and not math.isnan(x)]
        return sum(w) / len(w) if w else math.nan

    return {
        "initial_loss": initial,
        "plateau_loss": plateau,
        "constant_loss": scores[0]["constant_loss"],
        "plateau_ev": sum(scores[u]["explained_variance"] for u in tail) / len(tail),
        "initial_bias": scores[0]["bias"],
        "final_bias": sum(scores[u]["bias"] for u in tail) / len(tail),
        "enough": enough,
        "excess_90": excess_90,
        "online_ev_at_enough": window_mean(online_ev, enough) if enough else math.nan,
        "online_ev_plateau": window_mean(online_ev, len(online_ev), PLATEAU_WINDOW),
        "online_ev_first4": window_mean(online_ev, 4),
        "online_loss_at_enough": window_mean(online_loss, enough) if enough else math.nan,
        "online_loss_plateau": window_mean(online_loss, len(online_loss), PLATEAU_WINDOW),
        "patience": {p: replay_patience(online_loss, p) for p in PATIENCES},
        "tokens_per_update": run["batch"] * sum(lengths) / len(lengths),
        "response_length": sum(lengths) / len(lengths),
    }


def fmt(values: list[float], digits: int = 3) -> str:
    mean, half = mean_ci(values)
    if math.isnan(mean):
        return "–"
    if math.isnan(half):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{mean - half:.{digits}f}, {mean + half:.{digits}f}]"


def write_report(results_dir: str, batches=BATCHES, lengths=LENGTHS) -> str:
    runs_dir = os.path.join(results_dir, "runs")
    runs = [read_json(os.path.join(runs_dir, f)) for f in sorted(os.listdir(runs_dir)) if f.endswith(".json")]
    runs = [r for r in runs if r is not None]
    cells = {(r["length"], r["batch"], r["seed"]): summary(r) for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    updates = runs[0]["updates"]
    first = runs[0]
    lines = [
        "# How many value-pretraining updates: batch x response length (count-mod-5, online phase)",
        "",
        f"Made by `cd experiments && ../.venv/bin/python pretrain_scaling.py --threads 1` (plan.md), commit "
        f"{first['commit']}, seeds {seeds}; {updates} critic updates per run at a constant value learning rate, no "
        f"early stop. Held-out: {first['heldout']['batches']} x {first['heldout']['batch']} responses per seed and "
        "length, sampled once with another seed, the same for every batch size. Each cell: mean and 95 % t-interval "
        "over seeds.",
        "",
        f"*Enough* = the first update whose held-out ½(V − R)² is within {TOLERANCE:.0%} of the run's plateau (the "
        f"mean over its last {PLATEAU_WINDOW} updates); *90 % of the excess* = the first update where the held-out loss "
        "minus the plateau is at most 10 % of (before the first update − plateau). Online explained variance: "
        "`value_pretrain/explained_variance`, values before the update on the update's own fresh batch, mean of the 4 "
        f"updates ending at *enough* and of the last {PLATEAU_WINDOW}.",
        "",
        "| length | prompts / update | response tokens / update | updates to enough | updates to 90 % of the excess "
        "| held-out ½(V−R)² before → plateau | ½ Var(R) (constant predictor) | held-out EV at plateau "
        "| online EV at enough | online EV at plateau | per seed: enough |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for length in lengths:
        for batch in batches:
            got = [cells[(length, batch, s)] for s in seeds if (length, batch, s) in cells]
            if not got:
                continue

            def col(key, digits=3, got=got):
                return fmt([g[key] if g[key] is not None else math.nan for g in got], digits)

            per_seed = ", ".join(str(g["enough"]) for g in got)
            lines.append(
                f"| {length} | {batch} | {col('tokens_per_update', 0)} | {col('enough', 1)} | {col('excess_90', 1)} "
                f"| {col('initial_loss')} → {col('plateau_loss')} | {col('constant_loss')} | {col('plateau_ev')} "
                f"| {col('online_ev_at_enough')} | {col('online_ev_plateau')} | {per_seed} |"
            )
    lines += [
        "",
        "Held-out bias mean(V − R) before the first update and over the last updates; the package's patience rule "
        "(`value_pretrain_patience`, min_delta 1 %, no minimum) replayed on the online value loss "
        f"(`value_pretrain/loss_avg`): the update it would stop after ('>{updates}': not within the run).",
        "",
        "| length | prompts / update | bias before | bias at plateau | "
        + " | ".join(f"patience {p}: stops after" for p in PATIENCES)
        + " |",
        "|---|---|---|---|" + "---|" * len(PATIENCES),
    ]
    for length in lengths:
        for batch in batches:
            got = [cells[(length, batch, s)] for s in seeds if (length, batch, s) in cells]
            if not got:
                continue
            stops = [", ".join(str(g["patience"][p] or f">{updates}") for g in got) for p in PATIENCES]
            lines.append(
                f"| {length} | {batch} | {fmt([g['initial_bias'] for g in got])} | "
                f"{fmt([g['final_bias'] for g in got])} | " + " | ".join(stops) + " |"
            )
    lines += ["", "Mean held-out ½(V − R)² by update (over seeds):", ""]
    marks = sorted({u for u in (0, 1, 2, 4, 8, 12, 16, 24, 32, 48, 64) if u <= updates} | {updates})
    lines.append("| length | prompts / update | " + " | ".join(f"u={u}" for u in marks) + " |")
    lines.append("|---|---|" + "---|" * len(marks))
    for length in lengths:
        for batch in batches:
            got = [r for r in runs if r["length"] == length and r["batch"] == batch]
            if not got:
                continue
            means = []
            for u in marks:
                vals = [s["loss"] for r in got for s in r["scores"] if s["step"] == u]
                means.append(f"{sum(vals) / len(vals):.3f}" if vals else "–")
            lines.append(f"| {length} | {batch} | " + " | ".join(means) + " |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(results_dir, "results.md"), "w") as f:
        f.write(text)
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--updates", type=int, default=32)
    parser.add_argument("--heldout-batches", type=int, default=4)
    parser.add_argument("--results-dir", default=os.path.join(DEFAULT_RESULTS, "pretrain_scaling"))
    parser.add_argument("--cache-dir", default=None, help="default: .cache/count_mod_5 (--smoke: count_mod_5_smoke)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 on a shared 2-core machine)")
    parser.add_argument("--lengths", nargs="+", default=None, help="run only these lengths (default: all)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    budget = COUNT_MOD_5_SMOKE_BUDGET if args.smoke else COUNT_MOD_5_BUDGET
    batches, lengths = (SMOKE_BATCHES, SMOKE_LENGTHS) if args.smoke else (BATCHES, LENGTHS)
    run_lengths = {k: v for k, v in lengths.items() if args.lengths is None or k in args.lengths}
    cache = args.cache_dir or os.path.join(DEFAULT_CACHE, "count_mod_5_smoke" if args.smoke else "count_mod_5")
    from toy_assets import build_cold_start

    build_cold_start(budget, cache)  # the policy every variant starts from (15-31 digits; the lengths are subsets)
    run_grid(budget, cache, args.results_dir, args.seeds, batches, run_lengths, args.updates, args.heldout_batches)
    text = write_report(args.results_dir, batches, lengths)
    print(text)
    return text


if __name__ == "__main__":
    main()

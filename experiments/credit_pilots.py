"""The pilots of the credit comparison (issue 58 §3), before any run of its table: can the critic learn the pointer
chase, and how large must a batch be to beat the gradient's noise. Results under `results/credit/pilots/`.

    python experiments/credit_pilots.py critic --hops 2 8 32 --seed 900     # pilot (c)
    python experiments/credit_pilots.py noise --hops 8 --seed 900           # the batch size of pilot (b)
    python experiments/credit_pilots.py cold_start --hops 8 --seeds 900 901 902   # the cold starts' held-out success

`cold_start`: each (seed, K)'s cold start, built or read from the cache, and its held-out greedy and sampled success
(the table's evaluation, `credit.cold_start_assets`): the pilots and the table need about 0.35 on every seed.

`critic` (pilot (c)): on the frozen cold start, value pretraining (`VCPPOTrainer`, `value_pretrain_only`: the critic
alone on fresh rollouts of the frozen policy each update, λ = 1) for `--updates` updates; then on held-out rollouts of
the same policy (`--eval-prompts` prompts × 4 responses) the Monte-Carlo explained variance of the learned critic and
of the oracle (`toy.pointer_chase_credit.oracle_values`) by relative position, and the correlation of each hop's
advantage (at its decision token) with that hop's correctness under a group mean of G = 2 and 4, the learned critic
with GAE λ 0.95 and the oracle with GAE λ 0.95 (the measure of issue 58's numpy simulation of K independent
decisions, which has no model).

`noise`: the policy's gradient norm at two mini-batch sizes on frozen cold-start rollouts (learning rate 0, so the
policy never moves; one optimizer step per update), giving the gradient noise scale B_noise = tr(Σ) / |G|² from
E|g_B|² = |G|² + tr(Σ)/B (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training"), per advantage
estimator.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time

import runner
from credit import CreditBudget, cold_start_assets, recipe_of, response_length, splits
from run_files import DEFAULT_CACHE, DEFAULT_RESULTS, git_commit, write_json

PILOTS = os.path.join(DEFAULT_RESULTS, "credit", "pilots")


def pearson(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    if n < 3:
        return math.nan
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def base_fields(out_dir: str, seed: int, hops: int, budget: CreditBudget) -> dict:
    return {
        **runner.common_args(out_dir, seed),
        "num_sample_generations": 0,
        "num_generations": budget.num_generations,
        "response_length": response_length(hops, budget),
        "local_rollout_forward_batch_size": 64,
        "temperature": 1.0,
        "kl_coef": 0.0,
    }


def critic_pilot(hops: int, seed: int, updates: int, value_lr: float, eval_prompts: int, budget, cache_dir: str):
    """Pilot (c) at one K: see the module's docstring. Returns its record."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vcppo_trl import VCPPOConfig, VCPPOTrainer
    from vcppo_trl.algo import dual_lambda_gae, group_advantages, position_bucket_explained_variance
    from vcppo_trl.toy.pointer_chase import pointer_chase_reward
    from vcppo_trl.toy.pointer_chase_credit import hop_correctness, oracle_values

    assets = cold_start_assets(seed, hops, budget, cache_dir)
    data = splits(seed, hops, budget)
    tokenizer = AutoTokenizer.from_pretrained(assets["policy"])
    out_dir = os.path.join(cache_dir, "pilot_scratch", f"critic_K{hops}_seed{seed}")
    args = VCPPOConfig(
        **base_fields(out_dir, seed, hops, budget),
        per_device_train_batch_size=budget.per_device_train_batch_size,
        gradient_accumulation_steps=budget.gradient_accumulation_steps,
        num_mini_batches=budget.num_mini_batches,
        num_ppo_epochs=budget.num_ppo_epochs,
        value_learning_rate=value_lr,
        value_pretrain_only=True,
        value_pretrain_steps=updates,
        value_pretrain_min_steps=updates,
        value_pretrain_patience=None,
        value_pretrain_stop_explained_variance=None,
    )
    trainer = VCPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(assets["policy"]),
        processing_class=tokenizer,
        reward_funcs=pointer_chase_reward,
        args=args,
        train_dataset=data["train"].select_columns(["prompt", "solution", "difficulty"]),
        eval_dataset=data["test"].select_columns(["prompt", "solution", "difficulty"]),
    )
    t0 = time.time()
    trainer.train()
    pretrain_seconds = time.time() - t0
    curve = [
        {k: e[k] for k in ("value_pretrain/explained_variance", "value_pretrain/loss_avg") if k in e}
        for e in trainer.state.log_history
        if "value_pretrain/explained_variance" in e
    ]
    G = budget.num_generations
    rows = [trainer.eval_dataset[i] for i in range(min(eval_prompts, len(trainer.eval_dataset))) for _ in range(G)]
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        rollouts = [
            trainer.rollout_maker.make(rows[i : i + 64], train_policy=False)[0] for i in range(0, len(rows), 64)
        ]
    result = {"pretrain_seconds": pretrain_seconds, "pretrain_curve": curve}
    adv_by: dict[str, list[float]] = {"group_G2": [], "group_G4": [], "critic": [], "oracle": []}
    right_all: list[float] = []
    ev = {"critic": [], "oracle": []}
    values_all, oracle_all, returns_all, mask_all = [], [], [], []
    for rollout in rollouts:
        mask = rollout.response_mask
        prompts = list(rollout.prompts)
        oracle = oracle_values(prompts, rollout.response_ids.tolist(), tokenizer, num_hops=hops)
        oracle = oracle[:, : mask.shape[1]]
        mc = dual_lambda_gae(rollout.rewards, rollout.values, mask, gamma=1.0, lam_actor=1.0, lam_critic=1.0)[1]
        critic_adv = dual_lambda_gae(rollout.rewards, rollout.values, mask, gamma=1.0, lam_actor=0.95, lam_critic=1.0)[
            0
        ]
        oracle_adv = dual_lambda_gae(rollout.rewards, oracle, mask, gamma=1.0, lam_actor=0.95, lam_critic=1.0)[0]
        scores = torch.where(torch.isnan(rollout.raw_scores), float("nan"), rollout.scores)
        group = {f"group_G{g}": group_advantages(scores, g, scale_rewards="none") for g in (2, 4)}
        for row, hops_of_row in enumerate(hop_correctness(prompts, rollout.response_ids.tolist(), tokenizer)):
            for hop in hops_of_row:
                if hop.position >= mask.shape[1] or not mask[row, hop.position]:
                    continue
                right_all.append(float(hop.right))
                adv_by["critic"].append(float(critic_adv[row, hop.position]))
                adv_by["oracle"].append(float(oracle_adv[row, hop.position]))
                for name, adv in group.items():
                    adv_by[name].append(float(adv[row]))
        values_all.append(rollout.values)
        oracle_all.append(oracle)
        returns_all.append(mc)
        mask_all.append(mask)
    width = max(m.shape[1] for m in mask_all)

    def cat(tensors):
        return torch.cat([torch.nn.functional.pad(t.float(), (0, width - t.shape[1])) for t in tensors])

    values, oracle, returns, mask = cat(values_all), cat(oracle_all), cat(returns_all), cat(mask_all).bool()
    for name, v in (("critic", values), ("oracle", oracle)):
        ev[name] = position_bucket_explained_variance(v, returns, mask, num_buckets=8)
    result |= {
        "hops": hops,
        "seed": seed,
        "updates": updates,
        "value_learning_rate": value_lr,
        "episodes": int(mask.shape[0]),
        "success_rate": float((returns[:, 0] > 0).float().mean()),
        "hop_decisions": len(right_all),
        "hop_right_rate": sum(right_all) / max(len(right_all), 1),
        "ev_by_position": ev,
        "ev_mid": {k: (v[3] + v[4]) / 2 for k, v in ev.items()},
        "hop_advantage_correlation": {k: pearson(v, right_all) for k, v in adv_by.items()},
        "cold_start_weights_sha256": assets["manifest"].get("weights_sha256"),
    }
    return result


def noise_pilot(hops: int, seed: int, estimator: str, sizes: tuple[int, int], updates: int, budget, cache_dir: str):
    """The policy's gradient norm at two mini-batch sizes (frozen policy: learning rate 0), and the noise scale."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vcppo_trl import VCPPOConfig, VCPPOTrainer
    from vcppo_trl.toy.pointer_chase import pointer_chase_reward

    assets = cold_start_assets(seed, hops, budget, cache_dir)
    data = splits(seed, hops, budget)
    squares = {}
    for size in sizes:
        out_dir = os.path.join(cache_dir, "pilot_scratch", f"noise_K{hops}_{estimator}_{size}")
        args = VCPPOConfig(
            **base_fields(out_dir, seed, hops, budget),
            advantage_estimator=estimator,
            per_device_train_batch_size=size,
            gradient_accumulation_steps=1,
            num_mini_batches=1,
            num_ppo_epochs=1,
            max_steps=updates,
            learning_rate=0.0,
            value_learning_rate=0.0,
            value_pretrain_steps=0,
        )
        trainer = VCPPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(assets["policy"]),
            processing_class=AutoTokenizer.from_pretrained(assets["policy"]),
            reward_funcs=pointer_chase_reward,
            args=args,
            train_dataset=data["train"].select_columns(["prompt", "solution", "difficulty"]),
        )
        trainer.train()
        norms = [e["grad_norm/policy_avg"] for e in trainer.state.log_history if "grad_norm/policy_avg" in e]
        squares[size] = sum(n * n for n in norms) / len(norms)
    (b1, b2), (s1, s2) = sizes, (squares[sizes[0]], squares[sizes[1]])
    true_sq = (b2 * s2 - b1 * s1) / (b2 - b1)
    trace = (s1 - s2) / (1 / b1 - 1 / b2)
    return {
        "hops": hops,
        "seed": seed,
        "estimator": estimator,
        "updates_per_size": updates,
        "mean_squared_norm": {str(k): v for k, v in squares.items()},
        "gradient_squared_norm": true_sq,
        "trace_covariance": trace,
        "noise_scale": trace / true_sq if true_sq > 0 else math.inf,
    }


def cold_start_pilot(hops: int, seed: int, budget, cache_dir: str) -> dict:
    """The cold start of (seed, K) and its held-out success (`credit.cold_start_assets`, cached beside it)."""
    t0 = time.time()
    assets = cold_start_assets(seed, hops, budget, cache_dir)
    manifest = assets["manifest"]
    return {
        "hops": hops,
        "seed": seed,
        "eval_sampled": assets["eval_sampled"],
        "eval_greedy": assets["eval_greedy"],
        "cold_start": {k: manifest[k] for k in ("key", "recipe", "weights_sha256", "lookup_stage", "cpu", "threads")},
        "sft_seconds": manifest["seconds"],
        "seconds": time.time() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pilot", choices=("critic", "noise", "cold_start"))
    parser.add_argument("--hops", nargs="+", type=int, default=[8])
    parser.add_argument("--seed", type=int, default=900)
    parser.add_argument("--seeds", nargs="+", type=int, help="cold_start: the seeds (default: --seed)")
    parser.add_argument("--updates", type=int, default=40, help="critic: value-pretraining updates; noise: per size")
    parser.add_argument("--value-lr", type=float, default=1e-3)
    parser.add_argument("--eval-prompts", type=int, default=128)
    parser.add_argument("--sizes", nargs=2, type=int, default=[16, 64], help="noise: the two mini-batch sizes")
    parser.add_argument("--estimators", nargs="+", default=["grpo", "gae"], help="noise: the advantage estimators")
    parser.add_argument("--results-dir", default=PILOTS)
    parser.add_argument("--cache-dir", default=os.path.join(DEFAULT_CACHE, "credit"))
    parser.add_argument("--tag", default="", help="A suffix of the result file's name (a variant of the pilot).")
    parser.add_argument("--cold-start-steps", type=int, help="SFT steps of the cold start (default: the recipe's).")
    parser.add_argument(
        "--tables", type=int, help="A pool of this many tables instead of the budget's (0: a fresh one each)."
    )
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    budget = CreditBudget(cold_start_steps=args.cold_start_steps)
    if args.tables is not None:
        budget = dataclasses.replace(budget, num_tables=args.tables or None)
    for hops in args.hops:
        recipe_of(args.seed, hops, budget)  # a bad K stops here
        if args.pilot == "cold_start":
            records = [cold_start_pilot(hops, seed, budget, args.cache_dir) for seed in args.seeds or [args.seed]]
        elif args.pilot == "critic":
            records = [
                critic_pilot(hops, args.seed, args.updates, args.value_lr, args.eval_prompts, budget, args.cache_dir)
            ]
        else:
            records = [
                noise_pilot(hops, args.seed, e, tuple(args.sizes), args.updates, budget, args.cache_dir)
                for e in args.estimators
            ]
        for record in records:
            record |= {"commit": git_commit(), "argv": sys.argv[1:], "num_tables": budget.num_tables}
            seed = record.get("seed", args.seed)
            name = f"{args.pilot}_K{hops}_seed{seed}{record.get('estimator', '') and '_' + record['estimator']}"
            name += "" if budget.num_tables is None else f"_pool{budget.num_tables}"
            write_json(os.path.join(args.results_dir, f"{name}{args.tag}.json"), record)
            print(name, {k: v for k, v in record.items() if k not in ("pretrain_curve", "argv")}, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The knob diagnostic for `--task majority`, run before the table: the trainer's own first updates, read only for the
critic (stop-advantage gap, explained variance) and for how far the policy moves per update (approximate KL, clip
fraction) — never for accuracy or length.

    python experiments/knob_diagnostic.py --name ppo_lr1e-4_vlr2e-4 --variant ppo --updates 6 \\
        --learning-rate 1e-4 --value-learning-rate 2e-4

It uses `reproduce.py --task majority`'s budget and cached assets (`task_majority.py`, `toy_assets.py`), the
variant's settings and `--updates` PPO updates (plus the variant's value pretraining, if any) run as `runner.py` runs
them, with a seed that no table run uses (100), and writes the per-update metrics it reads to
`experiments/results/majority/knobs/<name>.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from run_files import DEFAULT_CACHE, budget_dict, git_commit, json_default
from runner import run_vcppo
from task_addition import MAIN_VARIANTS
from task_majority import MAJORITY_GRID, MajorityBudget
from toy_assets import build_cold_start, build_reward_model_asset

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = (
    "diagnostics/stop_advantage_gap",
    "value/explained_variance",
    "value_pretrain/explained_variance",
    "diagnostics/advantage_position_corr",
    "policy/approxkl_avg",
    "policy/clipfrac_avg",
    "val/clipfrac_avg",
    "value/mean",
    "value_pretrain/mean",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default=None)
    parser.add_argument("--variant", default=None)
    parser.add_argument("--critic", default=None, help="Override the variant's critic (rm, rm_eos).")
    parser.add_argument(
        "--build-rm",
        choices=("prefixes", "eos"),
        help="Only build (cache) this reward model of the budget, then exit.",
    )
    parser.add_argument("--updates", type=int, default=6)
    parser.add_argument("--pretrain-updates", type=int, default=None)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--value-learning-rate", type=float, default=2e-4)
    parser.add_argument(
        "--stop-after-pretraining",
        action="store_true",
        help="End the run after the value-pretraining updates (the learning-rate schedule still spans the PPO "
        "updates of --updates, as in a table run).",
    )
    parser.add_argument("--seed", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    budget = dataclasses.replace(
        MajorityBudget(),
        ppo_updates=args.updates,
        learning_rate=args.learning_rate,
        value_learning_rate=args.value_learning_rate,
        seeds=(args.seed,),
        **({} if args.pretrain_updates is None else {"pretrain_updates": args.pretrain_updates}),
    )
    cache = os.path.join(DEFAULT_CACHE, "majority")
    # The cold start and the two reward models only (built and cached as `build_assets` does; the controlled-bias
    # critic is not needed here).
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assets = build_cold_start(budget, cache)
    if args.build_rm:
        policy = AutoModelForCausalLM.from_pretrained(assets["policy"])
        tokenizer = AutoTokenizer.from_pretrained(assets["policy"])
        _, stats = build_reward_model_asset(budget, cache, policy, tokenizer, eos_only=args.build_rm == "eos")
        print(json.dumps(stats))
        return 0
    assets |= {
        "reward_model": os.path.join(cache, "reward_model"),
        "reward_model_eos": os.path.join(cache, "reward_model_eos"),
    }
    variant = {v.name: v for v in MAIN_VARIANTS + MAJORITY_GRID}[args.variant]
    if args.critic:
        variant = dataclasses.replace(variant, critic=args.critic)
    splits = budget.splits()
    columns = ["prompt", "solution", "difficulty"]
    train = splits["train"].select_columns(columns)
    scratch = os.path.join("/tmp", f"knob_diag_{args.name}")
    t0 = time.time()
    callbacks = ()
    if args.stop_after_pretraining:
        from transformers import TrainerCallback

        class StopAfterPretraining(TrainerCallback):
            def on_step_end(self, train_args, state, control, **kwargs):
                if state.global_step >= budget.pretrain_updates:
                    control.should_training_stop = True

        callbacks = (StopAfterPretraining(),)
    history, _ = run_vcppo(variant, args.seed, budget, assets, scratch, train, None, callbacks)
    rows = [{k: e[k] for k in KEYS if k in e} | {"step": e.get("step")} for e in history if any(k in e for k in KEYS)]
    record = {
        "name": args.name,
        "command": "python experiments/knob_diagnostic.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": git_commit(),
        "variant": args.variant,
        "budget": budget_dict(budget),
        "seconds": time.time() - t0,
        "updates": rows,
    }
    out = os.path.join(HERE, "results", "majority", "knobs")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{args.name}.json"), "w") as f:
        json.dump(record, f, indent=1, default=json_default)
    for r in rows:
        print({k.split("/")[-1] if k.startswith("diag") else k: round(v, 3) for k, v in r.items() if v is not None})
    return 0


if __name__ == "__main__":
    sys.exit(main())

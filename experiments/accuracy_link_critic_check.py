"""The accuracy-link pilot's critic diagnostic: does VC-PPO's critic explain more of the returns with more value
pretraining? (results/accuracy_link/pilot.md; the plan's critic check tripped at 20 pretraining updates.)

    python experiments/accuracy_link_critic_check.py --pretrain-updates 100
    python experiments/accuracy_link_critic_check.py --pretrain-updates 20 --value-lr 1e-3

Runs VC-PPO on `--task count-mod-5`'s budget with `--pretrain-updates` value-pretraining updates (and `--value-lr`, the
critic's learning rate, when given) and one policy update, seed 100 (never a table seed), one worker, into
`results/accuracy_link/pilot/count_mod_5_pretrain<N>[_vlr<lr>]/`. What it is
for is the pretraining's `value_pretrain/explained_variance` over its updates; the policy's figures are not read.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import runner
import task_running_sum
import toy_assets

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pretrain-updates", type=int, default=100)
    parser.add_argument("--value-lr", type=float, default=None, help="critic learning rate (default: the budget's)")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    budget = dataclasses.replace(
        task_running_sum.COUNT_MOD_5_BUDGET, pretrain_updates=args.pretrain_updates, ppo_updates=1, seeds=(100,)
    )
    suffix = ""
    if args.value_lr is not None:
        budget = dataclasses.replace(budget, value_learning_rate=args.value_lr)
        suffix = f"_vlr{args.value_lr:g}"
    assets = toy_assets.build_assets(budget, os.path.join(HERE, ".cache", "count_mod_5"), controlled_bias_critic=False)
    (variant,) = [v for v in task_running_sum.ACCURACY_LINK_GRID if v.name == "vcppo"]
    out = os.path.join(
        HERE, "results", "accuracy_link", "pilot", f"count_mod_5_pretrain{args.pretrain_updates}{suffix}"
    )
    return 1 if runner.run_all((variant,), budget, assets, out, 1) else 0


if __name__ == "__main__":
    sys.exit(main())

"""One rank of a 2-process check of the group advantage estimators, launched by test_distributed.py.

    ACCELERATE_USE_CPU=1 python -m torch.distributed.run --standalone --nproc_per_node 2 \
        tests/integration/distributed/advantage_worker.py OUT ESTIMATOR

`ESTIMATOR` is `grpo` (with `scale_rewards="batch"`: the whole batch's std, both ranks') or `rloo` (with
`normalize_advantages` and the KL in the reward: the whole batch's mean and std). Each rank trains 2 updates of a
`VCPPOTrainer` with that estimator; after each update it records its rows' scores, summed KL and advantages (one per
response: the same on every policy token). Rank 0 writes `OUT/advantages.json`: the largest difference between the
advantages each rank trained on and `group_advantages` of both ranks' scores together (rank 0's rows first), whether
each response's advantage was the same on all its tokens, whether a critic exists anywhere, and both ranks' policy
hashes after training.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


def main(out_dir: str, estimator: str) -> None:
    from accelerate.utils import gather_object
    from common import parity_reward, tiny_models_and_prompts, worker_config  # beside this script
    from transformers import TrainerCallback
    from worker import gathered_hash  # beside this script
    from worker_exit import exit_worker  # beside this script

    from vcppo_trl import VCPPOConfig, VCPPOTrainer
    from vcppo_trl.algo import group_advantages

    tokenizer, policy, train = tiny_models_and_prompts()
    knobs = {"scale_rewards": "batch"} if estimator == "grpo" else {"normalize_advantages": True, "kl_coef": 0.05}
    args = worker_config(
        VCPPOConfig,
        out_dir,
        gloo_under_deepspeed=True,
        advantage_estimator=estimator,
        num_generations=4,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_mini_batches=1,
        num_ppo_epochs=1,
        total_episodes=32,  # 2 updates of 16 responses (8 per rank)
        value_pretrain_steps=0,
        response_length=12,
        learning_rate=1e-3,
        local_rollout_forward_batch_size=8,
        **knobs,
    )
    records: list[dict] = []

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            update = trainer.last_update
            rollout, advantages = update.rollout, update.advantages
            tokens = rollout.action_tokens
            first = advantages[torch.arange(len(tokens)), tokens.float().argmax(dim=1)]
            records.append(
                {
                    "scores": torch.where(torch.isnan(rollout.raw_scores), float("nan"), rollout.scores).tolist(),
                    "kl_sums": (rollout.kl * tokens).sum(1).tolist(),
                    "advantages": first.tolist(),
                    "constant_on_tokens": bool(((advantages - first.unsqueeze(1)) * tokens).abs().max() == 0),
                    "zero_off_tokens": bool((advantages * ~tokens).abs().max() == 0),
                    "returns_none": update.returns is None and rollout.values is None,
                }
            )

    trainer = VCPPOTrainer(
        model=policy,
        reward_funcs=parity_reward,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=[Record()],
    )
    trainer.train()
    acc = trainer.accelerator
    policy_model, critic_model = trainer.unwrapped_policy_and_critic()
    report = {"records": records, "critic": critic_model is not None, "policy_hash": gathered_hash(policy_model)}
    ranks = gather_object([report])
    if acc.is_main_process:
        diffs, checks = [], []
        for update in range(len(records)):
            rows = [r["records"][update] for r in ranks]
            scores = torch.tensor([s for r in rows for s in r["scores"]], dtype=torch.float32)
            if estimator == "rloo":
                scores = scores - args.kl_coef * torch.tensor([k for r in rows for k in r["kl_sums"]])
            expected = group_advantages(
                scores,
                4,
                estimator=estimator,
                scale_rewards=args.scale_rewards,
                normalize=args.normalize_advantages,
            )
            trained = torch.tensor([a for r in rows for a in r["advantages"]])
            diffs.append(float((trained - expected).abs().max()))
            checks.append(all(r["constant_on_tokens"] and r["zero_off_tokens"] and r["returns_none"] for r in rows))
            # A local statistic would differ: the check is only meaningful when the ranks' statistics differ.
            local = group_advantages(
                scores[: len(rows[0]["scores"])],
                4,
                estimator=estimator,
                scale_rewards=args.scale_rewards,
                normalize=args.normalize_advantages,
            )
            diffs_local = float((trained[: len(local)] - local).abs().max())
            checks.append(diffs_local > 1e-4)
        result = {
            "max_abs_diff": max(diffs),
            "checks": checks,
            "critic_anywhere": any(r["critic"] for r in ranks),
            "policy_hashes": [r["policy_hash"] for r in ranks],
            "updates": len(records),
        }
        with open(os.path.join(out_dir, "advantages.json"), "w") as f:
            json.dump(result, f)
    exit_worker(acc)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

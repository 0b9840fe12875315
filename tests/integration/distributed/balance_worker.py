"""One rank of a 2-process check of balanced ranks (`balance_ranks`), launched by test_distributed.py.

    ACCELERATE_USE_CPU=1 python -m torch.distributed.run --standalone --nproc_per_node 2 \
        tests/integration/distributed/balance_worker.py OUT [budget|packed]

Each rank rolls out its own prompts and cuts its responses so that rank 0 holds short ones and rank 1 long ones; then
the same update runs twice from the same weights (learning rates held at 0, so no step moves them), once with each
process keeping its rows and once balanced, and the gradients of every optimizer step are compared (DDP: every
parameter's; under DeepSpeed ZeRO-3, whose gradients are partitioned, the gradient norms the steps report). Cases:

- `epochs`: 2 PPO epochs × 2 mini-batches, with the sampler-mismatch correction on (vLLM-like sampler log-probs),
  so its per-row weights come back to the rows' owners;
- `shortcut`: 1 epoch, 1 mini-batch, no old log-probs (the on-policy shortcut): the log-probs the balanced forward
  computed come back to their owners;
- `windows`: a generation window's fields (a window mask, unfinished responses, bootstrapped advantages);
- the rows' fields moved by the balancer alone, tagged with their (rank, row), checked to travel together.

Rank 0 writes `OUT/balance_check.json`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


def main(out_dir: str, forwards: str) -> None:
    from accelerate.utils import gather_object
    from common import parity_reward, tiny_critic, tiny_models_and_prompts, worker_config  # beside this script
    from worker_exit import exit_worker  # beside this script

    from vcppo_trl import PPOConfig, PPOTrainer
    from vcppo_trl.algo.objective import PPOBatch
    from vcppo_trl.learner.epoch_rows import RankBalancer
    from vcppo_trl.learner.ppo_learner import mini_batch_order
    from vcppo_trl.models.packing import TokenBatch
    from vcppo_trl.rollout.shaping import token_rewards
    from vcppo_trl.trainer.prompts import prompt_batches

    tokenizer, policy, train = tiny_models_and_prompts()
    critic = tiny_critic(policy)  # before the config: under DeepSpeed a model created after it is partitioned
    args = worker_config(
        PPOConfig,
        out_dir,
        gloo_under_deepspeed=True,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        num_mini_batches=2,
        num_ppo_epochs=2,
        response_length=16,
        lam=0.95,
        kl_coef=0.0,
        max_grad_norm=0.0,
        max_tokens_per_micro_batch=None if forwards == "packed" else 64,
        padding_free=forwards == "packed",
        balance_ranks=True,
        gradient_checkpointing=False,
        local_rollout_forward_batch_size=8,
    )
    trainer = PPOTrainer(
        policy, parity_reward, args=args, train_dataset=train, processing_class=tokenizer, value_model=critic
    )
    acc = trainer.accelerator
    rank = acc.process_index
    trainer._setup_training()
    learner = trainer.learner
    wrapper = acc.unwrap_model(trainer.model_wrapped)
    deepspeed = trainer.is_deepspeed_enabled

    # No step moves the weights: learning rates 0 (AdamW with lr 0 changes no parameter, weight decay included) and
    # no scheduler to restore them; under DDP the step records the gradient and does nothing else.
    learner.steps.lr_scheduler = None
    for group in trainer.optimizer.param_groups:
        group["lr"] = 0.0
    steps: list[dict[str, torch.Tensor]] = []
    if not deepspeed:

        def record(*a, **k):
            steps.append(
                {name: p.grad.detach().clone() for name, p in wrapper.named_parameters() if p.grad is not None}
            )

        trainer.optimizer.step = record

    rows = next(prompt_batches(trainer.train_dataset, trainer.batches, rank, args.seed, 1))
    base, _ = trainer.rollout_maker.make(rows)
    size = base.response_mask.shape[0]
    lengths = [1, 2, 3, 2, 1, 4, 2, 3] if rank == 0 else [16, 12, 15, 9, 14, 16, 10, 13]
    positions = torch.arange(base.response_mask.shape[1])
    base.response_mask = base.response_mask & (positions[None, :] < torch.tensor(lengths)[:, None])
    base.rewards = token_rewards(base.scores, base.kl, base.response_mask, args.kl_coef)
    noise = torch.Generator().manual_seed(rank)

    def update(rollout, balance: bool, *, epochs: int, mini_batch_size: int, correct_sampler: bool = False):
        learner.epoch_rows = lambda size: RankBalancer(acc, mini_batch_size=size, balance=balance)
        learner.settings = dataclasses.replace(
            learner.settings,
            num_ppo_epochs=epochs,
            correct_sampler_mismatch=correct_sampler,
        )
        learner.local_mini_batch_size = mini_batch_size
        advantages, returns = trainer.compute_advantages(rollout)
        steps.clear()
        result = learner.update(rollout, advantages, returns, value_cliprange=args.cliprange_value, update_index=1)
        return result, [dict(s) for s in steps]

    def worst(a: list[dict], b: list[dict]) -> float:
        diff = 0.0
        assert len(a) == len(b) and a
        for step_a, step_b in zip(a, b):
            for name, expected in step_a.items():
                scale = float(expected.abs().max()) or 1.0
                diff = max(diff, float((step_b[name] - expected).abs().max()) / scale)
        return diff

    results: dict = {"num_processes": acc.num_processes, "deepspeed": deepspeed}
    # Cases that run the same update with and without balancing.
    sampler = dataclasses.replace(
        base,
        sampler_logprobs=(base.logprobs + 0.05 * torch.randn(base.logprobs.shape, generator=noise))
        * base.response_mask,
    )
    window_mask = base.response_mask & (positions[None, :] >= torch.tensor([0, 1, 0, 1, 0, 2, 1, 0])[:, None])
    finished = torch.tensor([True, False, True, True, False, True, True, False] if rank else [True] * 7 + [False])
    windows = dataclasses.replace(
        base, window_mask=window_mask, finished=finished, bootstrap_values=torch.zeros(size), has_stop=finished.clone()
    )
    cases = {
        "epochs": (sampler, dict(epochs=2, mini_batch_size=size // 2, correct_sampler=True)),
        "shortcut": (dataclasses.replace(base, logprobs=None), dict(epochs=1, mini_batch_size=size)),
        "windows": (windows, dict(epochs=2, mini_batch_size=size // 2)),
    }
    for name, (rollout, kwargs) in cases.items():
        plain, plain_steps = update(rollout, False, **kwargs)
        balanced, balanced_steps = update(rollout, True, **kwargs)
        case = {
            "balance_off": plain.balance,
            "balance_on": balanced.balance,
            "grad_norm": [plain.stats["grad_norm"], balanced.stats["grad_norm"]],
            "optimizer_steps": len(plain_steps),
        }
        if not deepspeed:
            case["max_relative_difference"] = worst(plain_steps, balanced_steps)
        for output in ("old_logprobs", "importance_weights"):
            a, b = getattr(plain, output), getattr(balanced, output)
            if a is not None:  # computed by whichever process ran the row, back on the row's owner
                diff = (a - b).abs()  # over the response tokens (padding's values depend on the micro-batch's width)
                diff = diff[rollout.response_mask] if diff.shape == rollout.response_mask.shape else diff
                case[output] = gather_object([float(diff.max())])
        results[name] = case

    # The balancer alone: each row's fields tagged with its (rank, row), and its real length, travel together.
    tag = (rank * 100 + torch.arange(size)).float()[:, None].expand(size, base.response_mask.shape[1]).contiguous()
    batch = PPOBatch(
        base.response_mask, tag, returns=tag * 2, advantages=tag * 3, old_logprobs=-tag, sampler_logprobs=tag + 0.5
    )
    tokens = TokenBatch.of(base)
    order = mini_batch_order(size, seed=args.seed, update_index=1, epoch=0, process_index=rank)
    balancer = RankBalancer(acc, mini_batch_size=size // 2, balance=True)
    moved = balancer.epoch(order, batch=batch, tokens=tokens)
    got = moved.batch.old_values[:, 0]
    real = tokens.response_lengths.tolist()  # the forced lengths, or shorter where the response stopped first
    lengths_of = {r * 100 + i: n for r, row in enumerate(gather_object([real])) for i, n in enumerate(row)}
    together = bool(
        torch.equal(moved.batch.returns, moved.batch.old_values * 2)
        and torch.equal(moved.batch.advantages, moved.batch.old_values * 3)
        and torch.equal(moved.batch.old_logprobs, -moved.batch.old_values)
        and torch.equal(moved.batch.sampler_logprobs, moved.batch.old_values + 0.5)
        and torch.equal(moved.batch.mask, moved.tokens.attention_mask[:, moved.tokens.context_length :].bool())
    )
    # Each balanced row's response is the one its tag names (the tokens moved with the fields).
    response_lengths = moved.tokens.response_lengths.tolist()
    same_lengths = all(response_lengths[i] == lengths_of[int(t)] for i, t in enumerate(got.tolist()))
    halves = [sorted(int(t) for t in got[m * 4 : (m + 1) * 4]) for m in range(2)]
    own = [sorted(rank * 100 + int(i) for i in order[m * 4 : (m + 1) * 4]) for m in range(2)]
    results["exchange"] = {
        "fields_together": gather_object([together]),
        "lengths_follow": gather_object([same_lengths]),
        "mini_batches": gather_object([halves]),
        "own_mini_batches": gather_object([own]),
        "rows": gather_object([moved.batch.mask.shape[0]]),
        "tokens": gather_object([int(moved.tokens.attention_mask.sum())]),
        "own_tokens": gather_object([int(tokens.attention_mask.sum())]),
        "metrics": balancer.metrics(),
    }
    if rank == 0:
        with open(os.path.join(out_dir, "balance_check.json"), "w") as f:
            json.dump(results, f)
    exit_worker(acc)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "budget")

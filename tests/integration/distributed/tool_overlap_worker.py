"""One rank of a 2-process DDP run (torchrun, gloo) with `tools=` under `max_staleness=1`, launched by
test_distributed.py:

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/integration/distributed/tool_overlap_worker.py OUT [W]

Each rank starts its own rollout worker process, which runs that rank's tool episodes (whole, or with a second
argument W advanced by `generation_window=W` one window ahead) on a [`~tests.tool_fixtures.ToolCallingPolicy`], so
the `add` calls happen in the workers. Each rank writes `OUT/rank<r>.json`: the updates run, the weights' hash, the
prompts its episodes came from, and the logged staleness and tool metrics.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


def main(out_dir: str, window: int | None = None) -> None:
    from common import REPO, worker_config  # noqa: F401  (puts the repository on the path)
    from datasets import Dataset
    from worker import gathered_hash
    from worker_exit import exit_worker

    from tests.tool_fixtures import add, chat_tokenizer, tool_calling_policy
    from vcppo_trl import VCPPOConfig, VCPPOTrainer

    tokenizer = chat_tokenizer()
    policy = tool_calling_policy(tokenizer)
    prompts = [[{"role": "user", "content": f"Add 2 and 3 ({i})."}] for i in range(64)]
    args = worker_config(
        VCPPOConfig,
        out_dir,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        num_mini_batches=1,
        num_ppo_epochs=1,
        max_steps=4,
        value_pretrain_steps=0,
        max_staleness=1,
        kl_coef=0.0,
        response_length=160,
        learning_rate=1e-3,
        logging_steps=1,
        use_cpu=True,
        **({} if window is None else dict(generation_window=window)),
    )
    seen = []

    def reward(completions, prompts, **kwargs):
        seen.extend(p[-1]["content"] for p in prompts)
        return [float(any(m["role"] == "tool" for m in c)) for c in completions]

    trainer = VCPPOTrainer(
        model=policy,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        tools=[add],
    )
    trainer.train()
    rank = trainer.accelerator.process_index
    policy, _ = trainer.unwrapped_policy_and_critic()
    logged = [e for e in trainer.state.log_history if "sampling/staleness_max" in e]
    report = {
        "rank": rank,
        "global_step": trainer.state.global_step,
        "policy_hash": gathered_hash(policy),
        "seen": sorted(set(seen)),
        "staleness": [e["sampling/staleness_max"] for e in logged],
        "tools": [{k: v for k, v in e.items() if k.startswith("tools/")} for e in logged],
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    exit_worker(trainer.accelerator)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)

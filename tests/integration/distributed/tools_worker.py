"""One rank of a 2-process run with `tools=` (issue 48), launched by test_distributed.py (torchrun for DDP,
accelerate launch with configs/accelerate/zero3_cpu.yaml for ZeRO-3, generation sharded, or with
configs/accelerate/fsdp2_cpu.yaml for FSDP2, `use_cpu=True` as every FSDP2 run on a CPU):

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/integration/distributed/tools_worker.py OUT

Each rank's generations run through the trainer's real sampler (collective under ZeRO-3 and FSDP2: every rank must take
the same number of calls); then rank 0's turns are replaced by a script that calls the `add` tool twice before
answering, while rank 1 keeps its model's own turns (no tool call). The tool loop must keep the ranks in step: rank 1
joins rank 0's extra rounds. With a second argument W, the run has `generation_window=W` (4 updates): rank 0's turns
continue where a window cut them (`ResumingScriptedSampler`), and the ranks must still take the same generation
calls in every window. Each rank writes `OUT/rank<r>.json`: its generation calls, the weights' hash (ZeRO-3 and
FSDP2: gathered), the backend the models ran under, the updates run and the logged tool metrics.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


class RankScripted:
    """The trainer's sampler, with rank 0's turns scripted (two tool calls, then the answer)."""

    def __init__(self, real, tokenizer, rank: int, windows: bool = False):
        self.real, self.tokenizer, self.rank, self.calls, self.windows = real, tokenizer, rank, 0, windows
        self.name, self.start_seconds = real.name, real.start_seconds

    def generate(self, query_ids, query_mask, greedy, temperature, max_new_tokens=None):
        from tests.tool_fixtures import CALL, ResumingScriptedSampler, ScriptedSampler

        samples = self.real.generate(query_ids, query_mask, greedy, temperature, max_new_tokens=max_new_tokens)
        self.calls += 1
        if self.rank != 0:
            return samples
        if self.windows:
            return ResumingScriptedSampler(self.tokenizer, calls_wanted=lambda context: 2).generate(
                query_ids, query_mask, greedy, temperature, max_new_tokens
            )
        script = {0: CALL, 1: CALL}
        return ScriptedSampler(self.tokenizer, script).generate(
            query_ids, query_mask, greedy, temperature, max_new_tokens
        )

    def mark_stale(self):
        self.real.mark_stale()

    def close(self):
        self.real.close()


def main(out_dir: str, window: int | None = None) -> None:
    from common import REPO, worker_config  # noqa: F401  (puts the repository on the path)
    from datasets import Dataset
    from worker import gathered_hash
    from worker_exit import exit_worker

    from tests.builders import tiny_policy
    from tests.tool_fixtures import add, chat_tokenizer
    from vcppo_trl import VCPPOConfig, VCPPOTrainer

    tokenizer = chat_tokenizer()
    policy = tiny_policy(tokenizer)
    prompts = [[{"role": "user", "content": f"Add 2 and 3 ({i})."}] for i in range(32)]
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true"
    args = worker_config(
        VCPPOConfig,
        out_dir,
        gloo_under_deepspeed=True,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        num_mini_batches=1,
        num_ppo_epochs=1,
        max_steps=2 if window is None else 4,
        value_pretrain_steps=0,
        **({} if window is None else dict(generation_window=window, kl_coef=0.0)),
        response_length=300,
        learning_rate=1e-3,
        logging_steps=1,
        use_cpu=not deepspeed,  # DDP and FSDP2 on a CPU (FSDP2 over gloo needs it, see fsdp2_cpu.yaml)
        ds3_gather_for_generation=not deepspeed,
    )

    def reward(completions, **kwargs):
        return [1.0 if c[-1]["role"] == "assistant" and c[-1]["content"] == "5" else -1.0 for c in completions]

    trainer = VCPPOTrainer(
        model=policy,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        tools=[add],
    )
    rank = trainer.accelerator.process_index
    sampler = RankScripted(trainer.rollout_maker.sampler, tokenizer, rank, windows=window is not None)
    trainer.rollout_maker.sampler = sampler
    trainer.train()
    policy, _ = trainer.unwrapped_policy_and_critic()
    report = {
        "rank": rank,
        "generation_calls": sampler.calls,
        "global_step": trainer.state.global_step,
        "policy_hash": gathered_hash(policy),
        "deepspeed": deepspeed,
        "fsdp2": trainer.is_fsdp2,
        "tools": [
            {k: v for k, v in e.items() if k.startswith("tools/")}
            for e in trainer.state.log_history
            if "tools/call_frequency" in e
        ],
        "finished": [e.get("rollout/finished_responses") for e in trainer.state.log_history if "episode" in e],
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    exit_worker(trainer.accelerator)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)

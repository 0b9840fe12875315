"""One rank of a 2-process run with TRL's `rollout_func=` (issue 48), launched by test_distributed.py (torchrun for
DDP, accelerate launch with configs/accelerate/zero3_cpu.yaml for ZeRO-3 or with configs/accelerate/fsdp2_cpu.yaml
for FSDP2):

    ACCELERATE_USE_CPU=1 python -m torch.distributed.run --standalone --nproc_per_node 2 \
        tests/integration/distributed/rollout_func_worker.py OUT

The `rollout_func` does not call the trainer's model: it is a seeded uniform sampler over the toy's non-special tokens,
a stand-in for a user's own backend (a vLLM server, an environment). Its completions are a function of (prompt number,
generation, rank), so the reward function can recompute each one, and rank 1's hold 4 more policy tokens than rank 0's,
so a metric reduced over both ranks differs from either rank's own. Chosen rather than generating with the trainer's
model because under ZeRO-3 and FSDP2 `generate` on the sharded policy is a collective: every rank would have to call
it the same number of times from inside the function, which tests the function, not the trainer. Here nothing inside
the function talks to the other rank; the trainer's own collectives (the forwards, the gathers of the metrics, the
optimizer steps) are what must keep the ranks in step.

Each completion is 3 policy tokens, a 5-token "tool" block (`env_mask` 0, log-probability 0), then the rest of the
policy's tokens; `logprobs` are the sampler's own (log 1/98 per policy token). An extra key, `tag` ("n:j": the prompt
number and the generation), goes to the reward function, which scores by it (+1 where n + j is a multiple of 3) and
checks it against the row's `idx` column, its prompt and the completion it was given. Each rank writes
`OUT/rank<r>.json`: the prompt numbers and policy-token counts of each call, what the reward function saw, the logged
metrics, the last update's action terms on the tool tokens, and the policy's and critic's hashes (ZeRO-3 and FSDP2:
gathered).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

TOOL_TEXT = "[=42]"  # the "tool's" block, after the policy's first 3 tokens
FIRST_ID = 3  # the toy tokenizer's ids 0-2 are pad, bos and eos; the sampler draws from 3..vocab-1


def policy_tokens(number: int, generation: int, rank: int, vocab_size: int) -> list[int]:
    """The sampler's tokens for prompt `number`'s `generation`-th completion on `rank`: 5 + number % 3 + generation
    tokens, 4 more on rank 1, drawn uniformly from the non-special ids by a generator seeded with the three."""
    length = 5 + number % 3 + generation + 4 * rank
    generator = torch.Generator().manual_seed(10_000 * rank + 10 * number + generation)
    return torch.randint(FIRST_ID, vocab_size, (length,), generator=generator).tolist()


def main(out_dir: str) -> None:
    from common import tiny_policy, tiny_tokenizer, worker_config  # beside this script
    from datasets import Dataset
    from worker import gathered_hash, state_hash
    from worker_exit import exit_worker

    from vcppo_trl import VCPPOConfig, VCPPOTrainer

    tokenizer = tiny_tokenizer()
    policy = tiny_policy(tokenizer)  # built before the config: under ZeRO-3 a later model is created partitioned
    initial_policy_hash = state_hash(policy)
    vocab_size = len(tokenizer)
    tool_ids = tokenizer(TOOL_TEXT, add_special_tokens=False)["input_ids"]
    numbers = list(range(32))
    train = Dataset.from_dict({"prompt": [f"Add {n} and 7.\n" for n in numbers], "idx": numbers})
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true"
    args = worker_config(
        VCPPOConfig,
        out_dir,
        gloo_under_deepspeed=True,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        num_mini_batches=2,  # 8 completions per rank and update: 4 prompts × 2 generations, 2 optimizer steps
        num_generations=2,
        num_ppo_epochs=1,
        max_steps=2,
        value_pretrain_steps=0,
        response_length=24,
        learning_rate=1e-3,
        kl_coef=0.1,  # a reference model: the KL is non-zero on the second update's policy tokens, 0 on the tool's
        logging_steps=1,
        activation_checkpointing=False,
        use_cpu=not deepspeed,  # DDP and FSDP2 on a CPU (FSDP2 over gloo needs it, see fsdp2_cpu.yaml)
    )
    rank_box: list[int] = []  # this process's rank, known once the trainer exists
    calls: list[dict] = []

    def rollout_func(prompts, trainer):
        rank = trainer.accelerator.process_index
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "tag": []}
        call = {"numbers": [], "policy_lengths": []}
        k = trainer.args.num_generations
        for first in range(0, len(prompts), k):  # each prompt comes num_generations times in a row, as TRL passes it
            prompt = prompts[first]
            assert prompts[first : first + k] == [prompt] * k, prompts
            number = int(re.match(r"Add (\d+) and 7", prompt).group(1))
            call["numbers"].append(number)
            prompt_ids = trainer.processing_class(prompt, add_special_tokens=False)["input_ids"]
            for generation in range(k):
                policy = policy_tokens(number, generation, rank, vocab_size)
                completion = policy[:3] + tool_ids + policy[3:]
                mask = [1] * 3 + [0] * len(tool_ids) + [1] * (len(policy) - 3)
                out["prompt_ids"].append(prompt_ids)
                out["completion_ids"].append(completion)
                out["env_mask"].append(mask)
                out["logprobs"].append([-math.log(vocab_size - FIRST_ID) * m for m in mask])
                out["tag"].append(f"{number}:{generation}")
                call["policy_lengths"].append(len(policy))
        calls.append(call)
        return out

    seen = {"rows": 0, "mismatches": [], "tags": [], "rewards": []}

    def tagged_reward(prompts, completions, completion_ids, tag, idx, **kwargs):
        """+1 where prompt number + generation is a multiple of 3, else −1, read from the rollout_func's `tag`; each
        tag checked against the row's `idx` column, its prompt and the completion the function made for it."""
        rank = rank_box[0]
        values = []
        for i, (t, prompt, ids) in enumerate(zip(tag, prompts, completion_ids)):
            number, generation = map(int, t.split(":"))
            expected = policy_tokens(number, generation, rank, vocab_size)
            expected = expected[:3] + tool_ids + expected[3:]
            if number != idx[i] or prompt != f"Add {number} and 7.\n" or list(ids) != expected:
                seen["mismatches"].append({"tag": t, "idx": idx[i], "prompt": prompt})
            values.append(1.0 if (number + generation) % 3 == 0 else -1.0)
        seen["rows"] += len(tag)
        seen["tags"].append(list(tag))
        seen["rewards"].append(values)
        return values

    trainer = VCPPOTrainer(
        model=policy,
        reward_funcs=tagged_reward,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )
    acc = trainer.accelerator
    rank_box.append(acc.process_index)
    trainer.train()

    # The last update's action terms on the tool's tokens (0 everywhere) and on the policy's (the KL is not).
    record = trainer.last_update
    rollout = record.rollout
    tool = rollout.response_mask & ~rollout.action_mask
    on_tool = {
        name: float(tensor[tool].abs().max())
        for name, tensor in (
            ("kl", rollout.kl),
            ("rewards", rollout.rewards),
            ("advantages", record.advantages),
            ("returns", record.returns),
        )
    }
    policy_model, critic_model = trainer.unwrapped_policy_and_critic()
    report = {
        "rank": acc.process_index,
        "num_processes": acc.num_processes,
        "deepspeed": deepspeed,
        "fsdp2": trainer.is_fsdp2,
        "global_step": trainer.state.global_step,
        "calls": calls,
        "reward_rows": seen["rows"],
        "reward_tags": seen["tags"],
        "rewards": seen["rewards"],
        "mismatches": seen["mismatches"],
        "tool_tokens_per_row": tool.sum(1).tolist(),
        "on_tool_max_abs": on_tool,
        "kl_on_policy_tokens_max_abs": float(rollout.kl[rollout.action_tokens].abs().max()),
        "metrics": [
            {k: v for k, v in e.items() if isinstance(v, (int, float))}
            for e in trainer.state.log_history
            if "diagnostics/response_length_mean" in e
        ],
        "initial_policy_hash": initial_policy_hash,
        "policy_hash": gathered_hash(policy_model),
        "critic_hash": gathered_hash(critic_model),
    }
    with open(os.path.join(out_dir, f"rank{acc.process_index}.json"), "w") as f:
        json.dump(report, f)
    exit_worker(acc)


if __name__ == "__main__":
    main(sys.argv[1])

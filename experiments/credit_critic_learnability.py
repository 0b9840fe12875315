"""Can a critic learn the pointer chase's values at all? (issue 58, pilot (c)'s follow-up.) A fresh toy critic
(`LlamaForTokenClassification`, 3 layers, 128 wide) is trained by MSE on Monte-Carlo returns (or on the oracle's
values: `--targets oracle`, a check of what it can represent) from traces of the cold start's error model, drawn fresh
every step (no policy is needed: the traces are what the cold start imitates), and its held-out explained variance of
the return by relative position is printed beside the oracle's (`toy.pointer_chase_credit.oracle_values`).

    python experiments/credit_critic_learnability.py --variant table   # the package's task: a table in each prompt
    python experiments/credit_critic_learnability.py --variant fixed   # one permutation for every prompt, not shown
    python experiments/credit_critic_learnability.py --variant pool --tables 1   # the task with a pool of tables

`table` is the task as built (`toy.pointer_chase.make_problem`): to see that a hop is wrong, the critic must look the
key up in the prompt's table. `fixed` keeps the traces, the error model and the oracle but draws one table (seed
12345) for every prompt and leaves it out of the prompt (`"| A\\n"`: only the start), so the lookup lives in the weights;
`pool` is the task with `num_tables` = `--tables` (`toy.pointer_chase.table_pool`): each prompt shows one of M fixed
tables, so the lookup can be learned into the weights or done in context.
Writes `results/credit/pilots/learnability_<variant>_<targets>_K<k>.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import time

import torch
from run_files import DEFAULT_RESULTS, git_commit, write_json

from vcppo_trl.algo import position_bucket_explained_variance
from vcppo_trl.toy.pointer_chase import (
    draw_problem,
    format_completion,
    format_prompt,
    hop_error_rate,
    make_problem,
    sample_trace,
    table_pool,
)
from vcppo_trl.toy.pointer_chase_credit import oracle_values
from vcppo_trl.toy.tokenizer import build_tokenizer


def traces(n: int, rng: random.Random, hops: int, fixed, tokenizer, variant: str, pool=None):
    """`n` cold-start traces: (prompt ids, response ids, response mask, rewards ±1, oracle values)."""
    tables, prompts, responses, rewards = [], [], [], []
    for _ in range(n):
        if variant != "fixed":
            problem = draw_problem(rng, pool, num_hops=hops)
        else:  # the fixed table from a random start: still one cycle, so a wrong hop never leads back to the answer
            problem = dataclasses.replace(fixed, start=rng.choice([value for _, value in fixed.entries]))
        values = sample_trace(problem, hop_error_rate(hops), rng)
        tables.append(format_prompt(problem))
        prompts.append(f"| {problem.start}\n" if variant == "fixed" else tables[-1])
        completion = tokenizer(format_completion(problem, values), add_special_tokens=False)["input_ids"]
        responses.append(completion + [tokenizer.eos_token_id])
        rewards.append(1.0 if values[-1] == problem.answer else -1.0)
    width = max(map(len, responses))
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in responses]).bool()
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in responses])
    prompt_ids = tokenizer(prompts, add_special_tokens=False, return_tensors="pt")["input_ids"]
    oracle = oracle_values(tables, ids.tolist(), tokenizer, num_hops=hops)[:, :width]
    return prompt_ids, ids, mask, torch.tensor(rewards), oracle


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=("table", "fixed", "pool"), default="table")
    parser.add_argument("--targets", choices=("mc", "oracle"), default="mc")
    parser.add_argument("--hops", type=int, default=8)
    parser.add_argument("--tables", type=int, default=1, help="pool: the number of tables")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps of 64 fresh traces")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results-dir", default=os.path.join(DEFAULT_RESULTS, "credit", "pilots"))
    args = parser.parse_args(argv)
    from transformers import LlamaConfig, LlamaForTokenClassification

    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    fixed = make_problem(random.Random(12345), num_hops=args.hops) if args.variant == "fixed" else None
    pool = table_pool(args.tables, num_hops=args.hops) if args.variant == "pool" else None
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(args.seed)
    critic = LlamaForTokenClassification(config)
    optimizer = torch.optim.AdamW(critic.parameters(), lr=args.lr, weight_decay=0.0)

    def values_of(prompt_ids, ids, mask):  # V(s_t) before response token t, as the trainer's critic gives it
        width = prompt_ids.shape[1]
        attention = torch.cat([torch.ones_like(prompt_ids), mask.long()], 1)
        logits = critic(input_ids=torch.cat([prompt_ids, ids], 1), attention_mask=attention).logits[..., 0]
        return logits[:, width - 1 : width - 1 + ids.shape[1]]

    held_out = traces(1024, random.Random(args.seed + 999), args.hops, fixed, tokenizer, args.variant, pool)
    returns = held_out[3][:, None].expand_as(held_out[2]).float()
    oracle_ev = position_bucket_explained_variance(held_out[4], returns, held_out[2], 8)
    print(f"oracle: explained variance by position {[round(x, 3) for x in oracle_ev]}", flush=True)
    rng, curve, t0 = random.Random(args.seed), [], time.time()
    for step in range(1, args.steps + 1):
        prompt_ids, ids, mask, rewards, oracle = traces(64, rng, args.hops, fixed, tokenizer, args.variant, pool)
        values = values_of(prompt_ids, ids, mask)
        target = rewards[:, None].expand_as(values) if args.targets == "mc" else oracle
        loss = ((values - target) ** 2 * mask).sum() / mask.sum()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(critic.parameters(), 1.0)
        optimizer.step()
        if step % 50 == 0:
            critic.eval()
            with torch.no_grad():
                parts = [values_of(*(t[i : i + 256] for t in held_out[:3])) for i in range(0, 1024, 256)]
            critic.train()
            ev = position_bucket_explained_variance(torch.cat(parts), returns, held_out[2], 8)
            curve.append({"step": step, "loss": loss.item(), "ev_by_position": ev, "ev_mid": (ev[3] + ev[4]) / 2})
            print(
                f"step {step} ({time.time() - t0:.0f} s): loss {loss.item():.3f}, mid-response EV "
                f"{curve[-1]['ev_mid']:.3f} (oracle {(oracle_ev[3] + oracle_ev[4]) / 2:.3f})",
                flush=True,
            )
    record = {
        "variant": args.variant,
        "tables": args.tables if args.variant == "pool" else None,
        "targets": args.targets,
        "hops": args.hops,
        "steps": args.steps,
        "lr": args.lr,
        "layers": args.layers,
        "seed": args.seed,
        "success_rate": float((held_out[3] > 0).float().mean()),
        "oracle_ev_by_position": oracle_ev,
        "oracle_ev_mid": (oracle_ev[3] + oracle_ev[4]) / 2,
        "curve": curve,
        "seconds": time.time() - t0,
        "commit": git_commit(),
        "argv": sys.argv[1:],
    }
    variant = f"pool{args.tables}" if args.variant == "pool" else args.variant
    name = f"learnability_{variant}_{args.targets}_K{args.hops}.json"
    write_json(os.path.join(args.results_dir, name), record)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The first rollouts' stop-bias diagnostic, before any table run: one batch of the cold-start policy's responses, scored
by several critics with the package's own GAE and `stop_advantage_gap` (what `diagnostics/stop_advantage_gap` logs at
the first update, computed here on more responses and on the same responses for every critic).

    python experiments/first_rollouts.py --policy experiments/.cache/majority/cold_start \\
        --critic rm_prefixes=experiments/.cache/majority/reward_model_prefixes \\
        --critic rm_eos=experiments/.cache/majority/reward_model --num-prompts 256 --name first

    python experiments/first_rollouts.py --task count-mod-5 --policy experiments/.cache/count_mod_5/cold_start \\
        --critic rm_eos=experiments/.cache/count_mod_5/reward_model_eos --name first \\
        --results-dir experiments/results/accuracy_link/first_rollouts

`--task` picks the training prompts and the verifier (the majority task, or the accuracy-link toy's count-mod-5 with
its budget's splits). Per critic it writes (to `<results-dir>/<name>.json`):

- `gap_lam_0.95` and `gap_lam_1.0`: the stop-vs-continue advantage gap with raw (not whitened) advantages at λ 0.95
  and at λ 1 (at λ = 1 a positional bias telescopes away, so that gap is the true advantage difference plus noise;
  the difference between the two is the critic's spurious share), overall and per absolute-position bucket;
- `explained_variance_mc`: 1 − Var(G − V) / Var(G) against the Monte-Carlo returns G (λ = 1, γ = 1) over all valid
  tokens, and per relative-position bucket;
- `value_by_position`: the critic's mean value and mean return per relative-position bucket (the bias' shape).

Scores follow the trainer's settings in `runner.py`: +1/−1 from the verifier, −1 more for a response cut at the length
limit (`missing_eos_penalty=1.0`), γ = 1, no KL.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", required=True)
    parser.add_argument("--critic", action="append", required=True, help="name=path (a reward model or critic).")
    parser.add_argument("--name", required=True)
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--response-length", type=int, default=320)
    parser.add_argument("--buckets", type=int, default=8)
    parser.add_argument("--seed", type=int, default=11, help="Prompt choice and sampling (not a table seed).")
    parser.add_argument("--task", choices=("majority", "count-mod-5"), default="majority")
    parser.add_argument("--task-kwargs", default="{}", help="JSON kwargs of make_majority_splits (the task variant).")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results", "majority", "first_rollouts"))
    args = parser.parse_args(argv)

    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vcppo_trl.algo.diagnostics import (
        explained_variance,
        marker_token_ids,
        position_bucket_explained_variance,
        position_bucket_means,
        stop_advantage_gap,
        stop_positions,
    )
    from vcppo_trl.algo.gae import gae
    from vcppo_trl.models.policy_and_value import position_ids_from_mask
    from vcppo_trl.models.value_model import load_value_model, value_forward
    from vcppo_trl.toy.majority import majority_reward, make_majority_splits
    from vcppo_trl.toy.reward_model import sample_responses

    torch.set_num_threads(args.threads)
    if args.task == "count-mod-5":
        import task_running_sum

        from vcppo_trl.toy.running_sum import running_sum_reward as reward

        train = task_running_sum.COUNT_MOD_5_BUDGET.splits()["train"]
    else:
        reward = majority_reward
        train = make_majority_splits(seed=0, **json.loads(args.task_kwargs))["train"]
    rng = random.Random(args.seed)
    rows = train.select(rng.sample(range(len(train)), args.num_prompts))
    tokenizer = AutoTokenizer.from_pretrained(args.policy)
    policy = AutoModelForCausalLM.from_pretrained(args.policy)
    t0 = time.time()
    torch.manual_seed(args.seed)
    responses = sample_responses(policy, tokenizer, rows["prompt"], max_new_tokens=args.response_length)
    sampling_seconds = time.time() - t0
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    eos = tokenizer.eos_token_id
    has_stop = torch.tensor([bool(r) and r[-1] == eos for r in responses])
    scores = torch.tensor(reward(texts, rows["solution"])) - (~has_stop).float()

    # [prompt | response], prompts left-padded to a common context length, responses right-padded.
    tokenizer.padding_side = "left"
    enc = tokenizer(list(rows["prompt"]), return_tensors="pt", padding=True)
    context = enc["input_ids"].shape[1]
    width = max(len(r) for r in responses)
    response_ids = torch.full((len(responses), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(responses), width), dtype=torch.bool)
    for i, r in enumerate(responses):
        response_ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = True
    input_ids = torch.cat([enc["input_ids"], response_ids], dim=1)
    attention = torch.cat([enc["attention_mask"].bool(), mask], dim=1).long()
    positions = position_ids_from_mask(attention)
    lengths = mask.sum(1)
    rewards = torch.zeros(mask.shape)
    rewards[torch.arange(len(responses)), (lengths - 1).clamp(min=0)] = scores
    rewards = rewards * mask
    stops = stop_positions(response_ids, mask, marker_token_ids(tokenizer, "</think>"), has_stop)

    result = {
        "name": args.name,
        "command": "python experiments/first_rollouts.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "num_responses": len(responses),
        "accuracy": float((scores > 0).float().mean()),
        "response_tokens_mean": float(lengths.float().mean()),
        "stopped_share": float(has_stop.float().mean()),
        "sampling_seconds": sampling_seconds,
        "critics": {},
    }
    for spec in args.critic:
        name, path = spec.split("=", 1)
        critic = load_value_model(path).eval()
        values = []
        with torch.no_grad():
            for start in range(0, len(responses), 32):
                sl = slice(start, start + 32)
                values.append(value_forward(critic, input_ids[sl], attention[sl], positions[sl], context))
        values = torch.cat(values) * mask
        entry = {"path": path}
        for lam in (0.95, 1.0):
            adv, ret = gae(rewards, values, mask, 1.0, lam)
            res = stop_advantage_gap(adv, mask, stops, args.buckets, args.response_length)
            entry[f"gap_lam_{lam}"] = res.gap
            entry[f"gap_lam_{lam}_by_bucket"] = [None if x != x else float(x) for x in res.bucket_gaps.tolist()]
            entry["stop_counts_by_bucket"] = res.stop_counts.tolist()
            if lam == 1.0:
                entry["explained_variance_mc"] = float(explained_variance(values, ret, mask))
                entry["explained_variance_mc_by_position"] = [
                    float(x) for x in position_bucket_explained_variance(values, ret, mask, args.buckets)
                ]
                entry["value_by_position"] = [float(x) for x in position_bucket_means(values, mask, args.buckets)]
                entry["return_by_position"] = [float(x) for x in position_bucket_means(ret, mask, args.buckets)]
        result["critics"][name] = entry
        print(
            f"{name:14s} gap λ.95 {entry['gap_lam_0.95']:+.3f}  gap λ1 {entry['gap_lam_1.0']:+.3f}  "
            f"EV(MC) {entry['explained_variance_mc']:+.3f}  V by position "
            + " ".join(f"{v:+.2f}" for v in entry["value_by_position"])
        )
    os.makedirs(args.results_dir, exist_ok=True)
    with open(os.path.join(args.results_dir, f"{args.name}.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "critics"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

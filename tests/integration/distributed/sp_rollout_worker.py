"""One rank of a 2-process check of the rollout's split no-grad forwards, launched by test_distributed.py.

    ACCELERATE_USE_CPU=1 python -m torch.distributed.run --standalone --nproc_per_node 2 \
        tests/integration/distributed/sp_rollout_worker.py OUT

A trainer with `sequence_parallel_size=2`, a KL penalty against a reference model of its own (different weights) and a
token budget makes a rollout (generation with the original attention, then the maker's forwards split across both
processes). A second maker on the same models with sequence parallelism off computes the same forwards whole on each
process, at full width; the old log-probs, values and reference log-probs must agree. Then, on rows cut to lengths that differ between
the ranks (rank 0 short, rank 1 long, one row fewer), both makers compute the forwards again, and a generation
window's (`forward_with_bootstrap`, some rows unfinished); and once more with the sum over the group switched off, to
show the comparison would catch it. Rank 0 writes `OUT/sp_rollout.json`. Under DeepSpeed (configs/accelerate/
zero3_cpu.yaml) the models and the reference are ZeRO-3 engines.
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


def relative_difference(got: torch.Tensor, expected: torch.Tensor, mask: torch.Tensor) -> float:
    """The largest difference on `mask`, relative to the largest entry there."""
    scale = float(expected[mask].abs().max()) or 1.0
    return float((got[mask] - expected[mask]).abs().max()) / scale


def main(out_dir: str) -> None:
    from accelerate.utils import gather_object
    from common import parity_reward, tiny_models_and_prompts, tiny_policy, worker_config  # beside this script
    from worker_exit import exit_worker  # beside this script

    import vcppo_trl.models.packing as packing
    from vcppo_trl import PPOConfig, PPOTrainer
    from vcppo_trl.parallel import sequence
    from vcppo_trl.rollout.maker import RolloutMaker
    from vcppo_trl.trainer.prompts import prompt_batches

    tokenizer, policy, train = tiny_models_and_prompts(num_layers=2)
    reference = tiny_policy(tokenizer, seed=1, num_layers=2)
    args = worker_config(
        PPOConfig,
        out_dir,
        gloo_under_deepspeed=True,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        num_mini_batches=1,
        response_length=16,
        kl_coef=0.1,
        sequence_parallel_size=2,
        max_tokens_per_forward=40,  # per process: split micro-batches of up to 80 tokens, about 2 rows each
    )
    trainer = PPOTrainer(
        policy, parity_reward, args=args, train_dataset=train, processing_class=tokenizer, ref_model=reference
    )
    acc = trainer.accelerator
    rank = acc.process_index
    trainer._setup_training()
    split = trainer.rollout_maker
    whole = RolloutMaker(
        dataclasses.replace(  # whole, at full width (a budget would need as many rows on each process)
            split.settings,
            forwards=dataclasses.replace(split.settings.forwards, max_tokens=None),
        ),
        acc,
        tokenizer=tokenizer,
        sampler=None,
        current_model=split.forwarder.current_model,
        ref_model=split.forwarder.ref_model,
        reward_funcs=[],
        reward_processing_classes=[],
        reward_weights=torch.ones(0),
        stop_token_ids=split.stop_token_ids,
        reference_is_initial_policy=False,
    )

    switch_in_generation = []
    generate = split.sampler.generate

    def recording_generate(*a, **k):
        switch_in_generation.append(sequence._switch["depth"])
        return generate(*a, **k)

    split.sampler.generate = recording_generate
    rows = next(prompt_batches(trainer.train_dataset, trainer.batches, rank, args.seed, 1))
    rollout, stats = split.make(rows)

    def outputs(maker, rollout):
        forwards = maker.forwarder
        plan = forwards.forward_plan(rollout)
        logprobs, values = forwards.forward(rollout, compute_policy=True, plan=plan)
        return {"logprobs": logprobs, "values": values, "ref_logprobs": forwards.reference_logprobs(rollout, plan)}

    result = {
        "split_micro_batches": len(split.forwarder.forward_plan(rollout)),
        "whole_micro_batches": len(whole.forwarder.forward_plan(rollout)),
    }
    expected = outputs(whole, rollout)
    mask = rollout.response_mask
    result["made"] = {name: relative_difference(getattr(rollout, name), expected[name], mask) for name in expected}
    result["made_tokens"] = [int(mask.sum())]
    result["computed_tokens"] = stats.forwards.computed_tokens
    result["real_tokens"] = stats.forwards.real_tokens

    # Uneven rows: rank 0 short responses, rank 1 long ones and one row fewer; a window with unfinished rows.
    lengths = torch.tensor([2, 5, 3, 1] if rank == 0 else [16, 11, 14])
    cut = rollout.response_mask[: len(lengths)] & (torch.arange(mask.shape[1])[None, :] < lengths[:, None])
    uneven = dataclasses.replace(
        rollout,
        query_ids=rollout.query_ids[: len(lengths)],
        query_mask=rollout.query_mask[: len(lengths)],
        response_ids=rollout.response_ids[: len(lengths)].masked_fill(~cut, tokenizer.pad_token_id),
        response_mask=cut,
        finished=torch.tensor([True, False, False, True][: len(lengths)]),
    )
    expected = outputs(whole, uneven)
    got = outputs(split, uneven)
    result["uneven"] = {name: relative_difference(got[name], expected[name], cut) for name in expected}
    window_expected = whole.forwarder.forward_with_bootstrap(uneven, compute_policy=True)
    window_got = split.forwarder.forward_with_bootstrap(uneven, compute_policy=True)
    unfinished = ~uneven.finished
    result["window"] = {
        "logprobs": relative_difference(window_got[0], window_expected[0], cut),
        "values": relative_difference(window_got[1], window_expected[1], cut),
        "bootstrap": relative_difference(window_got[2], window_expected[2], unfinished),
        "bootstrap_of_finished": float(window_got[2][uneven.finished].abs().max()),
    }
    # Without the sum over the group each process keeps only the tokens predicted in its own columns.
    sum_over_group = packing.sum_over_group
    packing.sum_over_group = lambda tensor, group: tensor
    try:
        unsummed = outputs(split, uneven)
    finally:
        packing.sum_over_group = sum_over_group
    result["unsummed"] = {name: relative_difference(unsummed[name], expected[name], cut) for name in expected}
    result["switch_in_generation"] = switch_in_generation
    result["switch_after"] = sequence._switch["depth"]

    gathered = gather_object([result])
    if rank == 0:
        summary = {
            "num_processes": acc.num_processes,
            "deepspeed": trainer.is_deepspeed_enabled,
            "reference_is_engine": type(split.forwarder.ref_model).__name__ == "DeepSpeedEngine",
            "ranks": gathered,
        }
        with open(os.path.join(out_dir, "sp_rollout.json"), "w") as f:
            json.dump(summary, f)
    exit_worker(acc)


if __name__ == "__main__":
    main(sys.argv[1])

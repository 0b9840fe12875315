"""One rank of a multi-process training run on CPU, launched by the tests beside it
(test_distributed.py, test_elastic_resume.py, test_multinode.py) and by benchmarks/gpu_check.py.

    ACCELERATE_USE_CPU=1 python -m torch.distributed.run --standalone --nproc_per_node 2 \
        tests/integration/distributed/worker.py OUT

Builds the tiny toy policy in-process (same seed on every rank), trains a few VC-PPO updates (the first one value
pretraining) and writes `OUT/rank<r>.json`: the prompt indices this rank rolled out at each update, the rewards it
computed, the metrics it logged, and hashes of its policy and critic weights after training; rank 0 also saves the
model to `OUT/model`. An optional JSON argument overrides config fields (`resume_from_checkpoint` resumes;
`with_reward_model` adds a sequence-classification reward model; `lora` puts LoRA on the policy and the critic
(`lora_random_B`: the policy's B random of that scale before training, where LoRA would start at B = 0);
`push_to_hub` pushes at the end, to `HF_ENDPOINT`; `hidden_size` widens the policy, e.g. to 64 for vLLM's CPU backend).
Under FSDP2 rank 0 also records whether the weights a vLLM sync would send equal the gathered full weights; with
`lora`, after saving, how far the merged weights a sync sends (adapters' B set to random values first) are from those
PEFT's `merge_adapter` gives on an unsharded copy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


def state_hash(model: torch.nn.Module, state_dict: dict | None = None) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted((state_dict if state_dict is not None else model.state_dict()).items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def gathered_hash(model: torch.nn.Module | None) -> str | None:
    """Hash of the full weights; under ZeRO-3 or FSDP2 the shards are gathered first, on every rank (a collective: call
    on every rank). `None` for no model (a critic job's policy)."""
    if model is None:
        return None
    from vcppo_trl.parallel import is_fsdp2_sharded

    if is_fsdp2_sharded(model):  # FSDP2: the shards gathered into the full state dict, on every rank
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return state_hash(model, get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)))
    params = [p for p in model.parameters() if hasattr(p, "ds_id")]
    if not params:
        return state_hash(model)
    import deepspeed

    with deepspeed.zero.GatheredParameters(params):
        return state_hash(model)


def partition_counts(model: torch.nn.Module) -> dict[str, int]:
    """Parameters held by this rank (its ZeRO-3 partition or FSDP2 shard) and in the whole model."""

    def held(p):
        if hasattr(p, "ds_tensor"):
            return p.ds_tensor.numel()
        return p.to_local().numel() if hasattr(p, "to_local") else p.numel()

    local = sum(held(p) for p in model.parameters())
    total = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
    return {"local": local, "total": total}


def randomize_lora_b(policy_model: torch.nn.Module, rank: int, scale: float = 1.0) -> None:
    """Every LoRA B of the policy (this rank's shard of it under FSDP2) set to random values of standard deviation
    `scale`: LoRA starts at B = 0, which merges to the base weights."""
    generator = torch.Generator().manual_seed(1000 + rank)
    with torch.no_grad():
        for name, param in policy_model.named_parameters():
            if "lora_B" in name:
                local = param.data.to_local() if hasattr(param.data, "to_local") else param.data
                local.copy_(scale * torch.randn(local.shape, generator=generator, dtype=local.dtype))


def lora_vllm_weights_check(policy_model: torch.nn.Module, rank: int) -> dict | None:
    """A LoRA policy sharded by FSDP2: every adapter's B set to random values (LoRA starts at B = 0, which would merge
    to the base weights), then the weights a vLLM sync sends (gathered, merged) against what the merge_adapter path
    sends for an unsharded copy of the same PEFT model holding the gathered weights. A collective; rank 0's report (the
    names in order, the largest absolute difference, how far the merge moved the weights), `None` on the others."""
    import copy
    from contextlib import nullcontext

    from peft import get_peft_model

    from vcppo_trl.parallel import fsdp2_full_state_dict
    from vcppo_trl.parallel.fsdp import unsharded_class
    from vcppo_trl.sampling.vllm_checks import named_policy_weights

    randomize_lora_b(policy_model, rank)
    full = fsdp2_full_state_dict(policy_model, every_rank=True)
    sent = [(name, tensor.clone()) for name, tensor in named_policy_weights(policy_model, lambda _: nullcontext())]
    if rank != 0:
        return None
    inner = policy_model.get_base_model()
    unsharded = get_peft_model(
        unsharded_class(inner)(inner.config), copy.deepcopy(policy_model.peft_config["default"])
    )
    unsharded.load_state_dict(full)
    expected = [(name, tensor.clone()) for name, tensor in named_policy_weights(unsharded, lambda _: nullcontext())]
    base = {name.replace(".base_layer", ""): t for name, t in full.items() if ".base_layer.weight" in name}
    base = {name.removeprefix("base_model.model."): t for name, t in base.items()}
    return {
        "names_equal": [n for n, _ in sent] == [n for n, _ in expected],
        "max_abs_diff": max((a - b).abs().max().item() for (_, a), (_, b) in zip(sent, expected, strict=True)),
        "lora_B_max": max(t.abs().max().item() for n, t in full.items() if "lora_B" in n),
        "merged_moved": min((dict(sent)[n] - t).abs().max().item() for n, t in base.items()),
        "merged_layers": len(base),
        "dtype": str(sent[0][1].dtype),
    }


def main(out_dir: str, extra: list[str]) -> None:
    from common import tiny_models_and_prompts, worker_settings  # beside this script
    from transformers import TrainerCallback
    from worker_exit import exit_worker  # beside this script

    from vcppo_trl import TrainingInterrupted, VCPPOConfig, VCPPOTrainer

    overrides = json.loads(extra[0]) if extra else {}
    # `hidden_size` 64: heads 32 wide, which vLLM's CPU backend needs.
    tokenizer, policy, train = tiny_models_and_prompts(hidden_size=overrides.pop("hidden_size", 32))
    train = train.add_column("idx", list(range(len(train))))

    seen: list[list[int]] = []
    rewards: list[list[float]] = []

    def recording_reward(completions, idx, **kwargs):
        values = [1.0 if len(c) < 10 else -1.0 for c in completions]
        seen.append(list(idx))
        rewards.append(values)
        return values

    recording_reward.__name__ = "length_reward"
    completions_seen: list[list[str]] = []

    def recording_completions(completions, **kwargs):
        completions_seen.append(list(completions))
        return [0.0] * len(completions)

    logged: list[dict] = []
    initial_policy_hash = state_hash(policy)
    hashes_after_pretraining: dict[str, str] = {}
    optimizer_after_pretraining: dict[str, dict] = {}

    class RecordMetrics(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 1:  # value pretraining is over: how far did the policy's optimizer state move?
                from vcppo_trl.learner.optimizers import optimizer_state_summary

                for role in ("policy", "value"):
                    optimizer_after_pretraining[role] = optimizer_state_summary(trainer.optimizer, role)

        def on_train_begin(self, args, state, control, **kwargs):
            # The policy as training sees it (with LoRA: the wrapped model, whose hash differs from the bare one).
            hashes_after_pretraining["policy_at_start"] = gathered_hash(trainer.unwrapped_policy_and_critic()[0])

        def on_step_end(self, args, state, control, metrics=None, **kwargs):
            logged.append({k: v for k, v in (metrics or {}).items() if isinstance(v, (int, float))})
            print(f"UPDATE {state.global_step} RANK {trainer.accelerator.process_index}", flush=True)
            if state.global_step == 1:  # the value-pretraining update
                policy_model, critic_model = trainer.unwrapped_policy_and_critic()
                hashes_after_pretraining["policy"] = gathered_hash(policy_model)
                hashes_after_pretraining["critic"] = gathered_hash(critic_model)

    settings = worker_settings(
        out_dir,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        num_mini_batches=2,
        num_ppo_epochs=1,
        total_episodes=32,  # 2 PPO updates of 16 prompts (8 per rank), after 1 value-pretraining update
        value_pretrain_steps=1,
        response_length=12,
        activation_checkpointing=False,
        logging_steps=1,
        learning_rate=1e-3,
        local_rollout_forward_batch_size=8,
        kl_coef=0.0,
    )
    settings.update(overrides)
    reward_funcs, reward_tokenizers = [recording_reward, recording_completions], [None, None]
    if settings.pop("with_reward_model", False):  # a sequence-classification reward model, the same on every rank
        from transformers import AutoModelForSequenceClassification

        config = policy.config.__class__.from_dict({**policy.config.to_dict(), "num_labels": 1})
        torch.manual_seed(1)
        reward_funcs.append(AutoModelForSequenceClassification.from_config(config))
        reward_tokenizers.append(tokenizer)
    lora = settings.pop("lora", False)  # LoRA on the policy and on the critic
    lora_random_b = settings.pop("lora_random_B", None)  # the policy's LoRA B random of this scale before training
    store_batches = settings.pop("store_rollouts", None)  # a store-rollouts job of that many batches, not training
    args = VCPPOConfig(**settings)
    peft_kwargs = {}
    if lora:
        from peft import LoraConfig

        peft_kwargs = {
            "peft_config": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
            "value_peft_config": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        }
    trainer = VCPPOTrainer(
        model=policy,
        reward_funcs=reward_funcs,
        reward_processing_classes=reward_tokenizers,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=[RecordMetrics()],
        **peft_kwargs,
    )
    acc = trainer.accelerator
    if lora_random_b:
        randomize_lora_b(trainer.unwrapped_policy_and_critic()[0], acc.process_index, scale=lora_random_b)
    info = {
        "rank": acc.process_index,
        "num_processes": acc.num_processes,
        "distributed_type": str(acc.distributed_type),
        "torch_world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
    }
    if store_batches is not None:
        from vcppo_trl import store_rollouts

        report = store_rollouts(trainer, os.path.join(out_dir, "rollouts"), num_batches=store_batches)
        info.update(
            seen=seen, rewards=rewards, store=dataclasses.asdict(report), initial_policy_hash=initial_policy_hash
        )
        with open(os.path.join(out_dir, f"rank{acc.process_index}.json"), "w") as f:
            json.dump(info, f)
        acc.wait_for_everyone()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        sys.stdout.flush()
        os._exit(0)
    try:
        trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    except TrainingInterrupted as stop:  # a signal: the checkpoint is saved; report it and exit as train.py does
        with open(os.path.join(out_dir, f"rank{acc.process_index}.json"), "w") as f:
            json.dump({"interrupted": stop.checkpoint, "global_step": trainer.state.global_step}, f)
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        sys.stdout.flush()
        os._exit(stop.exit_code)
    policy_model, critic_model = trainer.unwrapped_policy_and_critic()
    info.update(
        seen=seen,
        rewards=rewards,
        completions=completions_seen,
        metrics=logged,
        initial_policy_hash=initial_policy_hash,
        after_pretraining=hashes_after_pretraining,
        optimizer_after_pretraining=optimizer_after_pretraining,
        policy_hash=gathered_hash(policy_model),
        critic_hash=gathered_hash(critic_model),
        policy_params=None if policy_model is None else partition_counts(policy_model),
        critic_params=partition_counts(critic_model),
        global_step=trainer.state.global_step,
        batch_size=trainer.batches.batch_size,
        batches_consumed=trainer.batches_consumed,
        last_rollout_rows=int(trainer.last_update.rollout.response_ids.shape[0]),
    )
    # What a vLLM sync sends under FSDP2: the full weights, gathered per tensor (LoRA merged: below, after saving).
    if trainer.is_fsdp2 and policy_model is not None and not lora:
        from contextlib import nullcontext

        from vcppo_trl.parallel import fsdp2_full_state_dict
        from vcppo_trl.sampling.vllm_checks import named_policy_weights

        full = fsdp2_full_state_dict(policy_model)  # on the CPU; the sampler's copies stay on the device
        sent = {name: tensor.clone() for name, tensor in named_policy_weights(policy_model, lambda _: nullcontext())}
        if acc.is_main_process:
            info["vllm_weights_match"] = set(sent) >= set(full) and all(
                torch.equal(sent[k].cpu(), full[k].cpu()) for k in full
            )
    info["fsdp2"] = trainer.is_fsdp2
    trainer.save_model(os.path.join(out_dir, "model"))
    if args.push_to_hub:  # every rank calls it, as a script would; the main process alone uploads
        info["pushed"] = trainer.push_to_hub() is not None
    if trainer.is_fsdp2 and policy_model is not None and lora:  # changes the adapters: after the model is saved
        info["vllm_lora"] = lora_vllm_weights_check(policy_model, acc.process_index)
    # This process's peak GPU memory over the whole run, saving included (benchmarks/gpu_check.py); None off CUDA.
    info["peak_gpu_bytes"] = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    with open(os.path.join(out_dir, f"rank{acc.process_index}.json"), "w") as f:
        json.dump(info, f)
    exit_worker(acc)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

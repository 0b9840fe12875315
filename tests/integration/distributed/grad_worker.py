"""One rank of a 2-process DDP check of the loss aggregation, launched by test_distributed.py.

    ACCELERATE_USE_CPU=1 python -m torch.distributed.run --standalone --nproc_per_node 2 \
        tests/integration/distributed/grad_worker.py OUT [LOSS_TYPE] [MAX_TOKENS_PER_MICRO_BATCH] [packed]

Each rank rolls out its own prompts and cuts its responses to lengths that differ between the ranks and between the
micro-batches (rank 0 short, rank 1 long), then runs one PPO optimizer step (4 micro-batches of 1 sequence per rank).
The gradient it steps with is compared to the gradient of the same loss computed in one process, on one copy of the
initial models, over the whole batch of both ranks: advantages whitened over the whole batch and token losses divided
by the whole batch's count. Rank 0 writes `OUT/grad_check.json` with the largest relative difference (and that of
the gradient norm; under DeepSpeed, launched with configs/accelerate/zero3_cpu.yaml, only the norm is compared).
With a token budget the ranks need different micro-batch counts (rank 0's short sequences fit in fewer): both must run
the largest, and the gradient must not change; `micro_batches` records each rank's count. `packed`: padding-free
forwards (`padding_free=True`) as well. `sp`: sequence parallelism over both processes (`sequence_parallel_size=2`:
every micro-batch of either rank split along the sequence across both, 8 micro-batches per rank). `checkpointing`:
gradient checkpointing on (its backward recomputes the forwards, split too under `sp`). `vapo`: every VAPO/DAPO policy-loss term on (clip-higher, dual-clip, the
entropy bonus, the positive-example LM loss over the correct responses of both ranks, truncated responses left out of
the policy loss), with fixed stop flags and correctness per rank.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


VAPO_TERMS = dict(
    cliprange_high=0.28,
    dual_clip_c=3.0,
    entropy_coef=0.05,
    positive_example_lm_coef=0.5,
    mask_truncated_completions=True,
)


def main(
    out_dir: str,
    loss_type: str,
    max_tokens: int | None,
    padding_free: bool = False,
    vapo: bool = False,
    sequence_parallel: bool = False,
    checkpointing: bool = False,
    bf16: bool = False,
) -> None:
    from accelerate.utils import gather_object
    from common import parity_reward, tiny_critic, tiny_models_and_prompts, worker_config  # beside this script
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from worker_exit import exit_worker  # beside this script

    from vcppo_trl import PPOConfig, PPOTrainer
    from vcppo_trl.algo.losses import clipped_policy_loss, clipped_value_loss, loss_normalizer, token_mean_term
    from vcppo_trl.models.logprobs import causal_lm_parts, full_logits_logprobs
    from vcppo_trl.models.policy_and_value import PolicyAndValueModel, position_ids_from_mask
    from vcppo_trl.models.value_model import value_forward
    from vcppo_trl.parallel import full_tensor
    from vcppo_trl.rollout.settings import old_logprobs_from_training_forward
    from vcppo_trl.rollout.shaping import token_rewards
    from vcppo_trl.trainer.prompts import prompt_batches

    tokenizer, policy, train = tiny_models_and_prompts()
    # Built before the config: under DeepSpeed, a model created once the config exists is created partitioned.
    critic = tiny_critic(policy)
    args = worker_config(
        PPOConfig,
        out_dir,
        gloo_under_deepspeed=True,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=4,
        num_mini_batches=1,
        num_ppo_epochs=1,
        response_length=16,
        lam=0.95,
        kl_coef=0.0,
        max_grad_norm=0.0,
        loss_type=loss_type,
        max_tokens_per_micro_batch=max_tokens,
        padding_free=padding_free,
        sequence_parallel_size=2 if sequence_parallel else 1,
        bf16=bf16,
        activation_checkpointing=checkpointing,
        local_rollout_forward_batch_size=8,
        **({"use_cpu": True} if os.environ.get("ACCELERATE_USE_FSDP") == "true" else {}),  # FSDP2 over gloo
        **(VAPO_TERMS if vapo else {}),
    )
    # The initial models, copied before the trainer exists (DeepSpeed partitions what it finds).
    reference = PolicyAndValueModel(copy.deepcopy(policy), copy.deepcopy(critic))
    reference_bf16 = copy.deepcopy(reference) if bf16 else None  # float32 weights, computed in bf16 (see below)
    trainer = PPOTrainer(
        policy, parity_reward, args=args, train_dataset=train, processing_class=tokenizer, value_model=critic
    )
    acc = trainer.accelerator
    rank = acc.process_index
    trainer._setup_training()
    wrapper = acc.unwrap_model(trainer.model_wrapped)

    rows = next(prompt_batches(trainer.train_dataset, trainer.batches, rank, args.seed, 1))
    rollout, _ = trainer.rollout_maker.make(rows)
    lengths = [1, 2, 3, 4] if rank == 0 else [12, 16, 9, 14]
    positions = torch.arange(rollout.response_mask.shape[1])
    rollout.response_mask = rollout.response_mask & (positions[None, :] < torch.tensor(lengths)[:, None])
    if vapo:  # one truncated response and different numbers of correct ones per rank
        rollout.has_stop = torch.tensor([True, True, False, True] if rank == 0 else [True, False, True, True])
        rollout.raw_scores = torch.tensor([1.0, -1.0, 1.0, 1.0] if rank == 0 else [-1.0, -1.0, 1.0, -1.0])
        rollout.scores = rollout.raw_scores.clone()
    rollout.rewards = token_rewards(rollout.scores, rollout.kl, rollout.response_mask, args.kl_coef)
    advantages, returns = trainer.compute_advantages(rollout)

    stepped = {}
    original_step = trainer.optimizer.step

    def step(*a, **k):
        if not trainer.is_deepspeed_enabled:
            for name, p in wrapper.named_parameters():
                # FSDP2: the shards gathered; FSDP's activation checkpointing wraps layers (a name of its own)
                stepped[name.replace("._checkpoint_wrapped_module", "")] = full_tensor(p.grad.detach()).clone()
        return original_step(*a, **k)

    trainer.optimizer.step = step  # (a no-op under DeepSpeed, whose engine steps inside the last backward)
    computed_in = set()  # the dtypes the linear layers compute in during the update (FSDP2: its param_dtype)
    hooks = [
        m.register_forward_hook(lambda mod, args, out: computed_in.add(str(out.dtype)))
        for m in wrapper.modules()
        if isinstance(m, torch.nn.Linear)
    ]
    update = trainer.learner.update(rollout, advantages, returns, value_cliprange=trainer.value_cliprange())
    for hook in hooks:
        hook.remove()
    stats = update.stats
    if update.old_logprobs is not None:  # the on-policy shortcut: the learner's own forward gave them
        rollout = dataclasses.replace(rollout, logprobs=update.old_logprobs)

    # The same step computed in one process over both ranks' sequences.
    fields = ("input_ids", "attention_mask", "response_mask", "values", "logprobs")
    mine = {name: getattr(rollout, name) for name in fields}
    policy_mask = rollout.response_mask & rollout.has_stop[:, None] if vapo else rollout.response_mask
    positive_mask = policy_mask & (rollout.raw_scores > args.accuracy_threshold)[:, None]
    mine.update(advantages=advantages, returns=returns, context_length=rollout.context_length)
    mine.update(policy_mask=policy_mask, positive_mask=positive_mask)
    chunks = gather_object([mine])
    valid = torch.cat([c["advantages"][c["policy_mask"]] for c in chunks])
    mean, std = valid.double().mean(), valid.double().std()
    length = args.response_length
    pg_count = sum(float(loss_normalizer(c["policy_mask"], loss_type, length)) for c in chunks)
    vf_count = sum(float(loss_normalizer(c["response_mask"], args.value_loss_type, length)) for c in chunks)
    policy_tokens = sum(float(c["policy_mask"].sum()) for c in chunks)
    positive_tokens = sum(float(c["positive_mask"].sum()) for c in chunks)

    def whole_batch_backward(reference, compute_dtype=None) -> float:
        """The whole batch's loss backpropagated through `reference` (one process); returns the value loss. With
        `compute_dtype` (bf16) every forward runs on the weights cast to it, their gradients flowing back into the
        float32 weights: what FSDP2's `MixedPrecisionPolicy(param_dtype=...)` does with its float32 shards."""
        from torch.nn.utils.stateless import _reparametrize_module

        reference.eval()  # no dropout (the trainer disables it in its models)
        expected_value_loss = 0.0
        for c in chunks:
            cast = {n: p.to(compute_dtype) for n, p in reference.named_parameters()} if compute_dtype else {}
            weights = _reparametrize_module(reference, cast, tie_weights=True) if cast else contextlib.nullcontext()
            m, pm = c["response_mask"], c["policy_mask"]
            whitened = (((c["advantages"].double() - mean) / std).float() * pm).float()
            ids, attention = c["input_ids"], c["attention_mask"]
            positions = position_ids_from_mask(attention)
            with weights:
                # The full-logits path: under a ZeRO-3 config TRL's LM-head gathering expects partitioned weights.
                logprobs, entropy = full_logits_logprobs(
                    reference.policy,
                    ids,
                    attention,
                    positions,
                    c["context_length"],
                    args.temperature,
                    compute_entropy=vapo,
                )
                values = value_forward(reference.critic, ids, attention, positions, c["context_length"])
            pg = clipped_policy_loss(
                logprobs,
                c["logprobs"],
                whitened,
                pm,
                args.cliprange,
                loss_type,
                pg_count,
                length,
                cliprange_high=args.cliprange_high,
                dual_clip_c=args.dual_clip_c,
            )
            vf = clipped_value_loss(
                values, c["values"], c["returns"], m, args.cliprange_value, args.value_loss_type, vf_count, length
            )
            expected_value_loss += float(vf.loss)
            loss = pg.loss + args.vf_coef * vf.loss
            if vapo:
                loss = loss - args.entropy_coef * token_mean_term(entropy, pm, policy_tokens)
                loss = loss + args.positive_example_lm_coef * token_mean_term(
                    -logprobs, c["positive_mask"], positive_tokens
                )
            loss.backward()
        return expected_value_loss

    expected_value_loss = whole_batch_backward(reference)
    expected_norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in reference.parameters()])))
    result = {
        "num_processes": acc.num_processes,
        "deepspeed": trainer.is_deepspeed_enabled,
        "fsdp2": trainer.is_fsdp2,
        # The policy's log-probs took the chunked LM-head path (no [B, T, V] logits), FSDP2's sharded head included
        "chunked_logprobs": causal_lm_parts(wrapper.policy) is not None,
        # Layers wrapped by FSDP's activation checkpointing (`--fsdp_activation_checkpointing true`)
        "checkpoint_wrapped": sum(isinstance(m, CheckpointWrapper) for m in wrapper.modules()),
        # One epoch, one mini-batch, KL 0: the update took its old log-probs from its own forward (on-policy shortcut).
        "on_policy_shortcut": old_logprobs_from_training_forward(args) and update.old_logprobs is not None,
        # The joint gradient norm the step reports (DeepSpeed's own under DeepSpeed) against the reference's.
        "grad_norm_relative_difference": abs(stats["grad_norm"] - expected_norm) / expected_norm,
        "micro_batches": gather_object([update.work.micro_batches]),
        "computed_tokens": gather_object([update.work.computed_tokens]),
        "positive_tokens": positive_tokens,
        "positive_example_lm": stats.get("loss/positive_example_lm"),
        # The logged value loss of each process (its mean over processes is the global loss) and the global loss
        "value_loss": gather_object([stats["loss/value"]]),
        "expected_value_loss": expected_value_loss,
        "computed_in": sorted(computed_in),
        # the trained parameters as the optimizer holds them (FSDP2: its shards, the master weights)
        "parameter_dtypes": sorted({str(p.dtype) for p in wrapper.parameters()}),
        "finite_losses": all(math.isfinite(float(v)) for k, v in stats.items() if k.startswith("loss/")),
    }
    if not trainer.is_deepspeed_enabled:  # DeepSpeed's gradients are partitioned and gone after its step
        worst = 0.0
        for name, p in reference.named_parameters():
            expected = p.grad
            scale = float(expected.abs().max()) or 1.0
            worst = max(worst, float((stepped[name] - expected).abs().max()) / scale)
        result["max_relative_difference"] = worst
    if bf16:  # against the one-process step computed in bf16
        whole_batch_backward(reference_bf16, torch.bfloat16)
        worst = 0.0
        for name, p in reference_bf16.named_parameters():
            expected = p.grad
            worst = max(worst, float((stepped[name] - expected).abs().max()) / (float(expected.abs().max()) or 1.0))
        result["max_relative_difference_bf16"] = worst
    if result["checkpoint_wrapped"]:  # the wrapped layers save under their own names, which load into a fresh model
        from transformers import AutoModelForCausalLM

        trainer.save_model(os.path.join(out_dir, "saved"))
        if rank == 0:
            saved = AutoModelForCausalLM.from_pretrained(os.path.join(out_dir, "saved"))
            result["saved_names_match"] = sorted(saved.state_dict()) == sorted(reference.policy.state_dict())
    if rank == 0:
        with open(os.path.join(out_dir, "grad_check.json"), "w") as f:
            json.dump(result, f)
    exit_worker(acc)


if __name__ == "__main__":
    flags = sys.argv[3:]
    budget = next((int(f) for f in flags if f.isdigit()), None)
    loss = sys.argv[2] if len(sys.argv) > 2 else "token_mean"
    main(
        sys.argv[1],
        loss,
        budget,
        "packed" in flags,
        "vapo" in flags,
        "sp" in flags,
        "checkpointing" in flags,
        "bf16" in flags,
    )

"""One command for a machine with a GPU: does the package run there, how fast, in how much memory. Prints one table.

    python benchmarks/gpu_check.py               # needs CUDA; without the rollout row about 545 s on one H200
                                                 # at f5cfd98 (measured in two commands: 349 s + 195 s)
    python benchmarks/gpu_check.py --cpu-smoke   # the same code paths on CPU at tiny sizes
                                                 # (tests/integration/scripts/test_gpu_check.py)

Run on one H200 at commit f5cfd98 in two commands (`--skip logprob long rollout fp32 --windows-length 1024`, then
`--skip gae update windows zero3 fsdp2 rollout`; vLLM's CUDA wheel could not be carried there):
benchmarks/results/gpu_check_h200_f5cfd98.txt, figures in docs/benchmarks.md. The run before it:
benchmarks/results/gpu_check_h200_ee33196.txt. Rows:

1. `gae`: `vcppo_trl.gae.dual_lambda_gae` against the per-token Python loop of benchmarks/gae.py, 64 x 16,384 tokens
   (smoke: 4 x 64), on the device; median times and their ratio, and the largest difference between the two.
2. `update`: one bf16 VC-PPO update (rollout forward of policy and critic, dual-lambda GAE, whitening, then the clipped
   policy and value losses with backward and an AdamW step over micro-batches) on a Qwen2.5-0.5B-shaped policy and
   critic with random weights (no download), SDPA attention, 4,096-token responses after 256 prompt tokens,
   activation checkpointing; tokens/s of the update and peak GPU memory (smoke: a 2-layer, hidden-32 model, 32 tokens).
3. `logprob-*`: extra peak memory of the response log-probs at 16,384 tokens x a 151,936-token vocabulary (Qwen2.5's),
   chunked (`vcppo_trl.models.logprobs.response_logprobs`) against full logits, without and with backward (smoke: 64 x 1,000).
   The full-logit rows hold 16,384 x 151,936 logits in bf16 and fp32 (9.3 GiB for one fp32 copy), so by arithmetic
   they need tens of GiB; on a small GPU they are expected to print FAILED (out of memory), which is itself a result.
5. `rollout`: benchmarks/rollout.py on the device: HF `generate` against vLLM colocate, both through the trainer's
   generation seam, on the Qwen2.5-0.5B shape with random weights in bf16, 64 prompts of 32 tokens, forced
   1,024-token responses; tokens/s of each and their ratio, and vLLM's engine start (smoke: the tiny model, 16 tokens,
   CPU build of vLLM). Needs vLLM (`pip install -e ".[vllm]"`); without it the row says "not run" and why.
6. `long-padded`, `long-budget`, `long-packed-sdpa`, `long-packed-flex`: one bf16 update through the trainer's parts
   on 8 long-tailed responses up to 16,384 tokens (docs/long_responses.md) on the Qwen2.5-0.5B shape, padded (one
   sequence per micro-batch), with a token budget, and padding-free under sdpa and under flex attention; real tokens/s,
   MFU with attention FLOPs counted, peak memory (smoke: the tiny model, 4 responses up to 48 tokens; the flex row
   says "not run" on CPU, where torch's flex attention has no backward). On one H200 at ee33196: 2,288 / 17,481 /
   11,386 / 15,776 real tokens/s.
7. `windows`: generation windows (`generation_window`, docs/rollout_windows.md) through `VCPPOTrainer` on the
   Qwen2.5-0.5B shape with random weights in bf16, benchmarks/windows.py's setting (its long-tailed lengths with the
   stop applied while sampling, batch 8, KL 0, the on-policy shortcut) with its token budget: whole responses against
   a window of T/4 in one run; finished responses per second, generation seconds per update, update seconds and peak
   GPU memory of each, the window's as ratios to the whole side's. T = 1,024 (`--windows-length`), not 16,384: see
   `check_generation_windows` (smoke: the tiny model, T = 32, windows T/2 and T/4). On one H200 at f5cfd98 (T = 1,024):
   whole 0.299 finished/s, 28 s of generation in a 30.6 s update; T/4 1.41x the finished responses per second. At
   T = 2,048 the row takes about 10 minutes alone (the whole side did 2 of its 4 updates in 208 s at ee33196).
8. `fp32-head`: the sampler/trainer log-prob gap of benchmarks/fp32_head.py on the device, without and with
   `cast_lm_head_to_fp32`: the Qwen2.5-0.5B shape with random weights in bf16 (tied embeddings), 16 random prompts of
   32 tokens, 256 sampled tokens at temperature 1, 3 seeds; HF `generate` as the sampler (its own log-probs), the
   chunked training log-probs under bf16 autocast as the trainer; mean and max |Δ log p| per token, mean ± 95 %
   t-interval over the seeds (smoke: the tiny model, 4 prompts x 8 tokens). On one H200 at ee33196: mean 8.07e-03
   without the cast, 8.11e-03 with it; CPU figures in benchmarks/results/fp32_head_cpu.txt.

9. `server`: server-mode training with `max_staleness=1` against the synchronous server run
   (benchmarks/server_overlap.py's tiny policy, T = 256, batch 8): a vLLM server on the same host, the weights pushed
   over NCCL with two GPUs or more (the server on the second), through the shared folder with one; the synchronous
   run's largest |Δ log p| (an exact push leaves only numerics), the trainer's idle share of an update on each side,
   the speed-up (smoke: T = 16 on vLLM's CPU server). Never run on a GPU. Needs vLLM, as the rollout row.

Sequence parallelism (`sequence_parallel_size`, docs/distributed.md#sequence-parallelism) splits sequences across a
group of 2 or more processes, so it needs at least 2 GPUs: it has no row here (its CPU tests run 2 processes).

A row that fails prints FAILED and its error; the exit status is then 1. Without CUDA (and without `--cpu-smoke`) the
script says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import torch  # noqa: E402

# Qwen2.5-0.5B's architecture (its config.json), used with random weights.
QWEN25_05B = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
SMOKE_MODEL = dict(
    vocab_size=1000,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_reset(device: torch.device) -> int:
    """Reset the peak counter; returns the memory allocated now (the baseline), in bytes (0 off CUDA)."""
    gc.collect()
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def peak_gib(device: torch.device, baseline: int = 0) -> float | None:
    if device.type != "cuda":
        return None  # host memory is not what this check is about; the CPU smoke reports none
    return (torch.cuda.max_memory_allocated() - baseline) / 2**30


def check_gae(device: torch.device, smoke: bool) -> dict:
    import gae as gae_bench  # benchmarks/gae.py

    from vcppo_trl.algo.gae import dual_lambda_gae

    batch, length = (4, 64) if smoke else (64, 16384)
    rewards, values, mask = gae_bench.make_batch(batch, length, device)
    fast = lambda: dual_lambda_gae(rewards, values, mask, 1.0, 0.95, 1.0)  # noqa: E731
    loop = lambda: gae_bench.per_token_dual(rewards, values, mask, 1.0, 0.95, 1.0)  # noqa: E731
    fast(), loop()  # warm-up (kernels, compilation caches)
    fast_s = gae_bench.timed(fast, 5, device)
    loop_s = gae_bench.timed(loop, 1 if not smoke else 2, device)
    (a, r), (a_ref, r_ref) = fast(), loop()
    diff = max((a - a_ref).abs().max().item(), (r - r_ref).abs().max().item())
    return {
        "size": f"{batch}x{length}",
        "result": f"{fast_s * 1e3:.2f} ms vs loop {loop_s * 1e3:.1f} ms ({loop_s / fast_s:.0f}x); max diff {diff:.1e}",
    }


def build_pair(config_kwargs: dict, device: torch.device, dtype: torch.dtype, attention: str = "sdpa"):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

    config = Qwen2Config(**config_kwargs, attn_implementation=attention)
    torch.manual_seed(0)
    with torch.device(device):
        policy = Qwen2ForCausalLM(config).to(dtype)
        critic = Qwen2ForTokenClassification(Qwen2Config(**config_kwargs, num_labels=1, attn_implementation=attention))
        critic = critic.to(dtype)
    return policy, critic


def enable_activation_checkpointing(model) -> None:
    """Non-reentrant activation checkpointing under the name of the installed transformers (renamed in 5.2x)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def critic_values(critic, input_ids, attention_mask, position_ids, context_length: int) -> torch.Tensor:
    """V(s_t) for each response token t: the critic's output at the position before the token, float32 [B, T]."""
    out = critic(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    return out.logits[:, context_length - 1 : -1, 0].float()


def check_update(device: torch.device, smoke: bool) -> dict:
    from vcppo_trl.algo.gae import dual_lambda_gae
    from vcppo_trl.algo.losses import clipped_policy_loss, clipped_value_loss
    from vcppo_trl.algo.masked import masked_whiten
    from vcppo_trl.models.logprobs import response_logprobs
    from vcppo_trl.models.policy_and_value import position_ids_from_mask

    config = SMOKE_MODEL if smoke else QWEN25_05B
    batch, prompt_len, response_len = (2, 8, 32) if smoke else (4, 256, 4096)
    dtype = torch.bfloat16
    policy, critic = build_pair(config, device, dtype)
    for model in (policy, critic):
        enable_activation_checkpointing(model)
        model.config.use_cache = False
        model.train()
    optimizer = torch.optim.AdamW(
        [{"params": policy.parameters(), "lr": 1e-6}, {"params": critic.parameters(), "lr": 2e-6}]
    )
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, config["vocab_size"], (batch, prompt_len + response_len), generator=generator)
    input_ids = input_ids.to(device)
    lengths = torch.randint(response_len // 2, response_len + 1, (batch,), generator=generator)
    lengths[0] = response_len
    mask = (torch.arange(response_len)[None, :] < lengths[:, None]).to(device)
    attention_mask = torch.cat([torch.ones(batch, prompt_len, dtype=torch.long, device=device), mask.long()], 1)
    position_ids = position_ids_from_mask(attention_mask)
    scores = torch.where(torch.rand(batch, generator=generator) < 0.5, 1.0, -1.0).to(device)

    def one_update() -> tuple[float, float]:
        sync(device)
        start = time.perf_counter()
        with torch.no_grad():  # the rollout-side forwards (generation itself is not part of this check)
            old_logprobs, _ = response_logprobs(policy, input_ids, attention_mask, position_ids, prompt_len, 1.0)
            old_values = critic_values(critic, input_ids, attention_mask, position_ids, prompt_len)
            rewards = torch.zeros(batch, response_len, device=device)
            rewards[torch.arange(batch, device=device), lengths.to(device) - 1] = scores
            advantages, returns = dual_lambda_gae(rewards, old_values, mask, 1.0, 0.95, 1.0)
            advantages = masked_whiten(advantages, mask)
        sync(device)
        middle = time.perf_counter()
        normalizer = mask.sum()
        for i in range(batch):  # micro-batches of one sequence, one optimizer step (gradient accumulation)
            rows = slice(i, i + 1)
            logprobs, _ = response_logprobs(
                policy, input_ids[rows], attention_mask[rows], position_ids[rows], prompt_len, 1.0
            )
            values = critic_values(critic, input_ids[rows], attention_mask[rows], position_ids[rows], prompt_len)
            pg = clipped_policy_loss(
                logprobs, old_logprobs[rows], advantages[rows], mask[rows], 0.2, normalizer=normalizer
            )
            vf = clipped_value_loss(values, old_values[rows], returns[rows], mask[rows], 0.2, normalizer=normalizer)
            (pg.loss + 0.1 * vf.loss).backward()
        torch.nn.utils.clip_grad_norm_(list(policy.parameters()) + list(critic.parameters()), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync(device)
        return middle - start, time.perf_counter() - middle

    one_update()  # warm-up: kernels, allocator, optimizer states
    baseline = peak_reset(device)
    forward_s, update_s = one_update()
    peak = peak_gib(device)  # absolute: weights, AdamW states, activations of the update
    tokens = int(attention_mask.sum())
    params = sum(p.numel() for p in policy.parameters()) + sum(p.numel() for p in critic.parameters())
    memory = "" if peak is None else f"; peak {peak:.1f} GiB (of which {baseline / 2**30:.1f} GiB before it)"
    return {
        "size": f"{params / 1e6:.3g}M params, {batch}x{response_len} tok",
        "result": f"{tokens / update_s:,.0f} tok/s update ({update_s:.2f} s), "
        f"rollout forwards {forward_s:.2f} s{memory}",
    }


def check_long_responses(device: torch.device, smoke: bool, variant: str, attention: str) -> dict:
    """
    One bf16 update through the trainer's own parts (`RolloutForwards.forward`, `PPOLearner.update`) on long-tailed
    responses (benchmarks/token_budget.py's distribution: mean ≈ 0.25 × max, 1 of 8 at the cap) up to 16,384 tokens
    on the Qwen2.5-0.5B-shaped pair, activation checkpointing: `padded` (one sequence per micro-batch and per no-grad
    forward, full width), `budget` (`max_tokens_per_micro_batch` = `max_tokens_per_forward` = the longest sequence),
    `packed` (the same budget, `padding_free=True`). Tokens/s of real tokens and MFU against the H200's 989 TFLOP/s
    dense bf16 peak, FLOPs counted as 2·N per token per pass (forward 1, backward 2) for each model plus attention
    4·L·h·layers per token over the width L each forward computes (a packed row: each sequence's own length under
    flex attention's block-sparse mask, the whole row under sdpa's dense one).
    """
    if attention == "flex_attention" and device.type != "cuda":
        return {"size": "-", "result": "not run: torch's flex attention has no CPU backward (a GPU row)"}
    import token_budget  # benchmarks/token_budget.py
    from accelerate import Accelerator

    from vcppo_trl import PPOConfig
    from vcppo_trl.algo.micro_batches import ForwardWork, plan_forwards
    from vcppo_trl.learner.optimizers import parameter_groups
    from vcppo_trl.learner.ppo_learner import PPOLearner
    from vcppo_trl.learner.settings import LearnerSettings
    from vcppo_trl.models.policy_and_value import PolicyAndValueModel
    from vcppo_trl.rollout.forwards import RolloutForwards
    from vcppo_trl.rollout.settings import RolloutSettings
    from vcppo_trl.rollout.shaping import token_rewards

    config = dict(SMOKE_MODEL) if smoke else dict(QWEN25_05B)
    sequences, max_length = (4, 48) if smoke else (8, 16384)
    prompts, responses = token_budget.draw_lengths("long-tailed", max_length, sequences=sequences)
    rollout = token_budget.build_rollout(prompts, responses)
    rollout = dataclasses.replace(
        rollout,
        query_ids=rollout.query_ids.to(device),
        query_mask=rollout.query_mask.to(device),
        response_ids=rollout.response_ids.to(device),
        response_mask=rollout.response_mask.to(device),
        scores=rollout.scores.to(device),
    )
    config["max_position_embeddings"] = max(prompts) + max_length + 8
    policy, critic = build_pair(config, device, torch.bfloat16, attention)
    for model in (policy, critic):
        enable_activation_checkpointing(model)
        model.config.use_cache = False
    pair = PolicyAndValueModel(policy, critic)
    width = max(prompts) + max_length
    budget = None if variant == "padded" else width
    args = PPOConfig(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=1,
        gradient_accumulation_steps=sequences,
        num_ppo_epochs=1,
        num_mini_batches=1,
        local_rollout_forward_batch_size=1,
        max_tokens_per_micro_batch=budget,
        max_tokens_per_forward=budget,
        padding_free=variant == "packed",
        response_length=max_length,
        lam=0.95,
        kl_coef=0.0,
        on_policy_shortcut=False,
        learning_rate=1e-6,
        bf16=False,
        use_cpu=device.type == "cpu",
        report_to="none",
    )
    accelerator = Accelerator(cpu=device.type == "cpu")
    rates = dict(learning_rate=args.learning_rate, value_learning_rate=args.value_learning_rate)
    groups = parameter_groups(pair.named_parameters(), set(), **rates, weight_decay=args.weight_decay)
    optimizer = torch.optim.AdamW(groups, lr=1e-6)
    learner = PPOLearner(
        pair,
        optimizer,
        lr_scheduler=None,
        accelerator=accelerator,
        settings=LearnerSettings.from_args(args),
        is_deepspeed=False,
        local_mini_batch_size=sequences,
    )
    rollout_forwards = RolloutForwards(  # the rollout's no-grad forwards, as a rollout maker runs them
        RolloutSettings.from_args(args),
        accelerator,
        current_model=lambda: pair,
        ref_model=None,
        pad_token_id=0,
    )
    rollout.kl = torch.zeros(rollout.response_mask.shape, device=device)
    rollout.rewards = token_rewards(rollout.scores, rollout.kl, rollout.response_mask, 0.0)

    def one_update() -> tuple[float, ForwardWork]:
        sync(device)
        start = time.perf_counter()
        rollout.logprobs, rollout.values = rollout_forwards.forward(rollout, True)
        returns = rollout.rewards.flip(1).cumsum(1).flip(1) * rollout.response_mask
        work = learner.update(rollout, returns - rollout.values, returns, value_cliprange=0.2).work
        sync(device)
        return time.perf_counter() - start, work

    one_update()  # warm-up
    peak_reset(device)
    seconds, work = one_update()
    peak = peak_gib(device)
    # FLOPs of the update as it ran (plan as the learner does: its micro-batches are the rollout forward's, too).
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    kv = config["num_key_value_heads"] * h // config["num_attention_heads"]
    params = layers * (2 * h * h + 2 * h * kv + 3 * h * config["intermediate_size"])  # non-embedding, per model
    lengths = [torch.tensor(prompts), torch.tensor(responses)]
    (plan,) = plan_forwards(
        [torch.arange(sequences)], *lengths, budget, 1, max(prompts), max_length, None, variant == "packed"
    )
    flops = 0.0
    for mb in plan:
        seqs = [(prompts[i] + responses[i]) for i in mb.indices.tolist()]
        if variant == "packed":
            spans = seqs if attention == "flex_attention" else [sum(seqs)]
            tokens, attention_flops = sum(seqs), sum(4 * n * n * h * layers for n in spans)
        else:
            tokens = mb.tokens
            attention_flops = 4 * (mb.prompt_width + mb.response_width) * h * layers * tokens
        # logits of the response positions: 2·h·V per token, only where log-probs are read (the policy)
        per_pass = 2 * (2 * params * tokens + attention_flops) + 2 * h * config["vocab_size"] * tokens
        flops += per_pass * 4  # the rollout's forward (1) and the update's forward and backward (3)
    real = sum(prompts) + sum(responses)
    mfu = flops / seconds / 989e12
    memory = "" if peak is None else f"; peak {peak:.1f} GiB"
    return {
        "size": f"{sequences} seq ≤{max_length}, {attention}",
        "result": f"{real / seconds:,.0f} real tok/s ({seconds:.2f} s, {work.micro_batches} micro-batches, "
        f"{work.real_tokens / work.computed_tokens:.2f} real); MFU {mfu:.1%} of 989 TFLOP/s{memory}",
    }


def check_logprob_memory(device: torch.device, smoke: bool, method: str, train: bool) -> dict:
    from vcppo_trl.models.logprobs import full_logits_logprobs, response_logprobs
    from vcppo_trl.models.policy_and_value import position_ids_from_mask

    config = dict(QWEN25_05B if not smoke else SMOKE_MODEL, num_hidden_layers=1)
    length = 64 if smoke else 16384
    policy, _ = build_pair(config, device, torch.bfloat16)
    policy.train(train)
    prompt = 16
    input_ids = torch.randint(
        0, config["vocab_size"], (1, prompt + length), generator=torch.Generator().manual_seed(2)
    )
    input_ids = input_ids.to(device)
    attention_mask = torch.ones_like(input_ids)
    position_ids = position_ids_from_mask(attention_mask)
    fn = {"chunked": response_logprobs, "full": full_logits_logprobs}[method]
    baseline = peak_reset(device)
    sync(device)
    start = time.perf_counter()
    with torch.set_grad_enabled(train):
        logprobs, entropy = fn(policy, input_ids, attention_mask, position_ids, prompt, 1.0, compute_entropy=train)
        if train:
            (logprobs.sum() + entropy.sum()).backward()
    sync(device)
    seconds = time.perf_counter() - start
    assert torch.isfinite(logprobs).all()
    peak = peak_gib(device, baseline)
    logits_gib = length * config["vocab_size"] * 4 / 2**30
    memory = "" if peak is None else f"extra peak {peak:.2f} GiB; "
    return {
        "size": f"{length}x{config['vocab_size']}",
        "result": f"{memory}{seconds:.2f} s (fp32 logits would be {logits_gib:.2f} GiB)",
    }


WINDOWS_LENGTH = 1024  # the `windows` row's T on the GPU (--windows-length); why not 16,384: check_generation_windows


def run_windows_side(
    config_kwargs: dict,
    device: torch.device,
    response_length: int,
    window: int | None,
    warmup: int,
    updates: int,
    pool: int | None = None,
) -> dict:
    """
    One side of the `windows` row: `VCPPOTrainer` on `config_kwargs`' shape (random weights in bf16, the critic built
    from the policy) for `warmup + updates` updates with `generation_window=window`, in benchmarks/windows.py's setting
    (its prompts, tokenizer, reward and `DrawnLengthStop`, batch 8, KL 0, the on-policy shortcut) with the token budget
    of its `*-budget` sides, activation checkpointing. Over the timed updates: finished responses per second, medians
    of generation and update seconds, peak GPU memory of the whole run (weights and AdamW states included).
    """
    import windows  # benchmarks/windows.py
    from datasets import Dataset
    from step_ours import vcppo_update_config
    from step_setup import EOS_ID, PROMPT_LENGTH, build_tokenizer, prompt_ids, prompt_texts
    from transformers import LogitsProcessorList, Qwen2Config, Qwen2ForCausalLM

    batch, seed = windows.BATCH, 0  # `pool`: rollout_pool_size (responses in flight), None: the batch
    baseline = peak_reset(device)
    config_kwargs = dict(config_kwargs, max_position_embeddings=PROMPT_LENGTH + response_length + 8)
    config = Qwen2Config(
        **config_kwargs, attn_implementation="sdpa", bos_token_id=None, eos_token_id=None, pad_token_id=None
    )
    torch.manual_seed(seed)
    with torch.device(device):
        policy = Qwen2ForCausalLM(config).to(torch.bfloat16)
    policy.generation_config.pad_token_id = EOS_ID
    num_prompts = batch * (warmup + updates) * 2 + 2 * (pool or 0)  # windows draw prompts as responses finish
    ids = prompt_ids(num_prompts, seed)
    stop = windows.DrawnLengthStop(windows.drawn_lengths(ids, response_length, seed), response_length)

    def tokenizer_ids_only(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores[:, EOS_ID + 1 :] = float("-inf")  # the model has Qwen's vocabulary, the tokenizer ids 0..EOS_ID
        return scores

    processors = LogitsProcessorList([tokenizer_ids_only, stop])
    original = policy.generate
    policy.generate = lambda *args, **kwargs: original(*args, logits_processor=processors, **kwargs)
    budget = 2 * (PROMPT_LENGTH + response_length)  # windows.py's: two full-length sequences per forward
    with tempfile.TemporaryDirectory() as output_dir:
        args = vcppo_update_config(
            output_dir,
            batch=batch,
            response_length=response_length,
            updates=warmup + updates,
            seed=seed,
            generation_window=window,
            rollout_pool_size=pool,
            max_tokens_per_micro_batch=budget,
            max_tokens_per_forward=budget,
            learning_rate=1e-6,
            bf16=False,  # the weights are bf16 themselves, as in the other rows
            activation_checkpointing=True,
            use_cpu=device.type == "cpu",
        )
        dataset = Dataset.from_dict({"prompt": prompt_texts(num_prompts, seed)})
        seconds, timed = windows.timed_training(policy, build_tokenizer(), dataset, args, warmup)
        sync(device)
    peak = peak_gib(device, baseline)
    if len(timed) != updates:
        raise RuntimeError(f"{warmup + len(timed)} updates ran, {warmup + updates} expected")
    finished = [m.get("rollout/finished_responses", float(batch)) for m in timed]
    return {
        "finished_per_s": sum(finished) / sum(seconds),
        "generation_s": statistics.median(m["time/generation_s"] for m in timed),
        "update_s": statistics.median(seconds),
        "finished_per_update": statistics.median(finished),
        "peak_gib": peak,
    }


def check_generation_windows(device: torch.device, smoke: bool, response_length: int = WINDOWS_LENGTH) -> dict:
    """
    Generation windows against whole responses in one run, each side a fresh trainer (`run_windows_side`): 8
    responses per update (one pool of 8 with windows), 3 timed updates after ceil(T / W) warm-up ones (the pool has
    turned over once: its first responses at the cap have finished; whole responses: one). Printed: the whole side's
    finished responses per second, generation seconds per update, update seconds and peak memory, then each window's,
    with its ratio to the whole side's (no timing is asserted anywhere).

    Sizes. What costs here is sequential decoding: each update of the whole side decodes T steps (every batch of 8
    draws one response at the cap), a window side W per update, whatever the batch, and HF `generate` on a 24-layer
    model takes about 27 ms per step on one H200 (launch-bound at batch 8; measured at T = 1,024 at commit f5cfd98:
    28 s of generation per whole-response update). At T = 16,384 one whole-response update alone would be about 7
    minutes and the row (whole: 4 x T steps, T/4: 7 x T/4) about 50, past a lent machine's 10-minute command; at T =
    2,048 the row alone takes about 10 minutes (at ee33196 the whole side did 2 of its 4 updates in 208 s) and the
    default is T = 1,024, where the row took about 4 minutes. Generation dominates the update there as at 16,384 (28
    of 30.6 s per whole-response update), so the ratios read the same trade. `--windows-length 16384` runs it at the
    full length where the time is there. T/2 is left out on the GPU (another 5 x T/2 steps); the smoke run has it.
    `T/4 pool`: the window of T/4 with `rollout_pool_size` = batch x E⌈l/W⌉ (benchmarks/windows.py's `pool_size`, 16
    at T/4), so that an update finishes about a batch; about as long as the T/4 side on a GPU (a window still decodes
    W steps, whatever the rows). Smoke: the tiny model, T = 32, 2 timed updates.
    """
    import windows  # benchmarks/windows.py: the larger pool's size (batch x E⌈l/W⌉ over its length mix)

    config, updates = (SMOKE_MODEL, 2) if smoke else (QWEN25_05B, 3)
    length = 32 if smoke else response_length

    quarter = max(1, length // 4)
    window_sizes = {"T/2": (max(1, length // 2), None)} if smoke else {}
    window_sizes |= {"T/4": (quarter, None), "T/4 pool": (quarter, windows.pool_size(length, quarter))}
    whole = run_windows_side(config, device, length, None, 1, updates)
    sides = {
        name: run_windows_side(config, device, length, w, -(-length // w), updates, pool=pool)
        for name, (w, pool) in window_sizes.items()
    }

    def peak(r: dict, ratio: bool = False) -> str:
        if r["peak_gib"] is None:
            return ""
        return f", peak {r['peak_gib']:.1f} GiB" + (f" ({r['peak_gib'] / whole['peak_gib']:.2f}x)" if ratio else "")

    parts = [
        f"whole {whole['finished_per_s']:.3g} done/s, gen {whole['generation_s']:.3g} s/upd, "
        f"upd {whole['update_s']:.3g} s{peak(whole)}"
    ]
    for name, r in sides.items():
        parts.append(
            f"{name} {r['finished_per_s'] / whole['finished_per_s']:.2f}x done/s, "
            f"gen {r['generation_s'] / whole['generation_s']:.2f}x, upd {r['update_s'] / whole['update_s']:.2f}x"
            f"{peak(r, True)}, {r['finished_per_update']:.1f} done/upd"
        )
    return {"size": f"8 resp ≤{length}, {updates} upd", "result": "; ".join(parts)}


# The one-process rows: the toy worker through `accelerate launch`, what each launch expects of it.
ONE_PROCESS_ROWS = {
    # ZeRO-3: one process on the GPU and in the smoke (gloo, --ddp_backend so that accelerate counts the process).
    "zero3": dict(
        gpu=("zero3.yaml", 1, {"bf16": True}, "DistributedType.DEEPSPEED"),
        smoke=("zero3_cpu.yaml", 1, {"ddp_backend": "gloo"}, "DistributedType.DEEPSPEED"),
    ),
    # FSDP2: one process on the GPU (accelerate's own FSDP, a process group of 1); on a CPU accelerate makes no FSDP
    # plugin and the trainer refuses one process, so the smoke runs 2 (MULTI_CPU over gloo, sharded by the trainer
    # with accelerate's fsdp2_prepare_model: the same sharding code).
    "fsdp2": dict(
        gpu=("fsdp2.yaml", 1, {"bf16": True}, "DistributedType.FSDP"),
        smoke=("fsdp2_cpu.yaml", 2, {"use_cpu": True}, "DistributedType.MULTI_CPU"),
    ),
}


def launch_toy_worker(config: str, num_processes: int, overrides: dict) -> tuple[list[dict], float]:
    """tests/integration/distributed/worker.py (1 value-pretraining + VC-PPO updates of the tiny toy model, 32 prompts
    in all) under `accelerate launch --config_file configs/accelerate/<config> --num_processes <n>`, in an environment
    without any launcher's variables (ACCELERATE_USE_CPU included); each rank's JSON report and the seconds the launch
    took, start-up included."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "src"), os.environ.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--config_file"]
        cmd += [os.path.join(REPO, "configs", "accelerate", config), "--num_processes", str(num_processes)]
        worker = os.path.join(REPO, "tests", "integration", "distributed", "worker.py")
        cmd += ["--main_process_port", "0", worker, out, json.dumps(overrides)]
        start = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=REPO)
        seconds = time.perf_counter() - start
        paths = [os.path.join(out, f"rank{r}.json") for r in range(num_processes)]
        if done.returncode != 0 or not all(os.path.isfile(p) for p in paths):
            raise RuntimeError(f"exit {done.returncode}: {(done.stdout + done.stderr)[-1500:]}")
        return [json.load(open(p)) for p in paths], seconds


def check_one_process(device: torch.device, smoke: bool, launcher: str) -> dict:
    """The toy worker under `launcher` ("zero3" or "fsdp2", [`ONE_PROCESS_ROWS`]): one process on the GPU (the smoke's
    FSDP2 launch has 2: on a CPU one is refused). Both rows report the same: updates, whether the policy moved (rank
    0's gathered weights against the initial ones), with more than one rank each rank's share of the policy, peak GPU
    memory per process (on CUDA), and the launch's seconds, start-up included."""
    config, num_processes, overrides, expected_type = ONE_PROCESS_ROWS[launcher]["smoke" if smoke else "gpu"]
    ranks, seconds = launch_toy_worker(config, num_processes, overrides)
    first = ranks[0]
    expected_steps = 1 + 32 // (8 * num_processes)  # value pretraining, then 8 prompts per process per update
    for info in ranks:
        if info["distributed_type"] != expected_type or info["num_processes"] != num_processes:
            raise RuntimeError(f"unexpected launch: {info['distributed_type']} with {info['num_processes']} processes")
        if info["global_step"] != expected_steps:
            raise RuntimeError(f"{info['global_step']} updates, not {expected_steps}")
    if first["policy_hash"] == first["initial_policy_hash"]:
        raise RuntimeError("the policy did not move")
    parts = [f"{first['global_step']} updates, policy moved"]
    if num_processes > 1:  # each rank's share of the policy (one process holds it all, sharded or not)
        held = [r["policy_params"]["local"] for r in ranks]
        if max(held) >= first["policy_params"]["total"]:
            raise RuntimeError(f"the policy was not sharded: {held} of {first['policy_params']['total']} parameters")
        parts.append(f"sharded ({'+'.join(map(str, held))} of {first['policy_params']['total']} policy parameters)")
    peaks = [r.get("peak_gpu_bytes") for r in ranks]
    if all(p is not None for p in peaks):  # absolute, per process: CUDA context not included
        parts.append(f"peak {max(peaks) / 2**30:.2f} GiB")
    size = "toy, 1 process" if num_processes == 1 else f"toy, {num_processes} CPU processes"
    return {"size": size, "result": "; ".join(parts) + f"; {seconds:.0f} s with launch"}


def check_rollout(device: torch.device, smoke: bool) -> dict:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return {"size": "-", "result": 'not run: vLLM is not installed (pip install -e ".[vllm]")'}
    import rollout

    if smoke:
        rows = rollout.run([16], 4, 8, 1, rollout.SMOKE)
    else:
        rows = rollout.run([1024], 64, 32, 1, QWEN25_05B)
    row = rows[0]
    return {
        "size": f"{row['tokens']} tokens",
        "result": f"HF {row['hf_tokens_per_s']:.0f} tok/s, vLLM {row['vllm_tokens_per_s']:.0f} tok/s, ratio "
        f"{row['ratio']:.2f}x; engine start {row['engine_start_s']:.0f} s",
    }


def check_server(device: torch.device, smoke: bool) -> dict:
    """Server-mode training with `max_staleness=1` against the synchronous server run (benchmarks/server_overlap.py's
    setting): a vLLM server on `step_setup`'s tiny policy shape, the weights pushed after every policy update. With two
    GPUs or more, over NCCL (the server on the second GPU); with one, through the shared folder (NCCL cannot join two
    processes on one GPU), the server taking 30 % of its memory. The largest |Δ log p| of the synchronous run's updates
    (every update sampled from the weights it trains: a push that failed or lagged shows here), the trainer's idle
    share of an update on each side, and the speed-up."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return {"size": "-", "result": 'not run: vLLM is not installed (pip install -e ".[vllm]")'}
    import server_overlap  # benchmarks/server_overlap.py
    import step_setup

    length, updates, warmup = (16, 2, 1) if smoke else (256, 6, 2)
    transfer, server_args, server_env = "shared_folder", (), {}
    if device.type == "cuda":
        server_args = ("--gpu-memory-utilization", "0.3")
        if torch.cuda.device_count() >= 2:
            transfer, server_args = "nccl", ("--weight-transfer-config", '{"backend": "nccl"}')
            server_env = {"CUDA_VISIBLE_DEVICES": "1"}
    overrides = dict(use_cpu=device.type == "cpu", vllm_weight_transfer=transfer)
    with tempfile.TemporaryDirectory() as model_dir:
        server_overlap.vllm_ready_policy(length).save_pretrained(model_dir)
        step_setup.build_tokenizer().save_pretrained(model_dir)
        with server_overlap.vllm_server(
            model_dir, server_overlap.PROMPT_TOKENS + length, server_args, server_env
        ) as url:
            sides = [server_overlap.run_side(url, length, bound, updates, warmup, **overrides) for bound in (0, 1)]
    sync, ahead = sides
    idle = [100 * side["idle_s"] / side["update_s"] for side in sides]
    return {
        "size": f"T={length}, batch {server_overlap.BATCH}, {transfer}",
        "result": f"sync max |Δ log p| {sync['logp_gap_max']:.1e}; idle {idle[0]:.0f} % (sync) → {idle[1]:.0f} % "
        f"(max_staleness 1, staleness {int(ahead['staleness'])}); speed-up {sync['update_s'] / ahead['update_s']:.2f}x",
    }


def check_fp32_head(device: torch.device, smoke: bool) -> dict:
    import fp32_head  # benchmarks/fp32_head.py
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config_kwargs = SMOKE_MODEL if smoke else QWEN25_05B
    prompts, prompt_length, response_length = (4, 8, 8) if smoke else (16, 32, 256)
    seeds = (0, 1, 2)
    gaps: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for seed in seeds:
        torch.manual_seed(seed)
        with torch.device(device):
            policy = Qwen2ForCausalLM(Qwen2Config(**config_kwargs)).to(torch.bfloat16).eval()
        generator = torch.Generator().manual_seed(seed)
        query_ids = torch.randint(2, config_kwargs["vocab_size"], (prompts, prompt_length), generator=generator)
        query_ids = query_ids.to(device)
        for cast in (False, True):  # the same model, cast in place for the second measurement
            mean, high, _ = fp32_head.gap(
                policy,
                cast,
                seed,
                query_ids=query_ids,
                query_mask=torch.ones_like(query_ids),
                stop_token_id=1,
                pad_token_id=0,
                response_length=response_length,
                temperature=1.0,
            )
            gaps[cast].append((mean, high))
        del policy
        peak_reset(device)
    parts = []
    for cast, label in ((False, "bf16 head"), (True, "fp32 head")):
        mean, half = fp32_head.interval([g[0] for g in gaps[cast]])
        parts.append(f"{label} mean {mean:.2e} ± {half:.1e}, max {max(g[1] for g in gaps[cast]):.2e}")
    return {"size": f"{prompts}x{response_length}, {len(seeds)} seeds", "result": "|Δ log p| " + "; ".join(parts)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true", help="run every row on CPU at tiny sizes")
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        help="row names to skip (gae, update, logprob, long, windows, zero3, fsdp2, rollout, fp32, server)",
    )
    parser.add_argument(
        "--windows-length",
        type=int,
        default=WINDOWS_LENGTH,
        help=f"response length T of the windows row on the GPU (default {WINDOWS_LENGTH}; the smoke run uses 32)",
    )
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        print("gpu_check: no CUDA device is visible; nothing was measured. (--cpu-smoke runs the code paths on CPU.)")
        return 2
    smoke = args.cpu_smoke
    checks = [
        ("gae", lambda: check_gae(device, smoke)),
        ("update", lambda: check_update(device, smoke)),
        ("logprob-chunked", lambda: check_logprob_memory(device, smoke, "chunked", False)),
        ("logprob-full", lambda: check_logprob_memory(device, smoke, "full", False)),
        ("logprob-chunked-bwd", lambda: check_logprob_memory(device, smoke, "chunked", True)),
        ("logprob-full-bwd", lambda: check_logprob_memory(device, smoke, "full", True)),
        ("long-padded", lambda: check_long_responses(device, smoke, "padded", "sdpa")),
        ("long-budget", lambda: check_long_responses(device, smoke, "budget", "sdpa")),
        ("long-packed-sdpa", lambda: check_long_responses(device, smoke, "packed", "sdpa")),
        ("long-packed-flex", lambda: check_long_responses(device, smoke, "packed", "flex_attention")),
        ("windows", lambda: check_generation_windows(device, smoke, args.windows_length)),
        ("zero3-1proc", lambda: check_one_process(device, smoke, "zero3")),
        ("fsdp2-1proc", lambda: check_one_process(device, smoke, "fsdp2")),
        ("rollout", lambda: check_rollout(device, smoke)),
        ("fp32-head", lambda: check_fp32_head(device, smoke)),
        ("server", lambda: check_server(device, smoke)),
    ]
    rows, failed = [], 0
    for name, check in checks:
        if any(name.startswith(s) for s in args.skip):
            continue
        try:
            row = check()
        except Exception as exc:  # one failing row must not hide the others
            traceback.print_exc()
            row, failed = {"size": "-", "result": f"FAILED: {type(exc).__name__}: {str(exc)[:300]}"}, failed + 1
        rows.append((name, row))
        # each row as it finishes, so that a run stopped by a time limit keeps the rows it had
        print(f"[gpu_check] {name} done: {row['size']}  {row['result']}", file=sys.stderr, flush=True)
    where = "CPU smoke (tiny sizes)" if smoke else torch.cuda.get_device_name(0)
    print(f"\ngpu_check on {where}, torch {torch.__version__}")
    width = max(len(r["size"]) for _, r in rows) if rows else 4
    print(f"{'check':<20} {'size':<{width}}  result")
    for name, row in rows:
        print(f"{name:<20} {row['size']:<{width}}  {row['result']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: dual-λ GAE, the per-token loop (as in TRL ≤ 1.12, verl, OpenRLHF) against vcppo_trl's chunked scan.

    python benchmarks/gae.py            # CPU, and CUDA too when a GPU is present

For each (B, T) it prints the time of the per-token loop (two passes, one per λ), the time of
`vcppo_trl.gae.dual_lambda_gae`, their ratio, and the fast path's max abs error against a float64 per-token reference
(also relative to the largest |value| of the reference). Inputs are float32, right-padded with varied lengths.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from vcppo_trl.algo.gae import dual_lambda_gae


def per_token_gae(rewards, values, mask, gamma, lam):
    """The straightforward GAE: one reverse Python loop over token positions."""
    batch, length = rewards.shape
    mask = mask.to(rewards.dtype)
    advantages = torch.zeros_like(rewards)
    running = torch.zeros(batch, dtype=rewards.dtype, device=rewards.device)
    for t in reversed(range(length)):
        next_mask = mask[:, t + 1] if t + 1 < length else torch.zeros_like(running)
        next_value = values[:, t + 1] * next_mask if t + 1 < length else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * next_mask * running) * mask[:, t]
        advantages[:, t] = running
    return advantages, (advantages + values) * mask


def per_token_dual(rewards, values, mask, gamma, lam_actor, lam_critic):
    advantages, _ = per_token_gae(rewards, values, mask, gamma, lam_actor)
    _, returns = per_token_gae(rewards, values, mask, gamma, lam_critic)
    return advantages, returns


def make_batch(batch, length, device, seed=0):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=generator)
    lengths[0] = length
    mask = torch.arange(length)[None, :] < lengths[:, None]
    rewards = torch.randn(batch, length, generator=generator) * 0.05  # per-token KL-like noise
    rewards[torch.arange(batch), lengths - 1] += torch.where(torch.rand(batch, generator=generator) < 0.5, 1.0, -1.0)
    values = torch.randn(batch, length, generator=generator).cumsum(1) * 0.01
    return rewards.to(device), values.to(device), mask.to(device)


def timed(fn, repeats, device):
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of the fast path (median)")
    parser.add_argument("--loop-repeats", type=int, default=2, help="timed runs of the per-token loop (median)")
    args = parser.parse_args()
    gamma, lam_actor, lam_critic = 1.0, 0.95, 1.0
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    header = f"{'device':<6} {'B':>3} {'T':>6} {'loop (2 λ) ms':>14} {'fast ms':>9} {'speed-up':>9} {'max abs err':>12} {'rel err':>9}"
    print(
        f"dual-λ GAE, γ={gamma}, λ_actor={lam_actor}, λ_critic={lam_critic}, float32 inputs, torch threads={torch.get_num_threads()}"
    )
    print(header)
    print("-" * len(header))
    for device in devices:
        for batch, length in [(32, 1024), (32, 8192), (16, 16384)]:
            rewards, values, mask = make_batch(batch, length, device)
            reference = per_token_dual(rewards.double(), values.double(), mask, gamma, lam_actor, lam_critic)
            dual_lambda_gae(rewards, values, mask, gamma, lam_actor, lam_critic)  # warm-up
            inputs = (rewards, values, mask, gamma, lam_actor, lam_critic)
            loop_s = timed(functools.partial(per_token_dual, *inputs), args.loop_repeats, device)
            fast_s = timed(functools.partial(dual_lambda_gae, *inputs), args.repeats, device)
            fast = dual_lambda_gae(rewards, values, mask, gamma, lam_actor, lam_critic)
            error = max(float((f.double() - r).abs().max()) for f, r in zip(fast, reference))
            scale = max(1.0, max(float(r.abs().max()) for r in reference))
            print(
                f"{device.type:<6} {batch:>3} {length:>6} {loop_s * 1e3:>14.1f} {fast_s * 1e3:>9.2f} "
                f"{loop_s / fast_s:>8.1f}x {error:>12.2e} {error / scale:>9.1e}"
            )


if __name__ == "__main__":
    main()

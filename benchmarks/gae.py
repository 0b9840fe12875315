"""Benchmark: dual-λ GAE, the per-token loop (as in TRL ≤ 1.12, verl, OpenRLHF) against vcppo_trl's chunked scan.

    python benchmarks/gae.py            # CPU, and CUDA too when a GPU is present
    python benchmarks/gae.py --actions-only   # only the second table

For each (B, T) it prints the time of the per-token loop (two passes, one per λ), the time of
`vcppo_trl.gae.dual_lambda_gae`, their ratio, and the fast path's max abs error against a float64 per-token reference
(also relative to the largest |value| of the reference). Inputs are float32, right-padded with varied lengths.

The second table (tools and environments, issue 48): `dual_lambda_gae(..., action_mask=)` with a third of each row's
tokens in tool blocks against today's call without a mask on the same shapes, side by side in this process (the ratio
is the masked call's speed relative to the unmasked one), and its max abs error against a float64 loop over the
compressed sequence (the policy's tokens alone).
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


def tool_blocks(mask, seed=0, share=1 / 3, block=256):
    """An action mask: `share` of each row's valid tokens in tool blocks of up to `block` tokens (the policy's first
    token and the last one kept)."""
    generator = torch.Generator().manual_seed(seed)
    actions = mask.clone().cpu()
    for row in range(mask.shape[0]):
        length = int(mask[row].sum())
        masked, goal = 0, int(length * share)
        while masked < goal:
            size = min(int(torch.randint(16, block + 1, (1,), generator=generator)), goal - masked)
            start = int(torch.randint(1, max(2, length - size - 1), (1,), generator=generator))
            masked += int(actions[row, start : start + size].sum())
            actions[row, start : start + size] = False
    return actions.to(mask.device)


def compressed_reference(rewards, values, actions, gamma, lam):
    """float64 per-token GAE over each row's policy tokens alone, written back (the definition of `action_mask`)."""
    out_a = torch.zeros(rewards.shape, dtype=torch.float64)
    out_r = torch.zeros(rewards.shape, dtype=torch.float64)
    for row in range(rewards.shape[0]):
        idx = actions[row].nonzero().flatten().cpu()
        r, v = rewards[row, idx].double().cpu()[None], values[row, idx].double().cpu()[None]
        a, ret = per_token_gae(r, v, torch.ones_like(r, dtype=torch.bool), gamma, lam)
        out_a[row, idx], out_r[row, idx] = a[0], ret[0]
    return out_a, out_r


def actions_table(devices, repeats: int) -> None:
    gamma, lam_actor, lam_critic = 1.0, 0.95, 1.0
    header = f"{'device':<6} {'B':>3} {'T':>6} {'no mask ms':>11} {'action mask ms':>15} {'speed ratio':>12} {'max abs err':>12}"
    print(
        "\nGAE over the policy's tokens: a third of the tokens in tool blocks (action_mask) against no mask, same shapes"
    )
    print(f"(medians of {repeats} interleaved calls each, torch threads={torch.get_num_threads()})")
    print(header)
    print("-" * len(header))
    for device in devices:
        for batch, length in [(16, 1024), (16, 16384)]:
            rewards, values, mask = make_batch(batch, length, device)
            actions = tool_blocks(mask)
            rewards = rewards * actions  # no reward on a tool's token
            plain = functools.partial(dual_lambda_gae, rewards, values, mask, gamma, lam_actor, lam_critic)
            masked = functools.partial(plain, action_mask=actions)
            plain(), masked()  # warm-up
            # Interleaved, so that the machine's drift (frequency, other load) falls on both sides alike.
            times = [(timed(plain, 1, device), timed(masked, 1, device)) for _ in range(repeats)]
            plain_s = statistics.median(t[0] for t in times)
            masked_s = statistics.median(t[1] for t in times)
            advantages, returns = masked()
            ref_a, _ = compressed_reference(rewards, values, actions, gamma, lam_actor)
            _, ref_r = compressed_reference(rewards, values, actions, gamma, lam_critic)
            error = max(
                float((advantages.double().cpu() - ref_a).abs().max()),
                float((returns.double().cpu() - ref_r).abs().max()),
            )
            print(
                f"{device.type:<6} {batch:>3} {length:>6} {plain_s * 1e3:>11.2f} {masked_s * 1e3:>15.2f} "
                f"{plain_s / masked_s:>11.2f}x {error:>12.2e}"
            )


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
    parser.add_argument("--actions-only", action="store_true", help="only the action-mask table")
    parser.add_argument("--action-repeats", type=int, default=31, help="interleaved calls per side in that table")
    args = parser.parse_args()
    gamma, lam_actor, lam_critic = 1.0, 0.95, 1.0
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    if args.actions_only:
        actions_table(devices, args.action_repeats)
        return
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
    actions_table(devices, args.action_repeats)


if __name__ == "__main__":
    main()

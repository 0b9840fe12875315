"""The assets every run of a task starts from, built once and cached under the task's cache directory: the cold-start
policy and its held-out scores, the reward model(s) the baseline critics start from, and the controlled-bias critic.
What differs between tasks (the splits, the policy's size, the reward model's truncated prefixes) comes from the
task's budget (`task_addition.Budget` and its subclasses)."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from run_files import read_json, write_json

if TYPE_CHECKING:
    from task_addition import Budget


def build_cold_start(budget: Budget, cache_dir: str) -> dict[str, Any]:
    """The cold-start policy (cached under `cache_dir/cold_start`, keyed by `budget.asset_key()` in
    `cache_dir/assets.json`) and its greedy held-out scores (and sampled ones where the budget asks); returns the
    manifest."""
    from vcppo_trl.toy import build_tiny_model, build_tokenizer, cold_start_sft, greedy_accuracy

    os.makedirs(cache_dir, exist_ok=True)
    key = budget.asset_key()
    manifest_path = os.path.join(cache_dir, "assets.json")
    policy_dir = os.path.join(cache_dir, "cold_start")
    manifest = read_json(manifest_path)
    if manifest is None or manifest.get("key") != key:
        splits = budget.splits(cold_start=True)
        t0 = time.time()
        tokenizer = build_tokenizer()
        policy = build_tiny_model(tokenizer, seed=0, **budget.model_size())
        policy = cold_start_sft(
            policy,
            tokenizer,
            splits["train"],
            output_dir=os.path.join(cache_dir, "sft_logs"),
            max_steps=budget.cold_start_steps,
            target_accuracy=None,
            seed=0,
        )
        policy.save_pretrained(policy_dir)
        tokenizer.save_pretrained(policy_dir)
        seconds = time.time() - t0
        evaluation = greedy_accuracy(policy, tokenizer, splits["test"], max_new_tokens=budget.response_length)
        manifest = {"key": key, "cold_start_seconds": seconds, "cold_start_eval": evaluation}
        write_json(manifest_path, manifest)
    if budget.held_out_samples() and "cold_start_eval_sampled" not in manifest:
        # The sampled evaluation (tasks that ask for it), added to a cached cold start without rebuilding it.
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from vcppo_trl.toy import sampled_accuracy

        manifest["cold_start_eval_sampled"] = sampled_accuracy(
            AutoModelForCausalLM.from_pretrained(policy_dir),
            AutoTokenizer.from_pretrained(policy_dir),
            budget.splits()["test"],
            budget.held_out_samples(),
            budget.response_length,
        )
        write_json(manifest_path, manifest)
    manifest["policy"] = policy_dir
    return manifest


def build_reward_model_asset(budget: Budget, cache_dir: str, policy, tokenizer, eos_only: bool = False):
    """The baseline critic's reward model, cached in `cache_dir/reward_model` (with truncated prefixes where the budget
    asks, the majority task), or with `eos_only` the paper's EOS-only one in `cache_dir/reward_model_eos`."""
    import torch

    from vcppo_trl.toy.reward_model import build_reward_model

    prefixes = 0 if eos_only else budget.reward_model_prefixes()
    torch.manual_seed(0)
    return build_reward_model(
        policy,
        tokenizer,
        budget.splits()["train"],
        output_dir=os.path.join(cache_dir, "reward_model_eos" if eos_only else "reward_model"),
        num_samples=budget.rm_samples,
        num_epochs=budget.rm_epochs,
        max_new_tokens=budget.response_length,
        cache_key=budget.asset_key(),
        prefixes_per_response=prefixes,
    )


def build_assets(budget: Budget, cache_dir: str, controlled_bias_critic: bool = True) -> dict[str, Any]:
    """Cold-start policy, reward model and controlled-bias critic (cached), and the cold start's held-out scores.

    `controlled_bias_critic=False` skips that critic (a third of the critics' build time) when no variant to run
    starts from it; one built earlier stays in the manifest."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vcppo_trl.toy.reward_model import build_controlled_bias_critic

    manifest = build_cold_start(budget, cache_dir)
    key = budget.asset_key()
    manifest_path = os.path.join(cache_dir, "assets.json")
    policy_dir = manifest["policy"]
    splits = budget.splits()
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    policy = AutoModelForCausalLM.from_pretrained(policy_dir)
    rm_dir = os.path.join(cache_dir, "reward_model")
    t0 = time.time()
    torch.manual_seed(0)
    reward_model, rm_stats = build_reward_model_asset(budget, cache_dir, policy, tokenizer)
    if budget.reward_model_prefixes():
        _, rm_eos_stats = build_reward_model_asset(budget, cache_dir, policy, tokenizer, eos_only=True)
        manifest.update(
            reward_model_eos=os.path.join(cache_dir, "reward_model_eos"), reward_model_eos_stats=rm_eos_stats
        )
    if controlled_bias_critic:
        cb_dir = os.path.join(cache_dir, "controlled_bias_critic")
        _, cb_stats = build_controlled_bias_critic(
            reward_model,
            policy,
            tokenizer,
            splits["train"],
            bias=budget.controlled_bias,
            output_dir=cb_dir,
            num_samples=budget.controlled_bias_samples,
            num_epochs=budget.controlled_bias_epochs,
            max_new_tokens=budget.response_length,
            cache_key=key,
        )
        manifest.update(controlled_bias_critic=cb_dir, controlled_bias_stats=cb_stats)
    manifest.update(policy=policy_dir, reward_model=rm_dir, reward_model_stats=rm_stats)
    manifest.setdefault("critic_build_seconds", time.time() - t0)  # the first (real) build, not a cache load
    write_json(manifest_path, manifest)
    return manifest

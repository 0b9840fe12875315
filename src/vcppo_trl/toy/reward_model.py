"""Reward models and critics for the toy reproduction of the paper's PPO baseline (arXiv 2503.01491).

The paper's plain PPO starts its critic from a **reward model** trained on complete responses. Such a critic has never
seen an incomplete prefix, so its values along a response are whatever the reward model extrapolates: VC-PPO's premise
is that they are biased. [`build_reward_model`] trains that reward model for the toy: responses sampled from the
cold-start policy, labelled ±1 by the verifier, a sequence-classification model initialised from the policy and
regressed (MSE) on the label at the last token. It saves a standard checkpoint, which `value_model=` accepts (a
sequence-classification model becomes a token-classification critic with the same head, see
[`~vcppo_trl.models.value_model.as_value_model`]).

With `prefixes_per_response > 0`, [`build_reward_model`] also trains on truncated prefixes of the sampled responses,
labelled by the same verifier (a prefix holds no complete answer, so it does not verify: −1). That is **our device**,
not the paper's: on a real LLM a reward model trained at `<EOS>` only scores incomplete prefixes low, which the first
toy's EOS-only reward model did not do; adding prefixes is a natural way for early prefixes to be scored low.

[`build_controlled_bias_critic`] builds a *controlled-bias* critic, a labelled experimental device rather than
anything a reward model gives by itself: the reward model's own values plus a known ramp in relative position,
`−bias · (1 − (t + 1) / L)` for token `t` of a response of `L` tokens (low at the start of every response, unbiased at
its end — "incomplete prefixes scored low"), distilled into a token-classification critic. It lets the mechanism be
tested causally when a naturally trained reward model's values do not rise along the response.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from datasets import Dataset
from transformers import (
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..models.value_model import as_value_model, save_value_model
from ..rewards.math_verify import math_verify_reward
from .defaults import TOY_MAX_NEW_TOKENS

SETTINGS_FILE = "toy_build_settings.json"


@torch.no_grad()
def sample_responses(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    max_new_tokens: int = TOY_MAX_NEW_TOKENS,
    batch_size: int = 64,
    temperature: float = 1.0,
) -> list[list[int]]:
    """Samples one response per prompt (pure sampling at `temperature`), cut after the eos token.

    Returns:
        `list[list[int]]`: The response token ids, eos included when the response stopped.
    """
    was_training = policy.training
    policy.eval()
    padding_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    responses: list[list[int]] = []
    try:
        for start in range(0, len(prompts), batch_size):
            batch = tokenizer(list(prompts[start : start + batch_size]), return_tensors="pt", padding=True)
            out = policy.generate(**batch, generation_config=config)
            for ids in out[:, batch["input_ids"].shape[1] :].tolist():
                if tokenizer.eos_token_id in ids:
                    ids = ids[: ids.index(tokenizer.eos_token_id) + 1]
                else:
                    ids = [i for i in ids if i != tokenizer.pad_token_id]
                responses.append(ids)
    finally:
        tokenizer.padding_side = padding_side
        policy.train(was_training)
    return responses


def _right_padded(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids, mask


def _load_cached(output_dir: str | None, settings: dict[str, Any], model_class) -> tuple | None:
    """`(model, stats)` from `output_dir` when it holds a model built with exactly `settings`, else `None`."""
    file = os.path.join(output_dir, SETTINGS_FILE) if output_dir is not None else None
    if file is None or not os.path.isfile(file):
        return None
    with open(file) as f:
        saved = json.load(f)
    stats = saved.pop("stats", {})
    if saved != settings:
        return None
    return model_class.from_pretrained(output_dir), stats


def _write_settings(path: str, settings: dict[str, Any]) -> None:
    with open(os.path.join(path, SETTINGS_FILE), "w") as f:
        json.dump(settings, f, indent=2, sort_keys=True)


def build_reward_model(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: Dataset,
    output_dir: str | None = None,
    num_samples: int = 1280,
    num_epochs: int = 4,
    learning_rate: float = 5e-4,
    batch_size: int = 32,
    max_new_tokens: int = TOY_MAX_NEW_TOKENS,
    reward_func: Callable[..., list[float | None]] = math_verify_reward,
    seed: int = 0,
    cache_key: dict[str, Any] | None = None,
    prefixes_per_response: int = 0,
) -> tuple[PreTrainedModel, dict[str, float]]:
    """Trains a reward model on complete responses of `policy`, scored at the last token (the paper's RM), and with
    `prefixes_per_response > 0` also on truncated prefixes of them (our device, see the module docstring).

    With `output_dir`, the model is saved there as a standard checkpoint with the tokenizer; when that directory
    already holds a reward model built with the same settings (and `cache_key`), it is loaded instead of trained.

    Args:
        policy ([`~transformers.PreTrainedModel`]): The cold-start policy; samples the responses and initialises the
            reward model's backbone.
        tokenizer ([`~transformers.PreTrainedTokenizerBase`]): Its tokenizer (with distinct pad and eos tokens).
        dataset ([`~datasets.Dataset`]): Prompts (`prompt` column) and gold answers (`solution` column).
        output_dir (`str`, *optional*): Where to save (and cache) the reward model.
        num_samples (`int`): Responses sampled (one per prompt, cycling through the dataset).
        num_epochs (`int`), learning_rate (`float`), batch_size (`int`): Regression settings (AdamW, MSE on ±1).
        max_new_tokens (`int`): Longest sampled response.
        reward_func: Labels the responses (TRL's reward-function protocol; `None` labels are dropped).
        seed (`int`): Seed of sampling, head initialisation and data order.
        cache_key (`dict`, *optional*): Extra identity of the inputs (e.g. how the policy was made) for the cache.
        prefixes_per_response (`int`, defaults to `0`): Truncated prefixes added per labelled response: the response
            cut before token `c`, `c` drawn uniformly in `[0, len(response) − 1]` (from the bare prompt to all but the
            last token), labelled by `reward_func` on the prefix text (−1 unless it already holds the whole answer).
            `0`: complete responses only (the paper's reward model).

    Returns:
        `(reward_model, stats)`: an `AutoModelForSequenceClassification` with `num_labels == 1`, and the training
        statistics (`label_mean`, `sign_accuracy` and `mse` of the last epoch on the training sequences; with
        prefixes also `num_prefixes`, `prefix_label_mean`, and the last epoch's mean score on complete responses and
        on prefixes, `complete_score_mean` and `prefix_score_mean`).
    """
    settings = {
        "kind": "reward_model",
        "num_samples": num_samples,
        "num_epochs": num_epochs,
        "learning_rate": learning_rate,
        "batch_size": batch_size,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "cache_key": cache_key or {},
    }
    if prefixes_per_response < 0:
        raise ValueError(f"`prefixes_per_response` must be >= 0, got {prefixes_per_response}.")
    if prefixes_per_response:  # a key only then: reward models cached before the option stay valid
        settings.update(kind="reward_model_with_prefixes", prefixes_per_response=prefixes_per_response)
    cached = _load_cached(output_dir, settings, AutoModelForSequenceClassification)
    if cached is not None:
        return cached

    torch.manual_seed(seed)
    rows = [dataset[i % len(dataset)] for i in range(num_samples)]
    prompts = [r["prompt"] for r in rows]
    responses = sample_responses(policy, tokenizer, prompts, max_new_tokens=max_new_tokens)
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    labels = reward_func(completions=texts, solution=[r["solution"] for r in rows])
    keep = [i for i, y in enumerate(labels) if y is not None and math.isfinite(y)]
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    sequences = [prompt_ids[i] + responses[i] for i in keep]
    target_list = [float(labels[i]) for i in keep]
    num_complete = len(sequences)
    if prefixes_per_response:
        # Cut points from their own generator: the global RNG (hence the head's initialisation) is the same as without.
        cuts = torch.Generator().manual_seed(seed + 1)
        owners, prefixes = [], []
        for i in keep:
            for _ in range(prefixes_per_response if responses[i] else 0):
                cut = int(torch.randint(0, len(responses[i]), (1,), generator=cuts))
                owners.append(i)
                prefixes.append(responses[i][:cut])
        prefix_texts = tokenizer.batch_decode(prefixes, skip_special_tokens=True)
        prefix_labels = reward_func(completions=prefix_texts, solution=[rows[i]["solution"] for i in owners])
        for i, prefix, y in zip(owners, prefixes, prefix_labels):
            if y is not None and math.isfinite(y):
                sequences.append(prompt_ids[i] + prefix)
                target_list.append(float(y))
    targets = torch.tensor(target_list)

    config = policy.config.__class__.from_dict(policy.config.to_dict())
    config.num_labels = 1
    config.pad_token_id = tokenizer.pad_token_id
    model = AutoModelForSequenceClassification.from_config(config)
    # The backbone starts from the policy's; the scalar head is fresh (seeded above).
    getattr(model, model.base_model_prefix).load_state_dict(getattr(policy, policy.base_model_prefix).state_dict())
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(num_epochs):
        order = torch.randperm(len(sequences), generator=generator).tolist()
        preds = torch.empty_like(targets)
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            ids, mask = _right_padded([sequences[i] for i in idx], tokenizer.pad_token_id)
            score = model(input_ids=ids, attention_mask=mask).logits[:, 0]
            loss = F.mse_loss(score, targets[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            preds[idx] = score.detach()
    model.eval()
    stats = {
        "num_responses": float(len(sequences)),
        "label_mean": float(targets.mean()),
        "sign_accuracy": float((preds.sign() == targets.sign()).float().mean()),
        "mse": float(F.mse_loss(preds, targets)),
    }
    if prefixes_per_response:
        stats.update(
            num_prefixes=float(len(sequences) - num_complete),
            prefix_label_mean=float(targets[num_complete:].mean()) if len(sequences) > num_complete else math.nan,
            complete_score_mean=float(preds[:num_complete].mean()),
            prefix_score_mean=float(preds[num_complete:].mean()) if len(sequences) > num_complete else math.nan,
        )
    if output_dir is not None:
        os.makedirs(output_dir, exist_ok=True)
        model.save_pretrained(output_dir)
        tokenizer.save_pretrained(output_dir)
        _write_settings(output_dir, settings | {"stats": stats})
    return model, stats


def position_ramp(response_mask: torch.Tensor, bias: float) -> torch.Tensor:
    """The controlled bias `−bias · (1 − (t + 1) / L)` for token `t` of each response of `L` valid tokens.

    Values start `bias` low at the first token of every response and become unbiased at its last: "the more
    incomplete, the lower", measured as the share of the response still to come. With λ < 1 it gives the advantages
    the shape of the paper's Figure 2 (more positive the earlier the token).

    Args:
        response_mask (`torch.Tensor` of shape `[B, T]`): Right-padded mask of the valid response tokens.
        bias (`float`): How much lower the value is at the first token than at the last.

    Returns:
        `torch.Tensor` of shape `[B, T]`: the ramp (0 outside the mask; exactly 0 on each response's last token).
    """
    mask = response_mask.bool()
    lengths = mask.sum(dim=1, keepdim=True).clamp(min=1).float()
    positions = torch.arange(mask.shape[1], device=mask.device).float().unsqueeze(0) + 1.0
    return (-bias * (1.0 - positions / lengths)) * mask


def build_controlled_bias_critic(
    reward_model: PreTrainedModel,
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: Dataset,
    bias: float,
    output_dir: str | None = None,
    num_samples: int = 1280,
    num_epochs: int = 4,
    learning_rate: float = 5e-4,
    batch_size: int = 32,
    max_new_tokens: int = TOY_MAX_NEW_TOKENS,
    seed: int = 0,
    cache_key: dict[str, Any] | None = None,
) -> tuple[PreTrainedModel, dict[str, float]]:
    """Distils the reward model's per-token values plus [`position_ramp`] into a token-classification critic.

    The targets are `V_RM(s_t) + position_ramp_t` on responses sampled from `policy` (the critic the paper describes —
    incomplete prefixes valued low — made on purpose). Labelled a controlled-bias critic everywhere it is used.

    Returns:
        `(critic, stats)`: an `AutoModelForTokenClassification` with `num_labels == 1` and the distillation's final
        `mse` and the mean target by relative-position octile (`target_bucket_0` … `target_bucket_7`).
    """
    settings = {
        "kind": "controlled_bias_critic",
        "bias": bias,
        "num_samples": num_samples,
        "num_epochs": num_epochs,
        "learning_rate": learning_rate,
        "batch_size": batch_size,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "cache_key": cache_key or {},
    }
    cached = _load_cached(output_dir, settings, AutoModelForTokenClassification)
    if cached is not None:
        return cached

    from ..algo.diagnostics import position_bucket_means

    torch.manual_seed(seed)
    teacher = as_value_model(reward_model).eval()
    critic = as_value_model(reward_model)  # a second, trainable copy with the same weights
    rows = [dataset[i % len(dataset)] for i in range(num_samples)]
    prompt_ids = tokenizer([r["prompt"] for r in rows], add_special_tokens=False)["input_ids"]
    responses = sample_responses(policy, tokenizer, [r["prompt"] for r in rows], max_new_tokens=max_new_tokens)
    sequences = [p + r for p, r in zip(prompt_ids, responses)]
    starts = [len(p) for p in prompt_ids]

    def targets_of(idx: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        ids, mask = _right_padded([sequences[i] for i in idx], tokenizer.pad_token_id)
        # Value of response token t is read at the position before it (see value_forward).
        response_mask = torch.zeros_like(mask, dtype=torch.bool)
        rel_mask = torch.zeros_like(mask, dtype=torch.bool)
        for row, i in enumerate(idx):
            response_mask[row, starts[i] - 1 : len(sequences[i]) - 1] = True
            rel_mask[row, : len(sequences[i]) - starts[i]] = True
        with torch.no_grad():
            base = teacher(input_ids=ids, attention_mask=mask).logits[..., 0]
        ramp = torch.zeros_like(base)
        ramp[response_mask] = position_ramp(rel_mask, bias)[rel_mask]
        return ids, mask, response_mask, base + ramp

    critic.train()
    optimizer = torch.optim.AdamW(critic.parameters(), lr=learning_rate, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    mse = float("nan")
    for _ in range(num_epochs):
        order = torch.randperm(len(sequences), generator=generator).tolist()
        losses = []
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            ids, mask, response_mask, target = targets_of(idx)
            pred = critic(input_ids=ids, attention_mask=mask).logits[..., 0]
            loss = F.mse_loss(pred[response_mask], target[response_mask])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        mse = sum(losses) / len(losses)
    critic.eval()
    stats: dict[str, float] = {"mse": mse}
    # Mean target by relative position, on the first batch: what the critic was taught.
    idx = list(range(min(256, len(sequences))))
    _, _, response_mask, target = targets_of(idx)
    rel = torch.zeros(len(idx), response_mask.shape[1], dtype=torch.bool)
    rel_target = torch.zeros(len(idx), response_mask.shape[1])
    for row in range(len(idx)):
        n = int(response_mask[row].sum())
        rel[row, :n] = True
        rel_target[row, :n] = target[row][response_mask[row]]
    for k, v in enumerate(position_bucket_means(rel_target, rel, num_buckets=8).tolist()):
        stats[f"target_bucket_{k}"] = v
    if output_dir is not None:
        save_value_model(critic, tokenizer, output_dir)
        _write_settings(output_dir, settings | {"stats": stats})
    return critic, stats

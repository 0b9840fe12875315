"""Value pretraining from stored rollouts: the stored samples of one batch turned back into the
[`~rollout.scoring.ScoredSamples`] the sampler and reward functions gave, and a rollout source whose `make` reads them
instead of sampling ([`StoredRolloutSource`]).

Everything after sampling and scoring is the online phase's own code ([`~rollout.maker.RolloutMaker.complete`]: the
critic's forward for the old values, penalties, per-token rewards), so fed the same rollouts in the same order the
offline phase ends at the same critic as the online one, bit for bit.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pyarrow.parquet
import torch

from ..sampling.seam import Samples
from .maker import GenerationStats, RolloutMaker, RolloutStats
from .reward_scorer import weighted_scores
from .scoring import ScoredSamples
from .stored_format import (
    DATA_DIRNAME,
    ROLLOUT_COLUMNS,
    StoredRolloutsError,
    StoredRolloutsInfo,
    read_info,
    shard_name,
    stored_batches,
)
from .types import Rollout

# What must match between the run that stored the rollouts and the run that pretrains on them. The sampler (HF or
# vLLM) and the seed may differ: they draw from the same distribution.
MUST_MATCH = {
    "policy": ("name_or_path", "revision", "weights_sha256"),
    "tokenizer": ("vocab_sha256", "chat_template", "pad_token_id"),
    "sampling": ("temperature", "knobs", "response_length", "max_prompt_length", "stop_token_ids", "num_generations"),
    "rewards": ("functions", "weights"),
    "layout": ("num_processes", "prompts_per_process"),
}


def mismatches(stored: StoredRolloutsInfo, run: StoredRolloutsInfo) -> list[str]:
    """The fields of [`MUST_MATCH`] that differ, each as `section.key: stored != this run`."""
    return stored.differences(run, MUST_MATCH)


def resolve_stored_rollouts(source: str, token: str | None = None) -> str:
    """A local folder of stored rollouts: `source` itself, or a Hub dataset repo downloaded to the cache."""
    if os.path.isdir(source):
        return source
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(source, repo_type="dataset", token=token)
    except Exception as err:  # noqa: BLE001 - say what was looked for, with the cause
        raise StoredRolloutsError(
            f"value_pretrain_dataset={source!r} is neither a local folder nor a Hub dataset this machine can download "
            f"({type(err).__name__}: {err}). Give the folder `train.py --store_rollouts` wrote, or a Hub dataset id."
        ) from err


def open_stored_rollouts(
    source: str,
    maker: RolloutMaker,
    *,
    this_run: StoredRolloutsInfo,
    process_index: int,
    heldout_batches: int = 0,
    token: str | None = None,
    draw: Callable[[], list[dict[str, Any]]] | None = None,
) -> StoredRolloutSource:
    """The [`StoredRolloutSource`] of `value_pretrain_dataset=source` (a folder or a Hub dataset), refused when the
    rollouts are not this run's policy's, tokenizer's, sampling's, rewards' or layout's (naming each field that
    differs from `this_run`)."""
    stored = StoredRolloutSource(
        maker,
        resolve_stored_rollouts(source, token=token),
        process_index=process_index,
        heldout_batches=heldout_batches,
        draw=draw,
    )
    differences = mismatches(stored.info, this_run)
    if differences:
        raise StoredRolloutsError(
            f"value_pretrain_dataset={source!r} holds rollouts of another run: "
            + "; ".join(differences)
            + " (stored != this run). Store rollouts with this run's settings (train.py --store_rollouts)."
        )
    return stored


def scored_from_records(records: list[dict[str, Any]], maker: RolloutMaker, device: torch.device) -> ScoredSamples:
    """
    The [`~rollout.scoring.ScoredSamples`] of one stored batch as the online phase had them: prompts left-padded to
    the longest (mask as the tokenizer gives it), responses right-padded to the width the sampler returned, the
    sampler's log-probabilities where stored, every function's rewards, and their weighted sum computed as online.
    """
    pad = maker.tokenizer.pad_token_id
    prompt_width = max(len(r["prompt_ids"]) for r in records)
    response_width = records[0]["response_width"]
    query_ids = torch.full((len(records), prompt_width), pad, dtype=torch.long)
    query_mask = torch.zeros((len(records), prompt_width), dtype=torch.long)
    response_ids = torch.full((len(records), response_width), pad, dtype=torch.long)
    response_mask = torch.zeros((len(records), response_width), dtype=torch.bool)
    with_logprobs = records[0]["sampler_logprobs"] is not None
    logprobs = torch.zeros((len(records), response_width), dtype=torch.float32) if with_logprobs else None
    for i, record in enumerate(records):
        prompt, completion = record["prompt_ids"], record["completion_ids"]
        query_ids[i, prompt_width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        query_mask[i, prompt_width - len(prompt) :] = 1
        response_ids[i, : len(completion)] = torch.tensor(completion, dtype=torch.long)
        response_mask[i, : len(completion)] = True
        if with_logprobs:
            logprobs[i, : len(completion)] = torch.tensor(record["sampler_logprobs"], dtype=torch.float32)
    has_stop = torch.tensor([r["has_stop"] for r in records], dtype=torch.bool)
    samples = Samples(
        response_ids.to(device),
        response_mask.to(device),
        has_stop.to(device),
        logprobs=None if logprobs is None else logprobs.to(device),
    )
    rewards = torch.tensor([r["rewards"] for r in records], dtype=torch.float32, device=device)
    return ScoredSamples(
        query_ids.to(device),
        query_mask.to(device),
        samples,
        completions=[r["completion"] for r in records],
        rewards_per_func=rewards,
        reward_failed=torch.tensor([r["reward_failed"] for r in records], dtype=torch.bool, device=device),
        raw_scores=weighted_scores(rewards, maker.scorer.reward_weights),
    )


def prompt_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The prompt dataset's rows of stored samples (their own columns, without the stored rollout's)."""
    return [{k: v for k, v in r.items() if k not in ROLLOUT_COLUMNS} for r in records]


class StoredRolloutSource:
    """
    The rollout source of value pretraining from stored rollouts: update u (from 0) trains on this process's shard of
    training batch `u mod n`, so a phase of more updates than stored batches runs several epochs over them. The last
    `heldout_batches` stored batches are never trained on: [`heldout`] gives them, for the stop rule.

    Args:
        maker: The trainer's rollout maker (its critic forward, penalties and rewards are the online phase's).
        path: A local stored-rollouts folder (see [`resolve_stored_rollouts`]).
        process_index: This process (its shards are read).
        heldout_batches: Stored batches kept out of training.
        draw: This process's next prompt rows, drawn once per rollout and not used, so that the prompt stream
            advances as in an online phase and PPO afterwards draws what it would after one (`None`: no stream).
    """

    holds_rollouts_in_flight = False

    def __init__(
        self,
        maker: RolloutMaker,
        path: str,
        process_index: int,
        heldout_batches: int = 0,
        draw: Callable[[], list[dict[str, Any]]] | None = None,
    ):
        self.maker = maker
        self.draw = draw
        self.path = path
        self.process_index = process_index
        self.info = read_info(path)
        num_processes = self.info.layout["num_processes"]
        found = stored_batches(path)
        complete = []
        while found.get(len(complete)) == set(range(num_processes)):
            complete.append(len(complete))
        if heldout_batches < 0 or len(complete) <= heldout_batches:
            raise StoredRolloutsError(
                f"{path} holds {len(complete)} complete batches (every process's shard, from batch 0); "
                f"value_pretrain_heldout_batches={heldout_batches} leaves none to train on. Store more batches or hold "
                "out fewer."
            )
        cut = len(complete) - heldout_batches
        self.training_batches, self.heldout_batches = complete[:cut], complete[cut:]

    def records(self, batch: int) -> list[dict[str, Any]]:
        name = shard_name(batch, self.process_index, self.info.layout["num_processes"])
        return pyarrow.parquet.read_table(os.path.join(self.path, DATA_DIRNAME, name)).to_pylist()

    def batch_for_update(self, update: int) -> int:
        return self.training_batches[update % len(self.training_batches)]

    def next(self, train_policy: bool = False, trainer_state=None) -> tuple[Rollout, RolloutStats]:
        """The rollout of update `trainer_state.global_step`, from its stored batch."""
        if train_policy:
            raise RuntimeError("Stored rollouts are the frozen initial policy's: they train the critic only.")
        if self.draw is not None:
            self.draw()
        return self.rollout_of(self.batch_for_update(trainer_state.global_step))

    def after_policy_step(self) -> None:
        raise RuntimeError("Stored rollouts train the critic only: no policy step follows one.")

    def state_dict(self) -> dict[str, Any]:
        return {}  # the batch of each update follows from the update's number

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass

    def rollout_of(self, batch: int) -> tuple[Rollout, RolloutStats]:
        records = self.records(batch)
        scored = scored_from_records(records, self.maker, self.maker.accelerator.device)
        rollout, work = self.maker.complete(prompt_rows(records), scored, train_policy=False)
        generation = GenerationStats(seconds=0.0, tokens=scored.samples.num_tokens, sync_seconds=None)
        return rollout, RolloutStats(generation, work)

    def heldout(self) -> list[Rollout]:
        """The held-out batches' rollouts, with the critic as it is now."""
        return [self.rollout_of(batch)[0] for batch in self.heldout_batches]

"""Stored rollouts: a frozen policy's scored samples written once as a `datasets` dataset, to train critics from.

With the policy frozen and γ = λ = 1 (VC-PPO's value pretraining), every update's rollouts are i.i.d. samples of one
distribution and the critic's targets depend only on them, so the phase can read its rollouts instead of sampling
them. A stored set is a folder (or a Hub dataset repo) of parquet shards:

    <dir>/vcppo_rollouts.json                                   what made them ([`StoredRolloutsInfo`])
    <dir>/README.md                                             a dataset card whose YAML points `datasets` at the data
    <dir>/data/batch-<b>-process-<p>-of-<P>.parquet             one process's samples of prompt batch b

One shard per (batch, process), written to a temporary name and renamed, so an interrupted job leaves whole shards
only and a rerun writes the missing ones. A row is one sample: the columns of [`ROLLOUT_COLUMNS`] plus the prompt
dataset's own columns (`prompt` and what the reward functions read, e.g. `solution`).
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import re
from typing import Any

import pyarrow
import pyarrow.parquet
import torch
from datasets import Dataset, load_dataset

from .scoring import ScoredSamples

SCHEMA_VERSION = 1
INFO_FILENAME = "vcppo_rollouts.json"
DATA_DIRNAME = "data"
SHARD_PATTERN = re.compile(r"batch-(\d+)-process-(\d+)-of-(\d+)\.parquet$")

# The columns the sampler and the reward functions produce, beside the prompt dataset's own.
ROLLOUT_COLUMNS = {
    "batch": "index of the prompt batch (the update of an online phase that would have sampled it), from 0",
    "process": "the process that sampled it",
    "index": "position in that process's batch",
    "prompt_ids": "the prompt's token ids, chat template applied, no padding",
    "completion_ids": "the response's token ids, cut after the first stop token, no padding",
    "response_width": "the padded width of the batch's responses as the sampler returned them",
    "has_stop": "whether the response ends with a stop token (else it reached response_length)",
    "sampler_logprobs": "the sampler's log-probability of each response token (vLLM), or null (HF generate)",
    "completion": "the response as the reward functions received it",
    "rewards": "one reward per reward function, in the run's order (NaN where a function returned None)",
    "reward_failed": "whether a reward function failed on the sample",
    "score": "the weighted sum of the rewards (NaN where no function scored it)",
}


class StoredRolloutsError(ValueError):
    """Stored rollouts that cannot be written or read as asked (another run's, a mismatched run, a broken folder)."""


@dataclasses.dataclass(frozen=True)
class StoredRolloutsInfo:
    """
    What made a set of stored rollouts: enough to refuse them to a run that would have sampled something else.

    `policy`: `name_or_path`, `revision`, `weights_sha256` (of every parameter's bytes, in name order). `tokenizer`:
    `name_or_path`, `vocab_sha256`, `chat_template`, `pad_token_id`. `sampling`: `sampler`, `temperature`, `knobs`
    (top-k, top-p, min-p, repetition penalty; absent or null: none), `response_length`, `max_prompt_length`, `stop_token_ids`, `num_generations`, `seed`. `rewards`: `functions`
    (names) and `weights`. `layout`: `num_processes` and `prompts_per_process` (sequences per process per batch).
    """

    policy: dict[str, Any]
    tokenizer: dict[str, Any]
    sampling: dict[str, Any]
    rewards: dict[str, Any]
    layout: dict[str, Any]
    schema_version: int = SCHEMA_VERSION
    package_version: str = ""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> StoredRolloutsInfo:
        data = json.loads(text)
        if data.get("schema_version") != SCHEMA_VERSION:
            raise StoredRolloutsError(
                f"Stored rollouts of schema version {data.get('schema_version')}; this version of vcppo-trl reads "
                f"version {SCHEMA_VERSION}. Store them again with this version."
            )
        return cls(**data)

    def differences(self, other: StoredRolloutsInfo, fields: dict[str, tuple[str, ...]] | None = None) -> list[str]:
        """
        The fields whose values differ between two infos, each as `section.key: this value != other value`: those
        of `fields` (section → keys), or every key of every section when `None`.
        """
        sections = fields or {name: None for name in ("policy", "tokenizer", "sampling", "rewards", "layout")}
        found = []
        for section, keys in sections.items():
            mine, theirs = getattr(self, section), getattr(other, section)
            for key in keys or sorted(set(mine) | set(theirs)):
                if mine.get(key) != theirs.get(key):
                    found.append(f"{section}.{key}: {_short(mine.get(key))} != {_short(theirs.get(key))}")
        return found


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def weights_sha256(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter's name, dtype, shape and bytes, in name order (the model as given: unwrap it and
    gather sharded parameters first)."""
    digest = hashlib.sha256()
    for name, param in sorted(model.state_dict().items()):
        tensor = param.detach().to("cpu").contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def vocab_sha256(tokenizer) -> str:
    """SHA-256 of the tokenizer's vocabulary (token → id, special tokens included)."""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


def shard_name(batch: int, process: int, num_processes: int) -> str:
    return f"batch-{batch:06d}-process-{process:05d}-of-{num_processes:05d}.parquet"


def _shard_paths(path: str) -> list[str]:
    return sorted(glob.glob(os.path.join(path, DATA_DIRNAME, "*.parquet")))


def read_info(path: str) -> StoredRolloutsInfo:
    """The [`StoredRolloutsInfo`] of a stored-rollouts folder."""
    info_path = os.path.join(path, INFO_FILENAME)
    if not os.path.isfile(info_path):
        raise StoredRolloutsError(
            f"{path} holds no stored rollouts: {INFO_FILENAME} is missing (write them with "
            "`train.py --store_rollouts DIR`, or download a Hub dataset of them first)."
        )
    with open(info_path) as f:
        return StoredRolloutsInfo.from_json(f.read())


class RolloutWriter:
    """
    Writes one process's shards of a stored-rollouts folder, and knows which it has already written (a rerun of an
    interrupted job writes only the missing ones).

    Every process checks the folder's info against its own; the folder's `vcppo_rollouts.json` is written by process 0
    before any shard (the caller makes the others wait for it: [`prepare`] then a barrier).
    """

    def __init__(self, path: str, info: StoredRolloutsInfo, process_index: int):
        self.path = path
        self.info = info
        self.process_index = process_index
        self.num_processes = info.layout["num_processes"]
        self.data_dir = os.path.join(path, DATA_DIRNAME)

    def prepare(self) -> None:
        """Process 0: create the folder and its info, or check an existing folder's info against this run's."""
        info_path = os.path.join(self.path, INFO_FILENAME)
        if os.path.isfile(info_path):
            self.check_existing()
            return
        if _shard_paths(self.path):
            raise StoredRolloutsError(f"{self.path} has rollout shards but no {INFO_FILENAME}: use another folder.")
        os.makedirs(self.data_dir, exist_ok=True)
        _write_atomically(info_path, self.info.to_json())
        _write_atomically(os.path.join(self.path, "README.md"), dataset_card(self.info))

    def check_existing(self) -> None:
        """Refuse to add to a folder written by another run (naming what differs)."""
        stored = read_info(self.path)
        differences = stored.differences(self.info)
        if differences:
            raise StoredRolloutsError(
                f"{self.path} holds rollouts of another run; this one differs in " + "; ".join(differences) + ". "
                "Store these rollouts in another folder, or rerun with the stored settings to complete them."
            )

    def written(self, batch: int) -> bool:
        name = shard_name(batch, self.process_index, self.num_processes)
        return os.path.isfile(os.path.join(self.data_dir, name))

    def write(self, batch: int, rows: list[dict[str, Any]], scored: ScoredSamples) -> str:
        """Write this process's samples of prompt batch `batch` (`rows`, as the sampler and rewards saw them)."""
        records = rollout_records(rows, scored, batch=batch, process=self.process_index)
        name = shard_name(batch, self.process_index, self.num_processes)
        final = os.path.join(self.data_dir, name)
        tmp = os.path.join(self.data_dir, f".{name}.tmp")
        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(records), tmp)
        os.replace(tmp, final)
        return final


def rollout_records(
    rows: list[dict[str, Any]], scored: ScoredSamples, batch: int, process: int
) -> list[dict[str, Any]]:
    """One record per sample: the prompt row's columns and the [`ROLLOUT_COLUMNS`]."""
    samples = scored.samples
    mask = samples.response_mask.cpu()
    query_ids, query_mask = scored.query_ids.cpu(), scored.query_mask.cpu().bool()
    response_ids = samples.response_ids.cpu()
    logprobs = None if samples.logprobs is None else samples.logprobs.cpu()
    rewards = scored.rewards_per_func.cpu().tolist()
    records = []
    for i, row in enumerate(rows):
        valid = mask[i].bool()
        record = {key: value for key, value in row.items() if key not in ROLLOUT_COLUMNS}
        record.update(
            batch=batch,
            process=process,
            index=i,
            prompt_ids=query_ids[i][query_mask[i]].tolist(),
            completion_ids=response_ids[i][valid].tolist(),
            response_width=int(response_ids.shape[1]),
            has_stop=bool(samples.has_stop[i]),
            sampler_logprobs=None if logprobs is None else logprobs[i][valid].tolist(),
            completion=scored.completions[i],
            rewards=rewards[i],
            reward_failed=bool(scored.reward_failed[i]),
            score=float(scored.raw_scores[i]),
        )
        records.append(record)
    return records


def load_stored_rollouts(path: str) -> tuple[StoredRolloutsInfo, Dataset]:
    """
    A stored-rollouts folder as its info and one dataset, rows ordered by batch, then process, then position: the
    order in which the processes of the run that stored them sampled them.
    """
    info = read_info(path)
    shards = _shard_paths(path)
    if not shards:
        raise StoredRolloutsError(f"{path} holds no rollout shards under {DATA_DIRNAME}/.")
    dataset = load_dataset("parquet", data_files=shards, split="train")
    return info, dataset.sort(["batch", "process", "index"])


def stored_batches(path: str) -> dict[int, set[int]]:
    """The processes whose shard of each batch is written: `{batch: {process, ...}}`."""
    found: dict[int, set[int]] = {}
    for shard in _shard_paths(path):
        match = SHARD_PATTERN.search(shard)
        if match:
            found.setdefault(int(match.group(1)), set()).add(int(match.group(2)))
    return found


def complete_batches(path: str, num_processes: int) -> int:
    """The number of batches from 0 whose shards of every process are written (a reader stops at the first gap)."""
    found = stored_batches(path)
    count = 0
    while found.get(count) == set(range(num_processes)):
        count += 1
    return count


def dataset_card(info: StoredRolloutsInfo) -> str:
    """A README whose YAML points `datasets.load_dataset` (and the Hub's viewer) at the shards."""
    sampling = info.sampling
    lines = [
        "---",
        "configs:",
        "- config_name: default",
        "  data_files:",
        "  - split: train",
        f"    path: {DATA_DIRNAME}/*.parquet",
        "tags:",
        "- vcppo-trl",
        "- rollouts",
        "---",
        "",
        f"# Rollouts of {info.policy['name_or_path']}",
        "",
        f"Sampled by vcppo-trl {info.package_version} ({sampling['sampler']}, temperature {sampling['temperature']}, "
        f"at most {sampling['response_length']} response tokens, seed {sampling['seed']}) and scored by "
        f"{', '.join(info.rewards['functions'])}, for pretraining a critic (`value_pretrain_dataset`). "
        f"`{INFO_FILENAME}` says what made them; the policy's weights have SHA-256 `{info.policy['weights_sha256']}`.",
        "",
        "| column | meaning |",
        "|---|---|",
        *[f"| `{name}` | {meaning} |" for name, meaning in ROLLOUT_COLUMNS.items()],
        "",
    ]
    return "\n".join(lines)


def push_stored_rollouts(path: str, repo_id: str, token: str | None = None, private: bool | None = None) -> str:
    """Upload a stored-rollouts folder to a Hub dataset repo (created if needed); returns the commit's URL."""
    from huggingface_hub import HfApi

    read_info(path)  # refuse a folder that is not one
    api = HfApi(token=token)
    api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
    commit = api.upload_folder(
        repo_id=repo_id,
        repo_type="dataset",
        folder_path=path,
        allow_patterns=[INFO_FILENAME, "README.md", f"{DATA_DIRNAME}/*.parquet"],
        commit_message="Upload stored rollouts (vcppo-trl)",
    )
    return commit.commit_url


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)

"""The store-rollouts job: sample the frozen initial policy on the training prompts, score the samples with the run's
reward functions, and write them as a stored-rollouts dataset ([`~rollout.stored_format`]) to pretrain critics from.

It runs the trainer's own rollout path ([`~rollout.maker.RolloutMaker.sample_and_score`]: chat template, tokenisation,
the HF or vLLM sampler, decoding, rewards) on the prompt batches the trainer's value-pretraining phase would draw,
in the same order ([`~trainer.prompts.PromptStream`] with the run's seed), so batch b of the stored set holds the
prompts of update b of an online phase. Nothing is trained.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import time

import numpy
import torch
from transformers.utils import logging

from ..algo.logits_processing import SamplingKnobs
from ..rollout import (
    RolloutWriter,
    StoredRolloutsInfo,
    complete_batches,
    push_stored_rollouts,
    vocab_sha256,
    weights_sha256,
)
from .prompts import PromptStream

logger = logging.get_logger(__name__)


@dataclasses.dataclass(frozen=True)
class StoreReport:
    """What a store job did (this process): batches written now, batches found written, samples and seconds."""

    path: str
    batches_written: int
    batches_found: int
    samples_written: int
    seconds: float
    complete_batches: int  # batches from 0 with every process's shard, after the job
    hub_url: str | None = None


def batch_seed(seed: int, batch: int, process: int) -> int:
    """The global generator's seed for sampling one process's batch: the same whether the job ran through or was
    resumed (HF sampling draws from torch's global generator; vLLM's engine has a stream of its own, seeded once)."""
    state = numpy.random.SeedSequence([seed, batch, process, 0x5707E]).generate_state(2, dtype=numpy.uint32)
    return int(state[0]) << 32 | int(state[1])


def run_info(trainer) -> StoredRolloutsInfo:
    """The [`~rollout.stored_format.StoredRolloutsInfo`] of a trainer's run: its initial policy, tokenizer, sampling,
    rewards and process layout."""
    args = trainer.args
    tokenizer = trainer.processing_class
    maker = trainer.rollout_maker
    policy = trainer.initial_policy  # a critic job's, taken when its models were built
    if policy is None:
        policy = policy_identity(trainer.unwrapped_policy_and_critic()[0], gather=trainer.is_deepspeed_enabled)
    return StoredRolloutsInfo(
        policy=policy,
        tokenizer={
            "name_or_path": tokenizer.name_or_path,
            "vocab_sha256": vocab_sha256(tokenizer),
            "chat_template": tokenizer.chat_template,
            "pad_token_id": tokenizer.pad_token_id,
        },
        sampling={
            "sampler": None if trainer.sampler is None else trainer.sampler.name,
            "temperature": args.temperature,
            "knobs": SamplingKnobs.from_args(args).describe(),  # None: the temperature alone
            "response_length": args.response_length,
            "max_prompt_length": args.max_prompt_length,
            "stop_token_ids": list(maker.stop_token_ids),
            "num_generations": args.num_generations,
            "seed": args.seed,
        },
        rewards={"functions": list(trainer.reward_func_names), "weights": maker.scorer.reward_weights.tolist()},
        layout={
            "num_processes": trainer.accelerator.num_processes,
            "prompts_per_process": trainer.batches.local_batch_size,
        },
        package_version=importlib.metadata.version("vcppo-trl"),
    )


def policy_identity(policy: torch.nn.Module, gather: bool) -> dict:
    """The policy's name, revision and weights hash ([`~rollout.stored_format.weights_sha256`]; with `gather`, its ZeRO-3
    partitions are gathered first), as stored rollouts record it."""
    with gathered_parameters(policy, gather):
        digest = weights_sha256(policy)
    config = policy.config
    return {
        "name_or_path": getattr(config, "_name_or_path", None) or "",
        "revision": getattr(config, "_commit_hash", None),
        "weights_sha256": digest,
    }


def gathered_parameters(model: torch.nn.Module, is_deepspeed: bool):
    """Every parameter of a ZeRO-3-partitioned model gathered (a no-op otherwise), to hash its weights."""
    if not is_deepspeed:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)


def default_num_batches(trainer) -> int:
    """The value-pretraining updates the run plans (`value_pretrain_steps`): the batches an online phase samples."""
    planned = getattr(trainer, "num_value_pretrain_updates", lambda: 0)()
    if planned < 1:
        raise ValueError(
            "How many prompt batches to store? Give num_batches (--store_rollouts_batches), or set value_pretrain_steps "
            "(the store job then samples the batches the online phase would)."
        )
    return planned


def store_rollouts(trainer, path: str, num_batches: int | None = None, push_to_hub: str | None = None) -> StoreReport:
    """
    Sample, score and store `num_batches` prompt batches (default: the run's planned value-pretraining updates) of
    the trainer's frozen initial policy under `path`; with `push_to_hub`, upload the folder to that Hub dataset repo.
    Shards already in `path` (an interrupted job) are kept and their batches skipped.

    Every process samples its own prompts of each batch, as in training, and writes its own shards.
    """
    accelerator = trainer.accelerator
    args = trainer.args
    if trainer.sampler is None:
        raise ValueError(
            "This trainer is a critic job (value_pretrain_only with value_pretrain_dataset): it holds no policy to "
            "sample rollouts from. Store rollouts with a run that does not set value_pretrain_dataset."
        )
    if trainer.rollout_maker.rollout_function is not None or trainer.rollout_maker.tool_loop is not None:
        raise ValueError(
            "Storing rollouts made by a rollout_func or with tools is not supported yet: the stored format has no "
            "action mask. Value pretraining then runs online (value_pretrain_steps), on the same episodes."
        )
    num_batches = default_num_batches(trainer) if num_batches is None else num_batches
    if num_batches < 1:
        raise ValueError(f"num_batches must be >= 1, got {num_batches}.")
    info = run_info(trainer)
    rank = accelerator.process_index
    writer = RolloutWriter(path, info, rank)
    if accelerator.is_main_process:
        writer.prepare()
    accelerator.wait_for_everyone()
    writer.check_existing()
    prompts = PromptStream(
        trainer.train_dataset,
        trainer.batches,
        rank,
        seed=args.seed,
        num_generations=args.num_generations,
        shuffle=args.shuffle_dataset,
    )
    trainer.sampler.mark_stale()  # a vLLM sampler loads the policy's weights before its first generation
    start = time.time()
    written = found = samples = 0
    for batch in range(num_batches):
        rows = prompts.draw()
        if writer.written(batch):
            found += 1
            continue
        torch.manual_seed(batch_seed(args.seed, batch, rank))
        scored = trainer.rollout_maker.sample_and_score(rows, trainer_state=trainer.state)
        writer.write(batch, rows, scored)
        written += 1
        samples += len(rows)
        if accelerator.is_main_process:
            logger.warning(
                f"Stored batch {batch + 1}/{num_batches} ({len(rows)} samples per process, "
                f"{scored.samples.num_tokens} response tokens here) in {path}"
            )
    accelerator.wait_for_everyone()
    complete = complete_batches(path, accelerator.num_processes)
    url = None
    if push_to_hub is not None and accelerator.is_main_process:
        url = push_stored_rollouts(path, push_to_hub, token=args.hub_token, private=args.hub_private_repo)
        logger.warning(f"Pushed the stored rollouts to {url}")
    accelerator.wait_for_everyone()
    return StoreReport(
        path,
        batches_written=written,
        batches_found=found,
        samples_written=samples,
        seconds=time.time() - start,
        complete_batches=complete,
        hub_url=url,
    )

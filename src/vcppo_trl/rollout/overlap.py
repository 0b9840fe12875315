"""One-step-off and bounded-staleness rollouts (`max_staleness` ≥ 1): generation in a worker process runs ahead of
training, so the sampler works while the learner does.

At each update the trainer keeps `max_staleness` generations queued beyond the one it trains: it submits the next
prompts (sampled from the weights the worker has, those of the previous update), takes the samples of this update's
prompts, scores them, and makes the rollout with its current weights: values, old and reference log-probabilities are
computed when a batch is consumed (the proximal policy is the trainer's), while the sampler's own log-probabilities
are kept as the behaviour policy of the importance weight π_train / π_sampler (the `vllm_importance_sampling_*`
correction, which covers staleness too). After the policy's update the new weights are pushed to the worker. A batch
is trained at most `max_staleness` policy updates after the weights that sampled it (`sampling/staleness_max`).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
from accelerate.utils import is_peft_model
from transformers.utils import logging

from ..parallel.collectives import gathered_state_dict
from ..parallel.fsdp import unsharded_class
from ..sampling.seam import SamplerError, Samples
from ..sampling.server_worker import ServerWorker
from ..sampling.vllm_checks import named_policy_weights
from ..sampling.vllm_colocate import VLLMColocateSampler
from ..sampling.vllm_server import VLLMServerSampler
from ..sampling.worker import Generated, RolloutWorker, VLLMEngineSpec
from .maker import GenerationStats, RolloutMaker, RolloutStats
from .types import OverlapStats, Rollout, uniform_staleness

logger = logging.get_logger(__name__)


@dataclasses.dataclass
class Prefetched:
    """One submitted generation: its prompts as rows and tokens, and its request (or its samples, once received)."""

    rows: list[dict[str, Any]]
    query_ids: torch.Tensor
    query_mask: torch.Tensor
    request: int
    generated: Generated | None = None


def request_seed(seed: int, request: int, rank: int = 0) -> int:
    """The seed of generation `request` of process `rank`: a function of the run's seed, the request's number and the
    process only (never of timing)."""
    return (seed * 1_000_003 + request * 7_919 + rank * 104_729 + 1) % (2**63 - 1)


def rollout_worker(
    maker: RolloutMaker, policy: torch.nn.Module, num_threads: int, program=None
) -> tuple[RolloutWorker, Callable[..., Any]]:
    """A rollout worker process for this training process (each samples its own prompts) with the trainer's sampler's
    engine: HF `generate` on a copy of the whole policy (under ZeRO-3 the copy and every push gather the shards), a
    vLLM engine of its own beside the colocate sampler's (`use_vllm`), or the vLLM server itself (`vllm_mode="server"`:
    a thread of the main process queues its requests and pushes, [`~sampling.server_worker.ServerWorker`]). Returns it and
    its sampling settings of a training rollout, given at most how many new tokens (`max_new_tokens=None`:
    `response_length`). `program`: what runs a request of episodes in the worker (tool episodes:
    `rollout/tool_overlap.py`). Every process must call it (the gathering is a collective)."""
    accelerator, sampler, temperature = maker.accelerator, maker.sampler, maker.settings.temperature
    common = dict(
        stop_token_ids=maker.stop_token_ids, device=accelerator.device, num_threads=num_threads, program=program
    )
    if isinstance(sampler, VLLMServerSampler):
        worker = ServerWorker(sampler, sampler_weights(policy, sampler))
        configure = sampler.sampling_kwargs
    elif isinstance(sampler, VLLMColocateSampler):
        spec = VLLMEngineSpec(
            sampler.config, sampler.engine_args, seed=sampler.seed, pad_token_id=maker.tokenizer.pad_token_id
        )
        worker = RolloutWorker(spec, chunk_size=0, weights=sampler_weights(policy, sampler), **common)
        configure = sampler.sampling_kwargs
    else:
        worker = RolloutWorker(whole_policy(policy), chunk_size=sampler.chunk_size, **common)
        configure = sampler.generation_config

    def request_config(max_new_tokens: int | None = None):
        return configure(greedy=False, temperature=temperature, max_new_tokens=max_new_tokens)

    return worker, request_config


def sampler_weights(policy: torch.nn.Module, sampler):
    """The weights a worker loads: for a vLLM engine, under the policy's checkpoint names (LoRA merged, as the colocate
    sampler loads them; for the server, an iterator of copies the worker stages); for HF, the policy's full state dict
    (gathered under ZeRO-3 and FSDP2: a collective, every process calls it)."""
    if isinstance(sampler, VLLMServerSampler):
        return named_policy_weights(policy, sampler.gather, copy=True)
    if isinstance(sampler, VLLMColocateSampler):
        return dict(named_policy_weights(policy, sampler.gather, copy=sampler.copy_weights))
    full = gathered_state_dict(policy, every_rank=True)
    return policy.state_dict() if full is None else full


def whole_policy(policy: torch.nn.Module) -> torch.nn.Module:
    """The policy with all its weights: itself, or under ZeRO-3 or FSDP2 (partitioned parameters) a new model of its
    class (before sharding) and config holding the gathered weights (every process must call it: the gathering is a
    collective)."""
    full = gathered_state_dict(policy, every_rank=True)
    if full is None:
        return policy
    if is_peft_model(policy):
        raise ValueError(
            "`max_staleness` > 0 with a PEFT policy under ZeRO-3 or FSDP2 is not supported yet (the worker would need "
            "the adapter merged from gathered shards). Use DDP, drop the adapter, or set max_staleness=0."
        )
    # A plain model: not partitioned (no zero.Init around the constructor), not FSDP2's sharded class.
    copy = unsharded_class(policy)(policy.config)
    copy.load_state_dict(full)
    return copy


class AheadOfTraining:
    """
    What both overlaps share: a rollout worker that samples ahead, the pushes of the trainer's weights to it, the
    stats of one consumed generation, and the worker's counters in checkpoints.

    Args:
        maker: The trainer's rollout maker (tokenising, scoring and the no-grad forwards).
        worker: The rollout worker that samples.
        policy: Returns the trainer's policy (unwrapped), whose weights are pushed to the worker.
        request_config: The worker's sampling settings of a training rollout, given at most how many new tokens
            (`None`: `response_length`).
        seed: The run's seed (each request's seed derives from it, the request's number and the process).
        rank: This process's index.
    """

    def __init__(
        self,
        maker: RolloutMaker,
        worker: RolloutWorker,
        policy: Callable[[], torch.nn.Module],
        *,
        request_config: Callable[..., Any],
        seed: int,
        rank: int = 0,
    ):
        self.maker = maker
        self.worker = worker
        self.policy = policy
        self.request_config = request_config
        self.seed = seed
        self.rank = rank

    def submit(self, query_ids: torch.Tensor, query_mask: torch.Tensor, config) -> int:
        """Queue one generation with its request's seed; returns the request."""
        return self.worker.submit(query_ids, query_mask, config, seed=self.next_seed())

    def next_seed(self) -> int:
        """The seed of the next request submitted."""
        return request_seed(self.seed, self.worker.submitted, self.rank)

    def take(self, request: int, generated: Generated | None) -> tuple[Generated, float]:
        """A request's samples (already received, or waited for now) and the seconds the trainer waited."""
        start = time.perf_counter()
        generated = generated if generated is not None else self.worker.result(request)
        return generated, time.perf_counter() - start

    def stats(self, generated: Generated, wait: float, in_flight: int, dropped: int = 0) -> OverlapStats:
        return OverlapStats(
            staleness=self.age(generated),
            wait_seconds=wait,
            sampler_idle_seconds=generated.idle_seconds,
            push_seconds=self.worker.push_seconds,
            in_flight=in_flight,
            dropped=dropped,
        )

    def age(self, generated: Generated) -> int:
        """Policy updates between the weights that sampled a generation and the trainer's."""
        return self.worker.version - generated.version

    def push_weights(self) -> None:
        """The policy changed: generations submitted from now on sample from its new weights."""
        self.worker.push_weights(sampler_weights(self.policy(), self.maker.sampler))

    def after_policy_step(self) -> None:
        """The trainer's sampler reloads the weights before its next generation; the worker gets them now."""
        self.maker.sampler.mark_stale()
        self.push_weights()

    def restore_worker(self, state: dict[str, Any]) -> None:
        """The worker's counters as saved, and the policy's weights (the checkpoint's) under the saved version."""
        self.worker.submitted = state["submitted"]
        self.worker.version = state["version"] - 1
        self.push_weights()

    def received(self, request: int, generated: Generated | None) -> Generated | None:
        """A generation for a checkpoint, waited for (`None` when the worker failed: it is not saved, and said)."""
        if generated is not None:
            return generated
        try:
            return self.worker.result(request)
        except SamplerError:
            logger.warning("The rollout worker failed: the generations queued ahead of training are not saved.")
            return None

    @staticmethod
    def saved_generation(request: int, generated: Generated) -> dict[str, Any]:
        if generated.samples is None:  # a request of episodes: their states, as the worker's program returned them
            return {
                "request": request,
                "version": generated.version,
                "seconds": generated.seconds,
                "episodes": generated.episodes,
            }
        samples = generated.samples
        tensors = (samples.response_ids, samples.response_mask, samples.has_stop, samples.logprobs)
        return {
            "request": request,
            "samples": [t.cpu() for t in tensors],
            "version": generated.version,
            "seconds": generated.seconds,
        }

    def loaded_generation(self, saved: dict[str, Any]) -> Generated:
        if "samples" not in saved:  # a request of episodes
            return Generated(None, saved["version"], seconds=saved["seconds"], episodes=saved["episodes"])
        ids, mask, has_stop, logprobs = (t.to(self.maker.accelerator.device) for t in saved["samples"])
        samples = Samples(ids, mask, has_stop, logprobs=logprobs, seconds=saved["seconds"])
        return Generated(samples, saved["version"], seconds=saved["seconds"])

    def close(self) -> None:
        self.worker.close()


class OverlappedRollouts(AheadOfTraining):
    """
    The rollout source of whole-response generations queued ahead of training (`max_staleness` of them beyond the
    one trained), and the rollouts made from them. Args as [`AheadOfTraining`]'s, and `draw` (this process's next
    prompt rows) and `max_staleness`.
    """

    holds_rollouts_in_flight = True

    def __init__(
        self,
        maker,
        worker,
        policy,
        *,
        draw: Callable[[], list[dict[str, Any]]],
        max_staleness: int,
        request_config,
        seed: int,
        rank: int = 0,
    ):
        super().__init__(maker, worker, policy, request_config=request_config, seed=seed, rank=rank)
        self.draw = draw
        self.max_staleness = max_staleness
        self.queue: collections.deque[Prefetched] = collections.deque()
        self.dropped = 0  # samples dropped for their age, over the run (`sample/dropped_stale_total`)

    def fill(self) -> None:
        """Submit generations until this update's and `max_staleness` more are queued."""
        while len(self.queue) < self.max_staleness + 1:
            self.queue.append(self.submit_rows(self.draw()))

    def submit_rows(self, rows: list[dict[str, Any]]) -> Prefetched:
        """Queue the generation of `rows`' responses."""
        query_ids, query_mask = self.maker.tokenize_prompts(self.maker.prompt_texts(rows))
        request = self.submit(query_ids, query_mask, self.request_config())
        return Prefetched(rows, query_ids, query_mask=query_mask, request=request)

    def scored(self, batch: Prefetched, generated: Generated, trainer_state=None):
        """A received batch's samples and their scores."""
        samples = generated.samples
        which = torch.ones(len(batch.rows), dtype=torch.bool, device=samples.response_ids.device)
        scored = self.maker.scorer.score_where(
            batch.rows, batch.query_ids, batch.query_mask, samples=samples, which=which, trainer_state=trainer_state
        )
        return batch.rows, scored

    def next(self, train_policy: bool, trainer_state=None) -> tuple[Rollout, RolloutStats]:
        """This update's rollout: submit the generations ahead, take this one's samples, score them and complete the
        rollout with the trainer's current weights."""
        batch, generated, wait = self.next_generation()
        rows, scored = self.scored(batch, generated, trainer_state)
        rollout, work = self.maker.complete(rows, scored, train_policy)
        rollout.token_staleness = uniform_staleness(rollout.response_mask, self.age(generated))
        generation = GenerationStats(generated.seconds, scored.samples.num_tokens, None)
        report = self.stats(generated, wait, in_flight=len(self.queue), dropped=self.dropped)
        return rollout, RolloutStats(generation, work, reports=(report,))

    def next_generation(self) -> tuple[Prefetched, Generated, float]:
        """The oldest queued generation no older than `max_staleness` (with the next ones submitted), and the seconds
        the trainer waited. Older ones are dropped and counted (TRL AsyncGRPO's rule): the queue never holds more
        than `max_staleness` generations ahead, so only a run resumed with a lower `max_staleness` than its
        checkpoint's has any; their prompts are not drawn again."""
        waited = 0.0
        while True:
            self.fill()
            batch = self.queue.popleft()
            generated, wait = self.take(batch.request, batch.generated)
            waited += wait
            if self.age(generated) <= self.max_staleness:
                return batch, generated, waited
            self.dropped += len(batch.rows)
            logger.warning(
                f"Dropped a generation of {len(batch.rows)} samples {self.age(generated)} policy updates old "
                f"(max_staleness={self.max_staleness})."
            )

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The queued generations, waited for (their samples saved, so a resumed run trains them as this one would),
        and the worker's counters (requests submitted: the seeds go on from there; weights pushed)."""
        batches = []
        for batch in self.queue:
            batch.generated = self.received(batch.request, batch.generated)  # kept: this run trains it later
            if batch.generated is None:  # a resumed run skips the prompts of what the failed worker did not return
                break
            saved = {"request": batch.request, "version": batch.generated.version, "seconds": batch.generated.seconds}
            if batch.generated.samples is not None:
                saved = self.saved_generation(batch.request, batch.generated)
            saved.update(rows=batch.rows, query_ids=batch.query_ids.cpu(), query_mask=batch.query_mask.cpu())
            if batch.generated.episodes is not None:  # tool episodes (plain data) and their environments (pickled)
                saved["episodes"] = batch.generated.episodes
            batches.append(saved)
        return {"batches": batches, "dropped": self.dropped, **self.worker.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the queue and the worker (see [`AheadOfTraining.restore_worker`])."""
        if "batches" not in state:
            raise ValueError(
                "This checkpoint's rollouts in flight are not whole-response generations queued ahead (another "
                "generation_window or max_staleness): resume it with its own settings."
            )
        self.restore_worker(state)
        self.dropped = state.get("dropped", 0)
        device = self.maker.accelerator.device
        self.queue.clear()
        for batch in state["batches"]:
            self.queue.append(
                Prefetched(
                    batch["rows"],
                    batch["query_ids"].to(device),
                    query_mask=batch["query_mask"].to(device),
                    request=batch["request"],
                    generated=self.loaded_generation(batch),
                )
            )


class WindowAhead(AheadOfTraining):
    """
    Generation windows with one-step-off overlap (`generation_window` with `max_staleness=1`): the next window of the
    pool, sampled by the worker while this update trains. The next window's contexts are known once this window's
    finished responses left the pool and fresh prompts took their slots, before the update's step: so the worker
    samples window k+1 with the weights before update k, and it is trained one update later (a window's age is 1).
    """

    def __init__(self, maker, worker, policy, *, request_config, seed: int, rank: int = 0):
        super().__init__(maker, worker, policy, request_config=request_config, seed=seed, rank=rank)
        self.pending: tuple[int, Generated | None] | None = (
            None  # the next window's request, and its samples once saved
        )

    def submit_window(self, context_ids: torch.Tensor, context_mask: torch.Tensor, budget: int) -> None:
        """Queue the pool's next window (at most `budget` new tokens per response)."""
        self.pending = (self.submit(context_ids, context_mask, self.request_config(max_new_tokens=budget)), None)

    def submit_episodes(self, payload: dict[str, Any]) -> None:
        """Queue the pool's next window of tool episodes (the worker's episode program advances them by
        `payload["budget"]` policy tokens each)."""
        self.pending = (self.worker.submit_episodes(payload, self.request_config(), seed=self.next_seed()), None)

    def take_window(self) -> tuple[Generated, float]:
        request, generated = self.pending
        self.pending = None
        return self.take(request, generated)

    def state_dict(self) -> dict[str, Any]:
        saved = None
        if self.pending is not None:
            request, generated = self.pending
            generated = self.received(request, generated)
            self.pending = (request, generated)  # kept: this run trains it at the next update
            saved = None if generated is None else self.saved_generation(request, generated)
        return {"ahead": saved, **self.worker.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "ahead" not in state:
            raise ValueError(
                "This checkpoint's rollouts in flight are not a generation window's with overlap (another "
                "generation_window or max_staleness): resume it with its own settings."
            )
        self.restore_worker(state)
        saved = state["ahead"]
        self.pending = None if saved is None else (saved["request"], self.loaded_generation(saved))

"""The rollout worker of server mode (`vllm_mode="server"` with `max_staleness` ≥ 1): the vLLM server samples the
next batches while the trainer trains.

[`ServerWorker`] keeps [`~sampling.worker.RolloutWorker`]'s protocol (`submit`, `result`, `push_weights`, `version`,
`state`), so the overlapped rollout sources use it unchanged. A thread of the main process sends the requests, and
runs them one at a time in the order they were queued: generations and weight pushes share one FIFO queue, so a
generation samples from exactly the weights pushed before it was submitted, and the version it reports is the number
of pushes before it (as in the worker process). The trainer stages each push in its own thread (the gathers are
collectives; the weights are copied, or written to the shared folder, before the next optimizer step changes them),
and the thread sends it when the generations queued before it are done.

Every process submits and takes in step (the collectives run in the trainer's thread): `submit` gathers every
process's prompts into the main process's request, `result` hands each process its own slice. The trainer's own
sampler (evaluation) sends its requests through the same queue ([`sample_now`]), after the pushes queued before them.

What it does not do: seed the server's sampling (vLLM's completions route takes one seed per request, which would give
the repeated prompts of `num_generations` identical samples), so a resumed run trains the generations its checkpoint
saved and then samples fresh ones (docs/vllm.md).
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from typing import Any

import torch

from .seam import SamplerError, samples_from_token_lists, unpadded_prompts
from .worker import Generated

STOP = None  # the job that ends the thread


class ServerWorker:
    """
    The trainer's handle on the vLLM server as a rollout worker.

    Args:
        sampler: The trainer's [`~sampling.vllm_server.VLLMServerSampler`] (its client, its weight transfer); from
            now on its requests go through this worker's queue.
        weights: The policy's weights as they are now (checkpoint names, an iterator every process runs through):
            version 0, pushed first.
    """

    name = "vllm-server"

    def __init__(self, sampler, weights):
        self.sampler = sampler
        self.accelerator = sampler.accelerator
        self.is_main = self.accelerator.is_main_process
        self.version = 0  # weights pushed so far; a request samples from the version current when it was submitted
        self.submitted = 0
        self.push_seconds = 0.0
        self.start_seconds = 0.0
        self.jobs: queue.Queue = queue.Queue()
        self.answers: dict[int, tuple] = {}  # request → ("samples", ...) or ("error", message), set by the thread
        self.answered = threading.Condition()
        self.failure: str | None = None  # a push that failed: every later request fails with it
        self.thread = None
        if self.is_main:
            self.thread = threading.Thread(target=self._serve, name="vllm-server-worker", daemon=True)
            self.thread.start()
        sampler.queue = self
        self._queue_weights(weights)
        self.taken: set[int] = set()

    # ------------------------------------------------------------------ the trainer's side

    def submit(self, query_ids: torch.Tensor, query_mask: torch.Tensor, config: dict[str, Any], seed: int) -> int:
        """Queue one generation of every process's prompts (sampled from the weights pushed before it); returns its
        request number. `config`: the sampling keywords ([`~sampling.vllm_common.VLLMSamplerBase.sampling_kwargs`]);
        `seed`: unused (the server is not seeded per request)."""
        return self._submit(unpadded_prompts(query_ids, query_mask), config)

    def _submit(self, prompts: list[list[int]], config: dict[str, Any]) -> int:
        from accelerate.utils import gather_object

        every = gather_object([prompts]) if self.accelerator.num_processes > 1 else [prompts]
        request = self.submitted
        self.submitted += 1
        if self.is_main:
            self.jobs.put(("generate", request, every, config, time.perf_counter()))
        return request

    def result(self, request: int) -> Generated:
        """This process's samples of a submitted request (waiting for them); a failed request or push raises
        `SamplerError` on every process."""
        answer = self._answer(request)
        if answer[0] == "error":
            raise SamplerError(answer[1])
        _, completions, logprobs, version, seconds, idle = answer
        sampler = self.sampler
        samples = samples_from_token_lists(
            completions,
            logprobs,
            sampler.stop_token_ids,
            pad_token_id=sampler.tokenizer.pad_token_id,
            device=sampler.device,
        )
        samples.seconds = seconds
        return Generated(samples, version, seconds, idle_seconds=idle)

    def sample_now(self, prompts: list[list[int]], kwargs: dict[str, Any]) -> tuple[list, list]:
        """The trainer's own sampler's request, through the queue (after the generations and pushes before it)."""
        answer = self._answer(self._submit(prompts, kwargs))
        if answer[0] == "error":
            raise SamplerError(answer[1])
        return answer[1], answer[2]

    def _answer(self, request: int) -> tuple:
        """The request's answer, this process's slice: the main process waits for the thread, then hands it out."""
        from accelerate.utils import broadcast_object_list

        if request in self.taken or request >= self.submitted:  # would wait forever
            raise RuntimeError(f"Generation {request} was already taken, or never submitted.")
        self.taken.add(request)
        payload = [None]
        if self.is_main:
            with self.answered:
                while request not in self.answers:
                    self.answered.wait(timeout=1.0)
                    if not self.thread.is_alive() and request not in self.answers:
                        self.answers[request] = ("error", "The vLLM server worker thread stopped.")
                payload = [self.answers.pop(request)]
        if self.accelerator.num_processes > 1:
            broadcast_object_list(payload, from_process=0)
        answer = payload[0]
        if answer[0] == "error":
            return answer
        _, every_completions, every_logprobs, *rest = answer
        rank = self.accelerator.process_index
        return ("samples", every_completions[rank], every_logprobs[rank], *rest)

    def push_weights(self, weights) -> None:
        """The policy changed: stage its weights now (every process iterates `weights`), apply them after the
        generations queued so far; those submitted from now on sample from them."""
        start = time.perf_counter()
        self.version += 1
        self._queue_weights(weights)
        self.push_seconds = time.perf_counter() - start

    def _queue_weights(self, weights) -> None:
        staged = self.sampler.transfer.stage(weights)
        if self.is_main:
            self.jobs.put(("weights", self.version, staged))

    def state(self) -> dict[str, Any]:
        return {"submitted": self.submitted, "version": self.version}

    def close(self) -> None:
        """Stop the thread after the job it runs (a request in flight has the server's timeout)."""
        self.sampler.queue = None
        if self.thread is not None and self.thread.is_alive():
            self.jobs.put(STOP)
            self.thread.join(timeout=self.sampler.timeout + 5)

    # ------------------------------------------------------------------ the thread (main process)

    def _serve(self) -> None:
        version, idle_since = 0, time.perf_counter()
        while (job := self.jobs.get()) is not STOP:
            if job[0] == "weights":
                _, pushed, staged = job
                if self.failure is None:
                    try:
                        self.sampler.transfer.send(staged)
                        version = pushed
                    except Exception as err:
                        self.failure = (
                            f"{self.sampler.sync_description} failed ({type(err).__name__}: {err}); training stops "
                            "rather than sample from stale weights."
                        )
                continue
            _, request, every, config, _queued = job
            idle = time.perf_counter() - idle_since
            start = time.perf_counter()
            answer = ("error", self.failure) if self.failure is not None else None
            if answer is None:
                try:
                    flat = [p for prompts in every for p in prompts]
                    completions, logprobs = self.sampler.completions(flat, config)
                    bounds = [0]
                    for prompts in every:
                        bounds.append(bounds[-1] + len(prompts))
                    split = [slice(a, b) for a, b in zip(bounds, bounds[1:])]
                    seconds = time.perf_counter() - start
                    answer = (
                        "samples",
                        [completions[s] for s in split],
                        [logprobs[s] for s in split],
                        version,
                        seconds,
                        idle,
                    )
                except Exception as err:
                    answer = (
                        "error",
                        f"The vLLM server at {self.sampler.base_url} failed to generate ({type(err).__name__}: "
                        f"{err}).\n{traceback.format_exc(limit=3)}",
                    )
            idle_since = time.perf_counter()
            with self.answered:
                self.answers[request] = answer
                self.answered.notify_all()

"""A rollout worker: HF `generate` in a process of its own, beside the trainer (`max_staleness` ≥ 1).

The trainer submits a generation and goes on training while the worker samples; it takes the samples when it needs
them. Requests and weight pushes travel on one FIFO queue, so a generation always samples from the weights pushed
before it was submitted: the version it reports is exactly the number of pushes before it. Each request carries its
own seed, so what the worker samples depends only on the request, its seed and those weights, never on timing: an
overlapped run is reproducible, and a resumed one can continue it.

The worker holds a copy of the policy on the trainer's device (tested on CPU only); weights are pushed as a state
dict through shared memory (on the CPU). It runs the same sampling code as the in-process HF sampler
([`~sampling.hf.sample_with_policy`]) and returns the sampler's log-probabilities of the sampled tokens (the behaviour
policy of an importance weight). A worker that dies or fails raises [`~sampling.seam.SamplerError`] in the trainer.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import queue
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any

import torch
import torch.multiprocessing as mp
from transformers import GenerationConfig

from .hf import sample_with_policy
from .seam import SamplerError, Samples

POLL_SECONDS = 1.0  # how often a waiting trainer checks that the worker is still alive


@dataclasses.dataclass
class Generated:
    """What the worker returns for one request: the samples (on the CPU), the weights' version that sampled them, and
    the seconds the generation itself took in the worker."""

    samples: Samples
    version: int
    seconds: float
    idle_seconds: float = 0.0  # the worker idle (waiting for work) since its previous generation


def _worker_main(policy: torch.nn.Module, requests, results, num_threads: int, device: str) -> None:
    """The worker process: load pushed weights, answer generation requests in order, stop on `None`."""
    torch.set_num_threads(num_threads)
    policy.to(device)
    version, idle = 0, 0.0
    while True:
        waiting = time.perf_counter()
        message = requests.get()
        idle += time.perf_counter() - waiting
        if message is None:
            return
        kind, payload = message
        try:
            if kind == "weights":
                policy.load_state_dict(payload["state_dict"])
                version = payload["version"]
                continue
            start = time.perf_counter()
            torch.manual_seed(payload["seed"])
            samples = sample_with_policy(
                policy,
                payload["query_ids"].to(device),
                payload["query_mask"].to(device),
                config=payload["config"],
                chunk_size=payload["chunk_size"],
                stop_token_ids=payload["stop_token_ids"],
                with_logprobs=True,
            )
            seconds = time.perf_counter() - start
            results.put(
                (
                    "samples",
                    payload["request"],
                    tuple(
                        t.cpu()
                        for t in (samples.response_ids, samples.response_mask, samples.has_stop, samples.logprobs)
                    ),
                    version,
                    seconds,
                    idle,
                )
            )
            idle = 0.0
        except Exception:  # reported to the trainer, which stops with a SamplerError
            results.put(
                ("error", payload.get("request") if isinstance(payload, dict) else None, traceback.format_exc())
            )


@contextlib.contextmanager
def main_module_hidden() -> Iterator[None]:
    """Start a spawned process without running the user's script again: `spawn` re-imports `__main__` in the child
    from its file or module name, which runs a training script that has no `if __name__ == "__main__":` guard (as
    TRL's examples have none) a second time. The worker needs nothing from `__main__`."""
    main = sys.modules["__main__"]
    spec, had_file, path = getattr(main, "__spec__", None), hasattr(main, "__file__"), getattr(main, "__file__", None)
    main.__spec__ = None
    if had_file:
        del main.__file__
    try:
        yield
    finally:
        main.__spec__ = spec
        if had_file:
            main.__file__ = path


def sampling_copy(policy: torch.nn.Module) -> torch.nn.Module:
    """A copy of the policy on the CPU, in eval mode, for the worker: without the training hooks (gradient
    checkpointing's input hooks are local functions, which cannot travel to another process, and sampling needs none)."""
    policy = copy.deepcopy(policy).to("cpu").eval()
    for module in policy.modules():
        module._forward_hooks.clear()
        module._forward_pre_hooks.clear()
        module._backward_hooks.clear()
    return policy


class RolloutWorker:
    """
    The trainer's handle on the worker process.

    Args:
        policy: The policy to sample from (a PEFT model is fine); the worker gets a copy on the CPU.
        stop_token_ids: Ids that end a response.
        chunk_size: Prompts per `generate` call.
        device: The trainer's device: the worker samples there (a second CUDA context on the same GPU: never run on a
            GPU yet) and the samples go there once received (they travel on the CPU).
        num_threads: Torch threads of the worker process (on a CPU host, the cores left to it).
    """

    name = "hf-worker"

    def __init__(
        self,
        policy: torch.nn.Module,
        stop_token_ids: list[int],
        chunk_size: int,
        device: torch.device,
        num_threads: int = 1,
    ):
        self.stop_token_ids = stop_token_ids
        self.chunk_size = chunk_size
        self.device = device
        self.version = 0  # weights pushed so far; a request samples from the version current when it was submitted
        self.submitted = 0
        self.push_seconds = 0.0
        context = mp.get_context("spawn")
        self.requests, self.results = context.Queue(), context.Queue()
        worker_policy = sampling_copy(policy)
        start = time.perf_counter()
        self.process = context.Process(
            target=_worker_main,
            args=(worker_policy, self.requests, self.results, num_threads, str(device)),
            daemon=True,
        )
        with main_module_hidden():
            self.process.start()
        self.start_seconds = time.perf_counter() - start
        self.ready: dict[int, Generated] = {}  # received, not taken yet
        self.taken: set[int] = set()

    def submit(self, query_ids: torch.Tensor, query_mask: torch.Tensor, config: GenerationConfig, seed: int) -> int:
        """Queue one generation (sampled from the weights pushed before it); returns its request number."""
        request = self.submitted
        self.submitted += 1
        payload = {
            "request": request,
            "query_ids": query_ids.cpu(),
            "query_mask": query_mask.cpu(),
            "config": config,
            "chunk_size": self.chunk_size,
            "stop_token_ids": self.stop_token_ids,
            "seed": seed,
        }
        self.requests.put(("generate", payload))
        return request

    def push_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Send the policy's current weights (its full state dict); generations submitted from now on sample from
        them."""
        start = time.perf_counter()
        self.version += 1
        state = {k: v.detach().to("cpu", copy=True) for k, v in state_dict.items()}
        self.requests.put(("weights", {"state_dict": state, "version": self.version}))
        self.push_seconds = time.perf_counter() - start

    def result(self, request: int) -> Generated:
        """The samples of a submitted request (waiting for them); a dead or failing worker raises `SamplerError`."""
        if request in self.taken or request >= self.submitted:  # would wait forever
            raise RuntimeError(f"Generation {request} was already taken, or never submitted.")
        while request not in self.ready:
            try:
                message = self.results.get(timeout=POLL_SECONDS)
            except (ConnectionError, EOFError, OSError) as err:  # the worker died while handing tensors over
                raise SamplerError(
                    f"The rollout worker process died (exit code {self.process.exitcode}) while it returned "
                    f"generation {request} ({type(err).__name__})."
                ) from err
            except queue.Empty:
                if not self.process.is_alive():
                    raise SamplerError(
                        f"The rollout worker process died (exit code {self.process.exitcode}) while the trainer "
                        f"waited for generation {request}."
                    ) from None
                continue
            if message[0] == "error":
                raise SamplerError(f"The rollout worker failed on generation {message[1]}:\n{message[2]}")
            _, number, (ids, mask, has_stop, logprobs), version, seconds, idle = message
            samples = Samples(
                ids.to(self.device), mask.to(self.device), has_stop.to(self.device), logprobs=logprobs.to(self.device)
            )
            samples.seconds = seconds
            self.ready[number] = Generated(samples, version, seconds, idle_seconds=idle)
        self.taken.add(request)
        return self.ready.pop(request)

    def close(self) -> None:
        """Stop the worker process (waits a little, then terminates it)."""
        if self.process.is_alive():
            try:
                self.requests.put(None)
                self.process.join(timeout=10)
            except Exception:  # closing must not mask the error that brought us here
                pass
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)

    def state(self) -> dict[str, Any]:
        return {"submitted": self.submitted, "version": self.version}

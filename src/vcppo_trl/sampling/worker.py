"""A rollout worker: generation in a process of its own, beside the trainer (`max_staleness` ≥ 1).

The trainer submits a generation and goes on training while the worker samples; it takes the samples when it needs
them. Requests and weight pushes travel on one FIFO queue, so a generation always samples from the weights pushed
before it was submitted: the version it reports is exactly the number of pushes before it. Each request carries its
own seed, so what the worker samples depends only on the request, its seed and those weights, never on timing: an
overlapped run is reproducible, and a resumed one can continue it.

Two engines, one protocol:

- HF `generate` ([`HFEngine`]): a copy of the policy, sampled with the same code as the in-process HF sampler
  ([`~sampling.hf.sample_with_policy`]); weights are pushed as the policy's state dict.
- vLLM ([`VLLMEngine`], `use_vllm=True`): an engine of the worker's own, started like the colocate sampler's (the
  policy's config, dummy weights, then the pushed ones, under their checkpoint names); every prompt of a request gets
  its own seed derived from the request's.

Both sample on the trainer's device (tested on CPU only: on a GPU the worker is a second CUDA context, and a vLLM
worker a second engine, beside the trainer's) and return the sampler's log-probabilities of the sampled tokens (the
behaviour policy of an importance weight). Tensors travel through shared memory on the CPU. A worker that dies or fails
raises [`~sampling.seam.SamplerError`] in the trainer.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import queue
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

import torch
import torch.multiprocessing as mp

from ..models.fp32_head import KeepOutputDtype
from .hf import sample_with_policy
from .seam import SamplerError, Samples, samples_from_token_lists, unpadded_prompts

POLL_SECONDS = 1.0  # how often a waiting trainer checks that the worker is still alive


@dataclasses.dataclass
class Generated:
    """What the worker returns for one request: the samples (on the CPU), the weights' version that sampled them, and
    the seconds the generation itself took in the worker."""

    samples: Samples | None  # None for a request of episodes
    version: int
    seconds: float
    idle_seconds: float = 0.0  # the worker idle (waiting for work) since its previous generation
    episodes: Any = None  # what the worker's episode program returned (`submit_episodes`), else None


@dataclasses.dataclass(frozen=True)
class VLLMEngineSpec:
    """What a worker needs to start a vLLM engine of its own: the colocate sampler's policy config, engine settings
    and seed, and the pad id that fills the samples."""

    config: Any  # the policy's transformers config
    engine_args: dict[str, Any]
    seed: int
    pad_token_id: int


class HFEngine:
    """HF `generate` on the worker's copy of the policy."""

    def __init__(self, policy: torch.nn.Module, device: str, *, stop_token_ids: list[int], chunk_size: int):
        self.policy = policy.to(device)
        self.device = device
        self.stop_token_ids = stop_token_ids
        self.chunk_size = chunk_size

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        self.policy.load_state_dict(weights)

    @staticmethod
    def limited(config, max_new_tokens: int):
        """The generation config `config` with at most `max_new_tokens` new tokens."""
        config = copy.deepcopy(config)
        config.max_new_tokens = max_new_tokens
        return config

    def generate(self, payload: dict[str, Any]) -> Samples:
        torch.manual_seed(payload["seed"])
        return sample_with_policy(
            self.policy,
            payload["query_ids"].to(self.device),
            payload["query_mask"].to(self.device),
            config=payload["config"],
            chunk_size=self.chunk_size,
            stop_token_ids=self.stop_token_ids,
            with_logprobs=True,
        )


def prompt_seed(request_seed: int, row: int) -> int:
    """The vLLM seed of prompt `row` of a request: one seed per prompt, since one seed shared by a request would give
    the repeated prompts of `num_generations` identical samples."""
    return (request_seed + row * 1_000_033) % (2**31 - 1)


class VLLMEngine:
    """A vLLM engine in the worker process: one process of its own distributed world (a free local port), on the
    trainer's device."""

    def __init__(self, spec: VLLMEngineSpec, device: str, stop_token_ids: list[int]):
        from .vllm_colocate import start_engine

        index = torch.device(device).index
        # The trainer's launch variables describe the trainer's world, not this process's.
        os.environ.update(
            RANK="0", WORLD_SIZE="1", LOCAL_RANK=str(index or 0), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())
        )
        self.llm = start_engine(spec.config, spec.engine_args, spec.seed)
        self.stop_token_ids = stop_token_ids
        self.pad_token_id = spec.pad_token_id

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights.items())})
        self.llm.reset_prefix_cache()

    @staticmethod
    def limited(config: dict[str, Any], max_new_tokens: int) -> dict[str, Any]:
        """The `SamplingParams` keywords `config` with at most `max_new_tokens` new tokens."""
        return {**config, "max_tokens": max_new_tokens}

    def generate(self, payload: dict[str, Any]) -> Samples:
        from vllm import SamplingParams

        from .vllm_common import completions_and_logprobs

        prompts = [{"prompt_token_ids": ids} for ids in unpadded_prompts(payload["query_ids"], payload["query_mask"])]
        params = [
            SamplingParams(**payload["config"], seed=prompt_seed(payload["seed"], row), detokenize=False)
            for row in range(len(prompts))
        ]
        outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)
        completions, logprobs = completions_and_logprobs(outputs)
        return samples_from_token_lists(
            completions,
            logprobs,
            self.stop_token_ids,
            pad_token_id=self.pad_token_id,
            device=torch.device("cpu"),
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def turn_seed(request_seed: int, call: int) -> int:
    """The seed of generation call `call` of a request of episodes (each of its turns is one call)."""
    return (request_seed + call * 2_000_003) % (2**31 - 1)


def engine_turns(engine, payload: dict[str, Any]):
    """An episode program's `generate(ids, mask, max_new_tokens)` on `engine` for one request: each call's seed
    derives from the request's and the call's number, each context's turn ids and sampler log-probs as lists."""
    calls = [0]

    def generate(ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int):
        config = engine.limited(payload["config"], max_new_tokens)
        call = {"query_ids": ids, "query_mask": mask, "config": config, "seed": turn_seed(payload["seed"], calls[0])}
        calls[0] += 1
        samples = engine.generate(call)
        turns = [row[m].tolist() for row, m in zip(samples.response_ids, samples.response_mask)]
        return turns, [row[m].tolist() for row, m in zip(samples.logprobs, samples.response_mask)]

    return generate


def _answer(engine, program, *, kind: str, payload: dict[str, Any]) -> tuple[Any, str]:
    """One request's answer and its kind: samples' tensors, or what the episode program returned."""
    if kind == "episodes":
        return program(engine_turns(engine, payload), payload), "episodes"
    samples = engine.generate(payload)
    tensors = (samples.response_ids, samples.response_mask, samples.has_stop, samples.logprobs)
    return tuple(t.cpu() for t in tensors), "samples"


def _worker_main(
    source, requests, results, *, num_threads: int, device: str, stop_token_ids, chunk_size, program=None
) -> None:
    """The worker process: start the engine, load pushed weights, answer generation requests (and requests of
    episodes, run by `program`) in order, stop on `None`."""
    torch.set_num_threads(num_threads)
    try:
        if isinstance(source, VLLMEngineSpec):
            engine = VLLMEngine(source, device, stop_token_ids=stop_token_ids)
        else:
            engine = HFEngine(source, device, stop_token_ids=stop_token_ids, chunk_size=chunk_size)
    except Exception:  # the trainer stops with a SamplerError that shows why
        results.put(("error", "start", traceback.format_exc()))
        return
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
                engine.load(payload["state_dict"])
                version = payload["version"]
                continue
            start = time.perf_counter()
            answer, answered = _answer(engine, program, kind=kind, payload=payload)
            results.put((answered, payload["request"], answer, version, time.perf_counter() - start, idle))
            idle = 0.0
        except Exception:  # reported to the trainer, which stops with a SamplerError
            results.put(("error", kind if kind == "weights" else payload["request"], traceback.format_exc()))


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
    checkpointing's input hooks are local functions, which cannot travel to another process, and sampling needs none),
    but with `cast_lm_head_to_fp32`'s [`~models.fp32_head.KeepOutputDtype`] (tied embeddings: the backbone's input
    dtype)."""
    policy = copy.deepcopy(policy).to("cpu").eval()
    for module in policy.modules():
        kept = {key: hook for key, hook in module._forward_hooks.items() if isinstance(hook, KeepOutputDtype)}
        module._forward_hooks.clear()
        module._forward_hooks.update(kept)
        module._forward_pre_hooks.clear()
        module._backward_hooks.clear()
    return policy


class RolloutWorker:
    """
    The trainer's handle on the worker process.

    Args:
        source: What samples: the policy (HF `generate`; a PEFT model is fine; the worker gets a copy on the CPU), or a
            [`VLLMEngineSpec`] (a vLLM engine of the worker's own, which starts with the `weights` given).
        stop_token_ids: Ids that end a response.
        chunk_size: Prompts per `generate` call (HF).
        device: The trainer's device: the worker samples there (a second CUDA context on the same GPU: never run on a
            GPU yet) and the samples go there once received (they travel on the CPU).
        num_threads: Torch threads of the worker process (on a CPU host, the cores left to it).
        weights: The weights a vLLM engine starts from (version 0, under their checkpoint names).
        program: What runs a request of episodes in the worker ([`submit_episodes`]; pickled to it): called with the
            engine's `generate(ids, mask, max_new_tokens)` for that request and the request's payload, it returns
            plain data (e.g. `rollout/tool_overlap.py`'s `EpisodesInWorker`: tool episodes). `None`: none.
    """

    def __init__(
        self,
        source: torch.nn.Module | VLLMEngineSpec,
        stop_token_ids: list[int],
        chunk_size: int,
        device: torch.device,
        num_threads: int = 1,
        weights: dict[str, torch.Tensor] | None = None,
        program=None,
    ):
        is_vllm = isinstance(source, VLLMEngineSpec)
        if is_vllm and weights is None:
            raise ValueError("A vLLM rollout worker starts from dummy weights: give it the policy's `weights`.")
        self.name = "vllm-worker" if is_vllm else "hf-worker"
        self.stop_token_ids = stop_token_ids
        self.device = device
        self.version = 0  # weights pushed so far; a request samples from the version current when it was submitted
        self.submitted = 0
        self.push_seconds = 0.0
        context = mp.get_context("spawn")
        self.requests, self.results = context.Queue(), context.Queue()
        start = time.perf_counter()
        self.process = context.Process(
            target=_worker_main,
            args=(source if is_vllm else sampling_copy(source), self.requests, self.results),
            kwargs=dict(
                num_threads=num_threads,
                device=str(device),
                stop_token_ids=stop_token_ids,
                chunk_size=chunk_size,
                program=program,
            ),
            daemon=True,
        )
        with main_module_hidden():
            self.process.start()
        if weights is not None:
            self._send_weights(weights)
        self.start_seconds = time.perf_counter() - start
        self.ready: dict[int, Generated] = {}  # received, not taken yet
        self.taken: set[int] = set()
        self._start_reader()

    def _start_reader(self) -> None:
        """Read the worker's answers in a thread of their own: reading one blocks until it is whole, and a worker
        killed while it writes one (an answer of episodes is larger than the pipe's buffer) leaves the reader blocked
        for good, which must not be the trainer's thread (it notices the dead worker and stops)."""
        self.inbox: queue.Queue = queue.Queue()

        def read() -> None:
            while True:
                try:
                    message = self.results.get()
                except (ConnectionError, EOFError, OSError) as err:  # the worker died while handing tensors over
                    self.inbox.put(("died", err))
                    return
                self.inbox.put(message)

        threading.Thread(target=read, name=f"{self.name}-answers", daemon=True).start()

    def submit(self, query_ids: torch.Tensor, query_mask: torch.Tensor, config: Any, seed: int) -> int:
        """Queue one generation (sampled from the weights pushed before it); returns its request number. `config`:
        the HF `GenerationConfig`, or the vLLM `SamplingParams` keywords, of the generation."""
        tensors = {"query_ids": query_ids.cpu(), "query_mask": query_mask.cpu()}
        return self._queue("generate", tensors, config=config, seed=seed)

    def submit_episodes(self, payload: dict[str, Any], config: Any, seed: int) -> int:
        """Queue one request of episodes: the worker's `program` runs them with its engine (every generation call
        sampled from the weights pushed before this request: no push comes between the turns of one request);
        returns its request number. `payload`: plain data (and CPU tensors) for the program."""
        return self._queue("episodes", payload, config=config, seed=seed)

    def _queue(self, kind: str, payload: dict[str, Any], *, config: Any, seed: int) -> int:
        request = self.submitted
        self.submitted += 1
        self.requests.put((kind, {**payload, "request": request, "config": config, "seed": seed}))
        return request

    def push_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Send the policy's current weights (its full state dict); generations submitted from now on sample from
        them."""
        start = time.perf_counter()
        self.version += 1
        self._send_weights(state_dict)
        self.push_seconds = time.perf_counter() - start

    def _send_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        state = {k: v.detach().to("cpu", copy=True) for k, v in state_dict.items()}
        self.requests.put(("weights", {"state_dict": state, "version": self.version}))

    def result(self, request: int) -> Generated:
        """The samples of a submitted request (waiting for them); a dead or failing worker raises `SamplerError`."""
        if request in self.taken or request >= self.submitted:  # would wait forever
            raise RuntimeError(f"Generation {request} was already taken, or never submitted.")
        while request not in self.ready:
            try:
                message = self.inbox.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if self.process.is_alive():
                    continue
                try:  # an answer written whole before the worker died may still be on its way in
                    message = self.inbox.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    raise SamplerError(
                        f"The rollout worker process died (exit code {self.process.exitcode}) while the trainer "
                        f"waited for generation {request}."
                    ) from None
            if message[0] == "died":
                raise SamplerError(
                    f"The rollout worker process died (exit code {self.process.exitcode}) while it returned "
                    f"generation {request} ({type(message[1]).__name__})."
                ) from message[1]
            if message[0] == "error":
                what = {"start": "to start", "weights": "to load pushed weights"}.get(
                    message[1], f"on generation {message[1]}"
                )
                raise SamplerError(f"The rollout worker failed {what}:\n{message[2]}")
            answered, number, answer, version, seconds, idle = message
            if answered == "episodes":
                self.ready[number] = Generated(None, version, seconds, idle_seconds=idle, episodes=answer)
                continue
            ids, mask, has_stop, logprobs = answer
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
        # Weights queued for a worker that is gone would keep this process waiting at exit to flush them.
        self.requests.cancel_join_thread()

    def state(self) -> dict[str, Any]:
        return {"submitted": self.submitted, "version": self.version}

"""The vLLM server sampler behind the generation seam (see [`~sampling.seam`]): [`VLLMServerSampler`], a `vllm serve`
process reached through TRL's `VLLMClient`; weights are pushed through a [`~sampling.weight_transfer.WeightTransfer`]
(NCCL on GPUs, or a folder the server reloads from, on any device).

What it shares with the colocated sampler (sampling parameters, weight-sync bookkeeping, `generate`'s skeleton) is in
[`~sampling.vllm_common`]. Nothing here imports vLLM at module level: the package works without it.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from ..algo.logits_processing import NO_KNOBS, SamplingKnobs
from .seam import SamplerError
from .vllm_checks import named_policy_weights, require_vllm
from .vllm_common import VLLMSamplerBase, short_message
from .weight_transfer import NCCLTransfer, SharedFolderTransfer, WeightTransfer, choose_transfer

__all__ = ["VLLMServerSampler"]


class VLLMServerSampler(VLLMSamplerBase):
    """
    Generation on a separate `vllm serve` process through TRL's `VLLMClient` (`vllm_mode="server"`).

    The server is started by the user (see docs/vllm.md), with the same model; weights are pushed to it before the
    first generation and after every policy update, over the NCCL communicator TRL's client sets up (CUDA) or through
    a shared folder the server reloads from (`weight_transfer`, [`~sampling.weight_transfer.choose_transfer`]).
    Only the main process talks to the server; every process gets its own prompts' responses back. With a rollout
    worker running ahead (`max_staleness`, [`~sampling.server_worker.ServerWorker`]) every request goes through the
    worker's queue (`queue`), and the worker pushes the weights.

    Unlike TRL's `VLLMGeneration` in server mode, requests carry a read timeout (`vllm_server_timeout`), so a server
    that stops answering ends the run with an error naming its URL instead of hanging.
    """

    name = "vllm-server"

    def __init__(
        self,
        policy_provider: Callable[[], torch.nn.Module],
        gather: Callable,
        accelerator,
        tokenizer: PreTrainedTokenizerBase,
        stop_token_ids: list[int],
        response_length: int,
        base_url: str,
        timeout: float,
        group_port: int = 51216,
        weight_transfer: str | None = "auto",
        transfer_dir: str | None = None,
        needed_length: int | None = None,
        knobs: SamplingKnobs = NO_KNOBS,
    ):
        require_vllm()
        super().__init__(
            policy_provider,
            gather,
            accelerator,
            tokenizer,
            stop_token_ids,
            response_length=response_length,
            knobs=knobs,
        )
        self.base_url = base_url
        self.sync_description = f"Pushing the policy's weights to the vLLM server at {base_url}"
        self.timeout = timeout
        self.client = None
        self.transfer: WeightTransfer | None = None  # None: generation alone (the server's own weights)
        self.queue = None  # a rollout worker's queue every request goes through (`max_staleness` > 0), or None
        if weight_transfer is not None:
            weight_transfer = choose_transfer(weight_transfer, accelerator.device)
            self.sync_description += f" ({weight_transfer})"
        problem = [None]  # decided by the main process, raised by every process (none waits at a barrier forever)
        if accelerator.is_main_process:
            start = time.perf_counter()
            problem[0] = self._connect(group_port, needed_length)
            if problem[0] is None and weight_transfer is not None:
                try:
                    self.transfer = self._transfer(weight_transfer, transfer_dir)
                except ValueError as err:
                    problem[0] = str(err)
                except Exception as err:
                    problem[0] = (
                        f"No vLLM server weight-update group at {self.base_url} (group port {group_port}): "
                        f"{type(err).__name__}: {short_message(err)}. Start the server with TRL's settings "
                        "(docs/vllm.md)."
                    )
            self.start_seconds = time.perf_counter() - start
        elif weight_transfer is not None:  # takes part in the gathers
            self.transfer = self._transfer(weight_transfer, transfer_dir)
        if accelerator.num_processes > 1:
            from accelerate.utils import broadcast_object_list

            broadcast_object_list(problem, from_process=0)
        if problem[0] is not None:
            error = SamplerError if problem[0].startswith("No vLLM server") else ValueError
            raise error(problem[0])

    def _connect(self, group_port: int, needed_length: int | None) -> str | None:
        """Connect to the server (main process); returns what is wrong, or `None`."""
        from requests.adapters import HTTPAdapter, Retry
        from trl.generation.vllm_client import VLLMClient

        try:
            self.client = VLLMClient(base_url=self.base_url, group_port=group_port, connection_timeout=self.timeout)
        except Exception as err:
            return (
                f"No vLLM server answered at {self.base_url} within vllm_server_timeout={self.timeout:g} s "
                f"({type(err).__name__}: {short_message(err)}). Start one (see docs/vllm.md) or fix "
                "vllm_server_base_url / vllm_server_host / vllm_server_port."
            )
        # Requests fail after `timeout` seconds without an answer, and retry a dead server only briefly.
        adapter = HTTPAdapter(max_retries=Retry(total=2, connect=2, read=0, status=0, backoff_factor=0.5))
        self.client.session.mount("http://", adapter)
        self.client.session.mount("https://", adapter)
        self.client.session.post = functools.partial(self.client.session.post, timeout=self.timeout)
        server_length = self.server_max_model_length()
        if needed_length is not None and server_length is not None and needed_length > server_length:
            return (
                f"Prompt plus response need up to {needed_length} tokens but the vLLM server at {self.base_url} serves "
                f"a context of {server_length} (its --max-model-len): restart it with a longer one, or lower "
                "max_prompt_length / response_length."
            )
        return None

    def _transfer(self, kind: str, folder: str | None) -> WeightTransfer:
        """This process's weight transfer (only the main process's has the client)."""
        if kind == "nccl":
            return NCCLTransfer(self.client, self.accelerator.device)
        if folder is None:
            raise ValueError(
                "vllm_weight_transfer='shared_folder' needs a folder the server can read: set vllm_weight_transfer_dir."
            )
        return SharedFolderTransfer(self.client, folder)

    def server_max_model_length(self) -> int | None:
        """The server's context length, from its `/server_info` (dev mode); `None` when it does not say."""
        try:
            info = self.client.get_server_info()
            return int(info["model_config"]["max_model_len"])
        except Exception:
            return None

    def named_weights(self, copy: bool) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's weights under their checkpoint names (every process iterates: the ZeRO-3 gathers)."""
        return named_policy_weights(self.policy_provider(), self.gather, copy=copy)

    def _push_weights(self) -> None:
        """Push the policy's weights to the server (every process takes part in the ZeRO-3 gathers). With a rollout
        worker's queue, nothing: the worker pushes after every policy update, in order with its generations."""
        if self.queue is not None or self.transfer is None:
            return
        self.transfer.push(lambda: self.named_weights(copy=self.transfer.copies))

    def completions(self, prompts: list[list[int]], kwargs: dict[str, Any]) -> tuple[list, list]:
        """The server's completions of `prompts` (main process: one request) and their sampled log-probs; raises what
        the request raised."""
        kwargs = dict(kwargs)
        kwargs.pop("n")
        generation_kwargs = {k: kwargs.pop(k) for k in ("stop_token_ids", "ignore_eos")}
        out = self.client.generate(prompts=prompts, n=1, generation_kwargs=generation_kwargs, **kwargs)
        return out["completion_ids"], [[lp[0] for lp in row] for row in out["logprobs"]]

    def _sample(self, prompts: list[list[int]], kwargs: dict[str, Any]) -> tuple[list[list[int]], list[list[float]]]:
        """The main process sends every process's prompts in one request and hands each its own slice back."""
        from accelerate.utils import broadcast_object_list, gather_object

        if self.queue is not None:
            return self.queue.sample_now(prompts, kwargs)
        all_prompts = gather_object(prompts) if self.accelerator.num_processes > 1 else prompts
        payload = [None]
        if self.client is not None:
            try:
                payload = [self.completions(all_prompts, kwargs)]
            except Exception as err:
                payload = [f"{type(err).__name__}: {err}"]
        if self.accelerator.num_processes > 1:
            broadcast_object_list(payload, from_process=0)
        if isinstance(payload[0], str):
            raise SamplerError(f"The vLLM server at {self.base_url} failed to generate ({payload[0]}).")
        completions, logprobs = payload[0]
        first = self.accelerator.process_index * len(prompts)
        mine = slice(first, first + len(prompts))
        return completions[mine], logprobs[mine]

    def close(self) -> None:
        if self.transfer is not None:
            with contextlib.suppress(Exception):
                self.transfer.close()

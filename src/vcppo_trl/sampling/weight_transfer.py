"""How the policy's weights reach a vLLM server (`vllm_mode="server"`, option `vllm_weight_transfer`): the seam
[`WeightTransfer`] and its two transports.

- [`NCCLTransfer`] (`"nccl"`, CUDA): TRL's `VLLMClient` streams the tensors over an NCCL group the server joins.
- [`SharedFolderTransfer`] (`"shared_folder"`, any device): the weights are written as one safetensors file to a
  folder the server can read, and the server reloads them in place (vLLM's `reload_weights` with a `weights_path`,
  through its `/collective_rpc` route, which a server started with `VLLM_SERVER_DEV_MODE=1` has). It is how
  server-mode training runs on a CPU, and it works on GPUs too where trainer and server share a filesystem; it costs a
  write and a read of the whole policy per push.

A push is two steps so that a rollout worker can run ahead (`max_staleness`): [`WeightTransfer.stage`] takes the
weights in the trainer's thread (the ZeRO-3 gathers are collectives, and the training step goes on changing the
tensors), and [`WeightTransfer.send`] hands them to the server, in the trainer's thread or in the worker's.
Every process holds a transfer; only the main process's has a client and talks to the server, the others take part
in the gathers (and iterate the weights as often as the main process does, so that the collectives pair up).
"""

from __future__ import annotations

import abc
import os
import shutil
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .vllm_common import short_message

__all__ = ["NCCLTransfer", "SharedFolderTransfer", "WeightTransfer", "choose_transfer"]

WEIGHT_TRANSFERS = ("auto", "nccl", "shared_folder")


def choose_transfer(option: str, device: torch.device) -> str:
    """The transport `vllm_weight_transfer=option` means on `device`: `"auto"` is NCCL on CUDA and the shared folder
    elsewhere; NCCL off CUDA is refused with what to use instead."""
    if option == "auto":
        return "nccl" if device.type == "cuda" else "shared_folder"
    if option == "nccl" and device.type != "cuda":
        raise ValueError(
            f"vllm_weight_transfer='nccl' pushes the policy's weights to the vLLM server over NCCL, which needs CUDA "
            f"devices; this run is on {device.type}. Use vllm_weight_transfer='shared_folder' (or 'auto'), with a "
            "server started with VLLM_SERVER_DEV_MODE=1 that can read vllm_weight_transfer_dir (docs/vllm.md)."
        )
    return option


class WeightTransfer(abc.ABC):
    """One way of bringing the server to the policy's weights."""

    name: str
    copies = True  # whether `push` wants the weights cloned as they are gathered (they outlive their gather)

    def push(self, weights: Callable[[], Iterable[tuple[str, torch.Tensor]]]) -> None:
        """Bring the server to the weights `weights()` yields, now (the synchronous sampler)."""
        self.send(self.stage(weights()))

    @abc.abstractmethod
    def stage(self, named_weights: Iterable[tuple[str, torch.Tensor]]) -> Any:
        """Take the weights (checkpoint names, one tensor at a time) into what [`send`] sends; the caller may change
        the tensors afterwards."""

    @abc.abstractmethod
    def send(self, staged: Any) -> None:
        """Bring the server to the staged weights (and drop its prefix cache: cached keys and values are the old
        weights'). Touches no collective: it may run in another thread."""

    def close(self) -> None:  # noqa: B027 (most transports hold nothing)
        """Release what the transport holds."""


class NCCLTransfer(WeightTransfer):
    """TRL's NCCL weight-update group (GPU only; never run here: the package's tests run on CPU)."""

    name = "nccl"
    copies = False

    def __init__(self, client, device: torch.device):
        self.client = client  # None on the other processes
        self.metadata: list[tuple[str, str, list[int]]] | None = None  # names, dtypes, shapes: set on the first push
        if client is not None:
            client.init_communicator(device=device)

    def push(self, weights: Callable[[], Iterable[tuple[str, torch.Tensor]]]) -> None:
        """Stream the tensors as they are gathered (no copy of the policy); the first push reads the metadata in a
        pass of its own (a gathered tensor does not outlive its ZeRO-3 context)."""
        if self.metadata is None:
            self.metadata = [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in weights()]
        if self.client is None:
            for _ in weights():  # take part in the gathers
                pass
            return
        self.client.update_named_params(self.metadata, weights())
        self.client.reset_prefix_cache()

    def stage(self, named_weights: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """A copy of every tensor on its device (one policy's worth of memory while it waits to be sent)."""
        staged = [(name, tensor.detach().clone()) for name, tensor in named_weights]
        if self.metadata is None:
            self.metadata = [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in staged]
        return staged if self.client is not None else []

    def send(self, staged: list[tuple[str, torch.Tensor]]) -> None:
        if self.client is not None:
            self.client.update_named_params(self.metadata, iter(staged))
            self.client.reset_prefix_cache()

    def close(self) -> None:
        if self.client is not None and self.client.communicator is not None:
            self.client.close_communicator()


class SharedFolderTransfer(WeightTransfer):
    """
    The weights written to `folder` (one sub-folder per push, `weights-<n>/model.safetensors`) and reloaded by the
    server from there; a sub-folder is removed once the server has loaded a newer one.

    Args:
        client: TRL's `VLLMClient` (its session, with the trainer's timeout, carries the requests); None on the other
            processes, which write nothing.
        folder: A folder the server can read (created if missing; the `weights-<n>` sub-folders an earlier run left
            there are removed).
    """

    name = "shared_folder"

    def __init__(self, client, folder: str):
        self.client = client
        self.folder = os.path.abspath(folder)
        self.pushes = 0
        if client is None:
            return
        os.makedirs(self.folder, exist_ok=True)
        for name in os.listdir(self.folder):
            if name.startswith("weights-"):
                shutil.rmtree(os.path.join(self.folder, name), ignore_errors=True)
        answer = client.session.get(f"{client.base_url}/collective_rpc")
        if answer.status_code == 404:
            raise ValueError(
                f"The vLLM server at {client.base_url} has no /collective_rpc route, which "
                "vllm_weight_transfer='shared_folder' uses to make it reload the pushed weights: start it with "
                "VLLM_SERVER_DEV_MODE=1 (docs/vllm.md), or use vllm_weight_transfer='nccl' on GPUs."
            )

    def stage(self, named_weights: Iterable[tuple[str, torch.Tensor]]) -> str:
        """Write the weights (tied ones under each name: vLLM's layer-wise reload waits for every name) to a new
        sub-folder; returns it."""
        from safetensors.torch import save_file

        if self.client is None:
            for _ in named_weights:  # take part in the gathers
                pass
            return ""
        tensors, seen = {}, set()
        for name, tensor in named_weights:
            tensor = tensor.detach().to("cpu")
            if tensor.data_ptr() in seen or tensor.data_ptr() == 0:  # safetensors refuses tensors that share memory
                tensor = tensor.clone()
            seen.add(tensor.data_ptr())
            tensors[name] = tensor.contiguous()
        path = os.path.join(self.folder, f"weights-{self.pushes}")
        self.pushes += 1
        os.makedirs(path, exist_ok=True)
        partial = os.path.join(path, "model.safetensors.partial")
        save_file(tensors, partial, metadata={"format": "pt"})
        os.replace(partial, os.path.join(path, "model.safetensors"))  # the server never sees half a file
        return path

    def send(self, staged: str) -> None:
        if self.client is None:
            return
        url = f"{self.client.base_url}/collective_rpc"
        answer = self.client.session.post(url, json={"method": "reload_weights", "kwargs": {"weights_path": staged}})
        if answer.status_code != 200:
            raise RuntimeError(
                f"The vLLM server did not reload the weights in {staged} (HTTP {answer.status_code}: "
                f"{short_message(RuntimeError(answer.text))}); it must be able to read that folder."
            )
        self.client.reset_prefix_cache()
        loaded = int(os.path.basename(staged).removeprefix("weights-"))
        for name in os.listdir(self.folder):  # the older pushes: the server has the newest one
            if name.startswith("weights-") and int(name.removeprefix("weights-")) < loaded:
                shutil.rmtree(os.path.join(self.folder, name), ignore_errors=True)

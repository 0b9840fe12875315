"""Sequence parallelism (`sequence_parallel_size`): a micro-batch's sequences cut along their length across a group of
processes, with DeepSpeed's Ulysses attention (`UlyssesSPAttentionHF`, the one accelerate and TRL's SFT use).

Each process of a group runs the model on its slice of the positions; inside every attention layer Ulysses trades the
sequence split for a head split (all-to-all), so that each process attends over the whole sequence for its share of
the heads, and trades back. Everything else in a decoder (embeddings, MLPs, norms, heads) is per position.

This module holds the collectives and the attention switch; the layout of a split micro-batch is
[`~models.packing.SplitRows`], the forwards over it are in [`~models.split_forwards`], and the sharing of rows within
a group in [`~parallel.row_sharing`] (the rollout's forwards) and [`~learner.sequence_group_rows`] (the PPO epochs).

Ulysses' attention is installed in place of the models' own implementation (transformers' `ALL_ATTENTION_FUNCTIONS`)
behind a switch: it runs only inside [`ulysses_attention`] (the split forwards: the learner's and their backward, where
gradient checkpointing recomputes them, and the rollout maker's no-grad ones). Generation, reward models and any other
forward outside it use the original attention, with its mask, as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch
import torch.distributed as dist

# Attention implementations that cannot run split: eager materialises the full 4-D mask, which Ulysses drops.
UNSUPPORTED_ATTENTION = ("eager", "paged|eager")

_groups: dict[tuple[int, int], list] = {}  # (world, size) -> the process groups, built once per process
_switch = {"depth": 0}
_installed: dict[str, object] = {}  # implementation name -> its original attention function


class SequenceParallelError(ValueError):
    """A setting or a model that sequence parallelism cannot run with (the message says why and the fix)."""


@dataclasses.dataclass(frozen=True)
class SequenceGroup:
    """This process's sequence-parallel group: `size` consecutive processes, this one `rank` among them."""

    size: int
    rank: int
    first_process: int  # global index of the group's rank 0
    process_group: object = dataclasses.field(repr=False, compare=False, default=None)

    @property
    def processes(self) -> list[int]:
        return list(range(self.first_process, self.first_process + self.size))


def sequence_group(size: int) -> SequenceGroup:
    """
    The group of `size` consecutive processes this one belongs to (processes `[k·size, (k+1)·size)`), building every
    group on first use (every process must call it). Needs an initialised process group whose size `size` divides.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise SequenceParallelError(
            f"sequence_parallel_size={size} needs {size} or more processes: launch with `accelerate launch` or "
            "torchrun (e.g. --num_processes 2), or set sequence_parallel_size=1."
        )
    world, process = dist.get_world_size(), dist.get_rank()
    if world % size:
        raise SequenceParallelError(
            f"sequence_parallel_size={size} must divide the number of processes ({world}): each group of {size} "
            "processes shares its sequences. Launch a multiple of it, or change sequence_parallel_size."
        )
    key = (world, size)
    if key not in _groups:
        _groups[key] = [dist.new_group(list(range(first, first + size))) for first in range(0, world, size)]
    first = process - process % size
    return SequenceGroup(
        size=size, rank=process % size, first_process=first, process_group=_groups[key][first // size]
    )


def check_attention(model: torch.nn.Module, name: str, size: int) -> str:
    """The attention implementation `model` runs (its config's), refused when Ulysses cannot split it: eager
    attention, or a head count `size` does not divide."""
    config = model.config.get_text_config()
    implementation = getattr(config, "_attn_implementation", None) or "eager"
    if implementation in UNSUPPORTED_ATTENTION:
        raise SequenceParallelError(
            f"sequence_parallel_size={size} cannot split the {name}'s {implementation!r} attention: Ulysses drops the "
            "attention mask and eager attention needs it. Load the model with attn_implementation='sdpa' "
            "(or a flash-attention or flex_attention implementation)."
        )
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if heads % size or (kv_heads % size and size % kv_heads):
        raise SequenceParallelError(
            f"sequence_parallel_size={size} must divide the {name}'s attention heads ({heads}), and divide or be "
            f"divided by its key/value heads ({kv_heads}): Ulysses gives each process of a group a share of the "
            "heads. Choose a size that does."
        )
    return implementation


def install_ulysses_attention(implementation: str, group: SequenceGroup) -> None:
    """Put Ulysses in front of `implementation` in transformers' attention table, active only inside
    [`ulysses_attention`]. Idempotent per implementation."""
    try:
        import deepspeed
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    except ImportError as err:
        raise SequenceParallelError(
            "sequence_parallel_size > 1 runs DeepSpeed's Ulysses attention: pip install 'vcppo-trl[deepspeed]'."
        ) from err
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if not deepspeed.comm.is_initialized():  # under DDP or FSDP2: DeepSpeed's collectives over torch's process group
        deepspeed.init_distributed(dist_backend=dist.get_backend())

    if implementation in _installed:
        return
    original = ALL_ATTENTION_FUNCTIONS[implementation]
    layers: dict[tuple[int, ...], UlyssesSPAttentionHF] = {}

    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        if _switch["depth"] == 0:
            return original(module, query, key, value, attention_mask, *args, **kwargs)
        # One Ulysses layer per shape: it checks the batch size and head counts it was built for.
        shape = (query.shape[0], query.shape[1], key.shape[1], query.shape[3])
        if shape not in layers:
            layers[shape] = UlyssesSPAttentionHF(
                attn=original,
                batch_size=shape[0],
                attn_head_count=shape[1],
                attn_head_size=shape[3],
                kv_head_count=shape[2],
                num_hidden_layers=1,  # only read by its debug mode
                process_group=group.process_group,
                seq_length_is_variable=True,
            )
            layers[shape].core_attn_implementation = implementation
        # Split rows are right-padded (models.packing.SplitRows): causal attention without a mask is exact for them.
        return layers[shape](module, query, key, value, None, *args, **kwargs)

    ALL_ATTENTION_FUNCTIONS[implementation] = attention
    _installed[implementation] = original


def setup_sequence_parallel(models: dict[str, torch.nn.Module], size: int) -> SequenceGroup:
    """This process's group of `size` ([`sequence_group`]), with Ulysses installed in front of the attention of
    `models` (by role: "policy", "critic"), each checked first ([`check_attention`])."""
    group = sequence_group(size)
    for name, model in models.items():
        install_ulysses_attention(check_attention(model, name, size), group)
    return group


@contextlib.contextmanager
def ulysses_attention(active: bool = True) -> Iterator[None]:
    """Inside: the installed attention runs split (Ulysses); outside (and with `active=False`): the original."""
    if not active:
        yield
        return
    _switch["depth"] += 1
    try:
        yield
    finally:
        _switch["depth"] -= 1


class _SumOverGroup(torch.autograd.Function):
    """Forward: the sum over the group. Backward: the gradient unchanged. Every process of the group computes the
    same loss from the summed tensor, so each one's gradient is the whole; its own summand takes it at its own
    positions (zero elsewhere), and the group's gradients add up to the unsplit one."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, process_group) -> torch.Tensor:
        total = tensor.clone()
        dist.all_reduce(total, group=process_group)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def sum_over_group(tensor: torch.Tensor, group: SequenceGroup) -> torch.Tensor:
    """The sum of `tensor` over the group's processes (each holding its own positions, zero elsewhere), differentiable
    (see [`_SumOverGroup`]). Adding zeros is exact: every entry is bit for bit the one process that computed it."""
    if group.size == 1:
        return tensor
    return _SumOverGroup.apply(tensor, group.process_group)

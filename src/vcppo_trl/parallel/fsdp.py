"""FSDP2 (torch's `fully_shard`) for the policy, the critic and the reference, through accelerate's own FSDP2 code.

accelerate turns its FSDP plugin on only for accelerator devices: `accelerate launch` with an FSDP config on a CPU
gives plain `MULTI_CPU` with no plugin, and the run would be DDP without a word. Here the launch's request is read
from the environment it exports (`ACCELERATE_USE_FSDP`, `FSDP_VERSION`, `FSDP_*`) and the models are sharded with
accelerate's [`fsdp2_prepare_model`] on every device type, so the sharding code that runs on GPUs is the code the
CPU tests run (over gloo).

Each model is its own FSDP root (the joint module is not sharded itself): the sampler calls the policy alone, and a
value-only update runs the critic alone. A PEFT (LoRA) model is sharded through the transformers model inside its
wrapper, which every forward and `generate` call goes through; the reference of a LoRA policy is the same sharded
model with its adapters disabled.
"""

from __future__ import annotations

import os
import types

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType


class FSDPError(ValueError):
    """An FSDP launch this version cannot run, with what to do instead."""


def requested_fsdp_version(accelerator: Accelerator) -> int | None:
    """The FSDP version the launch asks for (1 or 2), or `None` without FSDP: accelerate's plugin where it made one,
    else the environment `accelerate launch` exports with an FSDP config (on a CPU accelerate makes none)."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if plugin is not None:
        return int(plugin.fsdp_version or 1)
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        return int(os.environ.get("FSDP_VERSION", "1"))
    return None


def fsdp2_plugin(accelerator: Accelerator):
    """accelerate's FSDP plugin of the launch: its own where it made one, else one read from the launch's `FSDP_*`
    environment with the run's mixed precision set as accelerate sets it on its own plugin (`AcceleratorState`:
    `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)` under bf16), so that a CPU launch computes in the
    precision the run asks for rather than in float32 without a word."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if plugin is not None:
        return plugin
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    if getattr(accelerator, "mixed_precision", "no") != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    return plugin


def check_fsdp_launch(accelerator: Accelerator) -> bool:
    """Whether the run shards with FSDP2; refuses FSDP1 and what FSDP2 does not support here yet, saying why."""
    version = requested_fsdp_version(accelerator)
    if version is None:
        return False
    if version != 2:
        raise FSDPError(
            f"The launch asks for FSDP version {version}: vcppo-trl supports FSDP2 (torch's fully_shard). Set "
            "`fsdp_version: 2` in the accelerate config (configs/accelerate/fsdp2.yaml), or use DeepSpeed ZeRO-3."
        )
    one_process_runs = (DistributedType.FSDP, DistributedType.MULTI_CPU)
    if accelerator.num_processes < 2 and accelerator.distributed_type not in one_process_runs:
        # One process shards as a world of one where a process group exists: accelerate's own FSDP (a GPU through
        # `accelerate launch`: its plugin, a group of 1), or MULTI_CPU (`accelerate launch --num_processes 1` with
        # `--use_cpu true`); torch's fully_shard has a world-of-one path. Without a launcher there is no group.
        raise FSDPError(
            "An FSDP2 run of one process needs a process group: start it with `accelerate launch` (on a CPU with "
            "--use_cpu true, configs/accelerate/fsdp2_cpu.yaml), or use 2 or more processes."
        )
    if accelerator.distributed_type == DistributedType.NO:
        raise FSDPError(
            f"accelerate counts {accelerator.num_processes} processes but runs them as one (DistributedType.NO): its "
            "gathers and reductions would do nothing. On a CPU pass `--use_cpu true` (PPOConfig(use_cpu=True)) so "
            "that it runs them as MULTI_CPU over gloo (configs/accelerate/fsdp2_cpu.yaml)."
        )
    return True


def accelerate_view(accelerator: Accelerator, plugin):
    """What accelerate's `fsdp2_prepare_model` reads of an accelerator: the accelerator itself where accelerate runs
    FSDP, else the same fields with the launch's plugin (a CPU launch, where accelerate set no plugin)."""
    if getattr(accelerator.state, "fsdp_plugin", None) is not None:
        return accelerator
    return types.SimpleNamespace(
        state=types.SimpleNamespace(fsdp_plugin=plugin),
        torch_device_mesh=None,
        parallelism_config=None,
        mixed_precision=accelerator.mixed_precision,
        is_main_process=accelerator.is_main_process,
        device=accelerator.device,
    )


def fsdp2_root_of(model: torch.nn.Module) -> torch.nn.Module:
    """The module to shard as `model`'s FSDP2 root: the model itself, or for a PEFT model the transformers model
    inside it (`get_base_model()`), which holds every parameter, adapters included (LoRA layers and the critic's
    trained head copy are injected into it). PEFT's `generate` calls that inner model directly, never the wrapper, so a
    root on the wrapper would miss its forward hooks (FSDP then takes the first sharded layer it meets for the root).
    Refuses a PEFT model with parameters of its own outside that model (prompt learning: prefix or prompt tuning),
    which would stay unsharded and unsynchronised."""
    from accelerate.utils import is_peft_model

    if not is_peft_model(model):
        return model
    root = model.get_base_model()
    inside = {id(p) for p in root.parameters()}
    outside = [name for name, p in model.named_parameters() if id(p) not in inside]
    if outside:
        raise FSDPError(
            f"{type(model).__name__} has parameters outside the model it wraps ({', '.join(outside[:3])}): a "
            "prompt-learning PEFT method, whose parameters FSDP2 would neither shard nor synchronise here (the model "
            "inside the wrapper is the FSDP root, since PEFT's generate calls it alone). Use an adapter injected into "
            "the model, such as LoRA, or DDP or DeepSpeed ZeRO-3."
        )
    return root


def shard_with_fsdp2(accelerator: Accelerator, models: list[torch.nn.Module]) -> None:
    """Shard each model in place, as its own FSDP2 root, with accelerate's `fsdp2_prepare_model` (its wrap policy,
    mixed precision, CPU offload and reshard settings from the launch); a PEFT model through the model inside it
    ([`fsdp2_root_of`]): frozen base weights and trainable adapters share the FSDP groups, each parameter keeping its
    own `requires_grad`. Marks them for transformers' `generate`, which then keeps the ranks in step (`synced_gpus`)
    so that one rank's early stop cannot hang the other's gathers."""
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    view = accelerate_view(accelerator, fsdp2_plugin(accelerator))
    for model in models:
        root = fsdp2_root_of(model)
        fsdp2_prepare_model(view, root)
        gather_float32_head_in_float32(root)
        for marked in {id(m): m for m in (model, root)}.values():
            marked._is_fsdp_managed_module = True  # transformers' own flag: generate(synced_gpus=True)


def gather_float32_head_in_float32(root: torch.nn.Module) -> None:
    """
    Under a mixed-precision policy that gathers parameters in bf16, have the FSDP2 unit of a head that computes in
    float32 (`cast_lm_head_to_fp32`) gather, compute and reduce in float32 instead: accelerate gives every unit the
    run's policy, so the float32 head's logits would come from bf16-rounded weights. That unit is accelerate's tail
    (the final norm and the head, with tied embeddings the input embeddings too, whose output is cast back to the
    policy's dtype for the backbone), which then runs in float32.

    Sets the unit's policy before its first forward, when FSDP2 reads it (`FSDPParamGroup.lazy_init`); there is no
    public setter, so this reads FSDP2's private state and stops, saying so, where a torch version lays it out
    otherwise.
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy

    head = root.get_output_embeddings() if hasattr(root, "get_output_embeddings") else None
    if not getattr(head, "computes_in_float32", False) or not isinstance(head, FSDPModule):
        return
    state = head._get_fsdp_state()
    group = getattr(state, "_fsdp_param_group", None)
    policy = getattr(group, "mp_policy", None)
    if policy is None or not hasattr(state, "_mp_policy"):
        raise FSDPError(
            "cast_lm_head_to_fp32 under FSDP2 sets the head unit's mixed precision through FSDP2's internal state, "
            f"which torch {torch.__version__} lays out differently. Set cast_lm_head_to_fp32=False, or use torch 2.13."
        )
    if policy.param_dtype in (None, torch.float32):
        return
    float32 = MixedPrecisionPolicy(
        param_dtype=torch.float32,
        reduce_dtype=torch.float32,
        output_dtype=policy.output_dtype,
        cast_forward_inputs=policy.cast_forward_inputs,
    )
    group.mp_policy = state._mp_policy = float32
    embeddings = root.get_input_embeddings()
    if embeddings is not None and embeddings.weight is head.weight:  # tied: the embeddings are in that unit too
        embeddings.register_forward_hook(CastOutput(policy.param_dtype))  # the backbone keeps its bf16 input


class CastOutput:
    """A forward hook that casts a module's output to `dtype` (module level, so that it pickles)."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype

    def __call__(self, module: torch.nn.Module, args, output: torch.Tensor) -> torch.Tensor:
        return output.to(self.dtype)


def is_fsdp2_sharded(model: torch.nn.Module) -> bool:
    """Whether any parameter of `model` is an FSDP2 shard (a DTensor)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def fsdp2_full_state_dict(model: torch.nn.Module, every_rank: bool = False) -> dict[str, torch.Tensor]:
    """The model's full state dict on CPU, gathered from its FSDP2 shards: on the first process only (the others get
    an empty dict), or with `every_rank` on every process (a rollout worker's copy of the policy), one tensor gathered
    at a time. A collective: every rank calls it. Tied parameters (the toy's embeddings and LM head) come back as one
    tensor under both names, so that `save_pretrained` writes it once, as it does for an unsharded model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if every_rank:
        return _full_state_dict_on_every_rank(model)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    first_name: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        first = first_name.setdefault(id(param), name)
        if first != name and first in state and name in state:
            state[name] = state[first]
    return state


def _full_state_dict_on_every_rank(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """[`fsdp2_full_state_dict`] on every process: each shard all-gathered (`full_tensor`, tied ones once) and copied
    to CPU before the next, under the names of the unsharded model (FSDP's activation checkpointing wraps layers under
    a name of its own)."""
    gathered: dict[int, torch.Tensor] = {}
    state = {}
    for name, value in model.state_dict(keep_vars=True).items():
        if id(value) not in gathered:
            full = value.full_tensor() if hasattr(value, "full_tensor") else value
            gathered[id(value)] = full.detach().to("cpu", copy=True)
        state[name.replace("._checkpoint_wrapped_module", "")] = gathered[id(value)]
    return state


def unsharded_class(module: torch.nn.Module) -> type:
    """The class of `module` before FSDP2's `fully_shard`, which swaps it for a subclass `FSDP<Name>` of `FSDPModule`
    and the original."""
    from torch.distributed.fsdp import FSDPModule

    cls = type(module)
    if issubclass(cls, FSDPModule):
        return next(base for base in cls.__bases__ if base is not FSDPModule)
    return cls


def fsdp2_roots(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The FSDP2 roots inside `model` (its sharded models), outermost first."""
    from torch.distributed.fsdp import FSDPModule

    roots = []
    for module in model.modules():
        if isinstance(module, FSDPModule) and not any(module in r.modules() for r in roots):
            roots.append(module)
    return roots


def full_tensor(value):
    """A plain tensor of a value that may be a DTensor (an FSDP2 gradient norm): its full value (a collective)."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


FSDP2_STATES_DIRNAME = "fsdp2_states"  # in a checkpoint: the model and optimizer shards, torch's `.distcp` files


def _plain_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    from accelerate.optimizer import AcceleratedOptimizer

    while isinstance(optimizer, AcceleratedOptimizer):
        optimizer = optimizer.optimizer
    return optimizer


def save_fsdp2_states(model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: str) -> None:
    """The sharded model and optimizer states in torch's distributed-checkpoint format under `directory` (one
    `.distcp` file per process and a `.metadata`): a collective, every process writes its own shards."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, _plain_optimizer(optimizer))
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=directory)


def load_fsdp2_states(model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: str) -> None:
    """Load what [`save_fsdp2_states`] wrote into the sharded model and its optimizer (a collective; the format lets
    torch reshard onto another number of processes)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    optimizer = _plain_optimizer(optimizer)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=directory)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def check_fsdp2_options(accelerator: Accelerator, *, activation_checkpointing: bool) -> None:
    """Refuse FSDP2 settings of the launch that would be ignored or doubled: CPU offload on a CPU launch (there is no
    device memory to offload from), and the FSDP config's activation checkpointing together with the trainer's own
    (the config's `activation_checkpointing`, on by default), which would checkpoint every layer twice."""
    plugin = fsdp2_plugin(accelerator)
    offload = plugin.cpu_offload
    if accelerator.device.type == "cpu" and offload is not None and type(offload).__name__ == "CPUOffloadPolicy":
        raise FSDPError(
            "fsdp_offload_params: true moves parameters from an accelerator's memory to the host's, but this launch "
            "runs on a CPU: set fsdp_offload_params: false (configs/accelerate/fsdp2_cpu.yaml)."
        )
    if plugin.activation_checkpointing and activation_checkpointing:
        raise FSDPError(
            "The FSDP config turns on activation checkpointing (fsdp_activation_checkpointing: true) and so does the "
            "trainer (activation_checkpointing, on by default): every layer would be checkpointed twice. Pass "
            "--activation_checkpointing false to keep FSDP's (accelerate wraps each decoder layer), or set "
            "fsdp_activation_checkpointing: false to keep transformers'."
        )


def apply_fsdp2_activation_checkpointing(accelerator: Accelerator, models: list[torch.nn.Module]) -> None:
    """The FSDP config's activation checkpointing (`fsdp_activation_checkpointing`) on the trained models, before
    they are sharded, with accelerate's `fsdp2_apply_ac` (each layer its wrap policy selects wrapped in a checkpoint,
    offloaded with `fsdp_activation_checkpointing_offload`): accelerate applies it in its own `prepare`, which the
    trainer does not call under FSDP2. A no-op when the setting is off."""
    from accelerate.utils.fsdp_utils import fsdp2_apply_ac

    plugin = fsdp2_plugin(accelerator)
    if not plugin.activation_checkpointing:
        return
    view = accelerate_view(accelerator, plugin)
    for model in models:
        plugin.set_auto_wrap_policy(model)
        fsdp2_apply_ac(view, model)

"""The FSDP launch checks (`parallel/fsdp.py`): what an FSDP launch asks for, read from accelerate's plugin or, on a
CPU where accelerate makes none, from the environment `accelerate launch` exports; and the refusals, each naming what
to change. The sharding itself runs in tests/integration/distributed/test_distributed.py (two CPU processes)."""

from __future__ import annotations

import inspect
import types

import pytest
from accelerate.utils import DistributedType

from vcppo_trl.parallel import FSDPError, requested_fsdp_version
from vcppo_trl.parallel.fsdp import check_fsdp_launch, fsdp2_root_of

from ..builders import tiny_policy


def launch(num_processes=2, distributed_type=DistributedType.MULTI_CPU, plugin=None):
    """What the checks read of an accelerator."""
    state = types.SimpleNamespace(fsdp_plugin=plugin)
    return types.SimpleNamespace(state=state, num_processes=num_processes, distributed_type=distributed_type)


@pytest.fixture
def fsdp_env(monkeypatch):
    def set_version(version):
        monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
        monkeypatch.setenv("FSDP_VERSION", str(version))

    return set_version


def test_no_fsdp_launch_is_no_fsdp(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    assert requested_fsdp_version(launch()) is None
    assert check_fsdp_launch(launch()) is False


def test_the_version_comes_from_accelerates_plugin_or_the_launch_environment(fsdp_env):
    fsdp_env(2)
    assert requested_fsdp_version(launch()) == 2  # a CPU launch: accelerate made no plugin
    assert requested_fsdp_version(launch(plugin=types.SimpleNamespace(fsdp_version=1))) == 1
    assert check_fsdp_launch(launch()) is True


def test_fsdp1_is_refused_with_the_fix(fsdp_env):
    fsdp_env(1)
    with pytest.raises(FSDPError, match="asks for FSDP version 1.*fsdp_version: 2"):
        check_fsdp_launch(launch())


def test_the_launch_check_reads_the_launch_alone():
    """Overlap, vLLM sampling and a LoRA critic, once refused under FSDP, run with it: the check takes no training
    setting that could refuse them."""
    assert list(inspect.signature(check_fsdp_launch).parameters) == ["accelerator"]


def test_a_peft_model_is_sharded_through_the_model_inside_it(tokenizer):
    """PEFT's `generate` calls the transformers model inside the wrapper, never the wrapper: that inner model, which
    holds every parameter (adapters included), is the FSDP2 root."""
    from peft import LoraConfig, get_peft_model

    model = tiny_policy(tokenizer, hidden_size=16)
    assert fsdp2_root_of(model) is model
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    root = fsdp2_root_of(wrapped)
    assert root is model
    assert {id(p) for p in root.parameters()} == {id(p) for p in wrapped.parameters()}
    assert any(p.requires_grad for p in root.parameters()) and not all(p.requires_grad for p in root.parameters())


def test_a_peft_model_with_parameters_outside_the_model_is_refused(tokenizer):
    from peft import PromptTuningConfig, get_peft_model

    model = tiny_policy(tokenizer, hidden_size=16)
    prompt_tuning = get_peft_model(model, PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2))
    with pytest.raises(FSDPError, match="parameters outside the model it wraps.*prompt-learning"):
        fsdp2_root_of(prompt_tuning)


def test_a_launch_accelerate_runs_as_one_process_is_refused(fsdp_env):
    fsdp_env(2)
    with pytest.raises(FSDPError, match="use_cpu true"):
        check_fsdp_launch(launch(distributed_type=DistributedType.NO))
    with pytest.raises(FSDPError, match="needs a process group"):
        check_fsdp_launch(launch(num_processes=1, distributed_type=DistributedType.NO))


def test_one_process_is_allowed_where_it_has_a_process_group(fsdp_env):
    """On a GPU, `accelerate launch --num_processes 1` with an FSDP2 config gives accelerate's plugin and
    DistributedType.FSDP over a process group of one (benchmarks/gpu_check.py's fsdp2-1proc row); on a CPU,
    `--num_processes 1` with `--use_cpu true` gives MULTI_CPU over a gloo group of one (the vLLM test's launch). One
    process without a group (DistributedType.NO) is refused (above)."""
    fsdp_env(2)
    plugin = types.SimpleNamespace(fsdp_version=2)
    one_gpu = launch(num_processes=1, distributed_type=DistributedType.FSDP, plugin=plugin)
    assert check_fsdp_launch(one_gpu) is True
    assert check_fsdp_launch(launch(num_processes=1)) is True

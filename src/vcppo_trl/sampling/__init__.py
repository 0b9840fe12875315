"""The sampling seam: one interface (`generate(...) -> Samples`) for HF `generate` and vLLM (colocate, server), and
the checks a vLLM engine needs before it starts, and the rollout workers that sample ahead of training (a process of
their own, or a vLLM server).
"""

from .hf import HFSampler, neutralised_generation_fields, sample_with_policy
from .seam import (
    Sampler,
    SamplerError,
    Samples,
    left_pad,
    pad_responses,
    right_pad,
    truncate_at_stop,
    unpadded_prompts,
)
from .server_worker import ServerWorker
from .settings import SamplerSettings
from .vllm_checks import (
    check_vllm_model,
    named_policy_weights,
    require_vllm,
    server_base_url,
    vllm_dtype,
    vllm_platform_is_cpu,
)
from .vllm_colocate import VLLMColocateSampler
from .vllm_server import VLLMServerSampler
from .worker import Generated, RolloutWorker, VLLMEngineSpec

__all__ = [
    "Generated",
    "HFSampler",
    "RolloutWorker",
    "sample_with_policy",
    "Sampler",
    "SamplerError",
    "SamplerSettings",
    "ServerWorker",
    "Samples",
    "VLLMColocateSampler",
    "VLLMEngineSpec",
    "VLLMServerSampler",
    "check_vllm_model",
    "named_policy_weights",
    "neutralised_generation_fields",
    "require_vllm",
    "server_base_url",
    "truncate_at_stop",
    "pad_responses",
    "left_pad",
    "right_pad",
    "unpadded_prompts",
    "vllm_dtype",
    "vllm_platform_is_cpu",
]

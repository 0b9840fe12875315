"""Rollout sampling speed: HF `generate` against vLLM, both through the trainer's generation seam.

    .venv-vllm/bin/python benchmarks/rollout.py            # this CPU: ~8 min, nothing else running
    .venv-vllm/bin/python benchmarks/rollout.py --smoke    # tiny sizes, the same code paths
                                                           # (tests/integration/test_vllm.py)

Both sides are `vcppo_trl.sampling` samplers, the objects `RolloutMaker.generate` calls: `HFSampler` (`model.generate`
on the joint policy-and-critic module, eval mode, blank generation defaults, then the stop-token cut) and
`VLLMColocateSampler` (an in-process engine started from the config with dummy weights, the weights loaded by a sync,
then `LLM.generate` and the same cut). Same random Llama (head size 64, vocabulary 32,000, ~46M parameters, fp32), same
32 random prompts of 32 tokens, temperature 1. Responses are forced to full length: both samplers are subclassed only to
add a minimum length equal to the maximum (HF's `min_new_tokens`, vLLM's `min_tokens`, which mask the stop token until
then), so both generate exactly `prompts x length` tokens.

Prints tokens/s per side and length, their ratio (vLLM / HF), and vLLM's engine start and first weight sync separately
(one-time costs, not in the ratio). `--json PATH` also writes the rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")

import torch  # noqa: E402

FULL = dict(
    vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=10, num_attention_heads=8
)  # head size 64
SMOKE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2)


class _Tokenizer:
    """What the samplers read from a tokenizer: pad and BOS ids."""

    pad_token_id = 0
    bos_token_id = 1


def build_policy(shape: dict, max_length: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    from vcppo_trl.models.policy_and_value import PolicyAndValueModel

    torch.manual_seed(seed)
    kwargs = {"num_key_value_heads": shape["num_attention_heads"], "tie_word_embeddings": True, **shape}
    kwargs.update(max_position_embeddings=max_length, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config = LlamaConfig(**kwargs)
    policy = LlamaForCausalLM(config).eval()
    # The critic is not used by generation; the policy stands in for it so the joint module has its usual shape.
    return PolicyAndValueModel(policy, policy)


def prompts(num: int, length: int, vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (num, length), generator=generator)
    return ids, torch.ones_like(ids)


def full_length_samplers():
    """The two samplers, each forced to generate `response_length` tokens (the stop token masked until then)."""
    from vcppo_trl.sampling.hf import HFSampler
    from vcppo_trl.sampling.vllm_colocate import VLLMColocateSampler

    class FullLengthHF(HFSampler):
        def generation_config(self, greedy, temperature, max_new_tokens=None):
            config = super().generation_config(greedy, temperature, max_new_tokens)
            config.min_new_tokens = config.max_new_tokens
            return config

    class FullLengthVLLM(VLLMColocateSampler):
        def sampling_kwargs(self, greedy, temperature, max_new_tokens=None):
            kwargs = super().sampling_kwargs(greedy, temperature, max_new_tokens)
            return {**kwargs, "min_tokens": kwargs["max_tokens"]}

    return FullLengthHF, FullLengthVLLM


def time_sampler(sampler, query_ids, query_mask, repeats: int) -> tuple[float, int]:
    """Median seconds of `repeats` generations (after one warm-up of the same size), and tokens per generation."""
    sampler.generate(query_ids, query_mask, greedy=False, temperature=1.0)  # warm-up
    seconds, tokens = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        samples = sampler.generate(query_ids, query_mask, greedy=False, temperature=1.0)
        seconds.append(time.perf_counter() - start)
        tokens = samples.num_tokens
    return statistics.median(seconds), tokens


def run(lengths: list[int], num_prompts: int, prompt_length: int, repeats: int, shape: dict) -> list[dict]:
    """One row per response length: tokens/s of both samplers on the same model and prompts (CUDA when visible)."""
    from accelerate import Accelerator

    HFSampler, VLLMColocateSampler = full_length_samplers()
    max_length = prompt_length + max(lengths)
    model = build_policy(shape, max_length)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    model.to(accelerator.device, torch.bfloat16 if accelerator.device.type == "cuda" else torch.float32)
    query_ids, query_mask = (
        t.to(accelerator.device) for t in prompts(num_prompts, prompt_length, shape["vocab_size"])
    )
    stop = [2]  # EOS, masked until the last token by the minimum length
    tokenizer = _Tokenizer()
    rows = []
    start = time.perf_counter()
    vllm = VLLMColocateSampler(
        lambda: model.policy,
        lambda params: contextlib.nullcontext(),
        accelerator,
        tokenizer,
        stop,
        max(lengths),
        dtype="float32" if accelerator.device.type == "cpu" else "bfloat16",
        max_model_length=max_length,
        gpu_memory_utilization=0.3,
    )
    engine_start = time.perf_counter() - start
    start = time.perf_counter()
    vllm.sync_weights()
    first_sync = time.perf_counter() - start
    for length in lengths:
        hf = HFSampler(lambda: model, accelerator, tokenizer, stop, length, num_prompts)
        vllm.response_length = length
        hf_seconds, hf_tokens = time_sampler(hf, query_ids, query_mask, repeats)
        vllm_seconds, vllm_tokens = time_sampler(vllm, query_ids, query_mask, repeats)
        assert hf_tokens == vllm_tokens == num_prompts * length, (hf_tokens, vllm_tokens)
        rows.append(
            {
                "response_length": length,
                "tokens": hf_tokens,
                "hf_tokens_per_s": hf_tokens / hf_seconds,
                "vllm_tokens_per_s": vllm_tokens / vllm_seconds,
                "ratio": hf_seconds / vllm_seconds,
                "hf_s": hf_seconds,
                "vllm_s": vllm_seconds,
            }
        )
    for row in rows:
        row.update(engine_start_s=engine_start, first_sync_s=first_sync)
    vllm.close()
    return rows


def describe_machine() -> dict:
    import vllm

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {
        "commit": commit,
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "vllm": vllm.__version__,
        "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, the same code paths")
    parser.add_argument("--lengths", type=int, nargs="+", default=None, help="response lengths (default 256 1024)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1, help="timed generations per side and length (median)")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    lengths = args.lengths or ([8, 16] if args.smoke else [256, 1024])
    num_prompts = 4 if args.smoke else args.prompts
    info = describe_machine()
    rows = run(lengths, num_prompts, 8 if args.smoke else 32, args.repeats, SMOKE if args.smoke else FULL)
    print(f"rollout sampling, {num_prompts} prompts, forced full-length responses, temperature 1 ({json.dumps(info)})")
    print(f"{'length':>7} {'HF tok/s':>10} {'vLLM tok/s':>11} {'vLLM / HF':>10}")
    for row in rows:
        print(
            f"{row['response_length']:>7} {row['hf_tokens_per_s']:>10.1f} {row['vllm_tokens_per_s']:>11.1f} "
            f"{row['ratio']:>9.2f}x"
        )
    print(f"vLLM engine start {rows[0]['engine_start_s']:.1f} s, first weight sync {rows[0]['first_sync_s']:.2f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

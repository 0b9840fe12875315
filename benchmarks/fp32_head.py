"""Sampler/trainer log-prob gap in bf16, with and without `cast_lm_head_to_fp32`, on the toy model (CPU).

    python benchmarks/fp32_head.py           # 5 seeds, 32 prompts x 64 tokens, 3 setups, 5 cold-start SFTs (minutes)
    python benchmarks/fp32_head.py --smoke   # 3 seeds, 4 prompts x 8 tokens, 2 SFT steps (seconds)

For each seed: the tiny toy model (`vcppo_trl.toy.build_tiny_model` at the toy run's size: hidden 96, 2 layers,
4 heads, vocabulary 101, tied embeddings, random weights from the seed), the toy task's prompts, and two samplers'
worth of work per flag value:

- **sampler**: `sample_with_policy(..., with_logprobs=True)`, the code `HFSampler` runs (`generate` on the policy, eval
  mode, temperature only), which returns the log-probability of each sampled token from the scores `generate`
  sampled from. As in the trainer, `generate` runs on the policy itself, outside the autocast that accelerate wraps
  around the joint model's forward;
- **trainer**: `policy_logprobs` (the chunked path `PolicyAndValueModel.forward` runs for the rollout's old log-probs
  and the learner's forward) on prompt + response, under `torch.autocast("cpu", dtype=torch.bfloat16)`, which is what
  accelerate's mixed-precision wrapper does under `bf16=True`.

With the flag, the model's head is cast by `vcppo_trl.models.cast_lm_head_to_fp32` (what the trainer's setup calls)
before sampling. The gap is |sampler log-prob - trainer log-prob| over the sampled tokens (the response mask), mean
and max per seed; the summary gives the mean over seeds with a 95 % t-interval. Three setups:

- `bf16-weights`: the random model cast to bf16 (`model.to(torch.bfloat16)`), as a model loaded with
  `model_init_kwargs={"dtype": "bfloat16"}`: sampler and trainer both run a bf16 backbone. Random weights give
  near-uniform next-token distributions (seed 0: logits spread ~0.2, top probability ~0.02 of 101 tokens);
- `bf16-cold-start`: the same after `--cold-start-steps` steps of the toy's cold-start SFT in fp32
  (`vcppo_trl.toy.cold_start_sft`, seeded, no target accuracy), then cast to bf16: peaked distributions (logit
  spread ~2, up to ~10 at seed 0), as in a trained LM;
- `fp32-weights`: random fp32 weights under bf16 autocast (what `bf16=True` does to a model loaded in fp32, the toy's
  default): the HF sampler then runs entirely in fp32 and only the trainer runs in bf16.

Prints the command, commit and machine first. No timing is taken.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import platform
import statistics
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

SETUPS = ("bf16-weights", "bf16-cold-start", "fp32-weights")
# Two-sided 95 % Student t quantiles by degrees of freedom (seeds - 1).
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t-interval (0 for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    t = T_975.get(len(values) - 1, 1.96)
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def left_padded_prompts(tokenizer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    tokenizer.padding_side = "left"
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    return encoded["input_ids"], encoded["attention_mask"]


def build_model(setup: str, seed: int, *, tokenizer, cold_start_steps: int, output_dir: str):
    """The toy model of a setup and seed, in float32 (the caller casts it)."""
    from vcppo_trl.toy.cold_start import cold_start_sft
    from vcppo_trl.toy.model import build_tiny_model
    from vcppo_trl.toy.task import make_splits

    model = build_tiny_model(tokenizer, seed=seed)
    if setup == "bf16-cold-start":
        data = make_splits(2000, 16, seed=seed)["train"]
        # The SFT trainer prints a summary with its run time: not a figure of this benchmark.
        with contextlib.redirect_stdout(io.StringIO()):
            model = cold_start_sft(
                model,
                tokenizer,
                data,
                output_dir=output_dir,
                max_steps=cold_start_steps,
                seed=seed,
                target_accuracy=None,
                disable_tqdm=True,
                logging_steps=10**6,
            )
    return model.eval()


def gap(
    policy,
    cast: bool,
    seed: int,
    *,
    query_ids: torch.Tensor,
    query_mask: torch.Tensor,
    stop_token_id: int,
    pad_token_id: int,
    response_length: int,
    temperature: float,
) -> tuple[float, float, int]:
    """
    `(mean, max, tokens)` of |sampler - trainer| log-prob over the sampled tokens of one seed: `policy` (on the
    prompts' device, cast by `cast_lm_head_to_fp32` first when `cast`) samples with the HF sampler's code and scores
    prompt + response with the trainer's log-prob code under bf16 autocast on that device (also the `fp32-head` row
    of benchmarks/gpu_check.py).
    """
    from transformers import GenerationConfig

    from vcppo_trl.models import cast_lm_head_to_fp32, policy_logprobs
    from vcppo_trl.sampling.hf import sample_with_policy

    if cast:
        cast_lm_head_to_fp32(policy)
    config = GenerationConfig(
        max_new_tokens=response_length,
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        eos_token_id=[stop_token_id],
        pad_token_id=pad_token_id,
    )
    torch.manual_seed(seed)
    samples = sample_with_policy(
        policy,
        query_ids,
        query_mask,
        config=config,
        chunk_size=query_ids.shape[0],
        stop_token_ids=[stop_token_id],
        with_logprobs=True,
    )
    input_ids = torch.cat([query_ids, samples.response_ids], dim=1)
    attention_mask = torch.cat([query_mask, samples.response_mask.long()], dim=1)
    with torch.no_grad(), torch.autocast(query_ids.device.type, dtype=torch.bfloat16):
        trainer, _ = policy_logprobs(
            policy, input_ids, attention_mask, context_length=query_ids.shape[1], temperature=temperature
        )
    mask = samples.response_mask.bool()
    diff = (samples.logprobs - trainer).abs()[mask]
    return diff.mean().item(), diff.max().item(), int(mask.sum())


def describe() -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
            flags = next((line for line in open("/proc/cpuinfo") if line.startswith("flags")), "")
        model = f"{names[0] if names else model}, {os.cpu_count()} cores" + (
            ", avx512_bf16" if "avx512_bf16" in flags else ""
        )
    except OSError:
        pass
    return (
        f"command: python {' '.join(sys.argv)}\n"
        f"commit: {commit}{' (with uncommitted changes)' if dirty.stdout.strip() else ''}\n"
        f"machine: {model}; torch {torch.__version__}, {torch.get_num_threads()} threads"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="3 seeds, 4 prompts x 8 tokens")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2 3 4 (smoke: 0 1 2)")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per seed (default 32; smoke 4)")
    parser.add_argument("--response-length", type=int, default=None, help="default 64 (smoke 8)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--setups", nargs="+", choices=SETUPS, default=list(SETUPS))
    parser.add_argument(
        "--cold-start-steps", type=int, default=None, help="SFT steps of bf16-cold-start (200; smoke 2)"
    )
    parser.add_argument("--output-dir", default="/tmp/fp32_head_sft", help="the SFT trainer's (logs only)")
    args = parser.parse_args(argv)
    seeds = args.seeds or ([0, 1, 2] if args.smoke else [0, 1, 2, 3, 4])
    num_prompts = args.prompts or (4 if args.smoke else 32)
    response_length = args.response_length or (8 if args.smoke else 64)
    cold_start_steps = args.cold_start_steps or (2 if args.smoke else 200)

    from vcppo_trl.toy.model import build_tiny_model
    from vcppo_trl.toy.task import make_splits
    from vcppo_trl.toy.tokenizer import build_tokenizer

    print(describe())
    print(
        f"toy model (hidden 96, 2 layers, vocabulary 101, tied, random weights per seed); {num_prompts} toy prompts x "
        f"{response_length} tokens, temperature {args.temperature}; seeds {seeds}; bf16-cold-start: {cold_start_steps} "
        "SFT steps"
    )
    tokenizer = build_tokenizer()
    print("\nper seed: |sampler log-prob - trainer log-prob| over sampled tokens (mean / max, tokens)")
    print(f"{'setup':<16} {'seed':>4}  {'without flag':>26}  {'cast_lm_head_to_fp32':>26}")
    results: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    for setup in args.setups:
        for seed in seeds:
            prompts = list(make_splits(num_prompts, 1, seed=seed)["train"]["prompt"])
            query_ids, query_mask = left_padded_prompts(tokenizer, prompts)
            trained = build_model(
                setup, seed, tokenizer=tokenizer, cold_start_steps=cold_start_steps, output_dir=args.output_dir
            )
            row = []
            for cast in (False, True):
                # A fresh model with the weights, not a deepcopy: TRL's SFTTrainer patches the trained model's
                # `forward` with a closure that a copy would share (it would call the original's head).
                model = build_tiny_model(tokenizer, seed=seed).eval()
                model.load_state_dict(trained.state_dict())
                if setup != "fp32-weights":
                    model = model.to(torch.bfloat16)
                mean, high, tokens = gap(
                    model,
                    cast,
                    seed,
                    query_ids=query_ids,
                    query_mask=query_mask,
                    stop_token_id=tokenizer.eos_token_id,
                    pad_token_id=tokenizer.pad_token_id,
                    response_length=response_length,
                    temperature=args.temperature,
                )
                results.setdefault((setup, cast), []).append((mean, high))
                row.append(f"{mean:.3e} / {high:.3e} ({tokens:>4})")
            print(f"{setup:<16} {seed:>4}  {row[0]:>26}  {row[1]:>26}")
    print(f"\nover {len(seeds)} seeds: mean ± 95 % t-interval of the per-seed figures")
    print(f"{'setup':<16} {'figure':<8} {'without flag':>24} {'cast_lm_head_to_fp32':>24} {'ratio':>7}")
    for setup in args.setups:
        for index, figure in enumerate(("mean|Δ|", "max|Δ|")):
            off = interval([r[index] for r in results[(setup, False)]])
            on = interval([r[index] for r in results[(setup, True)]])
            ratio = on[0] / off[0] if off[0] else float("nan")
            print(f"{setup:<16} {figure:<8} {off[0]:>11.3e} ± {off[1]:.2e} {on[0]:>11.3e} ± {on[1]:.2e} {ratio:>7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

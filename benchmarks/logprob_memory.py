"""Peak memory of the policy log-prob pass: chunked (vcppo_trl) against full logits, one cell per process.

    python benchmarks/logprob_memory.py --vocab 152000 --method chunked --mode rollout

Builds a tiny Qwen2 (2 layers, hidden 16) with the given vocabulary, then computes the log-probabilities (and, in
`train` mode, the entropy and the backward pass) of `B × T` response tokens after a 16-token prompt. Prints one JSON
line with the peak RSS increase during that computation: `ru_maxrss` after it minus the RSS just before it (the model
and inputs are built, and a small warm-up call made, before the baseline is read). Run each cell in a fresh process
so that peaks do not mix.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import step_setup  # noqa: E402
import torch  # noqa: E402
from transformers import Qwen2ForCausalLM  # noqa: E402

HIDDEN_SIZE = 16


def current_rss_mib() -> float:
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def logprob_pass(model, input_ids, attention_mask, method: str, train: bool) -> None:
    from vcppo_trl.models.logprobs import full_logits_logprobs, response_logprobs
    from vcppo_trl.models.policy_and_value import position_ids_from_mask

    fn = {"chunked": response_logprobs, "full": full_logits_logprobs}[method]
    position_ids = position_ids_from_mask(attention_mask)
    with torch.set_grad_enabled(train):
        logprobs, entropy = fn(
            model, input_ids, attention_mask, position_ids, step_setup.PROMPT_LENGTH, 0.7, compute_entropy=train
        )
        if train:
            (logprobs.sum() + entropy.sum()).backward()


def run_cell(vocab: int, method: str, mode: str, batch_size: int = 2, response_length: int = 2048) -> dict:
    torch.manual_seed(0)
    config = step_setup.model_config(response_length, vocab_size=vocab, hidden_size=HIDDEN_SIZE)
    model = Qwen2ForCausalLM(config)
    model.train(mode == "train")
    length = step_setup.PROMPT_LENGTH + response_length
    input_ids = torch.randint(0, vocab, (batch_size, length), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(input_ids)
    warm = step_setup.PROMPT_LENGTH + 4
    logprob_pass(model, input_ids[:, :warm], attention_mask[:, :warm], method, mode == "train")
    model.zero_grad(set_to_none=True)
    gc.collect()
    baseline = current_rss_mib()
    start = time.perf_counter()
    logprob_pass(model, input_ids, attention_mask, method, mode == "train")
    seconds = time.perf_counter() - start
    return {
        "vocab": vocab,
        "method": method,
        "mode": mode,
        "peak_increase_mib": step_setup.peak_rss_mib() - baseline,
        "logits_mib": batch_size * response_length * vocab * 4 / 2**20,
        "seconds": seconds,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--method", choices=["chunked", "full"], required=True)
    parser.add_argument("--mode", choices=["rollout", "train"], default="rollout")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--response-length", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = run_cell(args.vocab, args.method, args.mode, args.batch_size, args.response_length)
    print("BENCH_JSON " + json.dumps(result))


if __name__ == "__main__":
    main()

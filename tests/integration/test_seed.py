"""`seed` makes runs reproducible across processes: it is applied before anything is initialised."""

import json
import os
import subprocess
import sys

from ..paths import REPO as ROOT

# Builds and trains (one update) a trainer on a saved policy (loaded by path, as users do: nothing seeds torch before
# the trainer) with a fresh critic head, a LoRA critic, and a LoRA policy; prints a digest of every model's weights.
# torch's default generator starts from a random seed in every process here, so anything drawn before
# `set_seed(args.seed)` differs between two runs of this script.
SCRIPT = r"""
import hashlib, json, sys, tempfile
import torch
from peft import LoraConfig
from vcppo_trl import VCPPOConfig, VCPPOTrainer
from vcppo_trl.toy.task import make_splits
from vcppo_trl.toy.tokenizer import build_tokenizer

def digest(model):
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode()); h.update(tensor.detach().float().numpy().tobytes())
    return h.hexdigest()[:16]

tokenizer = build_tokenizer()
data = make_splits(32, 4, seed=0, min_digits=1, max_digits=2)["train"]
lora = dict(r=4, lora_alpha=8, target_modules="all-linear")
out = {}
for variant in ("default", "lora_critic", "lora_policy"):
    torch.seed()  # a fresh, random generator state, as at the start of a process
    policy = sys.argv[1]
    args = VCPPOConfig(
        output_dir=tempfile.mkdtemp(), seed=0, per_device_train_batch_size=4, gradient_accumulation_steps=1,
        num_mini_batches=1, num_ppo_epochs=1, total_episodes=4, response_length=8, use_cpu=True, report_to="none",
        save_strategy="no", disable_tqdm=True, num_sample_generations=0, value_pretrain_steps=0,
        value_peft_config=lora if variant == "lora_critic" else None,
    )
    peft_config = LoraConfig(task_type="CAUSAL_LM", **lora) if variant == "lora_policy" else None
    trainer = VCPPOTrainer(model=policy, reward_funcs=lambda completions, **kw: [float(len(c) % 3) for c in completions],
                           args=args, train_dataset=data, processing_class=tokenizer, peft_config=peft_config)
    built = {"critic": digest(trainer.model.critic), "policy": digest(trainer.model.policy)}
    trainer.train()
    out[variant] = {"built": built, "trained": {"critic": digest(trainer.model.critic), "policy": digest(trainer.model.policy)}}
print("DIGESTS " + json.dumps(out))
"""


def run_once(model_dir):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TRL_EXPERIMENTAL_SILENCE="1")
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(model_dir)], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("DIGESTS "))
    return json.loads(line[len("DIGESTS ") :])


def test_same_seed_same_weights_across_processes(tiny_policy, tmp_path):
    tiny_policy.save_pretrained(tmp_path / "policy")
    first, second = run_once(tmp_path / "policy"), run_once(tmp_path / "policy")
    assert first == second

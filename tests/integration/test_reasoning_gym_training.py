"""A reasoning-gym task trains with its own scoring (issue 62): its prompts, its entries passed row by row to the
reward, on a byte-level model (the tiny GGUF Llama: any text tokenizes)."""

from __future__ import annotations

import json

from tests import builders
from tests.gguf_fixtures import write_tiny_llama_gguf
from vcppo_trl import VCPPOTrainer
from vcppo_trl.rewards.reasoning_gym import ENTRY_COLUMN, reasoning_gym_dataset, reasoning_gym_reward


def test_a_reasoning_gym_task_trains_with_its_own_scoring(tmp_path):
    (tmp_path / "model").mkdir()
    write_tiny_llama_gguf(str(tmp_path / "model" / "tiny.gguf"))
    train = reasoning_gym_dataset("leg_counting", size=16, seed=0)
    seen = []

    def scored(prompts, completions, reasoning_gym_entry, **kwargs):
        for prompt, entry in zip(prompts, reasoning_gym_entry):
            seen.append(prompt[-1]["content"] == json.loads(entry)["question"])  # each row's own entry
        return reasoning_gym_reward(completions, reasoning_gym_entry)

    args = builders.tiny_config(
        tmp_path / "out", model_init_kwargs={"gguf_file": "tiny.gguf"}, max_steps=1, response_length=16
    )
    trainer = VCPPOTrainer(model=str(tmp_path / "model"), reward_funcs=scored, args=args, train_dataset=train)
    trainer.train()
    assert len(seen) == 16 and all(seen)
    assert set(trainer.last_update.rollout.raw_scores.tolist()) <= {-1.0, 1.0}  # a random model: no partial credit
    assert ENTRY_COLUMN in train.column_names


def test_train_py_trains_on_a_reasoning_gym_task_by_name(tmp_path):
    """`train.py --dataset_name reasoning_gym:<task> --reward_funcs reasoning_gym` on a model folder."""
    from transformers import AutoTokenizer

    from vcppo_trl.cli import main

    folder = tmp_path / "model"
    folder.mkdir()
    write_tiny_llama_gguf(str(folder / "tiny.gguf")).save_pretrained(folder)
    AutoTokenizer.from_pretrained(folder, gguf_file="tiny.gguf").save_pretrained(folder)
    argv = [
        *("--model_name_or_path", str(folder), "--dataset_name", "reasoning_gym:basic_arithmetic"),
        *("--reward_funcs", "reasoning_gym", "--max_train_samples", "32", "--max_eval_samples", "4"),
        *("--output_dir", str(tmp_path / "run"), "--use_cpu", "true", "--report_to", "none", "--save_strategy", "no"),
        *("--max_steps", "1", "--value_pretrain_steps", "1", "--response_length", "16"),
        *("--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2", "--disable_tqdm", "true"),
        *("--num_sample_generations", "0", "--eval_strategy", "no"),
    ]
    trainer = main(argv)
    assert trainer.num_ppo_updates == 1 and len(trainer.train_dataset) == 32
    assert trainer.train_dataset[0]["prompt"][0]["role"] == "system"
    assert any("rewards/reasoning_gym_reward/mean" in e for e in trainer.state.log_history)

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

"""A GRPO user's port by hand (issue 59): five small TRL 1.16 GRPO scripts (plain, `tools=`, `environment_factory`
with `get_reward`, an `async def` reward, a `rollout_func` that generates with the trainer's model) run with only the
import changed, each beside TRL's own `GRPOTrainer` run of the same script as the control; and the first example of
docs/migrating_from_grpo.md, with a tiny model in place of Qwen's.

The only change besides the import is `value_pretrain_steps` (a short trial), passed where the script builds its
config. Each side must train `max_steps` updates and log TRL GRPO's metric keys (those TRL's run logged)."""

from __future__ import annotations

import asyncio
import pathlib
import re

import pytest
import torch
import trl
from datasets import Dataset
from transformers import Qwen2Config, Qwen2ForCausalLM

import vcppo_trl
from tests import builders
from tests.tool_fixtures import add, chat_tokenizer

MAX_STEPS = 2
SIDES = {"trl": (trl.GRPOConfig, trl.GRPOTrainer), "ours": (vcppo_trl.VCPPOConfig, vcppo_trl.VCPPOTrainer)}
# TRL GRPO's keys a dashboard reads; each side must log those TRL's run logged.
GRPO_KEYS = (
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "completions/mean_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
    "kl",
)


def tiny_qwen2_path(tokenizer, output_dir) -> str:
    """A tiny random Qwen2 for the tokenizer, saved beside `output_dir` with it, by path as scripts name models (TRL
    builds its reference model from the policy's path)."""
    path = pathlib.Path(output_dir).parent / f"tiny-qwen2-{len(tokenizer)}"
    if not path.exists():
        tiny_qwen2(tokenizer).save_pretrained(path)
        tokenizer.save_pretrained(path)
    return str(path)


def tiny_qwen2(tokenizer, seed: int = 0) -> Qwen2ForCausalLM:
    """A tiny random Qwen2 for the tokenizer (the model class the issue's scripts used)."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def script_config(GRPOConfig, output_dir, **fields):
    """What the scripts' configs share: a small CPU run, logging every step."""
    ours = GRPOConfig is vcppo_trl.VCPPOConfig
    return GRPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=fields.pop("max_completion_length", 12),
        max_steps=MAX_STEPS,
        learning_rate=1e-4,
        beta=0.04,  # a KL term, so that `kl` is logged
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        disable_tqdm=True,
        **({"value_pretrain_steps": 2} if ours else {}),  # a short trial (the only change but the import)
        **fields,
    )


# ------------------------------------------------------------------------------------------------ the five scripts


def plain_script(GRPOConfig, GRPOTrainer, output_dir):
    tokenizer = builders.tiny_tokenizer()
    dataset = builders.tiny_splits(32, 4)["train"]
    args = script_config(GRPOConfig, output_dir)
    trainer = GRPOTrainer(
        model=tiny_qwen2_path(tokenizer, output_dir),
        reward_funcs=builders.length_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.train()
    return trainer


def _chat_dataset(n: int = 16) -> Dataset:
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Add {i} and 3."}] for i in range(n)]})


def tools_script(GRPOConfig, GRPOTrainer, output_dir):
    tokenizer = chat_tokenizer()

    def answered(completions, **kwargs):
        return [1.0 if "5" in str(c) else -1.0 for c in completions]

    args = script_config(GRPOConfig, output_dir, max_completion_length=48, max_tool_calling_iterations=2)
    trainer = GRPOTrainer(
        model=tiny_qwen2_path(tokenizer, output_dir),
        reward_funcs=answered,
        args=args,
        train_dataset=_chat_dataset(),
        processing_class=tokenizer,
        tools=[add],
    )
    trainer.train()
    return trainer


class Counter:
    """An environment: its `increment` method is a tool, its count the reward."""

    def reset(self, **kwargs):
        self.count = 0

    def increment(self, step: int) -> int:
        """Add to the counter.

        Args:
            step: How much to add.
        """
        self.count += step
        return self.count

    def get_reward(self) -> float:
        return float(self.count)


def environment_script(GRPOConfig, GRPOTrainer, output_dir):
    tokenizer = chat_tokenizer()

    def short(completions, **kwargs):
        return [1.0 if len(str(c)) < 80 else -1.0 for c in completions]

    args = script_config(GRPOConfig, output_dir, max_completion_length=48)
    trainer = GRPOTrainer(
        model=tiny_qwen2_path(tokenizer, output_dir),
        reward_funcs=short,
        args=args,
        train_dataset=_chat_dataset(),
        processing_class=tokenizer,
        environment_factory=Counter,
    )
    trainer.train()
    return trainer


def async_reward_script(GRPOConfig, GRPOTrainer, output_dir):
    tokenizer = builders.tiny_tokenizer()

    async def slow_length_reward(completions, **kwargs):
        await asyncio.sleep(0)
        return builders.length_reward(completions)

    args = script_config(GRPOConfig, output_dir)
    trainer = GRPOTrainer(
        model=tiny_qwen2_path(tokenizer, output_dir),
        reward_funcs=slow_length_reward,
        args=args,
        train_dataset=builders.tiny_splits(32, 4)["train"],
        processing_class=tokenizer,
    )
    trainer.train()
    return trainer


def generate_with_the_trainers_model(prompts, trainer):
    """A `rollout_func` as TRL users write it: one completion per prompt received, sampled by the trainer's model."""
    tokenizer = trainer.processing_class
    model = trainer.accelerator.unwrap_model(trainer.model)
    batch = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    batch = batch.to(trainer.accelerator.device)
    with torch.no_grad():
        out = model.generate(
            **batch,
            max_new_tokens=trainer.args.max_completion_length,
            do_sample=True,
            temperature=1.0,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    width = batch["input_ids"].shape[1]
    prompt_ids = [ids[mask.bool()].tolist() for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]
    completion_ids = []
    for ids in out[:, width:].tolist():
        end = ids.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in ids else len(ids)
        completion_ids.append(ids[:end])
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}


def rollout_func_script(GRPOConfig, GRPOTrainer, output_dir):
    tokenizer = builders.tiny_tokenizer()
    args = script_config(GRPOConfig, output_dir)
    trainer = GRPOTrainer(
        model=tiny_qwen2_path(tokenizer, output_dir),
        reward_funcs=builders.length_reward,
        args=args,
        train_dataset=builders.tiny_splits(32, 4)["train"],
        processing_class=tokenizer,
        rollout_func=generate_with_the_trainers_model,
    )
    trainer.train()
    return trainer


SCRIPTS = {
    "plain": plain_script,
    "tools": tools_script,
    "environment_factory": environment_script,
    "async_reward": async_reward_script,
    "rollout_func": rollout_func_script,
}


def _logged_keys(trainer) -> set[str]:
    return {key for entry in trainer.state.log_history for key in entry}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_grpo_script_runs_with_only_the_import_changed(name, tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    script = SCRIPTS[name]
    theirs = script(*SIDES["trl"], tmp_path / "trl")  # the control: TRL's own trainer runs the script
    assert theirs.state.global_step == MAX_STEPS
    ours = script(*SIDES["ours"], tmp_path / "ours")
    assert ours.num_ppo_updates == MAX_STEPS  # max_steps PPO updates, after the value-pretraining ones
    assert ours.state.global_step == MAX_STEPS + ours.value_pretraining.updates_in_run()
    theirs_keys = _logged_keys(theirs) & set(GRPO_KEYS)
    assert theirs_keys, "TRL's run logged none of the keys compared"
    missing = theirs_keys - _logged_keys(ours)
    assert not missing, f"TRL GRPO logged {sorted(missing)}; the port did not"
    # The TRL names a script reads back hold the values it set.
    assert (ours.args.max_completion_length, ours.args.beta) == (theirs.args.max_completion_length, 0.04)


def test_the_migration_pages_first_example_runs_as_a_short_trial(tmp_path, monkeypatch):
    """The page's first block, run with a tiny model and the toy's prompts in place of Qwen's and the user's."""
    page = (pathlib.Path(__file__).parents[2] / "docs" / "migrating_from_grpo.md").read_text()
    block = re.search(r"```python\n(# from trl import GRPOConfig, GRPOTrainer\n.*?)```", page, re.S).group(1)
    assert 'model="Qwen/Qwen2.5-0.5B-Instruct"' in block and 'output_dir="out"' in block
    tokenizer = builders.tiny_tokenizer()
    block = block.replace('model="Qwen/Qwen2.5-0.5B-Instruct"', "model=model, processing_class=tokenizer")
    monkeypatch.chdir(tmp_path)  # output_dir="out" lands there
    namespace = {
        "model": tiny_qwen2_path(tokenizer, tmp_path / "out"),
        "tokenizer": tokenizer,
        "dataset": builders.tiny_splits(32, 4)["train"],
        "my_reward": builders.length_reward,
    }
    exec(compile(block, "migrating_from_grpo.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.num_ppo_updates == 3 and trainer.state.global_step == 3 + 5
    # The first PPO update is logged (a new phase): the critic's PPO schedule started afresh, 4 of its 12 optimizer
    # steps (3 updates x 4 epochs) taken.
    first_ppo = next(e for e in trainer.state.log_history if "value_lr" in e and "loss/policy_avg" in e)
    assert first_ppo["value_lr"] == pytest.approx(trainer.args.value_learning_rate * 8 / 12)

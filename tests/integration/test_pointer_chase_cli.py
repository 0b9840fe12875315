"""The pointer chase end to end: `train.py --toy_task pointer_chase` at a tiny budget (its cold start cached in the
output folder), its knobs refused on the other toys, and the oracle critic trained with in place of a learned one."""

import os

import pytest
import torch

from vcppo_trl.cli import build_parser, main
from vcppo_trl.toy import build_toy
from vcppo_trl.toy.pointer_chase import hop_error_rate, make_pointer_chase_splits, pointer_chase_reward
from vcppo_trl.toy.pointer_chase_credit import PointerChaseOracleForTokenClassification

from ..builders import tiny_config, tiny_policy, tiny_tokenizer
from ..paths import REPO as ROOT

RECIPE = os.path.join(ROOT, "configs", "recipes", "tiny_cpu.yaml")
# K = 2 hops with a filler dot (responses of 21 tokens), 2 cold-start steps, 1 value-pretraining and 1 PPO update.
TINY = [
    "--toy_task", "pointer_chase", "--toy_hops", "2", "--toy_filler", "1", "--toy_num_train", "32",
    "--toy_num_eval", "8", "--toy_cold_start_steps", "2", "--total_episodes", "32", "--value_pretrain_steps", "1",
    "--response_length", "32", "--num_ppo_epochs", "1", "--num_sample_generations", "0",
]  # fmt: skip


def test_train_py_runs_the_pointer_chase(tmp_path, capsys, caplog):
    out = tmp_path / "run"
    main(["--config", RECIPE, "--output_dir", str(out), *TINY])
    assert "after cold start" in capsys.readouterr().out
    assert (
        "Embedded pointer-chase run: 2 hops over 12 pairs (a fresh table per problem), 1 filler dots a hop"
        in caplog.text
    )
    assert os.path.isfile(out / "model.safetensors")
    cached = [p for p in (out / "cold_start").iterdir() if p.name.startswith("pointer_chase-")]
    assert len(cached) == 2 and all((folder / "manifest.json").is_file() for folder in cached)  # both stages


def test_the_command_line_builds_the_toy_once_and_refuses_knobs_of_other_toys(tmp_path, caplog):
    out = str(tmp_path / "run")
    args, config, _ = build_parser().parse_args_and_config(["--config", RECIPE, "--output_dir", out, *TINY])
    run = {"output_dir": config.output_dir, "seed": config.seed, "stop_token_id": config.stop_token_id}
    policy, tokenizer, train, test = build_toy(args, **run)
    assert train.column_names == test.column_names == ["prompt", "solution", "difficulty"]
    assert (len(train), len(test), set(test["difficulty"])) == (32, 8, {2})
    again, _, _, _ = build_toy(args, **run)
    assert "Cold start read from the cache" in caplog.text
    assert all(torch.equal(a, b) for a, b in zip(policy.state_dict().values(), again.state_dict().values()))
    for task, knob in (
        ("arithmetic", "--toy_hops"),
        ("tool_use", "--toy_filler"),
        ("arithmetic", "--toy_tables"),
        ("pointer_chase", "--toy_max_digits"),
    ):
        options = ["--config", RECIPE, "--output_dir", out, "--toy_task", task, knob, "3"]
        args, config, _ = build_parser().parse_args_and_config(options)
        with pytest.raises(ValueError, match=f"{knob}: not an option of --toy_task {task}"):
            build_toy(args, output_dir=config.output_dir, seed=config.seed, stop_token_id=config.stop_token_id)


def test_the_oracle_critic_trains_in_place_of_the_learned_one(tmp_path):
    """VC-PPO with the oracle as `value_model`: value pretraining and a PPO update run, the oracle's one parameter
    stays 0, and its values are those of `oracle_values` (what value pretraining fits is already exact)."""
    from vcppo_trl import VCPPOTrainer

    tokenizer = tiny_tokenizer()
    oracle = PointerChaseOracleForTokenClassification.from_tokenizer(tokenizer, num_hops=2)
    assert oracle.config.error_rate == pytest.approx(hop_error_rate(2))
    splits = make_pointer_chase_splits(32, 8, num_hops=2)
    args = tiny_config(tmp_path, value_pretrain_steps=1, response_length=24, total_episodes=16)
    trainer = VCPPOTrainer(
        model=tiny_policy(tokenizer),
        value_model=oracle,
        reward_funcs=pointer_chase_reward,
        args=args,
        train_dataset=splits["train"].select_columns(["prompt", "solution"]),
        processing_class=tokenizer,
    )
    trainer.train()
    assert not oracle.anchor.weight.any()
    history = trainer.state.log_history
    assert any("value_pretrain/loss_avg" in entry for entry in history), history
    assert any("loss/value_avg" in entry for entry in history), history

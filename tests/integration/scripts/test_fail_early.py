"""Build-time errors stop train.py before any training (cold-start SFT included), with the fix in the message."""

import os

import pytest
from datasets import Dataset

from ...builders import length_reward
from .test_train_script import run, tiny_run_command


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--reward_funcs", "math_verfy"], "Unknown reward 'math_verfy'. Did you mean 'math_verify'?"),
        (["--value_model_path", "no/such/critic"], "no such directory: {tmp}/no/such/critic"),
        # Shaped like a Hub id, but `outputs/` is a local directory: a local path, not a Hub lookup.
        (["--value_model_path", "outputs/value_pretrained"], "no such directory: {tmp}/outputs/value_pretrained"),
        (["--stop_token_id", "5000"], "`stop_token_id` 5000 is out of range: the tokenizer has a vocabulary of"),
    ],
    ids=["misspelled_reward", "missing_critic_dir", "missing_critic_dir_hub_shaped", "stop_token_id"],
)
def test_train_py_fails_before_cold_start(tmp_path, extra, message):
    (tmp_path / "outputs").mkdir()
    out = tmp_path / "run"
    # A cold start long enough that reaching it would be obvious (and slow).
    result = run(tiny_run_command(out, "--toy_cold_start_steps", "500", *extra), tmp_path)
    assert result.returncode != 0
    assert message.format(tmp=tmp_path) in result.stderr, result.stderr[-2000:]
    assert not (out / "cold_start").exists(), "the cold-start SFT ran before the error"


def test_conversational_prompts_without_chat_template_fail_at_build(make_trainer, tokenizer):
    assert tokenizer.chat_template is None
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": "1+1?"}]] * 32, "solution": ["2"] * 32})
    with pytest.raises(ValueError, match="holds chat messages .* has no chat template.*drop --conversational"):
        make_trainer(train_dataset=data)


def test_stop_token_id_out_of_range_names_the_vocabulary(make_trainer, tiny_config, tokenizer):
    with pytest.raises(ValueError, match=f"vocabulary of {len(tokenizer)} tokens \\(ids 0 to {len(tokenizer) - 1}\\)"):
        make_trainer(args=tiny_config(stop_token_id=len(tokenizer)))


def test_total_episodes_rounding_is_said(make_trainer, tiny_config, caplog):
    with caplog.at_level("WARNING"):
        trainer = make_trainer(reward_funcs=length_reward, args=tiny_config(total_episodes=20))
    assert trainer.num_ppo_updates == 2
    assert (
        "total_episodes=20 is not a multiple of the 16 prompts per update: rounded up to 2 updates = 32 episodes"
        in (caplog.text)
    )
    caplog.clear()
    with caplog.at_level("WARNING"):
        make_trainer(reward_funcs=length_reward, args=tiny_config(total_episodes=32))
    assert "rounded" not in caplog.text


def test_missing_value_model_path_in_trainer(make_trainer, tiny_config, tmp_path):
    missing = str(tmp_path / "value_pretrained")
    with pytest.raises(FileNotFoundError, match=f"no such directory: {missing}"):
        make_trainer(args=tiny_config(value_model_path=missing))
    assert not os.path.exists(missing)

"""TRL GRPO's `shuffle_dataset`, `chat_template_kwargs`, `pad_to_multiple_of` and `trust_remote_code` in training runs
(issue 47): each reaches what it acts on."""

from __future__ import annotations

import torch

from tests import builders
from tests.unit.test_grpo_fields import TEMPLATE, _custom_code_model


def _recorded(trainer, method: str) -> list:
    """Wrap `trainer.rollout_maker.<method>` to record what it returns."""
    calls = []
    original = getattr(trainer.rollout_maker, method)

    def record(*args, **kwargs):
        out = original(*args, **kwargs)
        calls.append((args, out))
        return out

    setattr(trainer.rollout_maker, method, record)
    return calls


def test_without_shuffle_the_updates_draw_the_prompts_in_the_datasets_order(tiny_config, toy_splits):
    seen = []

    def recording_reward(prompts, completions, **kwargs):
        seen.append(list(prompts))
        return [0.0] * len(prompts)

    trainer = builders.tiny_trainer(
        reward_funcs=recording_reward, args=tiny_config(shuffle_dataset=False, num_generations=2)
    )
    trainer.train()
    prompts = toy_splits["train"]["prompt"]
    assert seen[0] == [p for p in prompts[:8] for _ in range(2)]  # 16 sequences: 8 prompts, each twice
    assert seen[1] == [p for p in prompts[8:16] for _ in range(2)]


def test_padding_to_a_multiple_changes_the_shapes_and_not_the_training(fresh_trainer):
    plain = fresh_trainer()  # each built just before it trains: building seeds the generator sampling draws from
    plain.train()
    padded = fresh_trainer(pad_to_multiple_of=24, output_dir=plain.args.output_dir + "-padded")
    rollouts = _recorded(padded, "complete")
    padded.train()
    for _, (rollout, _work) in rollouts:
        assert rollout.query_ids.shape[1] % 24 == 0 and rollout.response_ids.shape[1] % 24 == 0
    assert rollouts[0][1][0].response_ids.shape[1] == 24  # responses of at most 16 tokens, padded
    for (name, a), (_, b) in zip(plain.model.named_parameters(), padded.model.named_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    losses = [[e["loss/policy_avg"] for e in t.state.log_history if "loss/policy_avg" in e] for t in (plain, padded)]
    torch.testing.assert_close(torch.tensor(losses[0]), torch.tensor(losses[1]), rtol=1e-4, atol=1e-5)


def test_chat_template_kwargs_render_the_conversational_prompts(tokenizer, toy_splits, tiny_config):
    chat_tokenizer = builders.tiny_tokenizer()
    chat_tokenizer.chat_template = TEMPLATE
    dataset = toy_splits["train"].map(lambda row: {"prompt": [{"role": "user", "content": row["prompt"].strip()}]})
    trainer = builders.tiny_trainer(
        model=builders.tiny_policy(chat_tokenizer),
        processing_class=chat_tokenizer,
        train_dataset=dataset,
        args=tiny_config(chat_template_kwargs={"enable_thinking": False}, max_steps=1),
    )
    texts = _recorded(trainer, "prompt_texts")
    trainer.train()
    rendered = texts[0][1]
    assert all(text.endswith("\n<nothink>=") for text in rendered), rendered[:2]


def test_trust_remote_code_trains_a_policy_with_its_own_code(
    tokenizer, toy_splits, tiny_config, tmp_path, monkeypatch
):
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    path = _custom_code_model(builders.tiny_tokenizer(), str(tmp_path / "custom"))
    trainer = builders.tiny_trainer(
        model=path, processing_class=None, args=tiny_config(trust_remote_code=True, max_steps=1)
    )
    assert type(trainer.accelerator.unwrap_model(trainer.model).policy).__name__ == "CustomForCausalLM"
    trainer.train()
    assert trainer.num_ppo_updates == 1
